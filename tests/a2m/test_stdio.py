"""The stdio binding's framing: one message per line, a line past the limit answered once and
skipped whole. End to end against a real tier server (`a2m serve working --stdio`, embedded
Redis), and the line reader on its own."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from a2m.stdio import MAX_LINE, LineTooLong, read_line
from tests.support.procs import ROOT, a2m_command, fixture_server_command


async def _reply(proc: asyncio.subprocess.Process, timeout: float = 60.0) -> dict[str, Any]:
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), timeout)
    assert line, "the server ended"
    return orjson.loads(line)


@pytest.mark.anyio
async def test_an_oversized_line_is_answered_once_and_none_of_it_runs(tmp_path: Path) -> None:
    """A line past the limit whose end is a valid request (after a run of padding) must not
    run that request, nor get a second answer; the next line is served normally."""
    proc = await asyncio.create_subprocess_exec(
        *a2m_command("serve", "working", "--stdio", "--data", str(tmp_path)),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
    assert proc.stdin is not None
    try:
        smuggled = orjson.dumps({"jsonrpc": "2.0", "id": 7, "method": "memory/remember",
                                 "params": {"records": [{"content": "smuggled"}]}})
        proc.stdin.write(b" " * (MAX_LINE + 1024 * 1024) + smuggled + b"\n")
        proc.stdin.write(b'{"jsonrpc":"2.0","id":8,"method":"memory/timeline","params":{}}\n')
        await proc.stdin.drain()
        first = await _reply(proc)
        assert first["id"] is None and first["error"]["code"] == -32600
        second = await _reply(proc)
        assert second["id"] == 8, second
        assert second["result"]["records"] == []
        proc.stdin.close()
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def _reader(*chunks: bytes, limit: int = 16) -> asyncio.StreamReader:
    reader = asyncio.StreamReader(limit=limit)
    for chunk in chunks:
        reader.feed_data(chunk)
    reader.feed_eof()
    return reader


@pytest.mark.anyio
async def test_read_line_skips_a_long_line_whole_wherever_its_newline_falls() -> None:
    # newline already buffered, newline arriving chunks later, and end of input inside the line
    reader = _reader(b"a" * 40 + b"\nok\n", b"b" * 20, b"c" * 30, b"d\nnext\nlast")
    with pytest.raises(LineTooLong):
        await read_line(reader)
    assert await read_line(reader) == b"ok\n"
    with pytest.raises(LineTooLong):
        await read_line(reader)
    assert await read_line(reader) == b"next\n"
    assert await read_line(reader) == b"last"
    assert await read_line(reader) == b""
    reader = _reader(b"x" * 50)
    with pytest.raises(LineTooLong):
        await read_line(reader)
    assert await read_line(reader) == b""


def _rpc(id_: int, method: str, params: dict[str, Any] | None = None) -> bytes:
    return orjson.dumps({"jsonrpc": "2.0", "id": id_, "method": method, "params": params or {}}) + b"\n"


def test_replies_are_whole_when_stdin_and_stdout_are_one_socket() -> None:
    """Under socat, inetd or systemd both are one socket; reading it made stdout non-blocking too,
    and a reply larger than the socket's buffer was cut short without an error: the next reply
    was glued to its tail, and the client waited for the end of a line that never came."""
    ours, theirs = socket.socketpair()
    proc = subprocess.Popen(fixture_server_command("--stdio"), stdin=theirs, stdout=theirs,
                            stderr=subprocess.DEVNULL, cwd=ROOT)
    theirs.close()
    try:
        ours.settimeout(10)
        stream = ours.makefile("rwb")
        stream.write(_rpc(1, "memory/remember", {"records": [{"content": "word " * 180_000}]}))
        stream.flush()
        assert "ids" in orjson.loads(stream.readline())["result"]
        stream.write(_rpc(2, "memory/timeline") + _rpc(3, "memory/timeline"))
        stream.flush()
        time.sleep(0.5)  # a slow reader: the server's writes fill the socket's buffer
        for id_ in (2, 3):
            reply = orjson.loads(stream.readline())
            assert reply["id"] == id_ and len(reply["result"]["records"][0]["content"]) == 900_000
        ours.shutdown(socket.SHUT_WR)
        assert proc.wait(30) == 0
    finally:
        ours.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_stdin_may_be_a_regular_file(tmp_path: Path) -> None:
    """`--stdio < requests.jsonl`: the pipe transport refuses a regular file, so the server
    failed at start with a traceback and answered nothing."""
    requests = tmp_path / "requests.jsonl"
    requests.write_bytes(_rpc(1, "memory/events/subscribe") + _rpc(2, "memory/remember", {"records": [{"content": "x"}]})
                         + _rpc(3, "memory/timeline"))
    with requests.open("rb") as stdin:
        done = subprocess.run(fixture_server_command("--stdio"), stdin=stdin, capture_output=True, cwd=ROOT,
                              timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [orjson.loads(line) for line in done.stdout.splitlines()]
    assert [m.get("id", m.get("method")) for m in lines] == [1, "memory/event", 2, 3]
    assert lines[3]["result"]["records"][0]["content"] == "x"


def test_a_reader_that_closes_stdout_stops_the_server_quietly() -> None:
    """`a2m serve … --stdio | head -1`: the reader went away, so the next reply cannot be written. The
    server ended with a BrokenPipeError traceback and exit status 1; it stops, and says why on stderr."""
    proc = subprocess.Popen(fixture_server_command("--stdio"), cwd=ROOT, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    describe = b'{"jsonrpc":"2.0","id":1,"method":"memory/describe"}\n'
    try:
        proc.stdin.write(describe)
        proc.stdin.flush()
        assert orjson.loads(proc.stdout.readline())["id"] == 1
        proc.stdout.close()  # the reader is gone
        for _ in range(5):  # the next reply finds stdout closed, and the server stops reading
            try:
                proc.stdin.write(describe)
                proc.stdin.flush()
            except BrokenPipeError:
                break
            time.sleep(0.1)
        with contextlib.suppress(BrokenPipeError):
            proc.stdin.close()
        assert proc.wait(30) == 0
        stderr = proc.stderr.read().decode()
        assert "Traceback" not in stderr and "stdout was closed" in stderr, stderr
    finally:
        if proc.poll() is None:
            proc.kill()
