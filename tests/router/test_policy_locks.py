"""The router's lock maps hold only the locks in use: a router that has served a million owners
and sessions must not keep a lock for each of them."""

from __future__ import annotations

import asyncio

import pytest

from router.policy import Policy


@pytest.mark.anyio
async def test_lock_maps_forget_locks_nobody_holds_and_share_the_ones_in_use() -> None:
    policy = Policy(None)  # type: ignore[arg-type]  # the locks need no federation
    for i in range(1000):
        async with policy.owner_lock(f"owner-{i}"), policy.lock("working", f"owner-{i}", "s"):
            pass
    assert len(policy._owner_locks) == 0 and len(policy._locks) == 0

    inside: list[int] = []

    async def hold(n: int) -> None:
        async with policy.owner_lock("alice"):
            inside.append(n)
            assert len(inside) == 1  # never two holders: the waiters share the holder's lock
            await asyncio.sleep(0.01)
            inside.remove(n)

    await asyncio.gather(*(hold(n) for n in range(5)))
    assert len(policy._owner_locks) == 0


@pytest.mark.anyio
async def test_a_read_under_this_routers_owner_lock_holds_back_a_move_that_starts_after_it() -> None:
    """`settled`'s third read holds the owner lock's local part (`.here`) alone: the map is weak, so
    with no reference to the OwnerLock itself it went at once, and a move started meanwhile got a
    new OwnerLock, its own asyncio lock, and ran while the read was out: the overlap it was to stop."""
    from router.reads import settled

    policy = Policy(None)  # type: ignore[arg-type]  # the locks need no federation
    asked, inside, release = 0, asyncio.Event(), asyncio.Event()

    async def read() -> int:
        nonlocal asked
        asked += 1
        if asked < 3:
            policy._deleting("alice")  # a move overlapped this read: it asks again
        else:
            inside.set()
            await release.wait()
        return asked

    reading = asyncio.create_task(settled(policy, "alice", [None, None], read))  # type: ignore[list-item]
    await inside.wait()
    assert policy.owner_lock("alice").locked(), "the third read holds no lock a move would wait for"
    mover = policy.owner_lock("alice")  # a move's: referred to while held, as `async with` does
    moving = asyncio.create_task(mover.__aenter__())
    await asyncio.sleep(0.05)
    assert not moving.done(), "a move began while the third read was out"
    release.set()
    assert await reading == 3
    await moving
    await mover.__aexit__(None, None, None)
