"""`a2m.paging`: a backwards walk of `memory/timeline` through a real (in-memory) tier server."""

from __future__ import annotations

from typing import Any

import pytest

from a2m.dispatch import Context, Dispatcher
from a2m.paging import BoundsIgnored, pages_backwards
from backends.surface import TierServer
from tests.support.memstore import MemoryStore


async def walk(stamps: list[str], page: int) -> list[list[str]]:
    """Write one record per stamp (content = its index), then walk them back `page` at a time."""
    server = TierServer(MemoryStore(), name="m", kind="episodic", capabilities=frozenset({"core"}), limits={})
    dispatcher, ctx = Dispatcher(server), Context()
    await server.startup()
    try:
        await dispatcher.call("memory/remember", {"records": [
            {"content": str(i), "created_at": stamp} for i, stamp in enumerate(stamps)]}, ctx)

        async def call(method: str, params: dict[str, Any]) -> dict[str, Any]:
            return await dispatcher.call(method, params, ctx)

        return [[r["content"] for r in records] async for records in pages_backwards(call, {}, page=page, cap=None)]
    finally:
        await server.shutdown()


@pytest.mark.anyio
@pytest.mark.parametrize("edge", ["9999-12-31T23:59:59.999Z", "0001-01-01T00:00:00.000Z"])
async def test_a_crowded_millisecond_at_either_end_of_time_is_read(edge: str) -> None:
    """A full page in the first or the last representable millisecond: the walk stepped one
    millisecond past it to bound the next page, and datetime raised OverflowError (the router's
    scan of a tier, and `a2m export`, ended there)."""
    stamps = [edge, edge, edge, "2026-01-01T00:00:00.000Z", "2026-01-01T00:00:00.001Z"]
    pages = await walk(stamps, page=2)
    assert sorted(c for p in pages for c in p) == ["0", "1", "2", "3", "4"]


@pytest.mark.anyio
async def test_a_millisecond_holding_more_than_a_page_is_read_whole_and_once() -> None:
    stamps = ["2026-01-01T00:00:00.005Z"] * 5 + ["2026-01-01T00:00:00.001Z", "2026-01-01T00:00:00.009Z"]
    pages = await walk(stamps, page=2)
    flat = [c for p in pages for c in p]
    assert sorted(flat) == sorted(str(i) for i in range(7)) and len(flat) == 7


def endpoint(answers: list[dict[str, Any]], asked: list[dict[str, Any]]) -> Any:
    """A timeline that answers `answers` in turn and notes what it was asked (a misbehaving server)."""
    async def call(method: str, params: dict[str, Any]) -> dict[str, Any]:
        asked.append(params)
        return answers[len(asked) - 1]
    return call


def record(i: int) -> dict[str, Any]:
    return {"id": str(i), "created_at": "2026-01-01T00:00:00.000Z"}


@pytest.mark.anyio
async def test_a_cursor_is_followed_until_it_is_null() -> None:
    asked: list[dict[str, Any]] = []
    call = endpoint([{"records": [record(2), record(3)], "cursor": "c1"},
                     {"records": [record(0), record(1)], "cursor": None}], asked)
    pages = [[r["id"] for r in p] async for p in pages_backwards(call, {"owner": "o"}, page=2, cap=2)]
    assert pages == [["2", "3"], ["0", "1"]]
    assert asked == [{"owner": "o", "limit": 2, "cursor": True}, {"owner": "o", "limit": 2, "cursor": "c1"}]


@pytest.mark.anyio
@pytest.mark.parametrize("second", [{"records": [record(0)], "cursor": "c1"}, {"records": [record(0)]},
                                    {"records": [record(0)], "cursor": 7}])
async def test_a_cursor_that_does_not_move_on_stops_the_walk(second: dict[str, Any]) -> None:
    """The same cursor again, or none where there was one, or one that is not a string: paging on
    could read the same page forever, or stop early unnoticed; the walk says so instead."""
    call = endpoint([{"records": [record(1)], "cursor": "c1"}, second], [])
    with pytest.raises(BoundsIgnored):
        async for _ in pages_backwards(call, {}, page=1, cap=1):
            pass
