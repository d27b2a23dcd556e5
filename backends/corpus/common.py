"""What both corpus adapters share: how a mounted record looks when its source has no time, how
their ranked lists are fused, the scope check every answer passes before it leaves, values made fit
for the wire, and the answers of a store that is never written."""

from __future__ import annotations

from datetime import date, datetime
from decimal import Decimal
from typing import Any, Hashable, Iterable, Sequence, TypeVar
from uuid import UUID

from a2m.filters import Scope, matches
from a2m.records import Record
from a2m.timefmt import format_ts

from backends.store import SessionInfo, StoreRejected

EPOCH = "1970-01-01T00:00:00.000Z"  # created_at of a record whose source keeps no creation time
RRF_K = 60
K = TypeVar("K", bound=Hashable)
P = TypeVar("P")


def fuse(rankings: Sequence[Iterable[K]]) -> list[tuple[K, float]]:
    """Reciprocal rank fusion of best-first lists, as (item, score in [0, 1]) best first.

    Scores are scaled by the best score possible (first in every list), so a
    record first by text and by vector scores 1.0 and `min_score` means the
    same whichever lists a recall had.
    """
    fused: dict[K, float] = {}
    for ranking in rankings:
        for rank, item in enumerate(ranking):
            fused[item] = fused.get(item, 0.0) + 1.0 / (RRF_K + rank + 1)
    top = len(rankings) / (RRF_K + 1) if rankings else 1.0
    return sorted(((item, min(1.0, s / top)) for item, s in fused.items()), key=lambda p: -p[1])


def visible(records: list[Record], scope: Scope) -> list[Record]:
    """The records that pass `scope` exactly. A corpus is shared (decision 8), so the owner is not
    tested; an engine's filter may be a superset of the scope, never a subset."""
    shared = Scope(owner=None, where=scope.where, key_prefix=scope.key_prefix, ids=scope.ids,
                   after=scope.after, before=scope.before)
    return [r for r in records if matches(r, shared)]


def visible_placed(placed: list[tuple[Record, P]], scope: Scope) -> list[tuple[Record, P]]:
    """`visible` of records read each with its place in an order (an exact time, a cursor
    position): the pairs whose record passes, in the order given."""
    kept = {id(r) for r in visible([r for r, _ in placed], scope)}
    return [p for p in placed if id(p[0]) in kept]


def json_safe(value: Any) -> Any:
    """A source value as metadata the wire can carry, nested values included: times as text,
    decimals as floats, and integers past 64 bits (which orjson refuses, failing the whole answer)
    as the nearest float, which is also what a client's JSON parser makes of them."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, int) and not isinstance(value, bool) and not -2**63 <= value < 2**64:
        try:
            return float(value)
        except OverflowError:  # past 1e308: no JSON number is that large
            return None
    if isinstance(value, datetime):
        return format_ts(value)
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, UUID):  # PostgreSQL's uuid: shown, and so matched, as its text
        return str(value)
    return value


class ReadOnlyStore:
    """The Store methods a mounted corpus answers the same way whatever holds it: it is never
    written (the surface refuses writes with -32004 before they get here), keeps no A2M keys or
    sessions, and keeps no access statistics of someone else's data (decision 8)."""

    async def write(self, puts: Sequence[Record], deletes: Sequence[str] = (), **conditions: Any) -> None:
        raise StoreRejected("this corpus is read-only")

    async def delete(self, scope: Scope) -> int:
        raise StoreRejected("this corpus is read-only")

    async def touch(self, owner: str | None, ids: Sequence[str], at: str) -> None:
        return None

    async def reinforce(self, owner: str | None, ids: Sequence[str], amount: float) -> int:
        return 0

    async def get_keys(self, owner: str | None, keys: Sequence[str]) -> dict[str, Record]:
        return {}

    async def owners(self, ids: Sequence[str]) -> dict[str, str | None]:
        return {}  # never written through A2M, so no id can collide

    async def sessions(self, owner: str | None) -> list[SessionInfo]:
        return []
