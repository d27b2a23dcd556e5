"""Each race the concurrency test (`test_tier_concurrency.py`) found, forced one way with a `Gate`
(`tests/support/races.py`) on the real engines, so it fails every time on the code before its fix.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Iterator

import pytest

from backends.serve import build
from backends.settings import TierSettings
from backends.surface import TierServer
from tests.support.inprocess import owner
from tests.support.races import REPLICATED, TIERS, Gate, call, tier_servers

pytestmark = pytest.mark.anyio

ONE_SERVER = list(TIERS)


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
async def servers(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[dict[str, TierServer]]:
    async with tier_servers(tmp_path_factory.mktemp("races")) as out:
        yield out


@pytest.fixture
def hold(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Gate]]:
    """`hold(obj, name, ...)`: a `Gate` on that method, opened after the test whatever happened."""
    made: list[Gate] = []

    def make(obj: Any, name: str, **options: Any) -> Gate:
        made.append(Gate(monkeypatch, obj, name, **options))
        return made[-1]

    yield make
    for held in made:
        held.open()


async def remember(server: TierServer, owner: str, records: list[dict[str, Any]]) -> list[str]:
    reply = await call(server, "memory/remember", {"owner": owner, "records": records})
    assert "ids" in reply, reply
    return reply["ids"]


async def fetch(server: TierServer, owner: str, key: str) -> dict[str, Any] | None:
    return (await call(server, "memory/fetch", {"owner": owner, "key": key}))["record"]


@pytest.mark.parametrize("label", ONE_SERVER)
async def test_a_touch_and_a_reinforce_while_a_replace_is_in_flight_are_kept(
        servers: dict[str, TierServer], label: str, hold: Callable[..., Gate]) -> None:
    """The replace read the record's statistics before the recall and the reinforce landed; its write
    used to put the old ones back (access_count 0, salience 0.5)."""
    server, me = servers[label], owner()
    [first] = await remember(server, me, [{"key": "user/city", "content": "Rome", "session": "s"}])
    gate = hold(server.store, "write")
    replace = asyncio.create_task(remember(server, me, [{"key": "user/city", "content": "Milan", "session": "s"}]))
    await gate.reached()
    recalled = await call(server, "memory/recall", {"owner": me, "where": {"id": [first]}})
    assert [r["id"] for r in recalled["records"]] == [first]
    assert (await call(server, "memory/reinforce", {"owner": me, "ids": [first], "amount": 0.25}))["reinforced"] == 1
    gate.release()
    assert await asyncio.wait_for(replace, 20) == [first]
    held = await fetch(server, me, "user/city")
    assert held is not None
    assert (held["content"], held["revision"], held["access_count"], held["salience"]) == ("Milan", 2, 1, 0.75)
    assert held["accessed_at"] == recalled["records"][0]["accessed_at"]


@pytest.mark.parametrize("selector", ["ids", "key_prefix", "session"])
@pytest.mark.parametrize("label", ONE_SERVER)
async def test_a_forget_while_a_replace_is_in_flight_is_not_undone(
        servers: dict[str, TierServer], label: str, selector: str, hold: Callable[..., Gate]) -> None:
    """The replace was resolved against the record the forget then deleted; its write used to put
    that id back (revision 2, its access history too). Now the key is written anew: a new id, revision 1."""
    server, me = servers[label], owner()
    [first] = await remember(server, me, [{"key": "user/city", "content": "Rome", "session": "s"}])
    gate = hold(server.store, "write")
    replace = asyncio.create_task(remember(server, me, [{"key": "user/city", "content": "Milan", "session": "s"}]))
    await gate.reached()
    chosen = {"ids": {"ids": [first]}, "key_prefix": {"key_prefix": "user/"}, "session": {"where": {"session": "s"}}}
    assert await call(server, "memory/forget", {"owner": me, **chosen[selector]}) == {"forgotten": 1}
    gate.release()
    [written] = await asyncio.wait_for(replace, 20)
    held = await fetch(server, me, "user/city")
    assert held is not None and written != first
    assert (held["id"], held["content"], held["revision"]) == (written, "Milan", 1)
    assert (await call(server, "memory/recall", {"owner": me, "where": {"id": [first]}}))["records"] == []


@pytest.mark.parametrize("label", ONE_SERVER)
async def test_the_second_of_two_first_writes_of_one_client_id_writes_nothing(
        servers: dict[str, TierServer], label: str, hold: Callable[..., Gate]) -> None:
    """Both found the id free; the second used to overwrite the first after it was answered and read
    (content replaced, the recall's touch lost). An existing id is returned, no second record is made."""
    server, me = servers[label], owner()
    gate = hold(server.store, "write", calls=2)
    writes = {asyncio.create_task(remember(server, me, [{"id": f"{me}-c", "content": content, "session": "s"}])): content
              for content in ("one", "two")}
    await gate.reached(2)
    gate.release(0)  # whichever got there first
    done, _ = await asyncio.wait(writes, timeout=20, return_when=asyncio.FIRST_COMPLETED)
    [first] = done
    assert first.result() == [f"{me}-c"]
    recalled = await call(server, "memory/recall", {"owner": me, "where": {"id": [f"{me}-c"]}})
    assert [r["content"] for r in recalled["records"]] == [writes[first]]
    gate.release(1)
    [second] = set(writes) - done
    assert await asyncio.wait_for(second, 20) == [f"{me}-c"]
    held = (await call(server, "memory/timeline", {"owner": me}))["records"]
    assert [(r["content"], r["access_count"]) for r in held] == [(writes[first], 1)]


async def test_a_working_forget_takes_a_record_replaced_in_place_after_it_read_it(
        servers: dict[str, TierServer], hold: Callable[..., Gate]) -> None:
    """The forget deletes what it read only if unchanged (a new version may have left its scope); a
    replace in the same session in between used to make it skip the record: forgotten 0, and the
    record, in scope all along, stayed."""
    server, me = servers["working"], owner()
    [first] = await remember(server, me, [{"key": "user/city", "content": "Rome", "session": "s"}])
    gate = hold(server.store, "_scan", after=True)
    forget = asyncio.create_task(call(server, "memory/forget", {"owner": me, "where": {"session": "s"}}))
    await gate.reached()
    assert await remember(server, me, [{"key": "user/city", "content": "Milan", "session": "s"}]) == [first]
    gate.release()
    assert await asyncio.wait_for(forget, 20) == {"forgotten": 1}
    assert await fetch(server, me, "user/city") is None


async def _until_a_delete_waits_for_a_lock(dsn: str, within: float = 20.0) -> None:
    """Until a DELETE on `dsn`'s database waits for a row lock. A fixed sleep did not wait for that:
    on a loaded machine the forget's DELETE had not started when the other transaction locked both
    rows, and there was no deadlock for the test to see run again (it passed without testing it)."""
    import time

    import psycopg

    deadline = time.monotonic() + within
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as watcher:  # a fresh snapshot a query
        while not (await (await watcher.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock' AND query ILIKE 'DELETE%'")).fetchone() or (0,))[0]:
            assert time.monotonic() < deadline, "the forget's DELETE never waited for the locked row"
            await asyncio.sleep(0.01)


async def test_an_episodic_forget_that_deadlocks_with_a_write_is_run_again(servers: dict[str, TierServer]) -> None:
    """PostgreSQL aborts one of two statements that lock rows in opposite orders; the forget's was
    answered -32603 "unavailable" (a down tier to the router) though nothing was wrong with either."""
    import psycopg

    server, me = servers["episodic"], owner()
    a, b = await remember(server, me, [{"content": "one", "session": "s"}, {"content": "two", "session": "s"}])
    async with await psycopg.AsyncConnection.connect(server.store.dsn) as other:  # type: ignore[attr-defined]
        await other.execute("SET deadlock_timeout = '30s'")  # the forget's session finds the deadlock
        await other.execute("UPDATE records SET salience = 0.9 WHERE id = %s", [b])  # holds b
        forget = asyncio.create_task(call(server, "memory/forget", {"owner": me, "where": {"session": "s"}}))
        await _until_a_delete_waits_for_a_lock(server.store.dsn)  # type: ignore[attr-defined]  # holds a, waits for b
        await other.execute("UPDATE records SET salience = 0.9 WHERE id = %s", [a])  # waits for a: a cycle
        await other.commit()
    assert await asyncio.wait_for(forget, 20) == {"forgotten": 2}


@pytest.mark.parametrize("tier", REPLICATED)
async def test_two_replicas_replacing_one_key_at_once_write_two_revisions(
        servers: dict[str, TierServer], tier: str, hold: Callable[..., Gate]) -> None:
    """Both resolved revision 1; both used to write revision 2, the first one's content lost with no
    trace (decision 42 recorded it as a cost). The second now finds revision 2 and writes 3."""
    one, two, me = servers[tier], servers[tier + "2"], owner()
    [first] = await remember(one, me, [{"key": "user/city", "content": "Rome"}])
    gate = hold(one.store, "write")
    late = asyncio.create_task(remember(one, me, [{"key": "user/city", "content": "Milan"}]))
    await gate.reached()
    assert await remember(two, me, [{"key": "user/city", "content": "Turin"}]) == [first]
    assert (await fetch(two, me, "user/city") or {})["revision"] == 2
    gate.release()
    assert await asyncio.wait_for(late, 20) == [first]
    held = await fetch(one, me, "user/city")
    assert held is not None and (held["content"], held["revision"]) == ("Milan", 3)


@pytest.mark.parametrize("tier", REPLICATED)
async def test_a_move_resolved_before_a_newer_revision_landed_on_another_replica_is_ignored(
        servers: dict[str, TierServer], tier: str, hold: Callable[..., Gate]) -> None:
    """The move (revision 2) found revision 1 and deleted it for its own record; meanwhile the other
    replica had written revisions 2 and 3: both acknowledged writes were lost and the key's revision
    went back to 2. Newer revision wins (decision 3): the move is ignored."""
    one, two, me = servers[tier], servers[tier + "2"], owner()
    [first] = await remember(one, me, [{"key": "user/city", "content": "Rome"}])
    gate = hold(one.store, "write")
    move = asyncio.create_task(remember(one, me, [{"id": f"{me}-moved", "key": "user/city", "content": "Naples",
                                                   "revision": 2, "created_at": "2026-01-01T00:00:00.000Z"}]))
    await gate.reached()
    for city in ("Turin", "Milan"):
        assert await remember(two, me, [{"key": "user/city", "content": city}]) == [first]
    gate.release()
    assert await asyncio.wait_for(move, 20) == [first]
    held = await fetch(one, me, "user/city")
    assert held is not None and (held["id"], held["content"], held["revision"]) == (first, "Milan", 3)


async def test_a_semantic_read_during_a_replace_by_another_id_sees_one_record_for_the_key(
        servers: dict[str, TierServer], hold: Callable[..., Gate]) -> None:
    """Qdrant Edge applies a write's puts and its deletes as two updates, in a worker thread; a read
    between them showed the key's old and new record both (a move's write half done)."""
    server, me = servers["semantic"], owner()
    [first] = await remember(server, me, [{"key": "user/city", "content": "Rome"}])
    gate = hold(server.store._engine, "_update", skip=1)  # type: ignore[attr-defined]  # the deletes
    move = asyncio.create_task(remember(server, me, [{"id": f"{me}-moved", "key": "user/city", "content": "Naples",
                                                      "revision": 2, "created_at": "2026-01-01T00:00:00.000Z"}]))
    await gate.reached()
    reads = [asyncio.create_task(call(server, method, {"owner": me, **params})) for method, params in (
        ("memory/timeline", {}), ("memory/recall", {"touch": False}), ("memory/recall", {"query": "Rome Naples"}))]
    await asyncio.sleep(0.05)
    gate.release()
    assert await asyncio.wait_for(move, 20) == [f"{me}-moved"]
    for read in reads:
        assert [r["id"] for r in (await read)["records"]] == [f"{me}-moved"]
    assert first != f"{me}-moved"


@pytest.mark.parametrize("label", ONE_SERVER)
async def test_first_vectors_of_different_widths_at_once_fix_one_width(label: str, tmp_path: Path) -> None:
    """Each write found no width yet and passed the surface's check. The procedural tier stored all
    three widths (vectors of the others are never found by a vector recall and cannot move to
    episodic); the other tiers refused the losers with -32602, where the protocol says -32008."""
    engine, options = TIERS[label]
    server = build(engine, TierSettings(name=engine, data_dir=tmp_path / label, options=dict(options)))
    await server.startup()
    try:
        replies = await asyncio.gather(*(call(server, "memory/remember", {"records": [
            {"content": f"{width} wide", "embedding": [1.0] * width}]}) for width in (3, 4, 5)))
        assert sum("ids" in reply for reply in replies) == 1, replies
        assert sorted(reply.get("error", 0) for reply in replies) == [-32008, -32008, 0], replies
        held = (await call(server, "memory/timeline", {"embeddings": True}))["records"]
        assert len(held) == 1 and (await call(server, "memory/describe", {}))["embeddings"]["dimensions"] == len(
            held[0]["embedding"])
    finally:
        await server.shutdown()


@pytest.mark.parametrize("label", ONE_SERVER)
async def test_two_recalls_of_one_record_at_once_each_show_the_count_they_made(
        servers: dict[str, TierServer], label: str, hold: Callable[..., Gate]) -> None:
    """Both recalls read access_count 0 before either touched the record; both answered 1 though it
    was 2. The router counts a recall twice with two such calls at once and promotes on the count
    they answer (decision 9): the record that reached promote_after was never queued."""
    server, me = servers[label], owner()
    [first] = await remember(server, me, [{"content": "recalled twice", "session": "s"}])
    gate = hold(server.store, "touch", calls=2)
    recalls = [asyncio.create_task(call(server, "memory/recall", {"owner": me, "where": {"id": [first]}}))
               for _ in range(2)]
    await gate.reached(2)
    gate.release(0)
    gate.release(1)
    answers = [await asyncio.wait_for(recall, 20) for recall in recalls]
    assert sorted([r["access_count"] for r in answer["records"]] for answer in answers) == [[1], [2]]
    held = (await call(server, "memory/timeline", {"owner": me}))["records"]
    assert [r["access_count"] for r in held] == [2]
