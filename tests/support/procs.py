"""Start A2M servers as real processes for tests, on free loopback ports, and stop them."""

from __future__ import annotations

import os
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


def free_port() -> int:
    """A loopback port nothing listens on, and not one this process handed out before: a federation
    takes its ports before starting any server, and the kernel may offer a port it just released
    again (a router once could not bind, and its readiness probe was answered by a tier)."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


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
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
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
