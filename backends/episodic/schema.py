"""Versioned schema for the episodic tier, safe for replicas that start at once.

Every migration runs in one transaction holding a transaction-level advisory
lock, so a second replica waits, then finds the version already applied and
does nothing. Migrations only ever add: a released step is never edited, a new
need is a new step (never "drop and recreate", which would lose memories).

The embedding column is not a migration: its width is fixed by the first
vector a client sends, so it is added lazily (`ensure_embedding`) under the same
lock. Its HNSW index is built by the store once the first load pauses
(`build_vector_index`, decision 28), under a session-level lock of its own so
one replica builds it.

Full text: a generated `tsvector` of `english` (stemmed, stopwords removed)
concatenated with `simple` (every word verbatim), so English recall gets
stemming and any other language still matches its exact words. Stopwords are
removed from the *query* with the shared multilingual lists (`a2m.text`), which
is why the `simple` half may keep them in the document.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Awaitable, Callable, Union

from psycopg import AsyncConnection

from a2m.text import tokenize_once

_log = logging.getLogger("a2m.episodic")

# pg_advisory_xact_lock key: "a2m-epi" as a stable 63-bit integer.
LOCK_KEY = 0x0061326D2D657069
# pg_try_advisory_lock key of the one replica building the vector index: "a2m-hnsw".
INDEX_LOCK_KEY = 0x61326D2D686E7377
VECTOR_INDEX = "records_embedding"

# HNSW in pgvector indexes at most 2,000 dimensions of `vector`; wider vectors are searched exactly.
HNSW_MAX_DIMENSIONS = 2000

BACKFILL_BATCH = 1000


async def tokenize_old_rows(conn: AsyncConnection) -> int:
    """Store the terms (`a2m.text.tokenize`) of every row that has none; returns how many.

    A step of Python, not SQL: PostgreSQL has no copy of the shared tokenizer.
    Keyset pages over the primary key, so a large table is read once.
    """
    done, last = 0, ""
    while True:
        cur = await conn.execute("SELECT id, content FROM records WHERE id > %s AND terms IS NULL ORDER BY id LIMIT %s",
                                 [last, BACKFILL_BATCH])
        rows = await cur.fetchall()
        if not rows:
            if done:
                _log.info("stored the terms of %d rows written before schema 2", done)
            return done
        if done and done % (50 * BACKFILL_BATCH) == 0:
            _log.info("storing the terms of rows written before schema 2: %d so far", done)
        async with conn.cursor() as update:
            await update.executemany("UPDATE records SET terms = %s WHERE id = %s",
                                     [(tokenize_once(content), record_id) for record_id, content in rows])
        done += len(rows)
        last = rows[-1][0]


# A step is SQL, or a coroutine over the migration's connection (inside its transaction).
Step = Union[str, Callable[[AsyncConnection], Awaitable[object]]]
MIGRATIONS: list[tuple[int, str, list[Step]]] = [
    (
        1,
        "records table, b-tree, full-text and metadata indexes",
        [
            "CREATE EXTENSION IF NOT EXISTS vector",
            "CREATE SEQUENCE IF NOT EXISTS records_seq",
            """
            CREATE TABLE IF NOT EXISTS records (
                id text PRIMARY KEY,
                seq bigint NOT NULL DEFAULT nextval('records_seq'),
                owner text,
                session text,
                role text,
                "group" text,
                tier text,
                key text,
                revision bigint NOT NULL DEFAULT 1,
                metadata jsonb NOT NULL DEFAULT '{}'::jsonb,
                created_at timestamptz NOT NULL,
                salience double precision NOT NULL DEFAULT 0.5,
                access_count bigint NOT NULL DEFAULT 0,
                accessed_at timestamptz,
                uri text,
                media_type text,
                content text NOT NULL,
                fts tsvector GENERATED ALWAYS AS
                    (to_tsvector('english'::regconfig, content) || to_tsvector('simple'::regconfig, content)) STORED
            )
            """,
            # Owner leads every index: every query is scoped to one owner's partition.
            "CREATE INDEX IF NOT EXISTS records_owner_created ON records (owner, created_at, seq)",
            "CREATE INDEX IF NOT EXISTS records_owner_session ON records (owner, session, created_at, seq)",
            # text_pattern_ops: equality for keys and a byte-wise range for key_prefix, whatever the collation.
            """CREATE UNIQUE INDEX IF NOT EXISTS records_owner_key ON records (owner, key text_pattern_ops)
               NULLS NOT DISTINCT WHERE key IS NOT NULL""",
            "CREATE INDEX IF NOT EXISTS records_fts ON records USING gin (fts)",
            "CREATE INDEX IF NOT EXISTS records_metadata ON records USING gin (metadata jsonb_path_ops)",
        ],
    ),
    (
        2,
        "terms: each record's BM25 terms (a2m.text.tokenize), written with it",
        # NULL for rows written before: a text recall tokenizes their content instead.
        ["ALTER TABLE records ADD COLUMN IF NOT EXISTS terms text[]"],
    ),
    (
        3,
        "rows up to a page long stay whole, and pages keep room for a touch to update in place",
        # PostgreSQL moves a row's widest values out of line past ~2 KB: a 384-dim vector (1.5 KB)
        # with its text crossed it, and an exact scan then read each embedding through the TOAST
        # index (2.7 vs 1.5 ms over an owner's 1,000 rows). A whole row is wider, so a page keeps
        # 30% free: recall's touch (access_count, accessed_at, no indexed column) then rewrites a
        # row on its own page (a HOT update) instead of inserting it anew into every index, the
        # HNSW graph included (10 rows: 0.8 vs 7.5 ms). Both apply to rows written from now on;
        # VACUUM FULL records rewrites the older ones. No data changes (decision 30).
        ["ALTER TABLE records SET (toast_tuple_target = 8160, fillfactor = 70)"],
    ),
    (
        4,
        "terms for the rows written before schema 2, so every text recall is ranked in SQL",
        [tokenize_old_rows],
    ),
    (
        5,
        "the full-text index keeps at most 256 kB of fresh rows unmerged",
        # GIN queues new rows' entries in a pending list that every text query reads whole until a
        # VACUUM (or an insert past the limit) merges it: at the default 4 MB, 6,000 fresh rows
        # made a text recall over 100,000 rows 40% slower (decision 33).
        ["ALTER INDEX records_fts SET (gin_pending_list_limit = 256)"],
    ),
]

LATEST = MIGRATIONS[-1][0]


async def applied_version(conn: AsyncConnection) -> int:
    """The schema version the database holds (0 for none), read without DDL or a lock."""
    cur = await conn.execute("SELECT to_regclass('schema_version') IS NOT NULL")
    row = await cur.fetchone()
    if not (row and row[0]):
        return 0
    row = await (await conn.execute("SELECT coalesce(max(version), 0) FROM schema_version")).fetchone()
    return int(row[0]) if row else 0


async def migrate(conn: AsyncConnection) -> int:
    """Bring the schema to `LATEST`; return the version found before (0 for an empty database).

    A schema already at `LATEST` is only read: a role with no CREATE right (the schema migrated
    once by its owner) or a read-only server could not start, refused the `CREATE TABLE IF NOT
    EXISTS` that PostgreSQL checks before it looks whether the table exists."""
    found = await applied_version(conn)
    if found == LATEST:
        return found
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", [LOCK_KEY])
        await conn.execute(
            """CREATE TABLE IF NOT EXISTS schema_version (
                   version integer PRIMARY KEY,
                   description text NOT NULL,
                   applied_at timestamptz NOT NULL DEFAULT now())"""
        )
        row = await (await conn.execute("SELECT coalesce(max(version), 0) FROM schema_version")).fetchone()
        found = int(row[0]) if row else 0
        if found > LATEST:
            raise RuntimeError(f"database schema version {found} is newer than this code ({LATEST}); upgrade a2m")
        for version, description, statements in MIGRATIONS:
            if version <= found:
                continue
            for statement in statements:
                if isinstance(statement, str):
                    await conn.execute(statement)
                else:
                    await statement(conn)
            await conn.execute(
                "INSERT INTO schema_version (version, description) VALUES (%s, %s)", [version, description]
            )
    return found


async def embedding_dimensions(conn: AsyncConnection) -> int | None:
    """Width of the embedding column (pgvector keeps it as the type modifier), or None before any vector."""
    cur = await conn.execute(
        """SELECT atttypmod FROM pg_attribute
           WHERE attrelid = 'records'::regclass AND attname = 'embedding' AND NOT attisdropped"""
    )
    row = await cur.fetchone()
    return int(row[0]) if row and row[0] and row[0] > 0 else None


@dataclass(frozen=True)
class HNSWBuild:
    """pgvector's build parameters, fixed when the index is made (after the first load).

    They set the rate of writes into an indexed tier: every insert walks the
    graph, and on 2 cores with 384-dim vectors the defaults write ~600
    records/s against ~8,500/s with no index; m = 8, ef_construction = 32
    writes ~1,500/s. Lower values cost recall on scans the index serves (large
    scopes), not on owner-sized ones, which the planner answers exactly from
    the b-tree.
    """

    m: int = 16
    ef_construction: int = 64

    def __post_init__(self) -> None:
        if not 2 <= self.m <= 100 or not 2 * self.m <= self.ef_construction <= 1000:
            raise ValueError("hnsw_m must be 2..100 and hnsw_ef_construction 2*m..1000")


async def ensure_embedding(conn: AsyncConnection, dimensions: int, *, index: HNSWBuild | None = HNSWBuild()) -> int:
    """Add the embedding column of this width (and its cosine HNSW index) if no vector fixed one yet.

    Runs inside the caller's transaction, so the column appears together with
    the first vectors or not at all. Returns the width now in force, which may
    differ from `dimensions` when another replica got there first.
    """
    await conn.execute("SELECT pg_advisory_xact_lock(%s)", [LOCK_KEY])
    current = await embedding_dimensions(conn)
    if current is not None:
        return current
    width = int(dimensions)
    await conn.execute(f"ALTER TABLE records ADD COLUMN embedding vector({width})")
    if index is not None:
        await ensure_vector_index(conn, width, index)
    return width


def indexable(width: int) -> bool:
    return width <= HNSW_MAX_DIMENSIONS


async def vector_index_state(conn: AsyncConnection) -> str:
    """"valid", "invalid" (a concurrent build that was interrupted: unused by the planner, dropped
    before the next build) or "missing"."""
    cur = await conn.execute(
        "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE c.relname = %s",
        [VECTOR_INDEX])
    row = await cur.fetchone()
    return "missing" if row is None else "valid" if row[0] else "invalid"


def _create_index_sql(build: HNSWBuild, concurrently: bool) -> str:
    return (f"CREATE INDEX {'CONCURRENTLY ' if concurrently else ''}IF NOT EXISTS {VECTOR_INDEX} ON records "
            f"USING hnsw (embedding vector_cosine_ops) WITH (m = {build.m:d}, ef_construction = {build.ef_construction:d})")


def index_sql_for_owner(build: HNSWBuild, invalid: bool) -> str:
    """What the table's owner runs to build the index a role without that right could not: the
    statement the store itself runs, after dropping an invalid index an interrupted build left."""
    drop = f"DROP INDEX CONCURRENTLY IF EXISTS {VECTOR_INDEX}; " if invalid else ""
    return drop + _create_index_sql(build, concurrently=True)


async def ensure_vector_index(conn: AsyncConnection, width: int, build: HNSWBuild = HNSWBuild()) -> None:
    """The cosine HNSW index, when pgvector can index this width (idempotent, in the caller's transaction)."""
    if indexable(width):
        await conn.execute(_create_index_sql(build, concurrently=False))


async def build_vector_index(conn: AsyncConnection, build: HNSWBuild) -> bool:
    """Build the index over the rows already written, without blocking writes (CONCURRENTLY, so
    `conn` must be in autocommit). False when another replica holds the build lock: it is building.

    The lock is a session lock: the caller closes `conn` afterwards, which releases it even when
    the build was interrupted. An invalid index left by an interrupted build is dropped first
    (`IF NOT EXISTS` would keep it).
    """
    cur = await conn.execute("SELECT pg_try_advisory_lock(%s)", [INDEX_LOCK_KEY])
    if not (await cur.fetchone() or (False,))[0]:
        return False
    state = await vector_index_state(conn)
    if state == "valid":
        return True
    if state == "invalid":
        await conn.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {VECTOR_INDEX}")
    await conn.execute(_create_index_sql(build, concurrently=True))
    return True
