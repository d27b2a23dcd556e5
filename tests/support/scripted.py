"""A scripted A2M tier on 127.0.0.1: a real HTTP server over the in-memory fixture store whose
replies a test can rewrite, or replace with any bytes, one method at a time.

For the router's tests against a tier that misbehaves (a mounted third-party server, an old
version): the server answers every call correctly from its own store unless `twist` says
otherwise. `twist(method, params, response)` may return
  - None: the correct answer goes out;
  - a dict: sent as the JSON-RPC response body (status 200);
  - bytes: written to the socket as they are (status line, headers and body: anything at all);
  - an async callable taking the StreamWriter: it writes what it likes, when it likes (a trickle,
    a response that never ends), and the connection is closed after it returns.
The HTTP side is a hand-written asyncio handler, so malformed bytes reach the client unchanged.
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable

import orjson

from a2m.dispatch import Context, Dispatcher
from backends.surface import TierServer

from .memstore import CAPABILITIES, MemoryStore

Twist = Callable[[str, dict[str, Any], dict[str, Any]], Any]


def http_response(body: bytes, status: str = "200 OK", content_type: str = "application/json",
                  extra: str = "") -> bytes:
    return (f"HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {len(body)}\r\n{extra}\r\n"
            .encode() + body)


class ScriptedTier:
    def __init__(self, name: str, kind: str = "episodic") -> None:
        self.server = TierServer(MemoryStore(), name=name, kind=kind, capabilities=CAPABILITIES)
        self.dispatcher = Dispatcher(self.server)
        self.twist: Twist | None = None
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self._listener: asyncio.AbstractServer | None = None
        self._handlers: set[asyncio.Task[Any]] = set()
        self.url = ""

    async def start(self) -> "ScriptedTier":
        await self.server.startup()
        self._listener = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._listener.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}/"
        return self

    async def stop(self) -> None:
        if self._listener is not None:
            self._listener.close()
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        await self.server.shutdown()

    async def call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """Straight to the store's server, no twist: what the tier really holds."""
        reply = await self.dispatcher.handle({"jsonrpc": "2.0", "id": 1, "method": method, "params": params},
                                             Context())
        assert reply is not None and "result" in reply, reply
        return reply["result"]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value.strip())
                message = orjson.loads(await reader.readexactly(length))
                method, params = message.get("method"), message.get("params") or {}
                self.calls.append((method, params))
                response = await self.dispatcher.handle(message, Context())
                out = self.twist(method, params, response) if self.twist is not None else None
                if out is None:
                    writer.write(http_response(orjson.dumps(response)))
                elif isinstance(out, dict):
                    writer.write(http_response(orjson.dumps(out)))
                elif isinstance(out, bytes):
                    writer.write(out)
                else:
                    await out(writer)
                    break
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self._handlers.discard(task)
            writer.close()


def with_result(response: dict[str, Any], result: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": response["id"], "result": result}


Writer = Callable[[asyncio.StreamWriter], Awaitable[None]]
