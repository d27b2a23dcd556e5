"""A whole federation as real processes for the router's tests: tier servers + the router.

`fixture` tiers are the in-memory A2M test servers (fast, for policy tests);
`real` tiers are `a2m serve <kind>` on their embedded engines. Every process
binds loopback on a free port and is stopped (by its own pid) on exit.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import uuid
import subprocess
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

from tests.support.procs import PYTHON, ROOT, a2m_command, free_port, stop_all, wait_ready

FOUR = [
    {"name": "working", "kind": "working", "capacity": 32, "spill_to": "episodic", "timeout": 2.0},
    {"name": "episodic", "kind": "episodic", "spill_to": "semantic", "promote_to": "semantic", "promote_after": 3},
    {"name": "semantic", "kind": "semantic"},
    {"name": "procedural", "kind": "procedural"},
]


LAUNCH_KEYS = ("serve", "seed_read_only", "engine", "args")  # how a tier is started, not router config


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{toml_value(k)} = {toml_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(value)


def write_config(path: Path, tiers: Sequence[dict[str, Any]], top: dict[str, Any] | None = None) -> Path:
    lines = [f"{k} = {toml_value(v)}" for k, v in (top or {}).items() if not isinstance(v, dict)]
    for name, table in (top or {}).items():
        if isinstance(table, dict):
            lines.append(f"[{name}]")
            lines += [f"{k} = {toml_value(v)}" for k, v in table.items()]
    for tier in tiers:
        lines.append("[[tiers]]")
        lines += [f"{k} = {toml_value(v)}" for k, v in tier.items() if k not in LAUNCH_KEYS]
    path.write_text("\n".join(lines) + "\n")
    return path


@dataclass
class Proc:
    name: str
    command: list[str]
    port: int
    env: dict[str, str] = field(default_factory=dict)
    log: Path | None = None
    popen: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def start(self) -> "Proc":
        stderr = open(self.log, "ab") if self.log else subprocess.DEVNULL
        try:
            self.popen = subprocess.Popen(self.command, cwd=ROOT, env={**os.environ, **self.env},
                                          stdout=subprocess.DEVNULL, stderr=stderr)
        finally:
            if self.log:
                stderr.close()  # type: ignore[union-attr]
        return self

    def wait(self, timeout: float = 120.0) -> None:
        assert self.popen is not None
        wait_ready(self.url, self.popen, timeout)

    def kill(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait()

    def restart(self, timeout: float = 120.0) -> None:
        """A crash and its recovery: SIGKILL (a stopped process too), then the same command again,
        on the same port and the same data, waited for until it answers."""
        if self.popen is not None and self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait()
        self.start()
        self.wait(timeout)

    def pause(self) -> None:
        assert self.popen is not None
        os.kill(self.popen.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.popen is not None
        os.kill(self.popen.pid, signal.SIGCONT)

    def stop(self) -> None:
        stop_procs([self])


def stop_procs(procs: Sequence[Proc]) -> None:
    """Stop `procs` together (a paused one is resumed first, so that it can take its SIGTERM)."""
    for proc in procs:
        if proc.popen is not None:
            try:
                os.kill(proc.popen.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
    stop_all([proc.popen for proc in procs if proc.popen is not None])


@dataclass
class Stack:
    tiers: dict[str, Proc]
    router: Proc
    config: Path

    @property
    def url(self) -> str:
        return self.router.url


def tier_command(tier: dict[str, Any], port: int, mode: str, data: Path) -> list[str]:
    serve = tier.get("serve", mode)
    if serve == "fixture":
        command = [PYTHON, "-m", "tests.support.testserver", "--port", str(port), "--name", tier["name"],
                   "--kind", tier.get("kind") or "episodic"]
        if tier.get("seed_read_only"):
            command.append("--read-only")
        return [*command, *tier.get("args", ())]
    # `engine` picks another server than the kind's own (e.g. "corpus"), `args` adds its switches.
    return a2m_command("serve", tier.get("engine", tier["kind"]), "--port", str(port), "--data", str(data),
                       "--name", tier["name"], *tier.get("args", ()))


@contextmanager
def federation(tmp: Path, tiers: Sequence[dict[str, Any]] = FOUR, *, mode: str = "fixture",
               top: dict[str, Any] | None = None, env: dict[str, str] | None = None,
               timeout: float = 120.0, router_args: Sequence[str] = ()) -> Iterator[Stack]:
    """Start the tier servers (concurrently), then the router over HTTP with a config naming them
    (and `router_args`, switches of `a2m serve router`)."""
    # Short, because embedded engines put unix sockets in their data dirs (108-byte path limit).
    data = Path(tempfile.mkdtemp(prefix="a2m-", dir="/tmp"))
    procs: dict[str, Proc] = {}
    configured = []
    for tier in tiers:
        port = free_port()
        procs[tier["name"]] = Proc(tier["name"], tier_command(tier, port, mode, data), port, dict(env or {}),
                                   tmp / f"{tier['name']}.log")
        configured.append({**tier, "url": f"http://127.0.0.1:{port}/"})
    config = write_config(tmp / "router.toml", configured, top)
    router = Proc("router", [PYTHON, "-m", "a2mctl.cli", "serve", "router", "--config", str(config), *router_args,
                             "--port", "0"], 0, dict(env or {}), tmp / "router.log")
    router.port = free_port()
    router.command[-1] = str(router.port)
    started: list[Proc] = []
    try:
        for proc in procs.values():
            started.append(proc.start())
        for proc in procs.values():
            proc.wait(timeout)
        started.append(router.start())
        router.wait(timeout)
        yield Stack(procs, router, config)
    finally:
        # The router first, so that it never sees its tiers go; then the tiers, which never call
        # each other, all at once.
        if router in started:
            router.stop()
        stop_procs([proc for proc in started if proc is not router])
        shutil.rmtree(data, ignore_errors=True)


def stdio_router_command(config: Path) -> list[str]:
    return [PYTHON, "-m", "a2mctl.cli", "serve", "router", "--stdio", "--config", str(config)]


def new_owner() -> str:
    """A fresh owner partition: tests sharing one federation never see each other's records."""
    return "owner-" + uuid.uuid4().hex[:8]


async def tier_call(stack: Stack, tier: str, method: str, params: dict[str, Any]) -> dict[str, Any]:
    """A call to one tier server directly, behind the router's back (ground truth, or set-up an
    interrupted move or another router would leave)."""
    from a2m.client import HTTPClient

    async with HTTPClient(stack.tiers[tier].url) as client:
        return await client.call(method, params)



@contextmanager
def black_hole() -> Iterator[str]:
    """A `redis://` URL on loopback whose port accepts connections (the kernel does, from its backlog)
    and never answers a command: a Redis that hangs, or a firewall that passes the handshake only."""
    import socket

    listener = socket.socket()
    try:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        yield f"redis://127.0.0.1:{listener.getsockname()[1]}/0"
    finally:
        listener.close()
