"""What the router keeps in memory per owner stays bounded however many owners come and go.

Agents are many and short-lived: an owner that recalls and then goes away (never consolidating,
never closing a session) must not leave state in a router that runs for months. The router runs
in this process over real tier servers (PostgreSQL, Qdrant Edge), so its maps can be read.
"""

from __future__ import annotations

import asyncio
from typing import Any, Iterator

import pytest

from a2m.dispatch import Context
from router import policy as policy_module
from router.config import load
from router.server import Router

from .stack import Stack, federation, new_owner as owner

pytestmark = pytest.mark.anyio

TIERS = [
    {"name": "episodic", "kind": "episodic", "promote_to": "semantic", "promote_after": 1, "timeout": 20.0},
    {"name": "semantic", "kind": "semantic", "timeout": 20.0},
]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with federation(tmp_path_factory.mktemp("bounded"), TIERS, mode="real") as running:
        yield running


@pytest.fixture
async def router(stack: Stack) -> Any:
    running = Router(load(str(stack.config)))
    await running.startup()
    try:
        yield running
    finally:
        await running.shutdown()


async def call(router: Router, method: str, params: dict[str, Any]) -> dict[str, Any]:
    return await router.handlers()[method](params, Context())


async def write_and_recall(router: Router, me: str) -> str:
    """One record of `me` in episodic, recalled once: past promote_after = 1, so queued for promotion."""
    [record_id] = (await call(router, "memory/remember", {"owner": me, "records": [
        {"content": f"a note of {me}", "tier": "episodic"}]}))["ids"]
    assert [r["id"] for r in (await call(router, "memory/recall", {"owner": me, "limit": 5}))["records"]] == [record_id]
    return record_id


async def test_promotions_queued_by_owners_that_never_consolidate_are_bounded(
        router: Router, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each owner's earned promotions wait for its consolidate or session close; an owner that does
    neither kept its queue for the router's life (2,000 such owners: 2,000 entries, never drained).
    Past MAX_PENDING ids the least recently queued owners give theirs up, and a record so dropped
    is queued again by its next recall."""
    monkeypatch.setattr(policy_module, "MAX_PENDING", 20, raising=False)
    policy = router.policy
    owners = [owner() for _ in range(60)]
    gate = asyncio.Semaphore(8)

    async def one(me: str) -> None:
        async with gate:
            await write_and_recall(router, me)

    await asyncio.gather(*(one(me) for me in owners[:-1]))
    await policy.counted()
    last = owners[-1]
    await write_and_recall(router, last)
    await policy.counted()
    queued = sum(len(ids) for ids in policy.pending.values())
    assert len(policy.pending) <= 20 and queued == policy._pending_size <= 20
    assert (last, "episodic") in policy.pending  # the most recent owner kept its queue

    assert (await call(router, "memory/consolidate", {"owner": last}))["promoted"] == 1
    assert (last, "episodic") not in policy.pending
    assert policy._pending_size == sum(len(ids) for ids in policy.pending.values())

    first = owners[0]  # dropped long ago: its next recall earns the promotion again
    assert (first, "episodic") not in policy.pending
    await call(router, "memory/recall", {"owner": first, "limit": 5})
    await policy.counted()
    assert (await call(router, "memory/consolidate", {"owner": first}))["promoted"] == 1
    held = (await call(router, "memory/recall", {"owner": first, "limit": 5, "touch": False}))["records"]
    assert [r["tier"] for r in held] == ["semantic"]
