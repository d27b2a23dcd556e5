"""Two router replicas over one federation, changing the same owner's records at once.

The owner lock (decision 37) is a lock in one router's memory; a deployment runs several routers
(deploy/k8s/hpa.yaml: two at least). Here two routers run in this process over the real tiers
(Redis, PostgreSQL, Qdrant Edge, git), each with its own policy and locks, as two replicas would;
one's move is held at a gate while the other acts. Each case runs with the replicas' owner locks
in a Redis both name (`lock_url`, decision 155), and without: what only the shared lock prevents
is a strict xfail without it. What is checked is read from the tier servers.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from dataclasses import replace
from typing import Any, AsyncIterator, Awaitable, Iterator

import pytest

from a2m.errors import A2MError
from tests.support.redis import own_redis

from .stack import Stack, federation, new_owner as owner, tier_call as direct
from .test_router_interleavings import Gate, InProcess, homes, names, stack  # noqa: F401 - the module's federation

pytestmark = pytest.mark.anyio
# Moves by two replicas in opposite directions, and a forget through one replica while the other
# moves the record, need a lock both replicas see; without `lock_url` the owner lock is one router's.
UNSHARED = pytest.param(False, id="own-locks", marks=pytest.mark.xfail(
    strict=True, reason="without lock_url the owner lock is per router process: replicas do not hold back "
                        "each other's moves and forgets"))
SHARED = pytest.param(True, id="lock_url")


@pytest.fixture(scope="module")
def lock_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with own_redis(tmp_path_factory.mktemp("locks")) as url:
        yield url


async def pair(stack: Stack, lock_url: str | None) -> tuple[InProcess, InProcess]:  # noqa: F811
    running = (InProcess(stack, lock_url), InProcess(stack, lock_url))
    for one in running:
        await one.router.startup()
    return running


async def stop(*running: InProcess) -> None:
    for one in running:
        for gate in one.gates:
            gate.release()
        await one.router.shutdown()


@pytest.fixture(params=[False, True], ids=["own-locks", "lock_url"])
async def replicas(request: pytest.FixtureRequest, stack: Stack,  # noqa: F811
                   lock_url: str) -> AsyncIterator[tuple[InProcess, InProcess]]:
    running = await pair(stack, lock_url if request.param else None)
    try:
        yield running
    finally:
        await stop(*running)


async def while_held(gate: Gate, first: asyncio.Task[Any], second: Awaitable[Any], shared: bool) -> Any:
    """`second` (replica B's call) run once `first` (A's) is held at `gate`, then A let go: B's answer.
    With replicas' own locks B runs to its end meanwhile; with a shared lock it waits for A's."""
    try:
        await asyncio.wait_for(gate.reached.wait(), 20)
        other = asyncio.ensure_future(second)
        if shared:
            await asyncio.wait([other], timeout=1.0)
            assert not other.done(), "B ran while A held the owner"
        else:  # B runs to its end meanwhile: nothing holds it back
            await asyncio.wait_for(asyncio.shield(other), 20)
        gate.release()
        await asyncio.wait_for(first, 20)
        return await asyncio.wait_for(other, 20)
    finally:
        gate.release()


def shared_of(replicas: tuple[InProcess, InProcess]) -> bool:
    return replicas[0].router.policy.shared_locks is not None


async def test_a_key_replaced_through_another_replica_mid_spill_is_not_lost(
        replicas: tuple[InProcess, InProcess], stack: Stack) -> None:  # noqa: F811
    """Replica A's spill has read `plan` (revision 1) and is writing it to episodic; replica B
    replaces `plan` (revision 2) and acknowledges it. A then verified its revision 1 in episodic and
    deleted the id from working: the acknowledged revision 2 went with it. Held by the revision
    A's delete names (decision 152) without a shared lock; with one, B waits and replaces it in
    episodic."""
    a, b = replicas
    me = owner()
    [rid] = (await a.call("memory/remember", {"owner": me, "records": [
        {"content": "the old plan", "key": "plan", "session": "s"}]}))["ids"]
    gate = a.hold("episodic", "memory/remember", names(rid))
    filling = asyncio.create_task(a.call("memory/remember", {"owner": me, "records": [
        {"content": f"turn {i}", "session": "s"} for i in range(4)]}))
    replaced = await while_held(gate, filling, b.call("memory/remember", {"owner": me, "records": [
        {"content": "the new plan", "key": "plan"}]}), shared_of(replicas))
    assert replaced["ids"] == [rid]
    for _ in range(2):  # whatever a later pass repairs counts too
        await a.call("memory/consolidate", {"owner": me})
    assert [c for _, c in (await homes(stack, me)).get(rid, [])] == ["the new plan"]


@pytest.mark.parametrize("shared", [UNSHARED, SHARED])
@pytest.mark.parametrize("second", ["promote", "repair"])
async def test_a_record_moved_by_two_replicas_at_once_is_not_lost(
        stack: Stack, lock_url: str, second: str, shared: bool) -> None:  # noqa: F811
    """Replica A promotes a record semantic -> episodic and is held just before its delete from
    semantic; replica B moves it back (a promote, or a consolidate's duplicate repair), keeps
    semantic's copy and deletes episodic's; then A deletes semantic's: the record is gone."""
    a, b = await pair(stack, lock_url if shared else None)
    try:
        me = owner()
        rid = f"{me}-fact"
        await direct(stack, "semantic", "memory/remember", {"owner": me, "records": [{"id": rid, "content": "a fact"}]})
        deleting = a.hold("semantic", "memory/forget", lambda p: rid in p.get("ids", ()))
        first = asyncio.create_task(a.call("memory/promote", {"owner": me, "ids": [rid], "tier": "episodic"}))
        await while_held(deleting, first, b.call("memory/promote", {"owner": me, "ids": [rid], "tier": "semantic"})
                         if second == "promote" else b.call("memory/consolidate", {"owner": me}), shared)
        for _ in range(2):
            await a.call("memory/consolidate", {"owner": me})
        held = (await homes(stack, me)).get(rid, [])
        assert len(held) == 1, f"{rid} held {held} after two replicas moved it at once"
    finally:
        await stop(a, b)


async def test_a_session_closed_by_two_replicas_at_once_keeps_every_record_once(
        replicas: tuple[InProcess, InProcess], stack: Stack) -> None:  # noqa: F811
    """Both replicas flush one session: A is held after its write to episodic, B runs its whole
    flush (its idempotent write keeps A's copies, then deletes working's) or, with a shared lock,
    waits for A's; then A deletes."""
    a, b = replicas
    me = owner()
    ids = (await a.call("memory/remember", {"owner": me, "records": [
        {"content": f"turn {i}", "session": "c"} for i in range(3)]}))["ids"]
    deleting = a.hold("working", "memory/forget", lambda p: ids[0] in p.get("ids", ()))
    closing = asyncio.create_task(a.call("memory/session/close", {"owner": me, "session": "c"}))
    await while_held(deleting, closing, b.call("memory/session/close", {"owner": me, "session": "c"}),
                     shared_of(replicas))
    held = await homes(stack, me)
    assert {i: [t for t, _ in held.get(i, [])] for i in ids} == {i: ["episodic"] for i in ids}


@pytest.mark.parametrize("shared", [UNSHARED, SHARED])
async def test_a_forget_acknowledged_by_another_replica_mid_spill_stays_forgotten(
        stack: Stack, lock_url: str, shared: bool) -> None:  # noqa: F811
    """Replica A's spill has read the record and is writing it to episodic; replica B forgets it
    (only working holds it yet) and acknowledges; A's write then put it back in episodic."""
    a, b = await pair(stack, lock_url if shared else None)
    try:
        me = owner()
        [rid] = (await a.call("memory/remember", {"owner": me, "records": [
            {"content": "forget me", "session": "s"}]}))["ids"]
        gate = a.hold("episodic", "memory/remember", names(rid))
        filling = asyncio.create_task(a.call("memory/remember", {"owner": me, "records": [
            {"content": f"turn {i}", "session": "s"} for i in range(4)]}))
        assert await while_held(gate, filling, b.call("memory/forget", {"owner": me, "ids": [rid]}),
                                shared) == {"forgotten": 1}
        assert rid not in await homes(stack, me)
    finally:
        await stop(a, b)


async def test_a_move_whose_hold_lapsed_writes_nothing_back(stack: Stack, lock_url: str) -> None:  # noqa: F811
    """A lease is not a fence: replica A read a record to spill, then froze past its lease (the key
    lapsed; here it is let go by hand); replica B took the owner and forgot the record, acknowledged;
    A resumed and wrote the record into episodic: forgotten, then back. A asks whether it still
    holds the owner before it writes, and stops."""
    import redis.asyncio as aioredis

    a, b = await pair(stack, lock_url)
    try:
        me = owner()
        [rid] = (await a.call("memory/remember", {"owner": me, "records": [
            {"content": "forget me", "session": "s"}]}))["ids"]
        read = a.hold("working", "memory/timeline", lambda p: rid in (p.get("where") or {}).get("id", ()), after=True)
        filling = asyncio.create_task(a.call("memory/remember", {"owner": me, "records": [
            {"content": f"turn {i}", "session": "s"} for i in range(4)]}))  # past capacity: the first turn spills
        await asyncio.wait_for(read.reached.wait(), 20)
        hold = a.router.policy.owner_lock(me)
        hold._lease._renewing.cancel()  # A frozen: no renewal, and the lease runs out
        admin = aioredis.from_url(lock_url)
        await admin.delete(a.router.policy.shared_locks.key(me))
        await admin.aclose()
        assert await asyncio.wait_for(b.call("memory/forget", {"owner": me, "ids": [rid]}), 20) == {"forgotten": 1}
        read.release()
        await asyncio.wait_for(filling, 20)  # the write itself stands; its capacity pass logged the lapse
        assert rid not in await homes(stack, me)
    finally:
        await stop(a, b)


@pytest.mark.parametrize("shared", [False, True], ids=["own-locks", "lock_url"])
async def test_a_key_replaced_through_another_replica_while_its_session_is_trimmed_is_not_dropped(
        tmp_path: Path, lock_url: str, shared: bool) -> None:
    """retention = "drop": replica A chose the old plan (the session's oldest) under its owner lock and
    is about to delete it by id; replica B replaces the plan (revision 2, another session) and
    acknowledges it; A's delete by id took revision 2 with it. Held by the revision A's delete
    names (decision 152); with a shared lock B waits for A's drop and writes the plan anew."""
    tiers = [{"name": "working", "kind": "working", "capacity": 4, "per_session": True, "retention": "drop",
              "timeout": 20.0}]
    with federation(tmp_path, tiers, mode="real") as small:
        a, b = await pair(small, lock_url if shared else None)
        try:
            me = owner()
            [rid] = (await a.call("memory/remember", {"owner": me, "records": [
                {"content": "the old plan", "key": "plan", "session": "s"}]}))["ids"]
            await a.call("memory/remember", {"owner": me, "records": [
                {"content": f"turn {i}", "session": "s"} for i in range(3)]})
            gate = a.hold("working", "memory/forget", lambda p: rid in p.get("ids", ()))
            trimming = asyncio.create_task(a.call("memory/remember", {"owner": me, "records": [
                {"content": "turn 3", "session": "s"}]}))  # five: the old plan, the oldest, is to go
            replaced = await while_held(gate, trimming, b.call("memory/remember", {"owner": me, "records": [
                {"content": "the new plan", "key": "plan", "session": "t"}]}), shared)
            # waiting for A, B found the old plan dropped and wrote its plan anew
            assert (replaced["ids"] == [rid]) != shared
            held = (await direct(small, "working", "memory/timeline", {"owner": me, "limit": 0}))["records"]
            assert [(r["id"], r["content"]) for r in held if r.get("key")] == [(replaced["ids"][0], "the new plan")]
        finally:
            await stop(a, b)


async def test_a_recall_answers_when_the_lock_store_went_away_during_a_move(stack: Stack,  # noqa: F811
                                                                          tmp_path: Path) -> None:
    """A recall counted while this router moved the owner's records follows its counts under the owner
    lock (`Policy._carried_off`). With that lock in a Redis that had gone away meanwhile, the recall
    (its records found and touched) failed as "the owner lock store is unavailable". The counts a
    move carried off are left uncounted there, as when a tier does not answer that follow-up."""
    with own_redis(tmp_path) as url:
        one = InProcess(stack, url)
        one.router.reads.config = replace(one.router.reads.config, background_promotion=False)  # counted inline
        await one.router.startup()
        try:
            me = owner()
            await one.call("memory/remember", {"owner": me, "records": [
                {"content": "the harbour ferry leaves at nine", "tier": "episodic"}]})
            moving = one.router.policy.owner_lock(me)
            await moving.__aenter__()  # a move of this router's, mid-way
            await shut_down(url)
            recall = asyncio.ensure_future(one.call("memory/recall", {"owner": me, "query": "harbour"}))
            await asyncio.sleep(0.5)
            await moving.__aexit__(None, None, None)
            found = await asyncio.wait_for(recall, 20)
            assert [r["content"] for r in found["records"]] == ["the harbour ferry leaves at nine"]
        finally:
            await one.router.shutdown()


async def test_a_consolidate_with_the_lock_store_away_fails_rather_than_answer_it_moved_nothing(
        stack: Stack, tmp_path: Path) -> None:  # noqa: F811
    """A record in working and in episodic at once (a move cut off after its write) is what a
    consolidate repairs, under the owner lock. With that lock's Redis gone, the repair was skipped
    as if a tier were down and the call answered `repaired: 0`, `moved: 0`: nothing said why."""
    with own_redis(tmp_path) as url:
        one = InProcess(stack, url)
        await one.router.startup()
        try:
            me = owner()
            record = {"id": f"dup-{me}", "content": "the harbour ferry leaves at nine"}
            for tier in ("working", "episodic"):
                await direct(stack, tier, "memory/remember", {"owner": me, "records": [record]})
            await shut_down(url)
            with pytest.raises(A2MError, match=r"the owner lock store \(lock_url\) is unavailable") as failed:
                await one.call("memory/consolidate", {"owner": me})
            assert failed.value.code == -32603
            assert sorted(t for t, _ in (await homes(stack, me))[record["id"]]) == ["episodic", "working"]
        finally:
            await one.router.shutdown()


async def test_readyz_says_whether_the_lock_store_answers(stack: Stack, tmp_path: Path) -> None:  # noqa: F811
    """/readyz (ready, then health) said every tier up while the lock store was gone, when every
    move, forget and keyed write failed. It says so now; the router stays ready for what works."""
    with own_redis(tmp_path) as url:
        one = InProcess(stack, url)
        await one.router.startup()
        try:
            assert await one.router.ready() and (await one.router.health())["owner_locks"] == "up"
            await shut_down(url)
            assert await one.router.ready() and (await one.router.health())["owner_locks"] == "down"
        finally:
            await one.router.shutdown()


async def shut_down(url: str) -> None:
    """The lock store goes away (SHUTDOWN NOSAVE: the server exits)."""
    import redis.asyncio as aioredis
    from redis.exceptions import ConnectionError as RedisConnectionError

    client = aioredis.from_url(url)
    try:
        await client.shutdown(nosave=True)
    except RedisConnectionError:
        pass
    finally:
        await client.aclose()
