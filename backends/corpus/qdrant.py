"""Read an existing Qdrant collection as A2M records: rank by its vectors and by word matches.

The collection is someone else's: nothing here creates, alters or writes it.
A point is a record: its id (an integer or a UUID, as text), the payload field
named `text_field` as content, `created_field` as `created_at`, and the rest of
the payload (or only `metadata_fields`) as metadata, which `where` filters
inside Qdrant. Two options fit the layouts the common frameworks write:
`metadata_field` names a payload object that holds the metadata (LangChain's
`{"page_content": ..., "metadata": {...}}`), and `text_json_key` reads the
content out of a JSON-encoded `text_field` (LlamaIndex's `_node_content`).

Every answer passes the reference `matches` (common.visible), so the filter
sent to Qdrant only has to hold at least the points in scope: where Qdrant's
reading of a value could differ from a record's, the condition is widened or
left out, never narrowed.

Text ranking: Qdrant keeps no term statistics, so a text recall asks for the
points whose `text_field` holds any query word (a full-text condition, indexed
when the collection has a text index) and ranks that pool by BM25. On a large
collection the pool is a sample (Qdrant returns matches in id order, not by
relevance): configure an embedder so queries carry a vector, which Qdrant
ranks over the whole collection.
"""

from __future__ import annotations

import json
import logging
import math
import re
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Iterable, Literal, Mapping, Sequence

from a2m.errors import A2MError
from a2m.filters import RECORD_FIELDS, Scope
from a2m.records import Record
from a2m.stopwords import STOPWORDS
from a2m.text import bm25_scores
from a2m.timefmt import format_ts, parse_ts

from backends.store import Position, StoreRejected, StoreUnavailable

from .common import EPOCH, ReadOnlyStore, fuse, json_safe, visible, visible_placed

TEXT_POOL = 200  # word matches ranked by BM25 per text recall
MAX_QUERY_WORDS = 32
ID_PAGE = 256  # points per page of an id-order scroll with no limit
LOCAL_META = "meta.json"  # what every qdrant-client local-mode directory holds (written when it is made)
_WORD = re.compile(r"\w+", re.UNICODE)
_STOP = STOPWORDS["en"]
# Qdrant's distance -> the protocol's metric name (describe's `embeddings.metric`).
METRICS = {"Cosine": "cosine", "Dot": "dot", "Euclid": "euclidean", "Manhattan": "manhattan"}
_RANGE_INDEXES = {"datetime", "integer", "float"}
# The times a record can show (years 1 to 9999): a payload time outside them shows the epoch.
_FIRST_STAMP, _FIRST_SECOND, _LAST_SECOND = "0001-01-01T00:00:00Z", -62135596800, 253402300799


@dataclass(slots=True)
class CollectionSpec:
    collection: str
    text_field: str = "text"
    vector_name: str | None = None  # None: the collection's only dense vector, named or not
    created_field: str | None = None  # with metadata_field, a key of that object
    metadata_fields: list[str] | None = None  # None: every key but text and created
    metadata_field: str | None = None  # None: the payload itself is the metadata
    text_json_key: str | None = None  # None: text_field holds the content itself
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
                   metadata_fields=None if fields is None else [str(f) for f in fields],
                   metadata_field=text("metadata_field"), text_json_key=text("text_json_key"),
                   api_key=text("api_key"))


def point_id(value: str) -> int | str | None:
    """The Qdrant id an A2M id names (an unsigned integer or a UUID), or None: no point has it.
    Only the spelling a record shows counts: ids are opaque text, and Qdrant reading `007` or an
    upper-case UUID as another spelling of a point's id would answer for an id no record has."""
    if value.isascii() and value.isdigit():
        number = int(value)
        return number if str(number) == value and number < 2**64 else None
    try:
        return value if str(uuid.UUID(value)) == value else None
    except ValueError:
        return None


def payload_time(value: Any) -> datetime | None:
    """A payload value as the time Qdrant's range filter and ordering read in it, or None.

    Text is read with qdrant-client's copy of the engine's formats (RFC 3339, and the
    naive stamps Python's `isoformat()` writes, read as UTC, and bare dates); a number
    is Unix seconds. Reading it any other way would make Qdrant's time filter and the
    record's `created_at` disagree about which records a range holds.
    """
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return datetime.fromtimestamp(value, timezone.utc) if _FIRST_SECOND <= value <= _LAST_SECOND else None
    return _parse_qdrant_time(value) if isinstance(value, str) else None


def _parse_qdrant_time(value: str) -> datetime | None:
    """qdrant-client's copy of the engine's time formats; a module of its local mode, so a
    release that moves it falls back to RFC 3339 alone (naive stamps then read as no time)."""
    try:
        from qdrant_client.local.datetime_utils import parse
    except ImportError:
        try:
            return parse_ts(value)
        except A2MError:
            return None
    return parse(value)


def _created_at(value: Any) -> str:
    """A payload time as the canonical stamp; anything unreadable is the epoch, like a missing one."""
    try:
        moment = payload_time(value)
        return EPOCH if moment is None else format_ts(moment)
    except (ValueError, OverflowError, OSError):  # a stamp whose offset leaves years 1 to 9999
        return EPOCH


_ORIGIN = datetime(1, 1, 1, tzinfo=timezone.utc)


def exact_time(value: Any) -> int:
    """A payload time's place within its millisecond, as a Position's int: microseconds since
    0001-01-01, plus one; 0 for a point with no readable time (it shows the epoch and sorts after
    every point with a time there)."""
    try:
        moment = payload_time(value)
        if moment is None:
            return 0
        moment = moment.replace(tzinfo=timezone.utc) if moment.tzinfo is None else moment
        format_ts(moment)  # what `_created_at` shows: one it cannot show is no time
        return (moment - _ORIGIN) // timedelta(microseconds=1) + 1
    except (ValueError, OverflowError, OSError):
        return 0


def id_order(record_id: str) -> tuple[int, int | str]:
    """A point id's place in the tie-break order: integers by value, then UUIDs by their text."""
    return (0, int(record_id)) if record_id.isdigit() else (1, record_id)


def _epoch_within(after: str | None, before: str | None) -> bool:
    """Whether a record showing the epoch (one with no readable time) falls in (after, before)."""
    return (after is None or after < EPOCH) and (before is None or EPOCH < before)


def query_words(text: str | None) -> list[str]:
    """Distinct lower-case words of a query, less English stopwords: each is one full-text condition
    (Qdrant matches whole words, so a word the index would drop costs a scan and finds nothing)."""
    words = dict.fromkeys(w for w in _WORD.findall((text or "").lower()) if len(w) > 1 and w not in _STOP)
    return list(words)[:MAX_QUERY_WORDS]


def payload_path(*keys: str) -> str | None:
    """Qdrant's name for the payload value under `keys`, one object inside the next.

    Its key syntax reads `a.b` as `b` inside `a` and `a[]` as an array, so a key of
    other than letters, digits, `_` and `-` is quoted; a key holding `"` or `\\` cannot
    be written at all, and gives None: that key cannot be tested inside Qdrant.
    """
    parts = []
    for key in keys:
        if key and all(c.isalnum() or c in "_-" for c in key):
            parts.append(key)
        elif '"' in key or "\\" in key:
            return None
        else:
            parts.append(f'"{key}"')
    return ".".join(parts)


def _equal_to(key: str, value: bool | int | float) -> Any | None:
    """A condition holding every payload value `matches` finds equal to a boolean or a number, or
    None when Qdrant cannot express one. A number is a range one step either side: Qdrant compares
    numbers as doubles, an int payload must meet an equal float (5 meets 5.0), and an integer past
    2**53 (or past 64 bits, which a record shows as the nearest float) must meet its rounding."""
    from qdrant_client import models as m

    if isinstance(value, bool):
        return m.FieldCondition(key=key, match=m.MatchValue(value=value))
    try:
        number = float(value)
    except OverflowError:
        return None
    if not math.isfinite(number):
        return None
    return m.FieldCondition(key=key, range=m.Range(gte=math.nextafter(number, -math.inf),
                                                   lte=math.nextafter(number, math.inf)))


def _any_of(key: str, expected: Any) -> Any | None:
    """A condition holding every point whose `key` passes `where`'s test (`expected` or any of a
    list), or None when some option cannot be expressed and the key cannot narrow the scope."""
    from qdrant_client import models as m

    options = expected if isinstance(expected, list) else [expected]
    words = [v for v in options if isinstance(v, str)]
    either: list[Any] = [m.FieldCondition(key=key, match=m.MatchAny(any=words))] if words else []
    for value in options:
        if value is None:  # null or absent (an empty list too: `visible` tells them apart)
            either.append(m.IsEmptyCondition(is_empty=m.PayloadField(key=key)))
        elif not isinstance(value, str):
            condition = _equal_to(key, value)
            if condition is None:
                return None
            either.append(condition)
    return m.Filter(should=either) if either else m.HasIdCondition(has_id=[])  # any of nothing


def _vector_names(named: dict[Any, Any]) -> str:
    """The dense vectors a collection has, as a start refusal names them: its unnamed one is not
    `'None'` (a name that looked like one to pass), and needs no `vector_name` at all."""
    if not named:
        return "none"
    if list(named) == [None]:
        return "only its unnamed vector: leave --option vector_name out"
    return str(sorted(str(n) for n in named))


class CollectionStore(ReadOnlyStore):
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
        root = (spec.metadata_field,) if spec.metadata_field else ()
        self._root: tuple[str, ...] = root  # where the metadata keys live in the payload
        self._text_key = payload_path(spec.text_field)
        self._created_key = payload_path(*root, spec.created_field) if spec.created_field else None

    # ---- lifecycle -------------------------------------------------------------

    async def open(self) -> None:
        from qdrant_client import AsyncQdrantClient

        self._check_fields()
        if self._client is None:
            self._check_local_directory()
            try:
                self._client = (AsyncQdrantClient(url=self._url, api_key=self.spec.api_key) if self._url
                                else AsyncQdrantClient(path=self._path))
            except RuntimeError as exc:  # local mode: another process holds the directory open
                raise SystemExit(f"corpus: {exc}") from None
        try:
            await self._settle()
        except (StoreUnavailable, StoreRejected) as exc:  # a message at start, not a traceback
            raise SystemExit(f"corpus: collection {self.spec.collection!r} at {self._url or self._path}: {exc}") from None

    def _check_local_directory(self) -> None:
        """Refuse at start a directory that is not qdrant-client's local-mode storage (no `meta.json`:
        a typo, the store's parent or one collection's folder, a semantic tier's Edge shard). Opened as
        it is, local mode writes an empty `meta.json` and a `.lock` into it before finding no
        collection, so a wrong path left files in someone else's folder."""
        if self._path is None or (Path(self._path) / LOCAL_META).is_file():
            return
        held = sorted(p.name for p in Path(self._path).iterdir())[:8]
        raise SystemExit(f"corpus: {self._path} is not a qdrant-client local-mode directory (it has no "
                         f"{LOCAL_META}; it holds {held or 'nothing'}): give the folder passed as "
                         "QdrantClient(path=...)")

    async def _settle(self) -> None:
        """Check the collection the options name, and settle how it is read."""
        name = self.spec.collection
        if not await self._call(self.client.collection_exists(name)):
            held = sorted(c.name for c in (await self._call(self.client.get_collections())).collections)
            raise SystemExit(f"corpus: no collection {name!r} at {self._url or self._path}; it has {held or 'none'}")
        info = await self._call(self.client.get_collection(name))
        self._settle_vectors(info.config.params.vectors)
        await self._check_payload()
        text_index = (info.payload_schema or {}).get(self._text_key or "")
        if self._url and getattr(getattr(text_index, "data_type", None), "value", None) != "text":
            logging.getLogger("a2m.corpus").warning(  # local mode has no indexes: it reads every point anyway
                "text recall reads every point of %r: it has no full-text index on %r (create a payload "
                "index on it with field_schema text)", name, self.spec.text_field)
        if self._created_key:
            index = (info.payload_schema or {}).get(self._created_key)
            kind = getattr(getattr(index, "data_type", None), "value", None)
            self._ordered = self._url is None or kind in _RANGE_INDEXES  # local mode orders without one
            if not self._ordered:
                logging.getLogger("a2m.corpus").warning(
                    "timeline runs in point id order: collection %r has no datetime index on %r",
                    self.spec.collection, self._created_key)

    async def _check_payload(self) -> None:
        """Refuse at start, naming it, a payload field the options name that no point holds: a text field
        that is not there (or holds no text) would mount a corpus whose every record is empty and whose
        text recall finds nothing, and a metadata or time field spelt wrong would be dropped silently. A
        field counts when some point holds it (Qdrant's filter finds the first one, indexed or not); an
        empty collection has nothing to check."""
        from qdrant_client import models as m

        spec = self.spec
        if not (await self._call(self.client.count(spec.collection, exact=False))).count:
            return

        async def holding(*keys: str) -> list[Any]:
            """Values of the payload field under `keys` in the first points that hold one."""
            path = payload_path(*keys)
            if path is None:
                return [None]  # a key Qdrant cannot name: not checked here
            points, _ = await self._call(self.client.scroll(
                spec.collection, scroll_filter=m.Filter(must_not=[m.IsEmptyCondition(is_empty=m.PayloadField(key=path))]),
                limit=16, with_payload=True, with_vectors=False))
            values = []
            for point in points:
                value: Any = point.payload or {}
                for key in keys:
                    value = value.get(key) if isinstance(value, dict) else None
                values.append(value)
            return values

        async def fields() -> str:
            points, _ = await self._call(self.client.scroll(spec.collection, limit=16, with_payload=True,
                                                            with_vectors=False))
            return ", ".join(sorted({str(k) for p in points for k in (p.payload or {})})) or "none"

        def refused(option: str, what: str) -> SystemExit:
            return SystemExit(f"corpus: --option {option}={getattr(spec, option)!r}: {what}")

        name = repr(spec.collection)

        texts = await holding(spec.text_field)
        if not texts:
            raise refused("text_field", f"no point of collection {name} has this payload field (its points hold: "
                                        f"{await fields()})")
        if not any(self._content(v) for v in texts if v is not None) and None not in texts:
            if spec.text_json_key is not None:
                raise refused("text_json_key", f"no {spec.text_field!r} of collection {name} holds a JSON object "
                                                 "with text under this key")
            raise refused("text_field", f"this payload field of collection {name} holds no text (e.g. {texts[0]!r})")
        if spec.metadata_field is not None:
            objects = await holding(spec.metadata_field)
            # LangChain's `add_texts` without metadatas writes `"metadata": null` on every point: the field
            # is the layout's, only empty so far, and its records show no metadata.
            if not any(isinstance(v, dict) for v in objects) and not await self._holds_null(spec.metadata_field):
                raise refused("metadata_field", f"no point of collection {name} holds an object under this "
                                                f"payload field (its points hold: {await fields()})")
        if spec.created_field is not None:
            times = await holding(*self._root, spec.created_field)
            if not times:
                raise refused("created_field", f"no point of collection {name} has this payload field" + (
                    f" inside {spec.metadata_field!r}" if spec.metadata_field else f" (its points hold: {await fields()})"))
            if None not in times and all(_created_at(v) == EPOCH for v in times):
                raise refused("created_field", f"this payload field of collection {name} holds no time Qdrant "
                                                f"reads (e.g. {times[0]!r})")
        for field in spec.metadata_fields or ():
            if not await holding(*self._root, field):
                raise SystemExit(f"corpus: --option metadata_fields names {field!r}, which no point of collection "
                                 f"{name} holds" + (f" inside {spec.metadata_field!r}" if spec.metadata_field
                                                    else f" (its points hold: {await fields()})"))

    async def _holds_null(self, field: str) -> bool:
        """Whether some point holds `field` as null (present, unlike a field no point has)."""
        from qdrant_client import models as m

        path = payload_path(field)
        if path is None:
            return False
        points, _ = await self._call(self.client.scroll(
            self.spec.collection, scroll_filter=m.Filter(must=[m.IsNullCondition(is_null=m.PayloadField(key=path))]),
            limit=1, with_payload=False, with_vectors=False))
        return bool(points)

    def _check_fields(self) -> None:
        """Refuse at start a text or time field Qdrant's filters cannot name (see `payload_path`)."""
        for option, key in (("text_field", self._text_key), ("created_field", self._created_key)):
            if key is None and getattr(self.spec, option) is not None:
                raise SystemExit(f"corpus: {option}={getattr(self.spec, option)!r}: Qdrant cannot filter on a "
                                 "payload key holding '\"' or '\\'")

    def _settle_vectors(self, vectors: Any) -> None:
        """Pick the dense vector recalls rank by, or refuse a name the collection does not have."""
        named = vectors if isinstance(vectors, dict) else ({} if vectors is None else {None: vectors})
        name = self.spec.vector_name
        if name is None and len(named) > 1:
            raise SystemExit(f"corpus: collection {self.spec.collection!r} has several vectors "
                             f"{sorted(str(n) for n in named)}: choose one with --option vector_name=NAME")
        if name is not None and name not in named:
            raise SystemExit(f"corpus: collection {self.spec.collection!r} has no vector named {name!r}; "
                             f"it has {_vector_names(named)}")
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
        payload = point.payload or {}
        metadata = self._metadata(payload)
        created = metadata.pop(self.spec.created_field, None) if self.spec.created_field else None
        if self.spec.metadata_fields is not None:
            metadata = {k: metadata[k] for k in self.spec.metadata_fields if k in metadata}
        return Record(id=str(point.id), content=self._content(payload.get(self.spec.text_field)),
                      created_at=_created_at(created), metadata=json_safe(metadata),
                      embedding=self._embedding(point.vector) if with_embedding else None)

    def _metadata(self, payload: Mapping[str, Any]) -> dict[str, Any]:
        """The object a record's metadata (and its time) comes from: the payload less its text, or
        the `metadata_field` object (none when that holds something else)."""
        if self.spec.metadata_field is None:
            return {k: v for k, v in payload.items() if k != self.spec.text_field}
        inner = payload.get(self.spec.metadata_field)
        return dict(inner) if isinstance(inner, dict) else {}

    def _content(self, value: Any) -> str:
        """The record's content: the text field, or with `text_json_key` that member of the JSON object
        the text field encodes. Anything that is not text reads as no content."""
        if self.spec.text_json_key is not None:
            try:
                node = json.loads(value) if isinstance(value, str) else None
            except ValueError:
                node = None
            value = node.get(self.spec.text_json_key) if isinstance(node, dict) else None
        return value if isinstance(value, str) else ""

    def _embedding(self, vector: Any) -> list[float] | None:
        if isinstance(vector, dict):
            vector = vector.get(self.spec.vector_name or "")
        return [float(x) for x in vector] if isinstance(vector, list) else None

    # ---- scopes as Qdrant filters -------------------------------------------------

    def _filter(self, scope: Scope, extra: Iterable[Any] = ()) -> Any | None:
        """A Qdrant filter holding at least every point in `scope` (`visible` then checks exactly),
        or None with nothing to filter. Ids no point can have make a filter that matches nothing."""
        from qdrant_client import models as m

        must: list[Any] = list(extra)
        named = scope.named_ids()
        if named is not None:
            must.append(m.HasIdCondition(has_id=[p for p in map(point_id, named) if p is not None]))
        for name, expected in scope.where.items():
            key = self._where_key(name, expected)
            condition = None if key is None else _any_of(key, expected)
            if condition is not None:
                must.append(condition)
        if self._created_key and (scope.after or scope.before):
            must.append(self._time_range(scope.after, scope.before))
        return m.Filter(must=must) if must else None

    def _where_key(self, name: str, expected: Any) -> str | None:
        """The payload path `where[name]` tests, or None when Qdrant cannot narrow it: a record field
        other than content, a key the records do not show (`visible` answers those), or content that
        is not the text field verbatim (JSON-encoded, or empty: a point without text shows "")."""
        if name == "content":
            empty = "" in (expected if isinstance(expected, list) else [expected])
            return None if self.spec.text_json_key or empty else self._text_key
        if name in RECORD_FIELDS or name == self.spec.created_field:
            return None
        if self.spec.metadata_fields is not None and name not in self.spec.metadata_fields:
            return None
        if not self._root and name == self.spec.text_field:
            return None
        return payload_path(*self._root, name)

    def _time_range(self, after: str | None, before: str | None) -> Any:
        """created_field in (after, before), whether it holds time text or Unix seconds; when the
        range holds the epoch, also the points with no readable time (they show the epoch)."""
        from qdrant_client import models as m

        key = self._created_key
        seconds = [None if t is None else parse_ts(t).timestamp() for t in (after, before)]
        either = [m.FieldCondition(key=key, range=m.DatetimeRange(gt=after, lt=before)),
                  m.FieldCondition(key=key, range=m.Range(gt=seconds[0], lt=seconds[1]))]
        if _epoch_within(after, before):
            either.append(self._untimed())
        return m.Filter(should=either)

    def _untimed(self) -> Any:
        """The points whose created_field holds no time `payload_time` reads: absent, null, text of no
        known form, seconds past year 9999. Qdrant's ordered scroll skips them."""
        from qdrant_client import models as m

        key = self._created_key
        return m.Filter(must_not=[m.FieldCondition(key=key, range=m.DatetimeRange(gte=_FIRST_STAMP)),
                                  m.FieldCondition(key=key, range=m.Range(gte=_FIRST_SECOND, lte=_LAST_SECOND))])

    def _outside_time(self, scope: Scope) -> bool:
        """Whether no record can be in the scope's time range without reading any: with no
        created_field every record shows the epoch."""
        return self.spec.created_field is None and not _epoch_within(scope.after, scope.before)

    # ---- reads -----------------------------------------------------------------

    async def get(self, owner: str | None, ids: Sequence[str], *, with_embeddings: bool = False) -> list[Record]:
        wanted = [p for p in map(point_id, ids) if p is not None]
        if not wanted:
            return []
        points = await self._call(self.client.retrieve(
            self.spec.collection, ids=wanted, with_payload=True, with_vectors=self._vectors(with_embeddings)))
        return [self._record(p, with_embedding=with_embeddings) for p in points]

    def _vectors(self, wanted: bool) -> Any:
        if not wanted or not self.searches_vectors:
            return False
        return [self.spec.vector_name] if self.spec.vector_name else True

    async def select(self, scope: Scope, *, order: Literal["asc", "desc"] = "asc", limit: int | None = None,
                     with_embeddings: bool = False) -> list[Record]:
        if scope.key_prefix is not None or self._outside_time(scope):
            return []
        if self._ordered and order == "desc" and limit:  # a walk's first page: read as the walk reads it
            return [r for r, _ in await self.timeline_page(scope, below=None, limit=limit,
                                                            with_embeddings=with_embeddings)]
        if self._ordered:
            return await self._by_time(scope, order, limit, with_embeddings)
        out = await self._by_id(self._filter(scope), scope, limit, with_embeddings)
        if order == "desc":
            out.reverse()  # the timeline turns a newest-first list around: it then shows id order
        return out

    async def _by_id(self, flt: Any, scope: Scope, limit: int | None, with_embeddings: bool) -> list[Record]:
        """The first `limit` records in scope in point id order, read page by page until that many
        pass the exact check (Qdrant's filter may hold more)."""
        return [r for r, _ in await self._placed_by_id(flt, scope, limit, with_embeddings)]

    async def _placed_by_id(self, flt: Any, scope: Scope, limit: int | None,
                            with_embeddings: bool) -> list[tuple[Record, int]]:
        """`_by_id`, each record with its exact time (`exact_time`)."""
        out: list[tuple[Record, int]] = []
        offset = None
        while True:
            page = ID_PAGE if limit is None else max(limit - len(out), 16)
            points, offset = await self._call(self.client.scroll(
                self.spec.collection, scroll_filter=flt, limit=page, offset=offset,
                with_payload=True, with_vectors=self._vectors(with_embeddings)))
            out += visible_placed([self._placed(p, with_embeddings) for p in points], scope)
            if offset is None or (limit is not None and len(out) >= limit):
                return out[:limit]

    def _placed(self, point: Any, with_embedding: bool) -> tuple[Record, int]:
        created = self._metadata(point.payload or {}).get(self.spec.created_field) if self.spec.created_field else None
        return self._record(point, with_embedding=with_embedding), exact_time(created)

    async def _by_time(self, scope: Scope, order: Literal["asc", "desc"], limit: int | None,
                       with_embeddings: bool) -> list[Record]:
        """The first `limit` records in scope in created_field order, oldest first, or all of them
        (`select` reads the newest `limit` as a walk's first page, `timeline_page`).

        Qdrant's ordered scroll skips the points with no time it can order by; they show the
        epoch, so when the scope's range holds the epoch they are read by id and placed by
        their stamp (ties at the epoch keep point id order: the lowest ids come first).
        """
        desc = order == "desc"
        timed = await self._timed(self._filter(scope), scope, limit, desc, with_embeddings)
        untimed: list[tuple[Record, int]] = []
        if _epoch_within(scope.after, scope.before):
            untimed = await self._placed_by_id(self._filter(scope, [self._untimed()]), scope, limit, with_embeddings)
        once = {r.id: (r, n) for r, n in untimed + timed}  # once each (a point may hold several times)
        return [r for r, _ in sorted(once.values(), key=self._order, reverse=desc)[:limit]]

    def _order(self, placed: tuple[Record, int]) -> tuple[Any, ...]:
        """Where a record (with its exact time) stands in the timeline, ascending: in created_field
        order, by the time it shows, then its exact time (a point without one after those with one at
        the epoch), then its point id; in point id order where the collection has no time index to
        order by (as `select` reads it there)."""
        record, exact = placed
        if not self._ordered:
            return (id_order(record.id),)
        return record.created_at, exact, id_order(record.id)

    async def timeline_page(self, scope: Scope, *, below: Position | None, limit: int | None,
                            with_embeddings: bool = False) -> list[tuple[Record, Position]]:
        """The newest `limit` records in scope strictly before `below`, in `select(order="desc")`'s
        order, each with its position (docs/extensions.md, the cursor on memory/timeline). A position
        keeps the exact time (`exact_time`) and the point id, so however many points share a
        millisecond, none is skipped or read twice.

        In created_field order a page reads the newest points at or before the position's time by
        Qdrant's ordered scroll (`_timed_before`), and, where those leave the page room, the points
        with no time where the scope's range holds the epoch and the position is not past it: all of
        them, for their highest ids come first. A plain limited timeline is the first page (`select`),
        read this way, so the two agree at a time many points share. In point id order (no time
        index) it reads every point in scope: Qdrant scrolls ids only upwards, so a walk of n points
        by pages of `limit` reads about n * n / (2 * limit) of them (and a plain limited timeline,
        which reads the lowest ids, is not its first page)."""
        if scope.key_prefix is not None or self._outside_time(scope):
            return []
        if self._ordered and limit:
            found = await self._timed_before(scope, below, limit, with_embeddings)
            newer = {r.id for r, n in found if (r.created_at, n) > (EPOCH, 0)}  # before any point with no time
            if (len(newer) < limit and _epoch_within(scope.after, scope.before)
                    and (below is None or below[0] >= EPOCH)):
                found += self._before(await self._placed_by_id(self._filter(scope, [self._untimed()]), scope,
                                                               None, with_embeddings), below)
            every = list({r.id: (r, n) for r, n in found}.values())  # once each (a point may hold several times)
        else:
            every = self._before(await self._placed_by_id(self._filter(scope), scope, None, with_embeddings), below)
        every.sort(key=self._order, reverse=True)
        kept = every[:limit] if limit else every
        return [(r, (r.created_at, n if self._ordered else 0, r.id)) for r, n in kept]

    def _before(self, placed: list[tuple[Record, int]], below: Position | None) -> list[tuple[Record, int]]:
        """The records (with their exact times) that stand strictly before `below` in the timeline."""
        if below is None:
            return placed
        mark = (id_order(below[2]),) if not self._ordered else (below[0], below[1], id_order(below[2]))
        return [p for p in placed if self._order(p) < mark]

    async def _timed_before(self, scope: Scope, below: Position | None, limit: int,
                            with_embeddings: bool) -> list[tuple[Record, int]]:
        """The newest points in scope strictly before `below` (`_timed`): the scroll reads from `below`'s
        microsecond, whose points up to `below` a walk has read already; they are not counted."""
        from qdrant_client import models as m

        extra = []
        if below is not None:  # up to the position's microsecond; one with no time stands at the epoch
            bound = _ORIGIN + timedelta(microseconds=below[1]) if below[1] else parse_ts(EPOCH)
            extra.append(m.Filter(should=[
                m.FieldCondition(key=self._created_key, range=m.DatetimeRange(lt=bound)),
                m.FieldCondition(key=self._created_key, range=m.Range(lt=bound.timestamp()))]))
        return await self._timed(self._filter(scope, extra), scope, limit, True, with_embeddings, below)

    async def _timed(self, flt: Any, scope: Scope, limit: int | None, desc: bool, with_embeddings: bool,
                     below: Position | None = None) -> list[tuple[Record, int]]:
        """The first points in scope of Qdrant's ordered scroll of `flt` (newest first where `desc`)
        strictly before `below`, each with its exact time: at least `limit` of them on this side of
        the last time read, or all there are (`limit` None: all). The last time's points are left
        out unless all were read: the scroll may have stopped among them, and Qdrant orders them no
        further, so which of them come first is the tie order's (`_order`) to say, over all of them.
        The scroll takes no offset: a read that leaves too few is read again, twice as far."""
        from qdrant_client import models as m

        order_by = m.OrderBy(key=self._created_key, direction=m.Direction.DESC if desc else m.Direction.ASC)
        want = max(limit, 16) if limit else await self.count(None) + 1  # all: one read (a point may hold several)
        while True:
            points, _ = await self._call(self.client.scroll(
                self.spec.collection, scroll_filter=flt, limit=want, order_by=order_by,
                with_payload=True, with_vectors=self._vectors(with_embeddings)))
            placed = [self._placed(p, with_embeddings) for p in points]
            if len(points) < want:
                return self._before(visible_placed(placed, scope), below)
            last = placed[-1][1]
            whole = self._before(visible_placed([p for p in placed if (p[1] > last if desc else p[1] < last)],
                                                scope), below)
            if limit and len(whole) >= limit:
                return whole
            want *= 2

    async def search(self, scope: Scope, *, text: str | None, vector: Sequence[float] | None, limit: int,
                     with_embeddings: bool = False) -> list[Record]:
        if scope.key_prefix is not None or self._outside_time(scope):
            return []
        rankings: list[list[str]] = []
        records: dict[str, Record] = {}
        words = query_words(text)
        if words:
            found = await self._word_matches(scope, words, with_embeddings)
            scores = bm25_scores({r.id: r.content for r in found}, text or "")
            rankings.append(sorted(scores, key=lambda i: -scores[i]))
            records |= {r.id: r for r in found}
        if vector is not None and self.searches_vectors:
            found = await self._nearest(scope, vector, max(limit * 4, 40), with_embeddings)
            rankings.append([r.id for r in found])
            records |= {r.id: r for r in found}
        ranked = [records[i].with_(score=s) for i, s in fuse(rankings)]
        return visible(ranked, scope)[:limit]

    async def _word_matches(self, scope: Scope, words: list[str], with_embeddings: bool) -> list[Record]:
        """The first TEXT_POOL points in scope whose text field holds any of `words`."""
        from qdrant_client import models as m

        holds = m.Filter(should=[m.FieldCondition(key=self._text_key, match=m.MatchText(text=w)) for w in words])
        points, _ = await self._call(self.client.scroll(
            self.spec.collection, scroll_filter=self._filter(scope, [holds]), limit=TEXT_POOL,
            with_payload=True, with_vectors=self._vectors(with_embeddings)))
        return [self._record(p, with_embedding=with_embeddings) for p in points]

    async def _nearest(self, scope: Scope, vector: Sequence[float], limit: int, with_embeddings: bool) -> list[Record]:
        """Qdrant's own nearest search over the whole collection, by the collection's distance."""
        found = await self._call(self.client.query_points(
            self.spec.collection, query=list(vector), using=self.spec.vector_name, query_filter=self._filter(scope),
            limit=limit, with_payload=True, with_vectors=self._vectors(with_embeddings)))
        return [self._record(p, with_embedding=with_embeddings) for p in found.points]

    async def count(self, owner: str | None) -> int:
        return int((await self._call(self.client.count(self.spec.collection, exact=True))).count)

    async def dimensions(self) -> int | None:
        return self._dims
