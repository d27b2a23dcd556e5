"""Reading a whole scope a page at a time (export, the router's scans), printed as JSON.

    python -m bench.paging [--records N] [--page P] [--tiers working,episodic,...] [--quick]

Each tier runs in process on its embedded engine (as `a2m serve` builds it, no
HTTP: both walks pay the same transport). One owner holds N records, seven to
a millisecond, and a second owner N records in one millisecond (a full
`memory/remember` stamps its records alike; imports of coarse timestamps more).
For each tier, in one run:

- `cursor`: the walk `a2m.paging` takes, by the tier's timeline cursor;
- `time`: the walk by `created_at` it takes where no cursor is answered (the
  baseline: the only walk before the cursor), over the same records;
- `crowded`: the cursor walk over the single millisecond, and whether the walk
  by time can read it at all (it cannot past one page: `CrowdedMillisecond`).

Then `router`: a router in process over the four tiers in process, the same
records spread evenly over them, walked whole (no `tier`): by the router's
cursor over several tiers (decision 137) against by time through the same
router, and the crowded millisecond by cursor.

Each figure is records/s of one full walk (the best of three), and every walk
is checked to read each record exactly once.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: tests.support (the in-process servers) sits beside bench/

from a2m import paging  # noqa: E402
from a2m.dispatch import Context, Dispatcher  # noqa: E402
from a2m.errors import A2MError  # noqa: E402
from router.config import RouterConfig, TierConfig  # noqa: E402
from router.server import Router  # noqa: E402
from tests.support.inprocess import dispatchers  # noqa: E402

TIERS = ("working", "episodic", "semantic", "procedural")
Call = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]


def caller(d: Dispatcher) -> Call:
    async def call(method: str, params: dict[str, Any]) -> dict[str, Any]:
        reply = await d.handle({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}, Context())
        assert reply is not None
        if "error" in reply:
            raise RuntimeError(reply["error"])
        return reply["result"]
    return call


class InProcessTier:
    """A tier client for the router that calls a dispatcher in this process (no HTTP on either walk)."""

    def __init__(self, d: Dispatcher) -> None:
        self.d = d

    async def call(self, method: str, params: dict[str, Any], *, timeout: float | None = None) -> dict[str, Any]:
        reply = await self.d.handle({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}, Context())
        assert reply is not None
        if "error" in reply:
            raise A2MError.from_error(reply["error"])
        return reply["result"]

    async def close(self) -> None: ...


async def fill(call: Call, owner: str, n: int, crowded: bool, tier: str | None = None) -> list[str]:
    records = [{"id": f"{owner}-{tier or ''}{i:07d}", "content": f"record {i} about topic {i % 17}",
                "created_at": "2026-03-01T00:00:00.000Z" if crowded else
                f"2026-03-01T{i // 7 // 3_600_000:02d}:{i // 7 // 60_000 % 60:02d}:{i // 7 // 1000 % 60:02d}."
                f"{i // 7 % 1000:03d}Z"} for i in range(n)]
    for start in range(0, n, 1000):
        await call("memory/remember", {"owner": owner, "records": records[start:start + 1000],
                                       **({"tier": tier} if tier else {})})
    return [r["id"] for r in records]


async def by_time(call: Call, params: dict[str, Any], page: int) -> Any:
    """The walk by `created_at`: what `pages_backwards` does where a tier answers no cursor."""
    base = {**params, "limit": page}
    async for records in paging._by_time(call, base, await call("memory/timeline", base), page=page, cap=1000):
        yield records


async def walk(pages: Any, want: list[str]) -> float:
    """Seconds for one full walk; checks it read every record once, in order."""
    started = time.perf_counter()
    read = [[r["id"] for r in records] async for records in pages]
    seconds = time.perf_counter() - started
    got = [i for records in reversed(read) for i in records]
    assert got == want, f"walk read {len(got)} records, {len(set(got))} distinct, of {len(want)}"
    return seconds


async def bench_tier(d: Dispatcher, n: int, page: int) -> dict[str, Any]:
    call = caller(d)
    return await bench_walks(call, await fill(call, "spread", n, False), await fill(call, "crowded", n, True), page)


async def bench_router(tiers: dict[str, Dispatcher], n: int, page: int) -> dict[str, Any]:
    """The same walks through a router over `tiers`, n records spread evenly over them. In the
    router's order a stamp's records come deepest tier first: none spills here, so by tier order."""
    config = RouterConfig(tiers=tuple(TierConfig(name=t, url="http://in-process/", kind=t) for t in tiers))
    router = Router(config, client_factory=lambda t: InProcessTier(tiers[t.name]))
    await router.startup()
    try:
        handlers = router.handlers()

        async def call(method: str, params: dict[str, Any]) -> dict[str, Any]:
            return await handlers[method](params, Context())

        share = n // len(tiers)
        wanted: dict[str, list[list[str]]] = {"spread": [], "crowded": []}
        for owner in wanted:
            for tier in tiers:
                wanted[owner].append(await fill(call, owner, share, owner == "crowded", tier))
        # every tier stamps its i-th record alike, seven to a millisecond: a millisecond's records tier by tier
        spread = [ids[i] for ms in range(0, share, 7) for ids in wanted["spread"] for i in range(ms, min(ms + 7, share))]
        crowded = [i for ids in wanted["crowded"] for i in ids]
        return await bench_walks(call, spread, crowded, page) | {"records": share * len(tiers)}
    finally:
        await router.shutdown()


async def bench_walks(call: Call, spread: list[str], crowded: list[str], page: int) -> dict[str, Any]:
    n = len(spread)
    out: dict[str, Any] = {}
    for name, make, want in (
            ("cursor", lambda: paging.pages_backwards(call, {"owner": "spread"}, page=page, cap=1000), spread),
            ("time", lambda: by_time(call, {"owner": "spread"}, page), spread),
            ("crowded", lambda: paging.pages_backwards(call, {"owner": "crowded"}, page=page, cap=1000), crowded)):
        best = min([await walk(make(), want) for _ in range(3)])
        out[f"{name}_records_per_s"] = round(n / best)
    out["cursor_vs_time"] = round(out["cursor_records_per_s"] / out["time_records_per_s"], 2)
    try:
        await walk(by_time(call, {"owner": "crowded"}, page), crowded)
        out["time_reads_crowded"] = True
    except paging.CrowdedMillisecond:
        out["time_reads_crowded"] = False
    return out


async def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.paging", description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--page", type=int, default=1000)
    parser.add_argument("--tiers", default=",".join(TIERS))
    parser.add_argument("--quick", action="store_true", help="5,000 records (run_all --quick's size)")
    args = parser.parse_args()
    if args.quick:
        args.records = 5_000
    tiers = [t for t in args.tiers.split(",") if t]
    result: dict[str, Any] = {"records": args.records, "page": args.page}
    with tempfile.TemporaryDirectory(prefix="a2m-bench-") as tmp:
        for tier in tiers:  # one at a time: each engine alone on the machine while it is measured
            async with dispatchers(Path(tmp) / tier, [tier]) as running:
                result[tier] = await bench_tier(running[tier], args.records, args.page)
        if set(TIERS) <= set(tiers):
            async with dispatchers(Path(tmp) / "router", TIERS) as running:
                result["router"] = await bench_router(running, args.records, args.page)
    result["meets"] = {f"{t}_reads_crowded_millisecond": result[t]["crowded_records_per_s"] > 0
                       for t in [*tiers, "router"] if t in result}
    print(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode())
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
