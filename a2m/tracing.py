"""OpenTelemetry traces, when asked for: one span per JSON-RPC request a server handles and one per
call the A2M client makes, joined across processes by the W3C `traceparent` header, so one recall
is one trace through the router and every tier it asked.

Off unless `OTEL_TRACES_EXPORTER` names `otlp` or `console`, or `A2M_TRACE_FILE` names a file (one
JSON span a line, for debugging and tests), and the optional SDK is installed
(`pip install 'a2m-router[otel]'`). The OTLP exporter reads the standard `OTEL_EXPORTER_OTLP_*`
variables. Off, a request pays one global lookup: the SDK is never imported.
"""

from __future__ import annotations

import atexit
import logging
import os
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, Iterator

_log = logging.getLogger("a2m.tracing")
_tracer: Any = None


EXPORTERS = ("otlp", "console")


def configure(service_name: str) -> bool:
    """Install a tracer provider for this process if the environment asks for one; True if it did.

    `OTEL_TRACES_EXPORTER` is a comma-separated list, as the OpenTelemetry spec has it; a name this
    module cannot install is said, and with nothing installable tracing stays off (a provider with no
    exporter would make every span and drop it). Raises ValueError when `A2M_TRACE_FILE` cannot be
    opened: tracing was asked for and would not happen."""
    global _tracer
    exporters = [e.strip() for e in os.environ.get("OTEL_TRACES_EXPORTER", "").lower().split(",")]
    exporters = [e for e in exporters if e and e != "none"]
    trace_file = os.environ.get("A2M_TRACE_FILE")
    if not trace_file and not exporters:
        return False
    unknown = [e for e in exporters if e not in EXPORTERS]
    if unknown:
        _log.warning("OTEL_TRACES_EXPORTER names %s, which a2m cannot install (it installs %s): no spans go "
                     "there", ", ".join(map(repr, unknown)), " and ".join(EXPORTERS))
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SimpleSpanProcessor
    except ImportError:
        _log.warning("tracing is configured but opentelemetry-sdk is not installed: pip install 'a2m-router[otel]'")
        return False
    processors: list[Any] = []
    if trace_file:
        try:
            stream = open(trace_file, "a", buffering=1, encoding="utf-8")  # a line per span, appended whole
        except OSError as exc:
            raise ValueError(f"A2M_TRACE_FILE {trace_file} cannot be opened for appending: "
                             f"{exc.strerror or exc}") from None
        processors.append(SimpleSpanProcessor(ConsoleSpanExporter(
            out=stream, formatter=lambda span: span.to_json(indent=None) + "\n")))
    if "otlp" in exporters:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError:
            _log.warning("OTEL_TRACES_EXPORTER=otlp needs opentelemetry-exporter-otlp-proto-http")
        else:
            processors.append(BatchSpanProcessor(OTLPSpanExporter()))
    if "console" in exporters:
        processors.append(BatchSpanProcessor(ConsoleSpanExporter()))
    if not processors:
        return False
    name = os.environ.get("OTEL_SERVICE_NAME") or service_name
    provider = TracerProvider(resource=Resource.create({"service.name": name}))
    for processor in processors:
        provider.add_span_processor(processor)
    trace.set_tracer_provider(provider)
    atexit.register(provider.shutdown)  # flush what the batch processors still hold
    _tracer = trace.get_tracer("a2m")
    _log.info("tracing on as %s", name)
    return True


def enabled() -> bool:
    return _tracer is not None


# With tracing off (the default) every request and every tier call takes this shared no-op context:
# a generator context manager costs ~1 us to enter and leave, on both ends of every call.
_OFF: AbstractContextManager[None] = nullcontext()


# How much of a method name no server knows a span keeps (`rpc.method_original`).
ORIGINAL_CHARS = 100


def server_span(method: str, traceparent: str | None, original: str | None = None) -> AbstractContextManager[Any]:
    """The span of one request this process serves, a child of the caller's when it sent one.
    `method` names it and must come from a bounded set; `original` is what the caller sent when
    that differs (an unknown method), kept cut short as an attribute."""
    return _OFF if _tracer is None else _server_span(method, traceparent, original)


def client_span(method: str, url: str) -> AbstractContextManager[dict[str, str] | None]:
    """The span of one call to another server; yields the headers that carry it (None when off)."""
    return _OFF if _tracer is None else _client_span(method, url)


@contextmanager
def _server_span(method: str, traceparent: str | None, original: str | None) -> Iterator[Any]:
    assert _tracer is not None
    from opentelemetry.propagate import extract
    from opentelemetry.trace import SpanKind

    parent = extract({"traceparent": traceparent}) if traceparent else None
    attributes = {"rpc.system": "jsonrpc", "rpc.method": method}
    if original is not None:
        attributes["rpc.method_original"] = original[:ORIGINAL_CHARS]
    with _tracer.start_as_current_span(f"a2m {method}", context=parent, kind=SpanKind.SERVER,
                                       attributes=attributes) as span:
        yield span


@contextmanager
def _client_span(method: str, url: str) -> Iterator[dict[str, str] | None]:
    assert _tracer is not None
    from opentelemetry.propagate import inject
    from opentelemetry.trace import SpanKind

    with _tracer.start_as_current_span(f"a2m {method}", kind=SpanKind.CLIENT,
                                       attributes={"rpc.system": "jsonrpc", "rpc.method": method,
                                                   "server.address": url}):
        headers: dict[str, str] = {}
        inject(headers)
        yield headers


def failed(span: Any, code: int, message: str) -> None:
    """Mark a span as a JSON-RPC error (its code as an attribute)."""
    if span is None:
        return
    from opentelemetry.trace import Status, StatusCode

    span.set_attribute("rpc.jsonrpc.error_code", code)
    span.set_status(Status(StatusCode.ERROR, message))


def answered(status: int) -> None:
    """Record the HTTP status on the current client span, failed unless 200 or 202: a server that
    refuses a call before its own span (a wrong path, a wrong token, an overload 503) leaves the
    caller's span as the trace's only record of that call, and it must not say OK."""
    if _tracer is None:
        return
    from opentelemetry.trace import Status, StatusCode, get_current_span

    span = get_current_span()
    span.set_attribute("http.response.status_code", status)
    if status not in (200, 202):
        span.set_status(Status(StatusCode.ERROR, f"HTTP {status}"))
