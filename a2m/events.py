"""The bounded event log with salted, opaque cursors.

A cursor is `<salt>.<seq>`: the salt changes every server start, so a cursor
from another server or an earlier run is recognised as foreign and answered
with `reset: true` instead of silently skipping or repeating events. Polls
advance over events of kinds the caller filtered out, so successive polls
deliver every visible event exactly once, in order.

`seq` counts one owner's events, from a random start: a cursor says nothing
of how much other owners did, and is meaningless under another owner. The
window holds `capacity` events in all; when it is full, the owner holding the
most gives up its oldest, so a tenant writing in bulk pushes out its own
events, not a quiet tenant's few.
"""

from __future__ import annotations

import secrets
from collections import deque
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Iterable

from . import errors
from .errors import A2MError, invalid
from .timefmt import now

EVENT_KINDS = frozenset({"written", "forgotten", "promoted", "consolidated", "session_closed"})
DEFAULT_POLL = 100
MAX_POLL = 1000
SEQ_START_BITS = 40  # an owner's first event is numbered at random below 2**40: far from any other start

Push = Callable[[dict[str, Any]], Awaitable[None]]


@dataclass(slots=True)
class _Subscriber:
    push: Push
    owner: str | None
    kinds: frozenset[str] | None


def parse_kinds(value: Any) -> frozenset[str] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(k, str) for k in value):
        raise invalid("kinds must be an array of event kinds", field="kinds")
    unknown = set(value) - EVENT_KINDS
    if unknown:
        raise invalid(f"unknown event kinds: {sorted(unknown)}", field="kinds", known=sorted(EVENT_KINDS))
    return frozenset(value)


class EventLog:
    def __init__(self, capacity: int = 1024) -> None:
        self.capacity = capacity
        self.salt = secrets.token_hex(6)
        self._logs: dict[str | None, deque[tuple[int, dict[str, Any]]]] = {}  # owner -> (seq, event), oldest first
        self._next: dict[str | None, int] = {}  # owner -> the seq of its next event
        self._size = 0
        # held -> the owners holding that many events (a dict as an ordered set): the largest holder in O(1)
        self._holders: dict[int, dict[str | None, None]] = {}
        self._most = 0
        self._subscribers: dict[object, _Subscriber] = {}

    def _cursor(self, seq: int) -> str:
        return f"{self.salt}.{seq}"

    def _next_seq(self, owner: str | None) -> int:
        """The owner's next seq, starting its count if it has none.

        Counts of owners with nothing in the window are dropped once there are
        twice as many counts as the window holds events, so the log stays
        bounded however many owners pass. A count started again starts at
        another random place: a cursor from before then is then before the
        oldest event or past the newest, and its poll resets instead of
        skipping the new events.
        """
        seq = self._next.get(owner)
        if seq is None:
            if len(self._next) >= 2 * max(self.capacity, 1):
                self._next = {o: n for o, n in self._next.items() if o in self._logs}
            seq = self._next[owner] = secrets.randbits(SEQ_START_BITS) + 1
        return seq

    def head(self, owner: str | None = None) -> str:
        """The cursor of `owner`'s newest event: a poll from it sees only what comes after."""
        return self._cursor(self._next_seq(owner) - 1)

    async def emit(self, kind: str, owner: str | None, **fields: Any) -> dict[str, Any]:
        """Append an event visible to `owner`'s scope and push it to matching subscribers."""
        event = {"kind": kind, "at": now(), **{k: v for k, v in fields.items() if v is not None}}
        seq = self._next_seq(owner)
        self._next[owner] = seq + 1
        if self.capacity > 0:
            self._keep(owner, seq, event)
        for key, sub in list(self._subscribers.items()):
            if sub.owner == owner and (sub.kinds is None or kind in sub.kinds):
                try:
                    await sub.push(event)
                except Exception:  # a dead connection unsubscribes itself
                    self._subscribers.pop(key, None)
        return event

    def _keep(self, owner: str | None, seq: int, event: dict[str, Any]) -> None:
        log = self._logs.setdefault(owner, deque())
        self._recount(owner, len(log), len(log) + 1)
        log.append((seq, event))
        self._size += 1
        if self._size > self.capacity:  # the largest holder (the first to get there) gives up its oldest
            victim = next(iter(self._holders[self._most]))
            dropped = self._logs[victim]
            self._recount(victim, len(dropped), len(dropped) - 1)
            dropped.popleft()
            self._size -= 1
            if not dropped:
                del self._logs[victim]

    def _recount(self, owner: str | None, held: int, holds: int) -> None:
        """Move `owner` from the holders of `held` events to those of `holds` (one more or one fewer)."""
        if held:
            bucket = self._holders[held]
            del bucket[owner]
            if not bucket:
                del self._holders[held]
                if self._most == held:
                    self._most = holds
        if holds:
            self._holders.setdefault(holds, {})[owner] = None
            self._most = max(self._most, holds)

    async def emit_many(self, kind: str, owner: str | None, items: Iterable[dict[str, Any]]) -> None:
        for fields in items:
            await self.emit(kind, owner, **fields)

    def poll(self, cursor: Any, *, limit: Any = None, kinds: Any = None, owner: str | None) -> dict[str, Any]:
        if limit is None:
            limit = DEFAULT_POLL
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
            raise invalid("limit must be a non-negative integer", field="limit")
        limit = MAX_POLL if limit == 0 else min(limit, MAX_POLL)
        wanted = parse_kinds(kinds)
        if cursor is None:
            return {"events": [], "cursor": self.head(owner)}
        if not isinstance(cursor, str):
            raise invalid("cursor must be a string", field="cursor")
        mine = self._logs.get(owner, ())
        upcoming = self._next_seq(owner)
        oldest = mine[0][0] if mine else upcoming
        position = self._parse(cursor)
        reset = position is None or position < oldest - 1 or position >= upcoming
        if reset:
            position = oldest - 1
        out: list[dict[str, Any]] = []
        last = position
        more = False
        for seq, event in mine:
            if seq <= position:
                continue
            if wanted is not None and event["kind"] not in wanted:
                last = seq
                continue
            if len(out) == limit:
                more = True
                break
            out.append(event)
            last = seq
        result: dict[str, Any] = {"events": out, "cursor": self._cursor(last)}
        if more:
            result["more"] = True
        if reset:
            result["reset"] = True
        return result

    def _parse(self, cursor: str) -> int | None:
        """The sequence number of one of this server's cursors, None for anything else (a reset).

        ASCII digits only and at most 20 of them: `str.isdigit` also accepts
        digits `int` refuses ("²"), and `int` refuses strings past 4,300 digits."""
        salt, _, seq = cursor.partition(".")
        if salt != self.salt or not (seq.isascii() and seq.isdigit()) or len(seq) > 20:
            return None
        return int(seq)

    def subscribe(self, key: object, push: Push, *, owner: str | None, kinds: Any = None) -> None:
        self._subscribers[key] = _Subscriber(push, owner, parse_kinds(kinds))

    def unsubscribe(self, key: object) -> bool:
        return self._subscribers.pop(key, None) is not None


class EventMethods:
    """memory/events, events/subscribe and events/unsubscribe over `self.events`, for any service.

    Push needs a transport that carries notifications (`ctx.push`); over plain
    HTTP subscribe answers -32003 and clients poll.
    """

    events: EventLog

    async def events_poll(self, params: dict[str, Any], ctx: Any) -> dict[str, Any]:
        return self.events.poll(params.get("cursor"), limit=params.get("limit"), kinds=params.get("kinds"),
                                owner=ctx.owner(params))

    async def subscribe(self, params: dict[str, Any], ctx: Any) -> dict[str, Any]:
        if ctx.push is None:
            raise A2MError(errors.CAPABILITY_NOT_SUPPORTED, "push needs a connection that carries notifications "
                           "(stdio); poll memory/events over HTTP", {"transport": ctx.transport})
        self.events.subscribe(ctx, ctx.push, owner=ctx.owner(params), kinds=params.get("kinds"))
        return {"subscribed": True}

    async def unsubscribe(self, params: dict[str, Any], ctx: Any) -> dict[str, Any]:
        ctx.owner(params)  # an owner the caller may not name is refused here too (-32005)
        self.events.unsubscribe(ctx)
        return {"subscribed": False}
