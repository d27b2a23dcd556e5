"""A tier server whose own embedder makes vectors of another width than the tier holds (a corpus
embedded by another model, served with `--embedder`): refused at start where the width is known,
and recalled by text (never failed) where it is learnt only at the first query (an HTTP embedder).
The embedder is the real `HTTPEmbedder` against the router tests' OpenAI-compatible stand-in."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

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


async def holding_four_dims(name: str, tmp_path: Path) -> TierSettings:
    """The settings of a semantic tier that holds one record with a 4-dim vector (the stand-in makes 16)."""
    settings = TierSettings(name=name, data_dir=tmp_path / "semantic")
    plain = build("semantic", settings)
    await plain.startup()
    try:
        await Dispatcher(plain).call("memory/remember", {"records": [
            {"content": "the kettle manual, page four", "embedding": [1.0, 0.0, 0.0, 0.0]}]}, Context())
    finally:
        await plain.shutdown()
    return settings


def embedder_of(stand_in: Any) -> HTTPEmbedder:
    return HTTPEmbedder(f"http://127.0.0.1:{stand_in.server_address[1]}/v1", "hashed-bow", None)


async def test_an_embedder_of_another_width_is_refused_at_start_or_leaves_text_recall(tmp_path: Path) -> None:
    settings = await holding_four_dims("corpus", tmp_path)
    with serving(Embeddings()) as stand_in:
        embedder = embedder_of(stand_in)
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


async def write_then_recall(served: Any, content: str, query: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Start `served`, write one record and recall it with its vectors, stop it: (remember's, recall's result)."""
    await served.startup()
    try:
        rpc = Dispatcher(served)
        written = await rpc.call("memory/remember", {"records": [{"content": content}]}, Context())
        return written, await rpc.call("memory/recall", {"query": query, "embeddings": True}, Context())
    finally:
        await served.shutdown()


async def test_a_write_is_kept_without_vectors_when_the_embedder_makes_another_width(tmp_path: Path) -> None:
    """Learnt only at the first call (an HTTP embedder, say after a change of model), a width other
    than the tier's failed the caller's write with -32008, a fault that was not the caller's:
    embedding never fails a write, so the record is written without a vector and found by text."""
    settings = await holding_four_dims("notes", tmp_path)
    with serving(Embeddings()) as stand_in:
        embedder = embedder_of(stand_in)
        served = build("semantic", settings, embedder=embedder)
        written, found = await write_then_recall(served, "the toaster manual", "toaster")
    assert len(written["ids"]) == 1 and embedder.dimensions == DIMS
    assert [(r["content"], r.get("embedding")) for r in found["records"]] == [("the toaster manual", None)]


async def test_a_query_of_another_width_is_logged_once_not_on_every_recall(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Each recall with a query logged the width mismatch again: one warning a recall, for a
    setting that only a restart changes."""
    settings = await holding_four_dims("corpus", tmp_path)
    caplog.set_level(logging.WARNING)
    with serving(Embeddings()) as stand_in:
        embedder = embedder_of(stand_in)
        served = build("semantic", settings, embedder=embedder)
        await served.startup()
        try:
            for _ in range(3):
                found = await Dispatcher(served).call("memory/recall", {"query": "kettle"}, Context())
                assert [r["content"] for r in found["records"]] == ["the kettle manual, page four"]
        finally:
            await served.shutdown()
    assert len([r for r in caplog.records if "4-dim vectors" in r.getMessage()]) == 1, caplog.text


async def test_an_embedder_wider_than_a_record_may_be_leaves_records_without_vectors(tmp_path: Path) -> None:
    """A record's vector has at most MAX_DIMENSIONS (16,000: pgvector's) on every tier, so that it
    can move to any. A caller's wider one is -32602, but the tier's own embedder's was stored (Qdrant
    takes up to 65,536): a record written to semantic that could never move to episodic. Such an
    embedder is unusable, as one answering NaN: the record is written without a vector."""
    from a2m.records import MAX_DIMENSIONS

    from tests.a2m.test_http_embedder import endpoint

    def wide(texts: list[str]) -> tuple[int, Any, dict[str, str]]:
        return 200, {"data": [{"index": i, "embedding": [0.5] * (MAX_DIMENSIONS + 1)}
                              for i in range(len(texts))]}, {}

    with endpoint([wide]) as (_, url):
        served = build("semantic", TierSettings(name="notes", data_dir=tmp_path / "semantic"),
                       embedder=HTTPEmbedder(url, "wide"))
        written, found = await write_then_recall(served, "the kettle manual", "kettle")
    assert len(written["ids"]) == 1
    assert [(r["content"], r.get("embedding")) for r in found["records"]] == [("the kettle manual", None)]
