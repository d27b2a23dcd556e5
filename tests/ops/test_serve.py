"""`a2m serve <tier>` as a user types it: a relative `--data`, from wherever the shell is."""

from __future__ import annotations

import os
import queue
import re
import subprocess
import threading
from pathlib import Path

import httpx
import orjson
import pytest

from tests.support.procs import ROOT, a2m_command, free_port, stop, wait_ready

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("tier", ["working", "procedural"])
def test_serve_with_a_relative_data_dir(tmp_path: Path, tier: str) -> None:
    # The working tier used to hand redis-server paths relative to a cwd it had already moved into.
    requests = [
        {"jsonrpc": "2.0", "id": 1, "method": "memory/remember", "params": {"records": [{"content": "relative dirs"}]}},
        {"jsonrpc": "2.0", "id": 2, "method": "memory/recall", "params": {"query": "relative"}},
    ]
    done = subprocess.run(
        a2m_command("serve", tier, "--stdio", "--data", "./data"), cwd=tmp_path, timeout=90,
        input=b"".join(orjson.dumps(r) + b"\n" for r in requests), capture_output=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    replies = {r["id"]: r for r in map(orjson.loads, done.stdout.splitlines())}
    assert "error" not in replies[1], replies[1]
    assert [r["content"] for r in replies[2]["result"]["records"]] == ["relative dirs"]
    assert (tmp_path / "data" / tier).is_dir() and not (tmp_path / "data" / tier / "data").exists()


def _serve_http(tmp_path: Path, *extra: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(a2m_command("serve", "procedural", "--data", str(tmp_path / "data"), *extra), cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


def _first_stderr_line(proc: subprocess.Popen[str], timeout: float = 60.0) -> str:
    """The server's first line on stderr, read by a thread so a silent server fails the test, not hangs it."""
    lines: queue.Queue[str] = queue.Queue()
    assert proc.stderr is not None
    threading.Thread(target=lambda: lines.put(proc.stderr.readline()), daemon=True).start()  # type: ignore[union-attr]
    try:
        return lines.get(timeout=timeout)
    except queue.Empty:
        return ""


@pytest.mark.parametrize("log_level", ["warning", "critical"])
def test_serve_without_a_port_says_where_it_listens(tmp_path: Path, log_level: str) -> None:
    # The default port is 0, any free one: without this line nobody could find the server.
    proc = _serve_http(tmp_path, "--log-level", log_level, env={"A2M_PORT": ""})
    try:
        line = _first_stderr_line(proc)
        found = re.fullmatch(r"a2m serve procedural: listening on (http://127\.0\.0\.1:(\d+)/)\n", line)
        assert found, line
        assert int(found.group(2)) != 0
        assert httpx.get(found.group(1) + "readyz", timeout=5.0, trust_env=False).status_code == 200
    finally:
        stop(proc)  # type: ignore[arg-type]
    assert proc.stdout is not None and proc.stdout.read() == ""


def test_serve_with_a_port_says_so_too_unless_a2m_up_runs_it(tmp_path: Path) -> None:
    port = free_port()
    proc = _serve_http(tmp_path, "--port", str(port))
    try:
        assert _first_stderr_line(proc) == f"a2m serve procedural: listening on http://127.0.0.1:{port}/\n"
    finally:
        stop(proc)  # type: ignore[arg-type]
    # `a2m up` prints its own line per tier once all are ready, so the servers it starts stay quiet.
    from a2mctl.up import _child_env

    assert _child_env(tmp_path / "data", port, None)["A2M_ANNOUNCE"] == "0"
    proc = _serve_http(tmp_path, "--port", str(port), env={"A2M_ANNOUNCE": "0"})
    try:
        wait_ready(f"http://127.0.0.1:{port}/", proc)  # type: ignore[arg-type]
    finally:
        stop(proc)  # type: ignore[arg-type]
    assert proc.stderr is not None and "listening on" not in proc.stderr.read()
