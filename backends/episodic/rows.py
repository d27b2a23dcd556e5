"""The `records` table's columns, and a Record on each side of them.

Every row a read returns comes through `to_record` and every row a write sends
through `to_row`, so both are plain positional code (see their comments for
what keywords cost). Timestamps leave PostgreSQL already in the wire's form,
and metadata enters jsonb as `dumps` writes it (decision 50: a float of 1e16
and more is stored as its exact value).
"""

from __future__ import annotations

import json
from typing import Any, Iterator, Sequence

import orjson
from pgvector import Vector
from psycopg.types.json import Jsonb

from a2m.records import Record
from a2m.text import tokenize_once

# Timestamps leave PostgreSQL in the wire's canonical form (`a2m.timefmt`): psycopg building an aware
# datetime that Python then formats again was 1.1 of 2.4 ms to read a 200-record session.
CANONICAL_TS = "to_char({} AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')"
COLUMNS = (
    f'id, content, {CANONICAL_TS.format("created_at")}, role, metadata, "group", tier, salience, access_count, '
    f'{CANONICAL_TS.format("accessed_at")}, owner, session, key, revision, uri, media_type'
)
INSERT_COLUMNS = (
    'id, owner, session, role, "group", tier, key, revision, metadata, created_at, salience, '
    "access_count, accessed_at, uri, media_type, content, terms"
)
UPDATE_SET = ", ".join(
    f"{c} = EXCLUDED.{c}"
    for c in ('owner', 'session', 'role', '"group"', 'tier', 'key', 'revision', 'metadata', 'created_at',
              'salience', 'access_count', 'accessed_at', 'uri', 'media_type', 'content', 'terms')
)


def to_record(row: Sequence[Any], *, with_embedding: bool, score: float | None = None) -> Record:
    """A row of `COLUMNS` (then `embedding::text` where `with_embedding`) as a Record."""
    embedding = None
    if with_embedding and row[16] is not None:
        embedding = [float(x) for x in orjson.loads(row[16])]  # pgvector's text form is a JSON array of shortest float32 reprs
    # Positional, in Record's field order (id, content, created_at, role, metadata, group, tier, salience,
    # access_count, accessed_at, owner, session, key, revision, embedding, uri, media_type, score): every row
    # of every read comes through here, and matching 18 keywords cost 0.6 of the call's 1.0 us.
    return Record(row[0], row[1], row[2], row[3], row[4] or {}, row[5], row[6], float(row[7]), int(row[8]), row[9],
                  row[10], row[11], row[12], int(row[13]), embedding, row[14], row[15], score)


def to_row(r: Record, vectors: bool) -> tuple[Any, ...]:
    """The values of `INSERT_COLUMNS` for `r` (and its embedding when the table has the column)."""
    row: tuple[Any, ...] = (
        r.id, r.owner, r.session, r.role, r.group, r.tier, r.key, r.revision,
        Jsonb(r.metadata or {}, dumps=dumps), r.created_at, r.salience, r.access_count, r.accessed_at,
        # terms: BM25 reads counts, not text (decision 26). Sent joined, split by PostgreSQL: no term
        # holds a space, and psycopg dumps a list element by element in Python (a tenth of a write).
        r.uri, r.media_type, r.content, " ".join(tokenize_once(r.content)),
    )
    if vectors:
        row += (None if r.embedding is None else Vector(r.embedding),)
    return row


def dumps(value: Any) -> str:
    """JSON for a jsonb column or containment test. A float whose shortest repr has an exponent
    (|x| >= 1e16) is written as its exact integer value with ".0": jsonb keeps numerics as decimals,
    so "1e+16" came back the int 10000000000000000 and "1.152921504606847e+18" (2.0**60) a different
    number, and `where` compared that decimal, not the float (`matches` compares exactly)."""
    # allow_nan=False: NaN is not JSON, and PostgreSQL would refuse it later with a vaguer message.
    text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return text if "e+" not in text else "".join(_encode_exact(value))  # "e+" in a string: only slower


def _encode_exact(value: Any) -> Iterator[str]:
    """`value` as JSON, floats of 1e16 and more exactly (finite: `dumps` has already refused NaN)."""
    if isinstance(value, float) and abs(value) >= 1e16:
        yield f"{int(value)}.0"
    elif isinstance(value, dict):
        yield "{"
        for i, (k, v) in enumerate(value.items()):
            yield ("," if i else "") + json.dumps(str(k), ensure_ascii=False) + ":"
            yield from _encode_exact(v)
        yield "}"
    elif isinstance(value, (list, tuple)):
        yield "["
        for i, v in enumerate(value):
            if i:
                yield ","
            yield from _encode_exact(v)
        yield "]"
    else:
        yield json.dumps(value, ensure_ascii=False, allow_nan=False)
