"""Benchmark the router in front of the four tier servers on their embedded engines.

Prints one JSON object. The tiers are bulk-loaded directly (batches of 500, not
through the router, so set-up stays fast), then every figure is taken through
the router over HTTP, and the same recall queries are sent to each tier
directly in the same run, so the router's own cost (fan-out, fusion, the
recall counting it does after answering) is the difference to the slowest
tier. Targets come from issue 7 and are printed next to the figures.

    python bench/router.py [--quick] [--working 1000 --episodic 100000 --semantic 20000 --procedural 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import shutil
import sys
import tempfile
import time
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Awaitable, Callable, Iterator

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from a2m.client import HTTPClient  # noqa: E402
from a2m.timefmt import format_ts  # noqa: E402
from router.config import FusionConfig  # noqa: E402
from tests.router.stack import federation  # noqa: E402  (the same launcher as the router's tests)

def vocabulary(n: int = 5000) -> list[str]:
    """Pronounceable made-up words: a vocabulary as wide as real chat, with no stopwords in it."""
    onsets, vowels, codas = "b d f g k l m n p r t v z br tr pl st".split(), "a e i o u".split(), "n r l k x m".split()
    rnd, words = random.Random(3), set()
    while len(words) < n:
        words.add("".join(rnd.choice(onsets) + rnd.choice(vowels) for _ in range(rnd.randint(2, 3)))
                  + rnd.choice(codas))
    return sorted(words)


WORDS = vocabulary()
# Zipf-like word frequencies (s = 1): a few common words, a long tail, like natural text.
CUMULATIVE = list(itertools.accumulate(1.0 / (rank + 1) for rank in range(len(WORDS))))
CAPACITY = 32
TIERS = [
    {"name": "working", "kind": "working", "capacity": CAPACITY, "spill_to": "episodic", "timeout": 5.0},
    {"name": "episodic", "kind": "episodic", "spill_to": "semantic", "promote_to": "semantic", "promote_after": 3,
     "timeout": 10.0},
    {"name": "semantic", "kind": "semantic", "timeout": 10.0},
    {"name": "procedural", "kind": "procedural", "timeout": 10.0},
]
TARGETS = {"recall_p50_vs_slowest_tier": 1.5, "recall_p50_ms": 25.0, "timeline_p50_ms": 3.0,
           "concurrent_recalls_per_s": 300.0, "spill_records_per_s": 1000.0}


def ms(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return round(ordered[index] * 1000, 2)


def text(rnd: random.Random, n: int = 12) -> str:
    return " ".join(rnd.choices(WORDS, cum_weights=CUMULATIVE, k=n))


def query(rnd: random.Random) -> str:
    """Two mid-frequency words: each matches a few hundred to a few thousand of 100,000 records."""
    return " ".join(rnd.sample(WORDS[30:1500], 2))


def records(kind: str, n: int, rnd: random.Random, start: datetime) -> list[dict[str, Any]]:
    out = []
    for i in range(n):
        created = format_ts(start + timedelta(seconds=i * 60 + rnd.random()))
        record: dict[str, Any] = {"content": text(rnd), "created_at": created, "metadata": {"n": i}}
        if kind == "working":
            record["session"] = f"w{i // (CAPACITY - 4)}"  # under capacity: nothing spills on load
            record["role"] = "user" if i % 2 else "assistant"
        elif kind == "episodic":
            record["session"] = f"e{i // 200}"
            record["role"] = "user" if i % 2 else "assistant"
        elif kind == "semantic":
            record["role"] = "memory"
        else:
            record["key"] = f"skill/{i}"
            record["role"] = "skill"
        out.append(record)
    return out


async def load(url: str, batch: list[dict[str, Any]], size: int = 500, parallel: int = 2) -> float:
    """Write straight into one tier; returns seconds."""
    t0 = time.perf_counter()
    async with HTTPClient(url, timeout=300) as client:
        chunks = [batch[i:i + size] for i in range(0, len(batch), size)]
        gate = asyncio.Semaphore(parallel)

        async def one(chunk: list[dict[str, Any]]) -> None:
            async with gate:
                await client.call("memory/remember", {"records": chunk})

        await asyncio.gather(*(one(c) for c in chunks))
    return time.perf_counter() - t0


@contextmanager
def embedded_postgres(tmp: Path) -> Iterator[str]:
    """The episodic tier's PostgreSQL, started here (the tier is served on it with --url) so the
    bench can VACUUM ANALYZE it after the bulk load."""
    from backends.episodic.embedded import EmbeddedPostgres

    postgres = EmbeddedPostgres(Path(tempfile.mkdtemp(prefix="a2m-pg-", dir="/tmp")))  # a short socket path
    try:
        yield postgres.start()
    finally:
        postgres.stop()
        shutil.rmtree(postgres.pgdata.parent, ignore_errors=True)


def cpu_seconds(stack: Any, dsn: str) -> dict[str, float]:
    """User + system CPU so far of the router, each tier server (with its children: the working
    tier's redis-server), PostgreSQL's processes and this bench (the 16 clients)."""
    import psutil

    def tree(pid: int) -> float:
        try:
            proc = psutil.Process(pid)
            return sum(sum(p.cpu_times()[:2]) for p in [proc, *proc.children(recursive=True)])
        except psutil.Error:
            return 0.0

    out = {name: tree(proc.popen.pid) for name, proc in stack.tiers.items() if proc.popen is not None}
    if stack.router.popen is not None:
        out["router"] = tree(stack.router.popen.pid)
    # The postmaster and its backends; the bench's server keeps its socket in its data dir.
    pid_file = Path(dsn.split("host=")[-1].split("&")[0]) / "postmaster.pid"
    postgres = tree(int(pid_file.read_text().split()[0])) if pid_file.exists() else 0.0
    out["postgres"] = postgres
    me = psutil.Process()
    out["bench_clients"] = sum(me.cpu_times()[:2])
    return out


def profilers(stack: Any, folder: str | None, seconds: float) -> list[Any]:
    """py-spy sampling the router and each tier server for the concurrent run, `<folder>/<name>.txt` in
    its raw (collapsed stacks) form. py-spy counts a runnable thread as busy: on a loaded machine the
    points where a process wakes another (a socket write) are over-counted, so read the Python below them."""
    if not folder:
        return []
    import subprocess

    Path(folder).mkdir(parents=True, exist_ok=True)
    procs = {**stack.tiers, "router": stack.router}
    return [subprocess.Popen([str(Path(sys.executable).parent / "py-spy"), "record", "--pid", str(proc.popen.pid),
                              "--duration", str(max(1, int(seconds))), "--rate", "250", "--nonblocking",
                              "--format", "raw", "-o", str(Path(folder) / f"{name}.txt")],
                             stdout=subprocess.DEVNULL)  # its errors (ptrace refused, say) on stderr
            for name, proc in procs.items() if proc.popen is not None]


def with_postgres(tiers: list[dict[str, Any]], dsn: str) -> list[dict[str, Any]]:
    return [{**t, "args": ["--url", dsn]} if t["kind"] == "episodic" else t for t in tiers]


async def settle(dsn: str) -> None:
    """VACUUM ANALYZE the episodic table, as autovacuum soon would: timings taken while it runs
    (and while the GIN index's pending list of fresh rows is unmerged) measure the load, not a recall."""
    import psycopg

    t0 = time.perf_counter()
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute("VACUUM ANALYZE records")
    print(f"vacuum analyze {time.perf_counter() - t0:.1f} s", file=sys.stderr)


async def timed(n: int, call: Callable[[int], Awaitable[Any]]) -> list[float]:
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        await call(i)
        out.append(time.perf_counter() - t0)
    return out


async def interleaved(n: int, probes: dict[str, Callable[[int], Awaitable[Any]]]) -> dict[str, list[float]]:
    """Seconds per call of each probe, the probes taking turns on each query."""
    out: dict[str, list[float]] = {name: [] for name in probes}
    for i in range(n):
        for name, call in probes.items():
            t0 = time.perf_counter()
            await call(i)
            out[name].append(time.perf_counter() - t0)
    return out


async def throughput(client: HTTPClient, queries: list[str], clients: int, seconds: float) -> float:
    stop_at = time.perf_counter() + seconds
    done = 0

    async def worker(w: int) -> None:
        nonlocal done
        i = w
        while time.perf_counter() < stop_at:
            await client.call("memory/recall", {"query": queries[i % len(queries)], "limit": 10})
            done += 1
            i += clients

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(clients)))
    return round(done / (time.perf_counter() - t0), 1)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    rnd = random.Random(7)
    sizes = {"working": args.working, "episodic": args.episodic, "semantic": args.semantic,
             "procedural": args.procedural}
    start = datetime(2026, 1, 1, tzinfo=timezone.utc)
    out: dict[str, Any] = {"benchmark": "router", "sizes": sizes, "queries": args.queries, "targets": TARGETS}
    with tempfile.TemporaryDirectory(prefix="a2m-bench-") as tmp, embedded_postgres(Path(tmp)) as dsn, \
            federation(Path(tmp), with_postgres(TIERS, dsn), mode="real", timeout=180.0) as stack:
        t0 = time.perf_counter()
        loads = await asyncio.gather(*(load(stack.tiers[name].url, records(name, n, random.Random(name), start))
                                       for name, n in sizes.items() if n))
        out["load_s"] = round(time.perf_counter() - t0, 1)
        out["load_tier_s"] = {name: round(s, 1) for name, s in zip([k for k, v in sizes.items() if v], loads)}
        await settle(dsn)
        queries = [query(rnd) for _ in range(args.queries)]
        tiers = {name: HTTPClient(proc.url, timeout=60) for name, proc in stack.tiers.items()}
        router = HTTPClient(stack.url, timeout=60, max_connections=64)
        try:
            for q in queries[:10]:  # warm every connection pool and cache
                await router.call("memory/recall", {"query": q})
                for client in tiers.values():
                    await client.call("memory/recall", {"query": q, "touch": False})

            # Every probe runs once per query in turn, so the tiers' own recalls and the router's share
            # the machine's state (a background autovacuum after the load, a noisy neighbour) alike.
            pool = FusionConfig.pool  # rerank asks each tier for a broad pool: its fair baseline is the slowest tier at it
            probes: dict[str, Callable[[int], Awaitable[Any]]] = {}
            for name, client in tiers.items():
                probes[name] = lambda i, c=client: c.call(
                    "memory/recall", {"query": queries[i], "limit": 10, "touch": False})
                probes[f"{name}@pool"] = lambda i, c=client: c.call(
                    "memory/recall", {"query": queries[i], "limit": pool, "touch": False})
            # The floor of any fan-out on this machine: the four tiers called concurrently by this client.
            probes["tiers_concurrently"] = lambda i: asyncio.gather(*(c.call(
                "memory/recall", {"query": queries[i], "limit": 10, "touch": False}) for c in tiers.values()))
            probes["router_procedural"] = lambda i: router.call(
                "memory/recall", {"query": queries[i], "limit": 10, "tier": "procedural", "touch": False})
            # touch: false here, so the router's recall counting (background writes to the tiers) does not
            # slow the tiers' own probes that follow; the throughput figure below counts as usual.
            for strategy in ("rrf", "rerank"):
                probes[strategy] = lambda i, s=strategy: router.call(
                    "memory/recall", {"query": queries[i], "limit": 10, "fusion": s, "touch": False})
            lat = await interleaved(len(queries), probes)
            per_tier = {name: {"p50_ms": ms(lat[name], 50), "p99_ms": ms(lat[name], 99)} for name in tiers}
            slowest = max(per_tier, key=lambda n: per_tier[n]["p50_ms"])
            out["tier_recall"] = per_tier
            out["slowest_tier"] = {"name": slowest, **per_tier[slowest],
                                   "pool_p50_ms": ms(lat[f"{slowest}@pool"], 50)}
            out["tiers_concurrently"] = {"p50_ms": ms(lat["tiers_concurrently"], 50),
                                         "p99_ms": ms(lat["tiers_concurrently"], 99)}
            # The router's own cost over one tier (the fastest), without fan-out contention.
            one = ms(lat["router_procedural"], 50)
            out["router_recall_one_tier"] = {"tier": "procedural", "p50_ms": one,
                                             "overhead_ms": round(one - per_tier["procedural"]["p50_ms"], 2)}
            for strategy in ("rrf", "rerank"):
                p50 = ms(lat[strategy], 50)
                out[f"router_recall_{strategy}"] = {
                    "p50_ms": p50, "p99_ms": ms(lat[strategy], 99),
                    # in ms as well as a ratio: a faster slowest tier raises the ratio of the same overhead
                    "over_slowest_tier_ms": round(p50 - per_tier[slowest]["p50_ms"], 2),
                    "vs_slowest_tier": round(p50 / max(per_tier[slowest]["p50_ms"], 1e-6), 2),
                    "vs_slowest_tier_pool": round(p50 / max(out["slowest_tier"]["pool_p50_ms"], 1e-6), 2)}
            await router.call("memory/consolidate", {})  # drain the background recall counting

            # Timeline of one session: a working session (on the working tier) through the router,
            # taking turns with each tier's own timeline of it and the four asked concurrently.
            session = {"where": {"session": "w1"}, "limit": 0}
            probes = {name: lambda i, c=client: c.call("memory/timeline", session) for name, client in tiers.items()}
            probes["tiers_concurrently"] = lambda i: asyncio.gather(
                *(c.call("memory/timeline", session) for c in tiers.values()))
            probes["router"] = lambda i: router.call("memory/timeline", session)
            lat = await interleaved(len(queries), probes)
            out["timeline_session"] = {"p50_ms": ms(lat["router"], 50), "p99_ms": ms(lat["router"], 99)}
            out["tier_timeline"] = {name: {"p50_ms": ms(lat[name], 50)} for name in [*tiers, "tiers_concurrently"]}
            lat = await timed(len(queries), lambda i: router.call(
                "memory/timeline", {"where": {"session": "e3"}, "limit": 0}))
            out["timeline_episodic_session"] = {"p50_ms": ms(lat, 50), "p99_ms": ms(lat, 99)}

            # remember through the router: single records into sessions under capacity, then batches.
            n_single = args.remember
            lat = await timed(n_single, lambda i: router.call("memory/remember", {"records": [
                {"content": text(rnd), "session": f"r{i // CAPACITY}", "role": "user"}]}))
            out["remember_single"] = {"p50_ms": ms(lat, 50), "p99_ms": ms(lat, 99),
                                      "records_per_s": round(n_single / sum(lat), 1)}
            batches = max(1, args.remember // 100)
            lat = await timed(batches, lambda i: router.call("memory/remember", {"records": [
                {"content": text(rnd), "role": "memory", "tier": "episodic"} for _ in range(100)]}))
            out["remember_batch100_episodic"] = {"records_per_s": round(batches * 100 / sum(lat), 1)}

            # Spill: big sessions written straight into working, then session/close moves them to episodic.
            spill_records = 0
            spill_time = 0.0
            for s in range(args.spill_sessions):
                batch = [{"content": text(rnd), "session": f"big{s}", "role": "user"} for _ in range(args.spill_size)]
                await load(stack.tiers["working"].url, batch)
                t0 = time.perf_counter()
                closed = await router.call("memory/session/close", {"session": f"big{s}"})
                spill_time += time.perf_counter() - t0
                spill_records += closed["flushed"]
            out["spill"] = {"records": spill_records, "seconds": round(spill_time, 2),
                            "records_per_s": round(spill_records / spill_time, 1)}

            spies = profilers(stack, args.profile, args.seconds)
            before = cpu_seconds(stack, dsn)
            t0 = time.perf_counter()
            rate = await throughput(router, queries, 16, args.seconds)
            wall = time.perf_counter() - t0
            for spy in spies:
                spy.wait()
            spent = {name: cpu - before.get(name, 0.0) for name, cpu in cpu_seconds(stack, dsn).items()}
            recalls = rate * wall
            out["concurrent_recall"] = {
                "clients": 16, "recalls_per_s": rate,
                # CPU each process spent per recall during the run: what 300/s would need of 2 cores
                "cpu_ms_per_recall": {name: round(1000 * cpu / recalls, 2) for name, cpu in spent.items()},
                "cpu_ms_per_recall_total": round(1000 * sum(spent.values()) / recalls, 2),
                "cores": os.cpu_count()}
            await router.call("memory/consolidate", {})
        finally:
            await router.close()
            for client in tiers.values():
                await client.close()

    rrf, rerank = out["router_recall_rrf"], out["router_recall_rerank"]
    out["meets"] = {
        "recall_rrf_p50_vs_slowest_tier": rrf["vs_slowest_tier"] <= TARGETS["recall_p50_vs_slowest_tier"],
        "recall_rerank_p50_vs_slowest_tier": rerank["vs_slowest_tier"] <= TARGETS["recall_p50_vs_slowest_tier"],
        "recall_rrf_p50_ms": rrf["p50_ms"] <= TARGETS["recall_p50_ms"],
        "recall_rerank_p50_ms": rerank["p50_ms"] <= TARGETS["recall_p50_ms"],
        "timeline_p50_ms": out["timeline_session"]["p50_ms"] <= TARGETS["timeline_p50_ms"],
        "concurrent_recalls_per_s": out["concurrent_recall"]["recalls_per_s"] >= TARGETS["concurrent_recalls_per_s"],
        "spill_records_per_s": out["spill"]["records_per_s"] >= TARGETS["spill_records_per_s"],
    }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: about two minutes")
    parser.add_argument("--working", type=int)
    parser.add_argument("--episodic", type=int)
    parser.add_argument("--semantic", type=int)
    parser.add_argument("--procedural", type=int)
    parser.add_argument("--queries", type=int, help="recall/timeline samples per figure")
    parser.add_argument("--remember", type=int, help="single-record remembers through the router")
    parser.add_argument("--spill-sessions", type=int)
    parser.add_argument("--spill-size", type=int)
    parser.add_argument("--seconds", type=float, help="duration of the 16-client recall run")
    parser.add_argument("--profile", metavar="DIR", help="py-spy (`pip install py-spy`) the router and tiers during "
                                                         "that run into DIR; its CPU figures then include py-spy")
    args = parser.parse_args()
    if args.profile and not (Path(sys.executable).parent / "py-spy").exists():  # before minutes of loading
        parser.error("--profile needs py-spy beside this Python (`pip install py-spy`)")
    quick = dict(working=1000, episodic=5000, semantic=2000, procedural=200, queries=100, remember=200,
                 spill_sessions=2, spill_size=500, seconds=5.0)
    full = dict(working=1000, episodic=100_000, semantic=20_000, procedural=1000, queries=300, remember=500,
                spill_sessions=3, spill_size=1000, seconds=10.0)
    for name, value in (quick if args.quick else full).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    result = asyncio.run(run(args))
    json.dump(result, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
