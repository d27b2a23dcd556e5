"""Run every benchmark of `bench/` and gather one report: JSON plus a short Markdown table.

Each benchmark is its own process (its engines start and stop with it) that
prints JSON: one object, or one object per line. They run one after another,
never together, so one does not eat the other's CPU. A benchmark that fails
or times out is recorded as such and the rest still run.

    python bench/run_all.py --quick     # a few minutes: reduced sizes
    python bench/run_all.py             # the sizes named in the issues
    python bench/run_all.py --only locomo,peer_langgraph

Writes `bench/results/latest.json` and `bench/results/latest.md` (or `--out DIR`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Sequence

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
ORDER = ["protocol", "working", "episodic", "semantic", "procedural", "tiers_http", "router", "paging", "locomo",
         "peer_langgraph", "soak"]
SKIP = {"run_all", "__init__"}

# Arguments per benchmark: (quick, full). A benchmark not listed gets `--quick` when its
# source accepts it (quick) and nothing (full).
ARGS: dict[str, tuple[list[str], list[str]]] = {
    "procedural": (["--records", "500", "--writes", "50", "--searches", "200"], []),
    "working": (["--iterations", "300"], []),
    "locomo": (["--up", "--quick"], ["--up", "--embedder", "none,local", "--fusion", "rrf,rerank"]),
    "peer_langgraph": (["--quick"], []),
}
TIMEOUT = {"quick": 420, "full": 3600}


def machine() -> dict[str, Any]:
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                memory = round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gib": memory, "os": platform.platform(),
            "python": platform.python_version(),
            "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}


def discover(only: Sequence[str] | None) -> list[str]:
    names = [p.stem for p in BENCH.glob("*.py") if p.stem not in SKIP and not p.stem.startswith("_")]
    if only:
        missing = set(only) - set(names)
        if missing:
            raise SystemExit(f"no benchmark {sorted(missing)} in {BENCH}")
        names = [n for n in names if n in only]
    rank = {n: i for i, n in enumerate(ORDER)}
    return sorted(names, key=lambda n: (rank.get(n, len(ORDER)), n))


def arguments(name: str, quick: bool) -> list[str]:
    if name in ARGS:
        return ARGS[name][0 if quick else 1]
    if quick and re.search(r"""["']--quick["']""", (BENCH / f"{name}.py").read_text()):
        return ["--quick"]
    return []


def parse_output(text: str) -> list[dict[str, Any]]:
    """Every JSON object the benchmark printed: one per line, or one document spanning lines."""
    objects = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(value, dict):
                objects.append(value)
    if not objects and text.strip():
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            return []
        objects = value if isinstance(value, list) else [value]
    return [o for o in objects if isinstance(o, dict)]


def run_one(name: str, quick: bool, timeout: float) -> dict[str, Any]:
    command = [sys.executable, str(BENCH / f"{name}.py"), *arguments(name, quick)]
    print(f"[run_all] {name}: {' '.join(command[1:])}", file=sys.stderr, flush=True)
    started = time.perf_counter()
    env = {**os.environ, "TQDM_DISABLE": "1", "PYTHONUNBUFFERED": "1"}
    # Its own process group: a benchmark that times out is stopped with the servers it started.
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
        rc: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        rc = None
        for sig, grace in ((signal.SIGTERM, 20), (signal.SIGKILL, 5)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                stdout, stderr = proc.communicate(timeout=grace)
                break
            except subprocess.TimeoutExpired:
                stdout, stderr = "", ""
    wall = round(time.perf_counter() - started, 1)
    out: dict[str, Any] = {"command": command[1:], "rc": rc, "wall_s": wall, "results": parse_output(stdout)}
    if rc != 0:
        out["error"] = "timed out" if rc is None else f"exit {rc}"
        out["stderr_tail"] = stderr[-2000:]
    print(f"[run_all] {name}: {out.get('error', 'ok')} in {wall} s", file=sys.stderr, flush=True)
    return out


# --- the table -------------------------------------------------------------------------------------------------

PREFERRED = ("recall@5", "recall@10", "recall@20", "p50_ms", "p99_ms", "rps", "ops_per_s", "writes_per_s",
             "ingest_s", "query_s")


def _label(name: str, result: dict[str, Any]) -> str:
    parts = [str(result[k]) for k in ("system", "case", "name", "mode", "engine", "transport") if k in result]
    for key in ("embedder", "fusion"):
        if key in result and f"{result[key]}" not in " ".join(parts):
            parts.append(f"{key}={result[key]}")
    return " ".join(parts) or name


# The figures each issue's targets are about, by dotted path into a benchmark's JSON: the table's
# row shows these (and which of the benchmark's own `meets` failed) rather than whichever scalars
# happen to sit at the top level. A path a result lacks is left out.
HEADLINE: dict[str, tuple[str, ...]] = {
    "protocol": ("bare/a2m-client.p50_ms", "a2m/a2m-client.p50_ms", "dispatcher_overhead_p50", "target_overhead_p50",
                 "a2m/a2m-client.rps_concurrent"),
    "working": ("http.timeline_32.p50_ms", "http.raw_timeline_32.p50_ms", "ratios.http_timeline_vs_raw_p50",
                "http.remember_4.p50_ms", "http.bulk_records_per_s", "store.timeline_32.p50_ms"),
    "episodic": ("insert_per_s", "cases.vector_owner_session.p50_ms", "cases.vector_owner_session.vs_raw_sql",
                 "cases.vector_owner_session.recall_at_10", "cases.vector_7_days.p50_ms",
                 "cases.vector_7_days.vs_raw_sql", "cases.vector_7_days.recall_at_10", "cases.vector.recall_at_10",
                 "cases.hybrid.p50_ms"),
    "semantic": ("upsert_records_per_s", "upsert_raw_engine_records_per_s", "search.dense/all.store.p50_ms",
                 "search.dense/all.raw_engine.p50_ms", "dense_recall_at_10.all", "dense_recall_at_10.owner"),
    "procedural": ("write_commit.p50_ms", "bare_gitpython_commit.p50_ms", "search_store.p50_ms"),
    "tiers_http": ("working.timeline_32.p50_ms", "episodic.insert_per_s_batch500",
                   "episodic.vector_owner_session.p50_ms", "episodic.vector_owner_session.vs_raw_sql",
                   "episodic.vector_7_days.p50_ms", "episodic.vector_7_days.vs_raw_sql",
                   "semantic.dense.p50_ms", "semantic.upsert_per_s_batch500", "procedural.write_commit.p50_ms",
                   "procedural.recall.p50_ms"),
    "router": ("router_recall_rrf.p50_ms", "router_recall_rrf.vs_slowest_tier", "router_recall_rerank.p50_ms",
               "router_recall_rerank.vs_slowest_tier", "slowest_tier.p50_ms", "timeline_session.p50_ms",
               "concurrent_recall.recalls_per_s", "spill.records_per_s"),
    "paging": tuple(f"{tier}.{figure}" for tier in ("working", "episodic", "semantic", "procedural", "router")
                    for figure in ("cursor_records_per_s", "cursor_vs_time", "crowded_records_per_s")),
}


def _dig(result: dict[str, Any], path: str) -> Any:
    value: Any = result
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def _figures(result: dict[str, Any], limit: int = 8, name: str | None = None) -> str:
    if name in HEADLINE:
        shown = [f"{path} {value}" for path in HEADLINE[name]
                 if isinstance(value := _dig(result, path), (int, float)) and not isinstance(value, bool)]
        if shown:
            meets = result.get("meets")
            if isinstance(meets, dict) and meets:
                missed = [k for k, ok in meets.items() if not ok]
                shown.append("targets: all met" if not missed else f"targets missed: {', '.join(missed)}")
            return ", ".join(shown)
    numeric = {k: v for k, v in result.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    keys = [k for k in PREFERRED if k in numeric] + [k for k in numeric if k not in PREFERRED]
    skip = {"questions", "turns", "questions_without_evidence", "writes", "dimensions", "startup_s"}
    keys = [k for k in keys if k not in skip][:limit]
    nested = [(k, v) for k, v in result.items() if isinstance(v, dict) and v
              and all(isinstance(x, (int, float)) for x in v.values()) and k not in ("tier_counts",)]
    text = ", ".join(f"{k} {numeric[k]}" for k in keys)
    if not keys and nested:
        key, values = nested[0]
        text = ", ".join(f"{key}.{k} {v}" for k, v in list(values.items())[:limit])
    return text


def markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    lines = [f"# Benchmarks ({'quick' if report['quick'] else 'full'}), {report['date']}", "",
             f"{m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, Python {m['python']}, "
             f"load at start {', '.join(f'{x:.1f}' for x in m['load_average'] or [])}", "",
             "| bench | configuration | figures |", "|---|---|---|"]
    for name, entry in report["benchmarks"].items():
        if entry.get("error"):
            tail = (entry.get("stderr_tail") or "").strip().splitlines()
            last = tail[-1][:120].replace("|", "/") if tail else ""
            lines.append(f"| {name} | **{entry['error']}** ({entry['wall_s']} s) | {last} |")
        results = entry["results"]
        if not results and not entry.get("error"):
            lines.append(f"| {name} | (no JSON printed) | |")
        for result in results:
            if "skipped" in result:
                lines.append(f"| {name} | {_label(name, result)} | skipped: {result['skipped']} |")
                continue
            lines.append(f"| {name} | {_label(name, result)} | {_figures(result, name=name)} |")
    lines.append("")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="reduced sizes: a few minutes in all")
    parser.add_argument("--only", help="comma-separated benchmark names (file stems)")
    parser.add_argument("--out", type=Path, default=BENCH / "results", help="where latest.json/.md go")
    parser.add_argument("--timeout", type=float, help="seconds per benchmark")
    args = parser.parse_args(argv)
    names = discover([n for n in (args.only or "").split(",") if n])
    timeout = args.timeout or TIMEOUT["quick" if args.quick else "full"]
    report: dict[str, Any] = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                              "quick": args.quick, "machine": machine(), "benchmarks": {}}
    started = time.perf_counter()
    for name in names:
        report["benchmarks"][name] = run_one(name, args.quick, timeout)
    report["wall_s"] = round(time.perf_counter() - started, 1)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "latest.json").write_text(json.dumps(report, indent=2) + "\n")
    table = markdown(report)
    (args.out / "latest.md").write_text(table)
    print(table)
    return report


if __name__ == "__main__":
    main()
