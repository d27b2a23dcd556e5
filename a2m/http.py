"""The HTTP binding: a plain ASGI app, run by uvicorn.

Transport rules are checked before any JSON-RPC processing, in this order:
path and method, Origin (403), bearer token (401), protocol header (400 with a
-32007 body), body size (413), the whole body within `body_timeout` (408, and
the connection closed). Before all of them, the server (`server()`) closes a
connection whose request head has not arrived within `body_timeout` either (no
answer; counted as a 408). Then one JSON-RPC message per body: 200 with the
response, or 202 with an empty body for a notification. The other paths are GET
only and take no caller's token: `/metrics` asks for `metrics_token` where one is
set (401), and the discovery document answers a describe's error as HTTP (429
with Retry-After past a router's rate limit, else 503). An allowed Origin gets
the CORS answers a browser needs to call at all: the preflight (`OPTIONS`) and
`Access-Control-Allow-Origin` on every response.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import logging
import math
import socket
import ssl
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Mapping

import orjson
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from . import errors
from .bodies import BodyBudget
from .capabilities import PROTOCOL
from .certificates import CERT_CHECK_INTERVAL, Certificates
from .dispatch import Context, Dispatcher
from .errors import A2MError, retry_after

log = logging.getLogger("a2m.http")

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

DEFAULT_MAX_BODY = 16 * 1024 * 1024  # a request body at the front door (the router, or any A2M server)
# A tier server takes what the router makes of a full caller batch: up to DEFAULT_MAX_BODY plus the
# vectors its embedder adds (1,000 records x 3,072 floats is ~61 MB of JSON) - decision 63.
TIER_MAX_BODY = 128 * 1024 * 1024
# Seconds a request's whole body may take to arrive once its headers have: past it the answer is 408 and the
# connection is closed. uvicorn has no read timeout, so without one a client that declares a length and
# stops (or trickles a byte a minute) holds a connection and a task for ever. 128 MiB to a tier over a
# 100 Mbit/s link is ~11 s; a caller slower than that is better refused than waited on.
DEFAULT_BODY_TIMEOUT = 30.0
# Connections (or requests in progress) at once before a new request is answered 503 (uvicorn's
# limit_concurrency): a flood is turned away instead of growing memory without bound. Far above what a
# router's pools open to a tier (64 per tier) and what bench/ drives (16 clients).
DEFAULT_MAX_CONNECTIONS = 1024
# Bodies of `max_body` a server holds at once by default (`max_body_in_flight`, a2m.bodies): the router's
# 64 MiB, a tier's 512 MiB, where max_connections times max_body was 16 and 128 GiB.
BODIES_IN_FLIGHT = 4
# Seconds a stopping server waits for requests in progress before cancelling them (uvicorn's default is
# for ever: one stuck client kept the process up). Under the 30 s a supervisor (Kubernetes, systemd,
# docker stop) commonly allows before SIGKILL, leaving room to close the engines.
DEFAULT_SHUTDOWN_TIMEOUT = 20.0
# Seconds an idle keep-alive connection is kept (uvicorn's default, fixed here). a2m.http1's pool stops
# reusing a connection 4 s after its last request was written, under this, so the router never writes into
# a socket a tier is closing.
KEEP_ALIVE = 5
_READ_HEADERS = frozenset({b"origin", b"authorization", b"a2m-protocol-version", b"content-type", b"content-length",
                           b"traceparent"})
SERVICE = object()  # a token that maps to SERVICE is trusted to name any owner (the router's token)
# What a browser page may send cross-origin: everything this binding reads from a request.
_CORS_REQUEST_HEADERS = b"authorization, content-type, a2m-protocol-version, traceparent"
_CORS_MAX_AGE = b"600"
# The paths besides the endpoint, each GET only.
_GET_PATHS = frozenset({"/.well-known/a2m-server.json", "/healthz", "/readyz", "/metrics"})


@dataclass
class HTTPSettings:
    allowed_origins: frozenset[str] = frozenset()
    # token -> principal (owner scope), or SERVICE for a trusted caller that names owners itself.
    tokens: Mapping[str, Any] = field(default_factory=dict)
    # The bearer token a /metrics scrape must present; None: /metrics is open (as /healthz and /readyz are).
    metrics_token: str | None = None
    max_body: int = DEFAULT_MAX_BODY
    # Bytes of request bodies held at once (a2m.bodies); None: BODIES_IN_FLIGHT bodies of max_body.
    max_body_in_flight: int | None = None
    body_timeout: float = DEFAULT_BODY_TIMEOUT  # seconds for a request head, then its whole body, to arrive
    # Read by server() (uvicorn, not the app): connections at once before 503, and how long a stop waits.
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT
    # PEM files: served over HTTPS where both are set (read by server(), as the two above).
    tls_cert: str | None = None
    tls_key: str | None = None
    # A PEM CA file: every connection must present a client certificate it signed (mutual TLS); HTTPS only.
    tls_client_ca: str | None = None

    def __post_init__(self) -> None:
        # The CLI refuses these; a library caller gets the same answer (a zero deadline would tick at 0 s: a spin).
        for name in ("body_timeout", "max_connections", "max_body_in_flight"):
            value = getattr(self, name)
            if value is None and name == "max_body_in_flight":
                continue
            if not (isinstance(value, (int, float)) and value > 0):
                raise ValueError(f"HTTPSettings.{name} must be a positive number, not {value!r}")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("HTTPSettings.tls_cert and tls_key go together: a certificate and its private key")
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise ValueError("HTTPSettings.tls_client_ca asks clients for certificates over TLS: it needs tls_cert "
                             "and tls_key")
        if not (isinstance(self.shutdown_timeout, (int, float)) and self.shutdown_timeout >= 0):
            raise ValueError(f"HTTPSettings.shutdown_timeout must be a number >= 0, not {self.shutdown_timeout!r}")


def _presents(scope: Scope, token: str) -> bool:
    """Whether the request carries `Authorization: Bearer <token>` (compared in constant time)."""
    scheme, _, given = _request_headers(scope).get("authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode("latin-1"), token.encode("latin-1"))


def token_problem(token: str) -> str | None:
    """Why a bearer token could never be presented as written, or None. The binding compares the header's
    value stripped and decoded as latin-1: spaces around it, control characters or non-ASCII never match."""
    if not token:
        return "is empty"
    if token != token.strip() or not token.isascii() or not token.isprintable():
        return "must be printable ASCII without spaces around it: an HTTP bearer header cannot carry it as written"
    return None


def origin_problem(origin: str) -> str | None:
    """Why `origin` would never equal a browser's Origin header (compared as a string), or None."""
    from urllib.parse import urlsplit

    if origin == "*":
        return '"*" is not supported: list each origin (scheme://host[:port])'
    try:
        parts = urlsplit(origin)
        port = parts.port
    except ValueError:
        parts, port = None, None
    if parts is None or not parts.scheme or not parts.hostname or "://" not in origin:
        return f'{origin!r} is not an origin; write scheme://host[:port], e.g. "https://app.example.com"'
    default_port = {"http": 80, "https": 443}.get(parts.scheme.lower())
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname  # an IPv6 literal
    canonical = f"{parts.scheme.lower()}://{host}" + (f":{port}" if port and port != default_port else "")
    if origin != canonical:
        return (f"{origin!r} never matches a browser's Origin header, which has no path, user, default port "
                f"or capitals; write {canonical!r}")
    return None


# Latency buckets, in seconds, for a call that may take 100 us (describe on a tier) or a minute (a
# session close that moves a long conversation; a tier timing out): no gap wider than 2.5x below 1 s,
# where quantiles are read, and room past the 5 s default tier timeout.
LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                   1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


# The error codes a2m_request_errors_total names; any other counts as "other".
PROTOCOL_CODES = frozenset(value for name, value in vars(errors).items() if name.isupper() and isinstance(value, int)
                           and -32768 <= value <= -32000)


class Metrics:
    """Per-app registry, so several servers in one process (tests) do not collide."""

    def __init__(self, tls: bool = False) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("a2m_requests", "JSON-RPC requests", ["method", "outcome"], registry=self.registry)
        self.latency = Histogram(
            "a2m_request_seconds", "JSON-RPC latency", ["method"], registry=self.registry,
            buckets=LATENCY_BUCKETS,
        )

        # Labelled by the protocol's codes only: a mounted tier may answer any integer, passed on.
        self.errors = Counter("a2m_request_errors", "JSON-RPC requests answered with an error, by code",
                              ["method", "code"], registry=self.registry)
        self._error_children: dict[tuple[str, str], Any] = {}
        # Labelled by the status the binding answers (a fixed set), never by anything the caller sent.
        self.refused = Counter("a2m_http_refused", "HTTP requests refused before any JSON-RPC method ran",
                               ["status"], registry=self.registry)
        self.body_bytes = Gauge("a2m_http_body_bytes_held", "Bytes of request bodies taken from the budget "
                                "(max_body_in_flight) by requests in progress", registry=self.registry)
        # Only over HTTPS: a plain server's 0 would read as a certificate expired in 1970. Set by
        # `Certificates` at start and on each renewal served; NaN where cryptography cannot read the end.
        self.certificate_expiry = Gauge(
            "a2m_tls_certificate_expiry_timestamp_seconds", "When the certificate served to new TLS "
            "connections expires (its notAfter), in unix seconds", registry=self.registry) if tls else None
        self._children: dict[tuple[str, bool], tuple[Any, Any]] = {}

    def observe(self, method: str, seconds: float, code: int | None) -> None:
        """One message answered: `code` None when it succeeded, else its JSON-RPC error code."""
        ok = code is None
        if code is not None:
            label = str(code) if code in PROTOCOL_CODES else "other"
            counter = self._error_children.get((method, label))
            if counter is None:
                counter = self._error_children[(method, label)] = self.errors.labels(method, label)
            counter.inc()
        children = self._children.get((method, ok))
        if children is None:  # label lookup is the costly part of prometheus-client: do it once
            children = (self.requests.labels(method, "ok" if ok else "error"), self.latency.labels(method))
            self._children[(method, ok)] = children
        children[0].inc()
        children[1].observe(seconds)


async def _respond(send: Send, status: int, body: bytes = b"", content_type: bytes = b"application/json",
                   headers: list[tuple[bytes, bytes]] | None = None) -> None:
    head = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())] + (headers or [])
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": body})


def _request_headers(scope: Scope) -> dict[str, str]:
    """The headers this binding reads (ASGI names arrive lowercased), decoded."""
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"] if k in _READ_HEADERS}


def _cors(origin: str) -> list[tuple[bytes, bytes]]:
    return [(b"access-control-allow-origin", origin.encode("latin-1")), (b"vary", b"origin")]


def _with_cors(send: Send, origin: str) -> Send:
    """`send` adding the CORS headers to the response: without them a browser page of an
    allowed origin gets the response but may not read it, which is the same as a refusal."""
    extra = _cors(origin)

    async def wrapped(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), *extra]}
        await send(message)

    return wrapped


def _rpc_error(code: int, message: str) -> bytes:
    return orjson.dumps({"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": message}})


class HTTPApp:
    def __init__(self, dispatcher: Dispatcher, settings: HTTPSettings | None = None,
                 lifespan: Any = None) -> None:
        self.dispatcher = dispatcher
        self.settings = settings or HTTPSettings()
        self.metrics = Metrics(tls=self.settings.tls_cert is not None)
        self._body_deadlines = _Deadlines(self.settings.body_timeout)
        self.bodies = BodyBudget(self.settings.max_body_in_flight or BODIES_IN_FLIGHT * self.settings.max_body)
        self.metrics.body_bytes.set_function(lambda: self.bodies.held)
        self.lifespan = lifespan  # an object with async startup() / shutdown(), or None
        dispatcher.observer = self.metrics.observe
        register = getattr(dispatcher.service, "register_metrics", None)
        if register is not None:  # a service's own gauges and counters join the same /metrics
            register(self.metrics.registry)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        if path == "/":
            if method == "OPTIONS":
                await self._preflight(scope, send)
                return
            if method != "POST":
                await self._refuse(send, 405, b'{"error":"use POST"}', headers=[(b"allow", b"POST")])
                return
            await self._rpc(scope, receive, send)
        elif path not in _GET_PATHS:  # before the method: a 405 would say the path exists
            await self._refuse(send, 404, b'{"error":"not found"}')
        elif method != "GET":
            await self._refuse(send, 405, b'{"error":"use GET"}', headers=[(b"allow", b"GET")])
        elif path == "/.well-known/a2m-server.json":
            # No token is needed here (protocol §8): with tokens configured the caller is anonymous.
            try:
                result = await self.dispatcher.call("memory/describe", {},
                                                    Context(transport="http", anonymous=bool(self.settings.tokens)))
            except A2MError as exc:  # a router's rate limit, which this document counts against without tokens
                await self._discovery_refused(send, exc)
                return
            await _respond(send, 200, orjson.dumps(result))
        elif path == "/healthz":
            await _respond(send, 200, b'{"status":"ok"}')
        elif path == "/readyz":
            try:
                ready = await self.dispatcher.service.ready()
            except Exception:
                ready = False
            body: dict[str, Any] = {"status": "ready" if ready else "unavailable"}
            health = getattr(self.dispatcher.service, "health", None)
            if health is not None:  # e.g. the router's per-tier status
                try:
                    body.update(await health())
                except Exception as exc:
                    body["error"] = type(exc).__name__
            await _respond(send, 200 if ready else 503, orjson.dumps(body))
        else:  # /metrics
            if self.settings.metrics_token is not None and not _presents(scope, self.settings.metrics_token):
                await self._refuse(send, 401, b'{"error":"missing or wrong bearer token for /metrics"}',
                                   headers=[(b"www-authenticate", b'Bearer realm="a2m-metrics"')])
                return
            await self._before_scrape()
            await _respond(send, 200, generate_latest(self.metrics.registry), CONTENT_TYPE_LATEST.encode())

    async def _refuse(self, send: Send, status: int, body: bytes,
                      headers: list[tuple[bytes, bytes]] | None = None) -> None:
        """Answer a refusal and count it in `a2m_http_refused_total{status}`: a client with a revoked
        token or an unlisted Origin fails every call before the dispatcher, which counts nothing, sees
        it (and logging each one would let any caller flood the log)."""
        self.metrics.refused.labels(str(status)).inc()
        await _respond(send, status, body, headers=headers)

    async def _discovery_refused(self, send: Send, exc: A2MError) -> None:
        """The discovery document refused (a router's `[rate_limit]` without tokens): said as HTTP says
        it, 429 with Retry-After, the JSON-RPC error as the body. Unhandled, it was a 500 and a
        traceback in the log for every GET past the budget."""
        wait = retry_after(exc, 86400.0)  # at most a day: the slowest rate a router takes
        if wait is not None:
            status, headers = 429, [(b"retry-after", str(max(1, math.ceil(wait))).encode())]
        else:
            status, headers = 503, []
        await self._refuse(send, status, orjson.dumps({"error": exc.to_error()}), headers=headers)

    async def _before_scrape(self) -> None:
        """Let the service bring what its gauges read up to date (the router probes tiers that may be
        back). A failure there is logged and the scrape still answers: stale gauges beat no metrics."""
        hook = getattr(self.dispatcher.service, "before_scrape", None)
        if hook is None:
            return
        try:
            await hook()
        except Exception:
            log.exception("before_scrape failed; /metrics answers with what it has")

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    if self.lifespan is not None:
                        await self.lifespan.startup()
                except Exception as exc:
                    await send({"type": "lifespan.startup.failed", "message": repr(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self.lifespan is not None:
                    await self.lifespan.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _preflight(self, scope: Scope, send: Send) -> None:
        """A browser's CORS preflight: allowed only for an allowed Origin (403 otherwise, as the
        request itself would be); without an Origin it is no preflight, and the endpoint is POST-only."""
        origin = _request_headers(scope).get("origin")
        if origin is None:
            await self._refuse(send, 405, b'{"error":"use POST"}', headers=[(b"allow", b"POST")])
        elif origin not in self.settings.allowed_origins:
            await self._refuse(send, 403, b'{"error":"origin not allowed"}')
        else:
            await _respond(send, 204, headers=[*_cors(origin), (b"access-control-allow-methods", b"POST"),
                                               (b"access-control-allow-headers", _CORS_REQUEST_HEADERS),
                                               (b"access-control-max-age", _CORS_MAX_AGE)])

    async def _rpc(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = _request_headers(scope)
        origin = headers.get("origin")
        if origin is not None:
            if origin not in self.settings.allowed_origins:
                await self._refuse(send, 403, b'{"error":"origin not allowed"}')
                return
            send = _with_cors(send, origin)
        principal = None
        if self.settings.tokens:
            auth = headers.get("authorization", "")
            scheme, _, token = auth.partition(" ")
            if scheme.lower() != "bearer" or token.strip() not in self.settings.tokens:
                await self._refuse(send, 401, b'{"error":"missing or wrong bearer token"}',
                                   headers=[(b"www-authenticate", b'Bearer realm="a2m"')])
                return
            mapped = self.settings.tokens[token.strip()]
            principal = None if mapped is SERVICE else str(mapped)
        version = headers.get("a2m-protocol-version")
        if version is not None and version.strip() != PROTOCOL:
            await self._refuse(send, 400, orjson.dumps({"jsonrpc": "2.0", "id": None, "error": A2MError(
                errors.PROTOCOL_NOT_SUPPORTED, f"this server speaks {PROTOCOL}", {"supported": [PROTOCOL]}).to_error()}))
            return
        ctype = headers.get("content-type")
        if ctype is not None and "json" not in ctype.lower():
            await self._refuse(send, 415, b'{"error":"send Content-Type: application/json (a JSON-RPC body)"}')
            return
        declared = headers.get("content-length", "")
        # A chunked body declares no length: it takes the most it may be (JSON-RPC clients send a length).
        size = int(declared) if declared.isdigit() else self.settings.max_body
        if size > self.settings.max_body:
            await self._refuse(send, 413, b'{"error":"body too large"}')
            return
        taken = self.bodies.take_now(size)
        if taken is None:
            try:
                with self._body_deadlines:
                    taken = await self.bodies.take(size)
            except TimeoutError:
                # The body still in the socket is read and dropped by uvicorn once this is answered (as
                # after a 413), never held: the connection stays usable.
                await self._refuse(send, 503, b'{"error":"the server holds too many request bodies; retry"}',
                                   headers=[(b"retry-after", b"1")])
                return
        try:
            await self._answer(receive, send, headers, principal, (scope.get("extensions") or {}).get(CLIENT_GONE))
        finally:
            self.bodies.give(taken)

    async def _answer(self, receive: Receive, send: Send, headers: dict[str, str], principal: str | None,
                      gone: Callable[[], bool] | None = None) -> None:
        """Read the body, dispatch it and respond: what a request does once its bytes are taken. A
        request whose client has closed its connection (`gone`) is not run (`client_gone`)."""
        try:
            with self._body_deadlines:
                body = await self._read_body(receive)
        except _TooLarge:
            await self._refuse(send, 413, b'{"error":"body too large"}')
            return
        except TimeoutError:
            # Closed as well: the rest of a body that never came would be read as the next request.
            await self._refuse(send, 408, b'{"error":"the request body did not arrive in time"}',
                               headers=[(b"connection", b"close")])
            return
        if body is None:  # the client went away
            return
        if gone is not None and gone():
            log.info("a request whose client had closed its connection was not run (499)")
            await self._refuse(send, 499, b'{"error":"the client closed its connection before this request ran; '
                                          b'nothing was done"}')
            return
        ctx = Context(principal=principal, transport="http", traceparent=headers.get("traceparent"))
        reply = await self.dispatcher.handle_bytes(body, ctx)
        if reply is None:
            await _respond(send, 202)
        else:
            await _respond(send, 200, reply)

    async def _read_body(self, receive: Receive) -> bytes | None:
        """The whole body, or None if the client disconnected; _TooLarge past max_body (counted as it
        arrives: a chunked body declares no length)."""
        first = await receive()
        if first["type"] == "http.disconnect":
            return None
        body = first.get("body", b"")
        if len(body) > self.settings.max_body:
            raise _TooLarge
        if not first.get("more_body", False):
            return body
        chunks: list[bytes] = [body]
        size = len(body)
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.settings.max_body:
                raise _TooLarge
            chunks.append(chunk)
            more = message.get("more_body", False)
        return b"".join(chunks)


class _Deadlines:
    """`with deadlines:` raises TimeoutError in the task running the block once it has run `timeout`
    seconds, as `asyncio.timeout` would; one timer, ticking while any block runs, checks them all.

    Why: `asyncio.timeout` arms and cancels an event loop timer per block. Around every request's body
    read (which has nearly always arrived with the headers) that cost 14-16 us of an episodic recall over
    HTTP against no deadline at all; this costs ~5 us less (same-run A/Bs, 3 x 5,000 recalls each). A
    block past its deadline is cancelled within `timeout / 8` (at most 1 s) of it.
    """

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.tick = min(timeout / 8, 1.0)
        self._running: dict[asyncio.Task[Any], float] = {}  # task -> its block's deadline (loop time)
        self._expired: set[asyncio.Task[Any]] = set()  # cancelled here, not by anyone else
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def __enter__(self) -> None:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # served again in a new loop (tests do): the old loop's blocks are gone
            self._running.clear()
            self._expired.clear()
            self._timer, self._loop = None, loop
        task = asyncio.current_task()
        assert task is not None
        self._running[task] = loop.time() + self.timeout
        if self._timer is None:
            self._timer = loop.call_later(self.tick, self._check, loop)

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._running.pop(task, None)
        if task in self._expired:
            self._expired.discard(task)
            if kind is asyncio.CancelledError and task.uncancel() == 0:  # our cancel, and nobody else's
                raise TimeoutError from exc

    def _check(self, loop: asyncio.AbstractEventLoop) -> None:
        now = loop.time()
        for task, deadline in self._running.items():
            if deadline <= now and task not in self._expired:
                self._expired.add(task)
                task.cancel()
        self._timer = loop.call_later(self.tick, self._check, loop) if self._running else None


class _Heads:
    """The connections whose request head is arriving, each with its deadline: one timer, ticking while
    any is, closes those past theirs (`_Deadlines`' way, for the same reason: no timer per request).

    Why: uvicorn has no header timeout (its keep-alive timer stops at a request's first byte), so a
    client that opened connections and sent nothing, or half a head, held each until the server
    stopped, and `max_connections` of them turned every other caller away with 503. A head gets
    `timeout` seconds from the connection's opening, or from its request's first byte.
    """

    def __init__(self, timeout: float, on_late: Callable[[], None]) -> None:
        self.timeout = timeout
        self.tick = min(timeout / 8, 1.0)
        self.on_late = on_late
        self._arriving: dict[asyncio.Protocol, float] = {}  # connection -> its head's deadline (loop time)
        self._timer: asyncio.TimerHandle | None = None

    def start(self, connection: Any, loop: asyncio.AbstractEventLoop) -> None:
        if connection not in self._arriving:  # a head already timed from the connection's opening keeps that
            self._arriving[connection] = loop.time() + self.timeout
            if self._timer is None:
                self._timer = loop.call_later(self.tick, self._check, loop)

    def done(self, connection: Any) -> None:
        self._arriving.pop(connection, None)

    def _check(self, loop: asyncio.AbstractEventLoop) -> None:
        now = loop.time()
        for connection in [c for c, deadline in self._arriving.items() if deadline <= now]:
            del self._arriving[connection]
            if not connection.transport.is_closing():  # type: ignore[attr-defined]
                self.on_late()
                connection.transport.close()  # type: ignore[attr-defined]
        self._timer = loop.call_later(self.tick, self._check, loop) if self._arriving else None


CLIENT_GONE = "a2m.client_gone"  # the ASGI scope extension: () -> whether the client closed its connection


def client_gone(transport: asyncio.Transport) -> bool:
    """Whether the client has closed its connection: the transport saw it, or its FIN waits in the
    socket behind the request (peeked, nothing read).

    Why: a server that stalled (stopped, swapping, a long pause) reads the requests queued for it when
    it resumes, their callers long gone, and ran them: a write the router had given up on landed
    after a forget of its records, and brought them back (decision 143). Unread, such a request is
    what its caller was told it was: not done. A client that half-closes its side and waits for the
    answer is taken as gone too; HTTP clients do not. Over TLS a client that has sent close_notify
    but keeps the connection open is not seen (one that closes it is), and its request runs."""
    if transport.is_closing():
        return True
    raw = transport.get_extra_info("socket")
    if raw is None:
        return False
    try:
        peek = socket.socket(raw.family, raw.type, fileno=raw.fileno())  # given: no getsockopt to learn them
    except OSError:
        return False
    try:
        return peek.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except (BlockingIOError, InterruptedError):
        return False
    except OSError:  # reset by the peer
        return True
    finally:
        peek.detach()


def _timed_heads(heads: _Heads) -> type[asyncio.Protocol]:
    """uvicorn's httptools protocol, each request's head under `heads`' deadline, and `client_gone`
    in each request's scope."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class TimedHeads(HttpToolsProtocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            heads.start(self, self.loop)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            heads.start(self, self.loop)

        def on_headers_complete(self) -> None:
            heads.done(self)
            extensions = self.scope.setdefault("extensions", {})  # type: ignore[typeddict-item]
            extensions[CLIENT_GONE] = functools.partial(client_gone, self.transport)
            super().on_headers_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            heads.done(self)
            super().connection_lost(exc)

    return TimedHeads


class _TooLarge(Exception):
    """A body past max_body (413)."""


class _OverLimitLog(logging.Filter):
    """uvicorn warns "Exceeded concurrency limit." for each request it answers 503: under the flood the
    limit is for, a line per refused request. One such line a minute goes through, counting those held."""

    MESSAGE = "Exceeded concurrency limit."

    def __init__(self, every: float = 60.0) -> None:
        super().__init__()
        self.every, self.last, self.held = every, -every, 0

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg != self.MESSAGE:
            return True
        now = time.monotonic()
        if now - self.last < self.every:
            self.held += 1
            return False
        record.msg = ("Exceeded concurrency limit (max_connections): answered 503"
                      + (f"; {self.held} more since the last such line" if self.held else "")
                      + " (logged at most each minute)")
        self.last, self.held = now, 0
        return True


def _quiet_over_limit_warnings() -> None:
    logger = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, _OverLimitLog) for f in logger.filters):  # once per process, however many servers
        logger.addFilter(_OverLimitLog())


def server(app: HTTPApp, host: str = "127.0.0.1", port: int = 0, *, log_level: str = "warning",
           on_listening: Callable[[str], None] | None = None, cert_check_every: float = CERT_CHECK_INTERVAL) -> Any:
    """A uvicorn server (httptools + uvloop) for `app`, the binding's production server, with the limits
    of `app.settings`: at most `max_connections` connections or requests at once (503 past it), and a stop
    that waits `shutdown_timeout` seconds for requests in progress, then cancels them. Over HTTPS, the
    certificate files are looked at every `cert_check_every` seconds and a renewed pair served
    (`a2m.certificates`), without a restart. With `tls_client_ca`, a connection whose client presents no
    certificate signed by that CA ends in its handshake (OpenSSL's CERT_REQUIRED), before any HTTP:
    /healthz and /readyz included, as the rest of the port.

    `on_listening(url)` is called once the app has started and the socket is bound, with the
    port actually bound (port 0 asks for any free one, known only then).
    """
    import uvicorn

    _quiet_over_limit_warnings()

    class Server(uvicorn.Server):
        watching: asyncio.Task[None] | None = None

        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets)
            if certificates is not None and self.started and not self.should_exit:
                self.watching = asyncio.create_task(certificates.watch())
            if on_listening is not None and self.started and not self.should_exit:
                bound = next((s.getsockname() for srv in self.servers for s in srv.sockets or ()), None)
                shown = host if ":" not in host else f"[{host}]"  # an IPv6 literal
                scheme = "https" if app.settings.tls_cert else "http"
                on_listening(f"{scheme}://{shown}:{bound[1] if bound else port}/")

        async def shutdown(self, sockets: Any = None) -> None:
            if self.watching is not None:
                self.watching.cancel()
            await super().shutdown(sockets)

    # No proxy-header middleware (this binding never reads the client address) and no
    # Server header: both are per-request work on the hottest path. uvicorn's backlog (2048) is kept.
    heads = _Heads(app.settings.body_timeout, app.metrics.refused.labels("408").inc)
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, http=_timed_heads(heads), loop="uvloop",
                            lifespan="on", access_log=False, proxy_headers=False, server_header=False,
                            limit_concurrency=app.settings.max_connections, timeout_keep_alive=KEEP_ALIVE,
                            timeout_graceful_shutdown=app.settings.shutdown_timeout,  # type: ignore[arg-type]
                            ssl_certfile=app.settings.tls_cert, ssl_keyfile=app.settings.tls_key,
                            ssl_ca_certs=app.settings.tls_client_ca,
                            ssl_cert_reqs=ssl.CERT_REQUIRED if app.settings.tls_client_ca else ssl.CERT_NONE)
    cert, key = app.settings.tls_cert, app.settings.tls_key
    expiry = app.metrics.certificate_expiry
    certificates = Certificates(config, cert, key, cert_check_every, None if expiry is None else expiry.set) \
        if cert and key else None
    return Server(config)


def run(app: HTTPApp, host: str = "127.0.0.1", port: int = 0, *, log_level: str = "warning",
        on_listening: Callable[[str], None] | None = None) -> None:
    """Serve `app` (see `server`) until stopped; a failed start (port taken, lifespan error) exits non-zero."""
    import sys

    from uvicorn.config import STARTUP_FAILURE

    served = server(app, host, port, log_level=log_level, on_listening=on_listening)
    try:
        served.run()
    except KeyboardInterrupt:
        pass
    if not served.started:  # as uvicorn.run: a failed startup (port taken, lifespan error) exits non-zero
        sys.exit(STARTUP_FAILURE)
