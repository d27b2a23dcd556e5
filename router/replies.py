"""What the router reads of a tier's reply, checked before anything reads it.

Any A2M server may be mounted as a tier (a third-party one, an old version), so a reply is input
like any other: a record without a string id, a `revision` that is a string, a `count` that is
not a number, an `ids` list shorter than the batch. Read as it came, such a reply raised deep in
fusion, a merge or a move (KeyError, TypeError), and the whole call failed with an internal error;
a shorter `ids` returned a partial write. Each reply the router reads is checked here, field by
field for what the router uses, and one that fails is `Malformed`: that tier failing this call
(`degraded` on a read, -32603 naming the tier on a write), the others' answers untouched.

Fields the router does not read are not checked (unknown fields are the protocol's extension
point). A `created_at` that is an RFC 3339 stamp but not the canonical form is rewritten to it
in place, as the router merges and pages by that string, and a timeline is put in ascending order
if it came otherwise.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from a2m.client import Unavailable
from a2m.errors import A2MError
from a2m.timefmt import normalize_ts


class Malformed(Unavailable):
    """A tier answered with a JSON-RPC result the router cannot use (code -32603, naming the tier).

    An `Unavailable`: what a write sent it may or may not have been applied, so a write takes it
    back, a move stops and leaves its records in the source, a read leaves the tier out."""


_TEXT = ("role", "group", "tier", "accessed_at", "owner", "session", "key", "uri", "media_type")
_LIMITS = ("max_records_per_call", "max_recall_limit", "max_content_length")


MAX_COUNT = 2**53 - 1  # JSON's safe integers: two tiers' counts summed still encode (orjson stops at 2**64)
MAX_DEPTH = 200  # levels of a record field's value: orjson encodes 254 at most, the reply's envelope takes 5


def _count(value: Any) -> bool:
    """A non-negative integer (a bool is not one) the router can add up and encode."""
    return type(value) is int and 0 <= value <= MAX_COUNT


def _shallow(value: Any) -> bool:
    """Nested no deeper than MAX_DEPTH: a reply holding it could not be encoded (internal error)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_DEPTH:
            return False
        for child in (item.values() if type(item) is dict else item):
            if type(child) is dict or type(child) is list:
                stack.append((child, depth + 1))
    return True


def _vector(value: Any) -> bool:
    """A list of finite numbers; `sum` checks that in C (a Python loop cost a recall a millisecond)."""
    if type(value) is not list:
        return False
    try:
        return math.isfinite(sum(value, 0.0))
    except TypeError:
        return False


def _number(value: Any) -> bool:
    return type(value) in (int, float) and math.isfinite(value)


def _is_text(value: Any) -> bool:
    return type(value) is str


def _is_revision(value: Any) -> bool:
    return type(value) is int and value >= 1


# Each optional field the router reads, and what it must be when not null.
_CHECKS: dict[str, tuple[Any, str]] = {
    **{name: (_is_text, "a string") for name in _TEXT},
    "metadata": (lambda v: type(v) is dict and _shallow(v), f"an object nested at most {MAX_DEPTH} levels"),
    "revision": (_is_revision, "a positive integer"),
    "access_count": (_count, "a non-negative integer"),
    "salience": (_number, "a finite number"),
    "score": (_number, "a finite number"),
    "embedding": (_vector, "a list of finite numbers"),
}


def record_problem(record: Any, where: str) -> str | None:
    """What is wrong with one wire record, or None."""
    if type(record) is not dict:
        return f"{where} is not an object"
    rid, content, stamp = record.get("id"), record.get("content"), record.get("created_at")
    if type(rid) is not str or type(content) is not str or type(stamp) is not str or not rid:
        for name in ("id", "content", "created_at"):
            if type(record.get(name)) is not str:
                return f"{where}.{name} is {'missing' if name not in record else 'not a string'}"
        return f"{where}.id is empty"
    try:
        canonical = normalize_ts(stamp)
    except A2MError:
        return f"{where}.created_at is not an RFC 3339 timestamp"
    if canonical is not stamp:
        record["created_at"] = canonical
    for name, value in record.items():
        if value is not None:
            check = _CHECKS.get(name)
            if check is not None:
                if not check[0](value):
                    return f"{where}.{name} is not {check[1]}"
            elif (type(value) is dict or type(value) is list) and not _shallow(value):  # an unknown field,
                return f"{where}.{name} is nested deeper than {MAX_DEPTH} levels"  # passed on by timeline
    return None


def _records_problem(records: Any, where: str = "records") -> str | None:
    if not isinstance(records, list):
        return f"{where} is not a list"
    seen: set[str] = set()
    for index, record in enumerate(records):
        problem = record_problem(record, f"{where}[{index}]")
        if problem:
            return problem
        if record["id"] in seen:
            return f"{where}[{index}].id {record['id']!r} appears twice"
        seen.add(record["id"])
    return None


def _strings(value: Any) -> bool:
    """Absent, or a list of strings."""
    return value is None or (isinstance(value, list) and all(type(v) is str for v in value))


def _describe_problem(result: Mapping[str, Any]) -> str | None:
    if not _strings(result.get("capabilities")):
        return "capabilities is not a list of strings"
    tiers = result.get("tiers")
    if tiers is not None:
        if not isinstance(tiers, list):
            return "tiers is not a list"
        for index, tier in enumerate(tiers):
            if not isinstance(tier, dict):
                return f"tiers[{index}] is not an object"
            if "count" in tier and not _count(tier["count"]):
                return f"tiers[{index}].count is not a non-negative integer"
            for name in ("name", "kind", "engine"):
                if tier.get(name) is not None and type(tier[name]) is not str:
                    return f"tiers[{index}].{name} is not a string"
    embeddings = result.get("embeddings")
    if embeddings is not None:
        if not isinstance(embeddings, dict):
            return "embeddings is not an object"
        dims = embeddings.get("dimensions")
        if dims is not None and not (_count(dims) and dims > 0):
            return "embeddings.dimensions is not a positive integer"
        if embeddings.get("metric") is not None and type(embeddings["metric"]) is not str:
            return "embeddings.metric is not a string"
        if not _strings(embeddings.get("metrics")):
            return "embeddings.metrics is not a list of strings"
    limits = result.get("limits")
    if limits is not None:
        if not isinstance(limits, dict):
            return "limits is not an object"
        for name in _LIMITS:
            if limits.get(name) is not None and not _count(limits[name]):
                return f"limits.{name} is not a non-negative integer"
    return None


def _sessions_problem(sessions: Any) -> str | None:
    if not isinstance(sessions, list):
        return "sessions is not a list"
    for index, entry in enumerate(sessions):
        if not isinstance(entry, dict):
            return f"sessions[{index}] is not an object"
        if entry.get("session") is not None and type(entry["session"]) is not str:
            return f"sessions[{index}].session is not a string"
        if "records" in entry and not _count(entry["records"]):
            return f"sessions[{index}].records is not a non-negative integer"
        for name in ("opened_at", "touched_at"):
            if entry.get(name) is not None and type(entry[name]) is not str:
                return f"sessions[{index}].{name} is not a string"
    return None


def _created(record: dict[str, Any]) -> str:
    return record["created_at"]


def problem(method: str, params: Mapping[str, Any], result: dict[str, Any]) -> str | None:
    """What is wrong with `result`, a tier's answer to `method` with `params`; None when the router
    can read it."""
    if method in ("memory/recall", "memory/timeline"):
        wrong = _records_problem(result.get("records"))
        if wrong is None and method == "memory/timeline":
            # Ascending, as the protocol has it (stable: a millisecond keeps the tier's order). Read
            # newest first, a scan paged backwards over the same records again and again, and a
            # capacity pass counted them twice and spilled too many. Already sorted: n comparisons.
            result["records"].sort(key=_created)
            if not isinstance(result.get("cursor", ""), str | None):
                return "cursor is not a string"
        return wrong
    if method == "memory/fetch":
        record = result.get("record")
        if record is None:
            return None
        if isinstance(record, dict) and record.get("key") != params.get("key"):
            return f"record holds key {str(record.get('key'))[:80]!r}, not the key asked for"
        return record_problem(record, "record")
    if method == "memory/remember":
        ids, sent = result.get("ids"), params.get("records")
        if not isinstance(ids, list) or not all(type(i) is str and i for i in ids):
            return "ids is not a list of ids"
        if isinstance(sent, list) and len(ids) != len(sent):
            return f"ids has {len(ids)} entries for {len(sent)} records"
        return None
    if method == "memory/forget":
        return None if _count(result.get("forgotten")) else "forgotten is not a non-negative integer"
    if method == "memory/reinforce":
        return None if _count(result.get("reinforced")) else "reinforced is not a non-negative integer"
    if method == "memory/session/list":
        return _sessions_problem(result.get("sessions"))
    if method == "memory/describe":
        return _describe_problem(result)
    return None
