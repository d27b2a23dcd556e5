"""A tier server killed (SIGKILL) and restarted on its port while clients keep calling the router:
the router recovers by itself, quickly, and no request is held past the tier's timeout.

Real processes on loopback: the router and the tier servers on their embedded engines."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from a2m.client import HTTPClient

from .stack import federation, new_owner

TIMEOUT = 2.0
TIERS = [
    {"name": "working", "kind": "working", "capacity": 1000, "spill_to": "episodic", "timeout": TIMEOUT},
    {"name": "episodic", "kind": "episodic", "timeout": TIMEOUT},
]


async def _readers(url: str, owner: str, stop: asyncio.Event, latencies: list[float], n: int = 8) -> None:
    async def one() -> None:
        async with HTTPClient(url, timeout=30) as client:
            while not stop.is_set():
                start = time.monotonic()
                await client.call("memory/recall", {"query": "harbour", "owner": owner, "limit": 5})
                latencies.append(time.monotonic() - start)
                await asyncio.sleep(0.01)

    await asyncio.gather(*(one() for _ in range(n)))


async def _remember_one(router: HTTPClient, owner: str) -> None:
    await router.call("memory/remember", {"owner": owner, "records": [
        {"content": "the harbour ferry leaves at nine", "tier": "episodic"}]})


async def _until_whole(router: HTTPClient, owner: str, within: float, why: str) -> None:
    """Recall until no tier is left out, failing with `why` after `within` seconds."""
    since = time.monotonic()
    while "degraded" in await router.call("memory/recall", {"query": "harbour", "owner": owner}):
        assert time.monotonic() - since < within, why
        await asyncio.sleep(0.05)


@pytest.mark.anyio
async def test_a_short_outage_under_concurrent_reads_is_noticed_over_within_the_short_backoff(tmp_path: Path) -> None:
    """Eight readers each saw the dead tier fail and each doubled its backoff: a 1 s outage left
    the tier out of every recall for the 15 s maximum after it was back. One outage is one step."""
    with federation(tmp_path, TIERS, mode="real") as stack:
        owner = new_owner()
        async with HTTPClient(stack.url, timeout=30) as router:
            await _remember_one(router, owner)
            stop, latencies = asyncio.Event(), []
            readers = asyncio.create_task(_readers(stack.url, owner, stop, latencies))
            try:
                await asyncio.sleep(0.5)
                episodic = stack.tiers["episodic"]
                episodic.kill()
                await asyncio.sleep(1.0)
                episodic.start()
                await asyncio.to_thread(episodic.wait, 60)
                # 0.25 + 0.5 + 1 + 2 s of backoff cover a 1 s outage and a restart of a few seconds;
                # 10 s leaves a slow CI machine room and still fails the 15 s maximum backoff
                await _until_whole(router, owner, 10.0, "the router kept the restarted tier out")
            finally:
                stop.set()
                await asyncio.wait_for(readers, 30)
            assert max(latencies) < TIMEOUT, "a recall waited on the dead tier"
            described = {t["name"]: t for t in (await router.call("memory/describe", {"owner": owner}))["tiers"]}
            assert described["episodic"]["status"] == "up" and described["episodic"]["count"] == 1
            assert "error" not in described["episodic"]


@pytest.mark.anyio
async def test_a_hung_tier_costs_one_probe_per_backoff_not_one_timeout_per_concurrent_read(tmp_path: Path) -> None:
    """A stopped (SIGSTOP) tier accepts connections and never answers. When its backoff ran out,
    every concurrent read called it and each waited out the whole timeout; one read is the probe."""
    tiers = [{**TIERS[0], "timeout": 1.0}, {**TIERS[1], "timeout": 1.0}]
    with federation(tmp_path, tiers, mode="real") as stack:
        owner = new_owner()
        async with HTTPClient(stack.url, timeout=30) as router:
            await _remember_one(router, owner)
            stop, latencies = asyncio.Event(), []
            readers = asyncio.create_task(_readers(stack.url, owner, stop, latencies))
            episodic = stack.tiers["episodic"]
            try:
                await asyncio.sleep(0.3)
                before = len(latencies)
                episodic.pause()
                await asyncio.sleep(4.0)  # backoffs of 0.25, 0.5, 1 s after each 1 s timeout: 2-3 probes
                episodic.resume()
                await _until_whole(router, owner, 10.0, "the router kept the resumed tier out")  # not 15 s
            finally:
                episodic.resume()
                stop.set()
                await asyncio.wait_for(readers, 30)
            waited = [d for d in latencies[before:] if d >= 0.9]
            assert max(latencies) < 1.0 + 0.5, "a recall was held past the tier's timeout"
            # the (up to) 8 reads in flight when it stopped, then one probe per backoff
            assert len(waited) <= 8 + 4, f"{len(waited)} recalls waited out the timeout"


@pytest.mark.anyio
async def test_a_forget_that_outlasts_the_timeout_leaves_the_tier_up_for_everyone(tmp_path: Path) -> None:
    """One owner's forget that runs past the tier's timeout (here its DELETE waits on a lock a session
    holds on the real PostgreSQL; in production, a wipe of many records) is answered `forget
    incomplete`, and the tier stays up: it marked the tier down, and every other owner's reads left
    it out for the backoff. The tier finishes the delete once it can."""
    import psycopg

    from a2m.errors import A2MError
    from backends.episodic.embedded import EmbeddedPostgres

    pg = EmbeddedPostgres(tmp_path / "pg")
    dsn = pg.start()
    try:
        tiers = [{"name": "working", "kind": "working", "timeout": TIMEOUT},
                 {"name": "episodic", "kind": "episodic", "timeout": 1.0, "args": ["--url", dsn]}]
        with federation(tmp_path, tiers, mode="real") as stack:
            leaving, staying = new_owner(), new_owner()
            async with HTTPClient(stack.url, timeout=30) as router:
                for who in (leaving, staying):
                    await _remember_one(router, who)
                with psycopg.connect(dsn, autocommit=False) as locker:
                    locker.execute("LOCK TABLE records IN SHARE MODE")  # reads go on; the DELETE waits
                    with pytest.raises(A2MError) as caught:
                        await router.call("memory/forget", {"owner": leaving, "where": {"tier": "episodic"}})
                    assert "forget incomplete" in caught.value.message and caught.value.data["degraded"] == ["episodic"]
                    read = await router.call("memory/recall", {"query": "harbour", "owner": staying, "touch": False})
                    assert "degraded" not in read and len(read["records"]) == 1, read
                    ready = await router.call("memory/describe", {"owner": staying})
                    assert {t["name"]: t["status"] for t in ready["tiers"]}["episodic"] == "up"
                for _ in range(100):  # the lock gone, the tier's DELETE goes through
                    left = await router.call("memory/timeline", {"owner": leaving, "tier": "episodic"})
                    if not left["records"]:
                        break
                    await asyncio.sleep(0.1)
                assert left["records"] == []
    finally:
        pg.stop()
