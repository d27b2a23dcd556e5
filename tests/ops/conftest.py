"""Helpers for the operations tests: a block of free ports for `a2m up --port`, and a working tier
server for the import and export tests."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from tests.support.procs import a2m_command, free_port, free_ports, http_server


def free_port_block(count: int = 5) -> int:
    """A base port such that base..base+count-1 are all free on loopback (`a2m up --port base`)."""
    return free_ports(count, contiguous=True)[0]


@pytest.fixture
def working(tmp_path: Path) -> Iterator[str]:
    """The Redis-backed working tier server, alone."""
    port = free_port()
    with http_server(a2m_command("serve", "working", "--port", str(port), "--data", str(tmp_path / "w")), port) as url:
        yield url
