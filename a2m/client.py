"""An async A2M client over HTTP (pooled keep-alive HTTP/1.1) or stdio (a child process).

The router talks to every tier through this. Protocol errors come back as
`A2MError` with the server's code; a server that cannot be reached raises
`Unavailable` (also an `A2MError`, code -32603), so callers can tell "the tier
said no" from "the tier is not there".
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import re
from typing import Any, Awaitable, Callable, Sequence, TypeVar

import orjson

from . import errors, tracing
from .errors import A2MError, retry_after
from .http1 import MAX_RESPONSE, ConnectionFailed, ConnectionPool
from .stdio import MAX_LINE, LineTooLong, read_line

log = logging.getLogger("a2m.client")

Notify = Callable[[dict[str, Any]], Awaitable[None] | None]
T = TypeVar("T")


# A reply's opening as JSON-RPC servers write it: `{"jsonrpc": "2.0", "id": 7, ...` (either order).
_REPLY_HEAD = re.compile(rb'\{\s*(?:"jsonrpc"\s*:\s*"2\.0"\s*,\s*)?"id"\s*:\s*(\d{1,18})\s*,')


class Unavailable(A2MError):
    """The server could not be reached, timed out, or answered outside JSON-RPC."""

    def __init__(self, message: str, data: Any = None) -> None:
        super().__init__(errors.INTERNAL_ERROR, message, data)


NOT_A2M = (404, 405, 501)  # HTTP answers of a server that takes no POST at the URL
MAX_ERROR_MESSAGE = 1000  # characters of a server's error message kept: it is passed on and logged


def _unwrap(response: Any, sent_id: int | None = None) -> dict[str, Any]:
    if not isinstance(response, dict):
        raise Unavailable("malformed JSON-RPC response")
    if sent_id is not None:  # one request per HTTP exchange: any other id answers another request
        got = response.get("id")
        if not (type(got) is int and got == sent_id) and not (got is None and "error" in response):
            raise Unavailable(f"a JSON-RPC response with id {str(got)[:40]!r} to request id {sent_id}")
    if "error" in response:
        error = A2MError.from_error(response["error"])
        if len(error.message) > MAX_ERROR_MESSAGE:
            error = A2MError(error.code, error.message[:MAX_ERROR_MESSAGE] + "...", error.data)
        raise error
    result = response.get("result")
    if not isinstance(result, dict):
        raise Unavailable("malformed JSON-RPC result")
    return result


class HTTPClient:
    """JSON-RPC over a pool of keep-alive HTTP/1.1 connections (`a2m.http1`).

    Not httpx or aiohttp: the router makes one tier call per tier for every
    request, and a general client costs 2-10x the CPU of this pool a call
    (bench/protocol.py, docs/decisions.md 5).
    """

    def __init__(self, url: str, *, token: str | None = None, timeout: float = 10.0,
                 max_connections: int = 64, headers: dict[str, str] | None = None,
                 max_response: int = MAX_RESPONSE) -> None:
        self.url = url.rstrip("/") + "/"
        self.timeout = timeout
        fixed = {"content-type": "application/json", **(headers or {})}
        if token:
            fixed["authorization"] = f"Bearer {token}"
        self._pool = ConnectionPool(self.url, headers=fixed, max_connections=max_connections,
                                    max_response=max_response)
        self._ids = itertools.count(1)

    async def _post(self, body: bytes, timeout: float | None, method: str) -> tuple[int, bytes]:
        with tracing.client_span(method, self.url) as headers:
            try:
                status, payload = await self._pool.post(body, timeout=timeout or self.timeout, headers=headers)
            except ConnectionFailed as exc:
                raise Unavailable(f"{self.url} unreachable: {exc}", {"url": self.url}) from exc
            tracing.answered(status)
            return status, payload

    async def call(self, method: str, params: dict[str, Any] | None = None, *, timeout: float | None = None) -> dict[str, Any]:
        sent_id = next(self._ids)
        body = orjson.dumps({"jsonrpc": "2.0", "id": sent_id, "method": method, "params": params or {}})
        status, payload = await self._post(body, timeout, method)
        if status == 413:  # the server is there and refused this request's size: its answer, not an outage
            raise A2MError(errors.INVALID_PARAMS, f"{self.url} refused a request of {len(body)} bytes as too large",
                           {"url": self.url, "status": 413, "size": len(body)})
        if status != 200:
            # What a web server that is not an A2M one answers a JSON-RPC POST: say so, or a tier URL
            # pointing at the wrong port read only as "down (answered HTTP 501)".
            hint = ": not an A2M endpoint? (it takes JSON-RPC POSTs at this URL)" if status in NOT_A2M else ""
            raise Unavailable(f"{self.url} answered HTTP {status}{hint}",
                              {"url": self.url, "status": status, "body": payload[:200].decode(errors="replace")})
        try:
            response = orjson.loads(payload)
        except orjson.JSONDecodeError as exc:
            raise Unavailable(f"{self.url} answered invalid JSON", {"url": self.url}) from exc
        try:
            return _unwrap(response, sent_id)
        except Unavailable as exc:
            raise Unavailable(f"{self.url} answered {exc.message}", {"url": self.url}) from None

    async def notify(self, method: str, params: dict[str, Any] | None = None) -> None:
        await self._post(orjson.dumps({"jsonrpc": "2.0", "method": method, "params": params or {}}), None, method)

    async def close(self) -> None:
        self._pool.close()

    async def __aenter__(self) -> "HTTPClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class StdioClient:
    """Runs a server as a child process and speaks newline-delimited JSON-RPC to it.

    Responses are matched to requests by id, so calls may run concurrently;
    notifications (`memory/event`) go to `on_notify`, in order. A coroutine
    `on_notify` runs apart from the reader, so it may call this client; an
    exception from it is logged. Once the child's output ends, every pending
    call and every later one fails with `Unavailable` until `close()`.
    """

    def __init__(self, command: Sequence[str], *, on_notify: Notify | None = None,
                 env: dict[str, str] | None = None, timeout: float = 30.0) -> None:
        self.command = list(command)
        self.on_notify = on_notify
        self.env = env
        self.timeout = timeout
        self._proc: asyncio.subprocess.Process | None = None
        self._pending: dict[Any, asyncio.Future[Any]] = {}
        self._reader: asyncio.Task[None] | None = None
        self._notes: asyncio.Queue[Awaitable[None]] | None = None
        self._notifier: asyncio.Task[None] | None = None
        self._ended: str | None = None  # why the child's output ended, once it has
        self._ids = itertools.count(1)
        self._lock = asyncio.Lock()
        self._starting = asyncio.Lock()

    async def start(self) -> "StdioClient":
        async with self._starting:  # concurrent first calls start one child, not one each
            if self._proc is None:
                self._proc = await asyncio.create_subprocess_exec(
                    *self.command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                    env={**os.environ, **(self.env or {})}, limit=MAX_LINE,
                )
                self._ended = None
                self._reader = asyncio.create_task(self._read(self._proc))
        return self

    async def _read(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        ended = "server process ended"
        try:
            while True:
                try:
                    line = await read_line(proc.stdout)
                except LineTooLong as exc:  # the lines after it are still read
                    log.warning("%s: dropped a reply line over %d bytes", self.command[0], MAX_LINE)
                    self._too_long(exc.head)
                    continue
                if not line:
                    break
                try:
                    message = orjson.loads(line)
                except orjson.JSONDecodeError:
                    continue  # a server must not do this; the conformance suite checks it separately
                if not isinstance(message, dict):
                    continue
                if "method" in message:  # a response has none; a request from the server (protocol §1 has
                    if "id" not in message:  # none) must not answer the call that shares its id
                        self._notify(message)
                    continue
                reply_to = message.get("id")
                if type(reply_to) is not int:  # ours are ints: true and 1.0 equal 1 as dict keys, lists hash not
                    continue
                future = self._pending.pop(reply_to, None)
                if future is not None and not future.done():
                    future.set_result(message)
        except Exception as exc:  # never end silently: the pending calls would wait out their timeout
            log.exception("reading from %s", self.command[0])
            ended = f"reading the server's output failed: {type(exc).__name__}"
        finally:
            self._ended = ended
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(Unavailable(ended))
            self._pending.clear()

    def _too_long(self, head: bytes) -> None:
        """Fail the call a dropped reply answered, as an HTTP reply past `max_response` fails, rather
        than leave it to wait out its timeout: the one whose id opens the line (servers here write
        `jsonrpc`, then `id`), or else the only call waiting. With several and no id, they wait."""
        opening = _REPLY_HEAD.match(head)
        if opening is not None:
            key: int | None = int(opening.group(1))
        else:
            key = next(iter(self._pending)) if len(self._pending) == 1 else None
        future = self._pending.pop(key, None) if key is not None else None
        if future is not None and not future.done():
            future.set_exception(Unavailable(f"{self.command[0]}: a reply line larger than {MAX_LINE} bytes"))

    def _notify(self, message: dict[str, Any]) -> None:
        if self.on_notify is None:
            return
        try:
            outcome = self.on_notify(message)
        except Exception:
            log.exception("on_notify failed")
            return
        if asyncio.iscoroutine(outcome) or isinstance(outcome, asyncio.Future):
            # Awaited apart from the reader, in arrival order: a handler that calls this client
            # waits for a reply only the reader can deliver.
            if self._notes is None:
                self._notes = asyncio.Queue()
                self._notifier = asyncio.create_task(self._deliver(self._notes))
            self._notes.put_nowait(outcome)

    @staticmethod
    async def _deliver(notes: "asyncio.Queue[Awaitable[None]]") -> None:
        while True:
            outcome = await notes.get()
            try:
                await outcome
            except Exception:
                log.exception("on_notify failed")
            finally:
                notes.task_done()

    async def send_raw(self, line: bytes) -> None:
        assert self._proc is not None and self._proc.stdin is not None
        if self._ended is not None:
            raise Unavailable(self._ended)
        try:
            async with self._lock:
                self._proc.stdin.write(line if line.endswith(b"\n") else line + b"\n")
                await self._proc.stdin.drain()
        except ConnectionError as exc:  # the child closed its input or ended
            raise Unavailable(f"server process ended: {type(exc).__name__}") from exc

    async def request_raw(self, message: dict[str, Any], *, timeout: float | None = None) -> Any:
        """Send one message (with an int id) and return the raw response object."""
        if self._ended is not None:
            raise Unavailable(self._ended)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[message["id"]] = future
        try:
            # the write counts too: a child that stops reading its input fills the pipe, and the
            # drain (with the write lock, so every later call) waited on it for ever
            async with asyncio.timeout(timeout or self.timeout):
                await self.send_raw(orjson.dumps(message))
                return await future
        except asyncio.TimeoutError:
            raise Unavailable("stdio server did not answer in time") from None
        finally:
            if self._pending.get(message["id"]) is future:
                del self._pending[message["id"]]

    async def call(self, method: str, params: dict[str, Any] | None = None, *, timeout: float | None = None) -> dict[str, Any]:
        if self._proc is None:
            await self.start()
        message = {"jsonrpc": "2.0", "id": next(self._ids), "method": method, "params": params or {}}
        return _unwrap(await self.request_raw(message, timeout=timeout))

    async def close(self) -> None:
        if self._proc is None:
            return
        if self._proc.stdin is not None and not self._proc.stdin.is_closing():
            self._proc.stdin.close()
        try:
            await asyncio.wait_for(self._proc.wait(), 15)
        except asyncio.TimeoutError:
            self._proc.kill()
            await self._proc.wait()
        except asyncio.CancelledError:  # a shutdown's deadline cut the close short: the child must
            self._proc.kill()  # not outlive its client (it ignored the end of its input)
            raise
        if self._reader is not None:
            await asyncio.wait({self._reader}, timeout=2)  # it reads what the child wrote to the end
        if self._notes is not None:  # and what it read is delivered
            drained = asyncio.ensure_future(self._notes.join())
            await asyncio.wait({drained}, timeout=5)
            drained.cancel()
        for task in (self._reader, self._notifier):
            if task is not None:
                task.cancel()
                await asyncio.wait({task})  # done before a restart: its last words are this child's
        while self._notes is not None and not self._notes.empty():
            outcome = self._notes.get_nowait()
            if asyncio.iscoroutine(outcome):
                outcome.close()  # never delivered: the client is closing
        self._proc = self._reader = self._notifier = self._notes = None

    async def __aenter__(self) -> "StdioClient":
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def waiting_out_rate_limits(call: Callable[[], Awaitable[T]], *, most: float, refusals: int) -> T:
    """`call()`, sent again after each rate-limit refusal (`-32006` with a `retry_after` of at most
    `most` seconds) up to `refusals` times: a refused call did nothing, so sending it again is safe.
    Any other error, a longer wait, or the last refusal is raised."""
    for _ in range(refusals):
        try:
            return await call()
        except A2MError as exc:
            wait = retry_after(exc, most)
            if wait is None:
                raise
            await asyncio.sleep(wait)
    return await call()


def connect(target: str, **kwargs: Any) -> HTTPClient | StdioClient:
    """`http(s)://...` -> HTTPClient; anything else is a command line for StdioClient.

    `token` is HTTP's (a child process is a local transport, protocol §7): None is dropped for
    stdio, so a caller may pass its optional token either way; a token given is refused."""
    if target.startswith(("http://", "https://")):
        return HTTPClient(target, **kwargs)
    import shlex

    if kwargs.pop("token", None) is not None:
        raise ValueError("a bearer token is for an http(s):// server; a command line speaks stdio")
    return StdioClient(shlex.split(target), **kwargs)
