"""bench/run_all.py's Markdown table: the figures the targets are about, and which targets a run missed."""

from __future__ import annotations

from bench.run_all import markdown


def _report(benchmarks: dict) -> dict:
    machine = {"cpu": "cpu", "cores": 2, "memory_gib": 1.0, "python": "3.11", "load_average": [0.0, 0.0, 0.0]}
    return {"date": "today", "quick": True, "machine": machine, "benchmarks": benchmarks}


def test_a_row_shows_its_headline_figures_and_the_targets_it_missed() -> None:
    router = {"queries": 300, "load_s": 7.8, "router_recall_rrf": {"p50_ms": 9.9, "vs_slowest_tier": 1.28},
              "timeline_session": {"p50_ms": 2.6}, "meets": {"timeline_p50_ms": True, "concurrent_recalls_per_s": False}}
    table = markdown(_report({"router": {"wall_s": 1.0, "results": [router]}}))
    row = next(line for line in table.splitlines() if line.startswith("| router"))
    assert "router_recall_rrf.p50_ms 9.9" in row and "router_recall_rrf.vs_slowest_tier 1.28" in row
    assert "timeline_session.p50_ms 2.6" in row
    assert "targets missed: concurrent_recalls_per_s" in row and "load_s" not in row


def test_a_benchmark_without_a_headline_still_shows_its_scalars() -> None:
    table = markdown(_report({"other": {"wall_s": 1.0, "results": [{"system": "x", "p50_ms": 1.5}]}}))
    assert "| other | x | p50_ms 1.5 |" in table


def test_every_headline_path_names_a_number_the_benchmark_prints() -> None:
    """semantic's recall@10 is a dict per partition: a path ending at the dict showed nothing."""
    semantic = {"upsert_records_per_s": 9000.0, "dense_recall_at_10": {"all": 0.98, "owner": 1.0}}
    table = markdown(_report({"semantic": {"wall_s": 1.0, "results": [semantic]}}))
    row = next(line for line in table.splitlines() if line.startswith("| semantic"))
    assert "dense_recall_at_10.all 0.98" in row and "dense_recall_at_10.owner 1.0" in row


def test_the_protocol_benchmark_runs_against_the_client_the_router_uses() -> None:
    """Its bare baseline answered every request with id 1; once the a2m client checked the answer's
    id against its request's, the benchmark stopped at its second request and run_all lost the row."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "bench" / "protocol.py"
    done = subprocess.run([sys.executable, str(script), "--requests", "40", "--concurrency", "2"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    figures = json.loads(done.stdout)
    assert figures["bare/a2m-client"]["p50_ms"] > 0 and figures["a2m/a2m-client"]["p50_ms"] > 0, figures
