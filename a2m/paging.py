"""Reading every record in a scope through `memory/timeline`, a page at a time.

A timeline with `limit` returns the *most recent* `limit` records, so a full
read walks backwards. Where the endpoint offers the cursor extension
(docs/extensions.md: asked with `cursor: true`, it answers a `cursor`), each
page asks for the records strictly before the last one's position, exact
however many records share a millisecond.

Elsewhere (a server without the extension, a router reading several tiers) it
walks by time with the `before` extension. Timestamps have millisecond
precision and many records can share one, so each page asks for `before` =
(earliest stamp of the last page) + 1 ms, which re-reads that millisecond, and
drops the ids it has already given. A page that lies wholly inside that
millisecond means it holds more records than a page: it is then read alone
(`after` / `before` around it, no limit) and the walk steps below it; past the
endpoint's max_recall_limit it cannot be read (`CrowdedMillisecond`).

A router answers a page without a tier that is down (`degraded`), and a walk
over several tiers answers no cursor then: such a page is asked again, the
same way, after waits that outlast the router's backoff of a down tier (30 s in
all), then the walk stops with `TiersDown`. Read from a router, a tier that
restarts mid-walk costs a wait, not the walk; what was read is never re-read.

Both the router (its capacity, flush and repair scans of a tier, and a
timeline past a tier's cap) and `a2m export` (any endpoint) read this way.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, AsyncIterator, Awaitable, Callable, Sequence

from .timefmt import parse_ts, shift_ms

Call = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]


def waits_within(total: float) -> tuple[float, ...]:
    """Seconds between asks of a page a router answered without some tiers, summing to `total`:
    doubling from 1 s up to 15 s, the router's longest backoff of a down tier, so each wait past
    that still finds the tier asked again."""
    waits: list[float] = []
    while (left := total - sum(waits)) > 0:
        waits.append(min(left, 2.0 ** len(waits), 15.0))
    return tuple(waits)


DEGRADED_WAITS = waits_within(30.0)  # 1, 2, 4, 8, 15

log = logging.getLogger("a2m.paging")


class CrowdedMillisecond(Exception):
    """More records share one created_at than the endpoint returns in one timeline (its
    max_recall_limit): they cannot all be read by time."""


class BoundsIgnored(CrowdedMillisecond):
    """The endpoint does not page as asked: it answered records outside the `before` / `after` it
    was given (a server without that extension ignores them, as the protocol has it do with unknown
    params), or a cursor that does not move on. Paging on would read the same records forever, so
    the walk stops where it is. A CrowdedMillisecond for its callers: what was read stands, the rest
    is left out."""


class TiersDown(Exception):
    """A router kept answering timeline pages without these tiers for as long as the walk waited for
    them: the rest of the walk cannot be read whole now. What was read stands."""

    def __init__(self, tiers: Sequence[str], waited: float) -> None:
        self.tiers = list(tiers)
        named = f"tier {self.tiers[0]}" if len(self.tiers) == 1 else f"tiers {', '.join(self.tiers)}"
        super().__init__(f"{named} did not answer a timeline page for {waited:g} s")


def _asking_again(call: Call, waits: Sequence[float]) -> Call:
    """`call`, with a timeline page a router answered `degraded` asked again after each of `waits`.

    Taking such a page would leave the tier's records out silently (a walk by time steps past them)
    or, walking several tiers, end the walk (the page has no cursor)."""

    async def whole(method: str, params: dict[str, Any]) -> dict[str, Any]:
        for wait in waits:
            result = await call(method, params)
            if not result.get("degraded"):
                return result
            log.warning("tiers %s did not answer a timeline page; asking again in %g s",
                        ", ".join(result["degraded"]), wait)
            await asyncio.sleep(wait)
        result = await call(method, params)
        if result.get("degraded"):
            raise TiersDown(result["degraded"], sum(waits))
        return result

    return whole


def _outside(records: list[dict[str, Any]], after: str | None, before: str | None) -> bool:
    """Whether a page holds a record at or past `before`, or at or before `after` (one parse each)."""
    stamps = [r["created_at"] for r in records]
    try:
        return ((before is not None and parse_ts(max(stamps)) >= parse_ts(before))
                or (after is not None and parse_ts(min(stamps)) <= parse_ts(after)))
    except Exception:  # a stamp that is not one: nothing to tell from it here
        return False


def _bounded(params: dict[str, Any], **bounds: str | None) -> dict[str, Any]:
    """`params` with each bound that exists (None: unbounded that way, the caller's own bound stays)."""
    return {**params, **{name: value for name, value in bounds.items() if value is not None}}


async def pages_backwards(call: Call, params: dict[str, Any], *, page: int, cap: int | None,
                          waits: Sequence[float] = DEGRADED_WAITS) -> AsyncIterator[list[dict[str, Any]]]:
    """Every record `memory/timeline` with `params` (a scope) reaches, newest page first, each page
    ascending, no id twice. `call(method, params)` returns a result; `cap` is the endpoint's
    max_recall_limit (None: `limit: 0` returns everything); `waits`, the seconds between asks of a
    page answered without some tiers (`TiersDown` after the last)."""
    call = _asking_again(call, waits)
    base = {**params, "limit": page}
    first = await call("memory/timeline", {**base, "cursor": True})
    walk = _by_cursor(call, base, first) if "cursor" in first else _by_time(call, base, first, page=page, cap=cap)
    async for records in walk:
        yield records


async def _by_cursor(call: Call, base: dict[str, Any],
                     result: dict[str, Any]) -> AsyncIterator[list[dict[str, Any]]]:
    """The pages as the cursor walks them. A router walking several tiers shows a record each tier
    holds a copy of (an interrupted move, until repair) once per page it falls on; the copies share
    a `created_at`, which is the earliest one read when the next copy comes, so the ids already
    yielded at that stamp are dropped, as `_by_time` drops its boundary's."""
    earliest: str | None = None  # the earliest created_at yielded, and the ids yielded there
    boundary: set[str] = set()
    while True:
        records, cursor = result["records"], result.get("cursor", ...)
        if cursor is not None and not isinstance(cursor, str):
            told = "no cursor" if cursor is ... else f"cursor {str(cursor)[:80]!r}, not a string or null"
            raise BoundsIgnored(f"a timeline page answered {told}: the endpoint cannot be paged by it")
        if not records:
            return
        fresh = [r for r in records if not (r["created_at"] == earliest and r["id"] in boundary)]
        if fresh:
            yield fresh
        if records[0]["created_at"] != earliest:
            earliest, boundary = records[0]["created_at"], set()
        boundary |= {r["id"] for r in records if r["created_at"] == earliest}
        if cursor is None:
            return
        result = await call("memory/timeline", {**base, "cursor": cursor})
        if result.get("cursor") == cursor:
            raise BoundsIgnored("a timeline page answered the cursor it was asked with: the endpoint does not "
                                "move on by it")


async def _by_time(call: Call, base: dict[str, Any], result: dict[str, Any], *, page: int,
                   cap: int | None) -> AsyncIterator[list[dict[str, Any]]]:
    before: str | None = None  # exclusive upper bound of the next page (None: none of ours)
    floor: str | None = None  # the millisecond just below `before`, which the next page re-reads
    boundary: set[str] = set()  # ids already yielded at `floor`
    while True:
        records = result["records"]
        if not records:
            return
        if _outside(records, None, before):
            raise BoundsIgnored(f"a timeline page asked for records before {before} holds later ones: the "
                                "endpoint ignores `before`, so it cannot be paged past its newest page")
        fresh = [r for r in records if r["id"] not in boundary]
        if len(records) < page:
            if fresh:
                yield fresh
            return  # the page holds everything before `before`
        earliest = records[0]["created_at"]
        if earliest == floor:
            # The whole page sits in the boundary millisecond: it holds at least `page` records, and
            # the next page would be this one again. Read that millisecond alone, then go below it.
            exact = _bounded({**base, "limit": 0}, after=shift_ms(earliest, -1), before=shift_ms(earliest, 1))
            same = (await call("memory/timeline", exact))["records"]
            if same and _outside(same, exact.get("after"), exact.get("before")):
                raise BoundsIgnored(f"a timeline asked for the records of {earliest} alone holds others: the "
                                    "endpoint ignores `after` / `before`")
            if cap is not None and len(same) >= cap:
                raise CrowdedMillisecond(f"at least {len(same)} records share created_at {earliest}, more than "
                                         "one timeline page holds")
            fresh = [r for r in same if r["id"] not in boundary]
            if fresh:
                yield fresh
            if (floor := shift_ms(earliest, -1)) is None:
                return  # that was the first millisecond there is
            before, boundary = earliest, set()
        else:
            if fresh:
                yield fresh
            # Re-read the earliest millisecond next time (it may hold more than this page showed).
            boundary = {r["id"] for r in records if r["created_at"] == earliest}
            before, floor = shift_ms(earliest, 1), earliest
        result = await call("memory/timeline", _bounded(base, before=before))
