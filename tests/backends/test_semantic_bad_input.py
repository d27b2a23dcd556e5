"""Bad input to the semantic tier server, on both Qdrant engines (Qdrant Edge and qdrant-client's local
mode): each refusal is the protocol's error (-32602 here, as the episodic tier answers) and leaves the
store as it was, never -32603 from inside the store nor a write one engine takes and the other refuses."""

from __future__ import annotations

from pathlib import Path
from typing import Any, AsyncIterator

import pytest

from a2m.dispatch import Dispatcher
from a2m.records import MAX_DIMENSIONS
from tests.support.inprocess import call, dispatchers, owner

pytestmark = pytest.mark.anyio

ENGINES = ("edge", "local")
LONE = "a\ud800b"  # a lone surrogate: no UTF-8 spelling (only an in-process caller can send it)


@pytest.fixture(params=ENGINES)
async def tier(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Dispatcher]:
    options = {"engine": "local"} if request.param == "local" else {}
    async with dispatchers(tmp_path, ["semantic"], options) as running:
        yield running["semantic"]


async def held(d: Dispatcher, me: str) -> list[dict[str, Any]]:
    return (await call(d, "memory/timeline", {"owner": me, "embeddings": True}))["records"]


async def test_an_id_with_a_lone_surrogate_is_invalid_params_and_changes_nothing(tier: Dispatcher) -> None:
    me = owner()
    await call(tier, "memory/remember", {"owner": me, "records": [{"id": me + "-a", "content": "kept"}]})
    before = await held(tier, me)
    batch = [{"id": me + "-b", "content": "good"}, {"id": LONE, "content": "bad"}]
    assert await call(tier, "memory/remember", {"owner": me, "records": batch}) == {"error": -32602}
    assert await call(tier, "memory/forget", {"owner": me, "ids": [me + "-a", LONE]}) == {"error": -32602}
    assert await call(tier, "memory/reinforce", {"owner": me, "ids": [me + "-a", LONE]}) == {"error": -32602}
    assert await held(tier, me) == before


async def test_a_vector_wider_than_qdrant_allows_is_refused_by_both_engines(tier: Dispatcher) -> None:
    """Qdrant Edge took 65,537 dimensions where a Qdrant server refuses them: the answer depended on
    the engine. Every tier now refuses past pgvector's 16,000 (`MAX_DIMENSIONS`) before its engine."""
    me = owner()
    wide = [{"content": "good"}, {"content": "too wide", "embedding": [0.5] * 65_537}]
    assert await call(tier, "memory/remember", {"owner": me, "records": wide}) == {"error": -32602}
    assert await held(tier, me) == []
    assert (await call(tier, "memory/describe", {}))["embeddings"]["dimensions"] is None
    widest = [{"content": "widest", "embedding": [0.5] * MAX_DIMENSIONS}]
    assert len((await call(tier, "memory/remember", {"owner": me, "records": widest}))["ids"]) == 1
