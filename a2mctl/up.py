"""`a2m up`: the whole federation on this machine, from the Procfile, through honcho.

Why honcho and a Procfile rather than a supervisor written here: the Procfile is
the same five lines a user can run with `honcho start` or `foreman start`, and
honcho already multiplexes output and turns one Ctrl-C into SIGTERM for every
process group. What this module adds is what a first run needs: a data
directory, a router.toml that matches the ports and the tiers chosen, a wait
until every tier answers /readyz, one status line per tier, and a last check
that no embedded engine (redis-server, postgres) outlives the run.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shlex
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

TIERS = ("working", "episodic", "semantic", "procedural")
PORT_OFFSET = {name: i + 1 for i, name in enumerate(TIERS)}  # router on --port, tiers on the next four
# Past this, `a2m up` says who it still waits for, and waits on: the first start of the embedded PostgreSQL
# runs initdb (5-50 s on a busy laptop), and a semantic tier builds its HNSW index before it serves
# (decision 18: ~40 s for 50,000 new vectors). Stopping there made a large build start over at every try.
READY_TIMEOUT = 180.0
ROUTER_CATCH_UP_S = 20.0  # past the router's longest backoff (15 s) for a tier it found down at its start
STOP_TIMEOUT = 30.0  # honcho's SIGKILL comes after this; postgres must have stopped well before

# One process per line, runnable as is by honcho or foreman: both run each line
# through /bin/sh, so POSIX parameter expansion and arithmetic are the only
# templating, and the defaults are the ones `a2m up` uses. `exec` makes the server the process
# honcho signals and waits for, not a shell that dies first and leaves it stopping unwatched. (Neither `$PORT`,
# which honcho and foreman set per process, nor `.env` is relied on.)
PROCFILE = """\
# The a2m federation on embedded engines: four tier servers and the router.
# `a2m up` runs this through honcho; `honcho start` or `foreman start` run it as is.
# A2M_DATA: the data directory (default .data); A2M_BASE_PORT: the router's port,
# the tiers listen on the next four; A2M: the a2m command; A2M_ROUTER_CONFIG: a
# router.toml (without one the router expects its tiers on 8701-8704).
working: exec ${A2M:-a2m} serve working --port $((${A2M_BASE_PORT:-8700} + 1)) --data "${A2M_DATA:-.data}"
episodic: exec ${A2M:-a2m} serve episodic --port $((${A2M_BASE_PORT:-8700} + 2)) --data "${A2M_DATA:-.data}"
semantic: exec ${A2M:-a2m} serve semantic --port $((${A2M_BASE_PORT:-8700} + 3)) --data "${A2M_DATA:-.data}"
procedural: exec ${A2M:-a2m} serve procedural --port $((${A2M_BASE_PORT:-8700} + 4)) --data "${A2M_DATA:-.data}"
router: exec ${A2M:-a2m} serve router --port ${A2M_BASE_PORT:-8700} ${A2M_ROUTER_CONFIG:+--config "$A2M_ROUTER_CONFIG"}
"""

_LINE = re.compile(r"^([A-Za-z0-9_-]+):\s*(.+)$")  # the Procfile grammar honcho and foreman share


def procfile_processes(text: str = PROCFILE) -> dict[str, str]:
    return {m.group(1): m.group(2) for line in text.splitlines() if (m := _LINE.match(line))}


def procfile_for(names: Iterable[str]) -> str:
    """The Procfile with only `names` (comments kept): what this run starts, for `honcho start` later."""
    keep = set(names)
    return "\n".join(line for line in PROCFILE.splitlines()
                     if (m := _LINE.match(line)) is None or m.group(1) in keep) + "\n"


def router_available() -> bool:
    try:
        return importlib.util.find_spec("router.server") is not None
    except ModuleNotFoundError:
        return False


def parse_tiers(value: str) -> list[str]:
    chosen = [t.strip() for t in value.split(",") if t.strip()]
    unknown = [t for t in chosen if t not in TIERS]
    if unknown or not chosen:
        raise SystemExit(f"a2m up: --tiers takes a comma-separated subset of {','.join(TIERS)}; got {value!r}")
    return [t for t in TIERS if t in chosen]  # Procfile order, no duplicates


# ---- router.toml --------------------------------------------------------------------------


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def router_toml(tiers: Iterable[str], base_port: int, host: str = "127.0.0.1", embedder: str | None = None) -> str:
    """The design's default layout restricted to `tiers`, on base_port+1.., links into absent tiers cut,
    and the tier servers' `embedder` (A2M_EMBEDDER) as the router's too: the router reads only its
    file's, so `A2M_EMBEDDER=local a2m up` embedded every record but no query, and warned each start.

    Generated from `router.config.default_tiers` so it cannot drift from the router's own defaults.
    """
    from router.config import default_tiers

    chosen = set(tiers)
    lines = ["# Written by `a2m up` on every start, so edits here are lost: copy it, edit the copy,",
             "# and run `a2m up --config COPY` (or `make up ARGS=\"--config COPY\"`).", ""]
    if embedder and embedder != "none":
        lines += [f"embedder = {_toml_value(embedder)}  # A2M_EMBEDDER, as the tier servers have it", ""]
    for tier in default_tiers(base_port=base_port + 1, host=host):
        if tier.name not in chosen:
            continue
        promote_to = tier.promote_to if tier.promote_to in chosen else None
        fields: dict[str, Any] = {
            "name": tier.name, "kind": tier.kind,
            "url": f"http://{host}:{base_port + PORT_OFFSET[tier.name]}/",
            "capacity": tier.capacity, "per_session": tier.per_session,
            "spill_to": tier.spill_to if tier.spill_to in chosen else None,
            "promote_to": promote_to,
            # Only beside promote_to: alone it counts towards nothing, and the router refuses it.
            "promote_after": tier.promote_after if promote_to else None, "timeout": tier.timeout,
        }
        lines.append("[[tiers]]")
        lines += [f"{k} = {_toml_value(v)}" for k, v in fields.items() if v is not None]
        lines.append("")
    return "\n".join(lines)


def own_config(path: str) -> Path:
    """The user's router.toml, checked before anything starts: a typo then stops `a2m up` with the
    router's own message, not after four tiers came up and the router process died."""
    from router.config import ConfigError, load

    config = Path(path).expanduser().resolve()
    try:
        load(config)
    except (ConfigError, OSError) as exc:
        raise SystemExit(f"a2m up: {exc}") from None
    return config


# ---- the run ------------------------------------------------------------------------------


@dataclass
class Member:
    name: str
    url: str
    state: str = "starting"
    since: float = 0.0
    detail: str = ""


def a2m_command() -> str:
    """How the Procfile's `$A2M` runs this very installation (works without the venv on PATH)."""
    return f"{shlex.quote(sys.executable)} -m a2mctl.cli"


def _child_env(data: Path, port: int, config: Path | None) -> dict[str, str]:
    package_root = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ)
    env.update({"A2M": a2m_command(), "A2M_DATA": str(data), "A2M_BASE_PORT": str(port),
                "PYTHONPATH": os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p),
                "PYTHONUNBUFFERED": "1",
                "A2M_HOST": "127.0.0.1",  # where router.toml and the readiness checks look, whatever the shell says
                "A2M_ANNOUNCE": "0"})  # no "listening on" line per server: `a2m up` prints its own status lines
    if config is not None:
        env["A2M_ROUTER_CONFIG"] = str(config)
    else:
        env.pop("A2M_ROUTER_CONFIG", None)
    return env


def _ready(url: str) -> bool:
    import httpx

    try:
        return httpx.get(url + "readyz", timeout=1.0, trust_env=False).status_code == 200
    except httpx.HTTPError:
        return False


def _router_catches_up(url: str, stopping: threading.Event, timeout: float = ROUTER_CATCH_UP_S) -> dict[str, str]:
    """Wait until the router's /readyz says it reaches every tier; then, or at `timeout`, each of its
    tiers' state (`up`, else why not; `{"router": "down"}` while it does not answer).

    Every server answering its own /readyz is not enough: the router asked each tier
    when it started, before the slow ones listened, and marked them down with backoff.
    Its /readyz probes those whose backoff has run out, so a few polls settle it, and
    "a2m is up" then means a recall reaches every tier (the first recalls used to be
    `degraded` for up to the backoff, 15 s after a slow first start)."""
    import httpx

    deadline = time.monotonic() + timeout
    tiers: dict[str, str] = {}
    while not stopping.is_set():
        try:
            tiers = dict(httpx.get(url + "readyz", timeout=5.0, trust_env=False).json().get("tiers") or {})
        except (httpx.HTTPError, ValueError, AttributeError, TypeError):
            tiers = {"router": "down"}
        if all(state == "up" for state in tiers.values()) or time.monotonic() > deadline:
            return tiers
        stopping.wait(0.2)
    return tiers


def _unseen(tiers: dict[str, str]) -> list[str]:
    return [name for name, state in tiers.items() if state != "up"]


def _tier_summary(url: str) -> str:
    """`engine, N records` from describe; best effort (the tier is ready, but say so if it will not tell)."""
    import httpx

    token = os.environ.get("A2M_SERVICE_TOKEN")  # the tiers then answer only the router's token
    try:
        response = httpx.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "memory/describe", "params": {}},
                              headers={"authorization": f"Bearer {token}"} if token else None,
                              timeout=5.0, trust_env=False)
        tiers = response.json()["result"].get("tiers") or []
    except Exception:  # noqa: BLE001 — a status line, not a health check (that is `a2m doctor`)
        return ""
    engine = next((t.get("engine") for t in tiers if t.get("engine")), "?")
    count = sum(int(t.get("count") or 0) for t in tiers)
    return f"{engine}, {count} record{'' if count == 1 else 's'}"


def engine_processes(data: Path, since: float | None = None) -> list[int]:
    """Pids of the redis-server / postgres serving exactly `data` (found by the paths on their command
    lines: `-D DATA/episodic/postgres`, Redis's `DATA/working` socket or dir), started at or after
    `since` (a psutil create_time) when given: another data dir's engines, or engines that were
    running before this run began, are never this run's to stop."""
    import psutil

    data = data.resolve()
    mine = {str(data / "episodic" / "postgres"), str(data / "working"), str(data / "working" / "redis.sock"),
            f"unixsocket:{data / 'working' / 'redis.sock'}"}
    found = []
    for proc in psutil.process_iter(["pid", "name", "cmdline", "create_time"]):
        info = proc.info
        argv = info["cmdline"] or []
        if info["pid"] == os.getpid() or not argv or not any(e in argv[0] for e in ("redis-server", "postgres")):
            continue
        tokens = {token for arg in argv for token in arg.split(" ")}  # Redis rewrites its title into one string
        if tokens & mine and (since is None or (info["create_time"] or 0) >= since):
            found.append(info["pid"])
    return found


def reap_engines(data: Path, since: float | None = None, timeout: float = 15.0) -> list[int]:
    """The safety net: stop engines a killed tier server left behind. Returns the pids it signalled.

    redis-server dies with its parent (PDEATHSIG), but the embedded PostgreSQL is
    daemonized by pg_ctl and survives a SIGKILLed tier server. SIGINT is its
    "fast shutdown": it disconnects clients and checkpoints.
    """
    pids = engine_processes(data, since)
    postmaster = data / "episodic" / "postgres" / "postmaster.pid"
    try:
        head = int(postmaster.read_text().split()[0])
        if head in pids:
            pids = [head] + [p for p in pids if p != head]
    except (OSError, ValueError, IndexError):
        pass
    for pid in pids:
        try:
            os.kill(pid, signal.SIGINT if pid == pids[0] and postmaster.exists() else signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and engine_processes(data, since):
        time.sleep(0.1)
    for pid in engine_processes(data, since):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return pids


LOCK_FILE = ".a2m-up.lock"


def _missing_from(data: Path) -> Path | None:
    """The outermost folder of `data` (itself included) that does not exist yet: what this run makes."""
    missing = None
    for path in (data, *data.parents):
        if path.exists():
            return missing
        missing = path
    return missing


def _unmake(made: Path | None, lock: Path) -> None:
    """Take back the data dir (and the folders above it) this run made only to lock, when it stops
    before using it: a mistyped --data refused for a busy port left an empty folder behind."""
    if made is None:
        return
    lock.unlink(missing_ok=True)
    for path in (lock.parent, *lock.parent.parents):
        try:
            path.rmdir()  # only an empty one: anything else written there meanwhile stays
        except OSError:
            return
        if path == made:
            return


def hold_data_dir(data: Path) -> int:
    """Create `data` and take its run lock, or stop with a message: two federations on one data dir
    would start two PostgreSQL and Redis servers over the same files. Returns the lock's fd (held
    until this process exits)."""
    import fcntl

    lock = data / LOCK_FILE
    # A file where the directory (or a folder above it) should be: mkdir says only "File exists".
    file = next((path for path in (data, *data.parents) if path.exists()), None)
    if file is not None and not file.is_dir():
        raise SystemExit(f"a2m up: cannot use {data} as the data directory: {file} is a file, not a directory "
                         "(--data / A2M_DATA names a folder)")
    try:
        data.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        raise SystemExit(f"a2m up: cannot use {data} as the data directory: {exc.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise SystemExit(f"a2m up: another `a2m up` (pid {holder}) is running on {data}; stop it first, "
                         "or give this one another --data") from None
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    return fd


def ports_in_use(host: str, ports: dict[str, int]) -> list[tuple[str, int]]:
    """The (process, port) pairs of `ports` that cannot be bound on `host` now. Bound as uvicorn binds
    (SO_REUSEADDR), so a port a stopped run left in TIME_WAIT still counts as free."""
    import socket

    taken = []
    for name, port in ports.items():
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((host, port))
            except OSError:
                taken.append((name, port))
    return taken


def _process_class() -> type:
    """honcho's Process, whose fork dies with this run and whose server dies with its fork
    (Linux: PR_SET_PDEATHSIG; elsewhere as before).

    honcho starts each server in a session of its own, so `a2m up` killed outright (`kill -9` of its
    process group, the OOM killer) left all five servers and their engines running, and the next
    `a2m up` found its ports taken. Now the fork gets SIGKILL when `a2m up` dies, and the server
    SIGTERM when its fork dies: the server's own stop, which stops its engine."""
    from honcho.process import Popen, Process

    from backends.children import die_with_parent

    def popen(cmd: str, **kwargs: Any) -> Any:  # in the fork: the fork is the parent the server watches
        return Popen(cmd, preexec_fn=die_with_parent(signal.SIGTERM), **kwargs)

    class DyingProcess(Process):  # type: ignore[misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._child_ctor = popen
            self._with_run = die_with_parent(signal.SIGKILL)  # made here, in `a2m up`: the parent it watches

        def run(self, events: Any = None, ignore_signals: bool = False) -> None:
            self._with_run()  # the fork ignores SIGINT and SIGTERM, hence SIGKILL
            super().run(events, ignore_signals)

    return DyingProcess


def _stop_on_hangup(manager: Any) -> None:
    """SIGHUP (the terminal closed, the ssh session dropped) stops the run as Ctrl-C does: honcho
    leaves it at its default, so `a2m up` died without a word and left its servers running. honcho's
    forks inherit the handler and ignore it there: each stops when its server does."""
    owner = os.getpid()

    def hangup(signum: int, frame: Any) -> None:
        if os.getpid() == owner:
            manager.returncode = 128 + signal.SIGHUP
            manager.terminate()  # before printing: the terminal may be gone

    signal.signal(signal.SIGHUP, hangup)


def up(args: argparse.Namespace) -> int:
    from honcho import manager as honcho_manager
    from rich.console import Console

    from .cli import default_data_dir, reachable_from_network

    port = int(args.port)
    if not 1 <= port <= 65535 - len(TIERS):
        raise SystemExit(f"a2m up --port: the router listens on it and the tiers on the next {len(TIERS)}, "
                         f"so it must be from 1 to {65535 - len(TIERS)}, not {port}")
    shell_host = os.environ.get("A2M_HOST")
    if shell_host and reachable_from_network(shell_host):
        raise SystemExit(f"a2m up: A2M_HOST={shell_host} would put the tier servers, which trust any caller to "
                         "name any owner, on the network; a2m up serves on 127.0.0.1 only: unset A2M_HOST (for "
                         "a deployment beyond this machine see compose.yaml and deploy/)")
    tls = [name for name in ("A2M_TLS_CERT", "A2M_TLS_KEY", "A2M_TLS_CLIENT_CA") if os.environ.get(name)]
    if tls:  # the servers would read them, as `a2m serve` does, and answer this run's http:// checks with nothing
        raise SystemExit(f"a2m up: {' and '.join(tls)} would make the servers speak HTTPS (or ask for it), which "
                         "the router.toml a2m up writes and its readiness checks do not; a2m up serves plain HTTP "
                         f"on 127.0.0.1 only: unset {' and '.join(tls)} (for TLS, `a2m serve --tls-cert`: "
                         "docs/operations.md)")
    console = Console(highlight=False)
    # The command line first: a typo in --tiers or --config used to make (and lock) the data dir before
    # it was refused.
    tiers = parse_tiers(args.tiers)
    with_router = router_available()
    if args.config and not with_router:
        raise SystemExit("a2m up --config: router/ is not installed here, so there is no router to configure")
    config = own_config(args.config) if with_router and args.config else None
    data = Path(args.data).expanduser() if args.data else default_data_dir()
    data = data.resolve()
    made = _missing_from(data)
    lock = hold_data_dir(data)
    import psutil

    started = psutil.Process().create_time()  # the engines this run starts are younger than this process
    host = "127.0.0.1"
    if not with_router:
        console.print("[yellow]router/ is not installed here: starting the tier servers only[/]")

    commands = procfile_processes()
    chosen = [*tiers, "router"] if with_router else list(tiers)
    ports = {name: port + PORT_OFFSET.get(name, 0) for name in chosen}
    # Checked before anything starts: otherwise the servers come up, the one whose port is taken exits,
    # and honcho stops the rest, its message one line among theirs (another federation on those ports
    # would even answer this run's readiness checks).
    for name, taken in ports_in_use(host, ports):
        _unmake(made, data / LOCK_FILE)
        raise SystemExit(f"a2m up: port {taken} ({name}) is in use on {host}; stop what listens there, or "
                         f"choose another --port (the router takes it, the tiers the next {len(TIERS)})")
    try:
        if with_router and not args.config:
            config = data / "router.toml"
            config.write_text(router_toml(tiers, port, host, embedder=os.environ.get("A2M_EMBEDDER")))
        (data / "Procfile").write_text(procfile_for(chosen))
    except OSError as exc:
        raise SystemExit(f"a2m up: cannot write to {data}: {exc.strerror}") from None

    members = {name: Member(name, f"http://{host}:{ports[name]}/") for name in chosen}
    env = _child_env(data, port, config)
    honcho_manager.KILL_WAIT = STOP_TIMEOUT  # honcho's default (5 s) can SIGKILL a tier before postgres stops
    stopping = threading.Event()
    outcome: dict[str, Any] = {"ready": False}

    class Manager(honcho_manager.Manager):  # type: ignore[misc]
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self._process_ctor = _process_class()

        def loop(self) -> None:
            _stop_on_hangup(self)
            super().loop()

        def _start(self) -> None:
            super()._start()  # forks first; the watcher thread starts after, so no fork sees it
            threading.Thread(target=watch, args=(self,), daemon=True, name="a2m-up-watch").start()

    def watch(manager: Any) -> None:
        from rich.live import Live
        from rich.spinner import Spinner
        from rich.table import Table

        start = time.monotonic()

        def render() -> Table:
            table = Table.grid(padding=(0, 2))
            for m in members.values():
                mark: Any = Spinner("dots", style="cyan") if m.state == "starting" else "[green]✓[/]"
                table.add_row(mark, m.name, m.url, m.state if m.state == "starting" else f"ready in {m.since:.1f} s")
            return table

        told = False
        with Live(render(), console=console, transient=True, refresh_per_second=8) as live:
            while not stopping.is_set():
                for m in members.values():
                    if m.state == "starting" and _ready(m.url):
                        m.state, m.since = "ready", time.monotonic() - start
                live.update(render())
                if all(m.state == "ready" for m in members.values()):
                    break
                if not told and time.monotonic() - start >= READY_TIMEOUT:
                    told = True
                    late = ", ".join(m.name for m in members.values() if m.state != "ready")
                    console.print(f"[yellow]not ready after {READY_TIMEOUT:.0f} s: {late}; still waiting (the log "
                                  "above says what it is doing: a first start of PostgreSQL runs initdb, a "
                                  "semantic tier builds its vector index); Ctrl-C stops[/]")
                stopping.wait(0.2)
        if stopping.is_set():
            return
        reached: dict[str, str] = _router_catches_up(members["router"].url, stopping) if with_router else {}
        unseen = _unseen(reached)
        if unseen:
            console.print(f"[yellow]the router does not reach {', '.join(unseen)} yet: recalls leave "
                          "it out (`degraded`) until it does; see `a2m doctor`[/]")
        outcome["ready"] = True
        head = members["router"].url if with_router else None
        console.print(f"[bold green]a2m is up[/] — router {head}" if head else
                      "[bold green]a2m tiers are up[/] (no router)")
        for name in tiers:
            m = members[name]
            console.print(f"  {name:<11} {m.url:<24} ready  {_tier_summary(m.url)}")
        if set(reached) - set(tiers):  # --config names tiers otherwise (a mounted corpus, a renamed tier)
            console.print(f"  router.toml's tiers: {', '.join(reached)}"
                          f"{'' if unseen else ', every one reached'}")
        console.print(f"  data in {data}; Ctrl-C stops everything")
        sys.stdout.flush()

    manager = Manager(printer=_RichPrinter(console))
    for name in chosen:
        manager.add_process(name, commands[name], env=env, cwd=str(data))
    try:
        manager.loop()
    finally:
        stopping.set()
        left = reap_engines(data, since=started)
        if left:
            console.print(f"[yellow]stopped {len(left)} engine process(es) a tier left behind: {left}[/]")
        os.close(lock)
    console.print("a2m stopped")
    if manager.returncode in (128 + signal.SIGHUP, 130, 143) and outcome["ready"]:
        return 0  # stopped on request
    return int(manager.returncode or 0) or (0 if outcome["ready"] else 1)


class _RichPrinter:
    """honcho's printer interface, writing through rich so child output scrolls above the spinner."""

    def __init__(self, console: Any) -> None:
        self.console = console
        self.width = 0

    def write(self, message: Any) -> None:
        data = message.data.decode("utf-8", "replace") if isinstance(message.data, bytes) else message.data
        name = (message.name or "").ljust(self.width)
        style = "dim" if message.name == "system" else "cyan"
        from rich.text import Text

        try:
            for line in data.splitlines():
                self.console.print(Text.assemble((f"{name} | ", style), line), soft_wrap=True)
        except OSError:  # the terminal is gone (a hangup): the stop must go on without its lines
            pass
