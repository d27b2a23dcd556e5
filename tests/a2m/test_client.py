"""The async client against real server processes: results, error codes, notifications, unreachable servers."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import anyio
import pytest

from a2m.client import HTTPClient, StdioClient, Unavailable, connect
from a2m.errors import A2MError
from a2m.stdio import MAX_LINE
from tests.support.procs import fixture_server_command, free_port, http_server


@pytest.mark.anyio
async def test_http_client_calls_and_surfaces_codes() -> None:
    port = free_port()
    with http_server(fixture_server_command("--port", str(port)), port) as url:
        async with HTTPClient(url) as client:
            ids = (await client.call("memory/remember", {"records": [{"content": "pooled keep-alive"}]}))["ids"]
            results = await asyncio.gather(*(client.call("memory/recall", {"query": "keep-alive"}) for _ in range(20)))
            assert all(r["records"][0]["id"] == ids[0] for r in results)
            with pytest.raises(A2MError) as err:
                await client.call("memory/fetch", {})
            assert err.value.code == -32602 and not isinstance(err.value, Unavailable)


@pytest.mark.anyio
async def test_http_client_unreachable_is_unavailable() -> None:
    async with HTTPClient(f"http://127.0.0.1:{free_port()}/", timeout=2) as client:
        with pytest.raises(Unavailable) as err:
            await client.call("memory/describe")
        assert err.value.code == -32603


@pytest.mark.anyio
async def test_stdio_client_concurrent_calls_and_notifications() -> None:
    events: list[dict] = []
    client = connect(" ".join(fixture_server_command("--stdio")), on_notify=events.append)
    assert isinstance(client, StdioClient)
    async with client:
        await client.call("memory/events/subscribe", {})
        await asyncio.gather(*(client.call("memory/remember", {"records": [{"content": f"n{i}"}]}) for i in range(5)))
        await asyncio.sleep(0.2)
        assert len([e for e in events if e["params"]["kind"] == "written"]) == 5
        with pytest.raises(A2MError) as err:
            await client.call("memory/no_such")
        assert err.value.code == -32601


@pytest.mark.anyio
async def test_stdio_calls_fail_at_once_after_the_child_ended() -> None:
    """A call made after the child died raised a bare ConnectionResetError (not Unavailable), or
    waited out its whole timeout, and its id stayed pending for ever."""
    client = StdioClient(fixture_server_command("--stdio"), timeout=30)
    async with client:
        await client.call("memory/describe")
        assert client._proc is not None
        client._proc.kill()
        await client._proc.wait()
        with anyio.fail_after(5):
            for _ in range(3):
                with pytest.raises(Unavailable, match="ended"):
                    await client.call("memory/describe")
        assert not client._pending


@pytest.mark.anyio
async def test_stdio_notification_handler_may_call_the_client_and_may_fail() -> None:
    """`on_notify` was awaited inside the reader: a handler calling the client waited for a reply
    only that reader could deliver (every call timed out), and one that raised ended the reader."""
    seen: list[str] = []

    async def on_event(message: dict) -> None:
        seen.append(message["params"]["kind"])
        if len(seen) == 1:
            raise RuntimeError("a handler's own bug")
        seen.append((await client.call("memory/describe"))["protocol"])

    client = StdioClient(fixture_server_command("--stdio"), on_notify=on_event, timeout=30)
    async with client:
        with anyio.fail_after(10):
            await client.call("memory/events/subscribe", {})
            await client.call("memory/remember", {"records": [{"content": "one"}, {"content": "two"}]})
            while len(seen) < 3:
                await asyncio.sleep(0.02)
            assert seen == ["written", "written", "a2m/0.1"]
            assert (await client.call("memory/describe"))["protocol"] == "a2m/0.1"



@pytest.mark.anyio
async def test_stdio_notifications_read_before_close_are_delivered() -> None:
    """Handlers run apart from the reader; closing still waits for those already read."""
    kinds: list[str] = []

    async def slow(message: dict) -> None:
        await asyncio.sleep(0.01)
        kinds.append(message["params"]["kind"])

    async with StdioClient(fixture_server_command("--stdio"), on_notify=slow, timeout=30) as client:
        await client.call("memory/events/subscribe", {})
        await client.call("memory/remember", {"records": [{"content": f"n{i}"} for i in range(20)]})
    assert kinds == ["written"] * 20

@pytest.mark.anyio
async def test_stdio_concurrent_first_calls_start_one_child(tmp_path: Path) -> None:
    """Each of two first calls started a child of its own: both readers read one child's output
    (both calls timed out) and the other child was never closed."""
    pids = tmp_path / "pids"
    command = ["sh", "-c", f'echo $$ >> "{pids}"; exec "$@"', "sh", *fixture_server_command("--stdio")]
    client = StdioClient(command, timeout=30)
    try:
        with anyio.fail_after(20):
            results = await asyncio.gather(*(client.call("memory/describe") for _ in range(3)))
        assert all(r["protocol"] == "a2m/0.1" for r in results)
    finally:
        await client.close()
    assert len(pids.read_text().split()) == 1


ODD_SERVER = r"""
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m["method"] == "big":  # a reply line past the client's limit
        out = '{"jsonrpc":"2.0","id":%d,"result":{"x":"%s"}}' % (m["id"], "a" * (MAX_LINE + 1024))
    elif m["method"] == "big-id-last":  # the same, its id where the head of the line does not show it
        out = '{"result":{"x":"%s"},"jsonrpc":"2.0","id":%d}' % ("a" * (MAX_LINE + 1024), m["id"])
    elif m["method"] == "odd":  # an id no request can have
        out = json.dumps({"jsonrpc": "2.0", "id": [m["id"]], "result": {}})
    else:
        out = json.dumps({"jsonrpc": "2.0", "id": m["id"], "result": {"ok": True}})
    sys.stdout.write(out + "\n")
    sys.stdout.flush()
"""


@pytest.mark.anyio
async def test_stdio_reader_survives_a_reply_over_the_limit_and_an_odd_id() -> None:
    """Either ended the reader (ValueError, TypeError): every later call waited out its timeout.
    A reply over the limit now fails its call at once, as an HTTP reply over `max_response` does,
    found by the id at the head of its line or as the only call waiting."""
    client = StdioClient([sys.executable, "-c", f"MAX_LINE = {MAX_LINE}\n" + ODD_SERVER], timeout=30)
    async with client:
        with anyio.fail_after(40):
            for method, said in (("big", "larger than"), ("big-id-last", "larger than"), ("odd", "in time")):
                with pytest.raises(Unavailable, match=said):
                    await client.call(method, timeout=1 if said == "in time" else 20)
                assert await client.call("ok") == {"ok": True}


def test_connect_drops_an_absent_token_for_a_command_line() -> None:
    """`a2m export`/`import` pass `token=None` whatever the URL: a command line failed with TypeError."""
    assert isinstance(connect("python -m x --stdio", token=None, timeout=5), StdioClient)
    with pytest.raises(ValueError, match="token"):
        connect("python -m x --stdio", token="t")


@pytest.mark.anyio
async def test_http_413_is_the_servers_answer_not_an_outage() -> None:
    """A body over the server's limit (a router batch that grew with its embeddings) came back as
    Unavailable, which the router reads as "the tier is down": it marked a healthy tier down."""
    port = free_port()
    with http_server(fixture_server_command("--port", str(port)), port) as url:
        async with HTTPClient(url) as client:
            with pytest.raises(A2MError) as err:
                await client.call("memory/remember", {"records": [{"content": "x" * (17 << 20)}]})
            assert err.value.code == -32602 and not isinstance(err.value, Unavailable)
            assert err.value.data["status"] == 413
            assert (await client.call("memory/describe"))["protocol"] == "a2m/0.1"


@pytest.mark.anyio
@pytest.mark.parametrize("status", [b"404 Not Found", b"405 Method Not Allowed", b"501 Unsupported method"])
async def test_a_web_server_that_is_not_an_a2m_one_is_named_so(status: bytes) -> None:
    """A tier URL pointing at another web server (the wrong port) read only as "answered HTTP 501"."""
    from tests.a2m.test_http1 import server

    async with server(lambda request: b"HTTP/1.1 %s\r\ncontent-length: 2\r\n\r\nno" % status) as (url, _, _):
        async with HTTPClient(url) as client:
            with pytest.raises(Unavailable, match=r"answered HTTP \d+: not an A2M endpoint\?"):
                await client.call("memory/describe")


@pytest.mark.anyio
@pytest.mark.parametrize("error", [b'{"code":true,"message":"x"}', b'{"code":-32602.5,"message":"x"}',
                                   b'{"code":"-32602","message":"x"}'])
async def test_an_error_code_that_is_not_an_integer_is_an_internal_error(error: bytes) -> None:
    """JSON-RPC error codes are integers. `true` passed `isinstance(code, int)` and came out of the
    client (and the router, which passes tier errors on) as the code, an error object no client can read."""
    from tests.a2m.test_http1 import server, sized

    async with server(lambda request: sized(b'{"jsonrpc":"2.0","id":1,"error":%s}' % error)) as (url, _, _):
        async with HTTPClient(url) as client:
            with pytest.raises(A2MError) as err:
                await client.call("memory/describe")
    assert type(err.value.code) is int and err.value.code == -32603


STUCK_SERVER = r"""
import json, sys, time
for line in sys.stdin:
    m = json.loads(line)
    if m["method"] == "stop_reading":  # stops reading its input: the pipe fills
        time.sleep(60)
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": m["id"], "result": {"ok": True}}) + "\n")
    sys.stdout.flush()
"""


@pytest.mark.anyio
async def test_stdio_timeout_counts_the_write_to_a_child_that_stopped_reading() -> None:
    """Only the wait for the reply was under the timeout: a child that stopped reading its input
    filled the pipe, and the drain waited for ever, holding the write lock every later call needs."""
    client = StdioClient([sys.executable, "-c", STUCK_SERVER], timeout=30)
    try:
        async with client:
            assert await client.call("ok") == {"ok": True}
            with anyio.fail_after(10):
                with pytest.raises(Unavailable, match="in time"):
                    await client.call("stop_reading", timeout=1)
                for _ in range(2):  # a big request fills the pipe; the next waits on the lock
                    with pytest.raises(Unavailable, match="in time"):
                        await client.call("x", {"pad": "a" * (1 << 20)}, timeout=1)
            assert not client._pending
            assert client._proc is not None
            client._proc.kill()  # close() would give the stuck child 15 s to end
    finally:
        await client.close()


ASKING_SERVER = r"""
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    # a request to the client (servers send none, protocol §1) bearing the id of the call, then a notification
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": m["id"], "method": "client/ask", "params": {}}) + "\n")
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "method": "memory/event", "params": {"n": m["id"]}}) + "\n")
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": m["id"], "result": {"answer": m["method"]}}) + "\n")
    sys.stdout.flush()
"""


@pytest.mark.anyio
async def test_stdio_a_message_with_a_method_never_answers_a_call() -> None:
    """A line with `method` and `id` was taken for the response to the call with that id: the call
    failed ("malformed JSON-RPC result") and its real answer, a line later, was dropped."""
    events: list[dict] = []
    async with StdioClient([sys.executable, "-c", ASKING_SERVER], on_notify=events.append, timeout=30) as client:
        with anyio.fail_after(10):
            assert await client.call("first") == {"answer": "first"}
            assert await client.call("second") == {"answer": "second"}
        assert [e["params"]["n"] for e in events] == [1, 2]


ODD_ID_SERVER = r"""
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    # replies whose id equals the call's only as a dict key (true == 1 == 1.0), then the real one
    for odd in (True, float(m["id"]), str(m["id"]), [m["id"]]):
        sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": odd, "result": {"answer": "odd"}}) + "\n")
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": m["id"], "result": {"answer": m["method"]}}) + "\n")
    sys.stdout.flush()
"""


@pytest.mark.anyio
async def test_stdio_a_reply_answers_only_the_call_of_its_exact_id() -> None:
    """A reply with id true or 1.0 answered call 1 (equal dict keys), and its real answer was dropped."""
    async with StdioClient([sys.executable, "-c", ODD_ID_SERVER], timeout=30) as client:
        with anyio.fail_after(10):
            assert await client.call("first") == {"answer": "first"}
            assert await client.call("second") == {"answer": "second"}


@pytest.mark.anyio
async def test_stdio_a_close_cut_short_still_ends_the_child() -> None:
    """close() waits up to 15 s for a child to leave after its input ends; cancelled meanwhile (a
    shutdown's deadline), it left a child that ignores its input running."""
    import asyncio

    deaf = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
    client = await StdioClient([sys.executable, "-c", deaf], timeout=30).start()
    proc = client._proc
    assert proc is not None
    try:
        closing = asyncio.ensure_future(client.close())
        await asyncio.sleep(0.3)
        closing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await closing
        with anyio.fail_after(10):
            assert await proc.wait() == -9
    finally:
        if proc.returncode is None:
            proc.kill()
