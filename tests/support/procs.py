"""Start A2M servers as real processes for tests, on free loopback ports, and stop them."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence

import httpx

ROOT = Path(__file__).resolve().parents[2]
PYTHON = sys.executable


_HANDED_OUT: set[int] = set()
_PICK = random.Random(os.urandom(16))  # apart from the global generator, which a test may seed


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = (int(n) for n in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        low, high = 49152, 65535  # IANA's range, as macOS uses
    return low, high


def free_ports(count: int = 1, contiguous: bool = False) -> list[int]:
    """`count` loopback ports nothing listens on, not handed out before in this process, and outside
    the kernel's ephemeral range. A port taken with bind(0) is ephemeral: between its release and the
    server's bind, any outgoing connection on the machine may get it as its source port, or a probe of
    it connect to itself (TCP self-connect), and the server then cannot listen (CI once saw episodic's
    port taken while its PostgreSQL started). Below the range, only a listener can take it."""
    low, high = _ephemeral_range()
    # below the range, else above it, else (a range of nearly every port) anywhere unprivileged
    first, last = (10000, low - 1) if low > 12000 else (high + 1, 65535) if high < 63535 else (1024, 65535)
    first, last = _own_share(first, last)
    for _ in range(1000):
        if contiguous:
            base = _PICK.randint(first, last - count + 1)
            ports = list(range(base, base + count))
        else:
            ports = _PICK.sample(range(first, last + 1), count)
        if _HANDED_OUT.intersection(ports) or not all(_bindable(port) for port in ports):
            continue
        _HANDED_OUT.update(ports)
        return ports
    raise RuntimeError(f"no {count} free loopback ports in {first}..{last}")


def _own_share(first: int, last: int) -> tuple[int, int]:
    """This pytest-xdist worker's slice of first..last (all of it outside xdist): a port is handed
    out once per process, and two workers each picking one before either binds it would collide."""
    worker, workers = os.environ.get("PYTEST_XDIST_WORKER", ""), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", 1))
    if not worker.startswith("gw") or workers < 2:
        return first, last
    width = (last - first + 1) // workers
    start = first + int(worker[2:]) * width
    return start, start + width - 1


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A loopback port nothing listens on, and not one this process handed out before: a federation
    takes its ports before starting any server, and the kernel may offer a port it just released
    again (a router once could not bind, and its readiness probe was answered by a tier)."""
    return free_ports(1)[0]


def a2m_command(*args: str) -> list[str]:
    """The `a2m` console script, run through this interpreter (works without the venv on PATH)."""
    return [PYTHON, "-m", "a2mctl.cli", *args]


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before it was ready: {url}")
        try:
            if httpx.get(url.rstrip("/") + "/readyz", timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"server at {url} not ready after {timeout} s")


def stop(proc: subprocess.Popen[bytes], timeout: float = 20.0) -> None:
    stop_all([proc], timeout)


def stop_all(procs: Sequence[subprocess.Popen[bytes]], timeout: float = 20.0) -> None:
    """SIGTERM every one of `procs` first, then wait for each (SIGKILL past `timeout`): their graceful
    shutdowns overlap, where stopping them one after another cost each one's ~0.2 s in turn."""
    running = [proc for proc in procs if proc.poll() is None]
    for proc in running:
        proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for proc in running:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def http_server(command: Sequence[str], port: int, env: dict[str, str] | None = None,
                timeout: float = 90.0) -> Iterator[str]:
    """Run `command` (which must listen on `port`) and yield its URL once /readyz says ready."""
    url = f"http://127.0.0.1:{port}/"
    proc = subprocess.Popen(list(command), cwd=ROOT, env={**os.environ, **(env or {})},
                            stdout=subprocess.DEVNULL, stderr=None)
    try:
        wait_ready(url, proc, timeout)
        yield url
    finally:
        stop(proc)


def fixture_server_command(*args: str) -> list[str]:
    return [PYTHON, "-m", "tests.support.testserver", *args]
