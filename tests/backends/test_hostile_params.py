"""What a caller with a valid token can send to a tier server, on every real engine: an oversized
`query`, `where` or record name is bounded or refused with -32602, never left to the engine to fail
on (PostgreSQL answered them -32603 "unavailable", or held a pooled connection for its statement
timeout while the router marked the tier down for every owner)."""

from __future__ import annotations

import random
import time
from typing import Any, AsyncIterator

import pytest

from a2m.dispatch import Dispatcher
from a2m.params import MAX_QUERY_WORDS
from a2m.records import MAX_DIMENSIONS, MAX_NAME_BYTES
from tests.support.inprocess import call, dispatchers, owner

pytestmark = pytest.mark.anyio

TIERS = ("working", "episodic", "semantic", "procedural")


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
async def tiers(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[dict[str, Dispatcher]]:
    async with dispatchers(tmp_path_factory.mktemp("tiers"), TIERS) as running:
        yield running


def words(n: int, first: str) -> str:
    return " ".join([first, *(f"w{i}x" for i in range(n - 1))])


@pytest.mark.parametrize("tier", TIERS)
async def test_a_query_of_thousands_of_words_is_searched_by_its_first_words(tiers: dict[str, Dispatcher],
                                                                            tier: str) -> None:
    d, me = tiers[tier], owner()
    rid = (await call(d, "memory/remember", {"owner": me, "records": [{"content": "the zebra crossing"}]}))["ids"][0]
    for query in (words(20_000, "zebra"), "zebra " * 200_000, words(MAX_QUERY_WORDS, "zebra")):
        started = time.monotonic()
        found = await call(d, "memory/recall", {"owner": me, "query": query, "limit": 5})
        assert [r["id"] for r in found["records"]] == [rid], (tier, query[:40], found)
        assert time.monotonic() - started < 5.0
    assert await call(d, "memory/forget", {"owner": me, "query": words(20_000, "zebra")}) == {"forgotten": 1}


@pytest.mark.parametrize("tier", TIERS)
async def test_a_where_past_max_where_keys_or_values_is_invalid_params(tiers: dict[str, Dispatcher], tier: str) -> None:
    d, me = tiers[tier], owner()
    for method in ("memory/recall", "memory/timeline", "memory/forget"):
        wide = {f"k{i}": "v" for i in range(10_000)}
        assert await call(d, method, {"owner": me, "where": wide}) == {"error": -32602}, method
        many = {"k": [f"v{i}" for i in range(40_000)]}
        assert await call(d, method, {"owner": me, "where": many}) == {"error": -32602}, method


@pytest.mark.parametrize("tier", TIERS)
async def test_a_session_or_key_past_max_name_bytes_is_invalid_params(tiers: dict[str, Dispatcher],
                                                                      tier: str) -> None:
    d, me = tiers[tier], owner()
    rng = random.Random(3)
    wide = "".join(chr(rng.randrange(0x4E00, 0x9FFF)) for _ in range(MAX_NAME_BYTES))  # 3 bytes each
    for field in ("session", "key", "group"):
        record: dict[str, Any] = {"content": "x", field: wide}
        assert await call(d, "memory/remember", {"owner": me, "records": [record]}) == {"error": -32602}, field
    assert (await call(d, "memory/timeline", {"owner": me}))["records"] == []


@pytest.mark.parametrize("tier", TIERS)
async def test_a_batch_with_a_vector_wider_than_every_engine_stores_writes_nothing(tiers: dict[str, Dispatcher],
                                                                                 tier: str) -> None:
    """Redis and Qdrant stored 16,001 dimensions, pgvector refuses them: such a record could never spill."""
    d, me = tiers[tier], owner()
    batch = [{"content": "fits"}, {"content": "too wide", "embedding": [0.25] * (MAX_DIMENSIONS + 1)}]
    assert await call(d, "memory/remember", {"owner": me, "records": batch}) == {"error": -32602}
    assert (await call(d, "memory/timeline", {"owner": me}))["records"] == []
