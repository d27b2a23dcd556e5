"""The `a2m` command line refuses a value it cannot use, naming it, before anything starts.

A port past 65535 was the case that mattered: the event loop bound 99999 as 34463, so a server
came up where nobody would look for it.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.support.procs import ROOT, a2m_command


@pytest.mark.parametrize(("argv", "message"), [
    (["serve", "working", "--port", "99999"], "a port is a number from 0 to 65535, not 99999"),
    (["serve", "working", "--port", "-1"], "a port is a number from 0 to 65535, not -1"),
    (["serve", "working", "--port", "http"], "a port is a number from 0 to 65535, not 'http'"),
    (["up", "--port", "70000"], "not 70000"),
    (["up", "--port", "65533"], "must be from 1 to 65531, not 65533"),
    (["up", "--port", "0"], "must be from 1 to 65531, not 0"),
    (["doctor", "localhost:8700"], "expected an http(s):// URL"),
    (["doctor", "http://127.0.0.1:99999/"], "Port out of range"),
    (["import", "http://127.0.0.1:1/", "x.jsonl", "--batch", "0"], "at least 1, not '0'"),
])
def test_a_value_that_cannot_work_is_refused_by_name(argv: list[str], message: str) -> None:
    done = subprocess.run(a2m_command(*argv), cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode in (1, 2) and message in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_the_port_from_the_environment_is_checked_too() -> None:
    done = subprocess.run(a2m_command("serve", "working"), cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "A2M_PORT": "65536"})
    assert done.returncode == 2 and "not 65536" in done.stderr


def test_a_host_reachable_from_the_network_is_told_apart_from_loopback() -> None:
    """`a2m serve` warns when it listens beyond this machine with no token (anyone could name any owner)."""
    from a2mctl.cli import reachable_from_network

    assert not any(map(reachable_from_network, ["127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost", "LOCALHOST"]))
    assert all(map(reachable_from_network, ["0.0.0.0", "::", "10.0.0.5", "memory.internal"]))
