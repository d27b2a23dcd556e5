"""The suite's own wire transports. Deliberately independent of `a2m/`: a
black-box suite must not share code (or bugs) with the servers it judges."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import shlex
from dataclasses import dataclass
from typing import Any

import httpx


class WireError(Exception):
    """The transport itself broke the protocol (bad JSON on stdout, wrong HTTP status, no answer)."""


@dataclass
class HTTPReply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class Transport:
    kind: str
    ids = itertools.count(1)

    async def request(self, method: str, params: Any = None, *, id_: Any = "auto") -> dict[str, Any]:
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        message["id"] = next(self.ids) if id_ == "auto" else id_
        return await self.send(message)

    async def call(self, method: str, params: Any = None) -> Any:
        """The result, or raises RPCError with the error object."""
        response = await self.request(method, params if params is not None else {})
        if "error" in response:
            raise RPCError(response["error"])
        if "result" not in response:
            raise WireError(f"response without result or error: {response}")
        return response["result"]

    async def send(self, message: Any) -> dict[str, Any]:
        raise NotImplementedError

    async def send_raw(self, body: bytes) -> Any:
        raise NotImplementedError

    async def notify(self, method: str, params: Any) -> None:
        raise NotImplementedError

    async def close(self) -> None: ...


class RPCError(Exception):
    def __init__(self, error: Any) -> None:
        self.error = error if isinstance(error, dict) else {"code": None}
        self.code = self.error.get("code")
        super().__init__(f"{self.code} {self.error.get('message')}")


class HTTPTransport(Transport):
    kind = "http"

    def __init__(self, url: str, token: str | None = None) -> None:
        self.url = url.rstrip("/") + "/"
        self.base = self.url
        headers = {"authorization": f"Bearer {token}"} if token else {}
        self.client = httpx.AsyncClient(timeout=30.0, headers=headers)

    async def post(self, body: bytes, headers: dict[str, str] | None = None, path: str = "") -> HTTPReply:
        merged = {"content-type": "application/json", **(headers or {})}
        response = await self.client.post(self.base + path, content=body, headers=merged)
        return HTTPReply(response.status_code, dict(response.headers), response.content)

    async def get(self, path: str) -> HTTPReply:
        response = await self.client.get(self.base + path.lstrip("/"))
        return HTTPReply(response.status_code, dict(response.headers), response.content)

    async def send(self, message: Any) -> dict[str, Any]:
        return await self.send_raw(json.dumps(message).encode())

    async def send_raw(self, body: bytes) -> Any:
        reply = await self.post(body)
        if reply.status != 200:
            raise WireError(f"HTTP {reply.status} for a JSON-RPC request: {reply.body[:200]!r}")
        try:
            return reply.json()
        except ValueError as exc:
            raise WireError(f"response body is not JSON: {reply.body[:200]!r}") from exc

    async def notify(self, method: str, params: Any) -> HTTPReply:  # type: ignore[override]
        return await self.post(json.dumps({"jsonrpc": "2.0", "method": method, "params": params}).encode())

    async def close(self) -> None:
        await self.client.aclose()


class StdioTransport(Transport):
    kind = "stdio"

    def __init__(self, command: str, env: dict[str, str] | None = None) -> None:
        self.command = shlex.split(command)
        self.env = env
        self.proc: asyncio.subprocess.Process | None = None
        self.notifications: list[dict[str, Any]] = []
        self.bad_lines: list[bytes] = []
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._reader: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            *self.command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            env={**os.environ, **(self.env or {})}, limit=64 * 1024 * 1024)
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.proc and self.proc.stdout
        while True:
            line = await self.proc.stdout.readline()
            if not line:
                await self._queue.put(None)
                return
            try:
                message = json.loads(line)
            except ValueError:
                self.bad_lines.append(line)
                continue
            if isinstance(message, dict) and "id" not in message and "method" in message:
                self.notifications.append(message)
            else:
                await self._queue.put(message)

    async def _write(self, body: bytes) -> None:
        assert self.proc and self.proc.stdin
        self.proc.stdin.write(body.rstrip(b"\n") + b"\n")
        await self.proc.stdin.drain()

    async def send(self, message: Any) -> dict[str, Any]:
        return await self.send_raw(json.dumps(message).encode())

    async def send_raw(self, body: bytes) -> Any:
        async with self._lock:  # one outstanding request: responses pair with requests in order
            await self._write(body)
            try:
                reply = await asyncio.wait_for(self._queue.get(), 60)
            except asyncio.TimeoutError:
                raise WireError("no response within 60 s") from None
            if reply is None:
                raise WireError("server closed stdout")
            return reply

    async def notify(self, method: str, params: Any) -> None:
        async with self._lock:
            await self._write(json.dumps({"jsonrpc": "2.0", "method": method, "params": params}).encode())

    async def close(self) -> None:
        if self.proc is None:
            return
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            await asyncio.wait_for(self.proc.wait(), 20)
            self.exit_code = self.proc.returncode
        except asyncio.TimeoutError:
            self.exit_code = None
            self.proc.kill()
            await self.proc.wait()
        if self._reader:
            self._reader.cancel()
