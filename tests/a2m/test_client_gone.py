"""A request whose client closed its connection before the server ran it is not run (a2m.http's
`client_gone`, decision 143): a real server process, stopped (SIGSTOP) while requests queue for it,
as a stalled server is."""

from __future__ import annotations

import os
import signal
import socket
import subprocess

import httpx
import orjson

from tests.support.procs import ROOT, fixture_server_command, free_port, stop, wait_ready


def _post(port: int, method: str, params: dict[str, object]) -> socket.socket:
    """A JSON-RPC request sent on a fresh connection, its answer not read yet."""
    body = orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    return sock


def test_a_write_its_client_gave_up_on_while_the_server_stalled_is_not_run() -> None:
    """Sent to a stopped server, then abandoned (the connection closed, as a client's timeout does):
    the server ran it when it resumed, and the write its caller was told had failed landed (a
    forgotten record came back through a router's cut-off move: tests/router/test_router_doubts.py).
    The request whose client still waits is run and answered, as before."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    proc = subprocess.Popen(fixture_server_command("--port", str(port)), cwd=ROOT, stdout=subprocess.DEVNULL)
    try:
        wait_ready(url, proc)
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            _post(port, "memory/remember", {"records": [{"content": "abandoned"}]}).close()
            waiting = _post(port, "memory/remember", {"records": [{"content": "awaited"}]})
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        waiting.settimeout(10)
        assert b'"ids"' in waiting.recv(65536)
        waiting.close()
        held = httpx.post(url, json={"jsonrpc": "2.0", "id": 2, "method": "memory/timeline", "params": {}}).json()
        assert [r["content"] for r in held["result"]["records"]] == ["awaited"]
        metrics = httpx.get(url + "metrics").text
        assert 'a2m_http_refused_total{status="499"} 1.0' in metrics
    finally:
        stop(proc)
