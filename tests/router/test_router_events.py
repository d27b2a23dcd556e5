"""The router's own event log in front of real tier servers (Redis, PostgreSQL, both embedded): one
`consolidated` event per spill pass, `written` events in the batch's order, moves that never read as
a forget and a write, the methods that say nothing, and a restart. Ground truth from the tiers."""

from __future__ import annotations

from typing import Any, Iterator

import pytest

from a2m.client import HTTPClient
from a2m.errors import A2MError

from .stack import Stack, federation, new_owner, tier_call

WINDOW = 64  # events_capacity: small enough to overflow, larger than any other test's events
TIERS = [
    {"name": "working", "kind": "working", "capacity": 3, "spill_to": "episodic", "timeout": 10.0},
    {"name": "episodic", "kind": "episodic", "timeout": 10.0},
]


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with federation(tmp_path_factory.mktemp("router-events"), TIERS, mode="real",
                    top={"events_capacity": WINDOW}) as stack:
        yield stack


async def head(router: HTTPClient, owner: str) -> str:
    return (await router.call("memory/events", {"owner": owner}))["cursor"]


async def since(router: HTTPClient, cursor: str, owner: str) -> list[dict[str, Any]]:
    page = await router.call("memory/events", {"owner": owner, "cursor": cursor, "limit": 0})
    assert not page.get("reset") and not page.get("more"), page
    return page["events"]


async def held(stack: Stack, owner: str) -> dict[str, str]:
    """id -> the tier holding it, read from the tier servers."""
    out: dict[str, str] = {}
    for name in stack.tiers:
        for record in (await tier_call(stack, name, "memory/timeline", {"owner": owner, "limit": 0}))["records"]:
            assert record["id"] not in out, f"{record['id']} in two tiers"
            out[record["id"]] = name
    return out


@pytest.mark.anyio
async def test_a_write_that_spills_several_sessions_is_one_consolidated_event(real: Stack) -> None:
    """One write, one spill pass: it told one `consolidated` event per session it trimmed (three
    here; a 500-record import across 50 sessions, fifty), where the protocol coalesces a pass."""
    me = new_owner()
    async with HTTPClient(real.url, timeout=30) as router:
        cursor = await head(router, me)
        ids = (await router.call("memory/remember", {"owner": me, "records": [
            {"content": f"turn {i} of {s}", "session": s} for s in ("s1", "s2", "s3") for i in range(5)]}))["ids"]
        events = await since(router, cursor, me)
    where = await held(real, me)
    assert sorted(where[i] for i in ids).count("episodic") == 6
    consolidated = [e for e in events if e["kind"] == "consolidated"]
    assert len(consolidated) == 1, consolidated
    assert {k: consolidated[0][k] for k in ("moved", "promoted", "dropped", "summarized")} == {
        "moved": 6, "promoted": 0, "dropped": 0, "summarized": 0}
    assert consolidated[0]["tier"] == "working" and "session" not in consolidated[0]
    assert [e["id"] for e in events if e["kind"] == "written"] == ids  # the spill wrote and forgot nothing
    assert [e["kind"] for e in events] == ["written"] * 15 + ["consolidated"]


@pytest.mark.anyio
async def test_a_spill_of_one_session_names_it(real: Stack) -> None:
    me = new_owner()
    async with HTTPClient(real.url, timeout=30) as router:
        cursor = await head(router, me)
        await router.call("memory/remember", {"owner": me, "records": [
            {"content": f"turn {i}", "session": "only"} for i in range(5)]})
        events = await since(router, cursor, me)
    [consolidated] = [e for e in events if e["kind"] == "consolidated"]
    assert (consolidated["moved"], consolidated["tier"], consolidated["session"]) == (2, "working", "only")


@pytest.mark.anyio
async def test_written_events_follow_the_batch_not_the_tiers(real: Stack) -> None:
    """Tiers where a key is replaced are written last (a new record can be taken back, a replacement
    cannot), and the events followed that order: the batch's second record was told first."""
    me = new_owner()
    async with HTTPClient(real.url, timeout=30) as router:
        [kept] = (await router.call("memory/remember", {"owner": me, "records": [
            {"content": "city: Lyon", "key": "user/city", "tier": "episodic"}]}))["ids"]
        cursor = await head(router, me)
        ids = (await router.call("memory/remember", {"owner": me, "records": [
            {"content": "city: Porto", "key": "user/city"}, {"content": "a new note"},
            {"content": "an old note", "tier": "episodic"}, {"content": "another", "session": "s"}]}))["ids"]
        events = await since(router, cursor, me)
    assert ids[0] == kept
    assert [(e["id"], e["tier"], e.get("revision")) for e in events] == [
        (kept, "episodic", 2), (ids[1], "working", None), (ids[2], "episodic", None), (ids[3], "working", None)]


@pytest.mark.anyio
async def test_moves_never_read_as_a_forget_and_a_write(real: Stack) -> None:
    """Promote, session close and consolidate move records between tiers (a write there, a delete
    here): the router tells each as its own event, never as `written` or `forgotten`."""
    me = new_owner()
    async with HTTPClient(real.url, timeout=30) as router:
        ids = (await router.call("memory/remember", {"owner": me, "records": [
            {"content": f"talk {i}", "session": "chat"} for i in range(3)]}))["ids"]
        cursor = await head(router, me)
        promoted = await router.call("memory/promote", {"owner": me, "ids": ids[:1], "tier": "episodic"})
        closed = await router.call("memory/session/close", {"owner": me, "session": "chat"})
        done = await router.call("memory/consolidate", {"owner": me})
        events = await since(router, cursor, me)
    assert promoted == {"promoted": 1} and closed["flushed"] == 2 and done["moved"] == 0
    assert set((await held(real, me)).values()) == {"episodic"}
    assert [e["kind"] for e in events] == ["promoted", "session_closed", "consolidated", "consolidated"]
    assert (events[0]["ids"], events[0]["tier"]) == (ids[:1], "episodic")
    assert events[1]["session"] == "chat"
    assert (events[2]["moved"], events[2]["session"]) == (2, "chat")
    assert {k: events[3][k] for k in ("moved", "promoted", "dropped", "summarized")} == {
        "moved": 0, "promoted": 0, "dropped": 0, "summarized": 0}


@pytest.mark.anyio
async def test_reads_reinforce_and_failed_calls_say_nothing(real: Stack) -> None:
    """The protocol's events are writes, forgets, promotions, consolidations and closes: a recall
    (which counts towards promotion in the background), a timeline, a fetch, a reinforce, a session
    list and a call refused for its params add nothing to the log."""
    me = new_owner()
    async with HTTPClient(real.url, timeout=30) as router:
        ids = (await router.call("memory/remember", {"owner": me, "records": [
            {"content": "the ferry leaves at nine", "key": "ferry"}]}))["ids"]
        cursor = await head(router, me)
        await router.call("memory/recall", {"owner": me, "query": "ferry"})
        await router.call("memory/timeline", {"owner": me})
        await router.call("memory/fetch", {"owner": me, "key": "ferry"})
        assert await router.call("memory/reinforce", {"owner": me, "ids": ids, "amount": 0.2}) == {"reinforced": 1}
        await router.call("memory/session/list", {"owner": me})
        await router.call("memory/describe", {"owner": me})
        for method, params in (("memory/remember", {"records": []}), ("memory/forget", {}),
                               ("memory/promote", {"ids": ids, "tier": "nowhere"}),
                               ("memory/session/close", {"session": ""})):
            with pytest.raises(A2MError):
                await router.call(method, {"owner": me, **params})
        await router.call("memory/recall", {"owner": me, "query": "ferry"})  # its count is flushed by now
        assert await since(router, cursor, me) == []


@pytest.mark.anyio
async def test_after_a_restart_an_old_cursor_resets_and_old_events_are_gone(real: Stack) -> None:
    """The log lives in the router's memory (protocol: "lives in server memory"; describe promises
    nothing more): a cursor from before a restart is another server's, `reset: true`, and the poll
    continues from the oldest event kept since the restart, none from before it."""
    me = new_owner()
    async with HTTPClient(real.url, timeout=30) as router:
        cursor = await head(router, me)
        before = (await router.call("memory/remember", {"owner": me, "records": [{"content": "before"}]}))["ids"]
        assert [e["id"] for e in await since(router, cursor, me)] == before
    real.router.stop()
    real.router.start()
    real.router.wait()
    async with HTTPClient(real.url, timeout=30) as router:
        after = (await router.call("memory/remember", {"owner": me, "records": [{"content": "after"}]}))["ids"]
        page = await router.call("memory/events", {"owner": me, "cursor": cursor})
        assert page["reset"] is True and [e["id"] for e in page["events"]] == after
        again = await router.call("memory/events", {"owner": me, "cursor": page["cursor"]})
        assert again["events"] == [] and "reset" not in again
        described = await router.call("memory/describe", {})
    assert described["events"] == {"push": False}


@pytest.mark.anyio
async def test_a_promote_cut_short_still_tells_what_it_moved(tmp_path_factory: pytest.TempPathFactory) -> None:
    """A promote that moved records out of one tier and then failed on the next (down) answers an
    error, as it should, but told nothing of the records it had already moved: a consumer of the
    events kept them in working. One `promoted` event still says what moved, as a forget cut short
    says what it forgot."""
    tiers = [{"name": "working", "kind": "working", "spill_to": "episodic", "timeout": 5.0},
             {"name": "episodic", "kind": "episodic", "timeout": 5.0},
             {"name": "semantic", "kind": "semantic", "timeout": 5.0}]
    me = new_owner()
    with federation(tmp_path_factory.mktemp("promote-cut"), tiers, mode="real") as stack:
        async with HTTPClient(stack.url, timeout=30) as router:
            [x] = (await router.call("memory/remember", {"owner": me, "records": [{"content": "move me"}]}))["ids"]
            cursor = await head(router, me)
            stack.tiers["episodic"].kill()
            with pytest.raises(A2MError) as failed:
                await router.call("memory/promote", {"owner": me, "ids": [x, "elsewhere"], "tier": "semantic"})
            assert failed.value.code == -32603, failed.value
            events = await since(router, cursor, me)
            there = (await tier_call(stack, "semantic", "memory/timeline", {"owner": me}))["records"]
    assert [r["id"] for r in there] == [x]
    assert [(e["kind"], e.get("ids"), e.get("tier")) for e in events] == [("promoted", [x], "semantic")]


@pytest.mark.anyio
async def test_a_bulk_writer_overflowing_the_window_resets_only_its_own_cursor(real: Stack) -> None:
    """Each owner keeps its own newest `events_capacity` events; only its own push them out. The bulk
    writer's cursor fell out of its window: `reset: true`, and the poll continues from its oldest kept
    event to its newest, a whole window of them. A quiet owner loses nothing."""
    bulk, quiet = new_owner(), new_owner()
    async with HTTPClient(real.url, timeout=30) as router:
        cursors = {o: await head(router, o) for o in (bulk, quiet)}
        kept = (await router.call("memory/remember", {"owner": quiet, "records": [
            {"content": "quiet one"}, {"content": "quiet two"}]}))["ids"]
        ids = (await router.call("memory/remember", {"owner": bulk, "records": [
            {"content": f"bulk {i}", "tier": "episodic"} for i in range(WINDOW + 16)]}))["ids"]
        page = await router.call("memory/events", {"owner": bulk, "cursor": cursors[bulk], "limit": 0})
        assert page["reset"] is True
        got = [e["id"] for e in page["events"]]
        assert got == ids[-WINDOW:]
        again = await router.call("memory/events", {"owner": bulk, "cursor": page["cursor"]})
        assert again["events"] == [] and "reset" not in again
        assert [e["id"] for e in await since(router, cursors[quiet], quiet)] == kept


@pytest.mark.anyio
async def test_writes_into_a_gated_tier_are_told_by_it_at_the_approve_not_by_the_router(tmp_path: Any) -> None:
    """A reviewed procedural tier holds a write on `proposed` until `memory/approve` (decision 101)
    and describes itself `gated`: the router tells nothing of what it routed there (a `written`
    for a record no recall shows yet), while the write it routed elsewhere is told as ever."""
    tiers = [{"name": "working", "kind": "working", "serve": "fixture"},
             {"name": "procedural", "kind": "procedural", "serve": "real", "args": ["--option", "review=true"]}]
    me = new_owner()
    with federation(tmp_path, tiers) as stack:
        async with HTTPClient(stack.url, timeout=30) as router:
            described = await tier_call(stack, "procedural", "memory/describe", {"owner": me})
            assert described["tiers"][0].get("gated") is True, described
            cursor = await head(router, me)
            ids = (await router.call("memory/remember", {"owner": me, "records": [
                {"content": "said hello"}, {"content": "deploy: run make ship", "tier": "procedural"}]}))["ids"]
            assert [(e["kind"], e["id"]) for e in await since(router, cursor, me)] == [("written", ids[0])]
            tier_cursor = (await tier_call(stack, "procedural", "memory/events", {"owner": me}))["cursor"]
            await tier_call(stack, "procedural", "memory/approve", {})
            told = (await tier_call(stack, "procedural", "memory/events", {"owner": me, "cursor": tier_cursor}))
            assert [(e["kind"], e["id"]) for e in told["events"]] == [("written", ids[1])]
            cursor = await head(router, me)
            assert await router.call("memory/forget", {"owner": me, "ids": [ids[1]]}) == {"forgotten": 1}
            assert await since(router, cursor, me) == []  # proposed: told by the tier at the next approve
            await router.call("memory/remember", {"owner": me, "records": [{"content": "kept", "tier": "procedural"}]})
            await tier_call(stack, "procedural", "memory/approve", {})
            cursor = await head(router, me)
            assert await router.call("memory/forget", {"owner": me, "query": "said kept"}) == {"forgotten": 2}
            assert [(e["kind"], e["count"]) for e in await since(router, cursor, me)] == [("forgotten", 1)]
            # A move there could never be verified (no read shows a proposal): refused before any write.
            ids = (await router.call("memory/remember", {"owner": me, "records": [{"content": "how to roll back"}]}))["ids"]
            with pytest.raises(A2MError) as refused:
                await router.call("memory/promote", {"owner": me, "ids": ids, "tier": "procedural"})
            assert refused.value.code == -32602 and "memory/approve" in str(refused.value), refused.value
            history = await tier_call(stack, "procedural", "memory/history", {"owner": me, "id": ids[0]})
            assert history["revisions"] == [], history
