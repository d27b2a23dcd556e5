"""The black-box conformance suite against the router, over HTTP and stdio: first in front of four
fixture tier servers, then in front of the four real tier servers on their embedded engines."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from tests.conformance.suite import run
from tests.conformance.wire import HTTPTransport, StdioTransport

from .stack import FOUR, federation, stdio_router_command


def failures(results: list) -> list[str]:
    return [f"{r.group}: {r.name}: {r.detail}" for r in results if r.outcome == "fail"]


async def run_http(url: str) -> list:
    transport = HTTPTransport(url, None)
    try:
        return await run(transport, echo=None)
    finally:
        await transport.close()


async def run_stdio(command: list[str], env: dict[str, str] | None = None) -> list:
    transport = StdioTransport(shlex.join(command), env)
    await transport.start()
    try:
        results = await run(transport, echo=None)
    finally:
        await transport.close()
    assert transport.exit_code == 0, "closing stdin must end the router cleanly"
    return results


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["fixture", "real"])
async def test_router_is_conformant_over_http_and_stdio(tmp_path: Path, mode: str) -> None:
    env = {"A2M_SERVICE_TOKEN": "router-service-token"} if mode == "real" else None
    with federation(tmp_path, FOUR, mode=mode, env=env) as stack:
        http = await run_http(stack.url)
        assert not failures(http), failures(http)
        assert sum(r.outcome == "pass" for r in http) >= 40
        stdio = await run_stdio(stdio_router_command(stack.config), env)
        assert not failures(stdio), failures(stdio)
        assert any(r.name.startswith("over stdio, subscribe") and r.outcome == "pass" for r in stdio)
