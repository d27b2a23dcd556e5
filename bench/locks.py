"""What the replicas' shared owner lock (`lock_url`, decision 156) costs the calls that take it.

Prints one JSON object. Two routers run over the same real tiers (working on Redis, spilling into
episodic on PostgreSQL): one with `lock_url` naming a Redis of its own, one without, the baseline
in the same run. They take turns on each call: a keyed remember (the owner lock, to locate the
key), a forget by id (the owner lock), and a session close of 50 records (a move: the owner lock
over read, write, verify and delete). Each router has owners of its own. Then two more routers
with `[rate_limit]`, one keeping the callers' buckets in the lock store (decision 159) and one in
its own memory, take turns on a recall (which takes no owner lock): the shared bucket's cost.

    python bench/locks.py [--quick] [--calls 500] [--sessions 20]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from a2m.client import HTTPClient  # noqa: E402
from tests.router.stack import federation  # noqa: E402  (the same launcher as the router's tests)
from tests.support.procs import a2m_command, free_port, http_server  # noqa: E402
from tests.support.redis import own_redis  # noqa: E402

TIERS = [{"name": "working", "kind": "working", "capacity": 1000, "per_session": True, "spill_to": "episodic"},
         {"name": "episodic", "kind": "episodic"}]
SESSION = 50  # records a closed session moves


def ms(values: list[float], q: int) -> float:
    """The q-th percentile of `values` (seconds) in milliseconds."""
    return round((statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else values[0]) * 1000, 3)


async def turns(n: int, probes: dict[str, Callable[[int], Awaitable[Any]]]) -> dict[str, list[float]]:
    """Seconds per call of each probe, the probes taking turns (so both share the machine alike)."""
    out: dict[str, list[float]] = {name: [] for name in probes}
    for i in range(n):
        for name, call in (probes.items() if i % 2 else reversed(probes.items())):
            t0 = time.perf_counter()
            await call(i)
            out[name].append(time.perf_counter() - t0)
    return out


async def run(calls: int, sessions: int) -> dict[str, Any]:
    out: dict[str, Any] = {"benchmark": "locks", "calls": calls, "sessions": sessions, "session_records": SESSION}
    with tempfile.TemporaryDirectory(prefix="a2m-bench-") as tmp, own_redis(Path(tmp)) as lock_url, \
            federation(Path(tmp), TIERS, mode="real", timeout=180.0) as stack:
        with contextlib.ExitStack() as servers:
            def router(name: str, head: str) -> str:
                """Another router over the stack's tiers, `head` before the stack's config: its URL."""
                config = Path(tmp) / f"router-{name}.toml"
                config.write_text(head + stack.config.read_text())
                port = free_port()
                return servers.enter_context(http_server(
                    a2m_command("serve", "router", "--config", str(config), "--port", str(port)), port, timeout=60))

            locked = f"lock_url = {json.dumps(lock_url)}\n"
            unlimited = "\n[rate_limit]\nper_second = 1000000\nburst = 1000000\n"  # counted, never refused
            urls = {"lock_url": router("locked", locked), "rate_shared": router("rate-shared", locked + unlimited),
                    "rate_own": router("rate-own", unlimited)}
            await _run(out, calls, sessions, stack, urls)
    out["lock_url_over_own_locks"] = {
        "keyed_remember_p50_ms": round(out["keyed_remember"]["lock_url"]["p50_ms"]
                                       - out["keyed_remember"]["own_locks"]["p50_ms"], 3),
        "forget_by_id_p50_ms": round(out["forget_by_id"]["lock_url"]["p50_ms"]
                                     - out["forget_by_id"]["own_locks"]["p50_ms"], 3),
        "session_close_rate": round(out["session_close"]["lock_url"]["records_per_s"]
                                    / out["session_close"]["own_locks"]["records_per_s"], 2),
        "rate_limited_recall_p50_ms": round(out["rate_limited_recall"]["rate_shared"]["p50_ms"]
                                            - out["rate_limited_recall"]["rate_own"]["p50_ms"], 3)}
    return out


async def _run(out: dict[str, Any], calls: int, sessions: int, stack: Any, urls: dict[str, str]) -> None:
    routers = {"lock_url": HTTPClient(urls["lock_url"]), "own_locks": HTTPClient(stack.url)}
    limited = {name: HTTPClient(urls[name]) for name in ("rate_shared", "rate_own")}
    working = HTTPClient(stack.tiers["working"].url)
    try:
        for name, client in routers.items():  # warm the connections (and the lock store's)
            await client.call("memory/remember", {"owner": f"{name}-warm", "records": [
                {"content": "warm", "key": "warm"}]})

        def keyed(name: str, client: HTTPClient) -> Callable[[int], Awaitable[Any]]:
            return lambda i: client.call("memory/remember", {"owner": f"{name}-{i % 10}", "records": [
                {"content": f"fact {i}", "key": f"k{i % 50}"}]})

        lat = await turns(calls, {name: keyed(name, c) for name, c in routers.items()})
        out["keyed_remember"] = {name: {"p50_ms": ms(v, 50), "p99_ms": ms(v, 99)} for name, v in lat.items()}

        ids: dict[str, list[str]] = {}
        for name, client in routers.items():
            ids[name] = (await client.call("memory/remember", {"owner": f"{name}-f", "records": [
                {"content": f"to forget {i}"} for i in range(calls)]}))["ids"]

        def forget(name: str, client: HTTPClient) -> Callable[[int], Awaitable[Any]]:
            return lambda i: client.call("memory/forget", {"owner": f"{name}-f", "ids": [ids[name][i]]})

        lat = await turns(calls, {name: forget(name, c) for name, c in routers.items()})
        out["forget_by_id"] = {name: {"p50_ms": ms(v, 50), "p99_ms": ms(v, 99)} for name, v in lat.items()}

        async def close(name: str, client: HTTPClient, i: int) -> None:
            owner = f"{name}-s"
            await working.call("memory/remember", {"owner": owner, "records": [
                {"content": f"turn {j}", "session": f"s{i}"} for j in range(SESSION)]})
            t0 = time.perf_counter()
            closed = await client.call("memory/session/close", {"owner": owner, "session": f"s{i}"})
            spent[name] += time.perf_counter() - t0
            moved[name] += closed["flushed"]

        spent = dict.fromkeys(routers, 0.0)
        moved = dict.fromkeys(routers, 0)
        for i in range(sessions):
            for name, client in (routers.items() if i % 2 else reversed(routers.items())):
                await close(name, client, i)
        out["session_close"] = {name: {"records_per_s": round(moved[name] / spent[name], 1),
                                       "records": moved[name]} for name in routers}

        for name, client in limited.items():
            await client.call("memory/remember", {"owner": name, "records": [
                {"content": f"the ferry leaves at {i}"} for i in range(20)]})

        def recall(name: str, client: HTTPClient) -> Callable[[int], Awaitable[Any]]:
            return lambda i: client.call("memory/recall", {"owner": name, "query": "ferry", "touch": False})

        lat = await turns(calls, {name: recall(name, c) for name, c in limited.items()})
        out["rate_limited_recall"] = {name: {"p50_ms": ms(v, 50), "p99_ms": ms(v, 99)}
                                      for name, v in lat.items()}
    finally:
        for client in [*routers.values(), *limited.values(), working]:
            await client.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="100 calls and 6 sessions: under a minute")
    parser.add_argument("--calls", type=int, default=500, help="keyed remembers and forgets through each router")
    parser.add_argument("--sessions", type=int, default=20, help="sessions of 50 records each router closes")
    args = parser.parse_args()
    calls, sessions = (100, 6) if args.quick else (args.calls, args.sessions)
    print(json.dumps(asyncio.run(run(calls, sessions)), indent=2))


if __name__ == "__main__":
    main()
