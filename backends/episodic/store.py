"""PostgresStore: the episodic Store on PostgreSQL + pgvector; filter inside the scan, then rank.

The store composes the package's parts (each module says why it works as it does):

- `connections`: the embedded server, the pool of autocommit connections, and
  engine errors as the Store's exceptions (retries on a broken connection,
  a deadlock, a dead postmaster).
- `schema`: the `records` table, its migrations and the HNSW index build.
- `rows`: the table's columns, and a Record on each side of them.
- `scope`: a Scope as the WHERE clause of every scan.
- `scope_sizes`: how many records a scope holds, counted briefly.
- `vectors`: vector recall, an exact scan or an HNSW walk by the scope's size.
- `lexical`: the full-text matches in scope, scored by BM25 in SQL.
- `ranking`: relevance (BM25 summed with the cosine, lent to session
  neighbours), then recency and salience blended in lightly.

What the store itself decides:

- Ids are global (the Store contract deletes by bare id), so an upsert that
  would take over another owner's id is refused instead of crossing partitions.
- A write checks and locks what it was resolved against inside its own
  transaction (decisions 42, 68), and sends its rows as they are made
  (decision 45).
- The HNSW index is built after the first load, not row by row during it
  (pgvector's own advice): once vector writes pause for `index_quiet_s`, or at
  most `INDEX_DEFER_MAX_S` after the first, in the background and without
  blocking writes. Until then a vector recall is an exact scan (decision 28).
- A recall takes as few round trips as its kind allows: once the scope's size
  is known (`scope_sizes`), a vector-only recall is one statement; a text or
  hybrid recall is three or four (decision 21).
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import datetime
from typing import Any, Collection, Literal, Mapping, Sequence

import psycopg
from pgvector import Vector
from psycopg import AsyncConnection

from a2m.filters import Scope
from a2m.records import Record
from a2m.timefmt import format_ts
from backends.settings import TierSettings
from backends.store import (Position, SessionInfo, StoreConflict, StoreIdTaken, StoreRejected, StoreUnavailable,
                            StoreWidthMismatch)

from . import schema
from .connections import Connections, no_embedding_column, read_only, unprivileged
from .lexical import query_words
from .ranking import HYBRID_POOL, RRF_K, blend, recency, text_relevance
from .rows import CANONICAL_TS, COLUMNS, INSERT_COLUMNS, UPDATE_SET, to_record, to_row
from .scope import scope_sql, storable_ids
from .scope_sizes import ScopeSizes
from .vectors import halfvec_range, nearest_rows

_log = logging.getLogger("a2m.episodic")

INDEX_DEFER_MAX_S = 60.0  # the longest the first index build waits for vector writes to pause
# How often an index build refused for good (a read-only server, a role without DDL) is tried again.
INDEX_REFUSED_RETRY_S = 3600.0
NO_DIMENSIONS_TTL_S = 5.0  # how long a server believes its tier holds no vectors (another replica may add some)


def _ts(value: datetime | None) -> str | None:
    return None if value is None else format_ts(value)


class PostgresStore:
    """Store on PostgreSQL + pgvector; `settings.url` is a postgresql:// DSN, None starts an embedded server."""

    engine = "postgresql"
    searches_vectors = True

    def __init__(self, settings: TierSettings) -> None:
        self.settings = settings
        options = settings.options or {}
        self._db = Connections(settings)
        self._dims: int | None = None
        self._no_dims_until = 0.0  # "no vectors yet" is believed until then (another replica may add them)
        self._sizes = ScopeSizes()
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

    @property
    def dsn(self) -> str | None:
        """The database's DSN: `settings.url`, or the embedded server's once open."""
        return self._db.dsn

    # -- lifecycle ---------------------------------------------------------------------------------

    async def open(self) -> None:
        if self._db.pool is not None:
            return
        await self._db.start()
        try:
            async with await self._db.connect() as conn:
                await schema.migrate(conn)
                self._dims = await schema.embedding_dimensions(conn)
                if self._wants_index(self._dims):
                    self._index_ready = await schema.vector_index_state(conn) == "valid"
                needs_index = self._wants_index(self._dims) and not self._index_ready
            await self._db.open_pool()
            if needs_index:  # vectors from before a crash, or a build that was interrupted
                self._schedule_index()
        except (psycopg.OperationalError, psycopg.InterfaceError) as error:
            await self._db.stop_embedded(quietly=True)
            raise StoreUnavailable(f"PostgreSQL is unavailable: {error}") from error
        except psycopg.errors.ReadOnlySqlTransaction as error:
            await self._db.stop_embedded(quietly=True)
            raise StoreUnavailable(read_only(error)) from error
        except psycopg.errors.InsufficientPrivilege as error:  # no schema yet, and this role may not make it
            await self._db.stop_embedded(quietly=True)
            raise StoreUnavailable(unprivileged(error, self._db.role)) from error
        except BaseException:
            await self._db.stop_embedded(quietly=True)
            raise

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
        parallel workers (a small /dev/shm cannot hold their shared graph).

        A build refused for a reason that stays (a read-only server, a role that does not own the
        table) is said once, in words naming what to run, and tried again only every
        `INDEX_REFUSED_RETRY_S` (a standby promoted, a right granted), quietly: it was retried every
        minute at most, with a warning each time, for ever. Recall is an exact scan meanwhile."""
        failures = 0
        said: str | None = None  # the refusal already logged
        while not self._index_ready:
            delay = self._index_due_in()
            if delay > 0:
                await asyncio.sleep(delay)
                continue
            started = time.monotonic()
            refusal: str | None = None
            try:
                async with await self._db.connect() as conn:
                    if failures:
                        await conn.execute("SET max_parallel_maintenance_workers = 0")
                    try:
                        built = await schema.build_vector_index(conn, self.hnsw)
                    except asyncio.CancelledError:
                        await conn.cancel_safe(timeout=5.0)  # leaves an invalid index: the next build drops it
                        raise
                    except (psycopg.errors.ReadOnlySqlTransaction, psycopg.errors.InsufficientPrivilege) as error:
                        refusal = await self._index_refusal(conn, error)
            except psycopg.Error as error:
                failures += 1
                _log.warning("building the vector index failed (attempt %d): %s", failures, error)
                await asyncio.sleep(min(60.0, 5.0 * failures))
                continue
            if refusal is not None:
                _log.log(logging.DEBUG if refusal == said else logging.WARNING, "%s", refusal)
                said = refusal
                await asyncio.sleep(INDEX_REFUSED_RETRY_S)
                continue
            if built:
                self._index_ready = True
                _log.info("vector index built in %.1f s", time.monotonic() - started)
            else:
                await asyncio.sleep(1.0)  # another replica holds the build lock

    async def _index_refusal(self, conn: AsyncConnection, error: psycopg.Error) -> str:
        """Why this server or role may not build the index, what to run instead, and what recall does
        meanwhile (for the log: `memory/describe` says nothing of the index)."""
        said = str(error).splitlines()[0]
        later = (f"vector recall is an exact scan meanwhile (slower past a few thousand records per owner); "
                 f"tried again every {INDEX_REFUSED_RETRY_S / 60:g} min")
        try:
            invalid = await schema.vector_index_state(conn) == "invalid"
        except psycopg.Error:
            invalid = False
        run = f"`{schema.index_sql_for_owner(self.hnsw, invalid)}`"
        if isinstance(error, psycopg.errors.ReadOnlySqlTransaction):
            return (f"the vector index {schema.VECTOR_INDEX} is missing and this server takes no writes ({said}): "
                    f"build it on the primary (a standby receives it): start the tier there once, or have the "
                    f"records table's owner run {run}; {later}")
        return (f"the role of --url may not build the vector index {schema.VECTOR_INDEX} ({said}): have the "
                f"records table's owner run {run}, or start the tier once with the owner's DSN; {later}")

    async def vector_index_ready(self) -> bool:
        """Whether the HNSW index exists and is valid (benches and tests wait on it)."""
        async def work(conn: AsyncConnection) -> bool:
            return await schema.vector_index_state(conn) == "valid"

        return await self._db.run(work)

    async def close(self) -> None:
        task, self._index_task = self._index_task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except (asyncio.CancelledError, Exception):  # a build cut short is redone at the next start
                pass
        await self._db.close()

    async def ping(self) -> None:
        async def work(conn: AsyncConnection) -> None:
            await conn.execute("SELECT 1")

        await self._db.run(work)

    async def _dimensions(self, conn: AsyncConnection, fresh: bool = False) -> int | None:
        """The tier's embedding width. A width never changes; "none yet" is re-read every few
        seconds rather than on every call (a catalog query per text recall on a tier without vectors)."""
        if self._dims is None and (fresh or time.monotonic() >= self._no_dims_until):
            self._dims = await schema.embedding_dimensions(conn)
            self._no_dims_until = time.monotonic() + NO_DIMENSIONS_TTL_S
        return self._dims

    def _columns(self, with_embeddings: bool) -> str:
        return COLUMNS + (", embedding::text" if with_embeddings else "")

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
        if self.vector_search == "exact":
            halfvec_range(puts)
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
                    try:
                        dims = await schema.ensure_embedding(conn, len(first), index=self.hnsw if built_now else None)
                    except psycopg.errors.InsufficientPrivilege as error:  # rolled back: nothing of the batch
                        raise StoreUnavailable(no_embedding_column(error, len(first))) from error
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
                columns = INSERT_COLUMNS + (", embedding" if vectors else "")
                marks = ", ".join(["%s"] * 16 + ["string_to_array(%s, ' ')"] + (["%s"] if vectors else []))
                sql = (
                    f"INSERT INTO records ({columns}) VALUES ({marks}) ON CONFLICT (id) DO UPDATE SET {UPDATE_SET}"
                    + (", embedding = EXCLUDED.embedding" if vectors else "")
                    + ", seq = nextval('records_seq') WHERE records.owner IS NOT DISTINCT FROM EXCLUDED.owner"
                    # the revision the surface resolved the put against (0: none, so never; NULL: any)
                    + " AND (%s::bigint IS NULL OR records.revision = %s::bigint)"
                )
                # A generator: executemany pipelines each row as it is made, so PostgreSQL inserts the
                # first rows while Python tokenizes and packs the next ones.
                values = (to_row(r, vectors) + (expect.get(r.id),) * 2 for r in rows)
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

        dims = await self._db.run(work)
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
            f"SELECT id, owner, revision, access_count, {CANONICAL_TS.format('accessed_at')}, salience "
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

        return await self._db.run(work)

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

        return await self._db.run(work)

    async def delete(self, scope: Scope) -> int:
        condition, params = scope_sql(scope)

        async def work(conn: AsyncConnection) -> int:
            cur = await conn.execute(f"DELETE FROM records WHERE {condition}", params)
            self._sizes.clear()  # a scope that shrank below the exact-scan threshold must not be walked
            return cur.rowcount

        return await self._db.run(work)

    # -- reads -------------------------------------------------------------------------------------

    async def _fetch(self, sql: str, params: Sequence[Any], with_embeddings: bool) -> list[Record]:
        async def work(conn: AsyncConnection) -> list[Record]:
            embed = with_embeddings and await self._dimensions(conn) is not None
            cur = await conn.execute(sql.replace("{columns}", self._columns(embed)), params)
            return [to_record(row, with_embedding=embed) for row in await cur.fetchall()]

        return await self._db.run(work)

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
            cur = await conn.execute("SELECT id, owner FROM records WHERE id = ANY(%s)", [storable_ids(ids)])
            return {row[0]: row[1] for row in await cur.fetchall()}

        return await self._db.run(work)

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

    async def timeline_page(self, scope: Scope, *, below: Position | None, limit: int | None,
                            with_embeddings: bool = False) -> list[tuple[Record, Position]]:
        """`select` newest first, from strictly before `below`: (created_at, seq) is the order of the
        owner's b-tree indexes, so a page of a crowded millisecond is one index range too (one
        sequence numbers every row: no tie for the id to break)."""
        condition, params = scope_sql(scope)
        if below is not None:
            condition = f"({condition}) AND (created_at, seq) < (%s::timestamptz, %s)"
            params += [below[0], below[1]]
        sql = f"SELECT seq, {{columns}} FROM records WHERE {condition} ORDER BY created_at DESC, seq DESC"
        if limit is not None:
            sql += " LIMIT %s"
            params.append(int(limit))

        async def work(conn: AsyncConnection) -> list[tuple[Record, Position]]:
            embed = with_embeddings and await self._dimensions(conn) is not None
            cur = await conn.execute(sql.replace("{columns}", self._columns(embed)), params)
            pairs = [(to_record(row[1:], with_embedding=embed), int(row[0])) for row in await cur.fetchall()]
            return [(record, (record.created_at, seq, record.id)) for record, seq in pairs]

        return await self._db.run(work)

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
                return [to_record(row, with_embedding=embed, score=recency(row[2], now))
                        for row in await cur.fetchall()]
            if not use_text:  # one ranked list, read whole in one statement: the reciprocal-rank shape
                rows = await nearest_rows(conn, self._sizes, self.vector_search, columns, scope, query_vector,
                                          dims, limit)
                relevance = [(RRF_K + 1.0) / (RRF_K + rank) for rank in range(1, len(rows) + 1)]
            else:
                pool = max(2 * limit, HYBRID_POOL) if use_vector else limit
                size = await self._sizes.count(conn, condition, scope_params)  # BM25's document count
                similar = {row[0]: 1.0 - float(row[1]) for row in await nearest_rows(
                    conn, self._sizes, self.vector_search, "id", scope, query_vector, dims, pool,
                )} if use_vector else {}
                best = dict(await text_relevance(conn, condition, scope_params, words, text or "", similar,
                                                 query_vector, self.vector_search, dims, size, pool))
                cur = await conn.execute(f"SELECT {columns} FROM records WHERE id = ANY(%s::text[])", [list(best)],
                                         prepare=True)  # the primary key, whatever the ids
                rows = await cur.fetchall()
                relevance = [best[row[0]] for row in rows]
            return blend(rows, relevance, embed, limit)

        return await self._db.run(work)

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

        return await self._db.run(work)

    async def count(self, owner: str | None) -> int:
        condition, params = scope_sql(Scope(owner=owner))

        async def work(conn: AsyncConnection) -> int:
            cur = await conn.execute(f"SELECT count(*) FROM records WHERE {condition}", params)
            row = await cur.fetchone()
            return int(row[0]) if row else 0

        return await self._db.run(work)

    async def dimensions(self) -> int | None:
        async def work(conn: AsyncConnection) -> int | None:
            return await self._dimensions(conn, fresh=True)

        return await self._db.run(work)
