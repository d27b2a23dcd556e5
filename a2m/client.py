"""An async A2M client over HTTP (pooled keep-alive HTTP/1.1) or stdio (a child process).

The router talks to every tier through this. Protocol errors come back as
`A2MError` with the server's code; a server that cannot be reached raises
`Unavailable` (also an `A2MError`, code -32603), so callers can tell "the tier
said no" from "the tier is not there".
"""

from __future__ import annotations

import asyncio
import itertools
import os
from typing import Any, Awaitable, Callable, Sequence

import orjson

from . import errors, tracing
from .errors import A2MError
from .http1 import ConnectionFailed, ConnectionPool

Notify = Callable[[dict[str, Any]], Awaitable[None] | None]


class Unavailable(A2MError):
    """The server could not be reached, timed out, or answered outside JSON-RPC."""

    def __init__(self, message: str, data: Any = None) -> None:
        super().__init__(errors.INTERNAL_ERROR, message, data)


def _unwrap(response: Any) -> dict[str, Any]:
    if not isinstance(response, dict):
        raise Unavailable("malformed JSON-RPC response")
    if "error" in response:
        raise A2MError.from_error(response["error"])
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
                 max_connections: int = 64, headers: dict[str, str] | None = None) -> None:
        self.url = url.rstrip("/") + "/"
        self.timeout = timeout
        fixed = {"content-type": "application/json", **(headers or {})}
        if token:
            fixed["authorization"] = f"Bearer {token}"
        self._pool = ConnectionPool(self.url, headers=fixed, max_connections=max_connections)
        self._ids = itertools.count(1)

    async def _post(self, body: bytes, timeout: float | None, method: str) -> tuple[int, bytes]:
        with tracing.client_span(method, self.url) as headers:
            try:
                return await self._pool.post(body, timeout=timeout or self.timeout, headers=headers)
            except ConnectionFailed as exc:
                raise Unavailable(f"{self.url} unreachable: {exc}", {"url": self.url}) from exc

    async def call(self, method: str, params: dict[str, Any] | None = None, *, timeout: float | None = None) -> dict[str, Any]:
        body = orjson.dumps({"jsonrpc": "2.0", "id": next(self._ids), "method": method, "params": params or {}})
        status, payload = await self._post(body, timeout, method)
        if status != 200:
            raise Unavailable(f"{self.url} answered HTTP {status}",
                              {"url": self.url, "status": status, "body": payload[:200].decode(errors="replace")})
        try:
            return _unwrap(orjson.loads(payload))
        except orjson.JSONDecodeError as exc:
            raise Unavailable(f"{self.url} answered invalid JSON", {"url": self.url}) from exc

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
    notifications (`memory/event`) go to `on_notify`.
    """

    def __init__(self, command: Sequence[str], *, on_notify: Notify | None = None,
                 env: dict[str, str] | None = None, timeout: float = 30.0) -> None:
        self.command = list(command)
        self.on_notify = on_notify
        self.env = env
        self.timeout = timeout
        self._proc: asyncio.subprocess.Process | None = None
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._reader: asyncio.Task[None] | None = None
        self._ids = itertools.count(1)
        self._lock = asyncio.Lock()

    async def start(self) -> "StdioClient":
        self._proc = await asyncio.create_subprocess_exec(
            *self.command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            env={**os.environ, **(self.env or {})}, limit=64 * 1024 * 1024,
        )
        self._reader = asyncio.create_task(self._read())
        return self

    async def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        while True:
            line = await self._proc.stdout.readline()
            if not line:
                break
            try:
                message = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue  # a server must not do this; the conformance suite checks it separately
            if isinstance(message, dict) and "method" in message and "id" not in message:
                if self.on_notify is not None:
                    outcome = self.on_notify(message)
                    if asyncio.iscoroutine(outcome):
                        await outcome
                continue
            future = self._pending.pop(message.get("id") if isinstance(message, dict) else None, None)
            if future is not None and not future.done():
                future.set_result(message)
        for future in self._pending.values():
            if not future.done():
                future.set_exception(Unavailable("server process ended"))
        self._pending.clear()

    async def send_raw(self, line: bytes) -> None:
        assert self._proc is not None and self._proc.stdin is not None
        async with self._lock:
            self._proc.stdin.write(line if line.endswith(b"\n") else line + b"\n")
            await self._proc.stdin.drain()

    async def request_raw(self, message: dict[str, Any], *, timeout: float | None = None) -> Any:
        """Send one message (with an int id) and return the raw response object."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[message["id"]] = future
        await self.send_raw(orjson.dumps(message))
        try:
            return await asyncio.wait_for(future, timeout or self.timeout)
        except asyncio.TimeoutError:
            self._pending.pop(message["id"], None)
            raise Unavailable("stdio server did not answer in time") from None

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
        if self._reader is not None:
            self._reader.cancel()
        self._proc = None

    async def __aenter__(self) -> "StdioClient":
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def connect(target: str, **kwargs: Any) -> HTTPClient | StdioClient:
    """`http(s)://...` -> HTTPClient; anything else is a command line for StdioClient."""
    if target.startswith(("http://", "https://")):
        return HTTPClient(target, **kwargs)
    import shlex

    return StdioClient(shlex.split(target), **kwargs)
