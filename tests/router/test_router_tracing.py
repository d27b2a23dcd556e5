"""One recall through the router is one OpenTelemetry trace: the router's span, its calls, each tier's span."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest

from a2m.client import HTTPClient

from .stack import federation

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"


def service(span: dict) -> str:
    return span["resource"]["attributes"]["service.name"]


@pytest.mark.anyio
async def test_a_recall_is_one_trace_across_the_router_and_every_tier_it_asked(tmp_path: Path) -> None:
    spans_file = tmp_path / "spans.jsonl"
    tiers = [{"name": "working", "kind": "working"}, {"name": "procedural", "kind": "procedural"}]
    with federation(tmp_path, tiers, mode="real", env={"A2M_TRACE_FILE": str(spans_file)}) as stack:
        async with HTTPClient(stack.url) as router:
            await router.call("memory/remember", {"records": [{"content": "the deploy runs on friday", "session": "t"}]})
        reply = httpx.post(stack.url, headers={"traceparent": f"00-{TRACE}-{CALLER_SPAN}-01"}, json={
            "jsonrpc": "2.0", "id": 1, "method": "memory/recall", "params": {"query": "deploy", "touch": False}})
        assert [r["content"] for r in reply.json()["result"]["records"]] == ["the deploy runs on friday"]
    spans = [json.loads(line) for line in spans_file.read_text().splitlines()]
    mine = [s for s in spans if s["context"]["trace_id"] == "0x" + TRACE]
    [front] = [s for s in mine if service(s) == "a2m-router" and s["kind"] == "SpanKind.SERVER"]
    assert front["name"] == "a2m memory/recall" and front["parent_id"] == "0x" + CALLER_SPAN
    calls = [s for s in mine if s["kind"] == "SpanKind.CLIENT"]
    assert calls and all(c["parent_id"] == front["context"]["span_id"] and service(c) == "a2m-router" for c in calls)
    served = [s for s in mine if s["kind"] == "SpanKind.SERVER" and s is not front]
    assert {service(s) for s in served} == {"a2m-working", "a2m-procedural"}
    assert all(s["name"] == "a2m memory/recall" for s in served)
    assert {s["parent_id"] for s in served} <= {c["context"]["span_id"] for c in calls}
    # the remember before it was a trace of its own
    assert any(s["name"] == "a2m memory/remember" and s["context"]["trace_id"] != "0x" + TRACE for s in spans)


@pytest.mark.anyio
async def test_a_tier_call_that_failed_is_a_failed_span(tmp_path: Path) -> None:
    """A tier at a wrong URL (or refusing the service token) answers HTTP 404 / 401 before any span
    of its own: the router's client span was all the trace had of that call, and it said OK while
    the recall came back `degraded`. The span is marked failed, with the HTTP status."""
    from tests.support.procs import PYTHON, free_port

    from .stack import Proc, tier_command, write_config

    spans_file = tmp_path / "spans.jsonl"
    port = free_port()
    tier = Proc("working", tier_command({"name": "working", "kind": "working", "serve": "fixture"}, port,
                                        "fixture", tmp_path), port, log=tmp_path / "working.log")
    config = write_config(tmp_path / "router.toml", [
        {"name": "working", "kind": "working", "url": tier.url},
        {"name": "episodic", "kind": "episodic", "url": tier.url + "wrong/path"}])
    router_port = free_port()
    router = Proc("router", [PYTHON, "-m", "a2mctl.cli", "serve", "router", "--config", str(config),
                             "--port", str(router_port)], router_port, {"A2M_TRACE_FILE": str(spans_file)},
                  tmp_path / "router.log")
    try:
        tier.start().wait()
        router.start().wait()
        deadline = time.monotonic() + 30
        while True:  # a recall skips the tier while it waits out the backoff its first 404s earned
            reply = httpx.post(router.url, headers={"traceparent": f"00-{TRACE}-{CALLER_SPAN}-01"}, json={
                "jsonrpc": "2.0", "id": 1, "method": "memory/recall", "params": {"query": "x", "touch": False}})
            assert reply.json()["result"]["degraded"] == ["episodic"]
            spans = [json.loads(line) for line in spans_file.read_text().splitlines()]
            calls = [s for s in spans if s["context"]["trace_id"] == "0x" + TRACE and s["kind"] == "SpanKind.CLIENT"]
            if any(s["attributes"]["server.address"].endswith("/wrong/path/") for s in calls):
                break
            assert time.monotonic() < deadline, "the router never asked the tier again"
            time.sleep(0.2)
    finally:
        router.stop()
        tier.stop()
    [wrong] = [s for s in calls if s["attributes"]["server.address"].endswith("/wrong/path/")]
    assert wrong["status"]["status_code"] == "ERROR" and wrong["attributes"]["http.response.status_code"] == 404
    answered = [s for s in calls if "/wrong/" not in s["attributes"]["server.address"]]
    assert answered and all(s["status"]["status_code"] == "UNSET" for s in answered)


@pytest.mark.anyio
async def test_a_method_no_server_has_gives_one_span_name(tmp_path: Path) -> None:
    """Span names are what tracing backends index and group by: any caller could make one new name
    per request by sending made-up method names. Those spans are all `a2m unknown`, as the request
    counter labels them, with what was sent kept, cut short, in `rpc.method_original`."""
    spans_file = tmp_path / "spans.jsonl"
    tiers = [{"name": "working", "kind": "working"}]
    with federation(tmp_path, tiers, env={"A2M_TRACE_FILE": str(spans_file)}) as stack:
        for i, method in enumerate(["memory/nope-1", "x" * 1000]):
            reply = httpx.post(stack.url, headers={"traceparent": f"00-{TRACE}-{CALLER_SPAN}-01"}, json={
                "jsonrpc": "2.0", "id": i, "method": method, "params": {}})
            assert reply.json()["error"]["code"] == -32601
    spans = [json.loads(line) for line in spans_file.read_text().splitlines()]
    mine = [s for s in spans if s["context"]["trace_id"] == "0x" + TRACE]
    assert [s["name"] for s in mine] == ["a2m unknown", "a2m unknown"]
    assert [s["attributes"]["rpc.method"] for s in mine] == ["unknown", "unknown"]
    assert [s["attributes"]["rpc.method_original"] for s in mine] == ["memory/nope-1", "x" * 100]
