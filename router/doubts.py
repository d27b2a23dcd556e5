"""Writes the router stopped waiting for: which ids may still land in which tier, so that a forget
reaching them is sent there again after they could have landed.

A tier that stalls (stopped, swapping, a long pause) resumes with requests in no fixed order
across connections. A move's write cut off so leaves its record in the source, and the caller is
told nothing failed; a forget of that record, acknowledged while the write was still pending in the
destination, may run there first: the write then brings the record back (found by the crash soak,
tests/router/test_router_chaos.py; tests/router/test_router_doubts.py). A write still queued unread
is no longer run once the router has closed its connection (a2m.http's `client_gone`, decision
143); one the tier had begun, on an engine slower than the router's timeout, lands all the same.
A remember's cut-off part is taken back twice (decision 102), but a write landing later stays too.

So each cut-off write's ids are held per (owner, tier) for DOUBT_S. A forget whose owner has ids in
doubt in a tier is sent to that tier again, limited to those ids, after each of LATE_FORGETS: the
forget's own selector still applies there, so it deletes only what the caller's forget covers. An
id the router writes to that tier again (a caller's client id) is no longer in doubt there: a late
forget must not delete the new record. Decision 142.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Iterable

DOUBT_S = 300.0  # how long a cut-off write is taken to be able to land
LATE_FORGETS = (0.5, 2.0, 8.0, 30.0, 120.0)  # seconds after a forget that it is sent again where ids are in doubt
MAX_DOUBTS = 50_000  # ids held in all; past it the oldest are let go


class Doubts:
    """Ids per (owner, tier) a write the router stopped waiting for may still put there, each until
    DOUBT_S after it was sent. Bounded by MAX_DOUBTS ids in all, the oldest let go first."""

    def __init__(self, ttl: float = DOUBT_S, size: int = MAX_DOUBTS) -> None:
        self.ttl, self.size = ttl, size
        self._until: OrderedDict[tuple[str | None, str, str], float] = OrderedDict()  # oldest first
        self._ids: dict[str | None, dict[str, set[str]]] = {}  # owner -> tier -> ids

    def note(self, owner: str | None, tier: str, ids: Iterable[str]) -> None:
        until = time.monotonic() + self.ttl
        for record_id in ids:
            entry = (owner, tier, record_id)
            self._until.pop(entry, None)
            self._until[entry] = until
            self._ids.setdefault(owner, {}).setdefault(tier, set()).add(record_id)
        while len(self._until) > self.size:
            self._let_go(next(iter(self._until)))

    def settle(self, owner: str | None, tier: str, ids: Iterable[str]) -> None:
        """`ids` were written to `tier` again through the router: no longer in doubt there (a late
        forget would delete the new records). In another tier a stale copy landing is still one."""
        held = self._ids.get(owner, {}).get(tier)
        if held:
            for record_id in held.intersection(ids):
                self._let_go((owner, tier, record_id))

    def held(self, owner: str | None, tier: str, among: Iterable[str] | None = None) -> list[str]:
        """The ids in doubt in `tier` for `owner` (of `among`, where given), oldest first."""
        self._expire()
        held = self._ids.get(owner, {}).get(tier)
        if not held:
            return []
        wanted = held if among is None else held.intersection(among)
        return sorted(wanted, key=lambda i: self._until[(owner, tier, i)])

    def tiers(self, owner: str | None) -> list[str]:
        """The tiers holding ids in doubt for `owner`."""
        self._expire()
        return list(self._ids.get(owner, {}))

    def _expire(self) -> None:
        now = time.monotonic()
        while self._until:
            entry, until = next(iter(self._until.items()))
            if until > now:
                return
            self._let_go(entry)

    def _let_go(self, entry: tuple[str | None, str, str]) -> None:
        self._until.pop(entry, None)
        owner, tier, record_id = entry
        tiers = self._ids.get(owner, {})
        held = tiers.get(tier)
        if held is not None:
            held.discard(record_id)
            if not held:
                del tiers[tier]
                if not tiers:
                    del self._ids[owner]
