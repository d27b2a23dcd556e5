"""A write the router stopped waiting for may land after a forget of its records (router/doubts.py,
decision 142), on real tier processes: episodic is stopped (SIGSTOP) so a spill's write to it is
cut off and waits there, queued, while the caller forgets the record (a2m.http's `client_gone`
keeps such a request from running, decision 143); or the write is already running on a slow
engine when the router gives up on it, which only the router's late forgets reach."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from a2m.client import HTTPClient
from router.doubts import Doubts

from .stack import Stack, federation, tier_call as direct

pytestmark = pytest.mark.anyio

TIERS = [
    {"name": "working", "kind": "working", "capacity": 1, "per_session": True, "spill_to": "episodic",
     "timeout": 1.0},
    {"name": "episodic", "kind": "episodic", "timeout": 1.0},
]


async def _held(stack: Stack) -> dict[str, list[str]]:
    return {t: [r["content"] for r in (await direct(stack, t, "memory/timeline", {"limit": 0}))["records"]]
            for t in ("working", "episodic")}


async def _cut_off_spill(stack: Stack, router: HTTPClient, first: dict[str, Any]) -> None:
    """`first` written, then a second record whose spill of `first` to the stopped episodic is cut
    off (the remember is acknowledged: the record stays in working). Episodic is left stopped."""
    await router.call("memory/remember", {"records": [first]})
    stack.tiers["episodic"].pause()
    await router.call("memory/remember", {"records": [{"content": "beta", "session": "s"}]})


@pytest.mark.parametrize("wait", [0.05, 0.5])
async def test_a_cut_off_move_that_lands_after_a_forget_is_forgotten_again(tmp_path: Path, wait: float) -> None:
    """The forget, sent while the move's write still waits in the stopped tier, ran there first (it
    found nothing); the write then brought the record back, two or three times in three."""
    with federation(tmp_path, TIERS, mode="real") as stack:
        async with HTTPClient(stack.url, timeout=20) as router:
            try:
                await _cut_off_spill(stack, router, {"id": "a-1", "content": "alpha", "session": "s"})
                forgetting = asyncio.create_task(router.call("memory/forget", {"ids": ["a-1"]}))
                await asyncio.sleep(wait)
            finally:
                stack.tiers["episodic"].resume()
            assert (await forgetting)["forgotten"] >= 1
            await asyncio.sleep(3.0)  # past the late forgets at 0.5 and 2 s
            held = await _held(stack)
    assert "alpha" not in held["working"] + held["episodic"], held


@pytest.mark.parametrize("again", [
    [{"id": "a-1", "content": "again", "tier": "episodic"}],
    # into working, then a spill moves it into the tier where it was in doubt (review-latereview: the
    # move's write left the doubt, and the late forget at 2 s deleted the new record)
    [{"id": "a-1", "content": "again", "session": "s"}, {"content": "gamma", "session": "s"}],
], ids=["remembered there", "moved there"])
async def test_a_late_forget_spares_the_record_written_again_under_its_id(tmp_path: Path,
                                                                          again: list[dict[str, Any]]) -> None:
    """The caller forgets a record whose move was cut off, then writes its id again, and it lands in
    the tier where the id was in doubt: the late forgets must not delete the new record."""
    with federation(tmp_path, TIERS, mode="real") as stack:
        async with HTTPClient(stack.url, timeout=20) as router:
            try:
                await _cut_off_spill(stack, router, {"id": "a-1", "content": "alpha", "session": "s"})
            finally:
                stack.tiers["episodic"].resume()
            await asyncio.sleep(0.5)  # the cut-off write lands, and the router sees episodic back
            assert (await router.call("memory/forget", {"ids": ["a-1"]}))["forgotten"] >= 1
            for record in again:
                await router.call("memory/remember", {"records": [record]})
            await asyncio.sleep(3.0)  # past the late forgets at 0.5 and 2 s
            held = await _held(stack)
    assert held["episodic"].count("again") == 1 and "alpha" not in held["working"] + held["episodic"], held


def _slow(delay: float) -> list[dict[str, Any]]:
    """TIERS with episodic a fixture whose engine takes `delay` seconds over a write (past 1 s)."""
    return [TIERS[0], {"name": "episodic", "kind": "episodic", "serve": "fixture",
                       "args": ["--slow-writes", str(delay)], "timeout": 1.0}]


async def _slow_spill_forgotten(router: HTTPClient) -> None:
    """a-1 written, spilled by a second record (its write to the slow tier cut off and still running
    there), then forgotten: acknowledged, the write not yet landed."""
    await router.call("memory/remember", {"records": [{"id": "a-1", "content": "alpha", "session": "s"}]})
    await router.call("memory/remember", {"records": [{"content": "beta", "session": "s"}]})
    assert (await router.call("memory/forget", {"ids": ["a-1"]}))["forgotten"] == 1


async def test_a_write_already_running_when_the_router_gave_up_is_forgotten_again(tmp_path: Path) -> None:
    """The move's write runs 1.2 s on the tier's engine, past the router's 1 s: the caller's forget
    runs beside it there and finds nothing, then the write lands. Not a request the tier can skip (it
    began before its client left): the router's late forget at 2 s deletes it."""
    with federation(tmp_path, _slow(1.2)) as stack:
        async with HTTPClient(stack.url, timeout=20) as router:
            await _slow_spill_forgotten(router)
            await asyncio.sleep(3.0)  # past the late forgets at 0.5 and 2 s
            held = await _held(stack)
    assert "alpha" not in held["working"] + held["episodic"], held
    # the write did land after the forget, and a late forget took it (so this test shows something)
    assert "landed after a forget of its records: 1 forgotten again there (ids ['a-1'])" in \
        (tmp_path / "router.log").read_text()


async def test_an_id_a_remember_was_told_exists_is_not_forgotten_late(tmp_path: Path) -> None:
    """The cut-off write lands after the caller's forget; before the next late forget the caller
    remembers that id again and is told it exists (a client id found is returned, not rewritten). The
    late forget at 2 s then deleted it: the caller held an acknowledged id that named nothing."""
    with federation(tmp_path, _slow(1.6)) as stack:
        async with HTTPClient(stack.url, timeout=20) as router:
            await _slow_spill_forgotten(router)
            await asyncio.sleep(1.0)  # the write has landed (at 1.6 s), after the late forget at 0.5 s
            again = {"id": "a-1", "content": "again", "session": "t"}
            assert (await router.call("memory/remember", {"records": [again]}))["ids"] == ["a-1"]
            await asyncio.sleep(2.5)  # past the late forget at 2 s
            found = (await router.call("memory/timeline", {"where": {"id": ["a-1"]}, "limit": 0}))["records"]
    assert [r["id"] for r in found] == ["a-1"], found


def test_doubts_expire_are_bounded_and_are_settled_per_tier() -> None:
    doubts = Doubts(ttl=60.0, size=3)
    doubts.note("o", "episodic", ["a", "b"])
    doubts.note("o", "semantic", ["a"])
    doubts.note(None, "episodic", ["c"])  # the fourth: "a" in episodic, the oldest, is let go
    assert doubts.held("o", "episodic") == ["b"] and doubts.held("o", "semantic") == ["a"]
    assert doubts.held(None, "episodic") == ["c"] and doubts.held("p", "episodic") == []
    doubts.settle("o", "semantic", ["a", "b"])  # written again there; episodic's "b" is still in doubt
    assert doubts.held("o", "semantic") == [] and doubts.held("o", "episodic", among=["b", "z"]) == ["b"]
    assert doubts.tiers("o") == ["episodic"]
    gone = Doubts(ttl=0.0)
    gone.note("o", "episodic", ["a"])
    assert gone.held("o", "episodic") == [] and gone.tiers("o") == []
