"""The bounded event log with salted, opaque cursors.

A cursor is `<salt>.<seq>`: the salt changes every server start, so a cursor
from another server or an earlier run is recognised as foreign and answered
with `reset: true` instead of silently skipping or repeating events. Polls
advance over events of kinds the caller filtered out, so successive polls
deliver every visible event exactly once, in order.

`seq` counts one owner's events, from a random start: a cursor says nothing
of how much other owners did, and is meaningless under another owner. Each
owner keeps a window of its own newest `capacity` events, which only its own
new events push out: what an owner can see of the log (its events, cursors,
resets, `more`) follows from its own events alone. A window shared by all
owners, whose largest holder gave up its oldest for anyone's new event, let
that holder count everyone else's events from its resets.

Memory is bounded apart from that, as a safety valve: `bound` counts every
event held plus `OWNER_UNITS` for each owner with a window, each by its size
(`UNIT_BYTES` a unit, so an event naming a thousand ids or an owner with a
long name counts as what it holds). An owner's window never holds more units
than a full window of ordinary events (`capacity` and its own): past that its
own oldest events go, as past `capacity`, so as many owners fill the bound
whatever their events are. Past the bound, the whole
window of the least recently active owner (the one that least recently wrote,
polled or asked for a head) goes, count and all: its next poll resets once.
An owner can then learn one thing of the others, and only under a load far
past the ordinary: that, since it was last active, enough happened to push
out a whole log's worth.

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
import sys
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Iterable

from . import errors
from .errors import A2MError, invalid
from .timefmt import now

EVENT_KINDS = frozenset({"written", "forgotten", "promoted", "consolidated", "session_closed"})
DEFAULT_POLL = 100
MAX_POLL = 1000
SEQ_START_BITS = 40  # an owner's first event is numbered at random below 2**40: far from any other start
# The safety bound, in units: one per event held, OWNER_UNITS per owner with a window. Measured with
# tracemalloc (tests/a2m/test_events.py): 440-500 bytes a unit, whatever the mix of owners and events
# (a `written` event ~440, an owner with a head and nothing else ~1,000), so the default holds ~60 MB at
# most: 127 owners with full windows of 1024, or 65,536 owners with nothing kept.
DEFAULT_BOUND = 1 << 17
OWNER_UNITS = 2
# What one unit stands for: an ordinary event's size. An event (or owner name) larger than that counts
# one unit more for each UNIT_BYTES of its strings: counted as one however large, a `promoted` event
# of 1,000 ids held ~90 KB a unit, an owner named in 16 KB ~8.5 KB, and the bound gigabytes.
UNIT_BYTES = 512

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


def _size_units(values: Iterable[Any]) -> int:
    """The units beyond the first that `values`' strings (and lists of strings: ids) hold."""
    size = 0
    for value in values:
        if isinstance(value, str):
            size += sys.getsizeof(value)
        elif isinstance(value, list):
            size += sum(sys.getsizeof(item) + 8 for item in value if isinstance(item, str))
    return size // UNIT_BYTES


@dataclass(slots=True, eq=False)
class _Window:
    """One owner's count and its newest events (each with its units), oldest first."""

    next: int  # the seq of the owner's next event
    units: int  # what it holds: OWNER_UNITS (and its name's size) plus its events' units
    events: deque[tuple[int, dict[str, Any], int]] = field(default_factory=deque)


class EventLog:
    def __init__(self, capacity: int = 1024, *, bound: int | None = None) -> None:
        """`capacity`: events kept per owner. `bound`: the safety bound on everything held, in
        units (see `DEFAULT_BOUND`); never below one full window, by default room for four."""
        self.capacity = capacity
        floor = max(capacity, 0) + OWNER_UNITS
        self.bound = max(bound, floor) if bound is not None else max(DEFAULT_BOUND, 4 * floor)
        self.share = floor  # the most one owner's window holds, in units: a full window of ordinary events
        self.salt = secrets.token_hex(6)
        self._windows: OrderedDict[str | None, _Window] = OrderedDict()  # least recently active first
        self._held = 0  # units: the windows' (`_Window.units`) together
        self._subscribers: dict[object, _Subscriber] = {}

    def _cursor(self, seq: int) -> str:
        return f"{self.salt}.{seq}"

    def _window(self, owner: str | None) -> _Window:
        """`owner`'s window, now its most recently active; started (at a random seq) if it has none.

        A window started again after the safety bound took the last one starts
        at another random place: a cursor from before is then before the oldest
        event or past the newest, and its poll resets instead of skipping."""
        window = self._windows.get(owner)
        if window is not None:
            self._windows.move_to_end(owner)
            return window
        units = OWNER_UNITS + (0 if owner is None else _size_units([owner]))
        window = self._windows[owner] = _Window(secrets.randbits(SEQ_START_BITS) + 1, units)
        self._held += units
        self._bound()
        return window

    def _bound(self) -> None:
        """The safety valve: past `bound`, the least recently active owners' windows go whole. Never
        the owner just active (it is the newest, and one window alone fits), and O(1) a unit freed."""
        while self._held > self.bound and len(self._windows) > 1:
            _, gone = self._windows.popitem(last=False)
            self._held -= gone.units

    def head(self, owner: str | None = None) -> str:
        """The cursor of `owner`'s newest event: a poll from it sees only what comes after."""
        return self._cursor(self._window(owner).next - 1)

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
        """Number the event in its owner's count and keep it in its owner's window, whose oldest go
        once it holds `capacity` events or its `share` of units: only an owner's own events push its
        events out (one larger than the share alone is not kept: it is pushed, never polled)."""
        event = {"kind": kind, "at": now(), **{k: v for k, v in fields.items() if v is not None}}
        window = self._window(owner)
        seq = window.next
        window.next = seq + 1
        if self.capacity > 0:
            units = 1 + _size_units(event.values())
            window.events.append((seq, event, units))
            window.units += units
            self._held += units
            while window.events and (len(window.events) > self.capacity or window.units > self.share):
                gone = window.events.popleft()[2]
                window.units -= gone
                self._held -= gone
            self._bound()
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
        window = self._window(owner)
        mine, upcoming = window.events, window.next
        oldest = mine[0][0] if mine else upcoming
        position = self._parse(cursor)
        reset = position is None or position < oldest - 1 or position >= upcoming
        if reset:
            position = oldest - 1
        out: list[dict[str, Any]] = []
        last = position
        more = False
        for seq, event, _ in mine:
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
