"""What both corpus adapters share: how a mounted record looks when its source has no time, how
their ranked lists are fused, and the scope check every answer passes before it leaves."""

from __future__ import annotations

from typing import Hashable, Iterable, Sequence, TypeVar

from a2m.filters import Scope, matches
from a2m.records import Record

EPOCH = "1970-01-01T00:00:00.000Z"  # created_at of a record whose source keeps no creation time
RRF_K = 60
K = TypeVar("K", bound=Hashable)


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
