"""A redis-server of the test's own, configured as a user's may be (the working tier's `--url`, the
router's `lock_url`), on a unix socket: no TCP port to collide with."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from backends.working import find_redis_server
from backends.working.embedded import ping_answer


@contextmanager
def own_redis(data: Path, *config: str) -> Iterator[str]:
    """A redis-server with `config` (its switches) and its files in `data`, up: its `unix://` URL."""
    sock_dir = tempfile.mkdtemp(prefix="a2m-own-")  # `data` may be too long for a socket path
    sock = os.path.join(sock_dir, "redis.sock")
    process = subprocess.Popen(
        [find_redis_server(), "--port", "0", "--unixsocket", sock, "--dir", str(data), "--save", "",
         "--appendonly", "no", *config], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while not ping_answer(sock).startswith((b"+PONG", b"-NOAUTH")):
            assert process.poll() is None and time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.02)
        yield f"unix://{sock}"
    finally:
        process.kill()
        process.wait()
        shutil.rmtree(sock_dir, ignore_errors=True)
