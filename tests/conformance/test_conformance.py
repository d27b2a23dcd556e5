"""Every server in this repository runs through the black-box conformance suite.

Tier servers and the router add themselves to SERVERS as they land; the
deliberately broken fixtures prove the suite's checks can fail.
"""

from __future__ import annotations

import shlex

import pytest

from tests.support.procs import free_port, http_server, fixture_server_command

from .suite import run
from .wire import HTTPTransport, StdioTransport


async def run_http(url: str, token: str | None = None) -> list:
    transport = HTTPTransport(url, token)
    try:
        return await run(transport)
    finally:
        await transport.close()


async def run_stdio(command: list[str]) -> list:
    transport = StdioTransport(shlex.join(command))
    await transport.start()
    try:
        results = await run(transport)
    finally:
        await transport.close()
    assert transport.exit_code == 0, "closing stdin must end the server cleanly"
    return results


def failures(results: list) -> list[str]:
    return [f"{r.group}: {r.name}: {r.detail}" for r in results if r.outcome == "fail"]


@pytest.mark.anyio
async def test_fixture_server_over_http() -> None:
    port = free_port()
    with http_server(fixture_server_command("--port", str(port)), port) as url:
        results = await run_http(url)
    assert not failures(results)
    assert sum(r.outcome == "pass" for r in results) >= 40


@pytest.mark.anyio
async def test_fixture_server_over_stdio() -> None:
    results = await run_stdio(fixture_server_command("--stdio"))
    assert not failures(results)
    assert any(r.name.startswith("over stdio, subscribe") and r.outcome == "pass" for r in results)


@pytest.mark.anyio
async def test_read_only_fixture_is_conformant() -> None:
    results = await run_stdio(fixture_server_command("--stdio", "--read-only"))
    assert not failures(results)
    assert any(r.group == "read-only" and r.outcome == "pass" for r in results)


@pytest.mark.anyio
async def test_core_only_fixture_without_limits_is_conformant() -> None:
    """Every other capability undeclared, and no limits: gating (-32003 for each capability's methods and for
    a record's `tier`), ignored record fields and `limit: 0` meaning no limit are checked here."""
    results = await run_stdio(fixture_server_command("--stdio", "--capabilities", "", "--no-limits"))
    assert not failures(results), failures(results)
    passed = {r.name for r in results if r.outcome == "pass"}
    assert {"every method of an undeclared capability answers -32003, never -32601",
            "a tier on a record without the tiers capability answers -32003",
            "fields of an undeclared capability on a record are ignored, not refused",
            "limit 0 is no limit (up to max_recall_limit where one is declared)"} <= passed


@pytest.mark.anyio
@pytest.mark.parametrize("broken, expected", [
    ("order", "timeline is ascending by created_at"),
    ("gating", "every method of an undeclared capability answers -32003"),
])
async def test_suite_catches_a_broken_server(broken: str, expected: str) -> None:
    results = await run_stdio(fixture_server_command("--stdio", "--broken", broken))
    assert any(expected in f for f in failures(results)), failures(results)
