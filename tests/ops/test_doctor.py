"""`a2m doctor`: a table of every tier behind a router (or one tier server), non-zero when one is down."""

from __future__ import annotations

import subprocess
from contextlib import ExitStack
from pathlib import Path
from typing import Iterator

import pytest

from a2mctl.doctor import check, doctor
from a2mctl.up import router_available, router_toml
from tests.support.procs import ROOT, a2m_command, free_port, stop, wait_ready

from .conftest import free_port_block


@pytest.fixture
def federation(tmp_path: Path) -> Iterator[tuple[str, dict[str, subprocess.Popen[bytes]]]]:
    """working + procedural tier servers and a router in front of them, as real processes."""
    if not router_available():
        pytest.skip("router/ not present")
    base = free_port_block(5)
    config = tmp_path / "router.toml"
    config.write_text(router_toml(["working", "procedural"], base))
    commands = {
        "working": a2m_command("serve", "working", "--port", str(base + 1), "--data", str(tmp_path)),
        "procedural": a2m_command("serve", "procedural", "--port", str(base + 4), "--data", str(tmp_path)),
        "router": a2m_command("serve", "router", "--port", str(base), "--config", str(config)),
    }
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for name in ("working", "procedural"):
            procs[name] = subprocess.Popen(commands[name], cwd=ROOT, stdout=subprocess.DEVNULL)
        wait_ready(f"http://127.0.0.1:{base + 1}/", procs["working"])
        wait_ready(f"http://127.0.0.1:{base + 4}/", procs["procedural"])
        # the router after its tiers: one it found down at start waits out a backoff, and the
        # first check below would race it (CI saw procedural reported down)
        procs["router"] = subprocess.Popen(commands["router"], cwd=ROOT, stdout=subprocess.DEVNULL)
        wait_ready(f"http://127.0.0.1:{base}/", procs["router"])
        yield f"http://127.0.0.1:{base}/", procs
    finally:
        for proc in procs.values():
            stop(proc)


@pytest.mark.anyio
async def test_doctor_reports_a_killed_tier_down(federation: tuple[str, dict[str, subprocess.Popen[bytes]]],
                                                 capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")  # piped output used to be cut to this, URLs and all
    url, procs = federation
    summary, reports = await check(url)
    assert summary["readyz"] == 200
    assert {r.name: (r.kind, r.engine, r.status) for r in reports} == {
        "working": ("working", "redis", "up"), "procedural": ("procedural", "git", "up")}
    assert all(r.p50_ms is not None and r.records == 0 for r in reports)
    assert await doctor(url) == 0
    out = capsys.readouterr().out
    assert "all tiers up" in out
    assert all(r.url in out for r in reports), out

    # One tier server alone is an A2M URL too.
    working_url = url.replace(url.rsplit(":", 1)[1], f"{int(url.rsplit(':', 1)[1].strip('/')) + 1}/")
    _, alone = await check(working_url)
    assert [(r.name, r.status, r.url) for r in alone] == [("working", "up", working_url)]

    procs["procedural"].kill()  # SIGKILL: no goodbye
    procs["procedural"].wait()
    assert await doctor(url) == 1
    out = capsys.readouterr().out
    assert "procedural" in out and "down" in out and "not healthy" in out
    _, reports = await check(url)
    assert {r.name: r.status for r in reports} == {"working": "up", "procedural": "down"}


@pytest.mark.anyio
async def test_doctor_on_an_unreachable_url_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}/"
    assert await doctor(url) == 2
    out = capsys.readouterr().out
    assert "unreachable: connection refused" in out and out.count(url.rstrip("/")) == 1, out


def test_doctor_command_line_exit_status() -> None:
    result = subprocess.run(a2m_command("doctor", f"http://127.0.0.1:{free_port()}/"), cwd=ROOT,
                            capture_output=True, text=True)
    assert result.returncode == 2, result.stdout + result.stderr


@pytest.mark.anyio
async def test_doctors_readyz_agrees_with_its_table(federation: tuple[str, dict[str, subprocess.Popen[bytes]]]) -> None:
    """doctor read /readyz before its describe: the default tier killed just after the router last
    heard from it read "/readyz 200" beside a table saying it was down. /readyz is read after."""
    url, procs = federation
    summary, _ = await check(url)
    assert summary["readyz"] == 200
    procs["working"].kill()  # the default tier, within seconds of the router's last good call to it
    procs["working"].wait()
    summary, reports = await check(url)
    assert {r.name: r.status for r in reports} == {"working": "down", "procedural": "up"}
    assert summary["readyz"] == 503, summary


@pytest.mark.anyio
async def test_a_probe_times_the_answered_call_not_the_rate_limits_wait() -> None:
    """Each probe recall is refused once (`-32006`, retry_after 0.3 s) and then answered at once: the
    p50 is the answered call's, not the wait's (the router test cannot claim a timing on a loaded
    machine; this client answers in microseconds, so 0.3 s is far from either side)."""
    from a2m import errors
    from a2m.errors import A2MError
    from a2mctl.doctor import PROBES, _probe

    class RefusedOnce:
        calls = 0

        async def call(self, method: str, params: dict[str, object], *, timeout: float | None = None) -> dict:
            self.calls += 1
            if self.calls % 2:
                raise A2MError(errors.QUOTA_EXCEEDED, "rate limit", {"retry_after": 0.3})
            return {"records": []}

    client = RefusedOnce()
    p50, why = await _probe(client, None)
    assert client.calls == 2 * PROBES and why == "" and p50 is not None and p50 < 300, (p50, why)


@pytest.mark.anyio
async def test_doctor_says_whether_the_owner_locks_are_shared_and_up(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """An operator scaling the router out must know its replicas share their owner locks (lock_url,
    decision 156); a lock store that does not answer fails moves, forgets and keyed writes."""
    from tests.router.stack import federation as stack
    from tests.support.redis import own_redis

    tiers = [{"name": "working", "kind": "working"}]
    for folder in ("plain", "shared", "locks"):
        (tmp_path / folder).mkdir()
    with stack(tmp_path / "plain", tiers, mode="real") as plain:
        assert await doctor(plain.url) == 0
        assert "owner locks: this router's own (run one router replica, or set lock_url)" in capsys.readouterr().out
    with ExitStack() as lock_store:
        lock_url = lock_store.enter_context(own_redis(tmp_path / "locks"))
        with stack(tmp_path / "shared", tiers, mode="real", top={"lock_url": lock_url}) as shared:
            assert await doctor(shared.url) == 0
            out = capsys.readouterr().out
            assert "owner locks: shared with the other router replicas (lock_url up)" in out and "evicts" not in out
            evicting(lock_url)
            assert await doctor(shared.url) == 0  # a warning: the locks work until that Redis is full
            assert "lock_url Redis evicts keys at its maxmemory (maxmemory-policy volatile-lru)" in \
                capsys.readouterr().out
            lock_store.close()  # the lock store's redis-server is gone
            assert await doctor(shared.url) == 1
            out = capsys.readouterr().out
            assert "the owner lock store (lock_url) does not answer" in out and "not healthy: lock_url" in out, out
            assert lock_url.removeprefix("unix://") not in out  # its words are in the router's log only


def evicting(url: str) -> None:
    """The Redis at `url` evicts keys with a TTL at its maxmemory, as a cache's may."""
    import redis

    with redis.Redis.from_url(url) as admin:
        admin.config_set("maxmemory", "100mb")
        admin.config_set("maxmemory-policy", "volatile-lru")


@pytest.mark.anyio
async def test_doctor_on_a_server_that_answers_nothing_says_so_in_one_wait(
        capsys: pytest.CaptureFixture[str]) -> None:
    """A server that takes connections and answers nothing (stopped, wedged) kept doctor 20 s, asking
    /readyz, /healthz and describe in turn, and then said "no response in 10 s"."""
    import socket
    import time

    from a2mctl.doctor import GET_ROUNDS, GET_TIMEOUT

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)  # the kernel completes each connection; nothing ever reads or answers
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/"
        started = time.monotonic()
        assert await doctor(url) == 2
        took = time.monotonic() - started
    assert GET_ROUNDS * GET_TIMEOUT <= took < GET_ROUNDS * GET_TIMEOUT + 3, took
    assert f"no response in {GET_ROUNDS * GET_TIMEOUT:g} s (to /readyz and /healthz)" in capsys.readouterr().out


@pytest.mark.anyio
async def test_doctor_on_a_server_slow_past_one_get_but_alive_reports_it(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """A server that answers in 6 s (its process stopped a while, a loop blocked by a long call) is
    alive, and answers describe within doctor's own 10 s: doctor gave up at 5 s, asking /readyz and
    /healthz at once, and said it gave no response, as of a wedged one."""
    import signal
    import threading

    port = free_port()
    proc = subprocess.Popen(a2m_command("serve", "procedural", "--port", str(port), "--data", str(tmp_path)),
                            cwd=ROOT, stdout=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}/"
        wait_ready(url, proc)
        proc.send_signal(signal.SIGSTOP)  # the kernel still takes connections; nothing answers them
        waking = threading.Timer(6.5, proc.send_signal, (signal.SIGCONT,))
        waking.start()
        try:
            code = await doctor(url)
        finally:
            waking.join()
        out = capsys.readouterr().out
        assert "no response" not in out and code != 2, out
        assert "procedural" in out, out
    finally:
        stop(proc)
