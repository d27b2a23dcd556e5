"""`a2m serve <tier>` as a user types it: a relative `--data`, from wherever the shell is."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import orjson
import pytest

from tests.support.procs import ROOT, a2m_command

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
