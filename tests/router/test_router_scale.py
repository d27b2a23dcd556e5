"""How much of a tier the router holds at once: work over an owner's whole tier goes a page at a time.

The tiers are scripted ones (tests/support/scripted.py: real HTTP servers over the fixture store)
declaring a small `max_recall_limit`, so a page is a few records and the order of the router's
calls shows whether it read a whole side before using any of it.
"""

from __future__ import annotations

from typing import Any, AsyncIterator

import pytest

from a2m.dispatch import Context, Dispatcher
from router.config import RouterConfig, TierConfig
from router.server import Router
from tests.support.scripted import ScriptedTier

pytestmark = pytest.mark.anyio
ME = "alice"
PAGE = 5


@pytest.fixture
async def tiers() -> AsyncIterator[dict[str, ScriptedTier]]:
    made = {}
    for name in ("episodic", "semantic"):
        tier = ScriptedTier(name, name)
        tier.server.limits["max_recall_limit"] = PAGE
        made[name] = await tier.start()
    try:
        yield made
    finally:
        for tier in made.values():
            await tier.stop()


def record(i: int) -> dict[str, Any]:
    return {"id": f"r{i}", "content": f"fact {i}", "created_at": f"2026-01-01T00:00:{i:02d}.000Z"}


async def test_duplicate_repair_looks_up_the_smaller_side_a_page_at_a_time(tiers: dict[str, ScriptedTier]) -> None:
    """Repair read every record of the smaller side (all pages) before looking any id up in the
    other: at 10^5 records that whole side sat in the router's memory. Now each page is looked up
    as it arrives, and only the duplicates' ids are kept."""
    await tiers["episodic"].call("memory/remember", {"owner": ME, "records": [record(i) for i in range(12)]})
    await tiers["semantic"].call("memory/remember", {"owner": ME, "records": [record(i) for i in range(0, 40, 2)]})
    order: list[tuple[str, str]] = []  # (tier, what) in the order the router asked
    for name, tier in tiers.items():
        def seen(method: str, params: dict[str, Any], response: dict[str, Any], name: str = name) -> None:
            if method == "memory/timeline":
                order.append((name, "lookup" if "id" in (params.get("where") or {}) else "page"))
        tier.twist = seen
    config = RouterConfig(tiers=(
        TierConfig("episodic", tiers["episodic"].url, kind="episodic", spill_to="semantic", timeout=2.0),
        TierConfig("semantic", tiers["semantic"].url, kind="semantic", timeout=2.0),
    ), background_promotion=False)
    router = Router(config)
    await router.startup()
    try:
        reply = await Dispatcher(router).handle(
            {"jsonrpc": "2.0", "id": 1, "method": "memory/consolidate", "params": {"owner": ME}}, Context())
    finally:
        await router.shutdown()
    assert reply is not None and reply["result"]["repaired"] == 6, reply  # r0, r2, ..., r10
    pages = [i for i, (name, what) in enumerate(order) if name == "episodic" and what == "page"]
    lookups = [i for i, (name, what) in enumerate(order) if name == "semantic" and what == "lookup"]
    assert len(pages) >= 3 and lookups, order  # 12 records, pages of 5
    assert lookups[0] < pages[-1], order  # the first page is looked up before the last is read
    tiers["episodic"].server.limits["max_recall_limit"] = 100  # one read shows all it holds
    held = await tiers["episodic"].call("memory/timeline", {"owner": ME})
    assert sorted(r["id"] for r in held["records"]) == sorted(f"r{i}" for i in range(1, 12, 2))
