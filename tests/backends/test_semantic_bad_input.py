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


# Lengths the shared validation accepts (decision 38: every element rounds to a finite float32) where Qdrant
# lost a vector's direction: it normalises for cosine only when the float32 squared length is at least
# float32's epsilon (under a length of about 3e-4), and past about 1.8e19 the squares overflow.
LENGTHS = (1e-5, 1e-30, 1e25, 3e38)


@pytest.mark.parametrize("size", LENGTHS)
async def test_a_vector_of_any_accepted_length_keeps_its_direction_and_comes_back_verbatim(
        tier: Dispatcher, size: float) -> None:
    """Stored and query vectors of such lengths ranked as if they had no direction (every score 0.5), in
    whatever order the engine kept: the store now hands Qdrant each vector scaled to length 1 in float64,
    and keeps the caller's own vector for `embeddings: true`."""
    me = owner()
    vectors = {"x": [size, 0.0, 0.0], "y": [0.0, size, 0.0], "z": [-size, 0.0, 0.0]}
    batch = [{"id": f"{me}-{name}", "content": name, "embedding": v} for name, v in vectors.items()]
    assert "ids" in await call(tier, "memory/remember", {"owner": me, "records": batch})
    along_y = (1.0, 0.5, 0.5)  # y, then x and z (both orthogonal to the query) in either order
    leaning = ((1 + 2 / 5**0.5) / 2, (1 + 1 / 5**0.5) / 2, (1 - 1 / 5**0.5) / 2)  # y, x, z: cos 2/√5, ±1/√5
    for query, scores in (([0.0, 1.0, 0.0], along_y), ([0.0, size, 0.0], along_y),
                          ([0.5, 1.0, 0.0], leaning), ([size / 2, size, 0.0], leaning)):
        found = (await call(tier, "memory/recall", {"owner": me, "embedding": query, "limit": 10}))["records"]
        ranked = [(r["id"][len(me) + 1:], r["score"]) for r in found]
        assert ranked[0][0] == "y" and [score for _, score in ranked] == pytest.approx(scores, abs=1e-6), \
            (size, query, ranked)
        if scores is leaning:
            assert [name for name, _ in ranked] == ["y", "x", "z"], (size, query, ranked)
    back = {r["id"][len(me) + 1:]: r["embedding"] for r in await held(tier, me)}
    assert back == vectors
    found = await call(tier, "memory/recall", {"owner": me, "embedding": [0.0, size, 0.0], "embeddings": True})
    assert {r["id"][len(me) + 1:]: r["embedding"] for r in found["records"]} == vectors
