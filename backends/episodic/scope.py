"""A Scope as the WHERE clause of a statement over `records`.

The scope is the WHERE clause of *every* scan, never a filter applied after
it: with `iterative_scan` pgvector walks the HNSW graph until `limit` rows pass
it, and for a selective scope the planner may use the b-tree instead.
`scope_sql` keeps the meaning of `a2m.filters.matches` (decision 39: `where`
on a record field tests the field), writes a one-value `where` as `=` so a
prepared plan can serve it (decision 20), and keeps NUL away from PostgreSQL,
which refuses it as a parameter (no record holds one).
"""

from __future__ import annotations

from typing import Any, Sequence

from psycopg.types.json import Jsonb

from a2m.errors import A2MError
from a2m.filters import RECORD_FIELDS, Scope
from a2m.timefmt import normalize_ts

from .rows import dumps

# How a `where` on a record field compares: the column's type decides which option values can match
# (a string never equals a number, as in `a2m.filters.matches`).
_FIELD_KINDS = {
    "id": "text", "content": "text", "role": "text", "group": "text", "tier": "text", "owner": "text",
    "session": "text", "key": "text", "uri": "text", "media_type": "text", "revision": "number",
    "access_count": "number", "salience": "number", "created_at": "ts", "accessed_at": "ts",
}


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


def storable_ids(ids: Sequence[str]) -> list[str]:
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
        params.append(storable_ids(scope.ids))
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
                    # Dumped as stored (`dumps`), so a large float is compared by its exact value.
                    ors.append("metadata @> %s OR metadata @> %s")
                    params.extend([Jsonb({name: option}, dumps=dumps), Jsonb({name: [option]}, dumps=dumps)])
        clauses.append("(" + " OR ".join(ors) + ")" if ors else "FALSE")
    return " AND ".join(clauses), params
