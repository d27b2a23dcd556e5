"""One recall through the router is one OpenTelemetry trace: the router's span, its calls, each tier's span."""

from __future__ import annotations

import json
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
