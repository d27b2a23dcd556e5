"""Qdrant Edge: the Qdrant engine in-process (`qdrant-edge-py`), the embedded default.

One shard in the data directory, with Qdrant's WAL (an acknowledged `update`
survives a SIGKILL), payload indexes and HNSW. The shard holds a lock on its
WAL, so one process owns a data directory.

These facts shape this module:

- `EdgeShard` calls are synchronous; updates run in a worker thread, so a
  slow fsync does not stall the event loop. Reads are fast and run inline.
- The WAL maps 32 MiB segment files into memory; where the disk cannot back a
  page of one, the process dies of SIGBUS, with no word (a restart on a full
  disk dies so while loading). The engine therefore refuses to open, and a
  write refuses, while less than `MIN_FREE` is free: a one-line error, not a
  silent death.
- `optimize()` (which builds HNSW) holds the GIL for its whole run (seconds at
  tens of thousands of points), so a thread does not keep it off the request
  path. It runs at `open()` when enough points are unindexed, and on demand
  through `optimize()`; between restarts new points sit in the appendable
  segment and are searched exactly, which for a semantic tier's size is fast.
- A deleted or replaced point stays in its segment (and its pending changes in
  memory, and the WAL's closed files on disk) until a vacuum and a flush: a
  tier that wrote and deleted 40,000 records grew by ~90 MB of memory and
  ~32 MB of disk with none live. Edge vacuums only inside `optimize()` and
  frees the old segment (and truncates the WAL) only at the next `flush()`, so
  every `VACUUM_AFTER` deleted points the engine runs both (`compact`): 0.3 s
  with none live, 0.9 s beside 5,000 live records, holding the GIL as above.
  While a build of HNSW is due, the vacuum waits for the next open.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from pathlib import Path
from typing import Any, Sequence

import anyio
import qdrant_edge as q

from backends.store import StoreUnavailable

from .store import (DENSE, EMBEDDING, INDEXES, RRF_K, SPARSE, AnyOf, Cond, Either, Empty, HasIds, Hit, Match, Not,
                    PointData, Prefix, Range)

log = logging.getLogger("a2m.semantic")

FACET_LIMIT = 1_000_000_000  # a facet's values: all of them
WAL_SEGMENT = 32 * 1024 * 1024  # the size of each WAL segment file Qdrant Edge maps
MIN_FREE = 2 * WAL_SEGMENT  # a rotation's new segment, and room for the segment files to grow
# deleted points between compactions: ~50 MB of memory they hold until then; at least Edge's own
# `vacuum_min_vector_number` (1,000), under which it vacuums no segment
VACUUM_AFTER = 20_000
# points changed (written, deleted or touched by a recall) between flushes: until one, every change
# stays in the WAL (~0.3 KB a touched point), so a read-mostly tier's disk grew without bound
FLUSH_AFTER = 20_000


def check_space(path: Path, *, replay: bool = False) -> None:
    """Refuse (StoreUnavailable) while the disk under `path` has less than `MIN_FREE` free: Qdrant Edge
    writes its WAL through memory maps, and a page the disk cannot back kills the process (SIGBUS)
    with no message. At open (`replay`) the WAL's files count too: `EdgeShard.load` replays them into
    the segments (65 MiB free beside a 96 MiB WAL died so)."""
    need = MIN_FREE + (_wal_bytes(path / "wal") if replay else 0)
    free = shutil.disk_usage(path).free
    if free < need:
        mib = 1024 * 1024
        raise StoreUnavailable(f"the disk holding the Qdrant Edge shard {path} has {free // mib} MiB free, under "
                               f"the {need // mib} MiB its write-ahead log needs (free some space)")


def _wal_bytes(wal: Path) -> int:
    return sum(f.stat().st_size for f in wal.iterdir() if f.is_file()) if wal.is_dir() else 0


def _cond(c: Cond) -> Any:
    if isinstance(c, Match):
        if isinstance(c.value, bool):
            # qdrant-edge-py 0.9 converts a Python bool to the integer 1/0, which never
            # matches a stored JSON boolean: narrow to "present" and let the store's
            # exact post-filter decide.
            return q.Filter(must_not=[q.IsEmptyCondition(c.path)])
        return q.FieldCondition(c.path, match=q.MatchValue(c.value))
    if isinstance(c, AnyOf):
        return q.FieldCondition(c.path, match=q.MatchAny(list(c.values)))
    if isinstance(c, Range):
        return q.FieldCondition(c.path, range=q.RangeFloat(gt=c.gt, gte=c.gte, lt=c.lt, lte=c.lte))
    if isinstance(c, Empty):
        return q.IsEmptyCondition(c.path)
    if isinstance(c, Prefix):
        return q.FieldCondition(c.path, match=q.MatchPrefix(c.prefix))
    if isinstance(c, HasIds):
        return q.HasIdCondition(set(c.ids))
    if isinstance(c, Either):
        return q.Filter(should=[_cond(x) for x in c.conds])
    if isinstance(c, Not):
        return q.Filter(must_not=[_cond(x) for x in c.conds])
    raise TypeError(f"unknown condition {c!r}")


def _filter(must: Sequence[Cond]) -> Any:
    return q.Filter(must=[_cond(c) for c in must]) if must else None


def _index_schema(kind: str) -> Any:
    if kind == "tenant":
        return q.KeywordIndexParams(is_tenant=True)
    if kind == "prefix":
        return q.KeywordIndexParams(prefix=True)
    if kind == "integer":
        return q.IntegerIndexParams(lookup=True, range=True)
    if kind == "datetime":
        return q.PayloadSchemaType.Datetime
    return q.PayloadSchemaType.Keyword


class EdgeEngine:
    name = "qdrant-edge"

    def __init__(self, path: Path, *, optimize_at_open: int = 20_000, vacuum_after: int = VACUUM_AFTER,
                 flush_after: int = FLUSH_AFTER) -> None:
        self._path = Path(path)
        self._shard: Any = None
        self._optimize_at_open = optimize_at_open
        self._vacuum_after = vacuum_after
        self._flush_after = flush_after
        self._deleted = 0  # points deleted since the last compaction
        self._changed = 0  # points changed since the last flush
        self._written = 0  # points written since the last optimize: what it might index now
        self._width: int | None = None

    @property
    def shard(self) -> Any:
        if self._shard is None:
            raise RuntimeError("the Qdrant Edge shard is closed")
        return self._shard

    async def open(self) -> None:
        if self._shard is not None:
            return
        self._path.mkdir(parents=True, exist_ok=True)
        check_space(self._path, replay=True)
        try:
            if (self._path / "edge_config.json").exists():
                self._shard = await anyio.to_thread.run_sync(q.EdgeShard.load, str(self._path))
            else:
                config = q.EdgeConfig(sparse_vectors={SPARSE: q.EdgeSparseVectorParams(modifier=q.Modifier.Idf)})
                self._shard = await anyio.to_thread.run_sync(q.EdgeShard.create, str(self._path), config)
        except Exception as exc:
            if "WouldBlock" in str(exc):  # the WAL's lock: Edge says only "Can't init WAL: Kind(WouldBlock)"
                raise StoreUnavailable(f"another process has the Qdrant Edge shard {self._path} open "
                                       "(a second server on this data directory?)") from None
            raise
        # The shard persists its config; it is the one place the width survives a restart before
        # (or without) any point carrying a dense vector.
        config = json.loads((self._path / "edge_config.json").read_text())
        dense = (config.get("vectors") or {}).get(DENSE)
        self._width = None if dense is None else int(dense["size"])
        present = set(self._shard.info().payload_schema)
        for field, kind in INDEXES:
            if field not in present:
                self._shard.update(q.UpdateOperation.create_field_index(field, _index_schema(kind)))
        self._written = self._unindexed()
        if self._written >= self._optimize_at_open:
            log.info("building the HNSW index for %d vectors written since the last build; the tier serves "
                     "once it is built (~40 s for 50,000 of 384 dimensions on 2 cores, decision 18)", self._written)
            started, count = time.monotonic(), self._written
            if await self.optimize():
                log.info("built the HNSW index in %.1f s", time.monotonic() - started)
            else:  # small vectors: Edge indexes a segment only past its own size threshold (~10 MB of them)
                log.info("no HNSW index was needed: Qdrant Edge searches %d vectors this small exactly", count)

    def _unindexed(self) -> int:
        """Dense vectors not yet in an HNSW graph. The shard's `indexed_vectors_count` counts every
        indexed vector of every kind, and a sparse vector is indexed as it is written, so points minus
        that count was ~0 for records with text and no restart ever built HNSW. Dense and sparse
        vectors held, less those indexed, leaves the dense ones waiting."""
        shard = self.shard
        held = sum(shard.count(q.CountRequest(filter=q.Filter(must=[q.HasVectorCondition(name)]), exact=True))
                   for name in (DENSE, SPARSE))
        return max(0, held - shard.info().indexed_vectors_count)

    async def optimize(self) -> bool:
        """Build HNSW for unindexed segments (blocking: see the module docstring)."""
        done = await anyio.to_thread.run_sync(self.shard.optimize)
        self._written = 0
        return done

    async def compact(self) -> None:
        """Vacuum deleted points and free what they held: Edge rebuilds a littered segment only in
        `optimize()`, and drops the old one (and the WAL's acknowledged files) only at `flush()`.
        `optimize()` also builds HNSW, which holds the GIL for seconds to minutes, so while enough
        points are unindexed to warrant that (decision 18) only the flush runs, and the vacuum waits
        for the next open."""
        self._deleted = 0
        # written since the last optimize and still live bounds what it would index now
        if min(self._written, self.shard.info().points_count) < self._optimize_at_open:
            await self.optimize()
        await self.flush()

    async def flush(self) -> None:
        """Write the segments out and let the WAL go: Edge truncates it only here (or at close), so
        every upsert, delete and recall's touch since the last flush is still in it."""
        self._changed = 0
        await anyio.to_thread.run_sync(self.shard.flush)

    async def _deleted_some(self, count: int) -> None:
        self._deleted += count
        if self._deleted >= self._vacuum_after:
            await self.compact()

    async def close(self) -> None:
        shard, self._shard = self._shard, None
        if shard is not None:
            await anyio.to_thread.run_sync(shard.flush)
            shard.close()

    async def ping(self) -> None:
        self.shard.info()

    async def dense_width(self) -> int | None:
        # Read from the shard's config at open, then kept: this process alone writes the shard, and
        # the store asks again while the width is unknown (a replica on a Qdrant server may fix it),
        # which must cost no file read and never read the file while `create_dense` rewrites it.
        return self._width

    async def create_dense(self, width: int) -> None:
        await self._update(q.UpdateOperation.create_dense_vector(DENSE, width, q.Distance.Cosine))
        self._width = width

    async def _update(self, op: Any, changed: int = 0) -> None:
        await anyio.to_thread.run_sync(self.shard.update, op)
        self._changed += changed
        if self._changed >= self._flush_after:
            await self.flush()

    async def write(self, points: Sequence[PointData], deletes: Sequence[str]) -> None:
        if points:  # a statvfs, about a microsecond a batch; a delete frees, so it is let through
            check_space(self._path)
        # Each update is one WAL record, applied whole or not at all: the puts land
        # together, then the deletes (a crash between the two leaves both versions
        # of a replaced key; readers prefer the newest).
        if points:
            await self._update(q.UpdateOperation.upsert_points([_point(p) for p in points]), len(points))
            self._written += len(points)
        if deletes:
            await self._update(q.UpdateOperation.delete_points(list(deletes)), len(deletes))
            await self._deleted_some(len(deletes))

    async def delete(self, pids: Sequence[str]) -> None:
        await self._update(q.UpdateOperation.delete_points(list(pids)), len(pids))
        await self._deleted_some(len(pids))

    async def set_payload(self, groups: Sequence[tuple[Sequence[str], dict[str, Any]]]) -> None:
        # by an id filter, not by ids: a point gone since the caller read it is skipped, not an error
        for pids, payload in groups:
            await self._update(q.UpdateOperation.set_payload_by_filter(
                q.Filter(must=[q.HasIdCondition(set(pids))]), payload), len(pids))

    def _with_payload(self, with_embedding: bool, fields: Sequence[str] | None = None) -> Any:
        if fields is not None:
            return q.PayloadSelector.Include(list(fields))
        return True if with_embedding else q.PayloadSelector.Exclude([EMBEDDING])

    async def retrieve(self, pids: Sequence[str], *, with_embedding: bool) -> list[dict[str, Any]]:
        found = self.shard.retrieve(list(pids), self._with_payload(with_embedding), False)
        return [r.payload for r in found if r.payload]

    async def scroll(
        self, must: Sequence[Cond], *, order_by: str | None = None, desc: bool = False,
        limit: int | None = None, with_embedding: bool = False, fields: Sequence[str] | None = None,
    ) -> list[dict[str, Any]]:
        flt = _filter(must)
        payload = self._with_payload(with_embedding, fields)
        if order_by is not None:
            order = q.OrderBy(order_by, q.Direction.Desc if desc else q.Direction.Asc)
            records, _ = self.shard.scroll(q.ScrollRequest(
                limit=limit or 1_000_000, filter=flt, with_payload=payload, with_vector=False, order_by=order))
            return [r.payload for r in records]
        out: list[dict[str, Any]] = []
        offset = None
        page = 1000 if limit is None else min(limit, 1000)
        while True:
            records, offset = self.shard.scroll(q.ScrollRequest(
                offset=offset, limit=page, filter=flt, with_payload=payload, with_vector=False))
            out.extend(r.payload for r in records)
            if offset is None or (limit is not None and len(out) >= limit):
                return out if limit is None else out[:limit]

    async def query(
        self, must: Sequence[Cond], *, dense: list[float] | None, sparse: tuple[list[int], list[float]] | None,
        limit: int, candidates: int, with_embedding: bool,
    ) -> list[Hit]:
        flt = _filter(must)
        payload = self._with_payload(with_embedding)
        legs = []
        if dense is not None:
            legs.append(q.Query.Nearest(dense, using=DENSE))
        params = q.SearchParams(hnsw_ef=max(128, candidates)) if dense is not None else None
        if sparse is not None:
            legs.append(q.Query.Nearest(q.SparseVector(sparse[0], sparse[1]), using=SPARSE))
        if len(legs) == 1:
            request = q.QueryRequest(limit=limit, query=legs[0], filter=flt, with_payload=payload, with_vector=False,
                                     params=params)
        else:
            request = q.QueryRequest(
                limit=limit,
                prefetches=[q.Prefetch(limit=candidates, query=leg, filter=flt, params=params) for leg in legs],
                query=q.Fusion.Rrf(k=RRF_K), filter=flt, with_payload=payload, with_vector=False)
        return [Hit(p.payload, p.score) for p in self.shard.query(request) if p.payload]

    async def count(self, must: Sequence[Cond]) -> int:
        return self.shard.count(q.CountRequest(exact=True, filter=_filter(must)))

    async def facet(self, must: Sequence[Cond], key: str, *, exact: bool) -> list[tuple[str, int]] | None:
        # exact: the shard lists the values, then counts each one's points (a point two segments
        # hold is counted once); otherwise it sums the segments' own counts (under a millisecond)
        found = self.shard.facet(q.FacetRequest(key, limit=FACET_LIMIT, exact=exact, filter=_filter(must)))
        return [(hit.value, hit.count) for hit in found.hits]


def _point(p: PointData) -> Any:
    vector: dict[str, Any] = {}
    if p.dense is not None:
        vector[DENSE] = p.dense
    if p.sparse is not None:
        vector[SPARSE] = q.SparseVector(p.sparse[0], p.sparse[1])
    return q.Point(p.pid, vector, p.payload)
