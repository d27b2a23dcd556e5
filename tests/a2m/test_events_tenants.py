"""One tenant's view of a tier server's event log, as that tenant (an authenticated principal): on a
real working tier (Redis), built as `a2m serve` builds it, behind the dispatcher."""

from __future__ import annotations

from typing import Any, AsyncIterator

import pytest

from a2m.dispatch import Context, Dispatcher
from tests.support.inprocess import dispatchers, owner

pytestmark = pytest.mark.anyio

WINDOW = 1024  # the tier server's log per owner, as `a2m serve` builds it (backends.serve.build)


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
async def working(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Dispatcher]:
    async with dispatchers(tmp_path_factory.mktemp("tenant-events"), ["working"]) as running:
        yield running["working"]


async def as_(d: Dispatcher, principal: str, method: str, params: dict[str, Any]) -> dict[str, Any]:
    reply = await d.handle({"jsonrpc": "2.0", "id": 1, "method": method, "params": params},
                           Context(transport="http", principal=principal))
    assert reply is not None and "result" in reply, reply
    return reply["result"]


async def test_a_tenant_cannot_count_the_writes_of_others_from_its_events(working: Dispatcher) -> None:
    """Alice fills the window with her own writes and keeps her first cursor. With the window
    shared, each record bob wrote took one of her events: her poll came back `reset` with 1024 - n
    events, n being bob's writes. Her view must be the same whatever bob does."""
    alice, bob = owner(), owner()
    start = (await as_(working, alice, "memory/events", {}))["cursor"]
    for first in range(0, WINDOW, 500):
        await as_(working, alice, "memory/remember", {"records": [
            {"content": f"alice {i}"} for i in range(first, min(first + 500, WINDOW))]})
    alone = await read(working, alice, start)
    assert len(alone) == WINDOW
    await as_(working, bob, "memory/remember", {"records": [{"content": f"bob {i}"} for i in range(37)]})
    assert await read(working, alice, start) == alone


async def read(d: Dispatcher, principal: str, cursor: str) -> list[dict[str, Any]]:
    """Every event from `cursor` on, page by page; a reset fails the read."""
    out: list[dict[str, Any]] = []
    while True:
        page = await as_(d, principal, "memory/events", {"cursor": cursor, "limit": 0})
        assert "reset" not in page, f"reset after {len(out)} events, with {len(page['events'])} still kept"
        out += page["events"]
        cursor = page["cursor"]
        if not page.get("more"):
            return out
