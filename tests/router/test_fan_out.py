"""fan_out's `arrived` hook: run on each reply as it comes, results still in tier order.

The tiers here are in-process callables, not engines: what is under test is the router's
scheduling of concurrent calls (the engines' side is tests/router/test_router_e2e.py).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from router.config import RouterConfig, TierConfig
from router.federation import Federation


class Answering:
    """A tier client that answers `recall` after `delay` seconds."""

    def __init__(self, name: str, delay: float) -> None:
        self.name, self.delay = name, delay

    async def call(self, method: str, params: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        if method == "memory/recall":
            await asyncio.sleep(self.delay)
        record = {"id": self.name, "content": "", "created_at": "2026-01-01T00:00:00.000Z"}
        return {"records": [record]} if method == "memory/recall" else {"name": self.name}

    async def close(self) -> None:
        pass


@pytest.mark.anyio
async def test_arrived_runs_in_arrival_order_and_a_failing_hook_degrades_only_its_tier() -> None:
    delays = {"slow": 0.05, "fast": 0.0, "broken": 0.01}
    config = RouterConfig(tiers=tuple(TierConfig(name=n, url=f"http://{n}") for n in delays))
    fed = Federation(config, client_factory=lambda t: Answering(t.name, delays[t.name]))
    await fed.start()
    seen: list[str] = []

    def arrived(name: str, result: dict[str, Any]) -> None:
        if name == "broken":
            raise ValueError("cannot parse this reply")
        seen.append(name)

    fan = await fed.fan_out("memory/recall", {}, list(fed), arrived=arrived)
    assert seen == ["fast", "slow"]
    assert list(fan.results) == ["slow", "fast"]  # tier order, whatever the arrival order
    assert fan.degraded == ["broken"]
    await fed.close()


@pytest.mark.anyio
async def test_a_tier_still_starting_is_info_and_one_that_was_up_going_down_is_a_warning(caplog) -> None:
    # Under `a2m up` the router starts with its tiers and asks before they listen: not news. A tier
    # that answered once and then stops answering is.
    from a2m.client import HTTPClient, Unavailable
    from router.federation import Tier
    from tests.support.procs import fixture_server_command, free_port, http_server

    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    tier = Tier(TierConfig(name="late", url=url, timeout=2.0), HTTPClient(url, timeout=2.0))
    caplog.set_level("INFO", logger="a2m.router")
    try:
        with pytest.raises(Unavailable):
            await tier.call("memory/describe", {})
        with http_server(fixture_server_command("--port", str(port)), port):
            await tier.call("memory/describe", {})
        with pytest.raises(Unavailable):
            await tier.call("memory/describe", {})
    finally:
        await tier.close()
    logged = [(r.levelname, r.getMessage().split(":")[0]) for r in caplog.records if r.name == "a2m.router"]
    assert logged == [("INFO", "tier late is down"), ("INFO", "tier late is up"), ("WARNING", "tier late is down")]


@pytest.mark.anyio
async def test_each_tier_call_is_reported_by_how_it_ended_and_a_cancelled_one_not_at_all() -> None:
    """The router's per-tier call metrics: "ok", "error" for an answered JSON-RPC error, and nothing
    for a call cancelled by its caller (a shutdown says nothing about the tier: counted as its
    error, it would page someone for a deploy)."""
    from a2m.errors import A2MError

    class Mixed(Answering):
        async def call(self, method: str, params: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
            if method == "memory/forget":
                raise A2MError(-32602, "no selector")
            if method == "memory/timeline":
                await asyncio.sleep(60)
            return await super().call(method, params, timeout)

    config = RouterConfig(tiers=(TierConfig(name="t", url="http://t"),))
    fed = Federation(config, client_factory=lambda t: Mixed(t.name, 0.0))
    seen: list[tuple[str, str, str]] = []
    fed.observe_calls(lambda tier, method, seconds, outcome: seen.append((tier, method, outcome)))
    await fed.start()
    [tier] = list(fed)
    await tier.call("memory/recall", {})
    with pytest.raises(A2MError):
        await tier.call("memory/forget", {})
    hung = asyncio.ensure_future(tier.call("memory/timeline", {}))
    await asyncio.sleep(0.01)
    hung.cancel()
    with pytest.raises(asyncio.CancelledError):
        await hung
    assert seen == [("t", "memory/describe", "ok"), ("t", "memory/recall", "ok"), ("t", "memory/forget", "error")]
    assert tier.healthy
    await fed.close()


@pytest.mark.anyio
async def test_closing_cancels_the_describe_of_a_tier_that_came_back() -> None:
    """A tier that comes back is described again in the background; a router stopping meanwhile left
    that task pending on a closed client (asyncio: "Task was destroyed but it is pending")."""
    class Hanging(Answering):
        async def call(self, method: str, params: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
            if method == "memory/describe" and self.came_back:
                await asyncio.sleep(60)
            return await super().call(method, params, timeout)

    client = Hanging("t", 0.0)
    client.came_back = False  # type: ignore[attr-defined]
    fed = Federation(RouterConfig(tiers=(TierConfig(name="t", url="http://t"),)), client_factory=lambda t: client)
    await fed.start()
    tier = fed["t"]
    tier.healthy = False  # down, then a read reaches it: the comeback starts the describe
    client.came_back = True  # type: ignore[attr-defined]
    await tier.call("memory/recall", {})
    revive = tier._revive
    assert revive is not None and not revive.done()
    await fed.close()
    await asyncio.sleep(0)
    assert revive.cancelled()


def _failing_describes(url: str, causes: list[Exception]) -> Federation:
    """A federation of one tier `t` whose describes raise `causes` in turn (the list is the caller's,
    filled once the federation has started), then answer."""
    class Outage(Answering):
        async def call(self, method: str, params: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
            if method == "memory/describe" and causes:
                raise causes.pop(0)
            return await super().call(method, params, timeout)

    return Federation(RouterConfig(tiers=(TierConfig(name="t", url=url),)), client_factory=lambda t: Outage("t", 0.0))


@pytest.mark.anyio
async def test_a_tier_down_logs_again_when_the_cause_of_its_outage_changes(caplog) -> None:
    """Unreachable, then its server back with its engine still away: the log said only the first cause
    for the whole outage, so the operator chased a server that was already running again."""
    import logging

    from a2m.client import Unavailable
    from a2m.errors import A2MError

    causes: list[Exception] = []
    fed = _failing_describes("http://t", causes)
    await fed.start()
    tier = fed["t"]
    causes[:] = [Unavailable("connection refused"),
                     A2MError(-32603, "tier t (postgresql) unavailable: could not connect to 10.0.0.9",
                              {"tier": "t", "engine": "postgresql"})]
    with caplog.at_level(logging.INFO, logger="a2m.router"):
        assert await tier.refresh() is None  # unreachable
        tier.retry_at = 0.0  # its backoff over: the next describe is a new verdict
        assert await tier.refresh() is None  # its server answers, its engine does not
        assert await tier.refresh() is not None
    down = [r.getMessage() for r in caplog.records if "is down" in r.getMessage()]
    assert len(down) == 2 and "connection refused" in down[0] and "10.0.0.9" in down[1], down
    await fed.close()


def test_a_slow_call_cut_off_by_its_timeout_leaves_the_tier_up_under_uvloop() -> None:
    """A forget (`slow`) that runs out its timeout leaves the tier up (decision 127). The router runs
    on uvloop, whose timers count whole milliseconds: about a quarter of those timeouts ended up to
    ~0.6 ms before time.monotonic() said the limit had passed, and `elapsed >= limit` then marked
    the tier down for every owner's reads (the real-engine test failed one run in three). Here the
    tier is a loopback socket that takes the request and never answers, as a tier busy deleting."""
    import socket

    import uvloop

    from a2m.client import HTTPClient, Unavailable
    from router.federation import Tier

    async def main() -> None:
        with socket.socket() as held:
            held.bind(("127.0.0.1", 0))
            held.listen(64)
            url = f"http://127.0.0.1:{held.getsockname()[1]}/"
            tier = Tier(config=TierConfig(name="t", url=url, timeout=0.05), client=HTTPClient(url))
            try:
                for _ in range(40):  # one early timer in 40 all but certain without the slack
                    with pytest.raises(Unavailable):
                        await tier.call("memory/forget", {}, slow=True)
                    assert tier.healthy, tier.last_error
                with pytest.raises(Unavailable):  # an ordinary call that times out still marks it down
                    await tier.call("memory/recall", {})
                assert not tier.healthy
            finally:
                await tier.close()

    uvloop.run(main())


@pytest.mark.anyio
async def test_a_tier_down_logs_again_when_the_cause_beneath_unavailable_changes(caplog) -> None:
    """Refused, then a certificate the router does not trust: both are an Unavailable raised from
    httpx's ConnectError, raised from httpcore's, and differ only in the error beneath those (as the
    client raises them). The second cause was not logged; the same cause again is not logged twice."""
    import logging
    import ssl

    import httpcore
    import httpx

    from a2m.client import Unavailable

    def unreachable(beneath: Exception) -> Unavailable:
        core = httpcore.ConnectError(str(beneath))
        core.__cause__ = beneath
        mapped = httpx.ConnectError(str(beneath))
        mapped.__cause__ = core
        error = Unavailable(f"https://t/ unreachable: {beneath}")
        error.__cause__ = mapped
        return error

    causes: list[Exception] = []
    fed = _failing_describes("https://t", causes)
    await fed.start()
    tier = fed["t"]
    causes[:] = [unreachable(ConnectionRefusedError(111, "Connection refused")),
                     unreachable(ConnectionRefusedError(111, "Connection refused")),
                     unreachable(ssl.SSLCertVerificationError(1, "[SSL: CERTIFICATE_VERIFY_FAILED]"))]
    with caplog.at_level(logging.INFO, logger="a2m.router"):
        for _ in range(3):
            tier.retry_at = 0.0  # its backoff over: the next describe is a new verdict
            assert await tier.refresh() is None
    down = [r.getMessage() for r in caplog.records if "is down" in r.getMessage()]
    assert len(down) == 2 and "refused" in down[0] and "CERTIFICATE_VERIFY_FAILED" in down[1], down
    await fed.close()
