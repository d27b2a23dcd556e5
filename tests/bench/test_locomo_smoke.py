"""bench/locomo.py end to end on one LoCoMo conversation: it completes and its figures are in range.

Not a quality gate (targets are tracked by the full run's report, not CI): this
proves the ingest path (sessions, imported `created_at`, session close, recall
by owner) works through a real federation and that scoring stays sane.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench.locomo import DEFAULT_DATA, load_all, recall_at
from tests.support.procs import ROOT

pytestmark = pytest.mark.skipif(not (DEFAULT_DATA / "30.json").exists(),
                                reason=f"LoCoMo dev split not at {DEFAULT_DATA}")


def test_loader_reads_only_what_a_memory_system_may_see() -> None:
    [conv] = load_all(DEFAULT_DATA, ["30"])
    assert conv.sessions and all(s.turns for s in conv.sessions)
    assert [s.number for s in conv.sessions] == sorted(s.number for s in conv.sessions)
    assert all(q.category in (1, 2, 3, 4) and q.evidence for q in conv.questions)
    ids = {t.dia_id for t in conv.turns}
    assert all(q.evidence <= ids for q in conv.questions)


def test_recall_at_k_counts_each_turn_once() -> None:
    evidence = frozenset({"D1:1", "D2:2"})
    assert recall_at(["D1:1", "D1:1", "D2:2"], evidence, 2) == 1.0
    assert recall_at(["D9:9", "D1:1"], evidence, 1) == 0.0
    assert recall_at([], evidence, 5) == 0.0


@pytest.mark.timeout(170)
def test_locomo_through_the_router_on_one_conversation() -> None:
    command = [sys.executable, "bench/locomo.py", "--up", "--conversations", "30", "--questions", "24",
               "--fusion", "rrf"]
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=160)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = {r["system"]: r for r in map(json.loads, filter(None, proc.stdout.splitlines()))}
    assert set(results) == {"bm25-turns", "router/rrf"}
    for result in results.values():
        assert result["questions"] == 24
        figures = [result["recall@5"], result["recall@10"], result["recall@20"]]
        assert all(isinstance(x, float) and 0.0 <= x <= 1.0 for x in figures), result
        assert figures == sorted(figures), result
    router = results["router/rrf"]
    assert router["writes"] == router["turns"] > 300
    assert router["tier_counts"].get("working") == 0  # every session was closed, so nothing stayed in working
    assert "records_without_dia_id" not in router  # metadata round-trips through every tier
