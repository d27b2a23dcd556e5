"""Read an existing table as A2M records: rank by pgvector distance and full text, fused by rank.

The table is someone else's: nothing here creates, alters or writes it (its
connections are read-only sessions), and column names come from config, so they
are validated against the catalog at start (the table as the queries will name
it, each column's type, the role's right to read them) and quoted as
identifiers, never interpolated as text.

Reads are written so that the table's own indexes answer them: ids compared in
the key column's type, the created column ordered as itself (rows without a
time read apart), words as `to_tsvector(config, text_column)` in the
configuration of the GIN index found over it (or a generated tsvector column
of it), vectors by the distance of the HNSW/IVFFlat index on the column. What
no index answers reads every row, and start says so in the log.

Two options fit the layouts the common frameworks write: `metadata_column`
makes one json/jsonb object the metadata (LangChain's `cmetadata`, LlamaIndex's
`metadata_`), its keys tested by containment (what a jsonb GIN index answers),
and `row_filter` mounts the rows of one value of a column (one LangChain
collection of its shared table).
"""

from __future__ import annotations

import logging
import re
import uuid
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta, timezone
from typing import Any, Callable, Iterable, Literal, Mapping, Sequence

from psycopg import errors as pg_errors, sql
from psycopg.rows import dict_row
from psycopg.types.datetime import DateLoader, TimestampLoader, TimestamptzLoader

from a2m.filters import RECORD_FIELDS, Scope
from a2m.records import Record
from a2m.timefmt import format_ts, parse_ts

from backends.store import Position, StoreRejected, StoreUnavailable

from .common import EPOCH, ReadOnlyStore, fuse, json_safe, visible, visible_placed

_INFINITIES = (b"infinity", b"-infinity")
_Part = tuple[sql.Composable, list[Any]]  # a query's WHERE and ORDER BY, and its arguments
_Placed = tuple[Record, Position]  # a record read, with its place in the timeline (`timeline_page`)


# PostgreSQL's 'infinity' and '-infinity' (an open-ended validity column, say) have no Python value:
# psycopg refused the whole row ("timestamp too large"), so a table holding one failed every read
# that met it. Read as no time: a record without one shows the epoch, a metadata value is null.
class _NoInfinityDate(DateLoader):
    def load(self, data: Any) -> Any:
        return None if bytes(data) in _INFINITIES else super().load(data)


class _NoInfinityTimestamp(TimestampLoader):
    def load(self, data: Any) -> Any:
        return None if bytes(data) in _INFINITIES else super().load(data)


class _NoInfinityTimestamptz(TimestamptzLoader):
    def load(self, data: Any) -> Any:
        return None if bytes(data) in _INFINITIES else super().load(data)

_WORD = re.compile(r"\w+", re.UNICODE)
_INTEGER = re.compile(r"-?[0-9]+")
POOL_TIMEOUT_S = 3.0  # how long a read waits for a connection: under the router's 5 s tier timeout
DOWN_WAIT_S = 0.5  # ... and while PostgreSQL is known to be down
ID_SAMPLE = 10_000  # rows whose ids are checked at start (`_check_ids`)
# How long the check of every row's id may take at start where the catalog does not show a key (a view, a
# table without a unique index on the column): 0.2-1.1 s for 1,000,000 rows on the embedded PostgreSQL.
ID_CHECK_S = 2.0
CONNECT_TIMEOUT_S = 5
DEFAULT_TEXT_CONFIG = "english"  # text search configuration where no full-text index names one
_TIMES = {"timestamptz", "timestamp", "date"}
_VECTORS = {"vector", "halfvec"}
# A pgvector operator class (by its ending) -> the protocol's metric; each metric -> its distance operator.
_OPCLASSES = {"_cosine_ops": "cosine", "_l2_ops": "euclidean", "_ip_ops": "dot", "_l1_ops": "manhattan"}
_OPERATORS = {"cosine": "<=>", "euclidean": "<->", "dot": "<#>", "manhattan": "<+>"}
# What a read meets when the table, a column, the vector type or the role's grant went away after start.
_GONE = (pg_errors.UndefinedTable, pg_errors.UndefinedColumn, pg_errors.UndefinedObject,
         pg_errors.UndefinedFunction, pg_errors.InsufficientPrivilege)


@dataclass(slots=True)
class TableSpec:
    table: str
    id_column: str = "id"
    text_column: str = "content"
    vector_column: str | None = None
    created_column: str | None = None
    metadata_columns: list[str] = field(default_factory=list)
    # A json/jsonb column holding the metadata as one object (LangChain's `cmetadata`, LlamaIndex's
    # `metadata_`): records show its keys (only `metadata_keys` of them, when given) and `where` tests them.
    metadata_column: str | None = None
    metadata_keys: list[str] | None = None
    # (column, value): the mount holds only the rows whose column equals the value (one LangChain
    # collection of the shared table), compared in the column's own type.
    row_filter: tuple[str, str] | None = None

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> "TableSpec":
        if not options.get("table"):
            raise SystemExit("corpus: --option table=NAME is required")

        def names(key: str) -> list[str] | None:
            value = options.get(key)
            if value is None:
                return None
            listed = value if isinstance(value, list) else str(value).split(",")
            return [str(c).strip() for c in listed if str(c).strip()]

        def name(key: str, default: str | None) -> str | None:
            value = options.get(key) or default
            return None if value is None else str(value)

        keys = names("metadata_keys")
        if keys is not None and not options.get("metadata_column"):
            raise SystemExit("corpus: --option metadata_keys needs metadata_column (the json or jsonb column "
                             "whose keys it picks)")
        return cls(table=str(options["table"]), id_column=name("id_column", "id") or "id",
                   text_column=name("text_column", "content") or "content",
                   vector_column=name("vector_column", None), created_column=name("created_column", None),
                   metadata_columns=names("metadata_columns") or [], metadata_column=name("metadata_column", None),
                   metadata_keys=keys, row_filter=_row_filter(options.get("row_filter")))


def _row_filter(value: Any) -> tuple[str, str] | None:
    """`row_filter=COLUMN=VALUE` as (column, value); the value may itself hold `=`."""
    if value is None or value == "":
        return None
    column, equals, expected = str(value).partition("=")
    if not equals or not column.strip():
        raise SystemExit(f"corpus: --option row_filter must be COLUMN=VALUE (e.g. row_filter=collection_id=UUID); "
                         f"got {value!r}")
    return column.strip(), expected


def _key_test(column: sql.Identifier, kind: str, key: str, options: list[Any]) -> tuple[sql.Composable, list[Any]]:
    """SQL for `where[key]` (any of `options`) on a key of the json/jsonb object in `column`, at least as
    wide as `matches` on the metadata the record shows. Text and booleans by containment, the form
    LangChain's `jsonb_path_ops` GIN index answers (`{"k": v}`, or `{"k": [v]}` for a list holding it);
    null as a key that is absent or null (a row without an object shows none); numbers only by their
    JSON kind (JSON compares them exactly, a record shows them as floats). A json column is read as
    jsonb: correct, but no index answers it."""
    from psycopg.types.json import Jsonb

    document = column if kind == "jsonb" else sql.SQL("{}::jsonb").format(column)
    parts: list[sql.Composable] = []
    args: list[Any] = []
    for value in options:
        if value is None:
            parts.append(sql.SQL("coalesce({} -> %s, 'null'::jsonb) = 'null'::jsonb").format(document))
            args.append(key)
        elif isinstance(value, bool) or (isinstance(value, str) and "\x00" not in value):
            parts.append(sql.SQL("({} @> %s OR {} @> %s)").format(document, document))
            args += [Jsonb({key: value}), Jsonb({key: [value]})]
        elif _number(value):
            parts.append(sql.SQL("jsonb_typeof({} -> %s) IN ('number', 'array')").format(document))
            args.append(key)
    if not parts:
        return sql.SQL("FALSE"), []  # text holding NUL: no JSON text in PostgreSQL holds one
    return sql.SQL("({})").format(sql.SQL(" OR ").join(parts)), args


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0]


def _canonical_uuid(value: str) -> bool:
    try:
        return str(uuid.UUID(value)) == value
    except ValueError:
        return False


def _text(values: Iterable[str]) -> list[str]:
    """Values to compare with text columns, less those holding NUL: PostgreSQL refuses NUL in a
    parameter, and no text column holds one, so such a value matches nothing (as on every tier)."""
    return [v for v in values if "\x00" not in v]


_INTEGERS = {"int2", "int4", "int8"}
_FLOATS = {"float4", "float8"}
_TEXTS = {"text", "varchar", "name", "citext"}
_MS = timedelta(milliseconds=1)
_ORIGIN = datetime(1, 1, 1, tzinfo=timezone.utc)
_US = timedelta(microseconds=1)


def exact_time(moment: datetime | date | None) -> int:
    """A row's place within its millisecond, as a Position's int: the created column's exact time
    (PostgreSQL keeps microseconds) as microseconds since 0001-01-01, plus one; 0 for a row without a
    time (it shows the epoch and sorts after every row with one there). Years 1 to 9999 need 18 digits
    at most, which a cursor carries."""
    if not isinstance(moment, date):
        return 0
    return (_utc(moment) - _ORIGIN) // _US + 1


def _moment(exact: int) -> datetime:
    """The time `exact_time` was made from; a cursor naming none is refused."""
    try:
        return _ORIGIN + (exact - 1) * _US
    except OverflowError:
        raise StoreRejected("cursor names no time of this table") from None


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


def _quote(name: str) -> str:
    """An identifier as SQL writes it quoted (for `to_regclass`, which reads a name as a query would)."""
    return '"' + name.replace('"', '""') + '"'


def _tsvector_config(expression: str, column: str) -> str | None:
    """The text search configuration of `expression` when it is exactly `to_tsvector(config, column)` as
    PostgreSQL prints it back (an index key or a generated column's expression), else None."""
    match = re.fullmatch(r"\(?to_tsvector\('((?:[^']|'')+)'::regconfig, (?:\((.+)\)::text|(.+))\)\)?", expression)
    if match is None or (match.group(2) or match.group(3)) != column:
        return None
    return match.group(1).replace("''", "'")


def _floats(vector: Any) -> list[float]:
    """A vector as pgvector's loader gives it (its Vector or HalfVector without numpy, which is not
    iterable; an array with numpy) as floats."""
    return [float(x) for x in (vector.to_list() if hasattr(vector, "to_list") else vector)]


def _utc(moment: datetime | date) -> datetime:
    """A time as the moment it names: a `timestamp` (no zone) is UTC, as the connection reads it in
    SQL (its TimeZone is UTC), and a date is its midnight."""
    if not isinstance(moment, datetime):
        return datetime(moment.year, moment.month, moment.day, tzinfo=timezone.utc)
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=timezone.utc)


class TableStore(ReadOnlyStore):
    engine = "postgresql (read-only table)"

    def __init__(self, dsn: str, spec: TableSpec) -> None:
        self.dsn = dsn
        self.spec = spec
        self.searches_vectors = spec.vector_column is not None
        self.metric = "cosine"  # settled by open(): the distance of the vector column's index
        self._operator = "<=>"
        self._vector_type = "vector"
        self._vector_index: str | None = None  # hnsw or ivfflat, when the column has one
        self._pool: Any = None
        self._dims: int | None = None
        self._types: dict[str, str] = {}  # column -> its type's name in the catalog (a domain's base type)
        self._formats: dict[str, str] = {}  # column -> its type as SQL writes it (format_type)
        self._nullable: set[str] = set()
        # Text search: the configuration, and the tsvector column to search (None: to_tsvector of the text).
        self._text_config = DEFAULT_TEXT_CONFIG
        self._tsvector_column: str | None = None
        self._engine_down = False

    # ---- lifecycle -------------------------------------------------------------

    async def open(self) -> None:
        import psycopg
        from psycopg_pool import AsyncConnectionPool

        try:
            conn = await psycopg.AsyncConnection.connect(self.dsn, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S)
        except psycopg.Error as exc:
            raise SystemExit(f"corpus: cannot connect to PostgreSQL: {_first_line(exc)}") from None
        async with conn:
            await self._validate(conn)
        self._pool = AsyncConnectionPool(self.dsn, min_size=1, max_size=8, timeout=POOL_TIMEOUT_S, open=False,
                                         kwargs={"autocommit": True, "connect_timeout": CONNECT_TIMEOUT_S},
                                         configure=self._configure)
        await self._pool.open(wait=True, timeout=30)

    async def _configure(self, conn: Any) -> None:
        """Each pooled connection: vectors as lists, times read as UTC, nothing written even by mistake,
        and a filtered index search that reads on until it has its rows (pgvector 0.8's iterative scan;
        without it HNSW hands back its first 40 candidates, and a `where` holding 5% of the table left
        two of them)."""
        if self.spec.vector_column:
            from pgvector.psycopg import register_vector_async

            await register_vector_async(conn)
        await conn.execute("SET TIME ZONE 'UTC'")
        await conn.execute("SET default_transaction_read_only = on")
        for name, loader in (("date", _NoInfinityDate), ("timestamp", _NoInfinityTimestamp),
                             ("timestamptz", _NoInfinityTimestamptz)):
            conn.adapters.register_loader(name, loader)
        if self._vector_index:
            try:
                await conn.execute(sql.SQL("SET {} = relaxed_order").format(
                    sql.Identifier(self._vector_index, "iterative_scan")))
            except pg_errors.Error:  # pgvector before 0.8: no iterative scan (logged at start)
                pass

    async def _validate(self, conn: Any) -> None:
        """Refuse at start, naming it, anything about the table this mount could not read: a table
        not found as the queries will name it, a column that is missing or of a type the mount cannot
        use, a table the role may not read. Then settle how recall ranks (the indexes it can use)."""
        import psycopg

        spec = self.spec
        try:
            row = await (await conn.execute("SELECT to_regclass(%s)::oid",
                                            (".".join(map(_quote, spec.table.split("."))),))).fetchone()
        except psycopg.Error as exc:
            raise SystemExit(f"corpus: table {spec.table!r}: {_first_line(exc)}") from None
        if row[0] is None:
            raise SystemExit(await self._not_found(conn))
        oid = row[0]
        rows = await (await conn.execute(
            "SELECT a.attnum, a.attname, coalesce(b.typname, t.typname), coalesce(b.typcategory, t.typcategory),"
            " a.attnotnull, a.atttypmod, format_type(a.atttypid, a.atttypmod), a.attgenerated,"
            " pg_get_expr(d.adbin, d.adrelid)"
            " FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid"
            " LEFT JOIN pg_type b ON t.typtype = 'd' AND b.oid = t.typbasetype"
            " LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum"
            " WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum", (oid,))).fetchall()
        columns = {r[1]: r for r in rows}
        self._types = {name: r[2] for name, r in columns.items()}
        self._formats = {name: r[6] for name, r in columns.items()}
        self._nullable = {name for name, r in columns.items() if not r[4]}
        wanted = [spec.id_column, spec.text_column, *spec.metadata_columns]
        wanted += [c for c in (spec.vector_column, spec.created_column, spec.metadata_column) if c]
        wanted += [spec.row_filter[0]] if spec.row_filter else []
        missing = [c for c in wanted if c not in columns]
        if missing:
            raise SystemExit(f"corpus: table {spec.table!r} has no column(s) {missing}; it has {sorted(columns)}")

        def refuse(option: str, needs: str) -> SystemExit:
            name = getattr(spec, option)
            return SystemExit(f"corpus: {option} {name!r} of table {spec.table!r} is {columns[name][6]}; {needs}")

        if columns[spec.text_column][3] != "S":
            raise refuse("text_column", "the content must be a text column (text, varchar, char)")
        if spec.created_column and columns[spec.created_column][2] not in _TIMES:
            raise refuse("created_column", "it must be a timestamptz, timestamp or date column")
        if spec.metadata_column and columns[spec.metadata_column][2] not in ("json", "jsonb"):
            raise refuse("metadata_column", "it must be a json or jsonb column holding an object")
        if spec.vector_column:
            kind, width = columns[spec.vector_column][2], columns[spec.vector_column][5]
            if kind not in _VECTORS:
                raise refuse("vector_column", "it must be a pgvector column: vector(N) or halfvec(N)")
            self._vector_type = kind
            self._dims = width if width > 0 else None  # vector(N) says N even before a row holds one
        try:  # the role may read every column the mount reads (and the reads are well formed)
            await conn.execute(sql.SQL("SELECT {} FROM {} LIMIT 0").format(self._columns(True), self._table()))
        except psycopg.Error as exc:
            raise SystemExit(f"corpus: cannot read table {spec.table!r}: {_first_line(exc)}") from None
        if spec.row_filter:
            await self._check_row_filter(conn, columns[spec.row_filter[0]][6])
        await self._check_ids(conn, oid)
        if spec.vector_column and self._dims is None:  # vector without a width: the first row's
            mounted, args = self._rows()
            row = await (await conn.execute(sql.SQL("SELECT vector_dims({}) FROM {} WHERE {} LIMIT 1").format(
                sql.Identifier(spec.vector_column), self._table(), sql.SQL(" AND ").join(
                    [*mounted, sql.SQL("{} IS NOT NULL").format(sql.Identifier(spec.vector_column))])),
                args)).fetchone()
            self._dims = row[0] if row else None
        await self._settle_indexes(conn, oid, columns)

    async def _check_row_filter(self, conn: Any, kind: str) -> None:
        """Refuse a row filter whose value the column's type cannot hold, or that holds no row of a table
        that has some (a collection's id mistyped would mount a corpus that answers nothing), naming a few
        values the column does hold."""
        import psycopg

        column, value = self.spec.row_filter or ("", "")
        test, args = self._rows()
        try:
            row = await (await conn.execute(sql.SQL("SELECT EXISTS (SELECT 1 FROM {} WHERE {}), EXISTS (SELECT 1 FROM {})")
                                            .format(self._table(), test[0], self._table()), args)).fetchone()
        except psycopg.Error as exc:
            raise SystemExit(f"corpus: row_filter: {value!r} is not a value of {column} ({kind}): "
                             f"{_first_line(exc)}") from None
        if row[1] and not row[0]:
            held = await (await conn.execute(sql.SQL(
                "SELECT DISTINCT v::text FROM (SELECT {} AS v FROM {} LIMIT 1000) s ORDER BY 1 LIMIT 5").format(
                    sql.Identifier(column), self._table()))).fetchall()
            raise SystemExit(f"corpus: row_filter: no row of table {self.spec.table!r} has {column} = {value!r}; "
                             f"it holds e.g. {', '.join(str(r[0]) for r in held)}")

    async def _check_ids(self, conn: Any, oid: int) -> None:
        """Refuse an `id_column` that is not a key of the rows mounted: one holding NULL (a record with
        no id, which the wire cannot carry) or a value shared by several rows (records that share an id
        read as one: a get answers several, a timeline walk's keyset skips the others). Both mounted
        and answered. A primary key or unique index on exactly that column, NOT NULL, is one: nothing
        is read. Otherwise (a view, a table without one) the first ID_SAMPLE rows are read, which finds
        the usual mistake (a chunk table's document column, whose chunks lie together) at the same
        cost on any table; then every row, where that takes under ID_CHECK_S (said in the log where
        it does not)."""
        import psycopg

        spec = self.spec
        if spec.id_column not in self._nullable and await self._unique_in_catalog(conn, oid):
            return
        mounted, args = self._rows()
        where = sql.SQL(" AND ").join([*mounted, sql.SQL("TRUE")])
        column = sql.Identifier(spec.id_column)
        row = await (await conn.execute(sql.SQL(
            "WITH s AS (SELECT {}::text AS v FROM {} WHERE {} LIMIT {}) SELECT count(*) FILTER (WHERE v IS NULL),"
            " (SELECT v FROM s WHERE v IS NOT NULL GROUP BY v HAVING count(*) > 1 ORDER BY v LIMIT 1), count(*)"
            " FROM s").format(column, self._table(), where, sql.Literal(ID_SAMPLE)), args)).fetchone()
        if not row[0] and row[1] is None and row[2] >= ID_SAMPLE:  # the sample was not every row mounted
            try:
                async with conn.transaction():
                    await conn.execute(sql.SQL("SET LOCAL statement_timeout = {}").format(
                        sql.Literal(int(ID_CHECK_S * 1000))))
                    row = await self._every_id(conn, where, args)
            except psycopg.errors.QueryCanceled:
                logging.getLogger("a2m.corpus").warning(
                    "id_column %r of %r: no primary key or unique index on it alone (NOT NULL) says each row has "
                    "one value of its own, and reading every row's took over %g s at start: only the first %d "
                    "were checked; a value repeated further on reads as one record (a unique index on it makes "
                    "the check free)", spec.id_column, spec.table, ID_CHECK_S, ID_SAMPLE)
                return
        if not row[0] and row[1] is None:
            return
        keys = [r[0] for r in await (await conn.execute(
            "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid"
            " AND a.attnum = ANY(i.indkey) WHERE i.indrelid = %s AND i.indisprimary", (oid,))).fetchall()]
        hint = (f": name its key, --option id_column={keys[0]}" if len(keys) == 1 and keys[0] != spec.id_column
                else ": name a column holding one value per row (or mount a view with one)")
        what = f"holds NULL in {row[0]} row(s)" if row[0] else f"holds {row[1]!r} in several rows"
        raise SystemExit(f"corpus: id_column {spec.id_column!r} of table {spec.table!r} is not a key: it {what}, "
                         f"and each record needs an id of its own{hint}")

    async def _unique_in_catalog(self, conn: Any, oid: int) -> bool:
        """Whether a valid primary key or unique index of the table covers `id_column` alone (no
        expression, no predicate; INCLUDE columns aside). A view has none."""
        row = await (await conn.execute(
            "SELECT EXISTS (SELECT 1 FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid"
            " AND a.attnum = i.indkey[0] WHERE i.indrelid = %s AND i.indisunique AND i.indisvalid"
            " AND i.indnkeyatts = 1 AND i.indexprs IS NULL AND i.indpred IS NULL AND a.attname = %s)",
            (oid, self.spec.id_column))).fetchone()
        return bool(row[0])

    async def _every_id(self, conn: Any, where: sql.Composable, args: list[Any]) -> tuple[int, str | None]:
        """(rows mounted whose id is NULL, a value several of them share or None), every row read once:
        NULL ids make one group of their own, put first. Grouped in the column's own type, as the reads
        compare ids (and 2.7 times as fast for bigint as by text), or by text for a type without
        equality."""
        import psycopg

        column = sql.Identifier(self.spec.id_column)
        for grouped in (column, sql.SQL("{}::text").format(column)):
            try:
                async with conn.transaction():  # a failed attempt leaves the outer transaction usable
                    row = await (await conn.execute(sql.SQL(
                        "SELECT {} IS NULL, {}::text, count(*) FROM {} WHERE {} GROUP BY {}"
                        " HAVING count(*) > 1 OR {} IS NULL ORDER BY 1 DESC LIMIT 1").format(
                            grouped, grouped, self._table(), where, grouped, grouped), args)).fetchone()
                if row is None:
                    return 0, None
                return (int(row[2]), None) if row[0] else (0, row[1])
            except psycopg.errors.UndefinedFunction:  # no equality for the type (json, point): by text
                continue
        return 0, None

    def _rows(self) -> tuple[list[sql.Composable], list[Any]]:
        """The rows the mount holds: those the row filter names (its value read as the column's type, so
        that an index on the column answers), or all of them."""
        if self.spec.row_filter is None:
            return [], []
        column, value = self.spec.row_filter
        return [sql.SQL("{} = %s").format(sql.Identifier(column))], [value]

    async def _not_found(self, conn: Any) -> str:
        """Why `table` was not found, with the tables of that name the role could mean: in a schema
        not on the search_path (which the queries would not find either), or spelt in other case."""
        name = self.spec.table.rpartition(".")[2]
        near = [r[0] for r in await (await conn.execute(
            "SELECT n.nspname || '.' || c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE lower(c.relname) = lower(%s) AND c.relkind IN ('r', 'p', 'v', 'm', 'f')"
            " AND n.nspname NOT IN ('pg_catalog', 'information_schema') ORDER BY 1", (name,))).fetchall()]
        path = (await (await conn.execute("SHOW search_path")).fetchone())[0]
        message = f"corpus: table {self.spec.table!r} not found (search_path: {path})"
        if near:
            message += f"; there is {', '.join(near)}: name it with its schema, --option table={near[0]}"
        return message

    async def _settle_indexes(self, conn: Any, oid: int, columns: Mapping[str, Any]) -> None:
        """Rank the way the table's own indexes can answer: vectors by the distance of the column's
        HNSW or IVFFlat index (cosine when there is none, or one of each), words with the text search
        configuration of a GIN index over `to_tsvector(config, text_column)` or over a generated
        tsvector column of it ('english' when there is none). A recall the indexes cannot answer reads
        every row: said at start, once."""
        spec = self.spec
        text_sql = (await (await conn.execute("SELECT quote_ident(%s)", (spec.text_column,))).fetchone())[0]
        indexes = await (await conn.execute(
            "SELECT am.amname, i.indkey::int2[], pg_get_indexdef(i.indexrelid),"
            " array(SELECT o.opcname FROM unnest(i.indclass::oid[]) WITH ORDINALITY u(oid, n)"
            "       JOIN pg_opclass o ON o.oid = u.oid ORDER BY u.n)"
            " FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_am am ON am.oid = c.relam"
            " WHERE i.indrelid = %s AND i.indisvalid AND i.indpred IS NULL ORDER BY c.relname", (oid,))).fetchall()
        log = logging.getLogger("a2m.corpus")
        kind = (await (await conn.execute("SELECT relkind FROM pg_class WHERE oid = %s", (oid,))).fetchone())[0]
        if spec.row_filter and kind != "v" and not any(
                keys and keys[0] == columns[spec.row_filter[0]][0] for _, keys, _, _ in indexes):
            log.warning("the timeline and count of %r read the rows of every %s: no index starts with it (e.g. "
                        "CREATE INDEX ON %s (%s)); a vector recall tests it inside the vector index's scan",
                        spec.table, spec.row_filter[0], spec.table, spec.row_filter[0])
        if kind == "v":  # a view has no indexes of its own: those of the tables beneath it answer, if they can
            if spec.vector_column:
                self._vector_index = "hnsw"  # the likelier index beneath: its filtered scans read on
            log.warning("%r is a view: text recall reads it as to_tsvector('%s', %s) and vector recall by cosine "
                        "distance; the tables beneath it answer from an index only one built on exactly that",
                        spec.table, DEFAULT_TEXT_CONFIG, text_sql)
            return
        if spec.vector_column:
            number = columns[spec.vector_column][0]
            found = {}
            for method, keys, _, opclasses in indexes:
                metric = next((m for suffix, m in _OPCLASSES.items() if opclasses and opclasses[0].endswith(suffix)), None)
                if method in ("hnsw", "ivfflat") and keys == [number] and metric:
                    found.setdefault(metric, method)
            if found:
                self.metric = "cosine" if "cosine" in found else next(iter(found))
                self._vector_index = found[self.metric]
                await self._check_iterative_scan(conn, log)
            else:
                log.warning("vector recall reads every row of %r: it has no HNSW or IVFFlat index on %r (e.g. "
                            "CREATE INDEX ON %s USING hnsw (%s vector_cosine_ops))", spec.table, spec.vector_column,
                            spec.table, spec.vector_column)
            self._operator = _OPERATORS[self.metric]
        for name, column in columns.items():  # a generated tsvector column of the text, with an index
            config = _tsvector_config(column[8] or "", text_sql) if column[7] == "s" and column[2] == "tsvector" else None
            if config and any(keys == [column[0]] and method in ("gin", "gist") for method, keys, _, _ in indexes):
                self._text_config, self._tsvector_column = config, name
                return
        for method, keys, definition, _ in indexes:
            key = re.search(r" USING gin \((.*)\)$", definition)
            config = _tsvector_config(key.group(1), text_sql) if method == "gin" and keys == [0] and key else None
            if config:
                self._text_config = config
                return
        log.warning("text recall reads every row of %r: it has no full-text index on %r (e.g. CREATE INDEX ON %s "
                    "USING gin (to_tsvector('english', %s)))", spec.table, spec.text_column, spec.table, text_sql)

    async def _check_iterative_scan(self, conn: Any, log: logging.Logger) -> None:
        try:
            await conn.execute(sql.SQL("SET {} = relaxed_order").format(
                sql.Identifier(self._vector_index or "", "iterative_scan")))
        except pg_errors.Error:
            log.warning("a vector recall with `where` may come back short: pgvector before 0.8 stops a filtered "
                        "%s scan at its first candidates (upgrade pgvector for iterative scans)", self._vector_index)

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    async def ping(self) -> None:
        """Ready while the table answers as mounted (not merely the server): a dropped or renamed table
        is not, nor one that lost a column a read names (every read would fail). `LIMIT 0` reads no row."""
        where, args = self._rows()
        columns = [self._columns(with_embeddings=True)]
        columns += [sql.Identifier(self._tsvector_column)] if self._tsvector_column else []  # text recall's
        query = sql.SQL("SELECT {} FROM {}").format(sql.SQL(", ").join(columns), self._table())
        if where:
            query = sql.SQL("{} WHERE {}").format(query, sql.SQL(" AND ").join(where))
        await self._query(sql.SQL("{} LIMIT 0").format(query), args)

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
        if spec.metadata_column:
            cols.append(sql.SQL("{} AS a2m_metadata").format(sql.Identifier(spec.metadata_column)))
        cols += [sql.Identifier(c) for c in spec.metadata_columns]
        return sql.SQL(", ").join(cols)

    def _record(self, row: dict[str, Any]) -> Record:
        created = row.get("a2m_created")
        vector = row.get("a2m_vector")
        return Record(
            id=row["a2m_id"], content=row["a2m_content"] or "",
            created_at=format_ts(_utc(created)) if isinstance(created, date) else EPOCH,
            metadata={**self._object(row.get("a2m_metadata")),
                      **{c: json_safe(row[c]) for c in self.spec.metadata_columns}},
            embedding=None if vector is None else _floats(vector),
        )

    def _object(self, value: Any) -> dict[str, Any]:
        """The metadata a `metadata_column` value gives: its keys (`metadata_keys` of them), or none when
        it holds no object (SQL or JSON null, an array)."""
        if not isinstance(value, dict):
            return {}
        keys = self.spec.metadata_keys
        return json_safe(value if keys is None else {k: value[k] for k in keys if k in value})

    def _shows_key(self, name: str) -> bool:
        """Whether `where[name]` names a key of the metadata column that records show (a metadata column
        of the same name is shown instead, and a record field is the field)."""
        if not self.spec.metadata_column or name in RECORD_FIELDS or name in self.spec.metadata_columns:
            return False
        return self.spec.metadata_keys is None or name in self.spec.metadata_keys

    def _ids(self, ids: Sequence[str]) -> tuple[sql.Composable, list[Any]]:
        """`id_column` is one of `ids`, compared in the column's own type so that its index (the
        primary key, usually) answers; `column::text = ANY(...)` read the whole table for each. Only
        the spelling a record shows names it: `05`, `5.0` or an upper-case UUID name no record."""
        column = sql.Identifier(self.spec.id_column)
        kind = self._types.get(self.spec.id_column, "")
        if kind in _INTEGERS:
            whole = [int(v) for v in ids if _INTEGER.fullmatch(v) and str(int(v)) == v and -2**63 <= int(v) < 2**63]
            return sql.SQL("{} = ANY(%s::int8[])").format(column), [whole]
        if kind == "uuid":
            return sql.SQL("{} = ANY(%s::uuid[])").format(column), [[v for v in ids if _canonical_uuid(v)]]
        if kind in ("text", "varchar"):
            return sql.SQL("{} = ANY(%s::text[])").format(column), [_text(ids)]
        return sql.SQL("{}::text = ANY(%s)").format(column), [_text(ids)]

    def _where(self, scope: Scope) -> tuple[list[sql.Composable], list[Any]]:
        """SQL for what the table can answer exactly of the scope, less its time range, and a wider test
        (or none) for what it cannot: `visible` re-checks everything with `matches` afterwards, so this
        may be a superset of the scope, never a subset."""
        clauses, args = self._rows()
        named = scope.named_ids()
        if named is not None:
            clause, values = self._ids(named)
            clauses.append(clause)
            args += values
        for name, expected in scope.where.items():
            options = expected if isinstance(expected, list) else [expected]
            if self._shows_key(name):
                column = self.spec.metadata_column or ""
                test = _key_test(sql.Identifier(column), self._types.get(column, ""), name, options)
            elif name in RECORD_FIELDS:
                continue  # a record field (a column named `role` is metadata, but `where.role` is the field)
            elif name not in self.spec.metadata_columns:  # a key no record shows: only null matches it
                if None not in options:  # (was read through to the end, every row refused by the exact check)
                    clauses.append(sql.SQL("FALSE"))
                continue
            else:
                test = _column_test(sql.Identifier(name), self._types.get(name, ""), options)
            if test is not None:
                clauses.append(test[0])
                args += test[1]
        return clauses, args

    def _timed(self, scope: Scope) -> tuple[list[sql.Composable], list[Any]]:
        """The rows with a time, within the scope's range (the created column compared as itself, so
        that an index on it answers)."""
        column = sql.Identifier(self.spec.created_column or "")
        clauses: list[sql.Composable] = [sql.SQL("{} IS NOT NULL").format(column)]
        args: list[Any] = []
        for bound, op in ((scope.after, ">"), (scope.before, "<")):
            if bound is not None:
                clauses.append(sql.SQL("{} " + op + " %s::timestamptz").format(column))
                args.append(bound)
        return clauses, args

    def _untimed(self, scope: Scope) -> bool:
        """Whether the scope's range holds the rows without a time: they show the epoch."""
        return (scope.after is None or scope.after < EPOCH) and (scope.before is None or EPOCH < scope.before)

    def _in_range(self, scope: Scope) -> tuple[list[sql.Composable], list[Any]]:
        """The scope's time range as one test, for a ranked read (no order to keep)."""
        if not self.spec.created_column:
            return ([], []) if self._untimed(scope) else ([sql.SQL("FALSE")], [])
        if scope.after is None and scope.before is None:
            return [], []
        timed, args = self._timed(scope)
        test = sql.SQL("({})").format(sql.SQL(" AND ").join(timed))
        if self._untimed(scope) and self.spec.created_column in self._nullable:
            test = sql.SQL("({} IS NULL OR {})").format(sql.Identifier(self.spec.created_column), test)
        return [test], args

    async def _query(self, query: sql.Composable, args: Sequence[Any]) -> list[dict[str, Any]]:
        import psycopg
        from psycopg_pool import PoolClosed, PoolTimeout

        if self._pool is None:
            raise StoreUnavailable("corpus store is not open")
        attempts = self._pool.max_size + 1
        for attempt in range(attempts):
            conn: Any = None
            # While PostgreSQL is known to be down, waiting the pool's whole timeout for the reconnect
            # loop only delays the answer (and holds up the router's fan-out).
            wait = DOWN_WAIT_S if self._engine_down else None
            try:
                async with self._pool.connection(timeout=wait) as conn:
                    cursor = conn.cursor(row_factory=dict_row)
                    await cursor.execute(query, args)
                    rows = await cursor.fetchall() if cursor.description else []
                self._engine_down = False
                return rows
            except (PoolTimeout, PoolClosed) as exc:
                self._engine_down = True
                raise StoreUnavailable(f"PostgreSQL is unavailable: {_first_line(exc)}") from exc
            except psycopg.OperationalError as exc:
                if conn is not None and conn.broken:  # PostgreSQL restarted or went away: try a fresh connection
                    self._engine_down = True
                    if attempt + 1 < attempts:
                        continue
                raise StoreUnavailable(f"PostgreSQL is unavailable: {_first_line(exc)}") from exc
            except _GONE as exc:  # the table, a column or the role's grant changed since start
                raise StoreUnavailable(f"table {self.spec.table!r} no longer reads as mounted: "
                                       f"{_first_line(exc)}") from exc
            except psycopg.DataError as exc:
                raise StoreRejected(_first_line(exc)) from exc
        raise StoreUnavailable("PostgreSQL is unavailable")  # pragma: no cover - the loop returns or raises

    # ---- reads -----------------------------------------------------------------

    async def get(self, owner: str | None, ids: Sequence[str], *, with_embeddings: bool = False) -> list[Record]:
        if not ids:
            return []
        clause, args = self._ids(ids)
        mounted, held = self._rows()
        rows = await self._query(sql.SQL("SELECT {} FROM {} WHERE {}").format(
            self._columns(with_embeddings), self._table(), sql.SQL(" AND ").join([clause, *mounted])), args + held)
        return [self._record(r) for r in rows]

    async def select(self, scope: Scope, *, order: Literal["asc", "desc"] = "asc", limit: int | None = None,
                     with_embeddings: bool = False) -> list[Record]:
        """Rows in creation order: those with a time in the created column's order (its index answers
        that), and those without one, which show and sort as the epoch, in id order; the two merged."""
        if scope.key_prefix is not None:
            return []
        way = sql.SQL("DESC" if order == "desc" else "ASC")
        key = sql.Identifier(self.spec.id_column)
        where, args = self._where(scope)
        parts: list[_Part] = []
        if self.spec.created_column:
            timed, bounds = self._timed(scope)
            parts.append((sql.SQL("WHERE {} ORDER BY {} {}, {} {}").format(
                sql.SQL(" AND ").join(where + timed), sql.Identifier(self.spec.created_column), way, key, way),
                args + bounds))
        if self._untimed(scope) and (not self.spec.created_column or self.spec.created_column in self._nullable):
            untimed = [sql.SQL("{} IS NULL").format(sql.Identifier(self.spec.created_column))] \
                if self.spec.created_column else []
            parts.append((sql.SQL("WHERE {} ORDER BY {} {}").format(
                sql.SQL(" AND ").join(where + untimed or [sql.SQL("TRUE")]), key, way), args))
        # Stable: rows of one shown time keep the lists' order (those with a time, then those without).
        placed = await self._read_merged(scope, parts, key=lambda p: p[0].created_at, descending=order == "desc",
                                         limit=limit, with_embeddings=with_embeddings)
        return [r for r, _ in placed]

    async def timeline_page(self, scope: Scope, *, below: Position | None, limit: int | None,
                            with_embeddings: bool = False) -> list[tuple[Record, Position]]:
        """The newest `limit` records in scope strictly before `below`, in `select(order="desc")`'s
        order, each with its position (docs/extensions.md, the cursor on memory/timeline).

        The order is select's: rows with a time by the created column itself, then the key column,
        both descending; rows without one (they show the epoch) after every row with a time there,
        by key. A position keeps the row's exact time (`exact_time`), so the keyset compares the
        column with the time it holds, not with the millisecond a record shows: the condition
        `col <= T AND (col < T OR key < K)` is a range on the column, which its own index answers in
        order, and the key breaks ties in the key column's own type. Truncating both sides to the
        millisecond would be exact too, but no index on the column answers `date_trunc` of it."""
        if scope.key_prefix is not None:
            return []
        where, args = self._where(scope)
        # Stable: ties of (shown time, exact time) are rows of one list, already in key order.
        return await self._read_merged(scope, self._below(scope, where, args, below), key=lambda p: p[1][:2],
                                       descending=True, limit=limit, with_embeddings=with_embeddings,
                                       past=lambda position: self._below(scope, where, args, position))

    async def _read_merged(self, scope: Scope, parts: list[_Part], *, key: Callable[[_Placed], Any],
                           descending: bool, limit: int | None, with_embeddings: bool,
                           past: Callable[[Position], list[_Part]] | None = None) -> list[_Placed]:
        """The first `limit` records in scope that `parts` hold (queries, each in the answer's order),
        merged by `key` (`descending`), each with its position; every one of them where `limit` is None.

        Each part is read `limit` rows long, the merged list is cut where a full part ends, and the
        exact check thins what is left (a filter wider than the scope). Until `limit` pass or every
        part has ended, the parts are read again four times as far: on from the last row merged where
        `past` gives the parts after a position (what passed is kept), else from the start."""
        found: list[_Placed] = []
        page = limit
        while True:
            lists = []
            for tail, values in parts:
                query = sql.SQL("SELECT {} FROM {} {}").format(self._columns(with_embeddings), self._table(), tail)
                if page:
                    query += sql.SQL(" LIMIT {}").format(sql.Literal(page))
                lists.append([self._placed(r) for r in await self._query(query, values)])
            merged = sorted((p for rows in lists for p in rows), key=key, reverse=descending)
            cut = len(merged)
            for rows in lists:  # past a list's last row, rows of that list not read yet may come first
                if page and len(rows) == page:
                    cut = min(cut, next(n for n, p in enumerate(merged) if p is rows[-1]) + 1)
            passed = visible_placed(merged[:cut], scope)
            found = found + passed if past else passed
            if not page or (limit and len(found) >= limit) or all(len(rows) < page for rows in lists):
                return found[:limit] if limit else found
            if past:
                parts = past(merged[cut - 1][1])
            page *= 4

    def _placed(self, row: dict[str, Any]) -> _Placed:
        record = self._record(row)
        return record, (record.created_at, exact_time(row.get("a2m_created")), record.id)

    def _below(self, scope: Scope, where: list[sql.Composable], args: list[Any],
               below: Position | None) -> list[_Part]:
        """select's two parts (rows with a time, rows without), each cut to the rows strictly before
        `below` and ordered newest first."""
        key = sql.Identifier(self.spec.id_column)
        parts: list[_Part] = []
        if self.spec.created_column:
            column = sql.Identifier(self.spec.created_column)
            timed, bounds = self._timed(scope)
            if below is not None and below[1] > 0:  # a row with a time: before it in time, or by key
                clause, value = self._key_below(below[2])
                moment = _moment(below[1])
                timed = timed + [sql.SQL("{} <= %s AND ({} < %s OR {})").format(column, column, clause)]
                bounds = bounds + [moment, moment, value]
            elif below is not None:  # a row without one: the rows with a time that show an earlier one
                timed = timed + [sql.SQL("{} < %s::timestamptz").format(column)]
                bounds = bounds + [parse_ts(below[0])]
            parts.append((sql.SQL("WHERE {} ORDER BY {} DESC, {} DESC").format(
                sql.SQL(" AND ").join(where + timed), column, key), args + bounds))
        if self._untimed(scope) and (not self.spec.created_column or self.spec.created_column in self._nullable):
            untimed = [sql.SQL("{} IS NULL").format(sql.Identifier(self.spec.created_column))] \
                if self.spec.created_column else []
            values = list(args)
            if below is not None and (below[0], below[1]) == (EPOCH, 0):
                clause, value = self._key_below(below[2])
                untimed.append(clause)
                values.append(value)
            if below is None or (below[0], below[1]) >= (EPOCH, 0):
                parts.append((sql.SQL("WHERE {} ORDER BY {} DESC").format(
                    sql.SQL(" AND ").join(where + untimed or [sql.SQL("TRUE")]), key), values))
        return parts

    def _key_below(self, record_id: str) -> tuple[sql.Composable, Any]:
        """`id_column` before the row `record_id` names in its own order: compared in the column's own
        type (as `_ids` does), so that its index answers and 9 sorts before 10."""
        column = sql.Identifier(self.spec.id_column)
        kind = self._types.get(self.spec.id_column, "")
        if kind in _INTEGERS:
            if not (_INTEGER.fullmatch(record_id) and -2**63 <= int(record_id) < 2**63):
                raise StoreRejected("cursor names no row of this table")
            return sql.SQL("{} < %s::int8").format(column), int(record_id)
        if kind == "uuid":
            if not _canonical_uuid(record_id):
                raise StoreRejected("cursor names no row of this table")
            return sql.SQL("{} < %s::uuid").format(column), record_id
        if kind in ("text", "varchar"):
            return sql.SQL("{} < %s::text").format(column), record_id
        # Any other type: the id is the column's text, read back as the column's own type.
        return sql.SQL("{} < CAST(%s AS {})").format(column, sql.SQL(self._formats[self.spec.id_column])), record_id

    async def search(self, scope: Scope, *, text: str | None, vector: Sequence[float] | None, limit: int,
                     with_embeddings: bool = False) -> list[Record]:
        if scope.key_prefix is not None:
            return []
        where, args = self._where(scope)
        timed, bounds = self._in_range(scope)
        where, args = where + timed, args + bounds
        pool = max(limit * 4, 40)
        while True:  # as select: a list the exact check thins is read again, longer
            records, full = await self._ranked(where, args, text, vector, pool, with_embeddings)
            records = visible(records, scope)
            if len(records) >= limit or not full:
                return records[:limit]
            pool *= 4

    async def _ranked(self, where: list[sql.Composable], args: list[Any], text: str | None,
                      vector: Sequence[float] | None, pool: int, with_embeddings: bool) -> tuple[list[Record], bool]:
        """The first `pool` rows by text and by vector, fused; and whether either list was cut short."""
        rankings: list[list[str]] = []
        rows: dict[str, dict[str, Any]] = {}
        key = sql.Identifier(self.spec.id_column)
        words = [w for w in _WORD.findall(text or "") if len(w) > 1][:32]
        if words:
            tsquery = " | ".join(words)
            config = sql.Literal(self._text_config)
            # As the index was made (to_tsvector(config, column), no coalesce): else it is never used.
            document = (sql.Identifier(self._tsvector_column) if self._tsvector_column else
                        sql.SQL("to_tsvector({}, {})").format(config, sql.Identifier(self.spec.text_column)))
            matched = sql.SQL("{} @@ to_tsquery({}, %s)").format(document, config)
            query = sql.SQL("SELECT {} FROM {} WHERE {} ORDER BY ts_rank_cd({}, to_tsquery({}, %s)) DESC, {} "
                            "LIMIT %s").format(self._columns(with_embeddings), self._table(),
                                               sql.SQL(" AND ").join(where + [matched]), document, config, key)
            found = await self._query(query, [*args, tsquery, tsquery, pool])
            rankings.append([row["a2m_id"] for row in found])
            rows |= {row["a2m_id"]: row for row in found}
        if vector is not None and self.spec.vector_column:
            column = sql.Identifier(self.spec.vector_column)
            # A row without a vector is no vector match (an index holds none of them either).
            has = sql.SQL("{} IS NOT NULL").format(column)
            query = sql.SQL("SELECT {}, {} {} %s::{} AS a2m_distance FROM {} WHERE {} ORDER BY a2m_distance, {} "
                            "LIMIT %s").format(self._columns(with_embeddings), column, sql.SQL(self._operator),
                                               sql.Identifier(self._vector_type), self._table(),
                                               sql.SQL(" AND ").join(where + [has]), key)
            found = await self._query(query, [str(list(vector)), *args, pool])  # the distance is selected first
            found.sort(key=lambda row: row["a2m_distance"])  # an iterative index scan may hand them back loosely
            rankings.append([row["a2m_id"] for row in found])
            rows |= {row["a2m_id"]: row for row in found}
        full = any(len(ranking) == pool for ranking in rankings)
        return [self._record(rows[i]).with_(score=s) for i, s in fuse(rankings)], full

    async def count(self, owner: str | None) -> int:
        mounted, args = self._rows()
        rows = await self._query(sql.SQL("SELECT count(*) AS n FROM {} WHERE {}").format(
            self._table(), sql.SQL(" AND ").join(mounted or [sql.SQL("TRUE")])), args)
        return int(rows[0]["n"])

    async def dimensions(self) -> int | None:
        return self._dims
