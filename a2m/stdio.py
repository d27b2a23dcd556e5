"""The stdio binding: one JSON message per line in, one per line out.

stdout carries only JSON-RPC (responses and `memory/event` notifications,
written whole under one lock so lines never interleave); logs go to stderr;
end of input ends the server cleanly.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from typing import Any

from .dispatch import Context, Dispatcher, dumps

log = logging.getLogger("a2m.stdio")

MAX_LINE = 64 * 1024 * 1024
HEAD = 256  # bytes of a dropped line kept for its reader


class LineTooLong(Exception):
    """A line past the reader's limit, already read past to its end; `head` is its first bytes (a
    reader can tell whose reply it was from the id there)."""

    def __init__(self, head: bytes = b"") -> None:
        super().__init__()
        self.head = head


async def read_line(reader: asyncio.StreamReader) -> bytes:
    """The next line with its newline (the last may lack one), or b"" at the end of input.

    A line longer than the reader's limit raises `LineTooLong` only once all of it has been
    read and dropped. `StreamReader.readline` drops just what it has buffered: the rest of
    the line was then read as a message of its own, answered a second time (-32700) or,
    when that rest happened to be valid JSON (a request after a run of padding), run."""
    try:
        return await reader.readuntil(b"\n")
    except asyncio.IncompleteReadError as exc:
        return exc.partial
    except asyncio.LimitOverrunError as exc:
        over = exc.consumed
    head = b""
    while True:
        dropped = await reader.readexactly(over)  # what is buffered of the long line (up to the newline, if it came)
        head = head or dropped[:HEAD]
        try:
            await reader.readuntil(b"\n")
        except asyncio.IncompleteReadError:
            raise LineTooLong(head) from None  # the input ended inside the long line
        except asyncio.LimitOverrunError as exc:
            over = exc.consumed
            continue
        raise LineTooLong(head)


class _FileReader(asyncio.ReadTransport):
    """Feeds `protocol` from a regular file: reading one never blocks, so it is read in the loop,
    a chunk per turn, paused while the reader holds more than its limit (the protocol's flow control)."""

    def __init__(self, fd: int, protocol: asyncio.Protocol) -> None:
        super().__init__()
        self._fd, self._protocol = fd, protocol
        self._reading = asyncio.Event()
        self._reading.set()
        protocol.connection_made(self)
        self._task = asyncio.get_running_loop().create_task(self._pump())

    async def _pump(self) -> None:
        while True:
            await self._reading.wait()
            data = os.read(self._fd, 1 << 20)
            if not data:
                break
            self._protocol.data_received(data)
            await asyncio.sleep(0)
        self._protocol.eof_received()
        self._protocol.connection_lost(None)

    def pause_reading(self) -> None:
        self._reading.clear()

    def resume_reading(self) -> None:
        self._reading.set()

    def is_reading(self) -> bool:
        return self._reading.is_set()

    def is_closing(self) -> bool:
        return self._task.done()

    def close(self) -> None:
        self._task.cancel()


async def serve_stdio(dispatcher: Dispatcher, lifespan: Any = None) -> None:
    """Serve on this process's stdin/stdout until stdin closes."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=MAX_LINE)
    protocol = asyncio.StreamReaderProtocol(reader)
    try:
        await loop.connect_read_pipe(lambda: protocol, sys.stdin)
    except ValueError:  # a regular file (`--stdio < requests.jsonl`), which only pipes and sockets may be
        _FileReader(sys.stdin.fileno(), protocol)
    out = sys.stdout.buffer
    # The read transport made stdin non-blocking, and with it stdout where both are one socket or
    # terminal (socat, inetd, systemd): a write to a full non-blocking stdout writes part of the
    # line and says nothing, cutting the reply and gluing the next onto it. Writes block, as on a pipe.
    if not os.get_blocking(out.fileno()):
        os.set_blocking(out.fileno(), True)
    lock = asyncio.Lock()
    gone = False  # stdout was closed by the reader: nobody hears a reply any more, so stop

    async def send(line: bytes) -> None:
        nonlocal gone
        async with lock:
            if gone:
                return
            try:
                out.write(line)
                out.flush()
            except (BrokenPipeError, ConnectionResetError):
                gone = True
                log.info("stdout was closed: stopping")
                # The interpreter flushes stdout again at exit: point it at /dev/null so that is quiet too.
                os.dup2(os.open(os.devnull, os.O_WRONLY), out.fileno())

    async def write(obj: dict[str, Any]) -> None:
        await send(dumps(obj) + b"\n")

    async def push(event: dict[str, Any]) -> None:
        await write({"jsonrpc": "2.0", "method": "memory/event", "params": event})

    ctx = Context(transport="stdio", push=push)
    if lifespan is not None:
        await lifespan.startup()
    try:
        while True:
            try:
                line = await read_line(reader)
            except LineTooLong:  # answered once; the whole line was skipped, none of it runs
                await write({"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": "message too large"}})
                continue
            if not line or gone:
                break
            if not line.strip():
                continue
            response = await dispatcher.handle_bytes(line, ctx)
            if response is not None:
                await send(response + b"\n")
    finally:
        if lifespan is not None:
            await lifespan.shutdown()


def log_to_stderr(level: int = logging.INFO) -> None:
    logging.basicConfig(stream=sys.stderr, level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
