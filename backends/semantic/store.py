"""The semantic store: A2M records as Qdrant points, over either Qdrant engine.

Qdrant has two faces here (Qdrant Edge in-process, a Qdrant server through
qdrant-client), so the A2M logic lives once in `SemanticStore` and talks to a
small `Engine` seam. Filters cross the seam as a tiny neutral form (`Cond`)
that each engine turns into its own filter classes.

Layout of a point:

- point id: UUIDv5 of the A2M id (ids are opaque strings, Qdrant wants UUIDs);
  the A2M id itself is the payload field `id`.
- vectors: `dense` (cosine, width fixed by the first vector) when the record
  has an embedding, and `bm25`, a sparse term-frequency vector from the `a2m`
  tokenizer that the engine weighs with its IDF modifier, so lexical recall
  needs no embedder and folds accents and CJK exactly like every other tier.
- payload: every Record field under its own name, metadata under `metadata`,
  plus `part` (the owner partition: `o:<owner>`, or `n` for no owner, so None
  can never collide with any string owner), `created_ms` (epoch millis, for
  ranges and ordering), `seq` (insertion sequence, tie-break) and `embedding`
  (`embedding_f64`: the caller's vector verbatim, float64 in base64, since
  `dense` holds it as float32, scaled to length 1 where Qdrant could not normalise it:
  `comparable`), and `metadata_json` /
  `salience_repr`, the metadata and salience verbatim, only when they hold a
  float Qdrant Edge would give back an ulp off (`float_survives`).

Every read is additionally checked with `a2m.filters.matches`, so the engine
filter only has to be a superset of the reference semantics (it is exact except
for a metadata value `[]`, which `IsEmpty` treats as null, metadata keys
containing `"`, which cannot be written as a JSON path, a number, matched within
an ulp either side, and on Qdrant Edge a boolean, matched as "present"). A read
that a wider filter left short of its `limit` reads further.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import math
import re
import struct
import time
import uuid
from dataclasses import dataclass
from decimal import Decimal
from functools import lru_cache
from typing import Any, Awaitable, Collection, Literal, Mapping, Protocol, Sequence

import anyio

from a2m.cosine import unit_length
from a2m.filters import RECORD_FIELDS, Scope, matches
from a2m.records import Record
from a2m.text import query_terms, sparse_vector, squash, term_id
from a2m.timefmt import to_epoch
from backends.store import (Position, SessionInfo, StoreConflict, StoreIdTaken, StoreRejected, StoreUnavailable,
                            StoreWidthMismatch)

log = logging.getLogger("a2m.semantic")

NAMESPACE = uuid.UUID("6f1d2a4e-9b7c-5e3a-8d21-a2a2a2a2a2a2")
DENSE = "dense"
SPARSE = "bm25"
RRF_K = 60
EMBEDDING = "embedding_f64"  # payload field holding the verbatim vector
EXACT_METADATA = "metadata_json"  # the metadata verbatim, when a float in it may not survive Qdrant Edge
EXACT_SALIENCE = "salience_repr"  # likewise for salience
DELETE_PAGE = 1000  # records a forget reads (and deletes) at a time

# Payload indexes every engine creates: (field, kind). `part` is the tenant field.
INDEXES: tuple[tuple[str, str], ...] = (
    ("part", "tenant"),
    ("id", "keyword"),
    ("owner", "keyword"),
    ("session", "keyword"),
    ("key", "prefix"),
    ("role", "keyword"),
    ("group", "keyword"),
    ("created_at", "keyword"),
    ("created_ms", "integer"),
    ("seq", "integer"),
    ("accessed_at", "datetime"),  # ordered reads of a session's latest access (`sessions`)
)


_NAMESPACE_BYTES = NAMESPACE.bytes


def point_id(record_id: str) -> str:
    """`str(uuid.uuid5(NAMESPACE, record_id))`, spelled out: the `UUID` object costs
    2 µs of a write's per-record budget, the digest and formatting under 1 µs.

    An id with a lone surrogate (only an in-process caller can send one) has no UTF-8 and so no
    point: StoreRejected (-32602, as the episodic tier answers it), not an internal error."""
    try:
        encoded = record_id.encode("utf-8")
    except UnicodeEncodeError:
        raise StoreRejected(f"id {record_id!r} is not valid Unicode (a lone surrogate)") from None
    digest = bytearray(hashlib.sha1(_NAMESPACE_BYTES + encoded).digest()[:16])
    digest[6] = (digest[6] & 0x0F) | 0x50  # version 5
    digest[8] = (digest[8] & 0x3F) | 0x80  # RFC 4122 variant
    h = digest.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def partition(owner: str | None) -> str:
    return "n" if owner is None else "o:" + owner


# --- the neutral filter form -------------------------------------------------


@dataclass(frozen=True, slots=True)
class Match:
    path: str
    value: str | int | bool


@dataclass(frozen=True, slots=True)
class AnyOf:
    path: str
    values: tuple[str, ...] | tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Range:
    path: str
    gt: float | None = None
    gte: float | None = None
    lt: float | None = None
    lte: float | None = None


@dataclass(frozen=True, slots=True)
class Empty:
    """Absent, null (or `[]`)."""

    path: str


@dataclass(frozen=True, slots=True)
class Prefix:
    path: str
    prefix: str


@dataclass(frozen=True, slots=True)
class HasIds:
    ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Either:
    conds: tuple["Cond", ...]


@dataclass(frozen=True, slots=True)
class Not:
    conds: tuple["Cond", ...]


Cond = Match | AnyOf | Range | Empty | Prefix | HasIds | Either | Not


@dataclass(slots=True)
class PointData:
    pid: str
    payload: dict[str, Any]
    dense: list[float] | None
    sparse: tuple[list[int], list[float]] | None


@dataclass(slots=True)
class Hit:
    payload: dict[str, Any]
    score: float
    order: float | None = None


class Engine(Protocol):
    """What the store needs from Qdrant; both engines implement exactly this."""

    name: str

    async def open(self) -> None: ...
    async def close(self) -> None: ...
    async def ping(self) -> None: ...
    async def dense_width(self) -> int | None: ...
    async def create_dense(self, width: int) -> None: ...
    async def write(self, points: Sequence[PointData], deletes: Sequence[str]) -> None: ...
    async def retrieve(self, pids: Sequence[str], *, with_embedding: bool) -> list[dict[str, Any]]: ...
    async def scroll(
        self, must: Sequence[Cond], *, order_by: str | None = None, desc: bool = False,
        limit: int | None = None, with_embedding: bool = False, fields: Sequence[str] | None = None,
    ) -> list[dict[str, Any]]: ...
    async def query(
        self, must: Sequence[Cond], *, dense: list[float] | None, sparse: tuple[list[int], list[float]] | None,
        limit: int, candidates: int, with_embedding: bool,
    ) -> list[Hit]: ...
    async def count(self, must: Sequence[Cond]) -> int: ...
    async def facet(self, must: Sequence[Cond], key: str, *, exact: bool) -> list[tuple[str, int]] | None:
        """Each value of the keyword field `key` among the points matching `must`, with how many hold
        it (exactly, or as the engine estimates it, which may be off either way), every value, in no
        set order; None where the engine does not serve it cheaply."""
    async def set_payload(self, groups: Sequence[tuple[Sequence[str], dict[str, Any]]]) -> None:
        """Set each group's payload fields on those of its points that still exist (no error for a
        point another replica deleted since it was read)."""
    async def delete(self, pids: Sequence[str]) -> None: ...


# --- scope -> conditions -------------------------------------------------------

_SIMPLE_KEY = re.compile(r"^[A-Za-z0-9_]+$")


class _Impossible(Exception):
    """The scope matches nothing (e.g. `where: {x: []}`): answer without asking the engine."""


def _path(name: str) -> str | None:
    if name in RECORD_FIELDS:
        return name
    if _SIMPLE_KEY.match(name):
        return f"metadata.{name}"
    if '"' in name or "\\" in name:
        return None  # not expressible as a JSON path: left to the post-filter
    return f'metadata."{name}"'


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _option(path: str, value: Any) -> Cond:
    if value is None:
        return Empty(path)
    if _number(value):
        # a Range matches 3 and 3.0 alike, as the reference `==` does. Widened by one float each
        # side: Qdrant Edge may hold a float one ulp off (`float_survives`), and an integer past
        # 2^53 is not exactly its float (local mode compares the two exactly); the post-filter
        # (`matches` over the exact values) narrows it back.
        number = float(value)
        return Range(path, gte=math.nextafter(number, -math.inf), lte=math.nextafter(number, math.inf))
    return Match(path, value)


def _test(path: str, expected: Any) -> Cond:
    if not isinstance(expected, list):
        return _option(path, expected)
    if not expected:
        raise _Impossible
    if len(expected) > 1 and all(isinstance(v, str) for v in expected):
        return AnyOf(path, tuple(expected))
    conds = tuple(_option(path, v) for v in expected)
    return conds[0] if len(conds) == 1 else Either(conds)


@lru_cache(maxsize=4096)
def _millis(ts: str) -> int:
    # cached: every record of a `remember` batch carries the same stamp
    return round(to_epoch(ts) * 1000)


def scope_conditions(scope: Scope) -> list[Cond]:
    """Engine conditions for a scope; the owner partition is always the first."""
    must: list[Cond] = [Match("part", partition(scope.owner))]
    if scope.ids is not None:
        if not scope.ids:
            raise _Impossible
        must.append(HasIds(tuple(point_id(i) for i in scope.ids)))
    if scope.key_prefix is not None:
        # Qdrant matches keyword prefixes natively (`MatchPrefix`, served by a
        # keyword index created with `prefix`); the empty prefix means "has a key".
        must.append(Prefix("key", scope.key_prefix) if scope.key_prefix else Not((Empty("key"),)))
    if scope.after is not None or scope.before is not None:
        must.append(Range(
            "created_ms",
            gt=None if scope.after is None else _millis(scope.after),
            lt=None if scope.before is None else _millis(scope.before),
        ))
    for name, expected in scope.where.items():
        path = _path(name)
        if path is None:
            if isinstance(expected, list) and not expected:
                raise _Impossible
            continue
        must.append(_test(path, expected))
    return must


def _tested_fields(scope: Scope) -> list[str]:
    """The payload fields `matches` reads for this scope (and `seq`, the page order): never the
    content, unless the scope tests it, nor the vector, which make most of a point's payload."""
    fields = {"id", "seq", "owner", "key", "created_at"}
    for name in scope.where:
        if name in RECORD_FIELDS:
            fields.add(name)
            if name == "salience":
                fields.add(EXACT_SALIENCE)
        else:
            fields.update(("metadata", EXACT_METADATA))
    return sorted(fields)


# --- records <-> points ---------------------------------------------------------

_PAYLOAD_FIELDS = ("content", "created_at", "role", "group", "tier", "salience", "access_count",
                   "accessed_at", "owner", "session", "key", "revision", "uri", "media_type")


def to_payload(record: Record, seq: int) -> dict[str, Any]:
    # Null fields are left out (absent and null filter alike): Qdrant Edge spends a
    # few microseconds taking in each payload value, a real share of a write.
    payload: dict[str, Any] = {name: value for name in _PAYLOAD_FIELDS if (value := getattr(record, name)) is not None}
    payload["id"] = record.id
    if record.salience != 0.5 and not float_survives(record.salience):
        payload[EXACT_SALIENCE] = repr(record.salience)
    if record.metadata:
        payload["metadata"] = record.metadata
        if not _floats_survive(record.metadata):
            payload[EXACT_METADATA] = json.dumps(record.metadata, ensure_ascii=False)
    payload["part"] = partition(record.owner)
    payload["created_ms"] = _millis(record.created_at)
    payload["seq"] = seq
    if record.embedding is not None:
        payload[EMBEDDING] = pack_vector(record.embedding)
    return payload


def from_payload(payload: dict[str, Any], *, with_embedding: bool) -> Record:
    return Record(
        id=payload["id"],
        content=payload.get("content") or "",
        created_at=payload["created_at"],
        role=payload.get("role"),
        metadata=(payload.get("metadata") or {}) if (exact := payload.get(EXACT_METADATA)) is None else json.loads(exact),
        group=payload.get("group"),
        tier=payload.get("tier"),
        salience=_salience(payload),
        access_count=int(payload.get("access_count") or 0),
        accessed_at=payload.get("accessed_at"),
        owner=payload.get("owner"),
        session=payload.get("session"),
        key=payload.get("key"),
        revision=int(payload.get("revision") or 1),
        embedding=unpack_vector(payload.get(EMBEDDING)) if with_embedding else None,
        uri=payload.get("uri"),
        media_type=payload.get("media_type"),
    )


def float_survives(value: float) -> bool:
    """Whether Qdrant Edge gives this float back unchanged. Its payload parser (serde_json's default,
    lossy one) is exact only on Clinger's fast path: at most 2^53 as the decimal significand of the
    shortest repr, and a decimal exponent within ±22; elsewhere it may be one ulp off
    (0.39999999999999997 comes back 0.4, 1/3 is fine, 0.9452706955539223 is not)."""
    if value == 0 or not math.isfinite(value):
        return True
    sign, digits, exponent = Decimal(repr(value)).as_tuple()
    return -22 <= int(exponent) <= 22 and int("".join(map(str, digits))) < 2**53


def _floats_survive(metadata: Any) -> bool:
    pending = [metadata]
    while pending:
        value = pending.pop()
        for item in value.values() if isinstance(value, dict) else value:
            kind = type(item)
            if kind is float:
                if not float_survives(item):
                    return False
            elif kind is dict or kind is list:
                pending.append(item)
    return True


def _salience(payload: dict[str, Any]) -> float:
    exact = payload.get(EXACT_SALIENCE)
    return float(payload.get("salience", 0.5)) if exact is None else float(exact)


def salience_payload(value: float) -> dict[str, Any]:
    """The payload update that sets a record's salience (its exact copy replaced or cleared)."""
    return {"salience": value, EXACT_SALIENCE: None if float_survives(value) else repr(value)}


def pack_vector(values: Sequence[float]) -> str:
    """The caller's vector, exactly (float64), as base64: a JSON array of floats costs
    Qdrant Edge ~6 µs per element to take in, a string almost nothing."""
    return base64.b64encode(struct.pack(f"<{len(values)}d", *values)).decode("ascii")


# Lengths between which Qdrant's own float32 normalisation keeps a vector's direction: it normalises only
# a vector whose squared length is at least float32's epsilon (a length of ~3e-4), and past ~1.8e19 the
# squares overflow. Inside them the caller's vector is handed over as it is.
_SAFE_LENGTHS = (1e-3, 1e18)


def comparable(vector: list[float]) -> list[float]:
    """The dense vector Qdrant is given: `vector` itself where Qdrant normalises it right
    (`_SAFE_LENGTHS`), else scaled to length 1 in float64 (`a2m.cosine`).

    Outside those lengths a vector the shared validation accepts lost its direction and scored 0.5
    against every query. The caller's vector is kept verbatim in the payload (`EMBEDDING`), so the
    engine may hold any multiple. Only outside them: scaling every vector cost ~30 µs a record (a
    50,000-record load went from ~5,600 to ~4,650 records/s), the length alone ~2 µs."""
    length = math.hypot(*vector)
    if _SAFE_LENGTHS[0] <= length <= _SAFE_LENGTHS[1] or not length:
        return vector
    return unit_length(vector)


def unpack_vector(packed: str | None) -> list[float] | None:
    if packed is None:
        return None
    raw = base64.b64decode(packed)
    return list(struct.unpack(f"<{len(raw) // 8}d", raw))


def _order_key(payload: dict[str, Any]) -> tuple[int, int, str]:
    return payload["created_ms"], payload["seq"], payload["id"]  # the id: replicas may repeat a seq


SESSION_RECORDS = 32  # records per session from which the per-session reads beat one full read


def _few_sessions(facet: Sequence[tuple[str, int]]) -> bool:
    """Whether `sessions` reads per session. Measured on Qdrant Edge (10,000 and 50,000 records, 20 to
    2,000 sessions an owner), the two ways cost the same at 25 to 35 records a session: per session
    at 44 records, 14 ms against 21; at 22, 148 ms against 130; at 13, 425 ms against 131."""
    return len(facet) * SESSION_RECORDS <= sum(n for _, n in facet)


def query_sparse(text: str) -> tuple[list[int], list[float]] | None:
    """The query side of BM25: each distinct term once; the engine applies IDF."""
    ids = sorted({term_id(t) for t in query_terms(text)})
    return (ids, [1.0] * len(ids)) if ids else None


def engine_error(exc: BaseException) -> Exception:
    """Classify an engine exception: input it cannot store, or the engine being unwell."""
    text = str(exc).lower()
    bad_input = ("dimension", "wrong input", "bad request", "validation", "invalid", "format error",
                 "unprocessable", "status_code=400", "400 ", "422")
    if isinstance(exc, (ValueError, TypeError)) or any(word in text for word in bad_input):
        return StoreRejected(str(exc))
    return StoreUnavailable(f"qdrant: {exc}")


# --- the store -----------------------------------------------------------------------


class SemanticStore:
    """`backends.store.Store` on Qdrant (either engine)."""

    searches_vectors = True

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self.engine = engine.name
        self._opened = False
        self._dims: int | None = None
        self._seq = 0
        # One writer at a time: read-modify-write (touch, reinforce), the lazily fixed
        # vector width and the sequence counter must not interleave.
        self._write_lock = anyio.Lock()
        # Set while a write that puts some records and deletes others (a move replacing a key's
        # holder) is between its two engine updates: reads wait for it, so none sees both records.
        self._split: anyio.Event | None = None

    # lifecycle

    async def open(self) -> None:
        if self._opened:
            return
        await self._guard(self._engine.open())
        self._dims = await self._guard(self._engine.dense_width())
        last = await self._guard(self._engine.scroll([], order_by="seq", desc=True, limit=1, fields=["seq"]))
        self._seq = int(last[0]["seq"]) if last else 0
        await self._repair_keys()
        self._opened = True

    async def _repair_keys(self) -> None:
        """Finish a replace a crash cut in two. A write that puts one id on a key and deletes the
        key's other holder is two engine updates (puts, then deletes); a crash between them leaves
        both records. The version written last (highest `seq`) is the one the write meant to keep."""
        payloads = await self._guard(self._engine.scroll([Not((Empty("key"),))], fields=["id", "part", "key", "seq"]))
        newest: dict[tuple[Any, Any], dict[str, Any]] = {}
        stale: list[str] = []
        for p in payloads:
            slot = (p.get("part"), p.get("key"))
            held = newest.get(slot)
            if held is not None and int(held.get("seq", 0)) > int(p.get("seq", 0)):
                stale.append(p["id"])
                continue
            if held is not None:
                stale.append(held["id"])
            newest[slot] = p
        if stale:
            log.warning("semantic: removing %d record(s) an interrupted replace left beside their key's new "
                        "version", len(stale))
            await self._guard(self._engine.delete([point_id(i) for i in stale]))

    async def close(self) -> None:
        if self._opened:
            self._opened = False
            await self._engine.close()

    async def ping(self) -> None:
        await self._guard(self._engine.ping())

    async def _guard(self, awaitable: Any) -> Any:
        try:
            return await awaitable
        except (StoreRejected, StoreUnavailable):
            raise
        except Exception as exc:  # the engines raise plain Exception / transport errors
            raise engine_error(exc) from exc

    def _next_seq(self) -> int:
        # time-based so replicas writing to one server rarely collide, and monotonic here
        self._seq = max(self._seq + 1, time.time_ns() // 1000)
        return self._seq

    # writes

    async def write(self, puts: Sequence[Record], deletes: Sequence[str] = (), *,
                    expect: Mapping[str, int] | None = None,
                    keep: Mapping[str, Collection[str]] | None = None) -> None:
        async with self._write_lock:
            puts = await self._as_resolved(puts, deletes, expect or {}, keep or {})
            # asked of the engine only for a vector: a text-only write to a Qdrant server pays no round trip
            width = await self.dimensions() if any(r.embedding is not None for r in puts) else self._dims
            for record in puts:
                if record.embedding is None:
                    continue
                if width is None:
                    width = len(record.embedding)
                elif len(record.embedding) != width:
                    raise StoreWidthMismatch(width, len(record.embedding))
            points = [
                PointData(
                    pid=point_id(r.id),
                    payload=to_payload(r, self._next_seq()),
                    dense=None if r.embedding is None else comparable(r.embedding),
                    sparse=sparse_vector(r.content) if r.content else None,
                )
                for r in puts
            ]
            for p in points:
                if p.sparse is not None and not p.sparse[0]:
                    p.sparse = None
            if width is not None and self._dims is None:
                await self._create_dense(width)
            await self._check_homes(puts, deletes)
            put_ids = {p.pid for p in points}
            gone = [pid for pid in dict.fromkeys(point_id(i) for i in deletes) if pid not in put_ids]
            if not (points and gone):
                await self._guard(self._engine.write(points, gone))
                return
            self._split = done = anyio.Event()
            try:
                await self._guard(self._engine.write(points, gone))
            finally:
                self._split = None
                done.set()

    async def _create_dense(self, width: int) -> None:
        """Fix the width with this write's first vector. A replica on the same collection may have
        fixed another width since `dimensions()` asked: Qdrant then refuses the vector's config
        ("already exists"), which is the caller's width mismatch (-32008), not bad input."""
        try:
            await self._guard(self._engine.create_dense(width))
        except StoreRejected:
            held = await self._guard(self._engine.dense_width())
            if held is None or held == width:
                raise
            self._dims = held
            raise StoreWidthMismatch(held, width) from None
        self._dims = width

    async def _settled(self) -> None:
        """Wait while a write is half applied (see `_split`)."""
        split = self._split
        if split is not None:
            await split.wait()

    async def _as_resolved(self, puts: Sequence[Record], deletes: Sequence[str], expect: Mapping[str, int],
                           keep: Mapping[str, Collection[str]]) -> Sequence[Record]:
        """Under the write lock (touch and reinforce take it too): each id in `expect` is as the
        surface resolved the batch (absent for 0, this owner's at that revision otherwise), else
        StoreConflict; the puts in `keep` take those statistics as stored now."""
        wanted = [i for i in dict.fromkeys([*(r.id for r in puts), *deletes]) if i in expect or i in keep]
        if not wanted:
            return puts
        stored = {p["id"]: p for p in await self._guard(self._engine.retrieve([point_id(i) for i in wanted],
                                                                             with_embedding=False))}
        owners = {r.id: r.owner for r in puts}
        for record_id in wanted:
            if record_id not in expect:
                continue
            payload, revision = stored.get(record_id), expect[record_id]
            if revision == 0:
                if payload is not None and (record_id not in owners
                                            or payload.get("part") == partition(owners[record_id])):
                    raise StoreConflict(f"record {record_id!r} was written since this batch was resolved")
                continue  # another owner's: refused as StoreIdTaken by _check_homes
            if payload is None or int(payload.get("revision", 1)) != revision or (
                    record_id in owners and payload.get("part") != partition(owners[record_id])):
                raise StoreConflict(f"record {record_id!r} changed since this batch was resolved")
        out = []
        for record in puts:
            payload, fields = stored.get(record.id), keep.get(record.id, ())
            if fields and payload is not None and payload.get("part") == partition(record.owner):
                now = {"access_count": int(payload.get("access_count") or 0),
                       "accessed_at": payload.get("accessed_at"), "salience": _salience(payload)}
                record = record.with_(**{name: now[name] for name in fields})
            out.append(record)
        return out

    async def _check_homes(self, puts: Sequence[Record], deletes: Sequence[str]) -> None:
        """Under the write lock, before anything changes: no put may take an id another owner holds
        or a key another live record holds (the surface resolved the batch before this lock, and a
        concurrent write, or a replica on the same Qdrant server, may have changed both since)."""
        held = await self.owners([r.id for r in puts])
        for record in puts:
            if record.id in held and held[record.id] != record.owner:
                raise StoreIdTaken(record.id)
        keyed: dict[str | None, list[Record]] = {}
        for record in puts:
            if record.key is not None:
                keyed.setdefault(record.owner, []).append(record)
        gone = set(deletes)
        for owner, records in keyed.items():
            holders = await self.get_keys(owner, [r.key for r in records if r.key is not None])
            for record in records:
                holder = holders.get(record.key or "")
                if holder is not None and holder.id != record.id and holder.id not in gone:
                    raise StoreConflict(record.key)

    async def delete(self, scope: Scope) -> int:
        """Delete the records in scope a page at a time, in `seq` order, reading only the fields the
        scope tests: reading every match whole in one scroll held them all in memory at once and
        stalled the server (Qdrant Edge answers in this thread) past the router's timeout for a
        broad `where` (30,000 records: 2.1 s and 60 MiB). Readers may see a forget half done; it
        still deletes every match that was there when it began, and a retry finishes it."""
        async with self._write_lock:
            try:
                must = scope_conditions(scope)
            except _Impossible:
                return 0
            # Without `where` the engine tests every condition exactly (the owner's partition, ids,
            # a key prefix, `created_ms` against canonical stamps): a page is deleted as read, by
            # its ids alone. (One delete by filter blocked every other call: Qdrant Edge held the
            # GIL for its 1.1 s over 50,000 records.)
            exact = not scope.where
            fields = ["id", "seq"] if exact else _tested_fields(scope)
            removed, after = 0, None
            while True:
                page = await self._guard(self._engine.scroll(
                    must if after is None else [*must, Range("seq", gt=after)], order_by="seq",
                    limit=DELETE_PAGE, fields=fields))
                doomed = [point_id(p["id"]) for p in page
                          if exact or matches(from_payload(p, with_embedding=False), scope)]
                if doomed:
                    await self._guard(self._engine.delete(doomed))
                    removed += len(doomed)
                if len(page) < DELETE_PAGE:
                    return removed
                after = int(page[-1]["seq"])
                await anyio.sleep(0)  # other calls run between pages

    async def touch(self, owner: str | None, ids: Sequence[str], at: str) -> dict[str, int]:
        async with self._write_lock:
            counts = {p["id"]: int(p.get("access_count") or 0) + 1 for p in await self._own(owner, ids)}
            groups: dict[int, list[str]] = {}
            for record_id, n in counts.items():
                groups.setdefault(n, []).append(point_id(record_id))
            if groups:
                await self._guard(self._engine.set_payload(
                    [(pids, {"access_count": n, "accessed_at": at}) for n, pids in groups.items()]))
            return counts

    async def reinforce(self, owner: str | None, ids: Sequence[str], amount: float) -> int:
        async with self._write_lock:
            found = await self._own(owner, ids)
            groups: dict[float, list[str]] = {}
            for p in found:
                value = min(1.0, max(0.0, _salience(p) + amount))
                groups.setdefault(value, []).append(point_id(p["id"]))
            if groups:
                await self._guard(self._engine.set_payload([(pids, salience_payload(v)) for v, pids in groups.items()]))
            return len(found)

    # reads

    async def _own(self, owner: str | None, ids: Sequence[str], *, with_embedding: bool = False) -> list[dict[str, Any]]:
        if not ids:
            return []
        payloads = await self._guard(self._engine.retrieve(
            list(dict.fromkeys(point_id(i) for i in ids)), with_embedding=with_embedding))
        part = partition(owner)
        return [p for p in payloads if p.get("part") == part]

    async def get(self, owner: str | None, ids: Sequence[str], *, with_embeddings: bool = False) -> list[Record]:
        await self._settled()
        by_id = {p["id"]: p for p in await self._own(owner, ids, with_embedding=with_embeddings)}
        return [from_payload(by_id[i], with_embedding=with_embeddings) for i in dict.fromkeys(ids) if i in by_id]

    async def owners(self, ids: Sequence[str]) -> dict[str, str | None]:
        if not ids:
            return {}
        await self._settled()
        payloads = await self._guard(self._engine.retrieve(list(dict.fromkeys(point_id(i) for i in ids)),
                                                           with_embedding=False))
        return {p["id"]: (None if p.get("part") == "n" else str(p.get("part", ""))[2:]) for p in payloads}

    async def get_keys(self, owner: str | None, keys: Sequence[str]) -> dict[str, Record]:
        if not keys:
            return {}
        await self._settled()
        wanted = tuple(dict.fromkeys(keys))
        must: list[Cond] = [Match("part", partition(owner)),
                            AnyOf("key", wanted) if len(wanted) > 1 else Match("key", wanted[0])]
        out: dict[str, dict[str, Any]] = {}
        for p in await self._guard(self._engine.scroll(must)):
            # two versions of a key can only coexist after a crash between a replace's
            # put and delete (repaired at the next open): the one written last wins
            held = out.get(p["key"])
            if held is None or int(p.get("seq", 0)) > int(held.get("seq", 0)):
                out[p["key"]] = p
        return {k: from_payload(p, with_embedding=False) for k, p in out.items()}

    async def select(
        self,
        scope: Scope,
        *,
        order: Literal["asc", "desc"] = "asc",
        limit: int | None = None,
        with_embeddings: bool = False,
    ) -> list[Record]:
        return [r for _, r in await self._select(scope, desc=order == "desc", limit=limit,
                                                 with_embeddings=with_embeddings)]

    async def timeline_page(self, scope: Scope, *, below: Position | None, limit: int | None,
                            with_embeddings: bool = False) -> list[tuple[Record, Position]]:
        """`select` newest first from strictly before `below`: the rest of its (millisecond, seq),
        by id, then of its millisecond by seq, then the milliseconds before it, each read as
        Qdrant orders by one key. Replicas on one Qdrant server count `seq` apart, so two records
        may share one: a tie at the page's end is read whole, and the id orders it."""
        def read(n: int | None, *bounds: Cond) -> Awaitable[list[tuple[dict[str, Any], Record]]]:
            return self._select(scope, desc=True, limit=n, with_embeddings=with_embeddings, bounds=bounds)

        start = None if below is None else (_millis(below[0]), below[1], below[2])  # as _order_key has it
        if start is None:
            pages = await read(limit)
        else:
            same_ms = Range("created_ms", gte=start[0], lte=start[0])
            pages = [pr for pr in await read(None, same_ms, Range("seq", gte=start[1], lte=start[1]))
                     if _order_key(pr[0]) < start]
            for bounds in ((same_ms, Range("seq", lt=start[1])), (Range("created_ms", lt=start[0]),)):
                if limit is not None and len(pages) >= limit:
                    break
                pages += await read(None if limit is None else limit - len(pages), *bounds)
            pages = pages[:limit]
        if limit is not None and len(pages) == limit:
            ms, seq, _ = _order_key(pages[-1][0])
            whole = [pr for pr in await read(None, Range("created_ms", gte=ms, lte=ms), Range("seq", gte=seq, lte=seq))
                     if start is None or _order_key(pr[0]) < start]
            pages = ([pr for pr in pages if _order_key(pr[0])[:2] != (ms, seq)] + whole)[:limit]
        return [(record, (record.created_at, payload["seq"], record.id)) for payload, record in pages]

    async def _select(self, scope: Scope, *, desc: bool, limit: int | None, with_embeddings: bool,
                      bounds: Sequence[Cond] = ()) -> list[tuple[dict[str, Any], Record]]:
        """Records in scope (and the engine conditions `bounds`) in creation order, with payloads."""
        await self._settled()
        try:
            must = [*scope_conditions(scope), *bounds]
        except _Impossible:
            return []
        if limit is None:
            payloads = await self._guard(self._engine.scroll(must, with_embedding=with_embeddings))
        elif limit <= 0:
            return []
        else:
            # Qdrant orders by one payload key: page by created_ms, then re-read the tie
            # group at the page's boundary ordered by seq, so insertion order breaks ties.
            payloads = await self._guard(self._engine.scroll(
                must, order_by="created_ms", desc=desc, limit=limit, with_embedding=with_embeddings))
            if len(payloads) == limit:
                edge = payloads[-1]["created_ms"]
                inside = [p for p in payloads if p["created_ms"] != edge]
                payloads = inside + await self._guard(self._engine.scroll(
                    [*must, Range("created_ms", gte=edge, lte=edge)], order_by="seq", desc=desc,
                    limit=limit - len(inside), with_embedding=with_embeddings))
        records = [(p, from_payload(p, with_embedding=with_embeddings)) for p in payloads]
        records = [(p, r) for p, r in records if matches(r, scope)]
        if limit is not None and len(records) < min(limit, len(payloads)):
            # the engine filter was wider than the scope (see the module docstring):
            # a page is no longer enough, read the whole scope
            return (await self._select(scope, desc=desc, limit=None, with_embeddings=with_embeddings,
                                       bounds=bounds))[:limit]
        records.sort(key=lambda pr: _order_key(pr[0]), reverse=desc)
        return records if limit is None else records[:limit]

    async def search(
        self,
        scope: Scope,
        *,
        text: str | None,
        vector: Sequence[float] | None,
        limit: int,
        with_embeddings: bool = False,
    ) -> list[Record]:
        if limit <= 0:
            return []
        await self._settled()
        sparse = query_sparse(text) if text else None
        dense = comparable([float(x) for x in vector]) if vector is not None else None
        if dense is not None:
            dims = await self.dimensions()
            if dims is None:
                dense = None  # no stored vector to compare with: rank lexically
            elif len(dense) != dims:
                raise StoreWidthMismatch(dims, len(dense))
        if dense is None and sparse is None:
            return []
        try:
            must = scope_conditions(scope)
        except _Impossible:
            return []
        fused = dense is not None and sparse is not None
        ask = limit
        while True:
            hits = await self._guard(self._engine.query(
                must, dense=dense, sparse=sparse, limit=ask, candidates=max(ask * 4, 64),
                with_embedding=with_embeddings))
            found = [(hit, record) for hit in hits
                     if matches(record := from_payload(hit.payload, with_embedding=with_embeddings), scope)]
            # the engine filter can be wider than the scope (module docstring; on Edge a boolean is
            # only "present"): the post-filter then leaves fewer than `limit` of a full page, and
            # the best `limit` in scope may lie further down, so ask for more
            if len(found) >= limit or len(hits) < ask:
                break
            ask *= 4
        out: list[Record] = []
        for hit, record in found[:limit]:
            if fused:
                score = hit.score * RRF_K / 2  # RRF: 1/(k+rank) per list, rank from 0
            elif dense is not None:
                score = (hit.score + 1) / 2  # cosine in [-1, 1]
            else:
                score = squash(hit.score)  # IDF-weighted BM25, unbounded
            record.score = min(1.0, max(0.0, score))
            out.append(record)
        return out

    async def sessions(self, owner: str | None) -> list[SessionInfo]:
        """Per session: its records, earliest `created_at`, latest `created_at` or access.

        Reading every record of the owner that has a session costs ~5 µs a record (210 ms at 50,000
        on Qdrant Edge); an engine with facets answers instead from its indexes, per session: an
        exact facet counts, and three one-point reads ordered by `created_ms` and `accessed_at`
        find the bounds (0.05 to 0.4 ms a session in all: 17 ms for 20 sessions at 50,000 records).
        Which is cheaper depends on the records per session, which the estimated facet tells in
        about a millisecond (`SESSION_RECORDS`).
        Stamps are canonical (`a2m.timefmt`), so the record first by `created_ms` holds the least
        `created_at` and a datetime index orders `accessed_at` as the strings compare."""
        await self._settled()
        part = Match("part", partition(owner))
        estimate = await self._guard(self._engine.facet([part], "session", exact=False))
        if estimate is not None and _few_sessions(estimate):
            counts = await self._guard(self._engine.facet([part], "session", exact=True))
            if counts is not None and _few_sessions(counts):
                return await self._sessions_by_heads(part, counts)
        return await self._sessions_by_scroll(owner)

    async def _sessions_by_heads(self, part: Cond, counts: Sequence[tuple[str, int]]) -> list[SessionInfo]:
        """`sessions` from exact per-session counts and ordered one-point reads. Several reads, like
        the full read's pages: a write between them may show in some and not others. A session whose
        records a forget took since the counts is left out, as the full read would have."""
        infos: list[SessionInfo] = []
        for session, records in counts:
            must = [part, Match("session", session)]
            first = await self._guard(self._engine.scroll(must, order_by="created_ms", limit=1, fields=["created_at"]))
            last = await self._guard(self._engine.scroll(must, order_by="created_ms", desc=True, limit=1,
                                                         fields=["created_at"]))
            if records <= 0 or not first or not last:
                continue
            seen = await self._guard(self._engine.scroll(must, order_by="accessed_at", desc=True, limit=1,
                                                         fields=["accessed_at"]))
            touched = max(last[0]["created_at"], (seen[0].get("accessed_at") or "") if seen else "")
            infos.append(SessionInfo(session, records, first[0]["created_at"], touched))
        return sorted(infos, key=lambda i: (i.opened_at or "", i.session))

    async def _sessions_by_scroll(self, owner: str | None) -> list[SessionInfo]:
        """`sessions` from every record of the owner that has a session (three fields of each)."""
        payloads = await self._guard(self._engine.scroll(
            [Match("part", partition(owner)), Not((Empty("session"),))],
            fields=["session", "created_at", "accessed_at"]))
        infos: dict[str, SessionInfo] = {}
        for p in payloads:
            info = infos.get(p["session"])
            if info is None:
                info = infos[p["session"]] = SessionInfo(p["session"], 0, p["created_at"], p["created_at"])
            info.records += 1
            info.opened_at = min(info.opened_at or p["created_at"], p["created_at"])
            latest = max(p["created_at"], p.get("accessed_at") or "")
            info.touched_at = max(info.touched_at or latest, latest)
        return sorted(infos.values(), key=lambda i: (i.opened_at or "", i.session))

    async def count(self, owner: str | None) -> int:
        await self._settled()
        return await self._guard(self._engine.count([Match("part", partition(owner))]))

    async def dimensions(self) -> int | None:
        """The width fixed by the first vector, asked of the engine again while unknown: a replica on
        the same Qdrant collection may have fixed it since this store opened (once known it never
        changes, so it is kept)."""
        if self._dims is None:
            self._dims = await self._guard(self._engine.dense_width())
        return self._dims
