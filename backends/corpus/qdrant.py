"""Read an existing Qdrant collection as A2M records: rank by its vectors and by word matches.

The collection is someone else's: nothing here creates, alters or writes it.
A point is a record: its id (an integer or a UUID, as text), the payload field
named `text_field` as content, `created_field` (an RFC 3339 string or Unix
seconds) as `created_at`, and the rest of the payload (or only
`metadata_fields`) as metadata, which `where` filters inside Qdrant.

Text ranking: Qdrant keeps no term statistics, so a text recall asks for the
points whose `text_field` holds any query word (a full-text condition, indexed
when the collection has a text index) and ranks that pool by BM25. On a large
collection the pool is a sample (Qdrant returns matches in id order, not by
relevance): configure an embedder so queries carry a vector, which Qdrant
ranks over the whole collection.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Iterable, Literal, Mapping, Sequence

from a2m.errors import A2MError
from a2m.filters import RECORD_FIELDS, Scope
from a2m.records import Record
from a2m.stopwords import STOPWORDS
from a2m.text import bm25_scores
from a2m.timefmt import format_ts, parse_ts

from backends.store import SessionInfo, StoreRejected, StoreUnavailable

from .common import EPOCH, fuse, visible

TEXT_POOL = 200  # word matches ranked by BM25 per text recall
MAX_QUERY_WORDS = 32
_WORD = re.compile(r"\w+", re.UNICODE)
_STOP = STOPWORDS["en"]
# Qdrant's distance -> the protocol's metric name (describe's `embeddings.metric`).
METRICS = {"Cosine": "cosine", "Dot": "dot", "Euclid": "euclidean", "Manhattan": "manhattan"}
_RANGE_INDEXES = {"datetime", "integer", "float"}


@dataclass(slots=True)
class CollectionSpec:
    collection: str
    text_field: str = "text"
    vector_name: str | None = None  # None: the collection's only dense vector, named or not
    created_field: str | None = None
    metadata_fields: list[str] | None = None  # None: every payload field but text and created
    api_key: str | None = None

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> "CollectionSpec":
        if not options.get("collection"):
            raise SystemExit("corpus: --option collection=NAME is required with a Qdrant --url")
        fields = options.get("metadata_fields")
        if fields is not None and not isinstance(fields, list):
            fields = [f.strip() for f in str(fields).split(",") if f.strip()]

        def text(key: str) -> str | None:
            value = options.get(key)
            return None if value in (None, "") else str(value)

        return cls(collection=str(options["collection"]), text_field=text("text_field") or "text",
                   vector_name=text("vector_name"), created_field=text("created_field"),
                   metadata_fields=None if fields is None else [str(f) for f in fields], api_key=text("api_key"))


def point_id(value: str) -> int | str | None:
    """The Qdrant id an A2M id names (an unsigned integer or a UUID), or None: no point has it."""
    if value.isascii() and value.isdigit():
        number = int(value)
        return number if str(number) == value and number < 2**64 else None
    try:
        return str(uuid.UUID(value))
    except ValueError:
        return None


def _created_at(value: Any) -> str:
    """A payload time as the canonical stamp; anything unreadable is the epoch, like a missing one."""
    try:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return format_ts(datetime.fromtimestamp(value, timezone.utc))
        if isinstance(value, str):
            return format_ts(parse_ts(value))
    except (A2MError, ValueError, OverflowError, OSError):  # a stamp of no known form, or past year 9999
        pass
    return EPOCH


def query_words(text: str | None) -> list[str]:
    """Distinct lower-case words of a query, less English stopwords: each is one full-text condition
    (Qdrant matches whole words, so a word the index would drop costs a scan and finds nothing)."""
    words = dict.fromkeys(w for w in _WORD.findall((text or "").lower()) if len(w) > 1 and w not in _STOP)
    return list(words)[:MAX_QUERY_WORDS]


class CollectionStore:
    """`url` for a Qdrant server; `path` for a directory in qdrant-client's local mode."""

    def __init__(self, spec: CollectionSpec, *, url: str | None = None, path: str | None = None) -> None:
        self.spec = spec
        self.engine = "qdrant (read-only collection)" if url else "qdrant-local (read-only collection)"
        self._url, self._path = url, path
        self._client: Any = None
        self._dims: int | None = None
        self.metric = "cosine"
        self.searches_vectors = True  # settled by open(): False for a collection without dense vectors
        self._ordered = False  # timeline in created_field order (else in id order)

    # ---- lifecycle -------------------------------------------------------------

    async def open(self) -> None:
        from qdrant_client import AsyncQdrantClient

        if self._client is None:
            try:
                self._client = (AsyncQdrantClient(url=self._url, api_key=self.spec.api_key) if self._url
                                else AsyncQdrantClient(path=self._path))
            except RuntimeError as exc:  # local mode: another process holds the directory open
                raise SystemExit(f"corpus: {exc}") from None
        name = self.spec.collection
        if not await self._call(self._client.collection_exists(name)):
            held = sorted(c.name for c in (await self._call(self._client.get_collections())).collections)
            raise SystemExit(f"corpus: no collection {name!r} at {self._url or self._path}; it has {held or 'none'}")
        info = await self._call(self._client.get_collection(name))
        self._settle_vectors(info.config.params.vectors)
        if self.spec.created_field:
            index = (info.payload_schema or {}).get(self.spec.created_field)
            kind = getattr(getattr(index, "data_type", None), "value", None)
            self._ordered = self._url is None or kind in _RANGE_INDEXES  # local mode orders without one
            if not self._ordered:
                import logging

                logging.getLogger("a2m.corpus").warning(
                    "timeline runs in point id order: collection %r has no datetime index on %r",
                    self.spec.collection, self.spec.created_field)

    def _settle_vectors(self, vectors: Any) -> None:
        """Pick the dense vector recalls rank by, or refuse a name the collection does not have."""
        named = vectors if isinstance(vectors, dict) else ({} if vectors is None else {None: vectors})
        name = self.spec.vector_name
        if name is None and len(named) > 1:
            raise SystemExit(f"corpus: collection {self.spec.collection!r} has several vectors "
                             f"{sorted(str(n) for n in named)}: choose one with --option vector_name=NAME")
        if name is not None and name not in named:
            raise SystemExit(f"corpus: collection {self.spec.collection!r} has no vector named {name!r}; "
                             f"it has {sorted(str(n) for n in named) or 'none'}")
        if not named:
            self.searches_vectors = False
            return
        self.spec.vector_name = name if name is not None else next(iter(named))
        params = named[self.spec.vector_name]
        self._dims = params.size
        self.metric = METRICS.get(getattr(params.distance, "value", str(params.distance)), "cosine")

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    async def ping(self) -> None:
        if not await self._call(self.client.collection_exists(self.spec.collection)):
            raise StoreUnavailable(f"collection {self.spec.collection!r} is gone")

    @property
    def client(self) -> Any:
        if self._client is None:
            raise StoreUnavailable("corpus store is not open")
        return self._client

    async def _call(self, pending: Any) -> Any:
        """Await a client call; the engine's failures become the store's two kinds."""
        from qdrant_client.http.exceptions import ResponseHandlingException, UnexpectedResponse

        try:
            return await pending
        except UnexpectedResponse as exc:
            if exc.status_code is not None and 400 <= exc.status_code < 500 and exc.status_code != 404:
                raise StoreRejected(f"qdrant refused the query: {exc.reason_phrase}") from exc
            raise StoreUnavailable(f"qdrant answered {exc.status_code}: {exc.reason_phrase}") from exc
        except (ResponseHandlingException, OSError) as exc:
            raise StoreUnavailable(f"qdrant unreachable: {exc}") from exc
        except ValueError as exc:  # local mode: an unknown collection
            raise StoreUnavailable(str(exc)) from exc

    # ---- points as records -------------------------------------------------------

    def _record(self, point: Any, *, with_embedding: bool) -> Record:
        payload = dict(point.payload or {})
        content = payload.pop(self.spec.text_field, None)
        created = payload.pop(self.spec.created_field, None) if self.spec.created_field else None
        if self.spec.metadata_fields is not None:
            payload = {k: payload[k] for k in self.spec.metadata_fields if k in payload}
        vector = point.vector
        if isinstance(vector, dict):
            vector = vector.get(self.spec.vector_name or "")
        return Record(id=str(point.id), content=content if isinstance(content, str) else "",
                      created_at=_created_at(created), metadata=payload,
                      embedding=[float(x) for x in vector] if with_embedding and isinstance(vector, list) else None)

    def _exposed(self, name: str) -> bool:
        """Whether `where[name]` tests a payload field: a metadata key the records show."""
        if name in RECORD_FIELDS or name in (self.spec.text_field, self.spec.created_field):
            return False
        return self.spec.metadata_fields is None or name in self.spec.metadata_fields

    def _filter(self, scope: Scope, extra: Iterable[Any] = ()) -> Any | None:
        """A Qdrant filter holding at least every point in `scope` (`visible` then checks exactly),
        or None with nothing to filter. Ids no point can have make a filter that matches nothing."""
        from qdrant_client import models as m

        must: list[Any] = list(extra)
        named = scope.named_ids()
        if named is not None:
            must.append(m.HasIdCondition(has_id=[p for p in map(point_id, named) if p is not None]))
        for name, expected in scope.where.items():
            if name == "content":
                must.append(self._any_of(self.spec.text_field, expected))
            elif self._exposed(name):
                must.append(self._any_of(name, expected))
        if self.spec.created_field and (scope.after or scope.before):
            must.append(self._time_range(scope.after, scope.before))
        return m.Filter(must=must) if must else None

    @staticmethod
    def _any_of(key: str, expected: Any) -> Any:
        from qdrant_client import models as m

        options = expected if isinstance(expected, list) else [expected]
        words = [v for v in options if isinstance(v, str)]
        either: list[Any] = [m.FieldCondition(key=key, match=m.MatchAny(any=words))] if words else []
        for value in options:
            if isinstance(value, bool):
                either.append(m.FieldCondition(key=key, match=m.MatchValue(value=value)))
            elif isinstance(value, (int, float)):  # an int payload and a float one compare equal
                either.append(m.FieldCondition(key=key, range=m.Range(gte=value, lte=value)))
        if None in options:  # null or absent (an empty list too: `visible` tells them apart)
            either.append(m.IsEmptyCondition(is_empty=m.PayloadField(key=key)))
        return m.Filter(should=either) if either else m.HasIdCondition(has_id=[])

    def _time_range(self, after: str | None, before: str | None) -> Any:
        """created_field in (after, before), whether it holds RFC 3339 strings or Unix seconds."""
        from qdrant_client import models as m

        key = self.spec.created_field
        seconds = [None if t is None else parse_ts(t).timestamp() for t in (after, before)]
        return m.Filter(should=[
            m.FieldCondition(key=key, range=m.DatetimeRange(gt=after, lt=before)),
            m.FieldCondition(key=key, range=m.Range(gt=seconds[0], lt=seconds[1])),
        ])

    # ---- reads -----------------------------------------------------------------

    async def get(self, owner: str | None, ids: Sequence[str], *, with_embeddings: bool = False) -> list[Record]:
        wanted = [p for p in map(point_id, ids) if p is not None]
        if not wanted:
            return []
        points = await self._call(self.client.retrieve(
            self.spec.collection, ids=wanted, with_payload=True, with_vectors=self._vectors(with_embeddings)))
        return [self._record(p, with_embedding=with_embeddings) for p in points]

    async def get_keys(self, owner: str | None, keys: Sequence[str]) -> dict[str, Record]:
        return {}  # a mounted collection has no A2M keys

    async def owners(self, ids: Sequence[str]) -> dict[str, str | None]:
        return {}  # never written through A2M, so no id can collide

    def _vectors(self, wanted: bool) -> Any:
        if not wanted or not self.searches_vectors:
            return False
        return [self.spec.vector_name] if self.spec.vector_name else True

    async def select(self, scope: Scope, *, order: Literal["asc", "desc"] = "asc", limit: int | None = None,
                     with_embeddings: bool = False) -> list[Record]:
        from qdrant_client import models as m

        if scope.key_prefix is not None:
            return []
        flt = self._filter(scope)
        order_by = (m.OrderBy(key=self.spec.created_field, direction=m.Direction.DESC if order == "desc"
                              else m.Direction.ASC) if self._ordered else None)
        if order_by is not None:  # Qdrant pages an ordered scroll by value, not by offset: one page
            points, _ = await self._call(self.client.scroll(
                self.spec.collection, scroll_filter=flt, limit=limit or await self.count(None), order_by=order_by,
                with_payload=True, with_vectors=self._vectors(with_embeddings)))
            return visible([self._record(p, with_embedding=with_embeddings) for p in points], scope)
        out: list[Record] = []
        offset = None
        while True:  # pages until `limit` records pass the exact check (Qdrant's filter may hold more)
            page = 256 if limit is None else max(limit - len(out), 16)
            points, offset = await self._call(self.client.scroll(
                self.spec.collection, scroll_filter=flt, limit=page, offset=offset,
                with_payload=True, with_vectors=self._vectors(with_embeddings)))
            out += visible([self._record(p, with_embedding=with_embeddings) for p in points], scope)
            if offset is None or (limit is not None and len(out) >= limit):
                break
        if order == "desc":
            out.reverse()  # the timeline turns a newest-first list around: it then shows id order
        return out[:limit] if limit is not None else out

    async def search(self, scope: Scope, *, text: str | None, vector: Sequence[float] | None, limit: int,
                     with_embeddings: bool = False) -> list[Record]:
        from qdrant_client import models as m

        if scope.key_prefix is not None:
            return []
        rankings: list[list[str]] = []
        points: dict[str, Any] = {}
        words = query_words(text)
        if words:
            matches = m.Filter(should=[m.FieldCondition(key=self.spec.text_field, match=m.MatchText(text=w))
                                       for w in words])
            found, _ = await self._call(self.client.scroll(
                self.spec.collection, scroll_filter=self._filter(scope, [matches]), limit=TEXT_POOL,
                with_payload=True, with_vectors=self._vectors(with_embeddings)))
            records = {str(p.id): self._record(p, with_embedding=with_embeddings) for p in found}
            scores = bm25_scores({i: r.content for i, r in records.items()}, text or "")
            rankings.append(sorted(scores, key=lambda i: -scores[i]))
            points |= records
        if vector is not None and self.searches_vectors:
            found = (await self._call(self.client.query_points(
                self.spec.collection, query=list(vector), using=self.spec.vector_name,
                query_filter=self._filter(scope), limit=max(limit * 4, 40), with_payload=True,
                with_vectors=self._vectors(with_embeddings)))).points
            rankings.append([str(p.id) for p in found])
            points |= {str(p.id): self._record(p, with_embedding=with_embeddings) for p in found}
        ranked = [points[i].with_(score=s) for i, s in fuse(rankings)]
        return visible(ranked, scope)[:limit]

    async def sessions(self, owner: str | None) -> list[SessionInfo]:
        return []

    async def count(self, owner: str | None) -> int:
        return int((await self._call(self.client.count(self.spec.collection, exact=True))).count)

    async def dimensions(self) -> int | None:
        return self._dims

    # ---- writes: never (the surface refuses them with -32004 first) -------------

    async def write(self, puts: Sequence[Record], deletes: Sequence[str] = ()) -> None:
        raise StoreRejected("this corpus is read-only")

    async def delete(self, scope: Scope) -> int:
        raise StoreRejected("this corpus is read-only")

    async def touch(self, owner: str | None, ids: Sequence[str], at: str) -> None:
        return None  # access statistics of someone else's collection are not ours to keep

    async def reinforce(self, owner: str | None, ids: Sequence[str], amount: float) -> int:
        return 0
