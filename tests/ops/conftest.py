"""Helpers for the operations tests: a block of free ports for `a2m up --port`."""

from __future__ import annotations

from tests.support.procs import free_ports


def free_port_block(count: int = 5) -> int:
    """A base port such that base..base+count-1 are all free on loopback (`a2m up --port base`)."""
    return free_ports(count, contiguous=True)[0]
