"""What one caller with a valid token can do to the router: when a tier fails it is told which tier,
never its URL or its engine's own words (a PostgreSQL host and user, a socket or repository path),
which go to the router's log; and no request it can send holds the event loop every caller shares."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from a2m.dispatch import Context, Dispatcher
from a2m.errors import A2MError
from router.config import RouterConfig, TierConfig
from router.server import Router
from tests.support.procs import free_port

pytestmark = pytest.mark.anyio

ENGINE_WORDS = ('tier episodic (postgresql) unavailable: PostgreSQL is unavailable: connection to server at '
                '"10.9.8.7", port 5432 failed: FATAL: password authentication failed for user "a2m_prod"')


class EngineDown:
    """A tier server that answers, its engine gone: -32603 in the engine's words, as backends.surface says it."""

    def __init__(self, name: str) -> None:
        self.name = name

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "tiers": [{"name": self.name, "kind": "episodic", "count": 0}],
                "capabilities": ["core", "keys", "sessions", "salience", "scopes"]}

    async def call(self, method: str, params: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        if method == "memory/describe":
            return self.describe()
        raise A2MError(-32603, ENGINE_WORDS, {"tier": self.name, "engine": "postgresql"})

    async def close(self) -> None:
        pass


async def ask(router: Router, method: str, params: dict[str, Any]) -> dict[str, Any]:
    reply = await Dispatcher(router).handle({"jsonrpc": "2.0", "id": 1, "method": method, "params": params},
                                            Context(principal="alice", transport="http"))
    assert reply is not None and "error" in reply, reply
    return reply["error"]


async def test_an_unreachable_tier_is_named_without_its_url(caplog: pytest.LogCaptureFixture) -> None:
    url = f"http://127.0.0.1:{free_port()}/private-path/"
    router = Router(RouterConfig(tiers=(TierConfig(name="episodic", url=url, kind="episodic", timeout=1.0),),
                                 default_tier="episodic"))
    await router.startup()
    try:
        error = await ask(router, "memory/remember", {"records": [{"content": "x"}]})
    finally:
        await router.shutdown()
    assert error["code"] == -32603 and error["data"] == {"tier": "episodic"}, error
    assert "127.0.0.1" not in str(error) and "private-path" not in str(error)
    assert "tier episodic unavailable" in error["message"]
    assert any(url in r.getMessage() for r in caplog.records)  # the operator still has it


async def test_a_tiers_engine_failure_is_named_without_the_engines_words() -> None:
    router = Router(RouterConfig(tiers=(TierConfig(name="episodic", url="http://episodic.internal:8702/",
                                                   kind="episodic"),), default_tier="episodic"),
                    client_factory=lambda t: EngineDown(t.name))
    await router.startup()
    try:
        for method, params in (("memory/remember", {"records": [{"content": "x"}]}),
                               ("memory/remember", {"records": [{"content": "x", "key": "k"}]})):
            error = await ask(router, method, params)
            assert error["code"] == -32603, error
            for secret in ("10.9.8.7", "a2m_prod", "postgresql", "episodic.internal"):
                assert secret not in str(error), (method, error)
    finally:
        await router.shutdown()


class Empty(EngineDown):
    """A tier holding nothing for anyone."""

    async def call(self, method: str, params: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        return self.describe() if method == "memory/describe" else {"records": []}

    async def close(self) -> None:
        pass


async def test_summarize_by_many_ids_does_not_hold_the_event_loop() -> None:
    """`ids` were narrowed against a list, once per id: 200,000 ids held the router's loop for 185 s."""
    import time

    router = Router(RouterConfig(tiers=(TierConfig(name="episodic", url="http://e/", kind="episodic"),),
                                 default_tier="episodic"), client_factory=lambda t: Empty(t.name))
    await router.startup()
    ids = [f"{i:032x}" for i in range(50_000)]
    try:
        started = time.monotonic()
        reply = await Dispatcher(router).handle({"jsonrpc": "2.0", "id": 1, "method": "memory/summarize",
                                                 "params": {"ids": ids}}, Context(principal="alice"))
        assert time.monotonic() - started < 3.0
    finally:
        await router.shutdown()
    assert reply is not None and reply["result"] == {"records": [], "read": 0, "written": 0}, reply


class EngineDownEverywhere(EngineDown):
    """A tier server whose engine is gone for every call, describe too (its /readyz is 503)."""

    async def call(self, method: str, params: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        raise A2MError(-32603, ENGINE_WORDS, {"tier": self.name, "engine": "postgresql"})


async def test_a_tier_down_for_its_engine_is_described_without_the_engines_words(
        caplog: pytest.LogCaptureFixture) -> None:
    """A probe's describe answered by a tier whose engine is down marks the tier down (decision 115);
    what describe then shows of it to any token holder names the tier, not its engine's hosts or users."""
    caplog.set_level(logging.INFO, logger="a2m.router")
    router = Router(RouterConfig(tiers=(TierConfig(name="episodic", url="http://episodic.internal:8702/",
                                                   kind="episodic"),), default_tier="episodic"),
                    client_factory=lambda t: EngineDownEverywhere(t.name))
    await router.startup()
    try:
        assert not router.fed["episodic"].healthy
        reply = await Dispatcher(router).handle({"jsonrpc": "2.0", "id": 1, "method": "memory/describe",
                                                 "params": {}}, Context(principal="alice", transport="http"))
    finally:
        await router.shutdown()
    assert reply is not None and "result" in reply, reply
    [entry] = reply["result"]["tiers"]
    assert entry["status"] == "down" and "episodic" in entry["error"], entry
    for secret in ("10.9.8.7", "a2m_prod"):
        assert secret not in str(reply), reply
    assert any("a2m_prod" in r.getMessage() for r in caplog.records)  # the operator still has it
