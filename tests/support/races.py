"""Races forced one way, on the real engines: a `Gate` holds a store method's calls until the test
lets each go, so an interleaving the engine's timing would produce now and then happens every time.
And the tier servers the concurrency tests run on (`tier_servers`), built as `a2m serve` builds
them, in process: one per tier configuration, plus a second server (a replica) on the working
tier's Redis and on the episodic tier's PostgreSQL, as `a2m serve <tier> --url` would run it.
"""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator

from a2m.dispatch import Context, Dispatcher
from backends.serve import build
from backends.settings import TierSettings
from backends.surface import TierServer

TIERS: dict[str, tuple[str, dict[str, Any]]] = {
    "working": ("working", {}),
    "episodic": ("episodic", {}),
    "semantic": ("semantic", {}),
    "semantic-local": ("semantic", {"engine": "local"}),
    "procedural": ("procedural", {}),
}
REPLICATED = ("working", "episodic")  # procedural refuses a second server (decision 47); Edge is one process's


@asynccontextmanager
async def tier_servers(data: Path) -> AsyncIterator[dict[str, TierServer]]:
    """label -> started server for each of `TIERS`, and `working2` / `episodic2` on the engines of
    `working` / `episodic`."""
    out: dict[str, TierServer] = {}
    try:
        for label, (engine, options) in TIERS.items():
            out[label] = build(engine, TierSettings(name=engine, data_dir=data / label, options=dict(options)))
            await out[label].startup()
        engines = {"working": out["working"].store.server.url, "episodic": out["episodic"].store.dsn}  # type: ignore[attr-defined]
        for name in REPLICATED:
            out[name + "2"] = build(name, TierSettings(name=name, data_dir=data / f"{name}2", url=engines[name]))
            await out[name + "2"].startup()
        yield out
    finally:
        for server in reversed(list(out.values())):
            await server.shutdown()


async def call(server: TierServer, method: str, params: dict[str, Any]) -> dict[str, Any]:
    """The result, or {"error": code, "message": ...}."""
    reply = await Dispatcher(server).handle({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}, Context())
    assert reply is not None
    if "error" in reply:
        return {"error": reply["error"]["code"], "message": reply["error"]["message"]}
    return reply["result"]


class Gate:
    """Holds the next `calls` calls (after `skip`) of an async method of one object until the test releases each,
    before the call runs (or, with `after`, once it has run but before it returns): a race forced
    to go one way, whatever the engine's timing."""

    def __init__(self, monkeypatch: Any, obj: Any, name: str, *, calls: int = 1, after: bool = False,
                 skip: int = 0) -> None:
        original = getattr(obj, name)
        self.left = calls
        self.skip = skip  # calls let through before the first one held
        self.releases: list[asyncio.Event] = []

        async def held(*args: Any, **kwargs: Any) -> Any:
            if self.skip > 0:
                self.skip -= 1
                return await original(*args, **kwargs)
            if self.left <= 0:
                return await original(*args, **kwargs)
            self.left -= 1
            release = asyncio.Event()
            self.releases.append(release)
            if not after:
                await release.wait()
            result = await original(*args, **kwargs)
            if after:
                await release.wait()
            return result

        monkeypatch.setattr(obj, name, held)

    async def reached(self, n: int = 1, timeout: float = 10.0) -> None:
        """Wait until `n` calls are held."""
        async with asyncio.timeout(timeout):
            while len(self.releases) < n:
                await asyncio.sleep(0.001)

    def release(self, index: int = 0) -> None:
        self.releases[index].set()

    def open(self) -> None:
        """Hold nothing more and let every held call go (a failed test must not leave one hanging)."""
        self.left = 0
        for release in self.releases:
            release.set()
