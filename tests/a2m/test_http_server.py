"""The HTTP binding as served (uvicorn, httptools, uvloop) on a loopback port, probed with raw sockets:
what a slow, stalled or flooding client gets, and how long a stop waits."""

from __future__ import annotations

import asyncio
import datetime
import http.client
import logging
import queue
import shutil
import socket
import ssl
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
from cryptography import x509

from a2m.dispatch import Dispatcher
from a2m.http import KEEP_ALIVE, HTTPApp, HTTPSettings, _Deadlines, server
from backends.surface import TierServer
from tests.support.memstore import CAPABILITIES, MemoryStore
from tests.support.pki import key_and_cert

pytestmark = pytest.mark.timeout(60)

BODY = b'{"jsonrpc":"2.0","id":1,"method":"memory/describe"}'


def make_app(**settings: Any) -> HTTPApp:
    tier = TierServer(MemoryStore(), name="memory", kind="episodic", capabilities=CAPABILITIES)
    return HTTPApp(Dispatcher(tier), HTTPSettings(**settings), lifespan=tier)


@contextmanager
def serving(app: HTTPApp, **options: Any) -> Iterator[tuple[int, Any, threading.Thread]]:
    """`app` served by a2m.http.server (given `options`) on a free loopback port, in a thread; stopped on the
    way out."""
    ports: queue.Queue[int] = queue.Queue()
    served = server(app, on_listening=lambda url: ports.put(int(url.rstrip("/").rsplit(":", 1)[1])), **options)
    thread = threading.Thread(target=served.run, daemon=True)
    thread.start()
    try:
        yield ports.get(timeout=20), served, thread
    finally:
        served.should_exit = True
        thread.join(timeout=30)


def connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    return sock


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (a socket timeout fails the test)."""
    out = b""
    while chunk := sock.recv(65536):
        out += chunk
    return out


def head(length: int) -> bytes:
    return (b"POST / HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\ncontent-length: "
            + str(length).encode() + b"\r\n\r\n")


def refused(app: HTTPApp, status: int) -> float:
    value = app.metrics.registry.get_sample_value("a2m_http_refused_total", {"status": str(status)})
    return value or 0.0


def test_a_body_that_stops_coming_is_answered_408_and_the_connection_closed() -> None:
    # uvicorn has no read timeout: before, this socket waited for ever (the recv timed out here), and the
    # server held the connection and a task for as long as the client kept it open.
    app = make_app(body_timeout=0.5)
    with serving(app) as (port, _, _), connect(port) as sock:
        sock.sendall(head(len(BODY)) + BODY[:10])
        started = time.monotonic()
        answer = read_until_closed(sock)
        assert answer.startswith(b"HTTP/1.1 408 "), answer
        assert b"connection: close" in answer.lower()
        assert 0.4 < time.monotonic() - started < 5
        assert refused(app, 408) == 1


HALF_A_HEAD = b"POST / HTTP/1.1\r\nhost: t\r\n"


@pytest.mark.parametrize("sent", [b"", HALF_A_HEAD, head(len(BODY)) + BODY + HALF_A_HEAD],
                         ids=["nothing", "half a head", "half a second head on a kept-alive connection"])
def test_a_connection_whose_head_does_not_arrive_is_closed(sent: bytes) -> None:
    """uvicorn has no header timeout: a connection that sent nothing, or half a head, was held until the
    server stopped, and max_connections of them turned every other caller away with 503. A kept-alive
    connection's next head is timed from its first byte (uvicorn's keep-alive timer stops there)."""
    app = make_app(body_timeout=0.5)
    with serving(app) as (port, _, _):
        started = time.monotonic()  # before connecting: the server times the head from the connection's opening
        with connect(port) as sock:
            sock.sendall(sent)
            answered = read_until_closed(sock)
        assert 0.4 < time.monotonic() - started < 5
        assert answered.startswith(b"HTTP/1.1 200") if BODY in sent else answered == b""
        assert answered.count(b"HTTP/1.1") == (1 if BODY in sent else 0)
        assert refused(app, 408) == 1


def test_the_heads_deadline_is_for_the_whole_head_not_each_piece() -> None:
    """A byte every 50 ms keeps the connection busy; the head as a whole still has its deadline."""
    app = make_app(body_timeout=0.5)
    with serving(app) as (port, _, _), connect(port) as sock:
        started = time.monotonic()
        for byte in head(len(BODY)):
            try:
                sock.sendall(bytes([byte]))
            except OSError:  # closed under us
                break
            time.sleep(0.05)
            if time.monotonic() - started > 3:
                break
        try:
            rest = read_until_closed(sock)
        except ConnectionResetError:  # closed while bytes were still coming: reset, not ended
            rest = b""
        assert rest == b"" and time.monotonic() - started < 3
        assert refused(app, 408) == 1


def test_the_deadline_is_for_the_whole_body_not_each_piece() -> None:
    """A byte every 100 ms keeps every single read short; the body as a whole still has its deadline."""
    app = make_app(body_timeout=0.5)
    with serving(app) as (port, _, _), connect(port) as sock:
        sock.sendall(head(len(BODY)))
        started = time.monotonic()
        answer = b""
        for byte in BODY:
            try:
                sock.sendall(bytes([byte]))
            except OSError:  # closed under us: the 408 has been sent
                break
            time.sleep(0.1)
            if time.monotonic() - started > 1.5:
                break
        answer = read_until_closed(sock)
        assert answer.startswith(b"HTTP/1.1 408 "), answer
        assert time.monotonic() - started < 3


def test_a_body_in_time_is_served_and_the_connection_kept() -> None:
    app = make_app(body_timeout=0.5)
    with serving(app) as (port, _, _), connect(port) as sock:
        for _ in range(2):  # the same connection twice: the deadline of the first does not fire on it later
            sock.sendall(head(len(BODY)) + BODY[:10])
            time.sleep(0.1)
            sock.sendall(BODY[10:])
            answer = sock.recv(65536)
            assert answer.startswith(b"HTTP/1.1 200 "), answer
            time.sleep(0.6)
        assert refused(app, 408) == 0


def test_body_deadlines_time_a_block_out_and_leave_other_cancels_alone() -> None:
    """The body deadline's shared timer (one per app, not one per request): a block past its deadline
    raises TimeoutError and its task is not left cancelling; a cancel from elsewhere (a stopping server)
    stays a cancel; the timer stops once no block runs."""
    async def main() -> None:
        deadlines = _Deadlines(0.2)
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            with deadlines:
                await asyncio.sleep(10)
        assert 0.2 <= time.monotonic() - started < 1
        task = asyncio.current_task()
        assert task is not None and task.cancelling() == 0
        with deadlines:  # in time: nothing happens, later either
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)

        async def reading() -> None:
            with deadlines:
                await asyncio.sleep(10)

        other = asyncio.create_task(reading())
        await asyncio.sleep(0.05)
        other.cancel()
        with pytest.raises(asyncio.CancelledError):
            await other
        await asyncio.sleep(0.1)
        assert deadlines._timer is None

    asyncio.run(main())


def test_connections_past_the_limit_are_answered_503_and_served_again_once_they_go() -> None:
    limit = 4
    app = make_app(max_connections=limit)
    with serving(app) as (port, _, _):
        url = f"http://127.0.0.1:{port}/"
        idle = [connect(port) for _ in range(limit)]
        try:
            deadline = time.monotonic() + 5
            status = 200
            while status != 503 and time.monotonic() < deadline:  # until the server has accepted all four
                status = httpx.post(url, content=BODY, trust_env=False).status_code
                time.sleep(0.02)
            assert status == 503
        finally:
            for sock in idle:
                sock.close()
        deadline = time.monotonic() + 5
        while status != 200 and time.monotonic() < deadline:
            status = httpx.post(url, content=BODY, trust_env=False).status_code
            time.sleep(0.02)
        assert status == 200


def test_a_stop_waits_for_a_stuck_request_only_as_long_as_shutdown_timeout() -> None:
    # uvicorn's default waits for ever; the request below is stuck for as long as its body deadline (60 s).
    app = make_app(body_timeout=60, shutdown_timeout=0.5)
    with serving(app) as (port, served, thread), connect(port) as stuck, connect(port) as mid_headers:
        stuck.sendall(head(len(BODY)) + BODY[:10])
        mid_headers.sendall(b"POST / HTTP/1.1\r\nhost: t\r\ncontent-le")
        time.sleep(0.3)  # both are read
        started = time.monotonic()
        served.should_exit = True
        thread.join(timeout=10)
        assert not thread.is_alive()
        assert time.monotonic() - started < 3
        assert read_until_closed(mid_headers) == b""  # a connection between requests is closed at once


def test_the_routers_pool_lets_connections_go_before_a_tier_closes_them() -> None:
    """a2m.http1 reuses a connection idle under `idle_timeout`; the server closes one idle KEEP_ALIVE s.
    Were the pool's the longer, the router would send a call into a socket the tier is closing."""
    from a2m.http1 import ConnectionPool

    assert ConnectionPool("http://127.0.0.1:1/").idle_timeout < KEEP_ALIVE
    assert server(make_app()).config.timeout_keep_alive == KEEP_ALIVE


def test_production_defaults_leave_room_for_the_benchmarks_and_a_routers_pools() -> None:
    settings = HTTPSettings()
    assert settings.max_connections >= 256 and 10 <= settings.body_timeout <= 120
    assert 0 < settings.shutdown_timeout < 30  # under the usual 30 s before a supervisor's SIGKILL
    config = server(make_app()).config
    assert config.limit_concurrency == settings.max_connections
    assert config.timeout_graceful_shutdown == settings.shutdown_timeout


def test_requests_answered_503_are_logged_at_most_once_a_minute(caplog: pytest.LogCaptureFixture) -> None:
    """uvicorn warns once per request past the limit: the flood the limit is for wrote a line per request."""
    import logging

    logger = logging.getLogger("uvicorn.error")
    app = make_app(max_connections=2)
    with serving(app) as (port, _, _), connect(port) as idle:
        # Here: uvicorn's logging set-up (as its server is made) drops the handlers of its loggers, and
        # "uvicorn" does not propagate to the root. An earlier test's 503 may have started the minute.
        logger.addHandler(caplog.handler)
        for held in (f for f in logger.filters if type(f).__name__ == "_OverLimitLog"):
            held.last = -held.every  # type: ignore[attr-defined]
        url = f"http://127.0.0.1:{port}/"
        statuses = []
        deadline = time.monotonic() + 5
        while statuses.count(503) < 20 and time.monotonic() < deadline:
            statuses.append(httpx.get(url + "healthz", trust_env=False).status_code)
        assert statuses.count(503) >= 20, statuses
        del idle
    logger.removeHandler(caplog.handler)
    lines = [r.getMessage() for r in caplog.records if "concurrency limit" in r.getMessage()]
    assert len(lines) == 1 and "answered 503" in lines[0], lines


@pytest.mark.parametrize("field", ["body_timeout", "max_connections", "shutdown_timeout", "max_body_in_flight"])
def test_settings_a_server_cannot_run_with_are_refused(field: str) -> None:
    """A zero body deadline made the shared deadline timer tick every 0 s (a spin); the CLI refused it,
    a library caller did not."""
    from a2m.http import HTTPSettings

    with pytest.raises(ValueError, match=field):
        HTTPSettings(**{field: -1})
    if field != "shutdown_timeout":  # 0 s: a stop cancels requests in progress at once
        with pytest.raises(ValueError, match=field):
            HTTPSettings(**{field: 0})


def remember(size: int) -> bytes:
    """A remember of one record whose body is `size` bytes long."""
    start = b'{"jsonrpc":"2.0","id":7,"method":"memory/remember","params":{"records":[{"content":"'
    end = b'"}]}}'
    return start + b"x" * (size - len(start) - len(end)) + end


def held_soon(app: HTTPApp, value: int) -> int:
    """`app.bodies.held` once it is `value`, or after 5 s. A request gives its bytes back after its
    answer is sent: a client may read the answer before the server's thread has run on to the give."""
    deadline = time.monotonic() + 5
    while app.bodies.held != value and time.monotonic() < deadline:
        time.sleep(0.01)
    return app.bodies.held


def test_bodies_past_the_budget_wait_for_it_and_small_ones_do_not() -> None:
    """max_connections bodies of max_body each were held at once (16 GiB at the router's defaults): a
    body that does not fit beside those in progress now waits, unread, until one is answered; a small
    one (a recall) goes past the queue."""
    app = make_app(max_body=300_000, max_body_in_flight=300_000, body_timeout=10)
    big = remember(200_000)
    with serving(app) as (port, _, _), connect(port) as first, connect(port) as second, connect(port) as small:
        first.sendall(head(len(big)) + big[:1000])  # takes 200,000 bytes, sends a sliver of them
        deadline = time.monotonic() + 5
        while app.bodies.held < 200_000 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert app.bodies.held == 200_000
        assert app.metrics.registry.get_sample_value("a2m_http_body_bytes_held") == 200_000
        second.sendall(head(len(big)) + big)
        small.sendall(head(len(BODY)) + BODY)
        assert small.recv(65536).startswith(b"HTTP/1.1 200 ")
        second.settimeout(0.5)
        with pytest.raises(TimeoutError):  # waiting for the first's bytes: not read, not answered
            second.recv(65536)
        first.sendall(big[1000:])
        assert first.recv(65536).startswith(b"HTTP/1.1 200 ")
        second.settimeout(10)
        assert second.recv(65536).startswith(b"HTTP/1.1 200 ")
        assert held_soon(app, 0) == 0
        sample = app.metrics.registry.get_sample_value("a2m_http_body_bytes_held")
        assert sample == 0.0


def test_a_body_that_waits_past_the_deadline_for_the_budget_is_answered_503() -> None:
    """Its body, unread, is dropped as it arrives after the answer, and the connection serves the next
    request."""
    app = make_app(max_body=300_000, max_body_in_flight=300_000, body_timeout=0.5)
    big = remember(200_000)
    with serving(app) as (port, _, _), connect(port) as sock:
        # Held for the whole test, as by requests in progress (taken before any request: the server's
        # loop is not touching the budget then, and nothing waits when it is given back).
        assert app.bodies.take_now(300_000) == 300_000
        started = time.monotonic()
        sock.sendall(head(len(big)) + big)
        answer = sock.recv(65536)
        assert answer.startswith(b"HTTP/1.1 503 ") and b"retry-after: 1" in answer.lower(), answer
        assert 0.4 < time.monotonic() - started < 5 and refused(app, 503) == 1
        app.bodies.give(300_000)
        sock.sendall(head(len(BODY)) + BODY)
        assert sock.recv(65536).startswith(b"HTTP/1.1 200 ")
        assert held_soon(app, 0) == 0


def test_a_chunked_body_takes_the_largest_body_from_the_budget() -> None:
    """A chunked body declares no length: it takes `max_body`, so it waits where a declared one of
    that size would (taking nothing, any number of chunked bodies were held at once, past the budget)."""
    app = make_app(max_body=300_000, max_body_in_flight=300_000, body_timeout=0.5)
    chunked = (b"POST / HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\ntransfer-encoding: chunked"
               b"\r\n\r\n" + b"%x\r\n" % len(BODY) + BODY + b"\r\n0\r\n\r\n")
    with serving(app) as (port, _, _):
        with connect(port) as sock:
            # Held as by a request in progress (taken before any request: the server's loop is not
            # touching the budget then, and nothing waits when it is given back).
            assert app.bodies.take_now(200_000) == 200_000
            sock.sendall(chunked)
            answer = sock.recv(65536)
            assert answer.startswith(b"HTTP/1.1 503 "), answer
            app.bodies.give(200_000)
        with connect(port) as sock:
            sock.sendall(chunked)
            assert sock.recv(65536).startswith(b"HTTP/1.1 200 ")
        assert held_soon(app, 0) == 0


def test_a_certificate_without_its_key_is_refused() -> None:
    with pytest.raises(ValueError, match="tls_cert and tls_key go together"):
        HTTPSettings(tls_cert="/etc/a2m/cert.pem")


# --- A renewed certificate is served without a restart (decision 136) ---

RENEWAL_WAIT = 10  # seconds a new pair may take to be served here, with a look every CHECK_EVERY seconds
CHECK_EVERY = 0.05


def pairs(tmp_path: Path, a_ends: datetime.datetime | None = None, b_ends: datetime.datetime | None = None
          ) -> tuple[Path, Path, tuple[Path, Path], tuple[Path, Path]]:
    """The served paths (holding pair A) and two pairs for the same name: A and its renewal B (each valid
    until its `_ends`, by default for 90 days)."""
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    a = key_and_cert(tmp_path / "a", "127.0.0.1", not_after=a_ends)
    b = key_and_cert(tmp_path / "b", "127.0.0.1", not_after=b_ends)
    key, cert = tmp_path / "tls.key", tmp_path / "tls.pem"
    renew(a, key, cert)
    return key, cert, a, b


def renew(pair: tuple[Path, Path], key: Path, cert: Path) -> None:
    """`pair` (key, certificate) written over the served files in place, the certificate first."""
    shutil.copyfile(pair[1], cert)
    shutil.copyfile(pair[0], key)


def serial(cert: Path) -> int:
    return x509.load_pem_x509_certificate(cert.read_bytes()).serial_number


def https(port: int) -> http.client.HTTPSConnection:
    """A keep-alive HTTPS connection that takes whatever certificate the server shows (read, not trusted)."""
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    return http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10)


def served_serial(connection: http.client.HTTPSConnection) -> int:
    """GET /healthz over `connection` (200 asserted); the serial of the certificate it was made with."""
    connection.request("GET", "/healthz")
    answer = connection.getresponse()
    answer.read()
    assert answer.status == 200
    assert isinstance(connection.sock, ssl.SSLSocket)
    return x509.load_der_x509_certificate(connection.sock.getpeercert(binary_form=True) or b"").serial_number


def new_connection_serial(port: int) -> int:
    connection = https(port)
    try:
        return served_serial(connection)
    finally:
        connection.close()


def wait_for_serial(port: int, wanted: int) -> None:
    deadline = time.monotonic() + RENEWAL_WAIT
    while (seen := new_connection_serial(port)) != wanted and time.monotonic() < deadline:
        time.sleep(CHECK_EVERY)
    assert seen == wanted, "a new connection still gets the certificate served before the renewal"


def tls_lines(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "a2m.http" and r.levelno == level
            and r.getMessage().startswith("TLS:")]


def test_a_renewed_certificate_is_served_to_new_connections_and_open_ones_keep_working(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Renewal (cert-manager, certbot) rewrites the files in place; the server read them only at start,
    so it served the old certificate until restarted, past its expiry."""
    caplog.set_level(logging.INFO, logger="a2m.http")
    key, cert, a, b = pairs(tmp_path)
    app = make_app(tls_cert=str(cert), tls_key=str(key))
    with serving(app, cert_check_every=CHECK_EVERY) as (port, _, _):
        before = https(port)
        try:
            assert served_serial(before) == serial(a[1])
            opened = before.sock
            renew(b, key, cert)
            wait_for_serial(port, serial(b[1]))
            # the connection opened before is the same one, still served, with the pair it was made with
            assert served_serial(before) == serial(a[1]) and before.sock is opened
        finally:
            before.close()
    assert any("as they now are on disk" in line for line in tls_lines(caplog, logging.INFO)), caplog.text


def test_a_renewal_of_a_kubernetes_secret_volume_is_served(tmp_path: Path) -> None:
    """The kubelet writes a Secret's new files into a directory of their own and swaps the `..data` link
    to it; tls.pem and tls.key are links through `..data`, themselves never rewritten."""
    _, _, a, b = pairs(tmp_path)
    volume = tmp_path / "volume"
    for version, (pair_key, pair_cert) in (("..v1", a), ("..v2", b)):
        (volume / version).mkdir(parents=True)
        shutil.copyfile(pair_key, volume / version / "tls.key")
        shutil.copyfile(pair_cert, volume / version / "tls.pem")
    (volume / "..data").symlink_to("..v1")
    for name in ("tls.key", "tls.pem"):
        (volume / name).symlink_to(f"..data/{name}")
    app = make_app(tls_cert=str(volume / "tls.pem"), tls_key=str(volume / "tls.key"))
    with serving(app, cert_check_every=CHECK_EVERY) as (port, _, _):
        assert new_connection_serial(port) == serial(a[1])
        (volume / "..data_tmp").symlink_to("..v2")
        (volume / "..data_tmp").replace(volume / "..data")  # atomic, as the kubelet's rename
        wait_for_serial(port, serial(b[1]))


def test_a_half_done_renewal_keeps_the_old_certificate_and_says_so_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The certificate rewritten, its key not yet: the old pair is served (loading the new certificate
    over the old key would leave no usable key), one warning, then the new pair once its key is there."""
    caplog.set_level(logging.INFO, logger="a2m.http")
    key, cert, a, b = pairs(tmp_path)
    app = make_app(tls_cert=str(cert), tls_key=str(key))
    with serving(app, cert_check_every=CHECK_EVERY) as (port, _, _):
        shutil.copyfile(b[1], cert)
        deadline = time.monotonic() + RENEWAL_WAIT
        while not tls_lines(caplog, logging.WARNING) and time.monotonic() < deadline:
            time.sleep(CHECK_EVERY)
        time.sleep(20 * CHECK_EVERY)  # twenty more looks at the same half-done pair
        assert new_connection_serial(port) == serial(a[1])
        warnings = tls_lines(caplog, logging.WARNING)
        assert len(warnings) == 1 and "KEY_VALUES_MISMATCH" in warnings[0] and "stays in use" in warnings[0], \
            warnings
        shutil.copyfile(b[0], key)
        wait_for_serial(port, serial(b[1]))
    assert len(tls_lines(caplog, logging.WARNING)) == 1


def test_certificate_files_gone_keep_the_pair_served_and_say_so_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    key, cert, a, _ = pairs(tmp_path)
    app = make_app(tls_cert=str(cert), tls_key=str(key))
    with serving(app, cert_check_every=CHECK_EVERY) as (port, _, _):
        key.unlink()
        deadline = time.monotonic() + RENEWAL_WAIT
        while not tls_lines(caplog, logging.WARNING) and time.monotonic() < deadline:
            time.sleep(CHECK_EVERY)
        time.sleep(20 * CHECK_EVERY)
        assert new_connection_serial(port) == serial(a[1])
        warnings = tls_lines(caplog, logging.WARNING)
        assert len(warnings) == 1 and f"cannot read {key}" in warnings[0], warnings


def test_a_plain_http_server_looks_at_no_certificate() -> None:
    app = make_app()
    with serving(app, cert_check_every=CHECK_EVERY) as (_, served, _):
        assert served.watching is None
    assert expiry_gauge(app) is None  # no certificate: no series (a 0 would read as expired in 1970)


# --- The served certificate's end: a gauge, a warning near and past it, an expired renewal not served ---

def from_now(**delta: float) -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(**delta)


def ends(cert: Path) -> datetime.datetime:
    return x509.load_pem_x509_certificate(cert.read_bytes()).not_valid_after_utc


def expiry_gauge(app: HTTPApp) -> float | None:
    return app.metrics.registry.get_sample_value("a2m_tls_certificate_expiry_timestamp_seconds")


def scraped_expiry(port: int) -> float:
    """The gauge as a scrape over HTTPS reads it."""
    from prometheus_client.parser import text_string_to_metric_families

    connection = https(port)
    try:
        connection.request("GET", "/metrics")
        text = connection.getresponse().read().decode()
    finally:
        connection.close()
    samples = [sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == "a2m_tls_certificate_expiry_timestamp_seconds"]
    assert len(samples) == 1, text
    return samples[0]


def test_the_served_certificates_expiry_is_a_gauge_that_follows_a_renewal(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Nothing told when the served certificate ends: a renewal that failed (a stopped certbot timer) was
    seen by the clients, once it had expired."""
    caplog.set_level(logging.INFO, logger="a2m.http")
    key, cert, a, b = pairs(tmp_path, a_ends=from_now(days=30), b_ends=from_now(days=90))
    app = make_app(tls_cert=str(cert), tls_key=str(key))
    with serving(app, cert_check_every=CHECK_EVERY) as (port, _, _):
        assert scraped_expiry(port) == ends(a[1]).timestamp()
        renew(b, key, cert)
        wait_for_serial(port, serial(b[1]))
        assert scraped_expiry(port) == ends(b[1]).timestamp()
    assert tls_lines(caplog, logging.WARNING) == []  # 30 and 90 days left: nothing to say


def test_a_certificate_near_its_end_is_one_warning_at_start(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="a2m.http")
    key, cert, a, _ = pairs(tmp_path, a_ends=from_now(days=3, hours=1))
    app = make_app(tls_cert=str(cert), tls_key=str(key))
    with serving(app, cert_check_every=CHECK_EVERY) as (port, _, _):
        time.sleep(20 * CHECK_EVERY)  # twenty looks at the same certificate
        assert new_connection_serial(port) == serial(a[1])  # served all the same
    warnings = tls_lines(caplog, logging.WARNING)
    assert len(warnings) == 1, warnings
    assert f"the certificate in {cert} expires on {ends(a[1]):%Y-%m-%d %H:%M} UTC, in 3 days" in warnings[0], warnings


def test_a_certificate_that_expires_while_served_is_said_again_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A server runs for months: the warning at start (or at its last renewal) is not the one that
    matters, the one when its certificate passes its end is."""
    caplog.set_level(logging.INFO, logger="a2m.http")
    key, cert, a, _ = pairs(tmp_path, a_ends=from_now(seconds=5))
    app = make_app(tls_cert=str(cert), tls_key=str(key))
    with serving(app, cert_check_every=CHECK_EVERY):
        deadline = time.monotonic() + RENEWAL_WAIT
        while len(tls_lines(caplog, logging.WARNING)) < 2 and time.monotonic() < deadline:
            time.sleep(CHECK_EVERY)
        time.sleep(20 * CHECK_EVERY)
    warnings = tls_lines(caplog, logging.WARNING)
    assert len(warnings) == 2 and "expires on" in warnings[0] and "in 0 days" in warnings[0], warnings
    assert f"the certificate in {cert} expired on" in warnings[1] and "refuse every connection" in warnings[1]


def test_a_renewal_to_an_expired_certificate_is_not_served_and_said_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A backup's old pair restored over the served one: served, it failed every client that verifies."""
    caplog.set_level(logging.INFO, logger="a2m.http")
    key, cert, a, b = pairs(tmp_path, b_ends=from_now(days=-1))
    app = make_app(tls_cert=str(cert), tls_key=str(key))
    with serving(app, cert_check_every=CHECK_EVERY) as (port, _, _):
        renew(b, key, cert)
        deadline = time.monotonic() + RENEWAL_WAIT
        while not tls_lines(caplog, logging.WARNING) and time.monotonic() < deadline:
            time.sleep(CHECK_EVERY)
        time.sleep(20 * CHECK_EVERY)
        assert new_connection_serial(port) == serial(a[1])
        assert scraped_expiry(port) == ends(a[1]).timestamp()
    warnings = tls_lines(caplog, logging.WARNING)
    assert len(warnings) == 1 and "cannot be served" in warnings[0] and "stays in use" in warnings[0], warnings
    assert f"the certificate in {cert} expired on {ends(b[1]):%Y-%m-%d %H:%M} UTC" in warnings[0], warnings
