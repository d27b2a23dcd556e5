"""Reading every record in a scope through `memory/timeline`, a page at a time.

No A2M method offers a cursor, and a timeline with `limit` returns the *most
recent* `limit` records, so a full read walks backwards with the `before`
extension (docs/extensions.md). Timestamps have millisecond precision and many
records can share one, so each page asks for `before` = (earliest stamp of the
last page) + 1 ms, which re-reads that millisecond, and drops the ids it has
already given. A page that lies wholly inside that millisecond means it holds
more records than a page: it is then read alone (`after` / `before` around it,
no limit) and the walk steps below it.

Both the router (its capacity, flush and repair scans of a tier) and
`a2m export` (any endpoint) read this way.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, AsyncIterator, Awaitable, Callable

from .timefmt import format_ts, parse_ts

Call = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]


class CrowdedMillisecond(Exception):
    """More records share one created_at than the endpoint returns in one timeline (its
    max_recall_limit): they cannot all be read by time."""


def _shift(stamp: str, ms: int) -> str:
    return format_ts(parse_ts(stamp) + timedelta(milliseconds=ms))


async def pages_backwards(call: Call, params: dict[str, Any], *, page: int,
                          cap: int | None) -> AsyncIterator[list[dict[str, Any]]]:
    """Every record `memory/timeline` with `params` (a scope) reaches, newest page first, each page
    ascending, no id twice. `call(method, params)` returns a result; `cap` is the endpoint's
    max_recall_limit (None: `limit: 0` returns everything)."""
    base = {**params, "limit": page}
    before: str | None = None  # exclusive upper bound of the next page
    boundary: set[str] = set()  # ids already yielded at the millisecond just below `before`
    while True:
        records = (await call("memory/timeline", base if before is None else {**base, "before": before}))["records"]
        if not records:
            return
        fresh = [r for r in records if r["id"] not in boundary]
        if len(records) < page:
            if fresh:
                yield fresh
            return  # the page holds everything before `before`
        earliest = records[0]["created_at"]
        if before is not None and earliest == _shift(before, -1):
            # The whole page sits in the boundary millisecond: it holds at least `page` records, and
            # the next page would be this one again. Read that millisecond alone, then go below it.
            exact = {**base, "after": _shift(earliest, -1), "before": before, "limit": 0}
            same = (await call("memory/timeline", exact))["records"]
            if cap is not None and len(same) >= cap:
                raise CrowdedMillisecond(f"at least {len(same)} records share created_at {earliest}, more than "
                                         "one timeline page holds")
            fresh = [r for r in same if r["id"] not in boundary]
            if fresh:
                yield fresh
            before, boundary = earliest, set()
            continue
        if fresh:
            yield fresh
        # Re-read the earliest millisecond next time (it may hold more than this page showed).
        boundary = {r["id"] for r in records if r["created_at"] == earliest}
        before = _shift(earliest, 1)
