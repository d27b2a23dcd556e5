"""`a2m up`: the whole federation on embedded engines, a scripted client, Ctrl-C, and a second start."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from a2m.client import HTTPClient
from a2mctl import transfer
from a2mctl.up import PROCFILE, TIERS, engine_processes, procfile_processes, router_available, router_toml
from tests.support.procs import ROOT, a2m_command

from .conftest import free_port_block

pytestmark = pytest.mark.timeout(240)


class Up:
    """`a2m up` as a child process, its output collected by a thread (so the pipe never fills)."""

    def __init__(self, data: Path, port: int, *extra: str, env: dict[str, str] | None = None) -> None:
        self.data = data
        self.lines: list[str] = []
        # A session of its own, so that kill() takes honcho's forks with it even when the test fails.
        self.proc = subprocess.Popen(a2m_command("up", "--data", str(data), "--port", str(port), *extra), cwd=ROOT,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env={**os.environ, "COLUMNS": "200", **(env or {})}, start_new_session=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_up(self, timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any("Ctrl-C stops everything" in line for line in self.lines):
                return
            if self.proc.poll() is not None:
                raise AssertionError(f"a2m up exited with {self.proc.returncode}:\n{self.output}")
            time.sleep(0.2)
        raise AssertionError(f"a2m up not ready after {timeout} s:\n{self.output}")

    def interrupt(self, timeout: float = 60.0) -> int:
        self.proc.send_signal(signal.SIGINT)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise

    def kill(self) -> None:
        """Everything this run started, whatever state a failed test left it in: honcho's forks, the
        tier servers (process groups of their own) and their engines, all named by the data dir."""
        import psutil

        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        for proc in psutil.process_iter(["cmdline"]):
            if any(str(self.data) in arg for arg in proc.info["cmdline"] or ()):
                try:
                    proc.kill()
                except psutil.Error:
                    pass


def _no_engines_left(data: Path) -> None:
    assert engine_processes(data) == []
    for name in ("redis-server", "postgres"):
        found = subprocess.run(["pgrep", "-f", f"{name}.*{data}"], capture_output=True, text=True).stdout.split()
        assert found == [], f"{name} left behind: {found}"
    found = subprocess.run(["pgrep", "-f", f"a2mctl.cli serve .*{data}"], capture_output=True, text=True).stdout
    assert found.split() == [], "tier server left behind"


def test_procfile_in_the_repository_is_the_one_up_runs() -> None:
    assert (ROOT / "Procfile").read_text() == PROCFILE
    processes = procfile_processes((ROOT / "Procfile").read_text())
    assert list(processes) == [*TIERS, "router"]
    for offset, name in enumerate(TIERS, 1):
        # Each line runs through /bin/sh; check the expansion gives the port and data dir we promise.
        line = processes[name].replace("exec ${A2M:-a2m}", "echo")
        out = subprocess.run(["sh", "-c", line], capture_output=True, text=True,
                             env={"PATH": os.environ["PATH"], "A2M_BASE_PORT": "9100", "A2M_DATA": "/d x"}).stdout
        assert out.split() == ["serve", name, "--port", str(9100 + offset), "--data", "/d", "x"]
    router = processes["router"].replace("exec ${A2M:-a2m}", "echo")
    assert subprocess.run(["sh", "-c", router], capture_output=True, text=True, env={}).stdout.split() == \
        ["serve", "router", "--port", "8700"]
    out = subprocess.run(["sh", "-c", router], capture_output=True, text=True,
                         env={"A2M_ROUTER_CONFIG": "/etc/r.toml"}).stdout.split()
    assert out[-2:] == ["--config", "/etc/r.toml"]


@pytest.mark.skipif(not router_available(), reason="router/ not present")
def test_router_toml_for_a_subset_cuts_links_into_absent_tiers() -> None:
    from router.config import parse
    import tomllib

    config = parse(tomllib.loads(router_toml(["working", "procedural"], 9000)), env={})
    assert [t.name for t in config.tiers] == ["working", "procedural"]
    assert config.tier("working").url == "http://127.0.0.1:9001/"
    assert config.tier("working").spill_to is None
    assert config.tier("procedural").url == "http://127.0.0.1:9004/"
    full = parse(tomllib.loads(router_toml(TIERS, 9000)), env={})
    assert full.tier("working").spill_to == "episodic" and full.tier("episodic").promote_to == "semantic"


@pytest.mark.skipif(not router_available(), reason="router/ not present")
def test_router_toml_gives_the_router_the_tier_servers_embedder() -> None:
    """The router reads its embedder from router.toml alone: `A2M_EMBEDDER=... a2m up` embedded every
    record on the tiers but no query on the router, which warned on every start."""
    from router.config import parse
    import tomllib

    url = "http://127.0.0.1:9/v1"
    assert parse(tomllib.loads(router_toml(TIERS, 9000, embedder=url)), env={}).embedder == url
    for unset in (None, "", "none"):
        assert "embedder" not in router_toml(TIERS, 9000, embedder=unset)


@pytest.mark.skipif(not router_available(), reason="router/ not present")
@pytest.mark.parametrize("chosen", [TIERS, ("working", "episodic", "procedural"), ("episodic",)])
def test_router_toml_sets_promote_after_only_where_a_tier_promotes(chosen: tuple[str, ...]) -> None:
    """promote_after counts recalls towards a promotion into promote_to, and nothing else: the file
    `a2m up` writes sets it on the tier that promotes and nowhere else (a subset that cuts episodic's
    promote_to cuts its promote_after with it), so the router takes it at start."""
    from router.config import parse
    import tomllib

    raw = tomllib.loads(router_toml(chosen, 9000))
    assert [t["name"] for t in raw["tiers"] if "promote_after" in t] == \
        [t["name"] for t in raw["tiers"] if "promote_to" in t]
    config = parse(raw, env={})
    assert [(t.name, t.promote_to) for t in config.tiers if t.promote_to] == \
        ([("episodic", "semantic")] if "semantic" in chosen and "episodic" in chosen else [])
    if "semantic" in chosen and "episodic" in chosen:
        assert config.tier("episodic").promote_after == 3


@pytest.mark.skipif(not router_available(), reason="router/ not present")
def test_promote_after_without_promote_to_is_refused_by_name() -> None:
    """Decision 62: a setting that would never take effect stops the router at start, by name."""
    from router.config import ConfigError, parse

    tiers = [{"name": "working", "kind": "working", "url": "http://127.0.0.1:1/", "capacity": 8,
              "spill_to": "episodic", "promote_after": 5},
             {"name": "episodic", "kind": "episodic", "url": "http://127.0.0.1:2/"}]
    with pytest.raises(ConfigError, match=r"tier 'working': promote_after = 5 counts recalls towards a promotion "
                                          r"into promote_to, and this tier has none"):
        parse({"tiers": tiers}, env={})
    tiers[0].pop("promote_after")
    tiers[1]["promote_after"] = 2  # episodic promotes nowhere either
    with pytest.raises(ConfigError, match="tier 'episodic': promote_after"):
        parse({"tiers": tiers}, env={})
    tiers[1]["promote_to"] = "semantic"
    tiers.append({"name": "semantic", "kind": "semantic", "url": "http://127.0.0.1:3/"})
    assert parse({"tiers": tiers}, env={}).tier("episodic").promote_after == 2


@pytest.mark.anyio
async def test_up_serves_the_federation_stops_cleanly_and_finds_its_data(tmp_path: Path) -> None:
    data = tmp_path / "data"
    port = free_port_block(5)
    up = Up(data, port)
    try:
        up.wait_up()
        for offset, name in enumerate(TIERS, 1):
            assert any(line.strip().startswith(name) and f":{port + offset}/" in line for line in up.lines), up.output
        assert "listening on" not in up.output  # the servers' own lines would repeat the status lines
        assert (data / "Procfile").exists()
        # A second `a2m up` on the same data is refused before it starts or stops anything: the
        # checks below then run against the first one, whole.
        second = subprocess.run(a2m_command("up", "--data", str(data), "--port", str(free_port_block(5))), cwd=ROOT,
                                capture_output=True, text=True, timeout=60)
        assert second.returncode != 0 and f"is running on {data}" in second.stderr, second.stderr + second.stdout
        url = f"http://127.0.0.1:{port}/"
        if router_available():
            assert f"router {url}" in up.output
            async with HTTPClient(url) as client:
                turns = [{"content": f"the user said their cat is called Miso ({i})", "session": "chat-1",
                          "role": "user"} for i in range(3)]
                ids = (await client.call("memory/remember", {"records": turns}))["ids"]
                found = await client.call("memory/recall", {"query": "cat Miso"})
                assert {r["id"] for r in found["records"]} >= set(ids)
                # "a2m is up" means the router reaches every tier, not only that each one listens
                assert "degraded" not in found, (found, up.output)
                closed = await client.call("memory/session/close", {"session": "chat-1"})
                assert closed["flushed"] == 3
                assert (await client.call("memory/timeline", {"tier": "working"}))["records"] == []
                spilled = await client.call("memory/timeline", {"tier": "episodic"})
                assert [r["id"] for r in spilled["records"]] == ids
            out = tmp_path / "export.jsonl"
            assert await transfer.export(url, str(out), quiet=True) == 0
            assert len(out.read_text().splitlines()) == 3
        assert up.interrupt() == 0, up.output
        assert "a2m stopped" in up.output
        _no_engines_left(data)

        # A second run on the same data dir (a subset this time, and the user's own router.toml,
        # which names the working tier "live") finds the records again.
        extra = []
        if router_available():
            generated = (data / "router.toml").read_text()
            own = tmp_path / "own.toml"
            own.write_text(router_toml(["working", "episodic"], port).replace('name = "working"', 'name = "live"'))
            extra = ["--config", str(own)]
        again = Up(data, port, "--tiers", "working,episodic", *extra)
        try:
            again.wait_up()
            assert "semantic" not in again.output.split("a2m is up")[-1]
            if router_available():  # the router's own names, where they are not the servers'
                assert "router.toml's tiers: live, episodic, every one reached" in again.output, again.output
            if router_available():
                async with HTTPClient(url) as client:
                    found = await client.call("memory/recall", {"query": "cat Miso"})
                    assert {r["id"] for r in found["records"]} >= set(ids), (found, again.output)
                    assert "degraded" not in found, (found, again.output)
                    described = await client.call("memory/describe", {})
                    assert [t["name"] for t in described["tiers"]] == ["live", "episodic"]
                assert (data / "router.toml").read_text() == generated  # the user's file is used, not written
            else:
                async with HTTPClient(f"http://127.0.0.1:{port + 1}/") as client:
                    await client.call("memory/describe", {})
            # A tier server killed outright (no chance to stop its PostgreSQL): honcho stops the rest,
            # and `a2m up` stops the orphaned engine on its way out.
            episodic = subprocess.run(["pgrep", "-f", f"a2mctl.cli serve episodic .*{data}"], capture_output=True,
                                      text=True).stdout.split()
            assert episodic, again.output
            for pid in episodic:
                os.kill(int(pid), signal.SIGKILL)
            assert again.proc.wait(60) != 0
            assert "engine process(es) a tier left behind" in again.output, again.output
        finally:
            again.kill()
        _no_engines_left(data)
    finally:
        up.kill()


@pytest.mark.skipif(not router_available(), reason="router/ not present")
def test_up_with_a_bad_config_stops_before_starting_anything(tmp_path: Path) -> None:
    bad = tmp_path / "router.toml"
    bad.write_text('[[tiers]]\nname = "working"\nkind = "working"\nurl = "http://127.0.0.1:1/"\nspill_to = "nowhere"\n')
    done = subprocess.run(a2m_command("up", "--data", str(tmp_path / "data"), "--config", str(bad)), cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "nowhere" in done.stderr and str(bad) in done.stderr, done.stderr
    assert not (tmp_path / "data").exists()  # not even made (and locked) before the refusal


def test_up_with_unknown_tiers_stops_before_making_the_data_dir(tmp_path: Path) -> None:
    done = subprocess.run(a2m_command("up", "--data", str(tmp_path / "data"), "--tiers", "workng"), cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("a2m up: --tiers takes a comma-separated subset of working,episodic,semantic,"
                                  "procedural; got 'workng'"), done.stderr
    assert not (tmp_path / "data").exists()


def test_engines_are_matched_by_their_exact_data_dir_and_age(tmp_path: Path) -> None:
    """The reaper's view: an engine of a sibling data dir whose name starts the same, or one that
    was running before the run began, is not this run's."""
    import psutil

    def fake_engine(data: Path) -> subprocess.Popen[bytes]:
        code = "import time; time.sleep(60)"
        return subprocess.Popen(["bash", "-c", f'exec -a postgres {sys.executable} -c "{code}" -D {data}/episodic/postgres'])

    near, far = tmp_path / "t", tmp_path / "t1"
    engine = fake_engine(far)
    try:
        deadline = time.monotonic() + 10
        while engine.pid not in engine_processes(far) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert engine_processes(far) == [engine.pid]
        assert engine_processes(near) == []
        assert engine_processes(far, since=psutil.Process(engine.pid).create_time() + 1) == []
    finally:
        engine.kill()
        engine.wait()



@pytest.mark.anyio
async def test_up_waits_for_the_router_to_reach_a_tier_that_started_after_it(tmp_path: Path) -> None:
    """Each server answering its own /readyz is not enough for "a2m is up": the router found a slow
    tier down at its start and skips it until its backoff runs out, so the first recalls were
    `degraded`. `_router_catches_up` returns once the router's /readyz reaches every tier."""
    from a2mctl.up import _router_catches_up
    from tests.support.procs import http_server

    if not router_available():
        pytest.skip("the router package is not installed")
    port = free_port_block(5)
    config = tmp_path / "router.toml"
    config.write_text(router_toml(["working", "procedural"], port))
    router = a2m_command("serve", "router", "--config", str(config), "--port", str(port))
    working = a2m_command("serve", "working", "--port", str(port + 1), "--data", str(tmp_path / "data"))
    procedural = a2m_command("serve", "procedural", "--port", str(port + 4), "--data", str(tmp_path / "data"))
    with http_server(working, port + 1), http_server(router, port) as url:
        late = _router_catches_up(url, threading.Event(), timeout=1.0)
        assert late["working"] == "up" and late["procedural"] != "up", late  # nothing listens there
        with http_server(procedural, port + 4):
            assert _router_catches_up(url, threading.Event()) == {"working": "up", "procedural": "up"}
            async with HTTPClient(url) as client:
                found = await client.call("memory/recall", {"query": "anything"})
                assert "degraded" not in found, found


@pytest.mark.parametrize("below", ["", "/below"])
def test_up_on_a_file_as_data_dir_says_it_is_a_file(tmp_path: Path, below: str) -> None:
    """mkdir's "File exists" (or "Not a directory") was all it said."""
    afile = tmp_path / "afile"
    afile.write_text("not a directory")
    done = subprocess.run(a2m_command("up", "--data", f"{afile}{below}", "--port", str(free_port_block(5))),
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert f"a2m up: cannot use {afile}{below} as the data directory: {afile} is a file, not a directory" \
        in done.stderr, done.stderr


@pytest.mark.parametrize("taken", ["router", "episodic"])
def test_up_on_a_port_in_use_stops_before_starting_anything(tmp_path: Path, taken: str) -> None:
    """A port in use used to surface after four servers had started (and PostgreSQL's initdb was cut
    short), as one uvicorn line among forty; with another federation on those ports, its servers
    answered this run's readiness checks."""
    import socket

    port = free_port_block(5)
    busy = port + {"router": 0, **{name: i for i, name in enumerate(TIERS, 1)}}[taken]
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", busy))
        sock.listen()
        done = subprocess.run(a2m_command("up", "--data", str(tmp_path / "new" / "data"), "--port", str(port)),
                              cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert f"a2m up: port {busy} ({taken}) is in use on 127.0.0.1" in done.stderr, done.stderr + done.stdout
    assert "Traceback" not in done.stderr
    # the data dir it made to lock (a mistyped --data, say) is gone with the refusal, folders above too
    assert not (tmp_path / "new").exists(), list((tmp_path / "new").rglob("*"))


def test_up_serves_on_loopback_whatever_a2m_host_says(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The servers `a2m up` starts read $A2M_HOST as `a2m serve` does: an A2M_HOST=0.0.0.0 left in the
    shell put every tier server, which trusts any caller to name any owner, on the network, and
    127.0.0.2 put them where the router.toml it wrote (127.0.0.1) never reached them."""
    from a2mctl.up import _child_env

    monkeypatch.setenv("A2M_HOST", "localhost")
    assert _child_env(tmp_path, 8700, None)["A2M_HOST"] == "127.0.0.1"
    up = Up(tmp_path / "data", free_port_block(5), env={"A2M_HOST": "0.0.0.0"})
    try:
        assert up.proc.wait(60) != 0, up.output
    finally:
        up.kill()
    assert "a2m up: A2M_HOST=0.0.0.0" in up.output and "127.0.0.1" in up.output, up.output
    assert not (tmp_path / "data" / "Procfile").exists()


def test_up_refuses_a_tls_certificate_left_in_the_environment(tmp_path: Path) -> None:
    """A2M_TLS_CERT/KEY left in the shell made every server `a2m up` starts speak HTTPS, while the
    router.toml it writes and its readiness checks speak HTTP: it waited out its start timeout."""
    done = subprocess.run(a2m_command("up", "--data", str(tmp_path / "data"), "--port", str(free_port_block(5))),
                          cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "A2M_TLS_CERT": "/etc/a2m/cert.pem", "A2M_TLS_KEY": "/etc/a2m/key.pem"})
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "a2m up: A2M_TLS_CERT and A2M_TLS_KEY would make the servers speak HTTPS" in done.stderr, done.stderr
    assert not (tmp_path / "data" / "Procfile").exists()
    # a client CA alone: every tier it starts stopped at once, refusing it without a certificate of its own
    done = subprocess.run(a2m_command("up", "--data", str(tmp_path / "data"), "--port", str(free_port_block(5))),
                          cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "A2M_TLS_CLIENT_CA": "/etc/a2m/ca.pem"})
    assert done.returncode != 0 and "a2m up: A2M_TLS_CLIENT_CA would make" in done.stderr, done.stderr
    assert not (tmp_path / "data" / "Procfile").exists()



def _servers_of(data: Path) -> list[str]:
    return subprocess.run(["pgrep", "-f", f"a2mctl.cli serve .*{data}"], capture_output=True, text=True).stdout.split()


def _until_gone(data: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and (_servers_of(data) or engine_processes(data)):
        time.sleep(0.2)
    _no_engines_left(data)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_servers_stop_when_up_is_killed_and_the_next_up_starts(tmp_path: Path) -> None:
    """`kill -9` of `a2m up`'s process group (or the OOM killer) left all five servers and their
    engines running in sessions of their own (honcho starts each so): the next `a2m up` found its
    ports taken and named no culprit. Each server now dies with the run that started it (its engines
    with it), so the next start on the same data dir and ports comes up."""
    data = tmp_path / "data"
    port = free_port_block(5)
    up = Up(data, port, "--tiers", "working,episodic")
    try:
        up.wait_up()
        os.killpg(up.proc.pid, signal.SIGKILL)
        up.proc.wait(10)
        _until_gone(data)
        again = Up(data, port, "--tiers", "working,episodic")
        try:
            again.wait_up()
            assert again.interrupt() == 0, again.output
        finally:
            again.kill()
        _no_engines_left(data)
    finally:
        up.kill()


def test_up_stops_everything_on_a_hangup(tmp_path: Path) -> None:
    """A closed terminal or a dropped ssh session sends SIGHUP, which honcho leaves at its default:
    `a2m up` died without a word and its servers, in sessions of their own, never heard of it.
    It is a stop like Ctrl-C now."""
    data = tmp_path / "data"
    port = free_port_block(5)
    up = Up(data, port, "--tiers", "working,episodic")
    try:
        up.wait_up()
        os.killpg(up.proc.pid, signal.SIGHUP)
        assert up.proc.wait(60) == 0, up.output
        assert "a2m stopped" in up.output, up.output
        _no_engines_left(data)
    finally:
        up.kill()
