"""Each tier under concurrent clients on its real engine, and two replicas of a tier on one engine.

`tests/support/concurrency.py` drives the workload and holds the invariants (its docstring lists
them); `tests/support/races.py` builds the servers. Every invariant must hold for every
interleaving, so a run's verdict does not depend on timing. Each race found here has a test of its
own in `test_tier_races.py`, forced one way.

CONC_SEEDS=1,2,3 (default "1,2"), CONC_CLIENTS (8) and CONC_CALLS (40) run more.
"""

from __future__ import annotations

import os
from typing import AsyncIterator

import pytest

from backends.surface import TierServer
from tests.support.concurrency import Workload, check
from tests.support.races import REPLICATED, TIERS, tier_servers

pytestmark = pytest.mark.anyio

SEEDS = [int(s) for s in os.environ.get("CONC_SEEDS", "1,2").split(",")]
CLIENTS = int(os.environ.get("CONC_CLIENTS", "8"))
CALLS = int(os.environ.get("CONC_CALLS", "40"))


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
async def servers(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[dict[str, TierServer]]:
    async with tier_servers(tmp_path_factory.mktemp("concurrency")) as out:
        yield out


async def verdict(tier: list[TierServer], seed: int) -> None:
    work = Workload(tier, seed, clients=CLIENTS, calls=CALLS)
    await work.run()
    problems = await check(tier, work)
    assert not problems, f"{len(problems)} violation(s), seed {seed}:\n" + "\n".join(problems[:25])


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("label", list(TIERS))
async def test_one_server_under_concurrent_clients(servers: dict[str, TierServer], label: str, seed: int) -> None:
    await verdict([servers[label]], seed)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("tier", REPLICATED)
async def test_two_replicas_on_one_engine_under_concurrent_clients(servers: dict[str, TierServer], tier: str,
                                                                   seed: int) -> None:
    await verdict([servers[tier], servers[tier + "2"]], seed)
