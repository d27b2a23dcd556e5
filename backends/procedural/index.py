"""What recall reads: a branch's records in memory, and the indexes over them.

Recall never touches git. The tree is parsed once at open into a `Tree` per
branch (id -> record, path, insertion sequence) and, for the branch readers
see, a `Visible`: per-owner and per-session dicts, keys, a BM25 index per
owner and unit vectors compared with numpy. A commit updates them only after
it landed, so a reader never sees a write that could still fail.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Sequence

from a2m.cosine import unit_length
from a2m.filters import Scope, matches
from a2m.records import Record
from a2m.text import BM25, squash


@dataclass(slots=True)
class Tree:
    """One branch's records as the store knows them (access statistics merged in)."""

    records: dict[str, Record] = field(default_factory=dict)  # id -> record
    paths: dict[str, str] = field(default_factory=dict)  # id -> path
    by_path: dict[str, str] = field(default_factory=dict)  # path -> id
    seqs: dict[str, int] = field(default_factory=dict)  # id -> insertion sequence

    def set(self, record: Record, path: str, seq: int) -> None:
        self.drop(record.id)
        self.records[record.id] = record
        self.paths[record.id] = path
        self.by_path[path] = record.id
        self.seqs[record.id] = seq

    def drop(self, record_id: str) -> None:
        if record_id in self.records:
            del self.records[record_id]
            path = self.paths.pop(record_id)
            # A batch may already have put another record on this path (two records trading keys
            # are set one after the other): the path is theirs now, only this record's entry goes.
            if self.by_path.get(path) == record_id:
                del self.by_path[path]
            del self.seqs[record_id]

    def copy(self) -> "Tree":
        return Tree(dict(self.records), dict(self.paths), dict(self.by_path), dict(self.seqs))



class Visible:
    """The searchable view of the branch recall sees: per-owner dicts, keys, BM25, vectors.

    `by_session` indexes the records that name a session, so a session's
    timeline (which the router asks of every tier on each replay) reads only
    that session instead of matching every record of the owner.
    """

    def __init__(self, tree: Tree) -> None:
        self.tree = tree
        self.by_owner: dict[str | None, dict[str, Record]] = defaultdict(dict)
        self.by_session: dict[tuple[str | None, str], dict[str, Record]] = defaultdict(dict)
        self.keys: dict[tuple[str | None, str], str] = {}
        self.bm25: dict[str | None, BM25] = defaultdict(BM25)
        self.vectors: dict[str, Any] = {}
        for record in tree.records.values():
            self._index(record)

    def _index(self, record: Record) -> None:
        self.by_owner[record.owner][record.id] = record
        if record.session is not None:
            self.by_session[(record.owner, record.session)][record.id] = record
        if record.key is not None:
            self.keys[(record.owner, record.key)] = record.id
        self.bm25[record.owner].add(record.id, record.content)
        if record.embedding is not None:
            self.vectors[record.id] = unit(record.embedding)

    def _unindex(self, record_id: str) -> None:
        record = self.tree.records.get(record_id)
        if record is None:
            return
        mine = self.by_owner.get(record.owner)
        if mine is not None:
            mine.pop(record_id, None)
            if not mine:  # an owner with nothing left keeps no entry: owners come and go by the million
                del self.by_owner[record.owner]
        if record.session is not None:
            session = self.by_session.get((record.owner, record.session))
            if session is not None:
                session.pop(record_id, None)
                if not session:
                    del self.by_session[(record.owner, record.session)]
        if record.key is not None and self.keys.get((record.owner, record.key)) == record_id:
            del self.keys[(record.owner, record.key)]
        index = self.bm25.get(record.owner)
        if index is not None:
            index.remove(record_id)
            if not len(index):
                del self.bm25[record.owner]
        self.vectors.pop(record_id, None)

    def apply(self, dropped: Iterable[str], puts: Iterable[tuple[Record, str, int]]) -> None:
        """A landed commit: the records it dropped, then those it put (record, path, seq)."""
        for record_id in dropped:
            self._unindex(record_id)
            self.tree.drop(record_id)
        for record, path, seq in puts:
            self._unindex(record.id)
            self.tree.set(record, path, seq)
            self._index(record)

    def replace_record(self, record: Record) -> None:
        """Swap a record in place without re-indexing its text (access statistics only)."""
        self.tree.records[record.id] = record
        self.by_owner[record.owner][record.id] = record
        if record.session is not None:
            self.by_session[(record.owner, record.session)][record.id] = record



    def scoped(self, scope: Scope) -> list[Record]:
        """The records in `scope`, from the smallest dict that holds them all."""
        session = scope.where.get("session")
        if isinstance(session, str):
            pool = self.by_session.get((scope.owner, session), {})
        else:
            pool = self.by_owner.get(scope.owner, {})
        ids = scope.named_ids()
        if ids is not None:
            candidates: Iterable[Record] = (pool[i] for i in dict.fromkeys(ids) if i in pool)
        else:
            candidates = pool.values()
        return [r for r in candidates if matches(r, scope)]

    def order_key(self, record: Record) -> tuple[str, int]:
        """Creation order: `created_at`, ties broken by the order records were written in."""
        return record.created_at, self.tree.seqs.get(record.id, 0)

    def ranked(self, scope: Scope, text: str | None, vector: Sequence[float] | None,
               limit: int) -> list[tuple[float, Record]]:
        """The best `limit` (0: all) records of `scope` for `text` and/or `vector`, best first, with
        their scores: BM25 squashed to [0, 1], cosine mapped to [0, 1], averaged when both are asked."""
        pool = self.by_owner.get(scope.owner, {})
        lexical: dict[str, float] = {}
        if text:
            index = self.bm25.get(scope.owner)
            if index is not None:
                lexical = {i: squash(s) for i, s in index.scores(text).items()}
        semantic: dict[str, float] = {}
        if vector is not None and len(vector):
            semantic = self.cosine(scope, vector)
        if not lexical and not semantic:
            return []
        both = bool(text) and vector is not None
        plain = scope.is_empty_selector()  # the owner's pool is already the scope: skip the matcher
        scored: list[tuple[float, Record]] = []
        for record_id in (lexical.keys() | semantic.keys()) if both else (lexical or semantic):
            record = pool.get(record_id)
            if record is None or not (plain or matches(record, scope)):
                continue
            if both:
                score = 0.5 * lexical.get(record_id, 0.0) + 0.5 * semantic.get(record_id, 0.0)
            else:
                score = lexical.get(record_id, semantic.get(record_id, 0.0))
            scored.append((score, record))
        seqs = self.tree.seqs
        return heapq.nsmallest(limit or len(scored), scored,
                               key=lambda p: (-p[0], p[1].created_at, seqs.get(p[1].id, 0)))

    def cosine(self, scope: Scope, vector: Sequence[float]) -> dict[str, float]:
        """Cosine similarity, mapped to [0, 1], of each record of `scope` with a vector of `vector`'s width."""
        import numpy as np

        ids = [r.id for r in self.scoped(scope) if r.id in self.vectors]
        query = unit(vector)
        ids = [i for i in ids if self.vectors[i].shape == query.shape]
        if not ids:
            return {}
        sims = np.stack([self.vectors[i] for i in ids]) @ query  # a zero query is orthogonal to all: 0.5 each
        return {i: float((s + 1.0) / 2.0) for i, s in zip(ids, sims.tolist())}


def unit(vector: Sequence[float]) -> Any:
    """`vector` at length 1 (`a2m.cosine`: scaled in float64, so one of any accepted length keeps its
    direction) as float32, what every tier keeps; a zero vector stays zero."""
    import numpy as np

    return np.asarray(unit_length(vector), dtype=np.float32)


def copy_out(record: Record, with_embeddings: bool) -> Record:
    """A copy for a caller, which may change it (a score), without its embedding unless asked."""
    return replace(record) if with_embeddings else replace(record, embedding=None)
