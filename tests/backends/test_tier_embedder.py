"""A tier server whose own embedder makes vectors of another width than the tier holds (a corpus
embedded by another model, served with `--embedder`): refused at start where the width is known,
and recalled by text (never failed) where it is learnt only at the first query (an HTTP embedder).
The embedder is the real `HTTPEmbedder` against the router tests' OpenAI-compatible stand-in."""

from __future__ import annotations

from pathlib import Path

import pytest

from a2m.dispatch import Context, Dispatcher
from a2m.embedder import HTTPEmbedder
from backends.serve import build
from backends.settings import SettingsError, TierSettings
from tests.router.test_router_embedder import DIMS, Embeddings, serving

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_an_embedder_of_another_width_is_refused_at_start_or_leaves_text_recall(tmp_path: Path) -> None:
    settings = TierSettings(name="corpus", data_dir=tmp_path / "semantic")
    plain = build("semantic", settings)
    await plain.startup()
    try:
        await Dispatcher(plain).call("memory/remember", {"records": [
            {"content": "the kettle manual, page four", "embedding": [1.0, 0.0, 0.0, 0.0]}]}, Context())
    finally:
        await plain.shutdown()
    with serving(Embeddings()) as stand_in:
        embedder = HTTPEmbedder(f"http://127.0.0.1:{stand_in.server_address[1]}/v1", "hashed-bow", None)
        served = build("semantic", settings, embedder=embedder)
        await served.startup()  # the embedder's width is not known yet
        try:
            found = await Dispatcher(served).call("memory/recall", {"query": "kettle"}, Context())
        finally:
            await served.shutdown()
        assert [r["content"] for r in found["records"]] == ["the kettle manual, page four"]
        assert embedder.dimensions == DIMS  # learnt from that query
        with pytest.raises(SettingsError, match="holds 4-dim vectors and --embedder makes 16"):
            await build("semantic", settings, embedder=embedder).startup()
