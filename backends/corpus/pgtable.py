"""Read an existing table as A2M records: rank by pgvector distance and full text, fused by rank.

The table is someone else's: nothing here creates, alters or writes it, and
column names come from config, so they are validated against the catalog at
start and quoted as identifiers, never interpolated as text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Iterable, Literal, Mapping, Sequence

from psycopg import sql
from psycopg.rows import dict_row

from a2m.filters import Scope
from a2m.records import Record
from a2m.timefmt import format_ts

from backends.store import StoreRejected, StoreUnavailable

from .common import EPOCH, ReadOnlyStore, fuse, json_safe, visible

_WORD = re.compile(r"\w+", re.UNICODE)


@dataclass(slots=True)
class TableSpec:
    table: str
    id_column: str = "id"
    text_column: str = "content"
    vector_column: str | None = None
    created_column: str | None = None
    metadata_columns: list[str] = field(default_factory=list)

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> "TableSpec":
        if not options.get("table"):
            raise SystemExit("corpus: --option table=NAME is required")
        columns = options.get("metadata_columns") or ""
        if not isinstance(columns, list):
            columns = [c.strip() for c in str(columns).split(",") if c.strip()]

        def name(key: str, default: str | None) -> str | None:
            value = options.get(key) or default
            return None if value is None else str(value)

        return cls(table=str(options["table"]), id_column=name("id_column", "id") or "id",
                   text_column=name("text_column", "content") or "content",
                   vector_column=name("vector_column", None), created_column=name("created_column", None),
                   metadata_columns=[str(c) for c in columns])


def _text(values: Iterable[str]) -> list[str]:
    """Values to compare with text columns, less those holding NUL: PostgreSQL refuses NUL in a
    parameter, and no text column holds one, so such a value matches nothing (as on every tier)."""
    return [v for v in values if "\x00" not in v]


class TableStore(ReadOnlyStore):
    engine = "postgresql (read-only table)"

    def __init__(self, dsn: str, spec: TableSpec) -> None:
        self.dsn = dsn
        self.spec = spec
        self.searches_vectors = spec.vector_column is not None
        self._pool: Any = None
        self._dims: int | None = None

    # ---- lifecycle -------------------------------------------------------------

    async def open(self) -> None:
        from pgvector.psycopg import register_vector_async
        from psycopg_pool import AsyncConnectionPool

        async def configure(conn: Any) -> None:
            if self.spec.vector_column:
                await register_vector_async(conn)

        self._pool = AsyncConnectionPool(self.dsn, min_size=1, max_size=8, configure=configure, open=False)
        await self._pool.open(wait=True, timeout=30)
        await self._validate()

    async def _validate(self) -> None:
        spec = self.spec
        schema, _, table = spec.table.rpartition(".")
        async with self._pool.connection() as conn:
            rows = await (await conn.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_name = %s"
                " AND (%s = '' OR table_schema = %s)", (table, schema, schema))).fetchall()
            present = {r[0] for r in rows}
            wanted = [spec.id_column, spec.text_column, *spec.metadata_columns]
            wanted += [c for c in (spec.vector_column, spec.created_column) if c]
            missing = [c for c in wanted if c not in present]
            if not present:
                raise SystemExit(f"corpus: table {spec.table!r} not found")
            if missing:
                raise SystemExit(f"corpus: table {spec.table!r} has no column(s) {missing}; it has {sorted(present)}")
            if spec.vector_column:
                row = await (await conn.execute(sql.SQL("SELECT vector_dims({}) FROM {} WHERE {} IS NOT NULL LIMIT 1").format(
                    sql.Identifier(spec.vector_column), self._table(), sql.Identifier(spec.vector_column)))).fetchone()
                self._dims = row[0] if row else None

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    async def ping(self) -> None:
        await self._query(sql.SQL("SELECT 1"), ())

    # ---- helpers ---------------------------------------------------------------

    def _table(self) -> sql.Composable:
        return sql.Identifier(*self.spec.table.split("."))

    def _columns(self, with_embeddings: bool) -> sql.Composable:
        spec = self.spec
        cols = [sql.SQL("{}::text AS a2m_id").format(sql.Identifier(spec.id_column)),
                sql.SQL("{} AS a2m_content").format(sql.Identifier(spec.text_column))]
        if spec.created_column:
            cols.append(sql.SQL("{} AS a2m_created").format(sql.Identifier(spec.created_column)))
        if with_embeddings and spec.vector_column:
            cols.append(sql.SQL("{} AS a2m_vector").format(sql.Identifier(spec.vector_column)))
        cols += [sql.Identifier(c) for c in spec.metadata_columns]
        return sql.SQL(", ").join(cols)

    def _record(self, row: dict[str, Any]) -> Record:
        created = row.get("a2m_created")
        vector = row.get("a2m_vector")
        return Record(
            id=row["a2m_id"], content=row["a2m_content"] or "",
            created_at=format_ts(created) if isinstance(created, datetime) else EPOCH,
            metadata={c: json_safe(row[c]) for c in self.spec.metadata_columns},
            embedding=None if vector is None else [float(x) for x in vector],
        )

    def _where(self, scope: Scope) -> tuple[sql.Composable, list[Any]]:
        """SQL for what the table can answer; `matches` re-checks everything in Python afterwards."""
        clauses: list[sql.Composable] = []
        args: list[Any] = []
        if scope.ids is not None:
            clauses.append(sql.SQL("{}::text = ANY(%s)").format(sql.Identifier(self.spec.id_column)))
            args.append(_text(scope.ids))
        for name, expected in scope.where.items():
            if name not in self.spec.metadata_columns:
                continue
            options = expected if isinstance(expected, list) else [expected]
            values = [v for v in options if v is not None]
            parts = []
            if values:
                parts.append(sql.SQL("{}::text = ANY(%s)").format(sql.Identifier(name)))
                args.append(_text(str(v).lower() if isinstance(v, bool) else str(v) for v in values))
            if len(values) < len(options):
                parts.append(sql.SQL("{} IS NULL").format(sql.Identifier(name)))
            clauses.append(sql.SQL("(") + sql.SQL(" OR ").join(parts) + sql.SQL(")"))
        if self.spec.created_column:
            for bound, op in ((scope.after, ">"), (scope.before, "<")):
                if bound is not None:
                    clauses.append(sql.SQL("{} " + op + " %s::timestamptz").format(sql.Identifier(self.spec.created_column)))
                    args.append(bound)
        if not clauses:
            return sql.SQL("TRUE"), args
        return sql.SQL(" AND ").join(clauses), args

    async def _query(self, query: sql.Composable, args: Sequence[Any]) -> list[dict[str, Any]]:
        import psycopg

        if self._pool is None:
            raise StoreUnavailable("corpus store is not open")
        try:
            async with self._pool.connection() as conn:
                cursor = conn.cursor(row_factory=dict_row)
                await cursor.execute(query, args)
                return await cursor.fetchall() if cursor.description else []
        except psycopg.OperationalError as exc:
            raise StoreUnavailable(str(exc).splitlines()[0]) from exc
        except psycopg.DataError as exc:
            raise StoreRejected(str(exc).splitlines()[0]) from exc

    # ---- reads -----------------------------------------------------------------

    async def get(self, owner: str | None, ids: Sequence[str], *, with_embeddings: bool = False) -> list[Record]:
        if not ids:
            return []
        rows = await self._query(sql.SQL("SELECT {} FROM {} WHERE {}::text = ANY(%s)").format(
            self._columns(with_embeddings), self._table(), sql.Identifier(self.spec.id_column)), [_text(ids)])
        return [self._record(r) for r in rows]

    async def select(self, scope: Scope, *, order: Literal["asc", "desc"] = "asc", limit: int | None = None,
                     with_embeddings: bool = False) -> list[Record]:
        if scope.key_prefix is not None:
            return []
        where, args = self._where(scope)
        by = sql.Identifier(self.spec.created_column or self.spec.id_column)
        query = sql.SQL("SELECT {} FROM {} WHERE {} ORDER BY {} " + ("DESC" if order == "desc" else "ASC")).format(
            self._columns(with_embeddings), self._table(), where, by)
        if limit:
            query += sql.SQL(" LIMIT %s")
            args.append(limit)
        return visible([self._record(r) for r in await self._query(query, args)], scope)

    async def search(self, scope: Scope, *, text: str | None, vector: Sequence[float] | None, limit: int,
                     with_embeddings: bool = False) -> list[Record]:
        if scope.key_prefix is not None:
            return []
        where, args = self._where(scope)
        pool = max(limit * 4, 40)
        rankings: list[list[str]] = []
        rows: dict[str, dict[str, Any]] = {}
        words = [w for w in _WORD.findall(text or "") if len(w) > 1][:32]
        if words:
            tsquery = " | ".join(words)
            document = sql.SQL("to_tsvector('english', coalesce({}, ''))").format(sql.Identifier(self.spec.text_column))
            query = sql.SQL("SELECT {} FROM {} WHERE {} AND {} @@ to_tsquery('english', %s) "
                            "ORDER BY ts_rank_cd({}, to_tsquery('english', %s)) DESC LIMIT %s").format(
                self._columns(with_embeddings), self._table(), where, document, document)
            found = await self._query(query, [*args, tsquery, tsquery, pool])
            rankings.append([row["a2m_id"] for row in found])
            rows |= {row["a2m_id"]: row for row in found}
        if vector is not None and self.spec.vector_column:
            query = sql.SQL("SELECT {} FROM {} WHERE {} ORDER BY {} <=> %s::vector LIMIT %s").format(
                self._columns(with_embeddings), self._table(), where, sql.Identifier(self.spec.vector_column))
            found = await self._query(query, [*args, str(list(vector)), pool])
            rankings.append([row["a2m_id"] for row in found])
            rows |= {row["a2m_id"]: row for row in found}
        records = [self._record(rows[i]).with_(score=s) for i, s in fuse(rankings)]
        return visible(records, scope)[:limit]

    async def count(self, owner: str | None) -> int:
        rows = await self._query(sql.SQL("SELECT count(*) AS n FROM {}").format(self._table()), ())
        return int(rows[0]["n"])

    async def dimensions(self) -> int | None:
        return self._dims
