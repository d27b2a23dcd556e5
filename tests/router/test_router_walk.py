"""A timeline cursor over several tiers (router/walk.py, decision 137), on the real tier servers and
one third-party fixture that pages by cursor but caps a timeline at 5 records.

The ground truth is each tier's own timeline, asked directly: a walk must hand out every record
of every tier once, in the router's timeline order, whatever the page size and however many
records share a millisecond."""

from __future__ import annotations

import asyncio
from typing import Any, Iterator

import pytest

from a2m.client import HTTPClient
from a2m.errors import A2MError
from a2m.paging import TiersDown, pages_backwards

from .stack import Stack, federation, new_owner as owner, tier_call as direct

pytestmark = pytest.mark.anyio

TIERS = [
    {"name": "working", "kind": "working", "spill_to": "episodic", "timeout": 2.0},
    {"name": "episodic", "kind": "episodic", "spill_to": "semantic", "timeout": 2.0},
    {"name": "semantic", "kind": "semantic", "timeout": 2.0},
    {"name": "procedural", "kind": "procedural", "timeout": 2.0},
    {"name": "capped", "kind": "episodic", "serve": "fixture", "args": ["--paged", "--max-recall-limit", "5"],
     "timeout": 2.0},
]
NAMES = [t["name"] for t in TIERS]
STAMPS = ["2026-03-01T00:00:00.000Z", "2026-03-01T00:00:00.001Z", "2026-03-02T10:00:00.000Z"]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with federation(tmp_path_factory.mktemp("walk"), TIERS, mode="real",
                    top={"background_promotion": False}) as running:
        yield running


async def _walk(router: HTTPClient, params: dict[str, Any], limit: int) -> tuple[list[dict[str, Any]], int]:
    """Every record the walk hands out, oldest first, and how many pages it took."""
    read: list[dict[str, Any]] = []
    cursor: Any = True
    pages = 0
    while cursor is not None:
        answer = await router.call("memory/timeline", {**params, "limit": limit, "cursor": cursor})
        assert "degraded" not in answer
        assert len(answer["records"]) <= limit
        read[:0] = answer["records"]
        cursor, pages = answer["cursor"], pages + 1
    return read, pages


async def _written(stack: Stack, me: str, per_tier: int) -> dict[str, list[str]]:
    """`per_tier` records in each tier, their stamps from STAMPS in turn; each tier's ids in its own
    timeline order (asked of the tier, in pages: `capped` answers 5 at a time)."""
    for name in NAMES:
        await direct(stack, name, "memory/remember", {"owner": me, "records": [
            {"content": f"{name} note {i}", "created_at": STAMPS[i % len(STAMPS)]} for i in range(per_tier)]})
    own: dict[str, list[str]] = {}
    for name in NAMES:
        own[name] = []
        async with HTTPClient(stack.tiers[name].url) as tier:
            async for page in pages_backwards(tier.call, {"owner": me}, page=5, cap=None):
                own[name][:0] = [r["id"] for r in page]
        assert len(own[name]) == per_tier
    return own


async def _semantic_back(stack: Stack) -> None:
    """Resume semantic and wait until the router has seen it back (its backoff may skip it a while)."""
    stack.tiers["semantic"].resume()
    async with HTTPClient(stack.url) as router:
        for _ in range(100):
            if "degraded" not in await router.call("memory/timeline", {"limit": 1}):
                return
            await asyncio.sleep(0.1)


def _in_each_tiers_order(read: list[dict[str, Any]], own: dict[str, list[str]]) -> None:
    assert [r["created_at"] for r in read] == sorted(r["created_at"] for r in read)
    for name, ids in own.items():
        assert [r["id"] for r in read if r["tier"] == name] == ids, name


@pytest.mark.parametrize("limit", [7, 40, 1000])
async def test_a_walk_over_every_tier_reads_each_record_once_in_timeline_order(stack: Stack, limit: int) -> None:
    """Five tiers, 30 records each over three stamps (two a millisecond apart): pages of 7 cut most
    tiers' pages, and `capped` (5 a timeline) bounds every page at its fifth record."""
    me = owner()
    own = await _written(stack, me, 30)
    async with HTTPClient(stack.url) as router:
        read, pages = await _walk(router, {"owner": me}, limit)
        whole = (await router.call("memory/timeline", {"owner": me, "limit": 1000}))["records"]
    assert len(read) == 150 and len({r["id"] for r in read}) == 150
    _in_each_tiers_order(read, own)
    # the order a timeline without a cursor shows, deeper tiers first within a stamp; but that one
    # reads `capped` by time, a page of 5 at a time
    assert [(r["id"], r["tier"]) for r in read] == [(r["id"], r["tier"]) for r in whole]
    assert pages >= 150 // min(limit, 5 * len(NAMES))  # `capped` holds each page to at most its 5 and what is newer


async def test_a_walk_reads_a_millisecond_no_timeline_holds(stack: Stack) -> None:
    """1,200 records of one millisecond in episodic and semantic (a timeline holds 1,000): a reader
    walking by time stops there, the walk reads them all; semantic's first, the deeper tier."""
    me, stamp = owner(), "2026-04-01T00:00:00.000Z"
    ids: dict[str, list[str]] = {}
    for name in ("semantic", "episodic"):
        ids[name] = (await direct(stack, name, "memory/remember", {"owner": me, "records": [
            {"content": f"{name} {i}", "created_at": stamp} for i in range(600)]}))["ids"]
    async with HTTPClient(stack.url) as router:
        read, _ = await _walk(router, {"owner": me}, 500)
        # and what a2m.paging (export, the router's own scans) makes of the router: the same walk
        paged: list[str] = []
        async for page in pages_backwards(router.call, {"owner": me}, page=500, cap=1000):
            paged[:0] = [r["id"] for r in page]
    assert [r["id"] for r in read] == ids["semantic"] + ids["episodic"]
    assert paged == ids["semantic"] + ids["episodic"]


async def test_a_walk_is_a_position_writes_and_forgets_between_pages_leave_the_rest_as_it_was(stack: Stack) -> None:
    me = owner()
    own = await _written(stack, me, 12)
    async with HTTPClient(stack.url) as router:
        first = await router.call("memory/timeline", {"owner": me, "limit": 20, "cursor": True})
        seen = {r["id"] for r in first["records"]}
        unread = [i for ids in own.values() for i in ids if i not in seen]
        # one record already read and one not yet are forgotten; a newer one is written to each tier
        await router.call("memory/forget", {"owner": me, "ids": [first["records"][3]["id"], unread[0]]})
        for name in NAMES:
            await direct(stack, name, "memory/remember", {"owner": me, "records": [
                {"content": "written mid-walk", "created_at": "2026-03-03T00:00:00.000Z"}]})
        rest: list[dict[str, Any]] = []
        cursor = first["cursor"]
        while cursor is not None:
            answer = await router.call("memory/timeline", {"owner": me, "limit": 20, "cursor": cursor})
            rest[:0] = answer["records"]
            cursor = answer["cursor"]
    assert sorted(r["id"] for r in rest) == sorted(unread[1:])
    assert not seen & {r["id"] for r in rest}


async def test_a_page_with_a_tier_down_has_no_cursor_and_the_walk_goes_on_from_the_last_one(stack: Stack) -> None:
    me = owner()
    own = await _written(stack, me, 9)
    async with HTTPClient(stack.url) as router:
        first = await router.call("memory/timeline", {"owner": me, "limit": 8, "cursor": True})
        stack.tiers["semantic"].pause()
        try:
            down = await router.call("memory/timeline", {"owner": me, "limit": 8, "cursor": first["cursor"]})
        finally:
            await _semantic_back(stack)
        assert down["degraded"] == ["semantic"] and "cursor" not in down
        read = first["records"]
        cursor = first["cursor"]
        while cursor is not None:
            answer = await router.call("memory/timeline", {"owner": me, "limit": 8, "cursor": cursor})
            assert "degraded" not in answer
            read[:0] = answer["records"]
            cursor = answer["cursor"]
    assert len(read) == 45
    _in_each_tiers_order(read, own)


@pytest.mark.parametrize("down_at", [0, 1])
async def test_a_reader_asks_a_page_with_a_tier_down_again_until_the_tier_is_back(stack: Stack, down_at: int) -> None:
    """`a2m.paging` through the router, semantic stopped before the first or the second page and
    back 3 s later: the page answered without it is asked again. Taken as it was, the first page
    sent the reader by time past semantic's records, and the second ended the walk (no cursor)."""
    me = owner()
    own = await _written(stack, me, 9)
    asked = 0
    async with HTTPClient(stack.url) as router:

        async def call(method: str, params: dict[str, Any]) -> dict[str, Any]:
            nonlocal asked
            if asked == down_at:
                stack.tiers["semantic"].pause()
                asyncio.get_running_loop().call_later(3.0, stack.tiers["semantic"].resume)
            asked += 1
            return await router.call(method, params)

        read: list[dict[str, Any]] = []
        try:
            async for page in pages_backwards(call, {"owner": me}, page=8, cap=None, waits=(0.5,) * 30):
                read[:0] = page
        finally:
            await _semantic_back(stack)
    assert len(read) == 45 and asked > 6  # six pages, and at least one asked again
    _in_each_tiers_order(read, own)


async def test_a_reader_stops_with_the_tiers_that_stay_down(stack: Stack) -> None:
    me = owner()
    await _written(stack, me, 3)
    stack.tiers["semantic"].pause()
    try:
        async with HTTPClient(stack.url) as router:
            with pytest.raises(TiersDown) as stopped:
                async for _ in pages_backwards(router.call, {"owner": me}, page=8, cap=None, waits=(0.1, 0.1)):
                    pass
    finally:
        await _semantic_back(stack)
    assert stopped.value.tiers == ["semantic"]
    assert "semantic did not answer a timeline page for 0.2 s" in str(stopped.value)


async def test_a_cursor_that_is_not_a_walks_is_refused(stack: Stack) -> None:
    me = owner()
    await _written(stack, me, 3)
    async with HTTPClient(stack.url) as router:
        walk = (await router.call("memory/timeline", {"owner": me, "limit": 2, "cursor": True}))["cursor"]
        one = (await router.call("memory/timeline", {"owner": me, "tier": "episodic", "limit": 2,
                                                     "cursor": True}))["cursor"]
        for params in ({"cursor": one}, {"cursor": "w1.bm90IGpzb24"}, {"cursor": "w1.e30"},  # not JSON; {}
                       {"cursor": walk[:-4]}, {"cursor": walk, "tier": "episodic"}, {"cursor": 3}):
            with pytest.raises(A2MError) as refused:
                await router.call("memory/timeline", {"owner": me, "limit": 2, **params})
            assert refused.value.code == -32602, params


PLAIN = [  # a third-party server without the cursor extension, capped at 5 a timeline
    {"name": "episodic", "kind": "episodic", "timeout": 2.0},
    {"name": "plain", "kind": "episodic", "serve": "fixture", "args": ["--max-recall-limit", "5"], "timeout": 2.0},
]


@pytest.fixture(scope="module")
def plain_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with federation(tmp_path_factory.mktemp("walk-plain"), PLAIN, mode="real",
                    top={"background_promotion": False}) as running:
        yield running


async def test_a_tier_without_a_cursor_makes_the_first_page_the_timeline_a_reader_pages_by_time(
        plain_stack: Stack) -> None:
    """`plain` answers no cursor, so there is no walk: a reader (`a2m.paging`, export) pages by time
    from the first page, which must then read `plain` past its cap of 5 as a timeline without a
    cursor does. Else its records newer than the page's earliest but past its first 5 are never read."""
    me = owner()
    await direct(plain_stack, "episodic", "memory/remember", {"owner": me, "records": [
        {"content": f"old {i}", "created_at": f"2026-01-01T00:00:{i:02d}.000Z"} for i in range(10)]})
    await direct(plain_stack, "plain", "memory/remember", {"owner": me, "records": [
        {"content": f"new {i}", "created_at": f"2026-02-01T00:00:{i:02d}.000Z"} for i in range(10)]})
    async with HTTPClient(plain_stack.url) as router:
        timeline = await router.call("memory/timeline", {"owner": me, "limit": 12})
        first = await router.call("memory/timeline", {"owner": me, "limit": 12, "cursor": True})
        read: list[str] = []
        async for page in pages_backwards(router.call, {"owner": me}, page=12, cap=1000):
            read[:0] = [r["content"] for r in page]
    assert "cursor" not in first
    assert [r["id"] for r in first["records"]] == [r["id"] for r in timeline["records"]]
    assert read == [f"old {i}" for i in range(10)] + [f"new {i}" for i in range(10)]


@pytest.mark.parametrize("page", [1, 3])
async def test_a_record_held_by_several_tiers_is_paged_once(stack: Stack, page: int) -> None:
    """An interrupted move leaves one record in two tiers until repair: a timeline shows it once, and
    a walk shows each copy on the page it falls on. a2m.paging (export, the router's scans) hands
    out each id once all the same."""
    me = owner()
    dup = {"id": f"dup-{me}", "content": "held twice over", "created_at": STAMPS[1]}
    for name in ("episodic", "semantic", "capped"):
        await direct(stack, name, "memory/remember", {"owner": me, "records": [
            dup, *({"content": f"{name} {i}", "created_at": STAMPS[i % 3]} for i in range(6))]})
    async with HTTPClient(stack.url) as router:
        whole = [r["id"] for r in (await router.call("memory/timeline", {"owner": me, "limit": 1000}))["records"]]
        paged: list[str] = []
        async for records in pages_backwards(router.call, {"owner": me}, page=page, cap=1000):
            paged[:0] = [r["id"] for r in records]
    assert len(whole) == 19 and sorted(paged) == sorted(whole)


async def test_summarize_takes_no_cursor_as_a_tier_takes_none(stack: Stack) -> None:
    """summarize reads through the router's own timeline, and passed a caller's `cursor` on to it:
    over several tiers a summary then covered one walk page, or was refused for a cursor no
    timeline made, where a tier server ignores the param."""
    me = owner()
    own = await _written(stack, me, 4)
    asked = {"owner": me, "ids": [i for ids in own.values() for i in ids]}

    def summary(answer: dict[str, Any]) -> tuple[str, list[str]]:
        [written] = answer["records"]
        return written["content"], written["metadata"]["summary_of"]

    async with HTTPClient(stack.url) as router:
        plain = summary(await router.call("memory/summarize", asked))
        for cursor in (True, "not a cursor"):
            assert summary(await router.call("memory/summarize", {**asked, "cursor": cursor})) == plain
    assert len(plain[1]) == 20
