"""The router's connection pool (a2m.http1) against a real tier server process (the fixture tier on
uvicorn, as `a2m.http` serves every tier): a tier restarted, and an answer read late, must not cost
a call. The pool never retries a request (a POST may have been applied), so a connection it reuses
has to be one the tier has not closed and will not close under the request.

An event loop that stalls is played by `time.sleep` in the test's own loop: a long step, or a
frozen router process, during which the tier closes connections or answers."""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager

import anyio
import orjson
import pytest

from a2m.http1 import ConnectionPool
from tests.support.procs import ROOT, fixture_server_command, free_port, stop, wait_ready

DESCRIBE = orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "memory/describe", "params": {}})


def _start(port: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(fixture_server_command("--port", str(port)), cwd=ROOT, stdout=subprocess.DEVNULL)
    try:
        wait_ready(f"http://127.0.0.1:{port}/", proc, 60)
    except BaseException:
        stop(proc)
        raise
    return proc


@contextmanager
def _tier() -> Iterator[tuple[str, list[subprocess.Popen[bytes]]]]:
    """A fixture tier on a free port: (its URL, [its process]); a restart replaces the process in the list."""
    port = free_port()
    procs = [_start(port)]
    try:
        yield f"http://127.0.0.1:{port}/", procs
    finally:
        for proc in procs:
            stop(proc)


@pytest.mark.anyio
async def test_a_tier_restarted_while_the_loop_stalled_costs_no_call() -> None:
    """The tier restarts (killed, started again on its port) while the router's loop is busy: every
    idle connection's FIN waits in its socket, unread. The next call took one, wrote into it and
    failed with "connection closed before the response" (the router marks the tier down for it),
    though the tier was up and the close already known to the kernel."""
    with _tier() as (url, procs):
        pool = ConnectionPool(url)
        with anyio.fail_after(30):
            await asyncio.gather(*(pool.post(DESCRIBE, timeout=5) for _ in range(4)))
            assert pool.idle == 4
            port = int(url.rsplit(":", 1)[1].strip("/"))
            procs[0].kill()  # the loop is not run from here to the calls below: a stalled one
            procs[0].wait()
            procs[0] = _start(port)
            for _ in range(4):  # as many as there were dead connections
                status, _ = await pool.post(DESCRIBE, timeout=5)
                assert status == 200
        pool.close()


@pytest.mark.anyio
async def test_an_answer_read_late_retires_its_connection_by_when_its_request_was_sent() -> None:
    """The tier's keep-alive timer (5 s) starts when it has answered. A loop stalled while the answer
    arrived read it seconds later, and the pool, counting its 4 s from that read, kept reusing the
    connection past the tier's close: a call written as the tier closed it failed (reset, or closed
    before the response). Counted from the request's write, the pool lets it go first."""
    with _tier() as (url, _):
        pool = ConnectionPool(url)
        with anyio.fail_after(30):
            await pool.post(DESCRIBE, timeout=5)
            conn = pool._idle[-1]
            call = asyncio.create_task(pool.post(DESCRIBE, timeout=10))
            while conn.waiter is None:  # written
                await asyncio.sleep(0)
            time.sleep(2.5)  # the loop stalls; the tier answers meanwhile, and closes the connection 5 s on
            assert (await call)[0] == 200
            await asyncio.sleep(1.8)  # 4.3 s since the request was written: 0.7 s before the tier closes it
            assert (await pool.post(DESCRIBE, timeout=5))[0] == 200
            assert conn.closed and pool._idle[-1] is not conn  # not taken: a new connection answered
        pool.close()
