"""Interleavings of concurrent router calls, forced one step at a time, on real tier servers.

The router runs in this process over the real tiers (Redis, PostgreSQL, Qdrant Edge, git) through
its `client_factory` seam: each tier client can hold one chosen call at a gate until the test lets
it go, so a race the concurrent test (test_router_concurrency.py) hits by chance happens here every
time. What is checked is read from the tier servers themselves.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import Any, Awaitable, Callable, Iterator

import pytest

from a2m.client import HTTPClient, Unavailable
from a2m.dispatch import Context
from a2m.errors import A2MError
from router.config import load
from router.server import Router

from .stack import Stack, federation, new_owner as owner, tier_call as direct
from .test_router_concurrency import TIERS

pytestmark = pytest.mark.anyio
NAMES = [t["name"] for t in TIERS]


class Gate:
    """Holds the first call to `tier` of `method` whose params satisfy `when`, until `release()`:
    before it is sent, or (`after`) once it has been answered, before the router sees the answer."""

    def __init__(self, tier: str, method: str, when: Callable[[dict[str, Any]], bool], after: bool = False,
                 fail: A2MError | None = None) -> None:
        self.tier, self.method, self.when, self.after, self.fail = tier, method, when, after, fail
        self.reached, self.released = asyncio.Event(), asyncio.Event()

    def release(self) -> None:
        self.released.set()


class GatedClient:
    def __init__(self, name: str, url: str, token: str | None, timeout: float, gates: list[Gate]) -> None:
        self.name, self.gates = name, gates
        self.client = HTTPClient(url, token=token, timeout=timeout)

    async def call(self, method: str, params: dict[str, Any], *, timeout: float | None = None) -> dict[str, Any]:
        gate = next((g for g in self.gates if g.tier == self.name and g.method == method and g.when(params)), None)
        if gate is not None:
            self.gates.remove(gate)  # one call each
            if not gate.after:
                gate.reached.set()
                await gate.released.wait()
            if gate.fail is not None:  # the call never reaches the tier: as one to a tier gone
                raise gate.fail
        answer = await self.client.call(method, params, timeout=timeout)
        if gate is not None and gate.after:
            gate.reached.set()
            await gate.released.wait()
        return answer

    async def close(self) -> None:
        await self.client.close()


class InProcess:
    """A Router over the stack's tiers whose tier calls can be held at gates."""

    def __init__(self, stack: Stack, lock_url: str | None = None) -> None:
        config = replace(load(str(stack.config)), lock_url=lock_url)  # lock_url: shared by replicas
        self.gates: list[Gate] = []
        self.router = Router(config, client_factory=lambda t: GatedClient(
            t.name, t.url, config.service_token, t.timeout, self.gates))

    def hold(self, tier: str, method: str, when: Callable[[dict[str, Any]], bool] = lambda p: True, *,
             after: bool = False, fail: A2MError | None = None) -> Gate:
        gate = Gate(tier, method, when, after, fail)
        self.gates.append(gate)
        return gate

    async def call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        handler = self.router.handlers()[method]
        return await handler(params, Context())


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with federation(tmp_path_factory.mktemp("interleave"), TIERS, mode="real") as running:
        yield running


@pytest.fixture
async def inproc(stack: Stack) -> Any:
    running = InProcess(stack)
    await running.router.startup()
    try:
        yield running
    finally:
        for gate in running.gates:
            gate.release()
        await running.router.shutdown()


async def homes(stack: Stack, me: str) -> dict[str, list[tuple[str, str]]]:
    """id -> [(tier, content)] for every record of `me`, read from each tier server."""
    out: dict[str, list[tuple[str, str]]] = {}
    for name in NAMES:
        for record in (await direct(stack, name, "memory/timeline", {"owner": me, "limit": 0}))["records"]:
            out.setdefault(record["id"], []).append((name, record["content"]))
    return out


def counting(params: dict[str, Any]) -> bool:
    """The router's query-less recall by id that counts a recall (not a fan-out read)."""
    return "query" not in params and "id" in (params.get("where") or {})


async def test_consolidate_waits_for_the_recalls_answered_before_it_not_for_later_ones(inproc: InProcess,
                                                                                     stack: Stack) -> None:
    """Under steady recall traffic the background counting never runs dry, and consolidate (and
    session/close) waited for it to: 0.7, 2.8, then 7 s under eight recalling clients, growing.
    It waits for the counts of the recalls answered before it began (decision 9), no more."""
    me = owner()
    [rid] = (await inproc.call("memory/remember", {"owner": me, "records": [
        {"content": "the harbour ferry leaves at nine", "tier": "episodic"}]}))["ids"]
    await inproc.call("memory/recall", {"owner": me, "query": "harbour"})  # counted at once
    await inproc.router.drain()
    first = inproc.hold("episodic", "memory/recall", counting)
    await inproc.call("memory/recall", {"owner": me, "query": "harbour"})  # its count is held
    await first.reached.wait()
    consolidating = asyncio.create_task(inproc.call("memory/consolidate", {"owner": me}))
    await asyncio.sleep(0.2)
    assert not consolidating.done(), "consolidate did not wait for a recall answered before it"
    later = inproc.hold("episodic", "memory/recall", counting)
    await inproc.call("memory/recall", {"owner": me, "query": "harbour"})  # answered after it began
    first.release()
    await later.reached.wait()
    try:
        done = await asyncio.wait_for(consolidating, 10)
    finally:
        later.release()
    assert done["promoted"] == 1, "the second recall before consolidate earned promotion"
    assert (await homes(stack, me))[rid][0][0] == "semantic"


async def test_a_recall_counted_after_its_record_spilled_is_counted_where_it_went(inproc: InProcess,
                                                                                   stack: Stack) -> None:
    """The router counts what it returned in the background, by id, in the tier it came from. A
    record that spilled in between was not there any more, and its recall was never counted."""
    me = owner()
    [rid] = (await inproc.call("memory/remember", {"owner": me, "records": [
        {"content": "the harbour ferry leaves at nine", "session": "s"}]}))["ids"]
    held = inproc.hold("working", "memory/recall", counting)
    assert [r["id"] for r in (await inproc.call("memory/recall", {"owner": me, "query": "harbour"}))["records"]] == [rid]
    await held.reached.wait()
    await write_turns(inproc, me, "s", 4)  # over capacity: the first turn spills to episodic
    assert [t for t, _ in (await homes(stack, me))[rid]] == ["episodic"]
    held.release()
    await inproc.router.drain()
    await inproc.router.policy.counted()
    [record] = (await direct(stack, "episodic", "memory/timeline", {"owner": me, "limit": 0}))["records"][:1]
    assert record["id"] == rid and record["access_count"] == 1


def names(rid: str) -> Callable[[dict[str, Any]], bool]:
    return lambda params: rid in [r.get("id") for r in params.get("records", ())] or \
        rid in ((params.get("where") or {}).get("id") or ())


async def test_a_refused_batch_leaves_nothing_behind_when_a_flush_moves_its_records_first(inproc: InProcess,
                                                                                       stack: Stack) -> None:
    """A batch whose semantic part is refused (an id another owner holds there) is undone by
    forgetting what it wrote in working; a session/close that moved that record to episodic before
    the refusal came left it there, written by a call that failed."""
    me, other = owner(), owner()
    await direct(stack, "semantic", "memory/remember", {"owner": other, "records": [{"id": f"{other}-x", "content": "x"}]})
    gate = inproc.hold("semantic", "memory/remember")
    writing = asyncio.create_task(inproc.call("memory/remember", {"owner": me, "records": [
        {"content": "a note of a failed batch", "session": "q"},
        {"id": f"{other}-x", "content": "not mine", "tier": "semantic"}]}))
    await gate.reached.wait()
    closing = asyncio.create_task(inproc.call("memory/session/close", {"owner": me, "session": "q"}))
    await asyncio.sleep(0.5)
    gate.release()
    with pytest.raises(A2MError) as refused:
        await writing
    assert refused.value.code == -32005
    await closing
    assert await homes(stack, me) == {}


async def test_one_client_id_written_twice_at_once_gets_one_home(inproc: InProcess, stack: Stack) -> None:
    """Both writes looked the id up before either wrote it: working and procedural each kept one,
    and no consolidate repairs that (they are no spill or promotion link)."""
    me = owner()
    rid = f"{me}-retried"
    gate = inproc.hold("working", "memory/remember", names(rid))
    first = asyncio.create_task(inproc.call("memory/remember", {"owner": me, "records": [
        {"id": rid, "content": "sent once"}]}))
    await gate.reached.wait()
    second = asyncio.create_task(inproc.call("memory/remember", {"owner": me, "records": [
        {"id": rid, "content": "sent again", "tier": "procedural"}]}))
    await asyncio.sleep(0.5)
    gate.release()
    assert [(await first)["ids"], (await second)["ids"]] == [[rid], [rid]]
    await inproc.call("memory/consolidate", {"owner": me})
    assert [tier for tier, _ in (await homes(stack, me))[rid]] == ["working"]


async def test_a_client_id_written_again_while_it_moves_is_not_written_twice(inproc: InProcess, stack: Stack) -> None:
    """The id lookup read episodic before a flush moved the record there and working after: the id
    seemed new and was written again, into procedural, beside the moved record."""
    me = owner()
    rid = f"{me}-once"
    await inproc.call("memory/remember", {"owner": me, "records": [
        {"id": rid, "content": "the original", "session": "m"}]})
    gate = inproc.hold("working", "memory/timeline", names(rid))
    retry = asyncio.create_task(inproc.call("memory/remember", {"owner": me, "records": [
        {"id": rid, "content": "a retry", "tier": "procedural"}]}))
    await gate.reached.wait()
    closing = asyncio.create_task(inproc.call("memory/session/close", {"owner": me, "session": "m"}))
    await asyncio.sleep(0.5)
    gate.release()
    assert (await retry)["ids"] == [rid]
    await closing
    await inproc.call("memory/consolidate", {"owner": me})
    assert (await homes(stack, me))[rid] == [("episodic", "the original")]


async def spill_held(inproc: InProcess, me: str, first: dict[str, Any]) -> tuple[str, Gate, asyncio.Task[Any]]:
    """`first` written to working session "s", then four more: the spill of `first` to episodic is
    held at its write there. Returns its id, the gate, and the write whose capacity pass spills."""
    [rid] = (await inproc.call("memory/remember", {"owner": me, "records": [first | {"session": "s"}]}))["ids"]
    gate = inproc.hold("episodic", "memory/remember", names(rid))
    filling = asyncio.create_task(inproc.call("memory/remember", {"owner": me, "records": [
        {"content": f"turn {i}", "session": "s"} for i in range(4)]}))
    await gate.reached.wait()
    return rid, gate, filling


async def test_a_forget_acknowledged_mid_spill_is_not_undone_by_the_spill(inproc: InProcess, stack: Stack) -> None:
    me = owner()
    rid, gate, filling = await spill_held(inproc, me, {"content": "forget me"})
    forgetting = asyncio.create_task(inproc.call("memory/forget", {"owner": me, "ids": [rid]}))
    await asyncio.sleep(0.3)
    gate.release()
    assert (await forgetting) == {"forgotten": 1}
    await filling
    assert rid not in await homes(stack, me)


async def test_a_reinforce_acknowledged_mid_spill_is_kept_by_the_moved_copy(inproc: InProcess,
                                                                             stack: Stack) -> None:
    """The spill had read the record and was writing it to episodic when the reinforce came: applied
    to the working copy the spill then deletes, the acknowledged raise was lost."""
    me = owner()
    rid, gate, filling = await spill_held(inproc, me, {"content": "raise me", "salience": 0.5})
    reinforcing = asyncio.create_task(inproc.call("memory/reinforce", {"owner": me, "ids": [rid], "amount": 0.25}))
    await asyncio.sleep(0.3)
    gate.release()
    assert (await reinforcing) == {"reinforced": 1}
    await filling
    [record] = (await inproc.call("memory/recall", {"owner": me, "where": {"id": rid}}))["records"]
    assert record["tier"] == "episodic" and record["salience"] == pytest.approx(0.75)


async def test_a_recall_counted_mid_spill_is_kept_by_the_moved_copy(inproc: InProcess, stack: Stack) -> None:
    """The spill had read the record (no recalls yet) and was writing it to episodic when the router
    counted a recall of it: the count landed on the working copy the spill then deleted, and was
    lost (as a reinforce was before decision 70)."""
    me = owner()
    rid, gate, filling = await spill_held(inproc, me, {"content": "the harbour ferry leaves at nine"})
    assert [r["id"] for r in (await inproc.call("memory/recall", {"owner": me, "query": "harbour"}))["records"]] == [rid]
    await asyncio.sleep(0.3)  # the count is sent (or waits for the move)
    gate.release()
    await filling
    await inproc.router.drain()
    [record] = (await direct(stack, "episodic", "memory/timeline", {"owner": me, "where": {"id": [rid]}}))["records"]
    assert record["access_count"] == 1


async def test_a_key_replaced_mid_spill_keeps_the_new_content_in_one_place(inproc: InProcess, stack: Stack) -> None:
    me = owner()
    rid, gate, filling = await spill_held(inproc, me, {"content": "the old plan", "key": "plan"})
    replacing = asyncio.create_task(inproc.call("memory/remember", {"owner": me, "records": [
        {"content": "the new plan", "key": "plan"}]}))
    await asyncio.sleep(0.3)
    gate.release()
    assert (await replacing)["ids"] == [rid]
    await filling
    assert (await homes(stack, me))[rid] == [("episodic", "the new plan")]


async def test_a_record_arriving_while_a_promotion_is_announced_keeps_its_earned_promotion(
        inproc: InProcess, stack: Stack) -> None:
    """Promotion dropped from its queue the ids it had not found, after announcing what it moved; a
    push subscriber slow to take the event (a push is an awaitable; stdio's does not yield today)
    let a spill bring one of them back into episodic, already recalled often enough, in between:
    it was queued on arrival, then dropped, and no later consolidate promoted it."""
    me = owner()
    [x] = (await inproc.call("memory/remember", {"owner": me, "records": [
        {"content": "harbour ferry", "tier": "episodic", "session": "s"}]}))["ids"]
    [y] = (await inproc.call("memory/remember", {"owner": me, "records": [
        {"content": "rocket plan", "tier": "episodic"}]}))["ids"]
    for query in ("harbour", "harbour", "rocket", "rocket"):
        await inproc.call("memory/recall", {"owner": me, "query": query})
        await inproc.router.policy.counted()
    assert (await inproc.call("memory/promote", {"owner": me, "ids": [x], "tier": "working"}))["promoted"] == 1
    announced, taken = asyncio.Event(), asyncio.Event()

    async def slow(event: dict[str, Any]) -> None:
        announced.set()
        await taken.wait()

    await inproc.router.subscribe({"owner": me, "kinds": ["promoted"]}, Context(push=slow))
    consolidating = asyncio.create_task(inproc.call("memory/consolidate", {"owner": me}))
    await announced.wait()  # y moved to semantic; x was not in episodic
    await inproc.call("memory/remember", {"owner": me, "records": [
        {"content": f"turn {i}", "session": "s"} for i in range(4)]})  # x spills back to episodic
    assert [t for t, _ in (await homes(stack, me))[x]] == ["episodic"]
    taken.set()
    await consolidating
    await inproc.call("memory/consolidate", {"owner": me})
    held = await homes(stack, me)
    assert (held[x][0][0], held[y][0][0]) == ("semantic", "semantic")


async def test_a_key_moving_while_it_is_fetched_is_found(inproc: InProcess, stack: Stack) -> None:
    """fetch asks every tier at once: episodic answered before a spill wrote the key there and
    working after the spill deleted it, so a key that was never forgotten read as absent (an agent
    that then writes a default replaces the real value)."""
    me = owner()
    await inproc.call("memory/remember", {"owner": me, "records": [
        {"content": "the user is called Ada", "key": "user/name", "session": "s"}]})
    gate = inproc.hold("working", "memory/fetch")
    fetching = asyncio.create_task(inproc.call("memory/fetch", {"owner": me, "key": "user/name"}))
    await gate.reached.wait()
    await inproc.call("memory/remember", {"owner": me, "records": [
        {"content": f"turn {i}", "session": "s"} for i in range(4)]})  # spills the key to episodic
    held = await homes(stack, me)
    assert [copies for copies in held.values() if copies[0][1] == "the user is called Ada"] == [
        [("episodic", "the user is called Ada")]]
    gate.release()
    record = (await fetching)["record"]
    assert record is not None and record["content"] == "the user is called Ada"


async def test_a_key_replaced_while_its_session_is_trimmed_is_not_dropped(tmp_path: Path) -> None:
    """retention = "drop": the capacity pass chose its victims from a read of the session taken
    before the owner lock, then deleted them by id; a key replaced in between (now the newest record,
    moved to another session) was deleted with the old version's id: an acknowledged write lost."""
    tiers = [{"name": "working", "kind": "working", "capacity": 4, "per_session": True, "retention": "drop",
              "timeout": 20.0}]
    with federation(tmp_path, tiers, mode="real") as small:
        inproc = InProcess(small)
        await inproc.router.startup()
        try:
            me = owner()
            [rid] = (await inproc.call("memory/remember", {"owner": me, "records": [
                {"content": "the old plan", "key": "plan", "session": "s"}]}))["ids"]
            await inproc.call("memory/remember", {"owner": me, "records": [
                {"content": f"turn {i}", "session": "s"} for i in range(3)]})
            gate = inproc.hold("working", "memory/timeline", lambda p: p.get("where") == {"session": "s"}, after=True)
            trimming = asyncio.create_task(inproc.call("memory/remember", {"owner": me, "records": [
                {"content": "turn 3", "session": "s"}]}))  # five: the old plan, the oldest, is to go
            await gate.reached.wait()
            replaced = await inproc.call("memory/remember", {"owner": me, "records": [
                {"content": "the new plan", "key": "plan", "session": "t"}]})
            assert replaced["ids"] == [rid]
            gate.release()
            await trimming
            held = (await direct(small, "working", "memory/timeline", {"owner": me, "limit": 0}))["records"]
            assert [(r["id"], r["content"]) for r in held if r.get("key")] == [(rid, "the new plan")]
            await inproc.call("memory/remember", {"owner": me, "records": [{"content": "turn 4", "session": "s"}]})
            held = (await direct(small, "working", "memory/timeline", {"owner": me, "limit": 0}))["records"]
            assert sorted(r["content"] for r in held) == ["the new plan", "turn 1", "turn 2", "turn 3", "turn 4"]
        finally:
            for gate in inproc.gates:
                gate.release()
            await inproc.router.shutdown()


# ---- reads that fan out while a record moves --------------------------------------------------
# A move writes the destination, reads it back, then deletes the source. A read of every tier at
# once can ask the destination before the write and the source after the delete: the record is in
# neither answer. Here working's call of the read is held until a move of the record to episodic has
# run, and episodic's is answered (empty) before that move begins.


def fanned(method: str) -> Callable[[dict[str, Any]], bool]:
    """The read's own call to a tier, not a move's or a recall count's (those select by id or session)."""
    if method == "memory/recall":
        return lambda params: "query" in params
    if method == "memory/timeline":
        return lambda params: "where" not in params
    return lambda params: True


async def held(gate: Gate, reading: asyncio.Task[Any]) -> bool:
    """Wait until `gate` holds a call or `reading` has finished (it asked no more: False)."""
    waiting = asyncio.ensure_future(gate.reached.wait())
    await asyncio.wait([waiting, reading], return_when=asyncio.FIRST_COMPLETED)
    waiting.cancel()
    return gate.reached.is_set()


async def across(reading: asyncio.Task[Any], source: Gate, dest: Gate,
                 move: Callable[[], Awaitable[Any]]) -> bool:
    """Let `dest` answer, run `move`, then let `source` be asked: the read misses what `move` moved.
    False when `reading` finished without asking (no read left to hold)."""
    if not await held(source, reading):
        return False
    await dest.reached.wait()
    dest.release()
    await asyncio.wait_for(move(), 20)  # a read holding the owner lock while held would block it: fail, not hang
    source.release()
    return True


def gates(inproc: InProcess, method: str, reads: int = 1) -> list[tuple[Gate, Gate]]:
    """(working's call held before it is sent, episodic's held once answered), for `reads` reads in a row."""
    return [(inproc.hold("working", method, fanned(method)),
             inproc.hold("episodic", method, fanned(method), after=True)) for _ in range(reads)]


async def write_turns(inproc: InProcess, me: str, session: str, n: int, start: int = 0) -> None:
    """`n` more turns to `session`: past working's capacity, its oldest records spill."""
    await inproc.call("memory/remember", {"owner": me, "records": [
        {"content": f"turn {i}", "session": session} for i in range(start, start + n)]})


async def test_a_record_spilled_while_it_is_recalled_is_found(inproc: InProcess, stack: Stack) -> None:
    """recall asks every tier at once: a record spilled from working to episodic between episodic's
    answer and working's was in neither, and the recall left it out (once found, once only)."""
    me = owner()
    [rid] = (await inproc.call("memory/remember", {"owner": me, "records": [
        {"content": "the harbour ferry leaves at nine", "session": "s"}]}))["ids"]
    [(source, dest)] = gates(inproc, "memory/recall")
    reading = asyncio.create_task(inproc.call("memory/recall", {"owner": me, "query": "harbour"}))
    assert await across(reading, source, dest, lambda: write_turns(inproc, me, "s", 4))
    assert [t for t, _ in (await homes(stack, me))[rid]] == ["episodic"]
    assert [r["id"] for r in (await reading)["records"]] == [rid]


async def test_a_record_spilled_while_the_timeline_is_read_is_found(inproc: InProcess, stack: Stack) -> None:
    """timeline asks every tier at once, as recall does: the spilled record was missing from the replay."""
    me = owner()
    [rid] = (await inproc.call("memory/remember", {"owner": me, "records": [
        {"content": "the first turn", "session": "s"}]}))["ids"]
    [(source, dest)] = gates(inproc, "memory/timeline")
    reading = asyncio.create_task(inproc.call("memory/timeline", {"owner": me}))
    assert await across(reading, source, dest, lambda: write_turns(inproc, me, "s", 4))
    assert [t for t, _ in (await homes(stack, me))[rid]] == ["episodic"]
    records = (await reading)["records"]
    assert [r["content"] for r in records] == ["the first turn"] + [f"turn {i}" for i in range(4)]
    assert records[0]["id"] == rid and records[0]["tier"] == "episodic"


async def test_a_session_flushed_while_sessions_are_listed_is_listed(inproc: InProcess, stack: Stack) -> None:
    """session/list asks every tier at once: a session/close that moved the whole session to episodic
    in between left the session out of the list (each tier counted it where it was not)."""
    me = owner()
    await inproc.call("memory/remember", {"owner": me, "records": [
        {"content": f"line {i}", "session": "s"} for i in range(2)]})
    [(source, dest)] = gates(inproc, "memory/session/list")
    reading = asyncio.create_task(inproc.call("memory/session/list", {"owner": me}))
    assert await across(reading, source, dest,
                        lambda: inproc.call("memory/session/close", {"owner": me, "session": "s"}))
    assert {t for copies in (await homes(stack, me)).values() for t, _ in copies} == {"episodic"}
    sessions = (await reading)["sessions"]
    assert [(e["session"], e["records"], e["tiers"]) for e in sessions] == [("s", 2, {"episodic": 2})]


async def test_a_recall_that_moves_overlap_twice_is_answered_under_the_owner_lock(inproc: InProcess,
                                                                                 stack: Stack) -> None:
    """The read asked again once a move overlapped it, and a second move overlapped that: it then
    asks with no move of the owner's records in flight (under the owner lock), and misses neither."""
    me = owner()
    ids = (await inproc.call("memory/remember", {"owner": me, "records": [
        {"content": "the harbour ferry leaves at nine", "session": "s"},
        {"content": "the harbour closes at dusk", "session": "s"}]}))["ids"]
    await write_turns(inproc, me, "s", 2)  # at capacity: each further turn spills the oldest record
    (source, dest), (again, again_dest) = gates(inproc, "memory/recall", reads=2)
    reading = asyncio.create_task(inproc.call("memory/recall", {"owner": me, "query": "harbour"}))
    assert await across(reading, source, dest, lambda: write_turns(inproc, me, "s", 1, 2))
    if not await across(reading, again, again_dest, lambda: write_turns(inproc, me, "s", 1, 3)):
        await write_turns(inproc, me, "s", 1, 3)  # it did not ask again: the second move comes after it
    assert [t for rid in ids for t, _ in (await homes(stack, me))[rid]] == ["episodic", "episodic"]
    assert sorted(r["id"] for r in (await reading)["records"]) == sorted(ids)


async def test_a_move_counts_for_a_read_from_when_its_delete_is_sent(inproc: InProcess, stack: Stack) -> None:
    """The read was answered after the source deleted the record but before the delete's reply
    reached the router: a move that counted its delete on the reply looked, to the read, as if it
    had not happened yet."""
    me = owner()
    [rid] = (await inproc.call("memory/remember", {"owner": me, "records": [
        {"content": "the harbour ferry leaves at nine", "session": "s"}]}))["ids"]
    [(source, dest)] = gates(inproc, "memory/recall")
    deleted = inproc.hold("working", "memory/forget", lambda p: rid in p.get("ids", ()), after=True)
    reading = asyncio.create_task(inproc.call("memory/recall", {"owner": me, "query": "harbour"}))
    await asyncio.gather(source.reached.wait(), dest.reached.wait())
    dest.release()
    filling = asyncio.create_task(write_turns(inproc, me, "s", 4))
    await deleted.reached.wait()  # written to episodic, deleted from working, the reply held
    source.release()
    try:
        found = [r["id"] for r in (await asyncio.wait_for(reading, 20))["records"]]
    finally:
        deleted.release()
        await filling
    assert found == [rid]


@pytest.mark.parametrize("method", ["memory/recall", "memory/timeline"])
async def test_a_record_in_both_tiers_mid_move_is_read_once(inproc: InProcess, stack: Stack, method: str) -> None:
    """Between a move's verified write and its delete the record is in both tiers: a read then
    returns it once, the destination's copy (the one fetch returns and repair keeps)."""
    me = owner()
    [rid] = (await inproc.call("memory/remember", {"owner": me, "records": [
        {"content": "the harbour ferry leaves at nine", "session": "s"}]}))["ids"]
    gate = inproc.hold("working", "memory/forget", lambda p: rid in p.get("ids", ()))
    filling = asyncio.create_task(write_turns(inproc, me, "s", 4))
    await gate.reached.wait()
    try:
        assert [t for t, _ in (await homes(stack, me))[rid]] == ["working", "episodic"]
        params = {"owner": me, "query": "harbour"} if method == "memory/recall" else {"owner": me}
        found = [r for r in (await inproc.call(method, params))["records"] if r["id"] == rid]
        assert [r["tier"] for r in found] == ["episodic"]
    finally:
        gate.release()
        await filling


async def test_a_tier_whose_timeline_reply_is_malformed_is_left_out(stack: Stack) -> None:
    """A mounted server may answer a timeline with a record lacking an id or a created_at: the merge
    raised and the whole timeline failed with -32603. That tier is left out and named in `degraded`,
    as a malformed recall reply is."""
    config = load(str(stack.config))

    class Garbling(GatedClient):
        async def call(self, method: str, params: dict[str, Any], *, timeout: float | None = None) -> dict[str, Any]:
            answer = await super().call(method, params, timeout=timeout)
            if self.name == "episodic" and method == "memory/timeline":
                answer = {"records": [{"content": "no id, no time"}, *answer["records"]]}
            return answer

    router = Router(config, client_factory=lambda t: Garbling(t.name, t.url, config.service_token, t.timeout, []))
    await router.startup()
    try:
        me = owner()
        handlers = router.handlers()
        written = (await handlers["memory/remember"]({"owner": me, "records": [{"content": "kept"}]}, Context()))["ids"]
        got = await handlers["memory/timeline"]({"owner": me}, Context())
        assert [r["id"] for r in got["records"]] == written and got["degraded"] == ["episodic"]
    finally:
        await router.shutdown()


class CutOff(GatedClient):
    """Episodic's next `memory/remember` is cut off: the router hears `Unavailable` as on a timeout,
    while the tier applies the write anyway, at once (`late=False`) or only once the router's first
    forget there has been answered (`late=True`: the take-back arrived before the delayed write)."""

    armed: bool = False
    late: bool = False

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.landing: asyncio.Task[Any] | None = None
        self.land = asyncio.Event()
        self.forgets: list[dict[str, Any]] = []

    async def call(self, method: str, params: dict[str, Any], *, timeout: float | None = None) -> dict[str, Any]:
        if self.name == "episodic" and method == "memory/remember" and CutOff.armed:
            CutOff.armed = False
            if not CutOff.late:
                await self.client.call(method, params, timeout=timeout)
                raise Unavailable("connection lost after the request went")

            async def later() -> Any:
                await self.land.wait()
                return await self.client.call(method, params, timeout=timeout)

            self.landing = asyncio.ensure_future(later())
            raise Unavailable("no response in 2 s")
        answer = await super().call(method, params, timeout=timeout)
        if self.name == "episodic" and method == "memory/forget":
            self.forgets.append({**answer, "ids": params["ids"]})
            if self.landing is not None and not self.land.is_set():
                self.land.set()
                await self.landing  # lands after the first forget, before the router hears its answer
        return answer


@pytest.fixture
async def cutoff(stack: Stack) -> Any:
    config = load(str(stack.config))
    clients: dict[str, CutOff] = {}

    def make(t: Any) -> CutOff:
        clients[t.name] = CutOff(t.name, t.url, config.service_token, t.timeout, [])
        return clients[t.name]

    router = Router(config, client_factory=make)
    await router.startup()
    try:
        yield router, clients
    finally:
        CutOff.armed = CutOff.late = False
        await router.shutdown()


async def test_a_take_back_that_arrives_before_the_delayed_write_is_sent_again(cutoff: Any, stack: Stack) -> None:
    """The router's forget on a tier it stopped waiting for may run before that tier applies the
    write: it then finds nothing, and the write lands after it. A take-back that finds fewer records
    than it sent forgets once more after a short pause, which catches a write queued behind it."""
    router, clients = cutoff
    me = owner()
    CutOff.armed, CutOff.late = True, True
    with pytest.raises(A2MError) as caught:
        await router.handlers()["memory/remember"]({"owner": me, "records": [
            {"content": "a turn"}, {"content": "an episode", "tier": "episodic"}]}, Context())
    assert caught.value.code == -32603 and caught.value.data["tier"] == "episodic"
    forgets = clients["episodic"].forgets
    assert [f["forgotten"] for f in forgets] == [0, 1] and forgets[0]["ids"] == forgets[1]["ids"]
    assert await homes(stack, me) == {}


async def test_a_cut_off_write_takes_back_new_records_and_never_deletes_a_replaced_key(cutoff: Any,
                                                                                      stack: Stack) -> None:
    """A keyed write replaces the record in place (same id, revision + 1): forgetting by id would delete
    the key's earlier revision with it. The take-back forgets only the records the batch made new; a
    replacement the tier applied stays, as it does in a tier that answered before another refused."""
    router, clients = cutoff
    me = owner()
    remember = router.handlers()["memory/remember"]
    [kept] = (await remember({"owner": me, "records": [
        {"key": "city", "content": "Rome", "tier": "episodic"}]}, Context()))["ids"]
    CutOff.armed = True
    with pytest.raises(A2MError) as caught:
        await remember({"owner": me, "records": [
            {"content": "a turn"}, {"key": "city", "content": "Milan"},
            {"content": "an episode", "tier": "episodic"}]}, Context())
    assert caught.value.code == -32603
    [forget] = clients["episodic"].forgets
    assert kept not in forget["ids"] and len(forget["ids"]) == 1 and forget["forgotten"] == 1
    held = await homes(stack, me)
    assert list(held) == [kept] and held[kept][0][0] == "episodic"


# ---- two moves of one record at once -------------------------------------------------------------
# A move is write, verify, delete. A second move of the same record in the other direction (a promote
# back, or consolidate's repair of what looks like a duplicate) that runs between the first one's write
# and its delete finds the record in both tiers, keeps the copy in its destination, the first one's
# source, and deletes the other; the first move's delete then takes the last copy. Moves of an owner's
# records run one at a time (the owner lock). Here the first move is held just before its delete.


@pytest.mark.parametrize("second", ["promote", "repair"])
async def test_a_second_move_of_a_record_waits_for_the_first_one_to_finish(inproc: InProcess, stack: Stack,
                                                                           second: str) -> None:
    me = owner()
    rid = f"{me}-fact"
    await direct(stack, "semantic", "memory/remember", {"owner": me, "records": [{"id": rid, "content": "a fact"}]})
    deleting = inproc.hold("semantic", "memory/forget", lambda p: rid in p.get("ids", ()))
    first = asyncio.create_task(inproc.call("memory/promote", {"owner": me, "ids": [rid], "tier": "episodic"}))
    try:
        await asyncio.wait_for(deleting.reached.wait(), 20)
        assert [t for t, _ in (await homes(stack, me))[rid]] == ["episodic", "semantic"]  # written, not deleted
        other = (inproc.call("memory/promote", {"owner": me, "ids": [rid], "tier": "semantic"}) if second == "promote"
                 else inproc.call("memory/consolidate", {"owner": me}))
        later = asyncio.create_task(other)
        # Under the owner lock the second move cannot start until the first has deleted; without it, it
        # ran to the end here (kept semantic's copy, deleted episodic's) in well under this second.
        await asyncio.wait({later}, timeout=1.0)
        deleting.release()
        await asyncio.wait_for(first, 20)
        await asyncio.wait_for(later, 20)
    finally:
        deleting.release()
    held = (await homes(stack, me)).get(rid, [])
    assert len(held) == 1, f"{rid} held {held} after a {second} raced the promote"


async def test_a_record_forgotten_between_a_walk_pages_two_asks_does_not_lose_the_next_one(
        inproc: InProcess, stack: Stack) -> None:
    """A walk over several tiers asks a tier whose page it cut again, for as many records as it kept,
    to learn where its cursor stands (router/walk.py). One of those forgotten in between moved that
    cursor one record further: the record it passed over was never shown, on that page or any other."""
    me = owner()
    stamp = "2026-05-01T00:00:00.{:03d}Z".format
    ids = {}
    for name, odd in (("episodic", 1), ("semantic", 2)):  # interleaved: a page of 4 keeps 2 of each
        ids[name] = (await direct(stack, name, "memory/remember", {"owner": me, "records": [
            {"content": f"{name} {i}", "created_at": stamp(2 * i + odd)} for i in range(6)]}))["ids"]
    gate = inproc.hold("episodic", "memory/timeline", lambda p: p.get("limit") == 2)
    first = asyncio.create_task(inproc.call("memory/timeline", {"owner": me, "limit": 4, "cursor": True}))
    await gate.reached.wait()
    await direct(stack, "episodic", "memory/forget", {"owner": me, "ids": [ids["episodic"][5]]})
    gate.release()
    page = await first
    read, cursor = [r["id"] for r in page["records"]], page["cursor"]
    while cursor is not None:
        page = await inproc.call("memory/timeline", {"owner": me, "limit": 4, "cursor": cursor})
        read[:0] = [r["id"] for r in page["records"]]
        cursor = page["cursor"]
    assert sorted(read) == sorted(ids["semantic"] + ids["episodic"][:5])


async def test_a_move_whose_second_delete_fails_counts_what_its_first_deleted(inproc: InProcess,
                                                                               stack: Stack) -> None:
    """A move deletes its source copies one revision at a time (decision 152). When the call for a
    later revision failed, the records the first call had deleted, moved for good, were left out of
    what the move said it moved: the close answered `flushed: 0` for three records gone to episodic."""
    me = owner()
    ids = (await inproc.call("memory/remember", {"owner": me, "records": [
        {"content": f"turn {i}", "session": "c"} for i in range(3)]}))["ids"]
    [plan] = (await inproc.call("memory/remember", {"owner": me, "records": [
        {"content": "the plan", "key": "plan", "session": "c"}]}))["ids"]
    await inproc.call("memory/remember", {"owner": me, "records": [
        {"content": "the new plan", "key": "plan", "session": "c"}]})  # revision 2
    gone = inproc.hold("working", "memory/forget", lambda p: (p.get("where") or {}).get("revision") == 2,
                       fail=Unavailable("working unreachable"))
    gone.release()
    closed = await inproc.call("memory/session/close", {"owner": me, "session": "c"})
    held = await homes(stack, me)
    assert {i: [t for t, _ in held[i]] for i in ids} == {i: ["episodic"] for i in ids}
    assert sorted(t for t, _ in held[plan]) == ["episodic", "working"]  # a duplicate, repaired by consolidate
    assert closed["flushed"] == 3, closed
