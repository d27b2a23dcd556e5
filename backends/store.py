"""The small interface every tier engine implements.

The shared surface (`surface.py`) owns the protocol: validation, limits, owner
scoping, id idempotency, key replacement, events, prompt rendering, touch
policy. A Store owns only bytes and indexes, so an engine is a few hundred lines
and the protocol's rules are written once.

Contract every Store honours (the store tests in tests/backends check it):

- `owner` partitions everything: `None` is its own partition, never "all".
- `write` is atomic: every put and delete lands, or none does, and a failure
  raises. A put overwrites the record with the same id (upsert by id).
- Order is creation order: `created_at` then insertion order for ties. A store
  keeps an insertion sequence to break ties (a record re-put keeps a new one).
- Records come back complete (every field, `embedding` included when
  `with_embeddings`), `score` unset except from `search`.
- An engine that is down raises `StoreUnavailable`; the surface answers
  `-32603` naming the tier, and nothing is half-written.
- `write` refuses, inside its atomic step, a put whose id another owner holds
  (`StoreIdTaken`) and a put whose key another live record holds, unless that
  record is deleted in the same write (`StoreConflict`): the surface's reads
  before the write cannot see what another replica writes meanwhile.
- `write` checks, in the same step, what the surface resolved the batch
  against (`expect`: id -> the revision it saw, 0 for "absent") and raises
  `StoreConflict` when a put's or delete's id no longer matches: a keyed
  replace resolved before a forget must not write the forgotten id back, two
  replacements must not both write revision n + 1, and of two first writes of
  one client id only one is written. A put named in `keep` takes the listed
  fields (`access_count`, `accessed_at`, `salience`) from the record it
  replaces as stored at the write, so touches and reinforces that landed
  after the surface read it are kept.

Optional, for a store whose writes land somewhere other than its reads show
(procedural behind its review gate): `write_owners(ids)` and
`write_keys(owner, keys)`, which answer as `owners` and `get_keys` do but for
the state writes are resolved against (decision 60); and `key_lock`, an
async lock the surface then holds from resolving a batch's keys to writing
them, so the store's own key-replacing methods can hold it too (decision 61).

Optional, for a store whose writes are not recallable when `write` returns
(procedural behind its review gate): `writes_visible`, False while so. The
surface then tells no `written` / `forgotten` event of its writes (an event
reaches only callers who could recall its record); the store's own step that
makes them recallable (procedural's `memory/approve`) tells them. Absent: True.

Optional, for the timeline cursor (docs/extensions.md): `timeline_page(scope, below=,
limit=, with_embeddings=)`, the newest `limit` records in scope strictly before
the `Position` `below` in creation order, newest first, each with its own
position; no two records share one. Absent: the surface answers a timeline without a cursor, and a reader
pages by time (`a2m.paging`), which cannot cross a millisecond holding more
records than one timeline returns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Collection, Literal, Mapping, Protocol, Sequence

from a2m.filters import Scope
from a2m.records import Record


Position = tuple[str, int, str]
"""Where a record stands in creation order: its created_at (canonical, so it sorts as text), the
store's insertion sequence number, which breaks ties (a record re-put takes a new one), and its id,
which breaks a tie of those two where a sequence may repeat (semantic replicas on one Qdrant
server each count their own)."""


class StoreUnavailable(Exception):
    """The engine cannot be reached or refused the operation for a reason other than bad input."""


class StoreReadOnly(StoreUnavailable):
    """The engine serves reads here and refuses every write: a hot standby, a role with read rights
    only, a Redis primary that became a replica. A write fails with it as with any StoreUnavailable;
    a recall answers without its touch (surface.py)."""


class StoreRejected(Exception):
    """The engine cannot store this input (e.g. a NUL byte PostgreSQL refuses): answered `-32602`."""


class StoreWidthMismatch(StoreRejected):
    """A put's embedding is not as wide as the tier's (fixed by the first stored vector, maybe by a
    concurrent write the surface's check before the write could not see): answered `-32008`."""

    def __init__(self, expected: int, got: int) -> None:
        super().__init__(f"embeddings here have {expected} dimensions, not {got}")
        self.expected, self.got = expected, got


class StoreIdTaken(StoreRejected):
    """A put's id is held by another owner: ids are global, so it is refused, never overwritten.
    The engine checks it in the same atomic step as the write (the surface's check before it can be
    raced by another writer); answered `-32005` like the surface's own."""

    def __init__(self, record_id: str) -> None:
        super().__init__(f"record id {record_id!r} is held by another owner")
        self.record_id = record_id


class StoreConflict(Exception):
    """What the surface resolved a batch against changed before it was written: another writer (a
    replica on the same engine, or a concurrent call on this server) took one of its keys, wrote or
    forgot one of its ids, or replaced its record. The surface resolves the batch again."""


@dataclass(slots=True)
class SessionInfo:
    session: str
    records: int
    opened_at: str | None = None  # earliest created_at
    touched_at: str | None = None  # latest created_at or access


class Store(Protocol):
    engine: str  # shown in describe and `a2m doctor`: "redis", "postgresql", "qdrant-edge", ...
    searches_vectors: bool  # True when `search` uses the query vector (episodic, semantic)
    # Optional `metric: str` (the protocol's name of the distance `search` ranks by): "cosine" if absent.

    async def open(self) -> None:
        """Connect (or start the embedded engine), create schema/indexes. Idempotent."""

    async def close(self) -> None:
        """Release connections and stop any engine this store started."""

    async def ping(self) -> None:
        """Raise StoreUnavailable when the engine does not answer."""

    async def write(self, puts: Sequence[Record], deletes: Sequence[str] = (), *,
                    expect: Mapping[str, int] | None = None,
                    keep: Mapping[str, Collection[str]] | None = None) -> None:
        """Atomically upsert `puts` by id and delete the ids in `deletes` (owner is in each record;
        deletes name ids whose owner the surface already checked). `expect` and `keep`: see above;
        an id in neither is written unconditionally, as before."""

    async def get(self, owner: str | None, ids: Sequence[str], *, with_embeddings: bool = False) -> list[Record]:
        """The records with these ids in this owner's partition; unknown ids are left out."""

    async def owners(self, ids: Sequence[str]) -> dict[str, str | None]:
        """id -> owner for the ids that exist in ANY partition: ids are global in every engine,
        so the surface refuses an id another owner holds instead of overwriting it."""

    async def get_keys(self, owner: str | None, keys: Sequence[str]) -> dict[str, Record]:
        """key -> record for the occupied keys of this owner."""

    async def select(
        self,
        scope: Scope,
        *,
        order: Literal["asc", "desc"] = "asc",
        limit: int | None = None,
        with_embeddings: bool = False,
    ) -> list[Record]:
        """Records in scope in creation order (`desc`: newest first), at most `limit`."""

    async def search(
        self,
        scope: Scope,
        *,
        text: str | None,
        vector: Sequence[float] | None,
        limit: int,
        with_embeddings: bool = False,
    ) -> list[Record]:
        """Best `limit` records in scope for the text and/or vector, each with `score` set,
        best first, scores in [0, 1]. A text with no searchable term and no vector gives []."""

    async def delete(self, scope: Scope) -> int:
        """Delete every record in scope; return how many."""

    async def touch(self, owner: str | None, ids: Sequence[str], at: str) -> Mapping[str, int] | None:
        """access_count += 1 and accessed_at = at for each id (missing ids ignored); returns id ->
        access_count after this touch, so that a recall shows its own count when other recalls touch
        the same record at once (None: the surface shows one more than it read)."""

    async def reinforce(self, owner: str | None, ids: Sequence[str], amount: float) -> int:
        """salience = min(1, salience + amount) (max(0, ...) for negative); return how many existed."""

    async def sessions(self, owner: str | None) -> list[SessionInfo]:
        """Every named session of this owner with its record count."""

    async def count(self, owner: str | None) -> int:
        """Records in this owner's partition."""

    async def dimensions(self) -> int | None:
        """The embedding width fixed by the first stored vector, or None before any."""
