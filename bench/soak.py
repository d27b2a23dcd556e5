"""Soak the router over the four real tier servers: sustained mixed traffic, resources sampled.

Prints one JSON object. A seeded mix from `--clients` concurrent clients over `--owners` owners
(remember: plain, keyed rewrites, groups, sessions; recall with where/tier; timeline walks with
cursors; forget; reinforce; promote; session close; consolidate; events polls; summarize; bad
requests, each of which must get its own error code) runs for `--seconds`. Every `--every`
seconds each process (the router, each tier server, redis-server, PostgreSQL, git children) is
sampled: RSS, open fds, threads, TCP and unix sockets, children; PostgreSQL's backends, Redis's
clients and memory, the git repository's objects, the data directory's files, the router's
/metrics size, and the latency p50/p99 of the window. At the end every acknowledged live record
must be read back exactly once (with its latest content) and no forgotten one may come back.
What leaks shows as growth from `start` to `mid` to `end` that does not level off.

    python bench/soak.py [--quick] [--seconds 240 --clients 8 --owners 20 --every 10 --think 0.15] [--churn]

`table` holds each process's figures at the start (the first window), middle and end; `samples`
every sample. Keep `--churn` for a leak hunt: the stores then stay near one size, so growth is not data.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from a2m.client import HTTPClient  # noqa: E402
from a2m.errors import A2MError  # noqa: E402
from bench.router import embedded_postgres, ms, with_postgres  # noqa: E402
from tests.router.stack import FOUR, Stack, federation  # noqa: E402

WORDS = ("river lamp cobalt harvest quartz meadow signal ember violet anchor orbit pepper canyon "
         "lantern marble thistle copper summit willow falcon").split()
# Each bad request and the error code it must get.
BAD: list[tuple[str, dict[str, Any], int]] = [
    ("memory/forget", {}, -32602),
    ("memory/promote", {"ids": ["x"], "tier": "nowhere"}, -32002),
    ("memory/fetch", {"key": ""}, -32602),
    ("memory/remember", {"records": [{"role": "user"}]}, -32602),
    ("memory/nope", {}, -32601),
    ("memory/session/close", {"session": ""}, -32602),
    ("memory/summarize", {}, -32602),
    ("memory/describe", {"protocol": "a2m/9.9"}, -32007),
    ("memory/recall", {"tier": "nowhere", "query": "x"}, -32002),
]


class Truth:
    """What one owner was told: its live records (id -> content), keys, groups, sessions, forgotten ids."""

    def __init__(self) -> None:
        self.live: dict[str, str] = {}
        self.keys: dict[str, str] = {}
        self.groups: dict[str, list[str]] = {}
        self.sessions: set[str] = set()
        self.forgotten: set[str] = set()
        self.lock = asyncio.Lock()  # one writer per owner at a time: every answer is unambiguous


class Soak:
    def __init__(self, client: HTTPClient, owners: int, seed: int) -> None:
        self.client = client
        self.truth = {f"soak-{i:02d}": Truth() for i in range(owners)}
        self.rnd = random.Random(seed)
        self.lat: dict[str, list[float]] = collections.defaultdict(list)  # this window's
        self.all_lat: dict[str, list[float]] = collections.defaultdict(list)
        self.errors: collections.Counter[str] = collections.Counter()
        self.bad_wrong: list[str] = []
        self.counts: collections.Counter[str] = collections.Counter()
        self.serial = 0

    def text(self, rnd: random.Random) -> str:
        self.serial += 1
        return " ".join(rnd.choices(WORDS, k=8)) + f" n{self.serial}"

    async def call(self, op: str, method: str, params: dict[str, Any]) -> dict[str, Any] | None:
        t0 = time.perf_counter()
        try:
            return await self.client.call(method, params)
        except A2MError as exc:
            self.errors[f"{op}: {exc.code} {exc.message[:80]}"] += 1
            return None
        except Exception as exc:  # noqa: BLE001  (a transport failure is a finding too)
            self.errors[f"{op}: {type(exc).__name__} {str(exc)[:80]}"] += 1
            return None
        finally:
            took = time.perf_counter() - t0
            self.lat[op].append(took)
            self.all_lat[op].append(took)
            self.counts[op] += 1

    async def op_remember(self, rnd: random.Random, owner: str, t: Truth) -> None:
        kind = rnd.choice(["plain", "plain", "session", "session", "keyed", "group", "skill"])
        records: list[dict[str, Any]]
        if kind == "session":
            session = f"s{rnd.randint(0, 5)}"
            records = [{"content": self.text(rnd), "session": session, "role": "user"}
                       for _ in range(rnd.randint(1, 3))]
        elif kind == "keyed":
            records = [{"content": self.text(rnd), "key": f"app/k{rnd.randint(0, 15)}", "role": "memory"}]
        elif kind == "skill":  # the procedural tier (git): a keyed rewrite of one of a few skills
            records = [{"content": self.text(rnd), "key": f"skill/s{rnd.randint(0, 5)}", "role": "skill",
                        "tier": "procedural"}]
        elif kind == "group":
            group = f"g{self.serial}"
            records = [{"content": self.text(rnd), "group": group, "role": "tool"} for _ in range(3)]
        else:
            records = [{"content": self.text(rnd), "role": "memory", "metadata": {"n": self.serial}}
                       for _ in range(rnd.randint(1, 4))]
        async with t.lock:
            result = await self.call(f"remember_{kind}", "memory/remember", {"owner": owner, "records": records})
            if result is None:
                return
            for rid, record in zip(result["ids"], records):
                t.live[rid] = record["content"]
                if "key" in record:
                    if t.keys.get(record["key"], rid) != rid:
                        self.bad_wrong.append(f"keyed rewrite of {record['key']} got a new id")
                    t.keys[record["key"]] = rid
                if "session" in record:
                    t.sessions.add(record["session"])
            if kind == "group":
                t.groups[records[0]["group"]] = list(result["ids"])

    async def op_recall(self, rnd: random.Random, owner: str, t: Truth) -> None:
        params: dict[str, Any] = {"owner": owner, "query": " ".join(rnd.sample(WORDS, 2)), "limit": 10}
        if rnd.random() < 0.3:
            params["tier"] = rnd.choice(["working", "episodic", "semantic", "procedural"])
        if rnd.random() < 0.3:
            params["where"] = {"role": rnd.choice(["user", "memory", "tool"])}
        await self.call("recall", "memory/recall", params)

    async def op_timeline(self, rnd: random.Random, owner: str, t: Truth) -> None:
        """A walk back through the owner's timeline, a page of 20 at a time, at most 5 pages."""
        params: dict[str, Any] = {"owner": owner, "limit": 20, "cursor": True}
        if rnd.random() < 0.3 and t.sessions:
            params["where"] = {"session": rnd.choice(sorted(t.sessions))}
        seen: set[str] = set()
        for _ in range(5):
            result = await self.call("timeline_page", "memory/timeline", params)
            if result is None:
                return
            ids = [r["id"] for r in result["records"]]
            if seen & set(ids):  # documented (docs/extensions.md) for a record that moved between tiers meanwhile
                self.counts["timeline_reread"] += len(seen & set(ids))
            seen |= set(ids)
            if not result.get("cursor"):
                return
            params["cursor"] = result["cursor"]

    async def op_forget(self, rnd: random.Random, owner: str, t: Truth) -> None:
        async with t.lock:
            if t.groups and rnd.random() < 0.3:
                group = rnd.choice(sorted(t.groups))
                ids = t.groups.pop(group)
                result = await self.call("forget_group", "memory/forget", {"owner": owner, "where": {"group": group}})
            else:
                plain = sorted(set(t.live) - {i for ids in t.groups.values() for i in ids} - set(t.keys.values()))
                if not plain:
                    return
                ids = rnd.sample(plain, min(len(plain), rnd.randint(1, 3)))
                result = await self.call("forget_ids", "memory/forget", {"owner": owner, "ids": ids})
            if result is None:
                return
            if result["forgotten"] != len(ids):
                self.bad_wrong.append(f"forget of {len(ids)} live records of {owner} said {result['forgotten']}")
            for rid in ids:
                t.live.pop(rid, None)
                t.forgotten.add(rid)

    async def op_reinforce(self, rnd: random.Random, owner: str, t: Truth) -> None:
        if t.live:
            ids = rnd.sample(sorted(t.live), min(3, len(t.live)))
            await self.call("reinforce", "memory/reinforce", {"owner": owner, "ids": ids, "amount": 0.1})

    async def op_promote(self, rnd: random.Random, owner: str, t: Truth) -> None:
        async with t.lock:
            grouped = {i for ids in t.groups.values() for i in ids}
            plain = sorted(set(t.live) - grouped - set(t.keys.values()))
            if plain:
                ids = rnd.sample(plain, min(2, len(plain)))
                await self.call("promote", "memory/promote", {"owner": owner, "ids": ids, "tier": "semantic"})

    async def op_close(self, rnd: random.Random, owner: str, t: Truth) -> None:
        async with t.lock:
            if t.sessions:
                await self.call("session_close", "memory/session/close",
                                {"owner": owner, "session": rnd.choice(sorted(t.sessions))})

    async def op_consolidate(self, rnd: random.Random, owner: str, t: Truth) -> None:
        async with t.lock:
            await self.call("consolidate", "memory/consolidate", {"owner": owner})

    async def op_events(self, rnd: random.Random, owner: str, t: Truth, cursors: dict[str, Any]) -> None:
        params: dict[str, Any] = {"owner": owner, "limit": 100}
        if owner in cursors:
            params["cursor"] = cursors[owner]
        result = await self.call("events", "memory/events", params)
        if result is not None:
            cursors[owner] = result["cursor"]
            self.counts["events_seen"] += len(result["events"])
            self.counts["events_reset"] += bool(result.get("reset"))

    async def op_summarize(self, rnd: random.Random, owner: str, t: Truth) -> None:
        async with t.lock:
            result = await self.call("summarize", "memory/summarize",
                                     {"owner": owner, "query": rnd.choice(WORDS), "limit": 10})
            if result is not None:
                for record in result.get("records", []):
                    if "id" in record and record.get("content") is not None:
                        t.live[record["id"]] = record["content"]
                self.counts["summaries_written"] += result.get("written", 0)

    async def op_bad(self, rnd: random.Random, owner: str, t: Truth) -> None:
        method, params, code = rnd.choice(BAD)
        t0 = time.perf_counter()
        try:
            await self.client.call(method, {**params, "owner": owner})
            self.bad_wrong.append(f"{method} {params} succeeded")
        except A2MError as exc:
            if exc.code != code:
                self.bad_wrong.append(f"{method} {params}: {exc.code} {exc.message}, wanted {code}")
        self.lat["bad"].append(time.perf_counter() - t0)
        self.counts["bad"] += 1

    async def client_loop(self, w: int, stop_at: float, think: float, churn: bool) -> None:
        rnd = random.Random(w)
        cursors: dict[str, Any] = {}
        ops = [("remember", 30), ("recall", 25), ("timeline", 10), ("forget", 30 if churn else 8), ("reinforce", 4),
               ("promote", 3), ("close", 4), ("consolidate", 2), ("events", 8), ("summarize", 2), ("bad", 4)]
        names, weights = zip(*ops)
        while time.perf_counter() < stop_at:
            owner = rnd.choice(sorted(self.truth))
            t = self.truth[owner]
            op = rnd.choices(names, weights)[0]
            if op == "events":
                await self.op_events(rnd, owner, t, cursors)
            else:
                await getattr(self, f"op_{op}")(rnd, owner, t)
            await asyncio.sleep(rnd.uniform(0, 2 * think))

    async def verify(self) -> dict[str, Any]:
        """Every live record read back exactly once with its latest content; no forgotten one back."""
        missing, doubled, stale, back, extra = [], [], [], [], 0
        for owner, t in self.truth.items():
            records = (await self.client.call("memory/timeline", {"owner": owner, "limit": 0}, timeout=120))["records"]
            seen = collections.Counter(r["id"] for r in records)
            content = {r["id"]: r["content"] for r in records}
            missing += [f"{owner}/{i}" for i in t.live if i not in seen]
            doubled += [f"{owner}/{i}" for i, n in seen.items() if n > 1]
            stale += [f"{owner}/{i}" for i, c in t.live.items() if i in content and content[i] != c]
            back += [f"{owner}/{i}" for i in t.forgotten if i in seen]
            extra += len(set(seen) - set(t.live) - t.forgotten)
        return {"live": sum(len(t.live) for t in self.truth.values()), "missing": missing[:20],
                "n_missing": len(missing), "doubled": doubled[:20], "stale": stale[:20], "n_stale": len(stale),
                "forgotten_back": back[:20], "n_forgotten_back": len(back), "unknown_records": extra}


# ---- sampling -------------------------------------------------------------------------------

def proc_sample(pid: int) -> dict[str, Any]:
    import psutil

    try:
        p = psutil.Process(pid)
        with p.oneshot():
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
            deleted = sum(1 for fd in fds if _readlink(fd).endswith("(deleted)"))
            return {"rss_mb": round(p.memory_info().rss / 2**20, 1), "fds": len(fds), "deleted_fds": deleted,
                    "threads": p.num_threads(), "tcp": len(p.net_connections(kind="tcp")),
                    "unix": len(p.net_connections(kind="unix")), "children": len(p.children(recursive=True)),
                    "cpu_s": round(sum(p.cpu_times()[:2]), 1)}
    except (psutil.Error, OSError):
        return {"gone": True}


def _readlink(path: Path) -> str:
    try:
        return str(path.readlink())
    except OSError:
        return ""


def children_named(pid: int, name: str) -> list[int]:
    import psutil

    try:
        return [c.pid for c in psutil.Process(pid).children(recursive=True) if name in c.name()]
    except psutil.Error:
        return []


def redis_info(pid: int) -> dict[str, Any]:
    import psutil
    import redis

    try:
        socks = [c.laddr for c in psutil.Process(pid).net_connections(kind="unix") if c.laddr]
        client = redis.Redis(unix_socket_path=socks[0], socket_timeout=2)
        info = client.info()
        client.close()
        return {"clients": info["connected_clients"], "used_memory_mb": round(info["used_memory"] / 2**20, 2),
                "keys": sum(v.get("keys", 0) for k, v in info.items() if k.startswith("db") and isinstance(v, dict))}
    except Exception as exc:  # noqa: BLE001
        return {"error": str(exc)[:80]}


def postgres_sample(dsn: str, pgdata: Path) -> dict[str, Any]:
    import psutil
    import psycopg

    out: dict[str, Any] = {}
    try:
        postmaster = int((pgdata / "postmaster.pid").read_text().split()[0])
        procs = [psutil.Process(postmaster), *psutil.Process(postmaster).children()]
        out["procs"] = len(procs)
        out["rss_mb"] = round(sum(p.memory_info().rss for p in procs) / 2**20, 1)
        with psycopg.connect(dsn, autocommit=True) as conn:
            rows = conn.execute("SELECT state, count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' "
                                "AND pid <> pg_backend_pid() GROUP BY state").fetchall()
            out["backends"] = {str(state): n for state, n in rows}
            out["records"] = conn.execute("SELECT count(*) FROM records").fetchone()[0]
            out["db_mb"] = round(conn.execute("SELECT pg_database_size(current_database())").fetchone()[0] / 2**20, 1)
    except Exception as exc:  # noqa: BLE001
        out["error"] = str(exc)[:80]
    return out


def git_sample(data: Path) -> dict[str, Any]:
    repos = [p.parent for p in data.rglob("HEAD") if p.parent.name == ".git" or (p.parent / "objects").is_dir()]
    if not repos:
        return {}
    run = subprocess.run(["git", "count-objects", "-v"], cwd=repos[0], capture_output=True, text=True)
    fields = dict(line.split(": ") for line in run.stdout.splitlines() if ": " in line)
    return {"loose": int(fields.get("count", 0)), "packs": int(fields.get("packs", 0)),
            "in_pack": int(fields.get("in-pack", 0)), "size_kb": int(fields.get("size", 0))}


def files_under(path: Path) -> int:
    return sum(1 for _ in path.rglob("*"))


def metrics_size(url: str) -> dict[str, Any]:
    try:
        body = urllib.request.urlopen(url + "metrics", timeout=5).read().decode()
    except OSError as exc:
        return {"error": str(exc)[:80]}
    return {"lines": sum(1 for line in body.splitlines() if line and not line.startswith("#"))}


def sample(stack: Stack, data: Path, dsn: str, pgdata: Path) -> dict[str, Any]:
    out: dict[str, Any] = {"router": proc_sample(stack.router.popen.pid)}  # type: ignore[union-attr]
    for name, proc in stack.tiers.items():
        out[name] = proc_sample(proc.popen.pid)  # type: ignore[union-attr]
    for pid in children_named(stack.tiers["working"].popen.pid, "redis"):  # type: ignore[union-attr]
        out["redis"] = {**proc_sample(pid), **redis_info(pid)}
    out["git_children"] = len(children_named(stack.tiers["procedural"].popen.pid, "git"))  # type: ignore[union-attr]
    out["postgres"] = postgres_sample(dsn, pgdata)
    out["git"] = git_sample(data)
    out["data_files"] = files_under(data)
    out["tmp_entries"] = sum(1 for _ in Path(tempfile.gettempdir()).iterdir())
    out["metrics"] = metrics_size(stack.url)
    return out


def window(lat: dict[str, list[float]]) -> dict[str, Any]:
    every = [x for v in lat.values() for x in v]
    return {"calls": len(every), "p50_ms": ms(every, 50) if every else None, "p99_ms": ms(every, 99) if every else None}


PROCESSES = ("router", "working", "episodic", "semantic", "procedural", "redis")
FIGURES = ("rss_mb", "fds", "threads", "tcp", "unix", "children", "clients", "used_memory_mb")


def table(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Start (after the first window), middle and end of each figure: what growth looks like at a glance."""
    run = [s for s in samples if "window" in s]
    picks = [run[min(1, len(run) - 1)], run[len(run) // 2], run[-1]]
    out: dict[str, Any] = {"t": [p["t"] for p in picks]}
    for name in PROCESSES:
        out[name] = {f: [p.get(name, {}).get(f) for p in picks] for f in FIGURES
                     if any(p.get(name, {}).get(f) is not None for p in picks)}
    for name in ("postgres", "git"):
        out[name] = [p.get(name) for p in picks]
    for name in ("data_files", "git_children"):
        out[name] = [p.get(name) for p in picks]
    out["metrics_lines"] = [p.get("metrics", {}).get("lines") for p in picks]
    out["window_p50_ms"] = [p["window"]["p50_ms"] for p in picks]
    out["window_p99_ms"] = [p["window"]["p99_ms"] for p in picks]
    return out


def log_repeats(folder: Path) -> dict[str, list[tuple[str, int]]]:
    """The most repeated lines of each log, digits folded, so an unbounded repeat stands out."""
    out = {}
    for log in sorted(folder.glob("*.log")):
        lines = collections.Counter(re.sub(r"[0-9a-f]{6,}|\d+", "#", line)[:160]
                                    for line in log.read_text(errors="replace").splitlines())
        out[log.stem] = lines.most_common(5)
    return out


async def run(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"benchmark": "soak", "seconds": args.seconds, "clients": args.clients,
                           "owners": args.owners, "seed": args.seed}
    tmp = Path(tempfile.mkdtemp(prefix="soak-", dir="/tmp"))
    tiers = [{**t, "timeout": 20.0} for t in FOUR]
    env = {}
    if args.gc_auto is not None:  # git reads it from the tier's $HOME/.gitconfig, GitPython as well
        (tmp / "home").mkdir()
        (tmp / "home" / ".gitconfig").write_text(f"[gc]\n\tauto = {args.gc_auto}\n")
        env["HOME"] = str(tmp / "home")
    grace = {"router": {"intent_grace": 2 * sum(t["timeout"] for t in tiers)}}  # above a batch's slowest write
    with embedded_postgres(tmp) as dsn, federation(tmp, with_postgres(tiers, dsn), mode="real", timeout=180,
                                                   env=env, top=grace) as stack:
        data = Path(stack.tiers["procedural"].command[stack.tiers["procedural"].command.index("--data") + 1])
        pgdata = Path(dsn.split("host=")[-1].split("&")[0])
        print(f"soak: logs in {tmp}, data in {data}", file=sys.stderr)
        out["pids"] = {name: proc.popen.pid for name, proc in [("router", stack.router), *stack.tiers.items()]}
        client = HTTPClient(stack.url, timeout=60, max_connections=args.clients * 2)
        soak = Soak(client, args.owners, args.seed)
        samples: list[dict[str, Any]] = []
        stop_at = time.perf_counter() + args.seconds
        t0 = time.perf_counter()

        async def sampler() -> None:
            while True:
                snap = await asyncio.to_thread(sample, stack, data, dsn, pgdata)
                lat, soak.lat = soak.lat, collections.defaultdict(list)
                snap["t"] = round(time.perf_counter() - t0)
                snap["window"] = window(lat)
                samples.append(snap)
                if args.snapshot_signal and (len(samples) == 3 or time.perf_counter() >= stop_at):
                    for proc in [stack.router, *stack.tiers.values()]:  # a heap profiler's hook, if one is set up
                        os.kill(proc.popen.pid, signal.SIGUSR2)  # type: ignore[union-attr]
                print(json.dumps({"t": snap["t"], **snap["window"], "router": snap["router"],
                                  "pg": snap["postgres"].get("backends")}), file=sys.stderr)
                if time.perf_counter() >= stop_at:
                    return
                await asyncio.sleep(args.every)

        try:
            sampling = asyncio.create_task(sampler())
            await asyncio.gather(*(soak.client_loop(w, stop_at, args.think, args.churn) for w in range(args.clients)))
            await sampling
            out["verify"] = await soak.verify()
            samples.append({**sample(stack, data, dsn, pgdata), "t": round(time.perf_counter() - t0), "after": True})
        finally:
            await client.close()
        out["calls"] = dict(soak.counts)
        out["latency"] = {op: {"n": len(v), "p50_ms": ms(v, 50), "p99_ms": ms(v, 99)}
                          for op, v in sorted(soak.all_lat.items())}
        out["errors"] = dict(soak.errors.most_common(20))
        out["wrong"] = soak.bad_wrong[:30]
        out["n_wrong"] = len(soak.bad_wrong)
        out["table"] = table(samples)
        out["samples"] = samples
        verify = out["verify"]
        out["meets"] = {"no_errors": not soak.errors, "no_wrong_answers": not soak.bad_wrong,
                        "every_live_record_once": not (verify["n_missing"] or verify["doubled"] or verify["n_stale"]),
                        "no_forgotten_record_back": not verify["n_forgotten_back"]}
        out["logs"] = log_repeats(tmp)
    if args.keep_logs:
        out["log_dir"] = str(tmp)
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=240.0)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--owners", type=int, default=20)
    parser.add_argument("--every", type=float, default=10.0, help="seconds between samples")
    parser.add_argument("--think", type=float, default=0.15, help="mean pause of a client between calls (s)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--churn", action="store_true",
                        help="forget about as often as remember, so the stores stay near one size: "
                             "growth is then a leak")
    parser.add_argument("--snapshot-signal", action="store_true",
                        help="send SIGUSR2 to the router and tiers at the third and the last sample (for a heap "
                             "profiler the processes were started with; they die of it without one)")
    parser.add_argument("--quick", action="store_true", help="a one-minute run")
    parser.add_argument("--keep-logs", action="store_true", help="keep the servers' logs (their folder is printed)")
    parser.add_argument("--gc-auto", type=int, help="the procedural repository's gc.auto (git's 6,700 by default): "
                                                    "lower, a short run packs it under load")
    args = parser.parse_args()
    if args.quick:
        args.seconds = min(args.seconds, 60.0)
    json.dump(asyncio.run(run(args)), sys.stdout, indent=1, default=str)
    print()


if __name__ == "__main__":
    main()
