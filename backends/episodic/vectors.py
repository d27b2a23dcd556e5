"""Vector recall: the nearest records in scope, by an exact scan or a walk of the HNSW graph.

Which one is decided per recall from the scope's size (`ScopeSizes`, counted
up to `SCOPE_COUNT_CAP` and remembered briefly, decision 23): a scope of at
most `EXACT_SCAN_ROWS` records is read whole, a larger one is walked with
`hnsw.iterative_scan`, the scope inside the walk. Until the first load's index
is built (decision 28), or under `vector_search = "exact"` (a pgvector that
cannot run HNSW on its CPU, decision 17), every recall is an exact scan, the
latter over halfvec casts. Which scans are prepared is decision 20.
"""

from __future__ import annotations

from typing import Any, Sequence

from pgvector import Vector
from psycopg import AsyncConnection

from a2m.filters import Scope
from a2m.records import Record
from backends.store import StoreRejected

from .scope import scope_sql
from .scope_sizes import SCOPE_COUNT_CAP, ScopeSizes

EXACT_SCAN_ROWS = SCOPE_COUNT_CAP  # a vector recall over a scope this small reads every row


# The smallest magnitude float16 rounds to infinity: `vector_search = "exact"` compares `embedding::halfvec`,
# and one stored element past it failed every later vector recall of its scope ("out of range").
HALFVEC_OVERFLOW = 65520.0


def halfvec_range(puts: Sequence[Record]) -> None:
    """StoreRejected for a record whose vector the exact search (`distance`'s halfvec cast) could not
    compare (see HALFVEC_OVERFLOW): a write checks it under `vector_search = "exact"`."""
    for record in puts:
        if record.embedding and max(map(abs, record.embedding)) >= HALFVEC_OVERFLOW:
            raise StoreRejected(
                f"record {record.id!r}: its embedding holds an element of magnitude {HALFVEC_OVERFLOW:g} or "
                "more, which this tier cannot compare: it searches over halfvec (vector_search = \"exact\"), "
                "float16; scale the vector to length 1")


def distance(vector_search: str, dims: int | None) -> str:
    """Cosine distance to the query vector (one parameter), as the index expects it."""
    if vector_search == "hnsw":
        return "embedding <=> %s"
    return f"embedding::halfvec({dims:d}) <=> %s::halfvec({dims:d})"


async def nearest_rows(conn: AsyncConnection, sizes: ScopeSizes, vector_search: str, columns: str, scope: Scope,
                       query: Vector, dims: int | None, pool: int) -> list[tuple[Any, ...]]:
    """The `pool` nearest records in scope, nearest first: `columns`, then the cosine distance.

    A scope of at most `EXACT_SCAN_ROWS` records is scanned exactly: there
    the planner may still pick the HNSW index, and a graph walk that must
    skip 99% of its nodes (one owner of a hundred) found 68% of the true top
    10 at 100,000 rows, slower than reading the owner's rows. Every filter
    narrows the owner's records, so an owner with few enough needs no count
    of the narrower scope. (Counting and scanning in one statement, the
    unneeded scan cut off by a one-time filter, measured no faster:
    planning both scans ate the round trip.)
    """
    condition, scope_params = scope_sql(scope)
    measure = distance(vector_search, dims)
    few = await sizes.count(conn, *scope_sql(Scope(owner=scope.owner))) <= EXACT_SCAN_ROWS
    walk = (vector_search == "hnsw" and not few
            and await sizes.count(conn, condition, scope_params) > EXACT_SCAN_ROWS)
    if vector_search == "hnsw" and not walk:
        measure = f"({measure}) + 0"  # HNSW serves only ORDER BY the bare operator: "+ 0" is the same order
    # ORDER BY the output column, not the expression again: PostgreSQL then computes each distance
    # once (twice read every embedding twice: 3.5 vs 2.1 ms over an owner's 1,000 rows).
    # Over an owner's few records any plan reads few rows, so the scan is prepared (planning was
    # 0.2 of its 0.5 ms). A large owner's narrow scope, or a graph walk, is planned for its values:
    # a generic plan, blind to how many records the owner holds, may read all of them (decision 20).
    cur = await conn.execute(f"SELECT {columns}, {measure} AS d FROM records "
                             f"WHERE {condition} AND embedding IS NOT NULL ORDER BY d LIMIT %s",
                             [query, *scope_params, pool], prepare=few)
    rows = await cur.fetchall()
    rows.sort(key=lambda row: row[-1])  # an iterative index scan in relaxed order may return a few out of order
    return rows
