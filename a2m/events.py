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

Order: the events of one call are appended together (`emit_many`), with no
await between them, so a concurrent call's events never land among them; and
each subscriber is pushed its events from one queue, one push at a time, in the
order they were appended. A push is an awaitable (an in-process callback may
yield): appended and pushed one at a time, a writer waiting on its first push
let a later write of the same key append and push its revision before the
earlier one's.
"""

from __future__ import annotations

import asyncio
import contextvars
import secrets
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Iterable

from . import errors
from .errors import A2MError, invalid
from .timefmt import now

EVENT_KINDS = frozenset({"written", "forgotten", "promoted", "consolidated", "session_closed"})
DEFAULT_POLL = 100
MAX_POLL = 1000
SEQ_START_BITS = 40  # an owner's first event is numbered at random below 2**40: far from any other start

Push = Callable[[dict[str, Any]], Awaitable[None]]


@dataclass(slots=True, eq=False)
class _Subscriber:
    """One connection's subscription and its delivery queue: events wait here in log order, and
    one caller at a time (`EventLog._deliver`) pushes them, so pushes never overtake each other."""

    push: Push
    owner: str | None
    kinds: frozenset[str] | None
    queue: deque[dict[str, Any]] = field(default_factory=deque)
    queued: int = 0  # events ever queued
    delivered: int = 0  # events taken off the queue (pushed, or dropped with a dead connection)
    busy: bool = False  # a caller is pushing
    owed: int = 0  # what an emit made from inside a push left for the pusher to deliver
    dead: bool = False
    progress: asyncio.Event = field(default_factory=asyncio.Event)  # set (and replaced) as deliveries go

    def wake(self) -> None:
        self.progress.set()
        self.progress = asyncio.Event()


# The subscribers this task is pushing to now: an emit from inside a push (a callback that writes)
# must not wait for its own event, which the push it runs in delivers once it returns.
_PUSHING: contextvars.ContextVar[frozenset[_Subscriber]] = contextvars.ContextVar("a2m_events_pushing",
                                                                                 default=frozenset())


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
        return (await self.emit_many(kind, owner, [fields]))[0]

    async def emit_many(self, kind: str, owner: str | None, items: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
        """Append one event per item, all at once (no other call's event lands among them), then
        push them; returns once each matching subscriber has been handed them (or has gone)."""
        events = [self._append(kind, owner, fields) for fields in items]
        if events and self._subscribers:
            await self._deliver(owner, events)
        return events

    def _append(self, kind: str, owner: str | None, fields: dict[str, Any]) -> dict[str, Any]:
        event = {"kind": kind, "at": now(), **{k: v for k, v in fields.items() if v is not None}}
        seq = self._next_seq(owner)
        self._next[owner] = seq + 1
        if self.capacity > 0:
            self._keep(owner, seq, event)
        return event

    async def _deliver(self, owner: str | None, events: list[dict[str, Any]]) -> None:
        """Queue `events` for each subscriber of `owner` that wants them, in the same step as they were
        appended (so every queue is in log order), then see each delivered."""
        due: list[tuple[object, _Subscriber, int]] = []
        for key, sub in self._subscribers.items():
            if sub.owner != owner:
                continue
            wanted = [e for e in events if sub.kinds is None or e["kind"] in sub.kinds]
            if wanted:
                sub.queue.extend(wanted)
                sub.queued += len(wanted)
                due.append((key, sub, sub.queued))
        for key, sub, target in due:
            await self._drain(key, sub, target)

    async def _drain(self, key: object, sub: _Subscriber, target: int) -> None:
        """Push `sub`'s queue up to its `target`th event, one push at a time: this caller pushes, or
        waits while another does (which pushes the events queued before this caller's first)."""
        if sub.busy and sub in _PUSHING.get():  # emitted from inside a push to it: that pusher delivers it
            sub.owed = max(sub.owed, target)
            return
        while sub.delivered < target and not sub.dead:
            if sub.busy:
                await sub.progress.wait()
                continue
            sub.busy = True
            pushing = _PUSHING.set(_PUSHING.get() | {sub})
            try:
                while sub.queue and sub.delivered < max(target, sub.owed):
                    event = sub.queue.popleft()
                    sub.delivered += 1
                    try:
                        await sub.push(event)
                    except Exception:  # a dead connection unsubscribes itself
                        if self._subscribers.get(key) is sub:
                            del self._subscribers[key]
                        sub.dead = True
                        sub.queue.clear()
                        sub.delivered = sub.queued
            finally:
                _PUSHING.reset(pushing)
                sub.busy = False
                sub.wake()

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
        """Subscribe the connection `key`; subscribing again changes what it gets from now on (one
        queue per connection still, so nothing already queued is overtaken)."""
        wanted = parse_kinds(kinds)
        sub = self._subscribers.get(key)
        if sub is None:
            self._subscribers[key] = _Subscriber(push, owner, wanted)
        else:
            sub.push, sub.owner, sub.kinds = push, owner, wanted

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
