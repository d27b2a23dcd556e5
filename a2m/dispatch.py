"""JSON-RPC 2.0 dispatch with capability gating, shared by every binding.

The rules that make a server conformant regardless of what it stores live here
once: batches refused, ids echoed exactly, every A2M name registered (an
undeclared capability answers -32003, an unknown name -32601), unknown params
ignored, `memory/describe` assembled from what the service declares.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Mapping, Protocol

import orjson

from . import errors, tracing
from .capabilities import METHOD_CAPABILITY, PROTOCOL, compatible
from .errors import A2MError, invalid
from .params import str_param

log = logging.getLogger("a2m")

# The method label of a message that names no method to run (not JSON, a batch, no string method).
INVALID_METHOD = "invalid"
# The method label of a method name that is neither an A2M method nor one this server handles.
UNKNOWN_METHOD = "unknown"

Push = Callable[[dict[str, Any]], Awaitable[None]]


@dataclass(eq=False)
class Context:
    """Who is calling, over what. One per connection (stdio) or request (HTTP).

    `principal` is set when a transport authenticated the caller: it is then the
    owner scope, and a different `owner` param is refused (-32005). `anonymous` is
    set where the transport takes tokens and this caller presented none (only the
    HTTP discovery document gets that far): it may learn what the server can do,
    never what it holds. `push` is set only where the transport can carry
    notifications.
    """

    principal: str | None = None
    transport: str = "inproc"
    anonymous: bool = False
    push: Push | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    traceparent: str | None = None  # the caller's W3C trace context (HTTP), for `a2m.tracing`

    def owner(self, params: Mapping[str, Any]) -> str | None:
        value = params.get("owner")
        if value is not None and not isinstance(value, str):
            raise invalid("owner must be a string or null", field="owner")
        if self.principal is not None:
            if value is not None and value != self.principal:
                raise A2MError(errors.SCOPE_DENIED, "owner disagrees with the authenticated principal",
                               {"owner": value})
            return self.principal
        return value


Handler = Callable[[dict[str, Any], Context], Awaitable[dict[str, Any]]]

# Every A2M method's handler name on a service, by one convention (memory/session/list -> session_list).
HANDLER_NAMES = {
    "memory/remember": "remember", "memory/recall": "recall", "memory/timeline": "timeline",
    "memory/forget": "forget", "memory/promote": "promote", "memory/consolidate": "consolidate",
    "memory/reinforce": "reinforce", "memory/session/list": "session_list",
    "memory/session/close": "session_close", "memory/fetch": "fetch", "memory/events": "events_poll",
    "memory/events/subscribe": "subscribe", "memory/events/unsubscribe": "unsubscribe",
    "memory/summarize": "summarize",
}


def bound_handlers(service: object) -> dict[str, Handler]:
    """The A2M methods `service` implements, found by HANDLER_NAMES (describe is the dispatcher's)."""
    return {method: getattr(service, name) for method, name in HANDLER_NAMES.items() if hasattr(service, name)}


class Service(Protocol):
    """What a server implements; the dispatcher does the rest."""

    name: str
    capabilities: frozenset[str]
    limits: Mapping[str, int]

    def handlers(self) -> Mapping[str, Handler]:
        """Method name -> handler, for A2M methods of declared capabilities and any extensions."""

    async def describe_fields(self, params: dict[str, Any], ctx: Context) -> dict[str, Any]:
        """The capability objects of describe (tiers, embeddings, events, ...)."""

    async def ready(self) -> bool:
        """True when every engine behind the service answers."""


def _error(id_: Any, error: A2MError) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id_, "error": error.to_error()}


def _valid_id(value: Any) -> bool:
    return value is None or isinstance(value, str) or (isinstance(value, (int, float)) and not isinstance(value, bool))


class Dispatcher:
    def __init__(self, service: Service) -> None:
        self.service = service
        self._handlers = dict(service.handlers())
        self._handlers["memory/describe"] = self._describe
        unknown = set(service.capabilities) - set(METHOD_CAPABILITY.values()) - {"scopes", "embeddings", "external", "prompt"}
        if unknown:
            raise ValueError(f"unknown capabilities declared: {sorted(unknown)}")
        if "core" not in service.capabilities:
            raise ValueError("every server declares core")
        # (method label, seconds, None when it succeeded else the JSON-RPC error code): the metrics.
        self.observer: Callable[[str, float, int | None], None] | None = None
        caps = service.capabilities
        self.methods = sorted(
            name for name in self._handlers
            if METHOD_CAPABILITY.get(name) is None or METHOD_CAPABILITY[name] in caps
        )

    def label(self, method: str) -> str:
        """The name metrics and spans give `method`: itself when it is an A2M method or one this server
        handles, else "unknown", so a caller sending made-up names cannot add series or span names."""
        return method if method in METHOD_CAPABILITY or method in self._handlers else UNKNOWN_METHOD

    async def _describe(self, params: dict[str, Any], ctx: Context) -> dict[str, Any]:
        protocol = str_param(params, "protocol")  # null: absent; 1 is a malformed param, not a version
        if protocol is not None and not compatible(protocol):
            raise A2MError(errors.PROTOCOL_NOT_SUPPORTED, f"this server speaks {PROTOCOL}",
                           {"supported": [PROTOCOL], "requested": protocol})
        result: dict[str, Any] = {
            "protocol": PROTOCOL,
            "name": self.service.name,
            "capabilities": sorted(self.service.capabilities),
            "methods": list(self.methods),
        }
        if self.service.limits:
            result["limits"] = dict(self.service.limits)
        result.update(await self.service.describe_fields(params, ctx))
        return result

    async def call(self, method: str, params: dict[str, Any], ctx: Context) -> dict[str, Any]:
        """Call one method as the wire would (gating included); raises A2MError."""
        capability = METHOD_CAPABILITY.get(method)
        handler = self._handlers.get(method)
        if capability is not None and capability not in self.service.capabilities:
            raise A2MError(errors.CAPABILITY_NOT_SUPPORTED, f"{method} needs the {capability} capability",
                           {"method": method, "capability": capability})
        if handler is None:
            if capability is not None:  # declared but not implemented: a server bug, not the caller's
                raise A2MError(errors.CAPABILITY_NOT_SUPPORTED, f"{method} is not implemented", {"method": method})
            raise A2MError(errors.METHOD_NOT_FOUND, f"{method} is not an A2M method", {"method": method})
        return await handler(params, ctx)

    async def handle(self, message: Any, ctx: Context) -> dict[str, Any] | None:
        """One decoded JSON-RPC message -> the response object, or None for a notification."""
        response, _ = await self._handle(message, ctx, encode=False)
        return response

    async def handle_bytes(self, body: bytes, ctx: Context) -> bytes | None:
        """One message's bytes -> the response's bytes, or None for a notification (what bindings call)."""
        started = time.perf_counter()
        try:
            message = orjson.loads(body)
        except orjson.JSONDecodeError:
            return self._reply(None, A2MError(errors.PARSE_ERROR, "body is not valid JSON"), True, started)[1]
        wide = None
        if isinstance(message, dict) and _wide_float(message):
            wide = _wide_integer(body)
        refused = None if wide is None else invalid(
            f"the number {wide[:40]} is an integer past 64 bits, which would be held as an inexact float: "
            "send it as a string")
        _, encoded = await self._handle(message, ctx, encode=True, refused=refused)
        return encoded

    async def _handle(self, message: Any, ctx: Context, *, encode: bool,
                      refused: A2MError | None = None) -> tuple[dict[str, Any] | None, bytes | None]:
        """(response, its bytes when `encode`); both None for a notification.

        The result is serialised inside the error handling: one orjson cannot
        write (nesting past its limit, a value it does not know) is a server bug
        like any other, logged and answered -32603, never an HTTP 500 or a
        silent stdio line.
        """
        started = time.perf_counter()
        if isinstance(message, list):
            return self._reply(None, A2MError(errors.INVALID_REQUEST,
                                              "batches are not supported: send one message at a time"), encode, started)
        if not isinstance(message, dict):
            return self._reply(None, A2MError(errors.INVALID_REQUEST, "a request must be a JSON object"), encode,
                               started)
        notification = "id" not in message
        id_ = message.get("id")
        if not _valid_id(id_):
            return self._reply(None, A2MError(errors.INVALID_REQUEST, "id must be a string, a number or null"), encode,
                               started)
        method = message.get("method")
        if message.get("jsonrpc") != "2.0" or not isinstance(method, str):
            return self._reply(id_, A2MError(errors.INVALID_REQUEST, "expected jsonrpc \"2.0\" and a string method"),
                               encode, started)
        params = message.get("params", {})
        if params is None:
            params = {}
        code: int | None = errors.INTERNAL_ERROR
        encoded: bytes | None = None
        label = self.label(method)
        with tracing.server_span(label, ctx.traceparent, None if label == method else method) as span:
            try:
                if refused is not None:
                    raise refused
                if not isinstance(params, dict):
                    raise invalid("params must be an object (by name)")
                result = await self.call(method, params, ctx)
                response: dict[str, Any] = {"jsonrpc": "2.0", "id": id_, "result": result}
                if encode and not notification:
                    encoded = dumps(response)
                code = None
            except A2MError as exc:
                code = exc.code
                response = _error(id_, exc)
                tracing.failed(span, exc.code, exc.message)
            except Exception as exc:  # a bug or an engine failure: report it, never crash the binding
                log.exception("internal error in %s", method)
                response = _error(id_, A2MError(errors.INTERNAL_ERROR, f"internal error: {type(exc).__name__}",
                                                {"method": method}))
                tracing.failed(span, errors.INTERNAL_ERROR, type(exc).__name__)
        if self.observer is not None:
            self.observer(label, time.perf_counter() - started, code)
        if notification:
            return None, None
        if encode and encoded is None:
            encoded = _encode_error(response, method)
        return response, encoded

    def _reply(self, id_: Any, error: A2MError, encode: bool,
               started: float) -> tuple[dict[str, Any], bytes | None]:
        """The error answer to a message that names no method to run (not JSON, a batch, no string
        method), counted as method "invalid": a client sending such bodies fails on every call, and
        an operator sees it only if the request counts do. Never labelled by what the caller sent."""
        if self.observer is not None:
            self.observer(INVALID_METHOD, time.perf_counter() - started, error.code)
        response = _error(id_, error)
        return response, dumps(response) if encode else None


def _wide_float(message: dict[str, Any]) -> bool:
    """Whether a record's metadata, or a `where`, holds a whole float of 2^63 or more: what orjson makes
    of an integer literal past 64 bits (10**30 -> 1e30, silently). Only then is the body read again,
    exactly (`_wide_integer`): a 1e30 the caller wrote as a float is one too. The rest of a record cannot
    keep such a number (counts must be integers, salience is in [0, 1], a vector is float32 anyway). A
    `where` naming one would match, and a forget delete, the records holding its float."""
    params = message.get("params")
    if not isinstance(params, dict):
        return False
    records = params.get("records")
    pending = [params.get("where")]
    if isinstance(records, list):
        pending.extend(r.get("metadata") for r in records if isinstance(r, dict))
    while pending:
        value = pending.pop()
        if type(value) is float:
            if abs(value) >= 2.0**63 and value.is_integer():
                return True
        elif isinstance(value, dict):
            pending.extend(value.values())
        elif isinstance(value, list):
            pending.extend(value)
    return False


def _wide_integer(body: bytes) -> str | None:
    """The first integer literal of `body` that orjson cannot hold as an integer and whose float is not
    its value, or None. The standard `json` module is what sees each literal as written; a literal
    whose float is its value (a double a JavaScript or Go client wrote out in full) is taken."""
    found: list[str] = []

    def parse_int(text: str) -> int:
        if not found and len(text.lstrip("-")) >= 19 and not _held_exactly(text):
            found.append(text)
        return 0  # only the literal matters here

    try:
        json.loads(body, parse_int=parse_int)
    except (ValueError, RecursionError):  # orjson read it; a difference of parsers is not the caller's error
        return None
    return found[0] if found else None


def _held_exactly(text: str) -> bool:
    """Whether orjson's reading of an integer literal is its value: an integer within 64 bits, or a
    float equal to it (JavaScript and Go write a double of 1e20 as `100000000000000000000`)."""
    if len(text) > 400:  # past any finite double (and Python's int() digit limit)
        return False
    value = int(text)
    if -(2**63) <= value < 2**64:
        return True
    try:
        return float(value) == value
    except OverflowError:
        return False


def _encode_error(response: dict[str, Any], method: str) -> bytes:
    """An error response's bytes; one whose `data` cannot be serialised loses its `data` (logged)."""
    try:
        return dumps(response)
    except orjson.JSONEncodeError:
        log.exception("cannot serialise the error of %s", method)
        error = response["error"]
        return dumps({"jsonrpc": "2.0", "id": response["id"],
                      "error": {"code": error["code"], "message": str(error["message"])}})


def dumps(obj: Any) -> bytes:
    """orjson with the options the wire needs (non-str dict keys never occur; NaN refused upstream)."""
    return orjson.dumps(obj)
