"""`[limits]` as the router declares and enforces them, in front of real tier servers."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from a2m.client import HTTPClient
from a2m.errors import A2MError

from .stack import Stack, federation, new_owner, tier_call

TIERS = [{"name": "working", "kind": "working"}, {"name": "archive", "kind": "semantic"}]


def test_limits_raised_past_the_tiers_are_declared_and_held_as_the_tiers_hold_them(tmp_path: Path) -> None:
    """A tier server keeps the protocol's defaults, so a raised `max_content_length` or
    `max_records_per_call` was declared in describe and then refused by the tier, in its words. The
    router now declares the least of its own and its writable tiers', refuses past it itself, and
    writes nothing; a lowered limit and `max_recall_limit` (paged past a tier's cap) stay its own."""
    me = new_owner()
    raised = {"max_content_length": 2_000_000, "max_records_per_call": 2000, "max_recall_limit": 1500}

    async def run(stack: Stack) -> None:
        async with HTTPClient(stack.url, timeout=60) as router:
            limits = (await router.call("memory/describe", {"owner": me}))["limits"]
            assert limits == {"max_content_length": 1_000_000, "max_records_per_call": 1000, "max_recall_limit": 1500}
            for records, said in (([{"content": "x" * 1_500_000}], "exceeds max_content_length (1000000)"),
                                  ([{"content": f"r{i}"} for i in range(1500)], "at most 1000 records per call")):
                with pytest.raises(A2MError, match=said.replace("(", r"\(").replace(")", r"\)")) as refused:
                    await router.call("memory/remember", {"owner": me, "records": records})
                assert refused.value.code == -32602
            for tier in stack.tiers:
                assert (await tier_call(stack, tier, "memory/timeline", {"owner": me}))["records"] == []
            await router.call("memory/remember", {"owner": me, "records": [{"content": f"r{i}"} for i in range(1000)]})

    with federation(tmp_path, TIERS, mode="real", top={"limits": raised}) as running:
        anyio.run(run, running)
    assert "limits.max_content_length = 2000000 is above what a tier accepts" in (tmp_path / "router.log").read_text()


def test_a_lowered_limit_stays_the_routers(tmp_path: Path) -> None:
    async def run(stack: Stack) -> None:
        async with HTTPClient(stack.url, timeout=60) as router:
            limits = (await router.call("memory/describe", {}))["limits"]
            assert limits["max_content_length"] == 10 and limits["max_records_per_call"] == 1000
            with pytest.raises(A2MError, match=r"exceeds max_content_length \(10\)"):
                await router.call("memory/remember", {"records": [{"content": "x" * 11}]})

    with federation(tmp_path, TIERS[:1], mode="real", top={"limits": {"max_content_length": 10}}) as running:
        anyio.run(run, running)
