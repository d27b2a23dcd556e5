"""The record model, and validation of what a client sends on `memory/remember`.

One `Record` type serves every layer: the wire, the stores, the router. Its
`to_wire` form is the protocol's record table; `from_wire` is the lossless
inverse used by the client and by stores that keep records as JSON.

Validation accepts the move/import extension (docs/extensions.md): a caller may
supply `created_at`, `accessed_at`, `access_count` and `revision`, so a record
moved between tiers or imported from an export keeps its history.

`parse_write` is also where every tier agrees on what is storable: the router
moves records between tiers, so a record one tier accepts must fit every other
engine. Hence the common limits below (no NUL in any text, metadata at most 32
levels deep, counters within JSON's safe integers, vectors within float32 and
16,000 dimensions), each the narrowest of the four engines, refused with -32602
before any write.
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass, field, fields, replace
from typing import Any

from .errors import SCOPE_DENIED, A2MError, invalid
from .timefmt import normalize_ts, now

DEFAULT_SALIENCE = 0.5
# Deeper metadata cannot be served back: orjson refuses to serialise past 254 levels (every read of
# the record would fail) and Qdrant Edge past ~128 (the record could not even be forgotten).
MAX_METADATA_DEPTH = 32
# access_count and revision: JSON's safe integers, so a JavaScript client reads them exactly and Redis's
# HINCRBY, PostgreSQL's bigint and Qdrant's i64 all have room to count on.
MAX_COUNTER = 2**53 - 1
# Embedding values: below this magnitude a double rounds to a finite float32 (pgvector's element type);
# FLT_MAX itself (3.4028234663852886e38, printed back by pgvector as 3.4028235e38) is accepted.
FLOAT32_BOUND = 2.0**128 - 2.0**103
# key, session and group: PostgreSQL indexes (owner, session, ...) and (owner, key) in a b-tree, whose
# entries hold at most 2,704 bytes; a longer value is refused there, so a record written to working
# with one could never spill. 1,024 bytes each leaves room for an owner as long beside it.
MAX_NAME_BYTES = 1024
# A stored vector's width: pgvector's `vector` holds at most 16,000 dimensions, so a wider record written
# to working or semantic (Redis and Qdrant take more) could never spill to episodic. Query vectors are
# not capped: one of another width than the tier stores is -32008 there, as any mismatch.
MAX_DIMENSIONS = 16_000


@dataclass(slots=True)
class Record:
    id: str
    content: str
    created_at: str
    role: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    group: str | None = None
    tier: str | None = None
    salience: float = DEFAULT_SALIENCE
    access_count: int = 0
    accessed_at: str | None = None
    owner: str | None = None
    session: str | None = None
    key: str | None = None
    revision: int = 1
    embedding: list[float] | None = None
    uri: str | None = None
    media_type: str | None = None
    score: float | None = None

    def to_wire(self, *, embeddings: bool = False, tier: str | None = None) -> dict[str, Any]:
        """The protocol form. `embedding` only when asked; `score` only when set (recall).

        Spelled out rather than reflected over fields: a timeline serialises
        every record of a session on the hottest path there is.
        """
        out = {
            "id": self.id, "content": self.content, "created_at": self.created_at, "role": self.role,
            "metadata": self.metadata, "group": self.group, "tier": tier if tier is not None else self.tier,
            "salience": self.salience, "access_count": self.access_count, "accessed_at": self.accessed_at,
            "owner": self.owner, "session": self.session, "key": self.key, "revision": self.revision,
            "uri": self.uri, "media_type": self.media_type,
        }
        if embeddings:
            out["embedding"] = self.embedding
        if self.score is not None:
            out["score"] = self.score
        return out

    def to_dict(self) -> dict[str, Any]:
        """Every field, embedding included: the form stores and exports keep."""
        out = self.to_wire(embeddings=True)
        out.pop("score", None)
        return out

    def with_(self, **changes: Any) -> "Record":
        return replace(self, **changes)

    def scored(self, score: float) -> "Record":
        """A copy with `score` set: what fusion makes of every candidate, so spelled out
        (`replace` walks the fields by name, several times slower)."""
        return Record(self.id, self.content, self.created_at, self.role, self.metadata, self.group, self.tier,
                      self.salience, self.access_count, self.accessed_at, self.owner, self.session, self.key,
                      self.revision, self.embedding, self.uri, self.media_type, score)

    @classmethod
    def from_wire(cls, data: dict[str, Any], *, tier: str | None = None) -> "Record":
        """Trusting inverse of `to_wire`/`to_dict` (for data this code wrote, or a server returned).

        Positional on purpose: it runs for every record of every reply, and the
        keys of a dict orjson decoded are not interned, which makes keyword
        matching cost twice the whole positional call.
        """
        record = cls(*map(data.get, _ALL_FIELDS))
        if record.metadata is None:
            record.metadata = {}
        if record.salience is None:
            record.salience = DEFAULT_SALIENCE
        if record.access_count is None:
            record.access_count = 0
        if record.revision is None:
            record.revision = 1
        if record.content is None:
            record.content = ""
        if record.created_at is None:
            record.created_at = now()
        if tier is not None:
            record.tier = tier
        return record


_ALL_FIELDS = tuple(f.name for f in fields(Record))
_WIRE_FIELDS = tuple(n for n in _ALL_FIELDS if n not in ("embedding", "score"))


def new_id() -> str:
    return uuid.uuid4().hex


def _opt_str(raw: dict[str, Any], name: str, index: int) -> str | None:
    value = raw.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise invalid(f"records[{index}].{name} must be a string", field=name, index=index)
    if "\x00" in value:
        raise _nul(name, index)
    return value


def _name(raw: dict[str, Any], name: str, index: int) -> str | None:
    """A key, session or group: a string without NUL of at most MAX_NAME_BYTES in UTF-8."""
    value = _opt_str(raw, name, index)
    if value is not None and len(value) * 4 > MAX_NAME_BYTES and len(value.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        raise invalid(f"records[{index}].{name} is longer than {MAX_NAME_BYTES} bytes (UTF-8)", field=name,
                      index=index, max=MAX_NAME_BYTES)
    return value


def _nul(name: str, index: int) -> A2MError:
    """No text of a record may hold NUL: PostgreSQL cannot store it, so no tier accepts it (a working
    record with NUL could never spill). Checked with one C-level search per field."""
    return invalid(f"records[{index}].{name} must not contain NUL (\\u0000)", field=name, index=index)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _vector_element(value: Any) -> bool:
    """A number every engine stores as a vector element: finite and within float32's range.

    Compared, not converted: a huge int stays exact (no OverflowError) and NaN fails the comparison."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and -FLOAT32_BOUND < value < FLOAT32_BOUND


_FLOATS = frozenset((float,))
_PLAIN_NUMBERS = frozenset((float, int))


def _plain_kinds(value: list[Any]) -> frozenset[type] | None:
    """The element types when every element is an exact `float`/`int` within float32's range, else None.

    Why: a 384-dim vector checked element by element costs ~50 µs, a large
    share of a semantic write. Two C-level passes (the set of types, and
    `math.hypot`: its result bounds every element's magnitude, and a NaN or an
    infinity anywhere makes it NaN or infinite) decide the common case. None is
    not "invalid": a subclass (bool), a norm past the bound or a huge int falls
    through to the element-wise check, which keeps the exact behaviour and messages.
    """
    kinds = frozenset(map(type, value))
    if not kinds <= _PLAIN_NUMBERS:
        return None
    try:
        return kinds if math.hypot(*value) < FLOAT32_BOUND else None
    except OverflowError:
        return None


def validate_embedding(value: Any, where: str = "embedding", index: int | None = None) -> list[float]:
    """A vector as floats; -32602 unless it is a non-empty array of numbers each within float32's
    finite range (pgvector stores float32 and refuses more; the other tiers must not accept more)."""
    if isinstance(value, list) and value and (kinds := _plain_kinds(value)) is not None:
        return list(value) if kinds == _FLOATS else [float(x) for x in value]
    if not isinstance(value, list) or not value or not all(_vector_element(x) for x in value):
        detail: dict[str, Any] = {"field": "embedding"} if index is None else {"field": "embedding", "index": index}
        raise invalid(f"{where} must be a non-empty array of finite numbers within float32's range", **detail)
    return [float(x) for x in value]


def _check_metadata(metadata: dict[str, Any], index: int) -> bool:
    """Refuse metadata nested deeper than MAX_METADATA_DEPTH, or with a NUL in any key or string;
    True when it holds a negative zero (see `_signless`).

    Why: PostgreSQL's jsonb cannot hold NUL, and past a few hundred levels no
    serialiser can answer a read, so such metadata would be stored by some tiers
    and refused (or made unreadable) by others. jsonb has no -0.0 either: the
    episodic tier read it back as 0.0 while the others kept the sign, so a
    spill or a restore changed it; every tier now stores 0.0 (decision 56). A
    flat object of plain values (the usual case, on the write path) is one
    loop; anything else is walked.
    """
    nested: list[tuple[Any, int]] = []
    signed = False
    try:
        for key, value in metadata.items():
            if "\x00" in key:
                raise _metadata_nul(index)
            kind = type(value)
            if kind is str:
                if "\x00" in value:
                    raise _metadata_nul(index)
            elif kind is float:
                signed = signed or (value == 0.0 and math.copysign(1.0, value) < 0)
            elif kind is not int and kind is not bool and value is not None:
                nested.append((value, 2))
    except TypeError:  # a key that is not a string (only possible in-process)
        raise invalid(f"records[{index}].metadata keys must be strings", field="metadata", index=index) from None
    if nested:
        signed = _check_nested(nested, index) or signed
    return signed


def _check_nested(pending: list[tuple[Any, int]], index: int) -> bool:
    """The walk behind `_check_metadata`: (value, depth) pairs, iteratively (no recursion limit to hit)."""
    signed = False
    while pending:
        value, depth = pending.pop()
        if isinstance(value, str):
            if "\x00" in value:
                raise _metadata_nul(index)
            continue
        if type(value) is float:
            signed = signed or (value == 0.0 and math.copysign(1.0, value) < 0)
            continue
        if not isinstance(value, (dict, list)):
            continue
        if depth > MAX_METADATA_DEPTH:
            raise invalid(f"records[{index}].metadata is nested deeper than {MAX_METADATA_DEPTH} levels",
                          field="metadata", index=index, max=MAX_METADATA_DEPTH)
        if isinstance(value, dict):
            for key in value:
                if not isinstance(key, str):
                    raise invalid(f"records[{index}].metadata keys must be strings", field="metadata", index=index)
                if "\x00" in key:
                    raise _metadata_nul(index)
            value = value.values()
        pending.extend((child, depth + 1) for child in value)
    return signed


def _signless(value: Any) -> Any:
    """A copy of `value` with every -0.0 as 0.0 (the caller's objects are left as they were).
    Recursive: only called on metadata `_check_metadata` has bounded in depth."""
    if type(value) is float:
        return 0.0 if value == 0.0 else value
    if isinstance(value, dict):
        return {k: _signless(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_signless(v) for v in value]
    return value


def _metadata_nul(index: int) -> A2MError:
    return invalid(f"records[{index}].metadata must not contain NUL (\\u0000) in a key or a string",
                   field="metadata", index=index)


def _counter(raw: dict[str, Any], name: str, default: int, least: int, index: int) -> int:
    """An integer field of the move/import extension, in [least, MAX_COUNTER]."""
    value = raw.get(name)
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or not least <= value <= MAX_COUNTER:
        kind = "non-negative" if least == 0 else "positive"
        raise invalid(f"records[{index}].{name} must be a {kind} integer of at most 2**53 - 1",
                      field=name, index=index, max=MAX_COUNTER)
    return value


def parse_write(raw: Any, index: int, *, owner: str | None, stamp: str | None = None) -> Record:
    """Validate one record of a `memory/remember` batch into a `Record`.

    `owner` is the request's scope; a record that names a different owner is
    refused rather than silently re-owned. Raises `-32602` naming the field and
    the record's index, so a client can fix the one bad record of a batch.
    """
    if not isinstance(raw, dict):
        raise invalid(f"records[{index}] must be an object", index=index)
    content = raw.get("content")
    uri = _opt_str(raw, "uri", index)
    if content is None and uri is not None:
        content = ""
    if not isinstance(content, str):
        raise invalid(f"records[{index}].content is required and must be a string", field="content", index=index)
    if "\x00" in content:
        raise _nul("content", index)
    record_id = raw.get("id")
    if record_id is not None and (not isinstance(record_id, str) or not record_id or len(record_id) > 512):
        raise invalid(f"records[{index}].id must be a non-empty string of at most 512 characters", field="id", index=index)
    if record_id is not None and "\x00" in record_id:
        raise _nul("id", index)
    metadata = raw.get("metadata")
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict):
        raise invalid(f"records[{index}].metadata must be an object", field="metadata", index=index)
    if metadata and _check_metadata(metadata, index):
        metadata = _signless(metadata)
    record_owner = _opt_str(raw, "owner", index)
    if record_owner is not None and owner is not None and record_owner != owner:
        # Protocol §7: a client-supplied owner that disagrees with the call's scope is refused -32005.
        raise A2MError(SCOPE_DENIED, f"records[{index}].owner disagrees with the request's owner",
                       {"field": "owner", "index": index})
    if record_owner is None and owner is not None and "\x00" in owner:
        raise _nul("owner", index)  # the request's owner becomes the record's
    key, session, group = (_name(raw, name, index) for name in ("key", "session", "group"))
    for name, value in (("key", key), ("session", session), ("group", group)):
        if value == "":  # an empty name is none that fetch, session/close or a group's move could use
            raise invalid(f"records[{index}].{name} must not be empty", field=name, index=index)
    salience = raw.get("salience")
    if salience is None:
        salience = DEFAULT_SALIENCE
    elif not _number(salience) or not 0 <= salience <= 1:
        raise invalid(f"records[{index}].salience must be a number in [0, 1]", field="salience", index=index)
    access_count = _counter(raw, "access_count", 0, 0, index)
    revision = _counter(raw, "revision", 1, 1, index)
    created_at = raw.get("created_at")
    created_at = now() if created_at is None and stamp is None else (
        stamp if created_at is None else normalize_ts(created_at, f"records[{index}].created_at"))
    accessed_at = raw.get("accessed_at")
    if accessed_at is not None:
        accessed_at = normalize_ts(accessed_at, f"records[{index}].accessed_at")
    embedding = raw.get("embedding")
    if embedding is not None:
        embedding = validate_embedding(embedding, f"records[{index}].embedding", index)
        if len(embedding) > MAX_DIMENSIONS:
            raise invalid(f"records[{index}].embedding has {len(embedding)} dimensions; a record's vector may have "
                          f"at most {MAX_DIMENSIONS} (the episodic tier's engine, pgvector, stores no more)",
                          field="embedding", index=index)
    return Record(
        id=record_id or new_id(),
        content=content,
        created_at=created_at,
        role=_opt_str(raw, "role", index),
        metadata=metadata,
        group=group,
        tier=_opt_str(raw, "tier", index),
        salience=float(salience),
        access_count=access_count,
        accessed_at=accessed_at,
        owner=record_owner if record_owner is not None else owner,
        session=session,
        key=key,
        revision=revision,
        embedding=embedding,
        uri=uri,
        media_type=_opt_str(raw, "media_type", index),
    )


def supplied_history(raw: dict[str, Any]) -> bool:
    """True when the caller used the move/import extension for `revision` (a move, not a new write)."""
    return isinstance(raw, dict) and raw.get("revision") is not None
