"""Tier servers built exactly as `a2m serve` builds them, run in this process behind the dispatcher,
each on its real embedded engine: for tests that call many methods on several tiers quickly."""

from __future__ import annotations

import uuid
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator, Iterable

from a2m.dispatch import Context, Dispatcher
from backends.serve import build
from backends.settings import TierSettings


@asynccontextmanager
async def dispatchers(data: Path, names: Iterable[str],
                      options: dict[str, Any] | None = None) -> AsyncIterator[dict[str, Dispatcher]]:
    """name -> a dispatcher over that tier's server, started in `data/<name>` with the store
    `options` given (`--option`), stopped after. `dispatcher.service` is the tier server."""
    servers = {name: build(name, TierSettings(name=name, data_dir=Path(data) / name, options=dict(options or {})))
               for name in names}
    started = []
    try:
        for server in servers.values():
            await server.startup()
            started.append(server)
        yield {name: Dispatcher(server) for name, server in servers.items()}
    finally:
        for server in started:
            await server.shutdown()


async def call(d: Dispatcher, method: str, params: dict[str, Any]) -> dict[str, Any]:
    """The reply's result, or {"error": code}."""
    reply = await d.handle({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}, Context())
    assert reply is not None
    return {"error": reply["error"]["code"]} if "error" in reply else reply["result"]


def owner() -> str:
    return "o-" + uuid.uuid4().hex[:10]
