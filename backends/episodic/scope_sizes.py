"""A short-lived memory of how many records a scope holds, so a recall need not count them each time.

A scope's size decides two things that tolerate being a few seconds stale: the
document count of BM25's IDF (it saturates at `SCOPE_COUNT_CAP`) and whether a
vector recall scans the scope exactly or walks the HNSW graph. Counting costs
a scan of the scope's index and heap (0.8 ms of a 2.6 ms recall over 1,000
rows); an agent recalls in the same scope over and over. A stale size costs
speed, not correctness, in both directions except one: a scope that shrank
below the exact-scan threshold is walked approximately until the entry
expires, so `forget` clears the memory (decision 23).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Any, Sequence

from psycopg import AsyncConnection
from psycopg.types.json import Jsonb

TTL_S = 10.0
MAX_SCOPES = 4096
# Characters of a scope's key (its SQL and values): a `where` of thousands of values would make
# each of MAX_SCOPES entries as large as a request.
MAX_KEY = 4096
SCOPE_COUNT_CAP = 10_000  # a scope's size is counted up to this (the IDF saturates; see vectors.EXACT_SCAN_ROWS)


class ScopeSizes:
    def __init__(self, ttl: float = TTL_S, size: int = MAX_SCOPES) -> None:
        self.ttl = ttl
        self.size = size
        self._entries: OrderedDict[str, tuple[float, int]] = OrderedDict()

    async def count(self, conn: AsyncConnection, condition: str, scope_params: list[Any]) -> int:
        """How many records the scope holds, up to SCOPE_COUNT_CAP + 1 (remembered a few seconds)."""
        key = self.key(condition, scope_params)
        size = self.get(key)
        if size is None:
            cur = await conn.execute(f"SELECT count(*) FROM (SELECT 1 FROM records WHERE {condition} LIMIT %s) c",
                                     [*scope_params, SCOPE_COUNT_CAP + 1])
            size = int((await cur.fetchone() or (0,))[0])
            self.put(key, size)
        return size

    @staticmethod
    def key(condition: str, params: Sequence[Any]) -> str:
        return condition + repr([p.obj if isinstance(p, Jsonb) else p for p in params])

    def get(self, key: str) -> int | None:
        entry = self._entries.get(key)
        if entry is None or entry[0] < time.monotonic():
            return None
        self._entries.move_to_end(key)
        return entry[1]

    def put(self, key: str, count: int) -> None:
        if len(key) > MAX_KEY:  # a scope named by a large filter is counted each time, not held
            return
        self._entries[key] = (time.monotonic() + self.ttl, count)
        self._entries.move_to_end(key)
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)

    def clear(self) -> None:
        self._entries.clear()
