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
