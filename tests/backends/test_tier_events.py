"""The events of each tier server, on its real embedded engine (Redis, PostgreSQL + pgvector, Qdrant
Edge, git), behind the dispatcher as `a2m serve` builds it: what a poller and a subscriber see when
writes overlap, and what a batch that writes a key twice says."""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator

import pytest

from a2m.dispatch import Context, Dispatcher
from tests.support.inprocess import call, dispatchers, owner

pytestmark = pytest.mark.anyio

TIERS = ("working", "episodic", "semantic", "procedural")


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
async def tiers(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[dict[str, Dispatcher]]:
    async with dispatchers(tmp_path_factory.mktemp("tier-events"), TIERS) as running:
        yield running


async def events(d: Dispatcher, me: str, cursor: str, **params: Any) -> list[dict[str, Any]]:
    return (await call(d, "memory/events", {"owner": me, "cursor": cursor, "limit": 0, **params}))["events"]


@pytest.mark.parametrize("tier", TIERS)
async def test_a_keys_revisions_reach_poller_and_subscriber_in_order_under_concurrent_writes(
        tiers: dict[str, Dispatcher], tier: str) -> None:
    """Writers of one key at once, some batches writing another key first, and a subscriber whose
    push yields (an in-process callback, protocol §8): the surface released its key lock, then
    appended the batch's events one at a time, each after awaiting its push, so a later batch's
    revision of the key was appended and pushed between: [2, 4, 6, 8, 1, 3, 5, 7]."""
    d, me = tiers[tier], owner()
    pushed: list[dict[str, Any]] = []

    async def push(event: dict[str, Any]) -> None:
        await asyncio.sleep(0.01)  # a callback that awaits before it takes the event
        pushed.append(event)

    await d.service.subscribe({"owner": me}, Context(push=push))
    head = (await call(d, "memory/events", {"owner": me}))["cursor"]

    async def write(i: int) -> None:
        first = [{"content": f"other {i}", "key": f"other/{i}"}] if i % 2 == 0 else []
        reply = await call(d, "memory/remember", {"owner": me, "records": [*first, {"content": f"v{i}", "key": "k"}]})
        assert "ids" in reply, reply

    await asyncio.gather(*(write(i) for i in range(8)))
    stored = (await call(d, "memory/fetch", {"owner": me, "key": "k"}))["record"]
    polled = [e["revision"] for e in await events(d, me, head) if e.get("key") == "k"]
    assert polled == list(range(1, 9)) and stored["revision"] == 8
    assert [e["revision"] for e in pushed if e.get("key") == "k"] == polled
    assert [(e.get("key"), e.get("revision")) for e in pushed] == [
        (e.get("key"), e.get("revision")) for e in await events(d, me, head)]


@pytest.mark.parametrize("tier", TIERS)
async def test_a_key_written_twice_in_one_batch_is_two_written_events_in_batch_order(
        tiers: dict[str, Dispatcher], tier: str) -> None:
    """The batch is applied record by record (decision 52): the key's second write is its next
    revision, and the router says so with one event per write (decision 57). A tier server said only
    the last revision, after the batch's other records: [(other, 1), (twice, 2)]."""
    d, me = tiers[tier], owner()
    head = (await call(d, "memory/events", {"owner": me}))["cursor"]
    ids = (await call(d, "memory/remember", {"owner": me, "records": [
        {"content": "v1", "key": "twice"}, {"content": "x", "key": "other"}, {"content": "v2", "key": "twice"}]}))["ids"]
    again = (await call(d, "memory/remember", {"owner": me, "records": [
        {"content": "v3", "key": "twice"}, {"content": "plain"}, {"content": "v4", "key": "twice"}]}))["ids"]
    assert ids[0] == ids[2] == again[0] == again[2]
    held = (await call(d, "memory/fetch", {"owner": me, "key": "twice"}))["record"]
    assert (held["content"], held["revision"]) == ("v4", 4)
    written = [(e["id"], e.get("key"), e.get("revision")) for e in await events(d, me, head)]
    assert written == [(ids[0], "twice", 1), (ids[1], "other", 1), (ids[0], "twice", 2),
                       (ids[0], "twice", 3), (again[1], None, None), (ids[0], "twice", 4)]


@pytest.mark.parametrize("tier", TIERS)
async def test_a_batch_of_several_owners_tells_each_owner_its_own_writes(
        tiers: dict[str, Dispatcher], tier: str) -> None:
    """A tier server takes a batch naming several owners (the router never sends one): each owner's
    poll shows its own records' events, in batch order, and none of the other's."""
    d, alice, bob = tiers[tier], owner(), owner()
    heads = {o: (await call(d, "memory/events", {"owner": o}))["cursor"] for o in (alice, bob)}
    ids = (await call(d, "memory/remember", {"records": [
        {"content": "a1", "owner": alice}, {"content": "b1", "owner": bob}, {"content": "a2", "owner": alice}]}))["ids"]
    assert [e["id"] for e in await events(d, alice, heads[alice])] == [ids[0], ids[2]]
    assert [e["id"] for e in await events(d, bob, heads[bob])] == [ids[1]]


async def test_a_tier_servers_log_stays_a_few_megabytes_however_many_owners_write(
        tiers: dict[str, Dispatcher]) -> None:
    """Behind a router nobody polls a tier's log, yet every owner's writes land in it: it is bounded at
    TIER_EVENTS_BOUND units (~4 MB), not the router's ~60 MB; past it the least recently active owner
    goes whole and its next poll resets once (decision 124)."""
    from backends.serve import TIER_EVENTS_BOUND

    d = tiers["working"]
    log = d.service.events
    first = owner()
    cursor = (await call(d, "memory/events", {"owner": first}))["cursor"]
    await call(d, "memory/remember", {"owner": first, "records": [{"content": "first"}]})
    for _ in range(TIER_EVENTS_BOUND // 3 + 1):  # an event (1 unit) and an owner (2) each: past the bound
        await log.emit("written", owner(), id="x", tier="working")
    assert log._held <= TIER_EVENTS_BOUND
    polled = await call(d, "memory/events", {"owner": first, "cursor": cursor})
    assert polled["reset"] is True and polled["events"] == []
