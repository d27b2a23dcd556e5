"""How many bytes of request bodies a server holds at once (`HTTPSettings.max_body_in_flight`).

Why: each request may carry `max_body` bytes, and `max_connections` requests
may be in progress, so without a budget a server held up to their product
(16 GiB at the router's defaults, 128 GiB at a tier's) and parsing multiplies
it again: 96 callers writing 15 MiB at once took a router to 624 MiB and
growing (161 MiB with the budget), where Kubernetes gives it 1 GiB before an
OOM kill, an outage for every tenant. A request takes its declared
length from the budget before its body is read and gives it back once it is
answered; one that does not fit waits, in order of arrival, with its body left
in the socket (uvicorn stops reading a connection past 64 KiB unread), so a
flood slows its senders instead of growing the process. A body of at most
`SMALL` bytes (a recall, a few records) never waits: it is what uvicorn holds
of any connection anyway, and a recall queued behind a stream of large writes
would be an outage of its own.
"""

from __future__ import annotations

import asyncio
from collections import deque

SMALL = 64 * 1024  # uvicorn's HIGH_WATER_LIMIT: what it reads of a connection before the app does


class BodyBudget:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self._waiting: deque[tuple[int, asyncio.Future[None]]] = deque()

    def take_now(self, size: int) -> int | None:
        """The bytes taken for a body of `size` (a body larger than the whole budget takes all of it,
        so that it still passes, alone), or None where it must wait behind others."""
        size = min(size, self.limit)
        if size > SMALL and (self._waiting or self.held + size > self.limit):
            return None
        self.held += size
        return size

    async def take(self, size: int) -> int:
        """`take_now`, waiting for the bytes where they are held by others (first come, first served:
        a large body is not passed over for ever by small ones)."""
        taken = self.take_now(size)
        if taken is not None:
            return taken
        size = min(size, self.limit)
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (size, granted)
        self._waiting.append(entry)
        try:
            await granted
        except BaseException:
            if granted.done() and not granted.cancelled():  # granted, then cancelled before it ran on
                self.give(size)
            else:
                if entry in self._waiting:  # else `_grant` already dropped it, cancelled
                    self._waiting.remove(entry)
                self._grant()  # those behind it may fit now
            raise
        return size

    def give(self, size: int) -> None:
        self.held -= size
        self._grant()

    def _grant(self) -> None:
        """Hand the bytes to the waits at the head of the queue that fit, in order.

        A wait whose task was cancelled (its deadline) but has not run on yet is still queued, its
        future cancelled: it is dropped, never granted, or a give in the same turn of the loop counted
        its bytes as held for good and raised InvalidStateError into the request that gave them."""
        while self._waiting:
            size, granted = self._waiting[0]
            if granted.done():
                self._waiting.popleft()
                continue
            if self.held + size > self.limit:
                return
            self._waiting.popleft()
            self.held += size
            granted.set_result(None)
