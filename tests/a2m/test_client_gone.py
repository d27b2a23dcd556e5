"""A request whose client closed its connection before the server ran it is not run (a2m.http's
`client_gone`, decision 143): a real server process, stopped (SIGSTOP) while requests queue for it,
as a stalled server is."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
from pathlib import Path

import httpx
import orjson
import pytest

from a2m.client import HTTPClient
from a2m.errors import A2MError
from tests.support.pki import key_and_cert
from tests.support.procs import ROOT, a2m_command, fixture_server_command, free_port, stop, wait_ready


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
        answer = b""
        while b'"ids"' not in answer:  # the head and the body may come in two reads
            answer += waiting.recv(65536) or b"(closed)"
            assert not answer.endswith(b"(closed)"), answer
        waiting.close()
        held = httpx.post(url, json={"jsonrpc": "2.0", "id": 2, "method": "memory/timeline", "params": {}}).json()
        assert [r["content"] for r in held["result"]["records"]] == ["awaited"]
        metrics = httpx.get(url + "metrics").text
        assert 'a2m_http_refused_total{status="499"} 1.0' in metrics
    finally:
        stop(proc)


@pytest.mark.anyio
async def test_over_tls_a_call_the_client_timed_out_is_not_run_either(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The router's client, over HTTPS, giving up on a call to a stopped server: the server sees the
    connection end behind the request (the client's close_notify, then its FIN) and does not run it."""
    key, cert = key_and_cert(tmp_path, "a2m")
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    port = free_port()
    url = f"https://127.0.0.1:{port}/"
    proc = subprocess.Popen(a2m_command("serve", "working", "--port", str(port), "--data", str(tmp_path / "data"),
                                        "--tls-cert", str(cert), "--tls-key", str(key)),
                            cwd=ROOT, stdout=subprocess.DEVNULL)
    try:
        wait_ready(url, proc)
        async with HTTPClient(url, timeout=0.5) as client:
            await client.call("memory/describe", {})  # the connection made while the server runs
            os.kill(proc.pid, signal.SIGSTOP)
            try:
                with pytest.raises(A2MError):
                    await client.call("memory/remember", {"records": [{"content": "given up on"}]})
            finally:
                os.kill(proc.pid, signal.SIGCONT)
            await asyncio.sleep(0.5)
            held = await client.call("memory/timeline", {})
        assert held["records"] == []
    finally:
        stop(proc)
