"""Routers in layers (one router a tier of another) naming one `lock_url` (router/locks.py)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest

from a2m.dispatch import Context
from router.config import TierConfig, load
from router.locks import SharedLocks, scope_of
from router.server import Router
from tests.support.redis import own_redis

from .stack import federation, new_owner

pytestmark = pytest.mark.anyio


async def test_a_router_that_is_a_tier_of_another_does_not_wait_for_the_upper_ones_lock(tmp_path: Path) -> None:
    """The upper router holds the owner's lock while it writes a keyed record to its tier, a router
    that takes the owner's lock for that write: with one Redis key per owner for both, the lower
    waited for the upper, which waited for the lower until its tier call timed out (the tier then
    marked down, the write left to land after the error)."""
    (tmp_path / "locks").mkdir()
    (tmp_path / "below").mkdir()
    with own_redis(tmp_path / "locks") as lock_url:
        tiers = [{"name": "episodic", "kind": "episodic"}]
        with federation(tmp_path / "below", tiers, top={"router": {"lock_url": lock_url}}) as below:
            config = replace(load(str(below.config)), lock_url=lock_url,
                             tiers=(TierConfig(name="episodic", kind="episodic", url=below.url, timeout=3.0),))
            upper = Router(config)
            await upper.startup()
            try:
                written = await asyncio.wait_for(upper.handlers()["memory/remember"](
                    {"owner": new_owner(), "records": [{"content": "the ferry leaves at nine", "key": "ferry"}]},
                    Context()), 10)
                assert len(written["ids"]) == 1
            finally:
                await upper.shutdown()


def test_replicas_share_the_lock_keys_and_other_federations_do_not() -> None:
    one = SharedLocks("redis://locks/0", scope=scope_of(["http://a:1/", "http://b:2"]))
    again = SharedLocks("redis://locks/0", scope=scope_of(["http://b:2/", "http://a:1"]))  # order, a slash
    other = SharedLocks("redis://locks/0", scope=scope_of(["http://router-below:8080/"]))
    assert one.key("alice") == again.key("alice") != other.key("alice")
    assert one.key("alice") != one.key("bob") and one.key(None) != one.key("-")
