"""The semantic store on both Qdrant engines: Qdrant Edge and qdrant-client (local mode).

Every test runs against the real engine: Edge's shard in a temp directory, and
qdrant-client's local mode on disk, so both code paths of `backends.semantic`
run on every CI run.
"""

from __future__ import annotations

import math
import os
import random
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import AsyncIterator

import anyio
import pytest

from a2m.filters import Scope
from a2m.records import Record
from backends.semantic import CAPABILITIES, KIND, SemanticStore, make_store
from backends.semantic.client import ClientEngine
from backends.semantic.edge import EdgeEngine
from backends.semantic.store import Engine
from backends.settings import TierSettings
from backends.store import SessionInfo, StoreRejected, StoreUnavailable, StoreWidthMismatch
from tests.support.races import Gate

pytestmark = pytest.mark.anyio

ENGINES = ["edge", "local"]
ROOT = Path(__file__).resolve().parents[2]


def settings(engine: str, data_dir: Path) -> TierSettings:
    return TierSettings("semantic", data_dir, options={"engine": engine} if engine == "local" else {})


@pytest.fixture(params=ENGINES)
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[SemanticStore]:
    s = make_store(settings(request.param, tmp_path))
    await s.open()
    try:
        yield s
    finally:
        await s.close()


def rec(i: int | str, content: str = "", *, second: int = 0, **fields: object) -> Record:
    fields.setdefault("owner", "alice")
    return Record(id=str(i), content=content or f"fact number {i}",
                  created_at=f"2026-03-01T10:00:{second:02d}.000Z", **fields)  # type: ignore[arg-type]


def ids(records: list[Record]) -> list[str]:
    return [r.id for r in records]


async def test_package_surface(tmp_path: Path) -> None:
    assert KIND == "semantic"
    assert {"core", "keys", "embeddings", "summarize"} <= CAPABILITIES
    assert make_store(TierSettings("semantic", tmp_path)).engine == "qdrant-edge"
    assert make_store(settings("local", tmp_path)).engine == "qdrant-local"
    assert make_store(TierSettings("semantic", tmp_path, url="http://127.0.0.1:6333")).engine == "qdrant"


async def test_write_get_and_select_in_creation_order(store: SemanticStore) -> None:
    # ties on created_at are broken by insertion order, across the limit boundary too
    batch = [rec("c", second=2), rec("a", second=1), rec("b", second=1), rec("d", second=1), rec("e", second=3)]
    await store.write(batch)
    assert ids(await store.select(Scope(owner="alice"))) == ["a", "b", "d", "c", "e"]
    assert ids(await store.select(Scope(owner="alice"), order="desc")) == ["e", "c", "d", "b", "a"]
    assert ids(await store.select(Scope(owner="alice"), limit=2)) == ["a", "b"]
    assert ids(await store.select(Scope(owner="alice"), order="desc", limit=3)) == ["e", "c", "d"]
    got = await store.get("alice", ["b", "zz", "a"])
    assert ids(got) == ["b", "a"]
    assert got[0].content == "fact number b" and got[0].score is None and got[0].embedding is None
    assert await store.get("bob", ["a"]) == []


async def test_records_come_back_complete(store: SemanticStore) -> None:
    full = Record(id="x1", content="Prefers green tea", created_at="2026-03-01T10:00:00.000Z", role="user",
                  metadata={"source": "chat", "n": 2, "tags": ["a", "b"]}, group="g1", tier="semantic",
                  salience=0.8, access_count=3, accessed_at="2026-03-02T10:00:00.000Z", owner="alice",
                  session="s1", key="pref/tea", revision=4, embedding=[0.25, -1.5, 3.0],
                  uri="file:///tea.txt", media_type="text/plain")
    await store.write([full])
    [back] = await store.get("alice", ["x1"], with_embeddings=True)
    assert back == full
    [plain] = await store.select(Scope(owner="alice"))
    assert plain.embedding is None and plain.with_(embedding=full.embedding) == full


async def test_get_keys(store: SemanticStore) -> None:
    await store.write([rec(1, key="user/city"), rec(2, key="user/name"), rec(3, key="user/city", owner="bob")])
    found = await store.get_keys("alice", ["user/city", "user/name", "nope"])
    assert {k: r.id for k, r in found.items()} == {"user/city": "1", "user/name": "2"}
    assert {k: r.id for k, r in (await store.get_keys("bob", ["user/city"])).items()} == {"user/city": "3"}
    assert await store.get_keys(None, ["user/city"]) == {}


async def test_corrected_fact_is_the_only_version(store: SemanticStore) -> None:
    await store.write([rec("v1", "The user lives in Bologna", key="user/city")])
    # the surface's key replacement: the new version put, the old one deleted, in one write
    await store.write([rec("v2", "The user lives in Milan", key="user/city", revision=2, second=5)], ["v1"])
    assert await store.search(Scope(owner="alice"), text="Bologna", vector=None, limit=5) == []
    assert ids(await store.search(Scope(owner="alice"), text="Milan", vector=None, limit=5)) == ["v2"]
    [current] = (await store.get_keys("alice", ["user/city"])).values()
    assert current.id == "v2" and current.revision == 2
    # a correction in place (same id re-put) also drops the old terms
    await store.write([rec("v2", "The user lives in Turin", key="user/city", revision=3, second=6)])
    assert await store.search(Scope(owner="alice"), text="Milan", vector=None, limit=5) == []
    assert ids(await store.search(Scope(owner="alice"), text="Turin", vector=None, limit=5)) == ["v2"]
    assert await store.count("alice") == 1


async def test_non_ascii_and_cjk_found_lexically(store: SemanticStore) -> None:
    await store.write([rec(1, "Lives in Città di Castello"), rec(2, "我喜欢吃寿司"), rec(3, "Works on rockets")])
    assert await store.dimensions() is None
    hits = await store.search(Scope(owner="alice"), text="citta", vector=None, limit=5)
    assert ids(hits) == ["1"] and 0 < hits[0].score <= 1
    assert ids(await store.search(Scope(owner="alice"), text="寿司", vector=None, limit=5)) == ["2"]
    # a text of only stopwords, and no vector, finds nothing
    assert await store.search(Scope(owner="alice"), text="the of and", vector=None, limit=5) == []


async def test_owner_isolation(store: SemanticStore) -> None:
    await store.write([rec("a", "shared secret word", owner="alice", key="k", session="s"),
                       rec("b", "shared secret word", owner="bob", key="k", session="s"),
                       rec("n", "shared secret word", owner=None, key="k", session="s"),
                       rec("e", "shared secret word", owner="", key="k", session="s")])
    for owner, only in (("alice", "a"), ("bob", "b"), (None, "n"), ("", "e")):
        assert ids(await store.select(Scope(owner=owner))) == [only]
        assert ids(await store.search(Scope(owner=owner), text="secret", vector=None, limit=10)) == [only]
        assert ids(await store.get(owner, ["a", "b", "n", "e"])) == [only]
        assert [r.id for r in (await store.get_keys(owner, ["k"])).values()] == [only]
        assert await store.count(owner) == 1
        assert [(s.session, s.records) for s in await store.sessions(owner)] == [("s", 1)]
    await store.touch("bob", ["a"], "2026-04-01T00:00:00.000Z")
    assert await store.reinforce("bob", ["a"], 0.3) == 0
    assert await store.delete(Scope(owner=None)) == 1
    [a] = await store.get("alice", ["a"])
    assert a.access_count == 0 and a.salience == 0.5
    assert await store.count("alice") == await store.count("bob") == await store.count("") == 1


async def test_hybrid_dense_and_sparse(store: SemanticStore) -> None:
    await store.write([
        rec(1, "The cat sleeps on the sofa", embedding=[1.0, 0.0, 0.0]),
        rec(2, "Quarterly revenue grew", embedding=[0.0, 1.0, 0.0]),
        rec(3, "The cat chased a revenue report", embedding=[0.7, 0.7, 0.0]),
        rec(4, "no vector here about cats"),
    ])
    assert await store.dimensions() == 3
    dense = await store.search(Scope(owner="alice"), text=None, vector=[0.0, 1.0, 0.0], limit=2)
    assert ids(dense) == ["2", "3"] and dense[0].score == pytest.approx(1.0, abs=1e-5)
    lexical = await store.search(Scope(owner="alice"), text="the cat", vector=None, limit=10)
    assert set(ids(lexical)) == {"1", "3", "4"}
    both = await store.search(Scope(owner="alice"), text="cat revenue", vector=[0.7, 0.7, 0.0], limit=10)
    assert ids(both)[0] == "3"  # first in both lists
    assert all(0 <= r.score <= 1 for r in both) and both[0].score == pytest.approx(1.0)
    assert [r.score for r in both] == sorted((r.score for r in both), reverse=True)
    filtered = await store.search(Scope(owner="alice", where={"id": ["1", "2"]}), text="revenue cat",
                                  vector=[0.7, 0.7, 0.0], limit=10)
    assert set(ids(filtered)) == {"1", "2"}
    with_vectors = await store.search(Scope(owner="alice"), text=None, vector=[1.0, 0, 0], limit=1, with_embeddings=True)
    assert with_vectors[0].embedding == [1.0, 0.0, 0.0]
    with pytest.raises(StoreRejected):
        await store.search(Scope(owner="alice"), text=None, vector=[1.0, 0.0], limit=3)


async def test_where_key_prefix_and_time_ranges(store: SemanticStore) -> None:
    await store.write([
        rec(1, role="user", key="pref/food/pizza", metadata={"topic": "food", "n": 1, "ok": True}, second=1),
        rec(2, role="assistant", key="pref/food", metadata={"topic": "work", "n": 2.0, "superseded_by": "3"}, second=2),
        rec(3, role="user", key="pref/drink", metadata={"topic": "food", "ok": False, "a.b": "dotted"}, second=3),
        rec(4, role=None, metadata={"superseded_by": None, "tags": ["x", "y"]}, second=4),
    ])

    async def sel(**kw: object) -> list[str]:
        return ids(await store.select(Scope(owner="alice", **kw)))  # type: ignore[arg-type]

    assert await sel(where={"role": "user"}) == ["1", "3"]
    assert await sel(where={"role": None}) == ["4"]
    assert await sel(where={"role": ["assistant", None]}) == ["2", "4"]
    assert await sel(where={"topic": "food"}) == ["1", "3"]
    assert await sel(where={"topic": ["food", "work"], "role": "user"}) == ["1", "3"]
    assert await sel(where={"superseded_by": None}) == ["1", "3", "4"]
    assert await sel(where={"n": 2}) == ["2"]
    assert await sel(where={"n": [1, 2]}) == ["1", "2"]
    assert await sel(where={"ok": True}) == ["1"]
    assert await sel(where={"ok": False}) == ["3"]
    assert ids(await store.select(Scope(owner="alice", where={"ok": False}), limit=1)) == ["3"]
    assert await sel(where={"tags": "y"}) == ["4"]
    assert await sel(where={"a.b": "dotted"}) == ["3"]
    assert await sel(where={"salience": 0.5, "revision": 1}) == ["1", "2", "3", "4"]
    assert await sel(where={"topic": []}) == []
    assert await sel(key_prefix="pref/food") == ["1", "2"]
    assert await sel(key_prefix="pref/") == ["1", "2", "3"]
    assert await sel(key_prefix="") == ["1", "2", "3"]
    assert await sel(key_prefix="Pref") == []
    assert await sel(after="2026-03-01T10:00:01.000Z") == ["2", "3", "4"]
    assert await sel(before="2026-03-01T10:00:03.000Z") == ["1", "2"]
    assert await sel(after="2026-03-01T10:00:01.000Z", before="2026-03-01T10:00:04.000Z") == ["2", "3"]
    assert await sel(ids=["4", "2", "nope"]) == ["2", "4"]
    assert await sel(ids=[]) == []
    hits = await store.search(Scope(owner="alice", where={"superseded_by": None}, key_prefix="pref/"),
                              text="fact number", vector=None, limit=10)
    assert sorted(ids(hits)) == ["1", "3"]


async def test_delete_by_scope(store: SemanticStore) -> None:
    await store.write([rec(i, session="s1" if i < 3 else "s2", second=i) for i in range(5)])
    await store.write([rec("other", owner="bob", session="s1")])
    assert await store.delete(Scope(owner="alice", where={"session": "s1"})) == 3
    assert ids(await store.select(Scope(owner="alice"))) == ["3", "4"]
    assert await store.delete(Scope(owner="alice", where={"nothing": []})) == 0
    assert await store.delete(Scope(owner="alice")) == 2
    assert await store.count("alice") == 0 and await store.count("bob") == 1


def _pages_read(store: SemanticStore, monkeypatch: pytest.MonkeyPatch) -> list[list[dict[str, object]]]:
    """Every page the store's engine scrolls from now on (the engine itself still answers)."""
    read: list[list[dict[str, object]]] = []
    scroll = store._engine.scroll

    async def spy(must, **options):  # type: ignore[no-untyped-def]
        found = await scroll(must, **options)
        read.append(found)
        return found

    monkeypatch.setattr(store._engine, "scroll", spy)
    return read


async def test_a_broad_delete_reads_a_page_at_a_time_without_the_content(
        store: SemanticStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """A forget with a broad `where` read every match whole (content and vector) in one scroll:
    50,000 records held 86 MiB and stalled the server for seconds, past the router's timeout.
    It reads a page of the fields the scope tests at a time, and still deletes every match."""
    import backends.semantic.store as semantic

    monkeypatch.setattr(semantic, "DELETE_PAGE", 4, raising=False)
    odd = 0.9452706955539223  # kept exactly only in the salience_repr copy on Edge
    await store.write([rec(i, metadata={"k": "a" if i % 3 else "b"}, salience=odd if i % 5 == 0 else 0.5,
                           session="s" if i < 9 else None, second=i) for i in range(23)])
    read = _pages_read(store, monkeypatch)
    assert await store.delete(Scope(owner="alice", where={"k": "a", "session": "s"})) == 6
    assert read and max(len(page) for page in read) <= 4
    assert not any("content" in p or "embedding_f64" in p for page in read for p in page)
    assert await store.delete(Scope(owner="alice", where={"salience": odd})) == 4  # 0, 10, 15, 20
    assert await store.delete(Scope(owner="alice", where={"k": "a"})) == 7
    left = ids(await store.select(Scope(owner="alice")))
    assert left == [str(i) for i in range(23) if i % 3 == 0 and i % 5 != 0]


async def test_a_forget_the_engine_filters_exactly_reads_ids_alone(
        store: SemanticStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """An owner's whole forget (a data deletion request) read each record's tested fields and
    matched it again in Python. Owner, ids, a key prefix and a time range the engine tests exactly,
    so such a forget reads only ids (and the page order), and still counts what it deletes."""
    await store.write([rec(i, key=f"k/{i}" if i % 2 else None, second=i) for i in range(12)])
    await store.write([rec(100 + i, owner="bob", key=f"k/{i}") for i in range(3)])
    read = _pages_read(store, monkeypatch)
    assert await store.delete(Scope(owner="alice", key_prefix="k/1")) == 2  # k/1, k/11
    assert await store.delete(Scope(owner="alice", ids=["0", "2", "100", "404"])) == 2  # 100 is bob's
    assert await store.delete(Scope(owner="alice", key_prefix="")) == 4  # every other keyed one
    assert await store.delete(Scope(owner="alice", after="2026-03-01T10:00:07.000Z")) == 2  # 8, 10
    assert await store.delete(Scope(owner="alice", before="2026-03-01T10:00:06.000Z")) == 1  # 4
    assert await store.delete(Scope(owner="alice", before="2999-01-01T00:00:00.000Z")) == 1  # 6
    assert await store.delete(Scope(owner="alice", before="2999-01-01T00:00:00.000Z")) == 0
    assert read and all(set(p) <= {"id", "seq"} for page in read for p in page)
    monkeypatch.undo()
    assert await store.count("alice") == 0 and await store.count("bob") == 3


async def test_touch_and_reinforce(store: SemanticStore) -> None:
    await store.write([rec(1, salience=0.9), rec(2, salience=0.1), rec(3)])
    await store.touch("alice", ["1", "2", "missing"], "2026-05-01T00:00:00.000Z")
    await store.touch("alice", ["1"], "2026-05-02T00:00:00.000Z")
    one, two, three = await store.get("alice", ["1", "2", "3"])
    assert (one.access_count, one.accessed_at) == (2, "2026-05-02T00:00:00.000Z")
    assert (two.access_count, two.accessed_at) == (1, "2026-05-01T00:00:00.000Z")
    assert (three.access_count, three.accessed_at) == (0, None)
    assert await store.reinforce("alice", ["1", "2", "missing"], 0.2) == 2
    one, two = await store.get("alice", ["1", "2"])
    assert one.salience == 1.0 and two.salience == pytest.approx(0.3)
    assert await store.reinforce("alice", ["2"], -0.5) == 1
    assert (await store.get("alice", ["2"]))[0].salience == 0.0


async def test_sessions(store: SemanticStore) -> None:
    await store.write([rec(1, session="s1", second=5), rec(2, session="s1", second=1), rec(3, session="s2", second=3),
                       rec(4, second=2), rec(5, session="s1", owner="bob")])
    await store.touch("alice", ["3"], "2026-03-09T00:00:00.000Z")
    got = {s.session: s for s in await store.sessions("alice")}
    assert set(got) == {"s1", "s2"}
    assert got["s1"].records == 2 and got["s1"].opened_at == "2026-03-01T10:00:01.000Z"
    assert got["s1"].touched_at == "2026-03-01T10:00:05.000Z"
    assert got["s2"].records == 1 and got["s2"].touched_at == "2026-03-09T00:00:00.000Z"


def sessions_from_records(records: list[Record]) -> list[tuple[str, int, str, str]]:
    """What `session/list` must answer, computed from the records themselves."""
    out: dict[str, tuple[str, int, str, str]] = {}
    for r in records:
        if r.session is None:
            continue
        latest = max(r.created_at, r.accessed_at or r.created_at)
        _, n, first, last = out.get(r.session, (r.session, 0, r.created_at, latest))
        out[r.session] = (r.session, n + 1, min(first, r.created_at), max(last, latest))
    return sorted(out.values(), key=lambda s: (s[2], s[0]))


async def test_sessions_match_the_records(store: SemanticStore) -> None:
    # many sessions across more than one scroll page, interleaved in time; a null session; records
    # touched (some after, some before a later record of their session) and never touched; another
    # owner, and the None partition, holding the same session names
    def stamp(i: int) -> str:
        return f"2026-03-{1 + i // 1000:02d}T10:{(i // 60) % 16:02d}:{i % 60:02d}.{i % 997:03d}Z"

    batch = [Record(id=f"{owner}-{i}", content=f"fact {i}", created_at=stamp(i), owner=owner,
                    session=None if i % 7 == 0 else f"s{i % 37}")
             for owner, n in (("alice", 1200), ("bob", 150), (None, 80)) for i in range(n)]
    for k in range(0, len(batch), 500):
        await store.write(batch[k:k + 500])
    await store.touch("alice", [f"alice-{i}" for i in range(0, 1200, 11)], "2026-03-01T10:30:00.000Z")
    await store.touch("alice", [f"alice-{i}" for i in range(3, 1200, 97)], "2026-04-01T00:00:00.000Z")
    await store.touch("bob", ["bob-1", "bob-2"], "2026-05-01T00:00:00.000Z")
    for owner in ("alice", "bob", None, "nobody"):
        got = [(s.session, s.records, s.opened_at, s.touched_at) for s in await store.sessions(owner)]
        assert got == sessions_from_records(await store.select(Scope(owner=owner))), owner
    alice = {s.session: s for s in await store.sessions("alice")}
    assert len(alice) == 37 and sum(s.records for s in alice.values()) == 1200 - 172
    assert alice["s3"].touched_at == "2026-04-01T00:00:00.000Z"  # an access later than any record
    assert alice["s1"].touched_at == max(r.created_at for r in batch if r.owner == "alice" and r.session == "s1")


async def test_a_full_read_in_local_mode_is_one_request(tmp_path: Path) -> None:
    # local mode sorts and filters the whole collection for each page it answers: paging a full
    # read made `session/list` quadratic (8.3 s over 20,000 points in pages of 1,000)
    store = make_store(settings("local", tmp_path))
    await store.open()
    try:
        await store.write([rec(i, session=f"s{i % 3}") for i in range(1100)])
        engine = store._engine
        assert isinstance(engine, ClientEngine)
        client, calls = engine.client, []
        scroll = client.scroll

        async def counted(*args: object, **kwargs: object) -> object:
            calls.append(kwargs.get("limit"))
            return await scroll(*args, **kwargs)  # type: ignore[arg-type]

        client.scroll = counted  # type: ignore[method-assign]
        assert [s.records for s in await store.sessions("alice")] == [367, 367, 366]
        assert len(calls) == 1
    finally:
        await store.close()


NAMES = ("s0", "", "ßé 会话", "x" * 1000, "a b", "7", "s5")  # the empty name, non-ASCII, 1,000 bytes, a number


def varied_sessions(rng: random.Random) -> list[Record]:
    """Few large sessions for alice, many small ones for bob (same names), the None partition, records
    without a session; stamps at the ends of the range, and two sessions opened in one millisecond
    (the name breaks the tie); some records carry an access, before or after their session's last."""
    def stamp() -> str:
        return f"2026-{rng.randrange(1, 13):02d}-{rng.randrange(1, 29):02d}T{rng.randrange(24):02d}:" \
               f"{rng.randrange(60):02d}:{rng.randrange(60):02d}.{rng.randrange(1000):03d}Z"
    out: list[Record] = []
    for owner, names, n in (("alice", NAMES, 420), ("bob", tuple(f"b{i}" for i in range(60)) + NAMES, 200),
                            (None, NAMES[:3], 150)):
        for i in range(n):
            session = None if i % 9 == 0 else names[rng.randrange(len(names))]
            accessed = None if rng.random() < 0.8 else rng.choice([stamp(), "9999-12-31T23:59:59.999Z"])
            out.append(Record(id=f"{owner}-{i}", content=f"fact {i}", created_at=stamp(), owner=owner,
                              session=session, accessed_at=accessed))
        out += [Record(id=f"{owner}-first-{k}", content="first", created_at="0001-01-01T00:00:00.000Z",
                       owner=owner, session=names[k]) for k in (0, 1)]
        out.append(Record(id=f"{owner}-last", content="last", created_at="9999-12-31T23:59:59.999Z", owner=owner,
                          session=names[2], accessed_at="0001-01-01T00:00:00.000Z"))
    return out


def session_rows(infos: list[SessionInfo]) -> list[tuple[str, int, str | None, str | None]]:
    return [(s.session, s.records, s.opened_at, s.touched_at) for s in infos]


async def test_sessions_from_the_indexes_answer_as_a_full_read(store: SemanticStore,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Qdrant Edge answers an owner with few large sessions from an exact facet and ordered one-point
    reads (a full read cost 210 ms at 50,000 records): the answer must be the full read's, record
    for record, on data that holds every case the full read folds (accessed records, the ends of
    the stamp range, forgotten records, other partitions holding the same session names)."""
    await store.write(varied_sessions(random.Random(11)))
    await store.touch("alice", [f"alice-{i}" for i in range(0, 420, 13)], "2026-06-30T00:00:00.000Z")
    await store.touch("alice", [f"alice-{i}" for i in range(0, 420, 39)], "2026-02-01T00:00:00.000Z")
    await store.touch("bob", [f"bob-{i}" for i in range(0, 200, 7)], "2026-12-31T00:00:00.000Z")
    assert await store.delete(Scope(owner="alice", where={"session": "s5"})) > 0  # a whole session gone
    assert await store.delete(Scope(owner="alice", ids=[f"alice-{i}" for i in range(1, 420, 5)])) > 0
    read_whole = store._sessions_by_scroll
    whole: list[str | None] = []

    async def spy(owner: str | None) -> list[SessionInfo]:
        whole.append(owner)
        return await read_whole(owner)

    monkeypatch.setattr(store, "_sessions_by_scroll", spy)
    for owner in ("alice", "bob", None, "nobody"):
        got = session_rows(await store.sessions(owner))
        assert got == sessions_from_records(await store.select(Scope(owner=owner))), owner
        assert got == session_rows(await read_whole(owner)), owner
    alice = {s.session: s for s in await store.sessions("alice")}
    assert set(alice) == set(NAMES) - {"s5"}
    assert alice["s0"].opened_at == alice[""].opened_at == "0001-01-01T00:00:00.000Z"
    assert alice["ßé 会话"].touched_at == "9999-12-31T23:59:59.999Z"
    if store.engine == "qdrant-edge":
        assert "alice" not in whole and None not in whole  # answered from the indexes
        assert "bob" in whole  # ~3 records a session: one read is cheaper


async def test_a_session_forgotten_between_the_counts_and_its_reads_is_left_out(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A forget between the facet and a session's ordered reads leaves a name with no record: it is
    left out, as a read after the forget would, never listed without stamps nor an error."""
    store = make_store(settings("edge", tmp_path))
    await store.open()
    try:
        await store.write([rec(i, session=f"s{i % 2}", second=i % 60) for i in range(100)])
        engine = store._engine
        facet = engine.facet

        async def stale(must, key, *, exact):  # type: ignore[no-untyped-def]
            found = await facet(must, key, exact=exact)
            return None if found is None else [*found, ("gone", 50)]

        monkeypatch.setattr(engine, "facet", stale)
        assert session_rows(await store.sessions("alice")) == [
            ("s0", 50, "2026-03-01T10:00:00.000Z", "2026-03-01T10:00:58.000Z"),
            ("s1", 50, "2026-03-01T10:00:01.000Z", "2026-03-01T10:00:59.000Z")]
    finally:
        await store.close()


async def test_a_shard_from_before_the_access_index_gets_it_at_open(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """`sessions` orders by `accessed_at`, which needs its index: a data directory written before
    that index existed must have it built when it opens, over the records already there."""
    import backends.semantic.edge as edge

    monkeypatch.setattr(edge, "INDEXES", tuple(i for i in edge.INDEXES if i[0] != "accessed_at"))
    old = make_store(settings("edge", tmp_path))
    await old.open()
    await old.write([rec(i, session="s", second=i % 60) for i in range(64)])
    await old.touch("alice", ["7"], "2026-04-01T00:00:00.000Z")
    await old.close()
    monkeypatch.undo()
    store = make_store(settings("edge", tmp_path))
    await store.open()
    try:
        assert session_rows(await store.sessions("alice")) == [
            ("s", 64, "2026-03-01T10:00:00.000Z", "2026-04-01T00:00:00.000Z")]
    finally:
        await store.close()


async def test_where_on_accessed_at_still_matches_its_stamp(store: SemanticStore) -> None:
    """`accessed_at` carries a datetime index (for `sessions`): a `where` on it, a string match or
    null, must still find exactly the records the reference filter does."""
    await store.write([rec(1), rec(2, second=1), rec(3, second=2)])
    await store.touch("alice", ["2"], "2026-04-01T00:00:00.000Z")
    assert ids(await store.select(Scope(owner="alice", where={"accessed_at": "2026-04-01T00:00:00.000Z"}))) == ["2"]
    assert ids(await store.select(Scope(owner="alice", where={"accessed_at": None}))) == ["1", "3"]
    assert ids(await store.select(Scope(owner="alice", where={"accessed_at": ["2026-04-01T00:00:00.000Z", None]}))) \
        == ["1", "2", "3"]


async def test_count_and_dimensions(store: SemanticStore) -> None:
    assert await store.count("alice") == 0 and await store.dimensions() is None
    await store.write([rec(1), rec(2, embedding=[0.1, 0.2, 0.3, 0.4])])
    assert await store.count("alice") == 2 and await store.dimensions() == 4
    await store.ping()


async def test_bad_batch_writes_nothing(store: SemanticStore) -> None:
    await store.write([rec("keep", key="k", embedding=[1.0, 0.0])])
    bad = [rec("new1", embedding=[1.0, 1.0]), rec("new2", embedding=[1.0, 1.0, 1.0]), rec("new3")]
    with pytest.raises(StoreRejected):
        await store.write(bad, ["keep"])
    assert ids(await store.select(Scope(owner="alice"))) == ["keep"]
    with pytest.raises(StoreRejected):  # mixed widths in a first batch are refused too
        await store.write([rec("x", owner="bob", embedding=[1.0, 2.0]), rec("y", owner="bob", embedding=[1.0])])
    assert await store.count("bob") == 0 and await store.dimensions() == 2


async def test_reopen_keeps_data(tmp_path: Path) -> None:
    for engine in ENGINES:
        first = make_store(settings(engine, tmp_path / engine))
        await first.open()
        await first.write([rec(1, "persisted fact", embedding=[1.0, 0.0], key="k"), rec(2, second=1)])
        await first.close()
        again = make_store(settings(engine, tmp_path / engine))
        await again.open()
        try:
            assert ids(await again.select(Scope(owner="alice"))) == ["1", "2"]
            assert await again.dimensions() == 2
            assert ids(await again.search(Scope(owner="alice"), text="persisted", vector=None, limit=3)) == ["1"]
            await again.write([rec(3, second=1)])  # the sequence resumes after the stored one
            assert ids(await again.select(Scope(owner="alice"))) == ["1", "2", "3"]
        finally:
            await again.close()


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_second_store_on_one_data_dir_is_refused_clearly(engine: str, tmp_path: Path) -> None:
    """Both engines lock their directory; the refusal says what happened (Edge's own words were
    `failed to open WAL ...: Can't init WAL: Kind(WouldBlock)`). The lock goes with a close."""
    first = make_store(settings(engine, tmp_path))
    await first.open()
    try:
        await first.write([rec(1)])
        second = make_store(settings(engine, tmp_path))
        with pytest.raises(StoreUnavailable, match="another (process|instance)"):
            await second.open()
    finally:
        await first.close()
    again = make_store(settings(engine, tmp_path))
    await again.open()
    try:
        assert ids(await again.select(Scope(owner="alice"))) == ["1"]
    finally:
        await again.close()


CRASH_IN_REPLACE = textwrap.dedent("""
    import os, signal, sys, anyio
    from pathlib import Path
    from a2m.records import Record
    from backends.semantic import make_store
    from backends.settings import TierSettings

    async def main(engine, data):
        store = make_store(TierSettings("semantic", Path(data), options={"engine": engine} if engine == "local" else {}))
        await store.open()
        await store.write([Record(id="old", content="the old fact", created_at="2026-03-01T10:00:05.000Z",
                                  owner="alice", key="k")])
        write = store._engine.write
        async def put_then_die(points, deletes):  # the puts are one engine update, the deletes the next
            await write(points, [])
            os.kill(os.getpid(), signal.SIGKILL)
        store._engine.write = put_then_die
        # an import (kept id, revision 2, an earlier created_at) replacing the key's holder
        await store.write([Record(id="new", content="the imported fact", created_at="2026-03-01T10:00:01.000Z",
                                  owner="alice", key="k", revision=2)], deletes=["old"])

    anyio.run(main, sys.argv[1], sys.argv[2])
""")


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_crash_inside_a_replace_is_repaired_at_open(engine: str, tmp_path: Path) -> None:
    """A batch that puts one id on a key and deletes the key's other holder is two engine updates; a
    crash between them left both records: a timeline showed two records with one key, and `fetch`
    chose by created_at, the old one. The next open keeps the version written last."""
    done = subprocess.run([sys.executable, "-c", CRASH_IN_REPLACE, engine, str(tmp_path)], cwd=ROOT, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True)
    assert done.returncode == -signal.SIGKILL, done.stderr
    store = make_store(settings(engine, tmp_path))
    await store.open()
    try:
        assert ids(await store.select(Scope(owner="alice"))) == ["new"]
        assert (await store.get_keys("alice", ["k"]))["k"].content == "the imported fact"
        assert await store.get("alice", ["old"]) == []
    finally:
        await store.close()


WRITER = textwrap.dedent("""
    import sys, anyio
    from pathlib import Path
    from a2m.records import Record
    from backends.semantic import make_store
    from backends.settings import TierSettings

    async def main(engine, data):
        store = make_store(TierSettings("semantic", Path(data), options={"engine": engine} if engine == "local" else {}))
        await store.open()
        n = 0
        while True:
            batch = [Record(id=f"r{n}-{i}", content=f"fact {n} {i}", created_at="2026-03-01T10:00:00.000Z",
                            owner="alice", embedding=[float(n), float(i), 1.0]) for i in range(20)]
            await store.write(batch)
            print(f"ack {n}", flush=True)
            n += 1

    anyio.run(main, sys.argv[1], sys.argv[2])
""")


@pytest.mark.parametrize("engine", ENGINES)
async def test_crash_mid_batch_loses_no_acknowledged_write(engine: str, tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", WRITER, engine, str(tmp_path)], stdout=subprocess.PIPE,
                            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, text=True)
    acked: list[int] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            acked.append(int(line.split()[1]))
            if len(acked) >= 15:
                break
        proc.send_signal(signal.SIGKILL)  # while it is writing the next batch
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert len(acked) >= 15, "the writer died before acknowledging enough batches"
    store = make_store(settings(engine, tmp_path))
    await store.open()
    try:
        wanted = [f"r{n}-{i}" for n in acked for i in range(20)]
        assert len(await store.get("alice", wanted)) == len(wanted)
        total = await store.count("alice")
        assert total % 20 == 0 if engine == "edge" else total >= len(wanted)  # Edge: whole batches only
        assert await store.dimensions() == 3
    finally:
        await store.close()


def _disk_with(monkeypatch: pytest.MonkeyPatch, free: int) -> None:
    """The disk under every path reports `free` bytes free (the engine itself is real)."""
    import shutil

    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda path: real(path)._replace(free=free))


async def test_a_nearly_full_disk_is_refused_in_words_not_by_sigbus(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Qdrant Edge maps its WAL segments (32 MiB files); a page the disk cannot back kills the process
    with SIGBUS. On a 150 MiB tmpfs, a server kept acknowledging writes down to 7 MiB free, and its
    restart died inside `EdgeShard.load` (exit -7, not a word on stderr), as did one with 65 MiB free
    beside its 96 MiB WAL. Now the open and each write that adds points refuse, saying why."""
    from backends.semantic import edge

    MIN_FREE = getattr(edge, "MIN_FREE", 64 << 20)  # noqa: N806 (the engine's constant)
    first = make_store(settings("edge", tmp_path))
    await first.open()
    try:
        await first.write([rec(1)])
        _disk_with(monkeypatch, MIN_FREE - 1)
        with pytest.raises(StoreUnavailable, match="MiB free"):
            await first.write([rec(2)])
        assert await first.delete(Scope(owner="alice", ids=["1"])) == 1  # a forget frees space: let through
        assert ids(await first.select(Scope(owner="alice"))) == []
    finally:
        await first.close()
    wal = sum(f.stat().st_size for f in (tmp_path / "qdrant-edge" / "wal").iterdir())
    _disk_with(monkeypatch, MIN_FREE + wal - 1)  # the open replays the WAL into the segments
    with pytest.raises(StoreUnavailable, match=r"MiB free, under the \d+ MiB its write-ahead log needs"):
        await make_store(settings("edge", tmp_path)).open()
    _disk_with(monkeypatch, MIN_FREE + wal)
    again = make_store(settings("edge", tmp_path))
    await again.open()
    await again.close()


async def test_owner_and_content_in_where_are_the_record_fields(store: SemanticStore) -> None:
    await store.write([rec("a", "alpha fact", metadata={"content": "beta fact", "owner": "meta"}),
                       rec("b", "beta fact", second=1), rec("c", "beta fact", owner="bob")])
    for where, want in (({"content": "beta fact"}, ["b"]), ({"content": ["alpha fact", "x"]}, ["a"]),
                        ({"owner": "alice"}, ["a", "b"]), ({"owner": ["bob", "alice"]}, ["a", "b"]),
                        ({"owner": "meta"}, []), ({"owner": None}, []), ({"owner": "bob"}, []),
                        ({"content": None}, [])):
        scope = Scope(owner="alice", where=where)
        assert ids(await store.select(scope)) == want, where
        assert sorted(ids(await store.search(scope, text="fact", vector=None, limit=10))) == want, where
    assert await store.delete(Scope(owner="alice", where={"content": "beta fact"})) == 1
    assert ids(await store.select(Scope(owner="bob"))) == ["c"]


async def test_floats_come_back_exactly_and_are_found_by_where(store: SemanticStore) -> None:
    """Qdrant Edge's payload parser gives about one float in nine back an ulp off (0.39999999999999997
    as 0.4, 0.9452706955539223 as its neighbour): metadata was not round-tripped unchanged, a `where` on such a value found nothing on Edge, and a reinforced salience (0.7 - 0.3)
    differed between the engines."""
    odd = [0.39999999999999997, 0.9452706955539223, 5.1715276387742e+299, 5e-324]
    metadata = {"f": odd[0], "nested": {"l": [odd[1], "x", {"g": odd[2]}]}, "tiny": odd[3], "plain": 0.25}
    await store.write([rec(1, metadata=metadata, salience=0.9452706955539223), rec(2, salience=0.7)])
    one, two = await store.get("alice", ["1", "2"])
    assert one.metadata == metadata and one.salience == 0.9452706955539223
    for where in ({"f": odd[0]}, {"tiny": odd[3]}, {"salience": 0.9452706955539223}, {"plain": 0.25}):
        assert ids(await store.select(Scope(owner="alice", where=where))) == ["1"], where
        assert ids(await store.search(Scope(owner="alice", where=where), text="fact", vector=None, limit=5)) == ["1"]
    assert await store.reinforce("alice", ["2"], -0.3) == 1
    assert (await store.get("alice", ["2"]))[0].salience == 0.7 - 0.3 == 0.39999999999999997
    assert ids(await store.select(Scope(owner="alice", where={"salience": 0.39999999999999997}))) == ["2"]
    assert await store.reinforce("alice", ["2"], 0.1) == 1  # and a plain value after it clears the copy
    assert (await store.get("alice", ["2"]))[0].salience == 0.39999999999999997 + 0.1


async def test_where_on_an_integer_past_2_to_the_53_finds_it(store: SemanticStore) -> None:
    """A number in `where` became a float range [x, x]; local mode compares the stored integer with
    it exactly, so 2^62 + 1 (not a float) was never found there, while Edge found it."""
    await store.write([rec(1, metadata={"n": 2**62 + 1, "u": 2**63 + 5}), rec(2, metadata={"n": 2**62}, second=1)])
    assert ids(await store.select(Scope(owner="alice", where={"n": 2**62 + 1}))) == ["1"]
    assert ids(await store.select(Scope(owner="alice", where={"n": 2**62}))) == ["2"]
    assert ids(await store.select(Scope(owner="alice", where={"u": 2**63 + 5}))) == ["1"]
    assert ids(await store.search(Scope(owner="alice", where={"n": [2**62 + 1]}), text="fact", vector=None,
                                  limit=5)) == ["1"]


async def test_search_with_a_boolean_where_fills_its_limit(store: SemanticStore) -> None:
    """Qdrant Edge cannot match a boolean (its binding sends True as 1), so the engine filter is
    "present" and the exact test comes after: a search took the best `limit` hits of the wider set
    and dropped those with the other value, returning fewer than `limit` (none at all for limit 1
    when a record with `ok: false` ranked first), where local mode returned them."""
    await store.write([rec(1, "tea tea tea", metadata={"ok": False}), rec(2, "tea and cake", metadata={"ok": False}),
                       rec(3, "tea with lemon on a sunny afternoon", metadata={"ok": True})])
    for limit in (1, 2):
        assert ids(await store.search(Scope(owner="alice", where={"ok": True}), text="tea", vector=None,
                                      limit=limit)) == ["3"], limit
    assert ids(await store.search(Scope(owner="alice", where={"ok": [True, "x"]}), text="tea", vector=None,
                                  limit=1)) == ["3"]


def shared_engine(engine: str, tmp_path: Path) -> Engine:
    """One engine under two stores: two tier servers on one Qdrant collection (replicas behind a
    load balancer), as `a2m serve semantic --url` runs them twice."""
    return EdgeEngine(tmp_path / "edge") if engine == "edge" else ClientEngine(path=":memory:")


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_replica_learns_the_width_another_fixed(engine: str, tmp_path: Path) -> None:
    """The width was read only at open: a replica that opened before the first vector answered every
    vector-only search with nothing, and `dimensions()` with None, until it restarted."""
    shared = shared_engine(engine, tmp_path)
    first, second = SemanticStore(shared), SemanticStore(shared)
    await first.open()
    await second.open()
    try:
        await first.write([rec(1, embedding=[1.0, 0.0, 0.0]), rec(2, embedding=[0.0, 1.0, 0.0], second=1)])
        assert await second.dimensions() == 3
        assert ids(await second.search(Scope(owner="alice"), text=None, vector=[1.0, 0.1, 0.0], limit=1)) == ["1"]
        with pytest.raises(StoreWidthMismatch):
            await second.write([rec(3, embedding=[1.0, 0.0])])
        assert await second.count("alice") == 2
    finally:
        await first.close()


@pytest.mark.parametrize("engine", ENGINES)
async def test_replicas_fixing_two_widths_at_once_refuse_one_as_a_width_mismatch(
        engine: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two replicas' first vectors, of two widths, at once: the one whose vector config Qdrant refused
    ("already exists with different parameters") answered -32602, bad input, not -32008."""
    shared = shared_engine(engine, tmp_path)
    first, second = SemanticStore(shared), SemanticStore(shared)
    await first.open()
    await second.open()
    gate = Gate(monkeypatch, shared, "create_dense")  # holds the second replica's, after it saw no width
    try:
        async with anyio.create_task_group() as tg:
            async def late() -> None:
                with pytest.raises(StoreWidthMismatch):
                    await second.write([rec(2, embedding=[1.0, 0.0])])
            tg.start_soon(late)
            await gate.reached()
            await first.write([rec(1, embedding=[1.0, 0.0, 0.0])])
            gate.release()
        assert await second.dimensions() == 3 and ids(await second.select(Scope(owner="alice"))) == ["1"]
    finally:
        gate.open()
        await first.close()


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_touch_on_a_record_another_replica_forgot_meanwhile_is_no_error(
        engine: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A recall touches what it found (read, then set): a replica forgetting one of those records in
    between made the set fail ("No point with id ..."), so the recall answered -32603, an outage to
    the router. The records still there are touched; the forgotten one is not written back."""
    shared = shared_engine(engine, tmp_path)
    first, second = SemanticStore(shared), SemanticStore(shared)
    await first.open()
    await second.open()
    gate = Gate(monkeypatch, shared, "set_payload")
    try:
        await first.write([rec(1), rec(2, second=1)])
        async with anyio.create_task_group() as tg:
            async def touch() -> None:
                assert await first.touch("alice", ["1", "2"], "2026-05-01T00:00:00.000Z") == {"1": 1, "2": 1}
            tg.start_soon(touch)
            await gate.reached()
            assert await second.delete(Scope(owner="alice", ids=["2"])) == 1
            gate.release()
        assert [(r.id, r.access_count) for r in await second.select(Scope(owner="alice"))] == [("1", 1)]
        gate = Gate(monkeypatch, shared, "set_payload")  # reinforce sets its payload the same way
        async with anyio.create_task_group() as tg:
            async def reinforce() -> None:
                assert await first.reinforce("alice", ["1"], 0.1) == 1
            tg.start_soon(reinforce)
            await gate.reached()
            assert await second.delete(Scope(owner="alice", ids=["1"])) == 1
            gate.release()
        assert await second.count("alice") == 0
    finally:
        gate.open()
        await first.close()


def test_the_dense_vector_is_one_qdrant_can_normalise_at_any_accepted_length() -> None:
    """`comparable`: what Qdrant is given. An ordinary vector as it is (no cost, same scores); zero
    stays zero, and so does a vector whose elements float32 (what every tier keeps) flushes to zero;
    any other length Qdrant could not normalise comes out of length 1."""
    from backends.semantic.store import comparable

    ordinary = [0.3, -0.2, 0.9]
    assert comparable(ordinary) is ordinary
    assert comparable([0.0, 0.0, 0.0]) == [0.0, 0.0, 0.0]
    assert comparable([1e-50, 0.0, 0.0]) == [0.0, 0.0, 0.0]
    for size in (1e-44, 1e-30, 1e-5, 1e25, 3.4e38):
        assert math.hypot(*comparable([size, size, -size])) == pytest.approx(1.0, abs=1e-12), size
        assert comparable([size, 0.0, 0.0]) == [1.0, 0.0, 0.0], size


async def test_edge_frees_deleted_points_as_it_goes(tmp_path: Path) -> None:
    """Qdrant Edge kept every deleted point in its segment until a restart: writing and deleting
    20,000 records held ~45 MB more memory and ~16 MB more disk with none live. The engine now
    vacuums and flushes every `vacuum_after` deletions; the shard's own counts show it."""
    engine = EdgeEngine(tmp_path / "edge", vacuum_after=1000)  # Edge vacuums no segment under 1,000 points
    store = SemanticStore(engine)
    await store.open()
    try:
        for r in range(75):  # 1,500 records written and deleted, 20 at a time
            batch = [rec(f"r{r}-{i}", f"fact {i} about the ferry {r}") for i in range(20)]
            await store.write(batch)
            await store.delete(Scope(owner="alice", ids=ids(batch)))
        await store.write([rec("kept", "the ferry leaves at noon")])
        info = engine.shard.info()
        assert info.points_count == 1
        # the sparse index counts each point a segment still holds, deleted or not: 1,501 without compaction
        assert info.indexed_vectors_count <= 1000 + 20
        # and the replaced segments are gone from disk, not only from the shard's list
        assert len([d for d in (tmp_path / "edge" / "segments").iterdir() if d.is_dir()]) == info.segments_count
        assert ids(await store.select(Scope(owner="alice"))) == ["kept"]
        assert ids(await store.search(Scope(owner="alice"), text="ferry noon", vector=None, limit=5)) == ["kept"]
    finally:
        await store.close()


async def test_edge_builds_hnsw_at_open_for_records_with_text(tmp_path: Path) -> None:
    """Decision 18: a restart builds HNSW for the dense vectors written since the last build. The
    open-time count took points minus the shard's indexed vectors, and every record with text has
    a sparse vector, indexed as written, so that count was 0 and no restart built anything."""
    rnd = random.Random(18)
    width, count = 1536, 2000  # ~12 MB of vectors: past Edge's own threshold for building HNSW at all
    store = SemanticStore(EdgeEngine(tmp_path / "edge", optimize_at_open=1000))
    await store.open()
    for start in range(0, count, 250):
        await store.write([rec(i, f"fact {i} about the ferry", embedding=[rnd.gauss(0, 1) for _ in range(width)])
                           for i in range(start, start + 250)])
    await store.close()
    engine = EdgeEngine(tmp_path / "edge", optimize_at_open=1000)
    await engine.open()
    try:
        # each point's sparse vector plus, once the graph is built, its dense one
        assert engine.shard.info().indexed_vectors_count == 2 * count
    finally:
        await engine.close()


def disk_bytes(path: Path) -> int:
    """Disk the files under `path` take (Qdrant Edge's are sparse: blocks, not lengths)."""
    return sum(f.stat().st_blocks * 512 for f in path.rglob("*") if f.is_file())


async def test_edge_flushes_as_recalls_touch_records(tmp_path: Path) -> None:
    """Qdrant Edge writes a change out to its segments, and lets go of what the change replaced,
    only at a flush, which ran at close or after 20,000 deletions: a read-mostly tier, whose
    recalls only touch records, grew on disk by ~0.27 KB a touched record for as long as it ran
    (5 MB each 20,000). It is flushed every `flush_after` changed points."""
    engine = EdgeEngine(tmp_path / "edge", flush_after=2000)
    store = SemanticStore(engine)
    await store.open()
    try:
        await store.write([rec(f"fact-{i}", f"the ferry leaves at noon past {i}") for i in range(20)])
        ids = [f"fact-{i}" for i in range(20)]
        for _ in range(100):
            await store.touch("alice", ids, "2026-03-02T10:00:00.000Z")
        before = disk_bytes(tmp_path / "edge" / "segments")
        for _ in range(1000):  # 20,000 touches
            await store.touch("alice", ids, "2026-03-02T10:00:00.000Z")
        grown = disk_bytes(tmp_path / "edge" / "segments") - before
        assert grown < 1_000_000, grown
        assert {r.access_count for r in await store.select(Scope(owner="alice"))} == {1100}
    finally:
        await store.close()
