"""A Qdrant server through `qdrant-client` (async), or qdrant-client's local mode.

The same code drives a server (`http://host:6333`) and the local mode
(`AsyncQdrantClient(path=...)`), so the tests exercise this path on every run
without a server. Local mode is a Python re-implementation kept for tests: it
ignores payload indexes and persists point by point in SQLite, so a batch is
atomic only against a server.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from qdrant_client import AsyncQdrantClient, models as m

from .store import (DENSE, EMBEDDING, INDEXES, RRF_K, SPARSE, AnyOf, Cond, Either, Empty, HasIds, Hit, Match, Not,
                    PointData, Prefix, Range)



PAGE = 1000  # points a scroll reads per request from a server
# Local mode sorts every point id of the collection and tests the filter on every point for each
# page it answers, so paging made a full read quadratic: `session/list` over 20,000 points took
# 8.3 s in pages of 1,000. It holds every payload in memory already, so one page costs no more.
LOCAL_PAGE = 1_000_000_000


def _cond(c: Cond) -> Any:
    if isinstance(c, Match):
        return m.FieldCondition(key=c.path, match=m.MatchValue(value=c.value))
    if isinstance(c, AnyOf):
        return m.FieldCondition(key=c.path, match=m.MatchAny(any=list(c.values)))
    if isinstance(c, Range):
        return m.FieldCondition(key=c.path, range=m.Range(gt=c.gt, gte=c.gte, lt=c.lt, lte=c.lte))
    if isinstance(c, Empty):
        return m.IsEmptyCondition(is_empty=m.PayloadField(key=c.path))
    if isinstance(c, Prefix):
        return m.FieldCondition(key=c.path, match=m.MatchPrefix(prefix=c.prefix))
    if isinstance(c, HasIds):
        return m.HasIdCondition(has_id=list(c.ids))
    if isinstance(c, Either):
        return m.Filter(should=[_cond(x) for x in c.conds])
    if isinstance(c, Not):
        return m.Filter(must_not=[_cond(x) for x in c.conds])
    raise TypeError(f"unknown condition {c!r}")


def _filter(must: Sequence[Cond]) -> m.Filter | None:
    return m.Filter(must=[_cond(c) for c in must]) if must else None


def _index_schema(kind: str) -> Any:
    if kind == "tenant":
        return m.KeywordIndexParams(type=m.KeywordIndexType.KEYWORD, is_tenant=True)
    if kind == "prefix":
        return m.KeywordIndexParams(type=m.KeywordIndexType.KEYWORD, prefix=True)
    if kind == "integer":
        return m.IntegerIndexParams(type=m.IntegerIndexType.INTEGER, lookup=True, range=True)
    if kind == "datetime":
        return m.PayloadSchemaType.DATETIME
    return m.PayloadSchemaType.KEYWORD


class ClientEngine:
    """`url` for a server; otherwise `path` (a directory) or `":memory:"` for local mode."""

    def __init__(self, *, url: str | None = None, path: Path | str | None = None,
                 collection: str = "a2m_semantic", api_key: str | None = None) -> None:
        self.name = "qdrant" if url else "qdrant-local"
        self._url, self._path, self._api_key = url, path, api_key
        self.collection = collection
        self._client: AsyncQdrantClient | None = None

    @property
    def client(self) -> AsyncQdrantClient:
        if self._client is None:
            raise RuntimeError("the Qdrant client is closed")
        return self._client

    async def open(self) -> None:
        if self._client is not None:
            return
        if self._url:
            self._client = AsyncQdrantClient(url=self._url, api_key=self._api_key)
        elif self._path in (None, ":memory:"):
            self._client = AsyncQdrantClient(location=":memory:")
        else:
            Path(self._path).mkdir(parents=True, exist_ok=True)
            self._client = AsyncQdrantClient(path=str(self._path))
        if not await self.client.collection_exists(self.collection):
            try:
                await self.client.create_collection(
                    self.collection, vectors_config={},
                    sparse_vectors_config={SPARSE: m.SparseVectorParams(modifier=m.Modifier.IDF)})
            except Exception:
                # another replica may have created it in between
                if not await self.client.collection_exists(self.collection):
                    raise
        if self._url:  # local mode has no payload indexes (and warns about them)
            info = await self.client.get_collection(self.collection)
            for field, kind in INDEXES:
                if field not in (info.payload_schema or {}):
                    await self.client.create_payload_index(self.collection, field, _index_schema(kind))

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.close()

    async def ping(self) -> None:
        await self.client.collection_exists(self.collection)

    async def dense_width(self) -> int | None:
        info = await self.client.get_collection(self.collection)
        vectors = info.config.params.vectors
        if isinstance(vectors, dict) and DENSE in vectors:
            return vectors[DENSE].size
        return None

    async def create_dense(self, width: int) -> None:
        await self.client.create_vector_name(
            self.collection, DENSE,
            m.DenseVectorNameConfig(dense=m.DenseVectorConfig(size=width, distance=m.Distance.COSINE)))

    async def write(self, points: Sequence[PointData], deletes: Sequence[str]) -> None:
        # One request: the server applies the operations in order on the shard's WAL.
        ops: list[Any] = []
        if points:
            ops.append(m.UpsertOperation(upsert=m.PointsList(points=[_point(p) for p in points])))
        if deletes:
            ops.append(m.DeleteOperation(delete=m.PointIdsList(points=list(deletes))))
        if ops:
            await self.client.batch_update_points(self.collection, ops, wait=True)

    async def delete(self, pids: Sequence[str]) -> None:
        await self.client.delete(self.collection, m.PointIdsList(points=list(pids)), wait=True)

    async def set_payload(self, groups: Sequence[tuple[Sequence[str], dict[str, Any]]]) -> None:
        # by an id filter, not by ids: a point gone since the caller read it (another replica forgot
        # it) is skipped, where a list of ids fails the whole request ("No point with id ...")
        ops = [m.SetPayloadOperation(set_payload=m.SetPayload(
                   payload=payload, filter=m.Filter(must=[m.HasIdCondition(has_id=list(pids))])))
               for pids, payload in groups]
        if ops:
            await self.client.batch_update_points(self.collection, ops, wait=True)

    @staticmethod
    def _with_payload(with_embedding: bool, fields: Sequence[str] | None = None) -> Any:
        if fields is not None:
            return list(fields)
        return True if with_embedding else m.PayloadSelectorExclude(exclude=[EMBEDDING])

    async def retrieve(self, pids: Sequence[str], *, with_embedding: bool) -> list[dict[str, Any]]:
        found = await self.client.retrieve(
            self.collection, list(pids), with_payload=self._with_payload(with_embedding), with_vectors=False)
        return [r.payload for r in found if r.payload]

    async def scroll(
        self, must: Sequence[Cond], *, order_by: str | None = None, desc: bool = False,
        limit: int | None = None, with_embedding: bool = False, fields: Sequence[str] | None = None,
    ) -> list[dict[str, Any]]:
        flt = _filter(must)
        payload = self._with_payload(with_embedding, fields)
        if order_by is not None:
            order = m.OrderBy(key=order_by, direction=m.Direction.DESC if desc else m.Direction.ASC)
            records, _ = await self.client.scroll(
                self.collection, scroll_filter=flt, limit=limit or 1_000_000, order_by=order,
                with_payload=payload, with_vectors=False)
            return [r.payload for r in records if r.payload]
        out: list[dict[str, Any]] = []
        offset = None
        page = min(limit or PAGE, PAGE) if self._url else (limit or LOCAL_PAGE)
        while True:
            records, offset = await self.client.scroll(
                self.collection, scroll_filter=flt, limit=page, offset=offset,
                with_payload=payload, with_vectors=False)
            out.extend(r.payload for r in records if r.payload)
            if offset is None or (limit is not None and len(out) >= limit):
                return out if limit is None else out[:limit]

    async def query(
        self, must: Sequence[Cond], *, dense: list[float] | None, sparse: tuple[list[int], list[float]] | None,
        limit: int, candidates: int, with_embedding: bool,
    ) -> list[Hit]:
        flt = _filter(must)
        payload = self._with_payload(with_embedding)
        legs: list[tuple[Any, str]] = []
        if dense is not None:
            legs.append((dense, DENSE))
        # local mode searches exactly (and warns about search params)
        params = m.SearchParams(hnsw_ef=max(128, candidates)) if dense is not None and self._url else None
        if sparse is not None:
            legs.append((m.SparseVector(indices=sparse[0], values=sparse[1]), SPARSE))
        if len(legs) == 1:
            result = await self.client.query_points(
                self.collection, query=legs[0][0], using=legs[0][1], query_filter=flt, limit=limit, search_params=params,
                with_payload=payload, with_vectors=False)
        else:
            result = await self.client.query_points(
                self.collection,
                prefetch=[m.Prefetch(query=v, using=name, limit=candidates, filter=flt, params=params)
                          for v, name in legs],
                query=m.RrfQuery(rrf=m.Rrf(k=RRF_K)), query_filter=flt, limit=limit,
                with_payload=payload, with_vectors=False)
        return [Hit(p.payload, p.score) for p in result.points if p.payload]

    async def count(self, must: Sequence[Cond]) -> int:
        result = await self.client.count(self.collection, count_filter=_filter(must), exact=True)
        return result.count

    async def facet(self, must: Sequence[Cond], key: str, *, exact: bool) -> list[tuple[str, int]] | None:
        # Not served: local mode answers each of the per-session reads that would follow by testing
        # every point, and a server's round trips per session were never measured against one
        # paged scroll; `sessions` reads the partition instead.
        return None


def _point(p: PointData) -> m.PointStruct:
    vector: dict[str, Any] = {}
    if p.dense is not None:
        vector[DENSE] = p.dense
    if p.sparse is not None:
        vector[SPARSE] = m.SparseVector(indices=p.sparse[0], values=p.sparse[1])
    return m.PointStruct(id=p.pid, vector=vector, payload=p.payload)
