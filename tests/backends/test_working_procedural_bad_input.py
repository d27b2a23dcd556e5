"""Edge input to the working and procedural tier servers, beside the episodic tier's answer to the same
call: what one tier accepts, the router may move to another, so each must read it back the same way."""

from __future__ import annotations

from typing import AsyncIterator

import pytest

from a2m.dispatch import Dispatcher
from tests.support.inprocess import call, dispatchers, owner

pytestmark = pytest.mark.anyio

# Vector magnitudes every tier accepts (decision 38: elements that round to a finite float32) but whose
# squares leave float32's range: the largest float32 and values far below 1.
MAGNITUDES = (3.4e38, 1e30, 1e-30, 1e-40)


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
async def tiers(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[dict[str, Dispatcher]]:
    async with dispatchers(tmp_path_factory.mktemp("tiers"), ("episodic", "procedural")) as running:
        yield running


@pytest.fixture
def procedural(tiers: dict[str, Dispatcher]) -> Dispatcher:
    return tiers["procedural"]


async def ranked(d: Dispatcher, me: str, vector: list[float]) -> list[str]:
    found = await call(d, "memory/recall", {"owner": me, "embedding": vector, "limit": 10})
    return [r["id"] for r in found["records"]]


@pytest.mark.parametrize("size", MAGNITUDES)
async def test_a_stored_vector_keeps_its_direction_at_any_float32_magnitude(procedural: Dispatcher,
                                                                            size: float) -> None:
    """The procedural tier normalised vectors in float32, where the square of 3.4e38 is infinite and that
    of 1e-30 is zero: such a record scored as orthogonal to every query (0.5), below a record pointing
    the other way, where the episodic tier ranks the small ones first."""
    d, me = procedural, owner()
    batch = [{"id": me + "-x", "content": "x axis", "embedding": [size, 0.0, 0.0]},
             {"id": me + "-y", "content": "y axis", "embedding": [0.0, size, 0.0]},
             {"id": me + "-n", "content": "minus x", "embedding": [-1.0, 0.0, 0.0]}]
    assert "ids" in await call(d, "memory/remember", {"owner": me, "records": batch})
    assert (await ranked(d, me, [1.0, 0.0, 0.0]))[0] == me + "-x", size
    assert (await ranked(d, me, [0.0, 1.0, 0.0]))[0] == me + "-y", size


@pytest.mark.parametrize("size", MAGNITUDES)
async def test_a_query_vector_keeps_its_direction_at_any_float32_magnitude(procedural: Dispatcher,
                                                                           size: float) -> None:
    """A query of [1e-30, 0, 0] has a float32 norm of 0: the procedural tier answered no records at all."""
    d, me = procedural, owner()
    batch = [{"id": me + "-x", "content": "x axis", "embedding": [1.0, 0.0, 0.0]},
             {"id": me + "-y", "content": "y axis", "embedding": [0.0, 1.0, 0.0]}]
    assert "ids" in await call(d, "memory/remember", {"owner": me, "records": batch})
    assert (await ranked(d, me, [size, 0.0, 0.0]))[0] == me + "-x", size
    assert (await ranked(d, me, [0.0, size, 0.0]))[0] == me + "-y", size


async def test_a_zero_query_vector_finds_the_records_with_vectors_as_episodic_does(
        tiers: dict[str, Dispatcher]) -> None:
    """A zero vector has no direction: the episodic and semantic tiers answer each record that has a vector
    (cosine 0, score 0.5), where the procedural tier answered none, alone with a query or as its half."""
    answers = {}
    for name, d in tiers.items():
        me = owner()
        batch = [{"id": "x", "content": "alpha", "embedding": [1.0, 0.0, 0.0]},
                 {"id": "y", "content": "beta", "embedding": [0.0, 1.0, 0.0]}, {"id": "t", "content": "alpha"}]
        batch = [{**r, "id": me + "-" + r["id"]} for r in batch]
        assert "ids" in await call(d, "memory/remember", {"owner": me, "records": batch})
        alone = await ranked(d, me, [0.0, 0.0, 0.0])
        both = await call(d, "memory/recall", {"owner": me, "embedding": [0.0, 0.0, 0.0], "query": "alpha"})
        answers[name] = (sorted(i[len(me):] for i in alone), sorted(r["id"][len(me):] for r in both["records"]))
    assert answers["procedural"] == answers["episodic"] == (["-x", "-y"], ["-t", "-x", "-y"])
