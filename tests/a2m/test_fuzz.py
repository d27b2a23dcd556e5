"""Malformed input at the HTTP binding: always a JSON-RPC error or a 4xx, never a 500 or a hang."""

from __future__ import annotations

import json

import anyio
import httpx
from hypothesis import HealthCheck, given, settings, strategies as st

from a2m.capabilities import METHOD_CAPABILITY
from tests.a2m.test_http import make_app

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
PARAM_NAMES = ["records", "query", "limit", "where", "owner", "ids", "tier", "key", "key_prefix", "embedding",
               "session", "cursor", "kinds", "prompt", "min_score", "amount", "embeddings", "protocol", "into",
               "after", "before", "touch"]


def check_reply(reply: httpx.Response) -> None:
    assert reply.status_code < 500, reply.text
    if reply.status_code == 200:
        body = reply.json()
        assert body["jsonrpc"] == "2.0" and ("result" in body or "error" in body)
        if "error" in body:
            assert isinstance(body["error"]["code"], int) and isinstance(body["error"]["message"], str)
            assert body["error"]["code"] != -32603, body


def post_all(bodies: list[bytes], max_body: int = 1 << 20) -> None:
    async def go() -> None:
        app = make_app(max_body=max_body)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            for body in bodies:
                with anyio.fail_after(5):
                    check_reply(await c.post("/", content=body))
    anyio.run(go)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(sorted(METHOD_CAPABILITY)), st.dictionaries(st.sampled_from(PARAM_NAMES), json_values, max_size=5))
def test_wrong_types_for_every_param(method: str, params: dict) -> None:
    post_all([json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).encode()])


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes(body: bytes) -> None:
    post_all([body])


@settings(max_examples=60, deadline=None)
@given(json_values)
def test_arbitrary_json_documents(doc: object) -> None:
    post_all([json.dumps(doc).encode()])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.dictionaries(st.sampled_from(["content", "id", "key", "metadata", "embedding", "created_at",
                                                 "revision", "salience", "owner", "tier", "session", "group"]),
                                json_values, max_size=6), min_size=1, max_size=4))
def test_malformed_records(records: list) -> None:
    post_all([json.dumps({"jsonrpc": "2.0", "id": 1, "method": "memory/remember",
                          "params": {"records": records}}).encode()])


def test_oversized_bodies() -> None:
    post_all([b"[" * 5000, b'{"jsonrpc":"2.0","id":1,"method":"' + b"a" * 3000 + b'"}', b" " * (2 << 20)],
             max_body=1 << 20)
