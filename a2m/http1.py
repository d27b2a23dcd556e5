"""A pooled HTTP/1.1 keep-alive connection set to one URL: POST a body, get (status, body) back.

This is all the A2M HTTP binding needs from a client, and the router makes
one such call per tier for every request it serves, so their cost is the
router's overhead. A general client spends its CPU on request and response
models, cookie jars, redirects and middleware: ~260 us a loopback call for
aiohttp, ~1.2 ms for httpx's default transport, against ~120 us for this pool
with the JSON-RPC around it (bench/protocol.py `client_cpu_us`,
docs/decisions.md 5).

What it does: one request in flight per connection (no pipelining), warmest
idle connection first, at most `max_connections` open, TLS for `https://`,
chunked, sized or close-delimited bodies (a response with neither length nor
chunking ends when the server closes: an HTTP/1.0-style server or proxy). A
connection is not reused `idle_timeout` after its last request was written:
the default (4 s) sits under uvicorn's 5 s keep-alive, so the pool never
writes into a socket the server is closing. Counted from the write, not from
when the answer was read: the server's timer starts when it has answered,
which an event loop that stalled (a frozen or starved process) may read
seconds later, and counted from then the 1 s margin was gone. A request is
never retried: a POST may have been applied before the connection broke. So
an idle connection is looked at before it is reused (`_Connection.dropped`):
a server that closed it (restarted, stopped) while the loop was not reading
left its FIN or reset waiting in the socket, and the request written there
failed though the pool could have known.

A response body is buffered whole, so it is capped (`max_response`, MAX_RESPONSE by default):
past it, declared in `content-length` or counted as it arrives (chunked or until close), the
call fails with ConnectionFailed saying so and the connection is closed. A server sending
gigabytes no longer takes the caller's memory with it. A response's head (status line and
headers, which the parser buffers whole) is capped apart, at MAX_HEAD bytes, and so are the
framing and trailers around a body (`max_response` + MAX_HEAD bytes after the head in all).

A response that begins while no request waits on its connection (an answer sent twice, a
408 written to an idle connection) closes that connection: the next request on it would
have read that answer as its own.

TLS (`ClientTLS`): the system's trust store (SSL_CERT_FILE for a private CA) and, where
A2M_TLS_CLIENT_CERT and A2M_TLS_CLIENT_KEY are set, that client certificate on every connection
(mutual TLS), loaded again for a new connection once its files change. A server that requires a
client certificate and refuses this connection's (or its lack) ends it without a word where it runs
on asyncio or uvloop, uvicorn included (their TLS drops the alert OpenSSL wrote): the failure says
what that most likely means (`ClientCertificateRefused`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import select
import socket
import ssl
from typing import Callable
from urllib.parse import urlsplit

import httptools

from .certificates import file_stamp, load_pair

log = logging.getLogger("a2m.client")


MAX_RESPONSE = 256 * 1024 * 1024  # bytes of one response body; a tier's reply past it is its failure
MAX_HEAD = 1024 * 1024  # bytes of one response's status line and headers; a tier's are a few hundred


class ConnectionFailed(Exception):
    """The server could not be reached, broke the connection, or sent something that is not HTTP."""


class ClientCertificateRefused(ConnectionFailed):
    """A TLS server ended a new connection before any answer, or alerted about the client's certificate:
    most likely one that requires a client certificate (mutual TLS) refusing this one, or its absence.
    A type of its own: the router logs a tier's outage again when the type beneath it changes."""


# OpenSSL's reasons for an alert a server sends about the client's certificate (a proxy's TLS sends them;
# asyncio's and uvloop's do not): none given, not signed by a CA it trusts, expired, revoked, refused.
CLIENT_CERT_ALERTS = frozenset({
    "TLSV13_ALERT_CERTIFICATE_REQUIRED", "SSLV3_ALERT_HANDSHAKE_FAILURE", "SSLV3_ALERT_BAD_CERTIFICATE",
    "SSLV3_ALERT_CERTIFICATE_UNKNOWN", "TLSV1_ALERT_UNKNOWN_CA", "SSLV3_ALERT_CERTIFICATE_EXPIRED",
    "SSLV3_ALERT_CERTIFICATE_REVOKED", "SSLV3_ALERT_UNSUPPORTED_CERTIFICATE", "TLSV1_ALERT_ACCESS_DENIED",
    "TLSV1_ALERT_DECRYPT_ERROR",
})
CLIENT_CERT = "A2M_TLS_CLIENT_CERT"
CLIENT_KEY = "A2M_TLS_CLIENT_KEY"


def _stamp(paths: tuple[str, ...]) -> tuple[tuple[int, int, int], ...] | None:
    """`file_stamp`, None where a file cannot be read (a renewal between its unlink and its write)."""
    try:
        return file_stamp(*paths)
    except OSError:
        return None


class ClientTLS:
    """The TLS context a pool's connections are made with: the system's trust store (SSL_CERT_FILE adds
    a private CA) and, given `pair` (certificate chain, key), that client certificate on every connection.

    A renewed pair (cert-manager, a rewritten Secret) is picked up without a restart: `context()`, called
    for each new connection and never per request, looks at the files' (mtime, size, inode) and loads a
    changed pair into a new context. A pair that does not load (the certificate written, its key not yet)
    is one warning, and the context loaded before stays in use until the files change again. Connections
    already open keep the certificate they presented: the server checked it at their handshake only.
    """

    def __init__(self, pair: tuple[str, str] | None) -> None:
        self.pair = pair
        self.seen = _stamp(pair) if pair else None  # before the load: a change in between is seen, not missed
        self._context = self._load()  # ValueError: the pair does not load, said at construction
        self.problem: str | None = None  # why the pair on disk is not presented (logged once)

    def _load(self) -> ssl.SSLContext:
        context = ssl.create_default_context()
        if self.pair is None:
            return context
        try:
            load_pair(context, *self.pair)
        except ValueError as exc:
            raise ValueError(f"{CLIENT_CERT} / {CLIENT_KEY}: {exc}") from None
        return context

    def context(self) -> ssl.SSLContext:
        """The context for a new connection: the pair as it is on disk where it changed and loads."""
        if self.pair is None:
            return self._context
        stamp = _stamp(self.pair)
        if stamp == self.seen:
            return self._context
        self.seen = stamp
        try:
            self._context = self._load()
        except ValueError as exc:
            if str(exc) != self.problem:
                log.warning("TLS: the client certificate changed but cannot be presented: %s; the one loaded "
                            "before stays in use, and the files are tried again when they change", exc)
            self.problem = str(exc)
            return self._context
        self.problem = None
        log.info("TLS: presenting %s as it now is on disk to new connections", self.pair[0])
        return self._context

    def refused(self, detail: str) -> str:
        """What a new connection ended by its server before any answer (`detail`) most likely means."""
        if self.pair is None:
            return (f"{detail}, right after the TLS handshake: the server likely requires a client certificate "
                    f"(mutual TLS) and none was presented; set {CLIENT_CERT} and {CLIENT_KEY}")
        return (f"{detail}, right after the TLS handshake: the server likely refused the client certificate "
                f"presented ({self.pair[0]}, {CLIENT_CERT}): not signed by the CA it trusts, expired, or not "
                "for client authentication")


def client_pair() -> tuple[str, str] | None:
    """$A2M_TLS_CLIENT_CERT and $A2M_TLS_CLIENT_KEY (certificate chain, key), or None where neither is
    set. ValueError where one is set without the other."""
    cert, key = os.environ.get(CLIENT_CERT) or None, os.environ.get(CLIENT_KEY) or None
    if (cert is None) != (key is None):
        raise ValueError(f"{CLIENT_CERT} and {CLIENT_KEY} go together: set both, the client certificate chain "
                         f"and its unencrypted private key (PEM files), or neither (set: "
                         f"{CLIENT_CERT if cert else CLIENT_KEY})")
    return (cert, key) if cert and key else None


def client_tls() -> ClientTLS:
    """This process's https client settings as the environment gives them (`client_pair`); ValueError
    where they cannot be used, with a line that says why."""
    return ClientTLS(client_pair())


class _Connection(asyncio.Protocol):
    """One keep-alive connection; `httptools` calls back `on_body` / `on_message_complete`."""

    def __init__(self, max_response: int = MAX_RESPONSE) -> None:
        self.max_response = max_response
        self.size = 0  # body bytes of the response in progress
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.waiter: asyncio.Future[tuple[int, bytes, bool]] | None = None
        self.body: list[bytes] = []
        self.closed = False
        self.sent_at = 0.0  # loop time its last request was written: its server's keep-alive timer starts later
        self.polled: Callable[[int], list[tuple[int, int]]] | None = None  # poll(0) of its socket: `dropped`
        self.framed = False  # the response in progress declared a length or chunking
        self.until_close = False  # its headers are in, and its body runs to the end of the connection
        self.interim = False  # the message in progress is a 1xx: the final response follows it
        self.heading = False  # a response has begun and its headers are not all in
        self.head_size = 0  # bytes received while `heading`
        self.tail_size = 0  # bytes received after the head: the body with its framing, and any trailers
        # Over TLS, until the first byte of an answer: what an end before it most likely means (ClientTLS.refused)
        self.refused: ClientTLS | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # a request is one write; never wait for an ACK
        if sock is not None:
            poller = select.poll()
            poller.register(sock.fileno(), select.POLLIN)
            self.polled = poller.poll

    def data_received(self, data: bytes) -> None:
        self.refused = None  # the server answered: it took this connection's certificate
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(ConnectionFailed(f"malformed HTTP response: {exc}"))
            self.close()
            return
        if self.heading:  # all of `data` was head: httptools buffers a header until its end, unbounded
            self.head_size += len(data)
            if self.head_size > MAX_HEAD:
                self._fail(ConnectionFailed(f"response headers larger than {MAX_HEAD} bytes"))
                self.close()
        elif self.waiter is not None:  # a chunked body's trailers are buffered whole as well
            self.tail_size += len(data)
            if self.tail_size > self.max_response + MAX_HEAD:
                self._too_large("with its framing and trailers")

    def on_message_begin(self) -> None:
        if self.waiter is None:  # nobody asked: an answer sent twice, or a 408 on an idle connection.
            self.close()  # kept, its rest would be read as the next request's answer
        self.heading, self.head_size, self.tail_size = True, 0, 0

    def on_header(self, name: bytes, value: bytes) -> None:
        lower = name.lower()
        if lower in (b"content-length", b"transfer-encoding"):
            self.framed = True
        if lower == b"content-length" and value.strip().isdigit() and int(value) > self.max_response:
            self._too_large(f"declared {int(value)} bytes")

    def on_headers_complete(self) -> None:
        self.heading = False
        self.interim = self.parser.get_status_code() < 200
        self.until_close = not self.framed and not self.interim

    def on_body(self, body: bytes) -> None:
        if self.closed:
            return  # refused as too large: the rest of what arrived is dropped
        self.size += len(body)
        if self.size > self.max_response:
            self._too_large(f"more than {self.max_response} bytes arrived")
            return
        self.body.append(body)

    def _too_large(self, how: str) -> None:
        self._fail(ConnectionFailed(f"response larger than {self.max_response} bytes ({how})"))
        self.body = []
        self.close()

    def on_message_complete(self) -> None:
        if self.interim:  # 100 Continue, 103 Early Hints (RFC 9110 §15.2): skipped; the answer is still to come
            self.interim = self.framed = False
            self.body, self.size = [], 0
            return
        self._complete(self.parser.should_keep_alive())

    def _complete(self, keep_alive: bool) -> None:
        waiter, body, self.body, self.size = self.waiter, b"".join(self.body), [], 0
        self.framed = self.until_close = False
        if waiter is not None and not waiter.done():
            waiter.set_result((self.parser.get_status_code(), body, keep_alive))
        self.waiter = None

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if exc is None and self.until_close and self.waiter is not None:
            self._complete(False)  # a close-delimited body ends here (RFC 9112 §6.3); a reset is no end
            return
        detail = f"connection lost: {exc!r}" if exc else "connection closed before the response"
        if self.refused is not None and (exc is None or isinstance(exc, ConnectionResetError) or refusal(exc)):
            # A new TLS connection ended before any answer: a server asking for a client certificate
            # closes (asyncio's, uvloop's TLS) or resets it (the request it never read) - or alerts (a proxy's)
            self._fail(ClientCertificateRefused(self.refused.refused(detail)))
            return
        self._fail(ConnectionFailed(detail))

    def _fail(self, exc: Exception) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(exc)
        self.waiter = None

    def send(self, request: bytes) -> asyncio.Future[tuple[int, bytes, bool]]:
        assert self.transport is not None and self.waiter is None
        if self.closed:
            raise ConnectionFailed("connection closed before the request")
        loop = asyncio.get_running_loop()
        self.waiter = loop.create_future()
        self.sent_at = loop.time()
        self.transport.write(request)
        return self.waiter

    def dropped(self) -> bool:
        """Whether this idle connection's socket holds something the event loop has not read yet: the
        server's FIN or reset, or bytes nobody asked for (over TLS, most likely its close_notify).

        Why: the loop learns of a close only when it next polls. A router whose loop stalled (a long
        step, a frozen process) while a tier restarted took the dead connection, wrote its call and got
        "connection closed before the response" at once, though the close was already in the socket:
        a failed call, and the tier marked down. One poll(2) that waits for nothing: ~0.6 us (a peek
        through a socket object wrapping the fd cost ~7 us)."""
        return self.polled is not None and bool(self.polled(0))

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


def refusal(exc: BaseException) -> bool:
    """Whether `exc` is OpenSSL reporting a server's alert about the client's certificate."""
    return isinstance(exc, ssl.SSLError) and exc.reason in CLIENT_CERT_ALERTS


def _header_lines(headers: dict[str, str]) -> bytes:
    """`name: value\\r\\n` lines; a CR or LF in either would let a value inject headers, so it is refused."""
    lines = []
    for name, value in headers.items():
        if any(c in name or c in value for c in "\r\n") or ":" in name:
            raise ValueError(f"invalid HTTP header {name!r}")
        lines.append(f"{name}: {value}\r\n")
    return "".join(lines).encode("latin-1")


class ConnectionPool:
    """Keep-alive connections to the origin of `url`, bound to the event loop that first uses them.

    An `https` URL's connections are made with `ssl_context` where given (as it is: no client certificate
    is added), else with `client_tls()`'s, which presents $A2M_TLS_CLIENT_CERT where set and follows its
    renewals; a pair that cannot be used is a ValueError here, as a URL that is not http(s) is."""

    def __init__(self, url: str, *, headers: dict[str, str] | None = None, max_connections: int = 64,
                 idle_timeout: float = 4.0, ssl_context: ssl.SSLContext | None = None,
                 max_response: int = MAX_RESPONSE) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self._ssl = ssl_context if parts.scheme == "https" else None
        self._tls = client_tls() if parts.scheme == "https" and ssl_context is None else None
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        authority = parts.netloc.rpartition("@")[2]
        self._head = f"POST {target} HTTP/1.1\r\nhost: {authority}\r\n".encode("latin-1") + _header_lines(headers or {})
        self.max_connections = max_connections
        self.max_response = max_response
        self.idle_timeout = idle_timeout
        self._idle: list[_Connection] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._slots = asyncio.Semaphore(max_connections)
        self._generation = 0  # counts close() calls: a connection in use across one is not kept

    async def post(self, body: bytes, *, timeout: float, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        """One POST under `timeout` seconds, the wait for a free connection and the connect included;
        any failure is ConnectionFailed."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._rebind(loop)
        request = b"%s%scontent-length: %d\r\n\r\n%s" % (self._head, _header_lines(headers) if headers else b"",
                                                          len(body), body)
        conn: _Connection | None = None
        reusable = False
        generation = self._generation
        try:
            async with asyncio.timeout(timeout):  # the wait for a free connection counts too
                async with self._slots:
                    try:
                        conn = self._take_idle(loop.time())
                        if conn is None:
                            conn = await self._connect(loop)
                        status, payload, reusable = await conn.send(request)
                        return status, payload
                    finally:  # cancelled, timed out or failed mid-response: its state is unknown, so close it
                        if conn is not None:
                            if reusable and not conn.closed and generation == self._generation:
                                self._idle.append(conn)
                            else:
                                conn.close()
        except TimeoutError:
            raise ConnectionFailed(f"no response in {timeout:g} s") from None
        except OSError as exc:
            if refusal(exc) and self._tls is not None:  # alerted in the handshake (TLS 1.2, a proxy's TLS)
                raise ClientCertificateRefused(self._tls.refused(f"{type(exc).__name__}: {exc}")) from None
            raise ConnectionFailed(f"{type(exc).__name__}: {exc}") from exc

    def _take_idle(self, now: float) -> _Connection | None:
        while self._idle:
            conn = self._idle.pop()  # the most recently used: the likeliest to be alive
            # is_closing: the server's FIN closed the transport, `connection_lost` is a loop turn away;
            # dropped: the FIN (or a reset) is in the socket, not yet read by the loop
            if (not conn.closed and not conn.transport.is_closing() and now - conn.sent_at < self.idle_timeout
                    and not conn.dropped()):
                return conn
            conn.close()
        return None

    async def _connect(self, loop: asyncio.AbstractEventLoop) -> _Connection:
        context = self._tls.context() if self._tls is not None else self._ssl
        _, conn = await loop.create_connection(lambda: _Connection(self.max_response), self.host, self.port,
                                               ssl=context, server_hostname=self.host if context else None)
        conn.refused = self._tls
        return conn

    def _rebind(self, loop: asyncio.AbstractEventLoop) -> None:
        """A new event loop (a test's, a restarted app's) cannot use the old loop's sockets."""
        if self._loop is not None and not self._loop.is_closed():
            self.close()
        self._idle = []  # a closed loop's transports cannot even be closed: just let them go
        self._slots = asyncio.Semaphore(self.max_connections)
        self._loop = loop

    def close(self) -> None:
        """Close the idle connections; one in use closes when its request ends. The pool stays usable."""
        self._generation += 1
        for conn in self._idle:
            conn.close()
        self._idle = []

    @property
    def idle(self) -> int:
        """Connections open and waiting for the next request."""
        return len(self._idle)
