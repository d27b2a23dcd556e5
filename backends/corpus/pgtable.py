"""Read an existing table as A2M records: rank by pgvector distance and full text, fused by rank.

The table is someone else's: nothing here creates, alters or writes it, and
column names come from config, so they are validated against the catalog at
start and quoted as identifiers, never interpolated as text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from typing import Any, Iterable, Literal, Mapping, Sequence

from psycopg import sql
from psycopg.rows import dict_row

from a2m.filters import RECORD_FIELDS, Scope
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


_INTEGERS = {"int2", "int4", "int8"}
_FLOATS = {"float4", "float8"}
_TEXTS = {"text", "varchar", "name", "citext"}
_MS = timedelta(milliseconds=1)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _integral(value: Any) -> int | None:
    """`value` as the integer a JSON number equals, or None when no integer equals it."""
    if isinstance(value, int):
        return value
    return int(value) if value.is_integer() else None


def _as_float(value: Any) -> float | None:
    try:
        return float(value)
    except OverflowError:  # an integer past every double: no float a record shows equals it
        return None


def _column_test(column: sql.Identifier, kind: str, options: list[Any]) -> tuple[sql.Composable, list[Any]] | None:
    """SQL for `where[column]` (any of `options`) on a column of type `kind`, at least as wide as what
    `matches` says of the value the record shows (`json_safe` of the column's); None where no such test
    is worth writing (the type is not one handled here, or a value it holds cannot be compared exactly in
    SQL), which leaves the test to `visible`. A value no record of this column can show is left out.

    Comparing `column::text` with the value's Python text was wrong for most types: 5.0 is "5" in an
    integer column, numeric keeps its scale ("5.00"), times and JSON have their own text, and an array
    column is matched by any member."""
    parts: list[sql.Composable] = []
    args: list[Any] = []

    def part(template: str, *values: Any) -> None:
        parts.append(sql.SQL(template).format(c=column))
        args.extend(values)

    present = [v for v in options if v is not None]
    if len(present) < len(options):
        part("{c} IS NULL")
        if kind in ("json", "jsonb"):
            part("{c}::jsonb = 'null'::jsonb")  # JSON null shows as null too
    if kind in _TEXTS or kind == "uuid":
        if strings := _text(v for v in present if isinstance(v, str)):
            part("{c}::text = ANY(%s)", strings)  # uuid's text is the lower-case form the record shows
    elif kind in _INTEGERS:
        if whole := [n for n in (_integral(v) for v in present if _number(v)) if n is not None]:
            part("{c}::numeric = ANY(%s::numeric[])", [str(n) for n in whole])
    elif kind in _FLOATS or kind == "numeric":
        if floats := [f for f in (_as_float(v) for v in present if _number(v)) if f is not None]:
            if kind == "numeric":  # the record shows float(value): compare that (within float's range)
                part("(CASE WHEN abs({c}) < 1e308 THEN {c}::float8 END = ANY(%s::float8[]) OR NOT abs({c}) < 1e308)",
                     floats)
            else:  # real's value is read from its shortest text (0.1 shows 0.1, not 0.10000000149…)
                part("{c}::text::float8 = ANY(%s::float8[])", floats)
    elif kind == "bool":
        if flags := [v for v in present if isinstance(v, bool)]:
            part("{c} = ANY(%s::bool[])", flags)
    elif kind == "timestamptz":  # the record shows format_ts: the millisecond it falls in
        for v in present:
            if isinstance(v, str) and (moment := _stamp(v)) is not None:
                if moment.year == 9999 and moment.month == 12 and moment.day == 31:
                    part("{c} >= %s", moment)  # its millisecond ends past what Python can write
                else:
                    part("({c} >= %s AND {c} < %s)", moment, moment + _MS)
    elif kind == "date":
        if days := [d for d in (_day(v) for v in present) if d is not None]:
            part("{c} = ANY(%s::date[])", days)
    elif kind in ("json", "jsonb"):
        from psycopg.types.json import Jsonb

        for v in present:
            if isinstance(v, (str, bool)):  # equal to the value, or a member of the top-level array
                part("{c}::jsonb @> %s::jsonb", Jsonb(v))
            elif _number(v):  # JSON numbers compare exactly in jsonb, as floats once read: only narrow by kind
                part("jsonb_typeof({c}::jsonb) IN ('number', 'array')")
    elif kind in ("_text", "_varchar"):
        if strings := _text(v for v in present if isinstance(v, str)):
            part("{c}::text[] && %s::text[]", strings)
    elif kind in ("_int2", "_int4", "_int8"):
        if whole := [n for n in (_integral(v) for v in present if _number(v)) if n is not None]:
            part("{c}::numeric[] && %s::numeric[]", [str(n) for n in whole])
    elif present:
        return None  # a type not handled here: `visible` tests it
    if not parts:
        return sql.SQL("FALSE"), []  # `where: {x: []}`, or values no record of this column can show
    return sql.SQL("(") + sql.SQL(" OR ").join(parts) + sql.SQL(")"), args


def _stamp(value: str) -> datetime | None:
    """The moment a canonical stamp names; None for text no `format_ts` writes."""
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo is not None and format_ts(moment) == value else None


def _day(value: Any) -> date | None:
    if not isinstance(value, str):
        return None
    try:
        day = date.fromisoformat(value)
    except ValueError:
        return None
    return day if day.isoformat() == value else None


class TableStore(ReadOnlyStore):
    engine = "postgresql (read-only table)"

    def __init__(self, dsn: str, spec: TableSpec) -> None:
        self.dsn = dsn
        self.spec = spec
        self.searches_vectors = spec.vector_column is not None
        self._pool: Any = None
        self._dims: int | None = None
        self._types: dict[str, str] = {}  # column -> its type's name in the catalog (udt_name)
        self._nullable: set[str] = set()

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
                "SELECT column_name, udt_name, is_nullable FROM information_schema.columns WHERE table_name = %s"
                " AND (%s = '' OR table_schema = %s)", (table, schema, schema))).fetchall()
            present = {r[0] for r in rows}
            self._types = {r[0]: r[1] for r in rows}
            self._nullable = {r[0] for r in rows if r[2] != "NO"}
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

    def _created(self) -> sql.Composable:
        """The created column as the records show it: a row without a time shows the epoch, and is
        ordered and bounded as the epoch too (PostgreSQL would sort NULL after every time)."""
        column = sql.Identifier(self.spec.created_column or "")
        if self.spec.created_column in self._nullable:
            return sql.SQL("coalesce({}, 'epoch'::timestamptz)").format(column)
        return column

    def _order(self, order: Literal["asc", "desc"]) -> sql.Composable:
        way = sql.SQL("DESC" if order == "desc" else "ASC")
        key = sql.Identifier(self.spec.id_column)
        if self.spec.created_column:
            return sql.SQL("{} {}, {} {}").format(self._created(), way, key, way)
        return sql.SQL("{} {}").format(key, way)

    def _where(self, scope: Scope) -> tuple[sql.Composable, list[Any]]:
        """SQL for what the table can answer exactly, and a wider test (or none) for what it cannot:
        `visible` re-checks everything with `matches` afterwards, so this may be a superset of the
        scope, never a subset."""
        clauses: list[sql.Composable] = []
        args: list[Any] = []
        if scope.ids is not None:
            clauses.append(sql.SQL("{}::text = ANY(%s)").format(sql.Identifier(self.spec.id_column)))
            args.append(_text(scope.ids))
        for name, expected in scope.where.items():
            if name not in self.spec.metadata_columns or name in RECORD_FIELDS:
                continue  # a record field (a column named `role` is metadata, but `where.role` is the field)
            test = _column_test(sql.Identifier(name), self._types.get(name, ""),
                                expected if isinstance(expected, list) else [expected])
            if test is not None:
                clauses.append(test[0])
                args += test[1]
        if self.spec.created_column:
            for bound, op in ((scope.after, ">"), (scope.before, "<")):
                if bound is not None:
                    clauses.append(sql.SQL("{} " + op + " %s::timestamptz").format(self._created()))
                    args.append(bound)
        elif (scope.after is not None and not EPOCH > scope.after) or (scope.before is not None
                                                                        and not EPOCH < scope.before):
            clauses.append(sql.SQL("FALSE"))  # every record shows the epoch
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
        query = sql.SQL("SELECT {} FROM {} WHERE {} ORDER BY {}").format(
            self._columns(with_embeddings), self._table(), where, self._order(order))
        if not limit:
            return visible([self._record(r) for r in await self._query(query, args)], scope)
        page = limit
        while True:  # the filter may be wider than the scope: read on until `limit` pass it, or the table ends
            rows = await self._query(query + sql.SQL(" LIMIT %s"), [*args, page])
            records = visible([self._record(r) for r in rows], scope)
            if len(records) >= limit or len(rows) < page:
                return records[:limit]
            page *= 4

    async def search(self, scope: Scope, *, text: str | None, vector: Sequence[float] | None, limit: int,
                     with_embeddings: bool = False) -> list[Record]:
        if scope.key_prefix is not None:
            return []
        where, args = self._where(scope)
        pool = max(limit * 4, 40)
        while True:  # as select: a list the exact check thins is read again, longer
            records, full = await self._ranked(where, args, text, vector, pool, with_embeddings)
            records = visible(records, scope)
            if len(records) >= limit or not full:
                return records[:limit]
            pool *= 4

    async def _ranked(self, where: sql.Composable, args: list[Any], text: str | None, vector: Sequence[float] | None,
                      pool: int, with_embeddings: bool) -> tuple[list[Record], bool]:
        """The first `pool` rows by text and by vector, fused; and whether either list was cut short."""
        rankings: list[list[str]] = []
        rows: dict[str, dict[str, Any]] = {}
        words = [w for w in _WORD.findall(text or "") if len(w) > 1][:32]
        if words:
            tsquery = " | ".join(words)
            document = sql.SQL("to_tsvector('english', coalesce({}, ''))").format(sql.Identifier(self.spec.text_column))
            query = sql.SQL("SELECT {} FROM {} WHERE {} AND {} @@ to_tsquery('english', %s) "
                            "ORDER BY ts_rank_cd({}, to_tsquery('english', %s)) DESC, {} LIMIT %s").format(
                self._columns(with_embeddings), self._table(), where, document, document,
                sql.Identifier(self.spec.id_column))
            found = await self._query(query, [*args, tsquery, tsquery, pool])
            rankings.append([row["a2m_id"] for row in found])
            rows |= {row["a2m_id"]: row for row in found}
        if vector is not None and self.spec.vector_column:
            query = sql.SQL("SELECT {} FROM {} WHERE {} ORDER BY {} <=> %s::vector, {} LIMIT %s").format(
                self._columns(with_embeddings), self._table(), where, sql.Identifier(self.spec.vector_column),
                sql.Identifier(self.spec.id_column))
            found = await self._query(query, [*args, str(list(vector)), pool])
            rankings.append([row["a2m_id"] for row in found])
            rows |= {row["a2m_id"]: row for row in found}
        full = any(len(ranking) == pool for ranking in rankings)
        return [self._record(rows[i]).with_(score=s) for i, s in fuse(rankings)], full

    async def count(self, owner: str | None) -> int:
        rows = await self._query(sql.SQL("SELECT count(*) AS n FROM {}").format(self._table()), ())
        return int(rows[0]["n"])

    async def dimensions(self) -> int | None:
        return self._dims
