"""The `a2m` command line refuses a value it cannot use, naming it, before anything starts.

A port past 65535 was the case that mattered: the event loop bound 99999 as 34463, so a server
came up where nobody would look for it.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

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
    (["serve", "working", "--body-timeout", "0"], "seconds above 0, not '0'"),
    (["export", "http://127.0.0.1:1/", "-", "--wait-for-tiers", "-1"], "0 or a number of seconds above 0, not '-1'"),
    (["export", "http://127.0.0.1:1/", "-", "--wait-for-tiers", "soon"], "not 'soon'"),
    (["import", "http://127.0.0.1:1/", "x.jsonl", "--wait-for-tiers", "-1"], "0 or a number of seconds above 0"),
    (["serve", "router", "--shutdown-timeout", "nan"], "seconds above 0, not 'nan'"),
    (["serve", "working", "--max-connections", "0"], "at least 1, not '0'"),
])
def test_a_value_that_cannot_work_is_refused_by_name(argv: list[str], message: str) -> None:
    done = subprocess.run(a2m_command(*argv), cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode in (1, 2) and message in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_the_port_from_the_environment_is_checked_too() -> None:
    done = subprocess.run(a2m_command("serve", "working"), cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "A2M_PORT": "65536"})
    assert done.returncode == 2 and "not 65536" in done.stderr


def test_the_http_limits_from_the_environment_are_checked_too() -> None:
    done = subprocess.run(a2m_command("serve", "working"), cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "A2M_MAX_CONNECTIONS": "lots"})
    assert done.returncode == 2 and "--max-connections" in done.stderr and "not 'lots'" in done.stderr


def test_a_host_reachable_from_the_network_is_told_apart_from_loopback() -> None:
    """`a2m serve` warns when it listens beyond this machine with no token (anyone could name any owner)."""
    from a2mctl.cli import reachable_from_network

    assert not any(map(reachable_from_network, ["127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost", "LOCALHOST"]))
    assert all(map(reachable_from_network, ["0.0.0.0", "::", "10.0.0.5", "memory.internal"]))


@pytest.mark.parametrize(("what", "flag", "value", "message"), [
    # The router's service token comes from router.toml or $A2M_SERVICE_TOKEN: with the flag alone
    # it called its tiers with no token, and every tier that needs one was "down".
    ("router", "--service-token", "svc-token", "service_token in router.toml or $A2M_SERVICE_TOKEN"),
    ("router", "--embedder", "local", "embedder in router.toml"),
    ("router", "--data", "{tmp}/d", "the router keeps no data"),
    ("router", "--url", "http://127.0.0.1:1/", "each tier's url in router.toml"),
    ("router", "--name", "memory", "name in router.toml"),
    ("router", "--option", "review=true", "router.toml"),
    ("procedural", "--config", "{tmp}/router.toml", "--config is the router's router.toml"),
])
def test_a_flag_the_server_would_not_read_is_refused(tmp_path: Path, what: str, flag: str, value: str,
                                                     message: str) -> None:
    """`a2m serve` takes the flags of every server; one that this server never reads was dropped
    without a word, so the server ran without the setting its operator gave it."""
    argv = ["serve", what, "--stdio", flag, value.format(tmp=tmp_path)]
    if what != "router":
        argv += ["--data", str(tmp_path / "data")]
    done = subprocess.run(a2m_command(*argv), cwd=ROOT, input="", capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert f"a2m serve {what}: {flag} " in done.stderr and message in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(("argv", "said"), [
    # A stranger reads --help first: the defaults and the variables that stand for a flag were only in the docs.
    (["serve", "--help"], ["default 127.0.0.1", "$A2M_HOST", "$A2M_<TIER>_URL", "$A2M_SERVICE_TOKEN",
                           "$A2M_ALLOWED_ORIGINS", "DATA/NAME", "$A2M_EMBEDDER"]),
    (["up", "--help"], ["default 8700", "the next four"]),
    (["doctor", "--help"], ["default http://127.0.0.1:8700/"]),
    (["export", "--help"], ["quoted command line"]),
    (["import", "--help"], ["quoted command line"]),
])
def test_help_names_defaults_and_variables(argv: list[str], said: list[str]) -> None:
    done = subprocess.run(a2m_command(*argv), cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 0, done.stderr
    assert [s for s in said if s not in done.stdout] == [], done.stdout


def test_the_router_says_it_does_not_read_a2m_embedder(tmp_path: Path) -> None:
    """A2M_EMBEDDER is the tier servers' variable; a router given it in a shared environment ran without
    an embedder and said nothing."""
    done = subprocess.run(a2m_command("serve", "router", "--stdio"), cwd=ROOT, input="", capture_output=True,
                          text=True, timeout=60, env={**os.environ, "A2M_EMBEDDER": "http://127.0.0.1:9/v1"})
    assert done.returncode == 0, done.stderr
    assert ("a2m serve router: warning: A2M_EMBEDDER=http://127.0.0.1:9/v1 is a tier server's setting; the router "
            "embeds with router.toml's embedder (none): set embedder there") in done.stderr, done.stderr
    quiet = subprocess.run(a2m_command("serve", "router", "--stdio"), cwd=ROOT, input="", capture_output=True,
                           text=True, timeout=60, env={**os.environ, "A2M_EMBEDDER": "none"})
    assert quiet.returncode == 0 and "A2M_EMBEDDER" not in quiet.stderr, quiet.stderr
