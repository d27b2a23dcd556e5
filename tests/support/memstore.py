"""An in-memory Store: a TEST FIXTURE for the protocol layer, never a product backend.

It lets the conformance suite and the protocol tests run before (and
independently of) any engine. `BrokenStore` violates timeline order on
purpose, to prove the conformance suite can fail.
"""

from __future__ import annotations

import asyncio
import itertools
import math
from typing import Any, Collection, Literal, Mapping, Sequence

from a2m.filters import Scope, matches
from a2m.records import Record
from a2m.text import rank
from backends.store import SessionInfo, StoreConflict, StoreIdTaken

CAPABILITIES = frozenset({"core", "tiers", "salience", "scopes", "sessions", "keys", "embeddings",
                          "external", "events", "prompt", "summarize"})


class MemoryStore:
    engine = "memory (test fixture)"
    searches_vectors = True

    def __init__(self) -> None:
        self.records: dict[str, tuple[int, Record]] = {}
        self._seq = itertools.count()

    async def open(self) -> None: ...
    async def close(self) -> None: ...
    async def ping(self) -> None: ...

    def _copy(self, record: Record, with_embeddings: bool) -> Record:
        return record.with_(metadata=dict(record.metadata), embedding=record.embedding if with_embeddings else None)

    async def write(self, puts: Sequence[Record], deletes: Sequence[str] = (), *,
                    expect: Mapping[str, int] | None = None,
                    keep: Mapping[str, Collection[str]] | None = None) -> None:
        owners = {r.id: r.owner for r in puts}
        for record_id, revision in (expect or {}).items():
            held = self.records.get(record_id, (0, None))[1]
            if revision == 0 and held is not None and held.owner != owners.get(record_id, held.owner):
                raise StoreIdTaken(record_id)
            if (held is not None) if revision == 0 else (
                    held is None or held.revision != revision or held.owner != owners.get(record_id, held.owner)):
                raise StoreConflict(record_id)
        kept = []
        for record in puts:
            held = self.records.get(record.id, (0, None))[1]
            fields = (keep or {}).get(record.id, ())
            if fields and held is not None and held.owner == record.owner:
                record = record.with_(**{name: getattr(held, name) for name in fields})
            kept.append(record)
        puts = kept
        for record_id in deletes:
            self.records.pop(record_id, None)
        for record in puts:
            self.records[record.id] = (next(self._seq), record.with_(score=None, tier=None))

    async def get(self, owner, ids, *, with_embeddings=False):  # type: ignore[no-untyped-def]
        return [self._copy(r, with_embeddings) for i in ids if (e := self.records.get(i)) and (r := e[1]).owner == owner]

    async def owners(self, ids):  # type: ignore[no-untyped-def]
        return {i: self.records[i][1].owner for i in ids if i in self.records}

    async def get_keys(self, owner, keys):  # type: ignore[no-untyped-def]
        return {r.key: self._copy(r, False) for _, r in self.records.values() if r.owner == owner and r.key in keys}

    def _ordered(self, scope: Scope) -> list[Record]:
        found = [(r.created_at, seq, r) for seq, r in self.records.values() if matches(r, scope)]
        return [r for _, _, r in sorted(found, key=lambda t: (t[0], t[1]))]

    async def select(self, scope: Scope, *, order: Literal["asc", "desc"] = "asc", limit=None, with_embeddings=False):  # type: ignore[no-untyped-def]
        found = self._ordered(scope)
        if order == "desc":
            found.reverse()
        return [self._copy(r, with_embeddings) for r in found[:limit]]

    async def search(self, scope, *, text, vector, limit, with_embeddings=False):  # type: ignore[no-untyped-def]
        pool = {r.id: r for r in self._ordered(scope)}
        scores: dict[str, float] = {}
        if text:
            for doc_id, score in rank({i: r.content for i, r in pool.items()}, text):
                scores[doc_id] = score
        if vector is not None:
            for doc_id, record in pool.items():
                if record.embedding and len(record.embedding) == len(vector):
                    dot = sum(a * b for a, b in zip(record.embedding, vector))
                    norm = math.sqrt(sum(a * a for a in record.embedding)) * math.sqrt(sum(b * b for b in vector))
                    cos = (dot / norm + 1) / 2 if norm else 0.0
                    scores[doc_id] = max(scores.get(doc_id, 0.0), cos)
        best = sorted(scores.items(), key=lambda p: -p[1])[:limit]
        return [self._copy(pool[i], with_embeddings).with_(score=s) for i, s in best]

    async def delete(self, scope: Scope) -> int:
        doomed = [r.id for _, r in self.records.values() if matches(r, scope)]
        for record_id in doomed:
            del self.records[record_id]
        return len(doomed)

    async def touch(self, owner, ids, at):  # type: ignore[no-untyped-def]
        counts = {}
        for record in await self.get(owner, ids, with_embeddings=True):
            seq, _ = self.records[record.id]
            self.records[record.id] = (seq, record.with_(access_count=record.access_count + 1, accessed_at=at))
            counts[record.id] = record.access_count + 1
        return counts

    async def reinforce(self, owner, ids, amount):  # type: ignore[no-untyped-def]
        found = await self.get(owner, ids, with_embeddings=True)
        for record in found:
            seq, _ = self.records[record.id]
            self.records[record.id] = (seq, record.with_(salience=min(1.0, max(0.0, record.salience + amount))))
        return len(found)

    async def sessions(self, owner):  # type: ignore[no-untyped-def]
        out: dict[str, SessionInfo] = {}
        for _, r in self.records.values():
            if r.owner == owner and r.session is not None:
                info = out.setdefault(r.session, SessionInfo(r.session, 0, r.created_at, r.created_at))
                info.records += 1
                info.opened_at = min(info.opened_at or r.created_at, r.created_at)
                info.touched_at = max(info.touched_at or r.created_at, r.created_at)
        return list(out.values())

    async def count(self, owner):  # type: ignore[no-untyped-def]
        return sum(1 for _, r in self.records.values() if r.owner == owner)

    async def dimensions(self):  # type: ignore[no-untyped-def]
        for _, r in self.records.values():
            if r.embedding:
                return len(r.embedding)
        return None


class SlowStore(MemoryStore):
    """Takes `delay` seconds over each write before applying it (`--slow-writes`): an engine that
    stalls with the request already running, past the router's timeout for the tier."""

    def __init__(self, delay: float) -> None:
        super().__init__()
        self.delay = delay

    async def write(self, puts: Sequence[Record], deletes: Sequence[str] = (), **kwargs: Any) -> None:
        if puts:
            await asyncio.sleep(self.delay)
        await super().write(puts, deletes, **kwargs)


class PagedStore(MemoryStore):
    """Answers the cursor extension: a third-party server that pages exactly (`--paged`)."""

    async def timeline_page(self, scope, *, below, limit, with_embeddings=False):  # type: ignore[no-untyped-def]
        found = sorted(((r.created_at, seq, r) for seq, r in self.records.values() if matches(r, scope)),
                       key=lambda t: (t[0], t[1]), reverse=True)
        if below is not None:
            found = [t for t in found if (t[0], t[1]) < (below[0], below[1])]
        return [(self._copy(r, with_embeddings), (at, seq, r.id)) for at, seq, r in found[:limit]]


class BrokenStore(MemoryStore):
    """Returns timelines newest-first: a violation the conformance suite must catch."""

    async def select(self, scope, *, order="asc", limit=None, with_embeddings=False):  # type: ignore[no-untyped-def]
        records = await super().select(scope, order=order, limit=limit, with_embeddings=with_embeddings)
        return list(reversed(records)) if order == "desc" else records
