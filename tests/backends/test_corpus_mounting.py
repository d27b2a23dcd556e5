"""Mounting an existing RAG table as its owner would: a PostgreSQL table made and indexed the way such
tables are (bigint or uuid keys, nullable text, vectors and times, their own HNSW and full-text
indexes). What the mount cannot read is refused at start by name (never a traceback, never a server
that answers empty); reads use the table's own indexes; ids round-trip; rows without text, vector or
time read as documented; and a table that goes away mid-run answers "unavailable" quickly, the
router leaves it out of recall (`degraded`), and it comes back with its engine.

Every engine here is real: an embedded PostgreSQL 18 + pgvector (the Qdrant side of this is
test_corpus_qdrant_mounting.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Sequence

import httpx
import psycopg
import pytest

from a2m.client import HTTPClient
from a2m.errors import A2MError
from a2m.filters import Scope
from backends.episodic.embedded import EmbeddedPostgres
from tests.support.corpora import TABLE_ARGS, make_table, opened_table, postgres_holding
from tests.support.procs import ROOT, a2m_command, free_port, free_ports

pytestmark = pytest.mark.timeout(300)

UUID_UPPER = "5F1C2C9E-3D7A-4C59-9A53-1B7E2F0C4A11"
ROWS = 2000
USER_TABLES = f"""
CREATE EXTENSION IF NOT EXISTS vector;
CREATE SCHEMA rag;
CREATE TABLE rag.chunks (id int PRIMARY KEY, body text);
INSERT INTO rag.chunks VALUES (1, 'refunds take fourteen days');

-- The owner's main table: bigint keys, nullable text, vector and time, and the indexes they made.
CREATE TABLE docs (id bigint PRIMARY KEY, body text, emb vector(3), src text, written timestamptz);
INSERT INTO docs SELECT g,
    CASE WHEN g % 20 = 0 THEN 'refunds are issued within ' || g || ' days' ELSE 'parcel ' || g || ' ships' END,
    ARRAY[cos(g), sin(g), (g % 7) / 7.0]::vector, CASE WHEN g % 20 = 3 THEN 'mid' ELSE 'bulk' END,
    timestamptz '2026-01-01 00:00:00+00' + g * interval '1 minute'
  FROM generate_series(1, {ROWS}) g;
UPDATE docs SET body = NULL WHERE id = 1;
UPDATE docs SET emb = NULL WHERE id = 2;
UPDATE docs SET written = NULL WHERE id = 3;
CREATE INDEX docs_emb ON docs USING hnsw (emb vector_cosine_ops);
CREATE INDEX docs_fts ON docs USING gin (to_tsvector('simple', body));
CREATE INDEX docs_written ON docs (written);
ANALYZE docs;
CREATE VIEW docs_view AS SELECT * FROM docs;  -- one partition of a shared table per corpus (decision 8)

CREATE TABLE docs_uuid (id uuid PRIMARY KEY, body text);
INSERT INTO docs_uuid VALUES ('{UUID_UPPER}', 'refunds in five days'),
                             ('0b6f3c1e-8d2a-4e57-b9c4-7a1d2e3f4a5b', 'shipping to Italy');

CREATE TABLE odd_types (id int PRIMARY KEY, body int, label text, emb real[], written text);
INSERT INTO odd_types VALUES (1, 42, 'refunds', '{{1,0,0}}', 'yesterday');

CREATE TABLE docs_empty (id int PRIMARY KEY, body text, emb vector(5));

-- Three rows: one without text, one without a vector; an L2 index (the owner ranks by distance).
CREATE TABLE few (id int PRIMARY KEY, body text, emb vector(2));
INSERT INTO few VALUES (1, 'refunds take days', '[1,0]'), (2, NULL, '[10,1]'), (3, 'refunds without a vector', NULL);
CREATE INDEX few_emb ON few USING hnsw (emb vector_l2_ops);

-- Times without a zone, and dates.
CREATE TABLE naive (id int PRIMARY KEY, body text, written timestamp, day date);
INSERT INTO naive VALUES (1, 'refunds', '2026-01-02 09:00:00', '2026-01-02'), (2, 'shipping', '2026-01-03 09:00:00', NULL);

-- A generated tsvector column with its own index (the Supabase / PostgreSQL docs layout).
CREATE TABLE docs_gen (id int PRIMARY KEY, body varchar,
                       fts tsvector GENERATED ALWAYS AS (to_tsvector('english', body)) STORED);
CREATE INDEX docs_gen_fts ON docs_gen USING gin (fts);
INSERT INTO docs_gen (id, body) SELECT g, 'parcel ' || g FROM generate_series(1, 50) g;
INSERT INTO docs_gen VALUES (51, 'Refunds are issued quickly');

-- id columns the catalog shows are keys, and ones it does not: 20,000 rows each (past the 10,000 sampled).
CREATE TABLE ids_pk (ref int PRIMARY KEY, body text);
CREATE TABLE ids_unique (ref text NOT NULL UNIQUE, body text);
CREATE TABLE ids_unkeyed (ref text, body text);
CREATE TABLE ids_late (ref int, body text);
INSERT INTO ids_pk SELECT g, 'row ' || g FROM generate_series(1, 20000) g;
INSERT INTO ids_unique SELECT 'r' || g, 'row ' || g FROM generate_series(1, 20000) g;
INSERT INTO ids_unkeyed SELECT 'r' || g, 'row ' || g FROM generate_series(1, 20000) g;
INSERT INTO ids_late SELECT g, 'row ' || g FROM generate_series(1, 20000) g;
INSERT INTO ids_late VALUES (15000, 'row 15000 again');  -- a repeat past the first 10,000 rows
CREATE VIEW ids_late_view AS SELECT * FROM ids_late;
CREATE TABLE ids_late_null (ref int, body text);
INSERT INTO ids_late_null SELECT g, 'row ' || g FROM generate_series(1, 20000) g;
INSERT INTO ids_late_null VALUES (NULL, 'a row without an id');
CREATE VIEW ids_pk_view AS SELECT * FROM ids_pk;

CREATE ROLE outsider LOGIN;
"""


@pytest.fixture(scope="module")
def user_pg(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with postgres_holding(tmp_path_factory.mktemp("mount-pg"), USER_TABLES) as dsn:
        yield dsn


def serve(url: str, data: Path, *options: str, calls: Sequence[tuple[str, dict[str, Any]]] = (),
          env: dict[str, str] | None = None) -> tuple[list[dict[str, Any]], subprocess.CompletedProcess[str]]:
    """`a2m serve corpus --stdio` on `url`: the answers to `calls` (by id), and the finished process."""
    command = a2m_command("serve", "corpus", "--stdio", "--url", url, "--data", str(data),
                          *[arg for option in options for arg in ("--option", option)])
    lines = "".join(json.dumps({"jsonrpc": "2.0", "id": n, "method": method, "params": params}) + "\n"
                    for n, (method, params) in enumerate(calls))
    done = subprocess.run(command, input=lines, capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env={**os.environ, **(env or {})})
    answers = sorted((json.loads(line) for line in done.stdout.splitlines()), key=lambda a: a["id"])
    return answers, done


def records(answer: dict[str, Any]) -> list[dict[str, Any]]:
    assert "result" in answer, answer
    return answer["result"]["records"]


# ---- what the mount cannot read is refused at start, by name --------------------------------------------

@pytest.mark.parametrize("options, says", [
    # Found in the catalog but not on the search_path: every read failed with "internal error: UndefinedTable".
    (["table=chunks", "text_column=body"], "there is rag.chunks: name it with its schema, --option table=rag.chunks"),
    (["table=Docs", "text_column=body"], "table 'Docs' not found (search_path: \"$user\", public); there is public.docs"),
    # Content must be text: an integer column answered content 42 (not a string) and refused every text query.
    (["table=odd_types", "text_column=body"], "text_column 'body' of table 'odd_types' is integer"),
    (["table=odd_types", "text_column=label", "vector_column=emb"],
     "vector_column 'emb' of table 'odd_types' is real[]; it must be a pgvector column"),  # was a traceback
    (["table=odd_types", "text_column=label", "created_column=written"],
     "created_column 'written' of table 'odd_types' is text; it must be a timestamptz"),  # every row showed 1970
    (["table=docs", "text_column=body", "metadata_columns=src,lang"], "has no column(s) ['lang']"),
    (["table=docs", "text_column=content"], "has no column(s) ['content']"),
    # An id column that is not a key: a shared value answered several records for one id and a timeline walk
    # skipped the rest (89 of 100 rows read); a NULL one was answered as `"id": null`.
    (["table=docs", "id_column=src", "text_column=body"], "id_column 'src' of table 'docs' is not a key: it holds "
                                                          "'bulk' in several rows"),
    (["table=docs", "id_column=body", "text_column=src"], "id_column 'body' of table 'docs' is not a key: it holds "
                                                          "NULL in 1 row(s), and each record needs an id of its own: "
                                                          "name its key, --option id_column=id"),
])
def test_a_table_the_mount_cannot_read_is_refused_at_start_by_name(user_pg: str, tmp_path: Path,
                                                                   options: list[str], says: str) -> None:
    _, done = serve(user_pg, tmp_path, *options)
    assert done.returncode == 1 and says in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def _scans(dsn: str, table: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute("SELECT seq_scan FROM pg_stat_user_tables WHERE relname = %s", (table,)).fetchone()[0]


def test_an_id_column_the_catalog_shows_is_a_key_is_not_read_at_start(user_pg: str, tmp_path: Path) -> None:
    """A primary key or a unique index on the id column alone, NOT NULL, is a key: the mount reads
    none of its rows to check it. Without one the rows are read (a sample, then every row)."""
    tables = ("ids_pk", "ids_unique", "ids_unkeyed")
    before = {table: _scans(user_pg, table) for table in tables}
    for table in tables:
        _, done = serve(user_pg, tmp_path, f"table={table}", "id_column=ref", "text_column=body")
        assert done.returncode == 0, done.stderr
    deadline = time.monotonic() + 30  # a server's backend reports its scans as it exits
    while _scans(user_pg, "ids_unkeyed") - before["ids_unkeyed"] < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _scans(user_pg, "ids_unkeyed") - before["ids_unkeyed"] == 2  # the first 10,000 rows, then every row once
    assert _scans(user_pg, "ids_pk") == before["ids_pk"] and _scans(user_pg, "ids_unique") == before["ids_unique"]


@pytest.mark.parametrize("table, holds", [("ids_late", "'15000' in several rows"),
                                          ("ids_late_view", "'15000' in several rows"),
                                          ("ids_late_null", "NULL in 1 row(s)")])
def test_an_id_repeated_past_the_sampled_rows_is_refused_at_start(user_pg: str, tmp_path: Path, table: str,
                                                                   holds: str) -> None:
    """Only the first 10,000 rows were read, so a repeat further on mounted, and answered two records for
    one id. Where no catalog key vouches for the column (a view never has one), every row is read when
    that is quick."""
    _, done = serve(user_pg, tmp_path, f"table={table}", "id_column=ref", "text_column=body")
    assert done.returncode == 1, done.stderr
    assert f"id_column 'ref' of table {table!r} is not a key: it holds {holds}" in done.stderr, \
        done.stderr
    answers, done = serve(user_pg, tmp_path, "table=ids_pk_view", "id_column=ref", "text_column=body",
                          calls=[("memory/timeline", {"limit": 2})])  # a view of a keyed table mounts
    assert done.returncode == 0 and [r["id"] for r in records(answers[0])] == ["19999", "20000"], done.stderr


@pytest.mark.anyio
async def test_ids_not_read_in_time_at_start_are_said_and_mounted(user_pg: str, monkeypatch: pytest.MonkeyPatch,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    """Reading every row's id is bounded (ID_CHECK_S): past it the sampled rows stand, and the log says
    what was not checked and how to make the check free."""
    from backends.corpus import pgtable

    monkeypatch.setattr(pgtable, "ID_CHECK_S", 0.001)
    async with opened_table(user_pg, table="ids_late", id_column="ref", text_column="body"):
        pass
    assert "id_column 'ref' of 'ids_late': no primary key or unique index" in caplog.text, caplog.text
    assert "only the first 10000 were checked" in caplog.text, caplog.text


def test_a_table_the_role_may_not_read_is_refused_at_start(user_pg: str, tmp_path: Path) -> None:
    # information_schema hides what a role may not read, so this said "table 'docs' not found".
    outsider = user_pg.replace("postgres:@", "outsider:@", 1)
    _, done = serve(outsider, tmp_path, "table=docs", "text_column=body")
    assert done.returncode == 1 and "cannot read table 'docs': permission denied for table docs" in done.stderr, \
        done.stderr
    assert "Traceback" not in done.stderr


def test_a_postgresql_that_does_not_answer_is_refused_at_start(tmp_path: Path) -> None:
    # The pool waited 30 s for it, then a PoolTimeout traceback.
    _, done = serve(f"postgresql://reader@127.0.0.1:{free_port()}/rag", tmp_path, "table=docs")
    assert done.returncode == 1 and "corpus: cannot connect to PostgreSQL: connection failed" in done.stderr, \
        done.stderr
    assert "Traceback" not in done.stderr


def test_the_vector_width_is_the_columns_before_any_row_holds_a_vector(user_pg: str, tmp_path: Path) -> None:
    # Read from the first row before: an empty vector(5) table said `dimensions: null` and answered a
    # 4-wide query vector with nothing instead of -32008.
    answers, done = serve(user_pg, tmp_path, "table=docs_empty", "text_column=body", "vector_column=emb", calls=[
        ("memory/describe", {}), ("memory/recall", {"embedding": [1.0, 0.0, 0.0, 0.0]})])
    assert done.returncode == 0, done.stderr
    assert answers[0]["result"]["embeddings"]["dimensions"] == 5
    assert answers[1]["error"]["code"] == -32008


# ---- reads use the table's own indexes ----------------------------------------------------------------------

def explained(store: Any) -> list[str]:
    """From now on, the plan of each query `store` runs (each is then run as well)."""
    from psycopg import sql

    plans: list[str] = []
    run = store._query

    async def query(statement: Any, args: Sequence[Any]) -> list[dict[str, Any]]:
        rows = await run(sql.SQL("EXPLAIN ") + statement, args)
        plans.append("\n".join(row["QUERY PLAN"] for row in rows))
        return await run(statement, args)

    store._query = query
    return plans


def no_seq_scan(dsn: str) -> str:
    """The DSN with sequential scans priced out: a plan still holds one only where no index can answer
    the query as written (what a large table's planner meets)."""
    return dsn + "&options=-c%20enable_seqscan%3Doff"


DOCS = dict(table="docs", text_column="body", vector_column="emb", created_column="written", metadata_columns=["src"])


@pytest.mark.anyio
async def test_reads_use_the_tables_own_indexes(user_pg: str) -> None:
    async with opened_table(no_seq_scan(user_pg), **DOCS) as store:
        plans = explained(store)
        reads = {
            "get by id": lambda: store.get(None, ["5", "77"]),  # was id::text = ANY(...): the whole table
            "recall by id": lambda: store.search(Scope(where={"id": ["20", "40"]}), text="refunds",
                                                vector=[1.0, 0.0, 0.5], limit=5),
            "timeline by id": lambda: store.select(Scope(ids=["5", "77"]), order="desc", limit=10),
            "newest ten": lambda: store.select(Scope(), order="desc", limit=10),  # was coalesce(written, epoch)
            "a time range": lambda: store.select(Scope(after="2026-01-01T10:00:00.000Z"), order="asc", limit=10),
            "text": lambda: store.search(Scope(), text="refunds issued", vector=None, limit=10),  # was coalesce(body)
            "vector": lambda: store.search(Scope(), text=None, vector=[1.0, 0.0, 0.5], limit=10),
        }
        for name, read in reads.items():
            plans.clear()
            found = await read()
            assert found, name
            assert not [p for p in plans if "Seq Scan" in p], (name, plans)
        hits = await store.search(Scope(), text="refunds issued", vector=None, limit=10)
        assert len(hits) == 10 and all(h.content.startswith("refunds are issued") for h in hits)
    async with opened_table(no_seq_scan(user_pg), table="docs_gen", text_column="body") as store:
        plans = explained(store)  # the generated tsvector column and its index, in its configuration (english)
        hits = await store.search(Scope(), text="refund", vector=None, limit=5)
        assert [h.id for h in hits] == ["51"] and not [p for p in plans if "Seq Scan" in p], plans


@pytest.mark.anyio
async def test_a_filtered_vector_recall_fills_its_limit_from_the_hnsw_index(user_pg: str) -> None:
    # 100 of the 2,000 rows are `mid`: HNSW handed back its first 40 candidates, of which two were.
    for table in ("docs", "docs_view"):  # a view reads through the index of the table beneath it
        async with opened_table(no_seq_scan(user_pg), **{**DOCS, "table": table}) as store:
            hits = await store.search(Scope(where={"src": "mid"}), text=None, vector=[1.0, 0.0, 0.5], limit=10)
            assert len(hits) == 10 and {h.metadata["src"] for h in hits} == {"mid"}, table
            scores = [h.score for h in hits]
            assert scores == sorted(scores, reverse=True)


@pytest.mark.anyio
async def test_integer_and_uuid_keys_round_trip_in_the_spelling_a_record_shows(user_pg: str) -> None:
    async with opened_table(user_pg, **DOCS) as store:
        for spellings, wanted in ((["5", "05", "5.0", "+5", " 5", "-5", str(2**64)], ["5"]), (["nope", ""], [])):
            assert [r.id for r in await store.get(None, spellings)] == wanted
            assert [r.id for r in await store.select(Scope(where={"id": spellings}))] == wanted
        newest = await store.select(Scope(), order="desc", limit=3)
        assert [r.id for r in await store.get(None, [r.id for r in newest])] == sorted(
            (r.id for r in newest), key=int)
    async with opened_table(user_pg, table="docs_uuid", text_column="body") as store:
        shown = [r.id for r in await store.select(Scope())]
        assert UUID_UPPER.lower() in shown and UUID_UPPER not in shown
        assert [r.id for r in await store.get(None, shown)] != [] and len(await store.get(None, shown)) == 2
        assert await store.get(None, [UUID_UPPER]) == []  # ids are opaque text: only the spelling shown
        hits = await store.search(Scope(where={"id": UUID_UPPER.lower()}), text="refunds", vector=None, limit=5)
        assert [h.id for h in hits] == [UUID_UPPER.lower()]


# ---- rows without text, vector or time; times without a zone ------------------------------------------------

def test_rows_without_text_or_vector_and_the_indexs_distance(user_pg: str, tmp_path: Path) -> None:
    answers, done = serve(user_pg, tmp_path, "table=few", "text_column=body", "vector_column=emb", calls=[
        ("memory/describe", {}),
        ("memory/recall", {"embedding": [1.0, 0.2], "limit": 1}),
        ("memory/recall", {"embedding": [1.0, 0.2], "limit": 10}),
        ("memory/recall", {"query": "refunds", "limit": 10}),
        ("memory/timeline", {"embeddings": True}),
    ])
    assert done.returncode == 0, done.stderr
    embeddings = answers[0]["result"]["embeddings"]
    assert embeddings["metric"] == "euclidean" and embeddings["dimensions"] == 2  # the index's distance
    assert [r["id"] for r in records(answers[1])] == ["1"]  # nearest by L2 ([10, 1] is nearer by cosine)
    assert [r["id"] for r in records(answers[2])] == ["1", "2"]  # the row without a vector is no vector match
    assert {r["id"] for r in records(answers[3])} == {"1", "3"}
    timeline = records(answers[4])  # `embeddings: true` was an internal error (pgvector's Vector is not a list)
    assert [(r["id"], r["content"], r.get("embedding")) for r in timeline] == [
        ("1", "refunds take days", [1.0, 0.0]), ("2", "", [10.0, 1.0]), ("3", "refunds without a vector", None)]


def test_times_without_a_zone_are_utc_and_dates_are_midnight(user_pg: str, tmp_path: Path) -> None:
    # Read in the server's local zone before (and dates as no time at all): under TZ=Asia/Tokyo a row
    # written 09:00 showed 00:00Z, and SQL compared it as UTC, so a range and the stamps disagreed.
    tokyo = {"TZ": "Asia/Tokyo"}
    answers, done = serve(user_pg, tmp_path, "table=naive", "text_column=body", "created_column=written", calls=[
        ("memory/timeline", {}), ("memory/timeline", {"after": "2026-01-02T09:00:00.000Z"})], env=tokyo)
    assert done.returncode == 0, done.stderr
    assert [r["created_at"] for r in records(answers[0])] == ["2026-01-02T09:00:00.000Z", "2026-01-03T09:00:00.000Z"]
    assert [r["id"] for r in records(answers[1])] == ["2"]
    answers, done = serve(user_pg, tmp_path, "table=naive", "text_column=body", "created_column=day", calls=[
        ("memory/timeline", {})], env=tokyo)
    assert [(r["id"], r["created_at"]) for r in records(answers[0])] == [
        ("2", "1970-01-01T00:00:00.000Z"), ("1", "2026-01-02T00:00:00.000Z")]


def test_infinite_times_read_as_no_time(user_pg: str, tmp_path: Path) -> None:
    # 'infinity' (an open-ended validity column) has no Python value: psycopg refused every row
    # holding one, so each read that met it failed ("timestamp too large").
    with psycopg.connect(user_pg, autocommit=True) as conn:
        conn.execute("CREATE TABLE endless (id int PRIMARY KEY, body text, written timestamptz, until date)")
        conn.execute("INSERT INTO endless VALUES (1, 'a dated note', '2026-01-02 09:00+00', '2027-01-01'), "
                     "(2, 'an open-ended note', 'infinity', 'infinity'), (3, 'a note from always', '-infinity', NULL)")
    answers, done = serve(user_pg, tmp_path, "table=endless", "text_column=body", "created_column=written",
                          "metadata_columns=until", calls=[("memory/timeline", {}), ("memory/recall", {"query": "note"})])
    assert done.returncode == 0, done.stderr
    shown = {r["id"]: (r["created_at"], r["metadata"]["until"]) for r in records(answers[0])}
    assert shown == {"1": ("2026-01-02T09:00:00.000Z", "2027-01-01"), "2": ("1970-01-01T00:00:00.000Z", None),
                     "3": ("1970-01-01T00:00:00.000Z", None)}
    assert sorted(r["id"] for r in records(answers[1])) == ["1", "2", "3"]


# ---- the table going away mid-run, alone and under a router ----------------------------------------------

@contextmanager
def mounted(tmp: Path, tiers: list[dict[str, Any]]) -> Iterator[Any]:
    """The router over `tiers`, each started as tests/router/stack.py starts them, on ports chosen at
    once (free_ports): a process that cannot bind its port leaves its readiness probe answered by
    whichever holds it (the router's calls once reached the corpus)."""
    from tests.router.stack import Proc, Stack, tier_command, write_config

    ports = free_ports(len(tiers) + 1)
    data = Path(tempfile.mkdtemp(prefix="a2m-", dir="/tmp"))  # short: embedded engines put sockets here
    procs = {t["name"]: Proc(t["name"], tier_command(t, port, "fixture", data), port, log=tmp / f"{t['name']}.log")
             for t, port in zip(tiers, ports)}
    config = write_config(tmp / "router.toml", [{**t, "url": procs[t["name"]].url} for t in tiers],
                          {"background_promotion": False})
    router = Proc("router", a2m_command("serve", "router", "--config", str(config), "--port", str(ports[-1])),
                  ports[-1], log=tmp / "router.log")
    started: list[Any] = []
    try:
        for proc in [*procs.values(), router]:
            started.append(proc.start())
            proc.wait(120)
        yield Stack(procs, router, config)
    finally:
        for proc in reversed(started):
            proc.stop()
        shutil.rmtree(data, ignore_errors=True)


async def timed_call(client: HTTPClient, method: str, params: dict[str, Any]) -> tuple[Any, float]:
    """(the result, or the A2MError raised) and the seconds it took."""
    started = time.monotonic()
    try:
        result: Any = await client.call(method, params)
    except A2MError as exc:
        result = exc
    return result, time.monotonic() - started


async def until(check: Any, seconds: float) -> Any:
    deadline = time.monotonic() + seconds
    while True:
        try:
            return await check()
        except (A2MError, AssertionError):
            if time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.5)


@pytest.mark.anyio
async def test_the_table_going_away_answers_unavailable_quickly_and_comes_back(tmp_path: Path) -> None:
    pg = EmbeddedPostgres(tmp_path / "pg")
    dsn = pg.start()
    try:
        make_table(dsn)
        corpus = {"name": "kb", "kind": "semantic", "read_only": True, "engine": "corpus", "serve": "real",
                  "args": ["--url", dsn, *TABLE_ARGS], "timeout": 8.0}
        working = {"name": "working", "kind": "working", "capacity": 8, "timeout": 5.0}
        with mounted(tmp_path, [working, corpus]) as stack:
            async with HTTPClient(stack.url) as router, HTTPClient(stack.tiers["kb"].url, timeout=60) as kb:
                await router.call("memory/remember", {"records": [{"content": "the customer asked about refunds"}]})
                hits = (await router.call("memory/recall", {"query": "refunds"}))["records"]
                assert {h["tier"] for h in hits} == {"working", "kb"}

                pg.stop()  # PostgreSQL goes away under the mounted corpus
                answer, took = await timed_call(kb, "memory/recall", {"query": "refunds"})
                assert isinstance(answer, A2MError) and answer.code == -32603, answer
                assert "unavailable" in str(answer) and took < 5.0, (str(answer), took)  # the pool waited 30 s
                answer, took = await timed_call(kb, "memory/recall", {"query": "refunds"})
                assert isinstance(answer, A2MError) and took < 2.0, took  # known down: no second long wait
                assert httpx.get(stack.tiers["kb"].url + "readyz").status_code == 503
                answer, took = await timed_call(router, "memory/recall", {"query": "refunds"})
                assert answer["degraded"] == ["kb"] and took < 6.0, (answer, took)  # not the 8 s tier timeout
                assert [h["tier"] for h in answer["records"]] == ["working"]

                pg.start()  # back: the pool's broken connections are replaced, no restart of the corpus
                back = await until(lambda: kb.call("memory/recall", {"query": "refunds"}), 30)
                assert back["records"] and back["records"][0]["content"].startswith("Refunds")

                async def fused() -> None:
                    hits = (await router.call("memory/recall", {"query": "refunds"}))["records"]
                    assert {h["tier"] for h in hits} == {"working", "kb"}

                await until(fused, 30)

                with psycopg.connect(dsn, autocommit=True) as conn:  # the owner drops the table
                    conn.execute("ALTER TABLE kb RENAME TO kb_old")
                answer, took = await timed_call(kb, "memory/timeline", {})
                assert isinstance(answer, A2MError) and answer.code == -32603
                assert "table 'kb' no longer reads as mounted" in str(answer), str(answer)  # was "internal error"
                assert httpx.get(stack.tiers["kb"].url + "readyz").status_code == 503
                answer, _ = await timed_call(router, "memory/recall", {"query": "refunds"})
                assert answer["degraded"] == ["kb"] and [h["tier"] for h in answer["records"]] == ["working"]
    finally:
        pg.stop()


@pytest.mark.anyio
async def test_readiness_fails_while_a_mounted_column_is_gone(user_pg: str) -> None:
    """`/readyz` (the store's ping) read only the table, so a renamed text, vector, metadata, time or
    row-filter column left the corpus "ready" while every read failed "no longer reads as mounted"."""
    from backends.store import StoreUnavailable

    with psycopg.connect(user_pg, autocommit=True) as conn:
        conn.execute("CREATE TABLE ready_cols (id int PRIMARY KEY, body text, emb vector(2), src text, meta jsonb,"
                     " written timestamptz, coll text)")
        conn.execute("""INSERT INTO ready_cols VALUES (1, 'refunds', '[1,0]', 'a', '{"k": 1}', now(), 'c1')""")
        async with opened_table(user_pg, table="ready_cols", text_column="body", vector_column="emb",
                                metadata_columns=["src"], metadata_column="meta", created_column="written",
                                row_filter=("coll", "c1")) as store:
            await store.ping()
            for column in ("body", "emb", "src", "meta", "written", "coll", "id"):
                conn.execute(f"ALTER TABLE ready_cols RENAME COLUMN {column} TO gone")
                try:
                    with pytest.raises(StoreUnavailable, match=f"column \"{column}\" does not exist"):
                        await store.ping()
                finally:
                    conn.execute(f"ALTER TABLE ready_cols RENAME COLUMN gone TO {column}")
                await store.ping()  # back as mounted: ready again


# ---- every write-shaped method, as the protocol says a read-only server answers it ----------------------

WRITES = [  # (method, params, the error code, or None: answered, writing nothing)
    ("memory/remember", {"records": [{"content": "x"}]}, -32004),
    ("memory/remember", {"records": []}, -32004),
    ("memory/forget", {"ids": ["5"]}, -32004),
    ("memory/forget", {"query": "refunds"}, -32004),
    ("memory/forget", {}, -32004),  # refused as a write before its params are read
    ("memory/summarize", {"query": "refunds"}, -32003),  # summarize is not declared (protocol §2)
    ("memory/reinforce", {"ids": ["5"]}, -32003),
    ("memory/fetch", {"key": "a"}, -32003),
    ("memory/session/close", {"session": "s"}, -32003),
    ("memory/promote", {"ids": ["5"], "tier": "corpus"}, None),  # the ids already live in the only tier here
    ("memory/consolidate", {}, None),
]


def answered_as_read_only(answers: list[dict[str, Any]]) -> list[Any]:
    # one answer per call, each by its id: zip alone stopped at the answers given, so a call never
    # answered (or a server that answered none) was never checked
    wrong: list[Any] = [] if [a.get("id") for a in answers] == list(range(len(WRITES))) else [("answers", answers)]
    for (method, params, code), answer in zip(WRITES, answers):
        got = answer.get("error", {}).get("code")
        if got != code or (code is None and answer["result"].get("promoted", 0) != 0):
            wrong.append((method, params, answer))
    return wrong


def test_every_write_method_answers_as_a_read_only_server(user_pg: str, tmp_path: Path) -> None:
    answers, done = serve(user_pg, tmp_path, "table=docs", "text_column=body",
                          calls=[(method, params) for method, params, _ in WRITES])
    assert done.returncode == 0, done.stderr
    assert not answered_as_read_only(answers)
    with psycopg.connect(user_pg) as conn:
        assert conn.execute("SELECT count(*) FROM docs").fetchone()[0] == ROWS
