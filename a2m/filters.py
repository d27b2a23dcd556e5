"""`where`, `key_prefix` and time ranges: validation, and a reference matcher.

`where` is a conjunction of equality tests against record fields, falling back
to metadata keys; an array value means "any of"; `null` matches a field that is
null or absent (so `{"superseded_by": null}` keeps only current facts).
Engines with a native filter language translate a `Scope`; engines that scan
(working, procedural) use `matches`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

from .errors import invalid
from .records import Record
from .timefmt import normalize_ts

# Record fields a `where` key may name; any other key is a metadata key (protocol §6: fields first).
# `owner` is tested inside the call's owner partition, never instead of it; `tier` is answered by the
# server that knows its tiers (`settle_field`), since a record shows the tier it is read from.
RECORD_FIELDS = frozenset(
    {"id", "content", "role", "group", "tier", "owner", "session", "key", "revision", "uri", "media_type",
     "salience", "access_count", "created_at", "accessed_at"}
)
# A `where` that matches no record: "any of" nothing. Every engine answers it without reading records.
MATCH_NOTHING: Mapping[str, Any] = {"id": []}

Scalar = str | int | float | bool | None
# Tests in one `where`. PostgreSQL plans a condition per test: 10,000 of them held a connection of the
# episodic tier's pool for its whole statement timeout (30 s), and a few such calls at once took the
# tier from every owner. Real filters name a handful of fields.
MAX_WHERE_KEYS = 64
# "Any of" values over metadata keys, in all. PostgreSQL tests each with parameters of its own and takes
# 65,535 a statement: past that a recall failed as if the engine were gone (-32603). A record field's
# values go as one array, so `id`, `group` and `key` lists (the router's own look-ups) are not counted.
MAX_WHERE_VALUES = 10_000


@dataclass(frozen=True, slots=True)
class Scope:
    """Which records a call concerns. `owner` always applies: `None` is its own partition."""

    owner: str | None = None
    where: Mapping[str, Any] = field(default_factory=dict)
    key_prefix: str | None = None
    ids: Sequence[str] | None = None
    after: str | None = None  # created_at strictly after (extension)
    before: str | None = None  # created_at strictly before (extension)

    def is_empty_selector(self) -> bool:
        return not self.where and self.key_prefix is None and self.ids is None and self.after is None and self.before is None

    def named_ids(self) -> Sequence[str] | None:
        """The ids the scope is limited to, by `ids` or by `where.id` (the router counts the recalls
        it returned that way), so a store can read those records rather than filter all of an
        owner's; the rest of the scope still applies to them. None when it names no ids."""
        if self.ids is not None:
            return self.ids
        named = self.where.get("id")
        if isinstance(named, str):
            return [named]
        if isinstance(named, list) and all(isinstance(i, str) for i in named):
            return named
        return None


def _scalar(value: Any) -> bool:
    return value is None or isinstance(value, (str, int, float, bool))


def parse_where(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise invalid("where must be an object", field="where")
    if len(value) > MAX_WHERE_KEYS:
        raise invalid(f"where tests at most {MAX_WHERE_KEYS} fields", field="where", max=MAX_WHERE_KEYS)
    values = 0
    for name, test in value.items():
        if isinstance(test, list):
            if not all(_scalar(v) for v in test):
                raise invalid(f"where.{name}: an array must hold only scalars", field="where")
            if name not in RECORD_FIELDS:
                values += len(test)
                if values > MAX_WHERE_VALUES:
                    raise invalid(f"where: metadata keys test at most {MAX_WHERE_VALUES} values in all",
                                  field="where", max=MAX_WHERE_VALUES)
        elif not _scalar(test):
            raise invalid(f"where.{name} must be a scalar or an array of scalars", field="where")
    return dict(value)


def parse_scope(params: Mapping[str, Any], owner: str | None, *, ids_field: bool = False) -> Scope:
    """Build a `Scope` from request params, validating each selector."""
    key_prefix = params.get("key_prefix")
    if key_prefix is not None and not isinstance(key_prefix, str):
        raise invalid("key_prefix must be a string", field="key_prefix")
    ids = params.get("ids") if ids_field else None
    if ids is not None and (not isinstance(ids, list) or not all(isinstance(i, str) for i in ids)):
        raise invalid("ids must be an array of strings", field="ids")
    after = params.get("after")
    before = params.get("before")
    return Scope(
        owner=owner,
        where=parse_where(params.get("where")),
        key_prefix=key_prefix,
        ids=ids,
        after=None if after is None else normalize_ts(after, "after"),
        before=None if before is None else normalize_ts(before, "before"),
    )


def settle_field(scope: Scope, name: str, value: Any) -> Scope:
    """Answer `where[name]` for a field every record in scope shows with the same `value` (a tier
    server's `tier`): the test is dropped when `value` passes it, and when it fails the scope becomes
    one that matches nothing, so every engine gets the same answer without storing the field."""
    if name not in scope.where:
        return scope
    if test_matches(True, value, scope.where[name]):
        where = {k: v for k, v in scope.where.items() if k != name}
    else:
        where = dict(MATCH_NOTHING)
    return replace(scope, where=where)


def field_value(record: Record, name: str) -> tuple[bool, Any]:
    """(present, value) of a record field, or of a metadata key when `name` is not a field."""
    if name in RECORD_FIELDS:
        return True, getattr(record, name)
    if name in record.metadata:
        return True, record.metadata[name]
    return False, None


def _equal(actual: Any, expected: Any) -> bool:
    if isinstance(actual, bool) or isinstance(expected, bool):
        return type(actual) is type(expected) and actual == expected
    return actual == expected


def test_matches(present: bool, actual: Any, expected: Any) -> bool:
    options = expected if isinstance(expected, list) else [expected]
    for option in options:
        if option is None:
            if not present or actual is None:
                return True
        elif present and _equal(actual, option):
            return True
        elif present and isinstance(actual, list) and any(_equal(a, option) for a in actual):
            return True  # a metadata list field matches any of its members
    return False


def matches(record: Record, scope: Scope) -> bool:
    """The reference semantics of a `Scope` (owner included)."""
    if record.owner != scope.owner:
        return False
    if scope.ids is not None and record.id not in scope.ids:
        return False
    if scope.key_prefix is not None and (record.key is None or not record.key.startswith(scope.key_prefix)):
        return False
    if scope.after is not None and not record.created_at > scope.after:
        return False
    if scope.before is not None and not record.created_at < scope.before:
        return False
    for name, expected in scope.where.items():
        present, actual = field_value(record, name)
        if not test_matches(present, actual, expected):
            return False
    return True
