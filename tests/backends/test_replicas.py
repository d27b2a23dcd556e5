"""Concurrent writers that the surface's own checks cannot see: another owner taking the same id at
the same instant, and a second replica of a tier on the same engine (decision 42).

The tier servers run in process on their real engines; a replica is a second server built with the
first one's engine URL, as `a2m serve <tier> --url` would run it.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import AsyncIterator

import pytest

from backends.surface import TierServer
from tests.support.races import call, tier_servers

pytestmark = pytest.mark.anyio

TIERS = ("working", "episodic", "semantic", "procedural")  # each in tests.support.races.TIERS too


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
async def servers(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[dict[str, TierServer]]:
    """One server per tier, plus `working2` and `episodic2`: replicas on the first ones' engines."""
    async with tier_servers(tmp_path_factory.mktemp("replicas")) as out:
        yield out


def owner() -> str:
    return "o-" + uuid.uuid4().hex[:10]


@pytest.mark.parametrize("tier", TIERS)
async def test_an_id_two_owners_write_at_once_is_one_owners_and_the_other_is_refused(
        servers: dict[str, TierServer], tier: str) -> None:
    server = servers[tier]
    for n in range(12):
        a, b, record_id = owner(), owner(), f"shared-{uuid.uuid4().hex[:8]}"
        replies = await asyncio.gather(*(call(server, "memory/remember", {"owner": who, "records": [
            {"id": record_id, "content": f"{who}'s record {n}"}]}) for who in (a, b)))
        won = [who for who, reply in zip((a, b), replies) if "ids" in reply]
        assert len(won) == 1 and -32005 in [r.get("error") for r in replies], replies
        loser = b if won == [a] else a
        kept = (await call(server, "memory/timeline", {"owner": won[0]}))["records"]
        assert [(r["id"], r["content"]) for r in kept] == [(record_id, f"{won[0]}'s record {n}")]
        assert (await call(server, "memory/timeline", {"owner": loser}))["records"] == []


@pytest.mark.parametrize("tier", ["working", "episodic"])
async def test_two_replicas_writing_one_new_key_keep_one_record_for_it(
        servers: dict[str, TierServer], tier: str) -> None:
    """Each replica finds the key free and writes it; the engine refuses the second (the key is
    taken), which resolves the batch again and replaces the first: one record, revision 2."""
    one, two = servers[tier], servers[tier + "2"]
    for n in range(12):
        me = owner()
        replies = await asyncio.gather(*(call(server, "memory/remember", {"owner": me, "records": [
            {"key": "user/city", "content": f"city from replica {i}"}]}) for i, server in enumerate((one, two))))
        assert all("ids" in reply for reply in replies), replies
        held = (await call(one, "memory/timeline", {"owner": me}))["records"]
        assert len(held) == 1 and held[0]["revision"] == 2, (n, held)
        assert replies[0]["ids"] == replies[1]["ids"] == [held[0]["id"]]
        assert (await call(two, "memory/fetch", {"owner": me, "key": "user/city"}))["record"]["id"] == held[0]["id"]
