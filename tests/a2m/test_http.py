"""The HTTP binding's transport rules, in-process through httpx's ASGI transport."""

from __future__ import annotations

import json

import httpx
import pytest

from a2m.dispatch import Dispatcher
from a2m.http import SERVICE, HTTPApp, HTTPSettings
from backends.surface import TierServer
from tests.support.memstore import CAPABILITIES, MemoryStore

BODY = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "memory/describe"}).encode()


def make_app(**settings: object) -> HTTPApp:
    server = TierServer(MemoryStore(), name="memory", kind="episodic", capabilities=CAPABILITIES)
    return HTTPApp(Dispatcher(server), HTTPSettings(**settings), lifespan=server)  # type: ignore[arg-type]


def client(app: HTTPApp) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


@pytest.mark.anyio
async def test_post_answers_200_and_notification_202() -> None:
    async with client(make_app()) as c:
        reply = await c.post("/", content=BODY, headers={"content-type": "application/json"})
        assert reply.status_code == 200 and reply.json()["result"]["protocol"] == "a2m/0.1"
        note = await c.post("/", content=b'{"jsonrpc":"2.0","method":"memory/describe"}')
        assert note.status_code == 202 and note.content == b""


@pytest.mark.anyio
async def test_get_is_405_and_unknown_path_404() -> None:
    async with client(make_app()) as c:
        assert (await c.get("/")).status_code == 405
        assert (await c.put("/", content=BODY)).status_code == 405
        assert (await c.get("/nope")).status_code == 404


@pytest.mark.anyio
async def test_an_unknown_path_is_404_whatever_the_method() -> None:
    """405 says the path exists and names the methods it takes: `POST /rpc` (a client with the wrong
    URL) was told to use GET, for a path that answers nothing."""
    async with client(make_app()) as c:
        for method in ("POST", "PUT", "DELETE", "OPTIONS"):
            reply = await c.request(method, "/rpc", content=BODY)
            assert reply.status_code == 404 and "allow" not in reply.headers, method
        assert (await c.post("/healthz", content=BODY)).headers["allow"] == "GET"


@pytest.mark.anyio
async def test_origin_allow_list() -> None:
    async with client(make_app(allowed_origins=frozenset({"https://app.example"}))) as c:
        assert (await c.post("/", content=BODY, headers={"origin": "https://evil.example"})).status_code == 403
        assert (await c.post("/", content=BODY, headers={"origin": "https://app.example"})).status_code == 200
        assert (await c.post("/", content=BODY)).status_code == 200
    async with client(make_app()) as c:  # default: no origin allowed
        assert (await c.post("/", content=BODY, headers={"origin": "http://localhost:3000"})).status_code == 403


@pytest.mark.anyio
async def test_protocol_version_header() -> None:
    async with client(make_app()) as c:
        bad = await c.post("/", content=BODY, headers={"a2m-protocol-version": "a2m/2.0"})
        assert bad.status_code == 400 and bad.json()["error"]["code"] == -32007
        assert (await c.post("/", content=BODY, headers={"a2m-protocol-version": "a2m/0.1"})).status_code == 200


@pytest.mark.anyio
async def test_body_limit_413() -> None:
    async with client(make_app(max_body=1024)) as c:
        assert (await c.post("/", content=b" " * 2048)).status_code == 413


@pytest.mark.anyio
async def test_bearer_auth_runs_first_and_sets_the_owner_scope() -> None:
    app = make_app(tokens={"tok-a": "alice", "tok-b": "bob", "svc": SERVICE})
    async with client(app) as c:
        assert (await c.post("/", content=BODY)).status_code == 401
        assert (await c.post("/", content=BODY, headers={"authorization": "Bearer wrong"})).status_code == 401

        async def rpc(token: str, method: str, params: dict) -> dict:
            body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).encode()
            return (await c.post("/", content=body, headers={"authorization": f"Bearer {token}"})).json()

        await rpc("tok-a", "memory/remember", {"records": [{"content": "alice secret zebra"}]})
        assert len((await rpc("tok-a", "memory/recall", {"query": "zebra"}))["result"]["records"]) == 1
        assert (await rpc("tok-b", "memory/recall", {"query": "zebra"}))["result"]["records"] == []
        assert (await rpc("tok-b", "memory/recall", {"query": "zebra", "owner": "alice"}))["error"]["code"] == -32005
        # the service token names owners itself
        assert len((await rpc("svc", "memory/recall", {"query": "zebra", "owner": "alice"}))["result"]["records"]) == 1


@pytest.mark.anyio
async def test_health_ready_metrics_well_known() -> None:
    async with client(make_app()) as c:
        assert (await c.get("/healthz")).status_code == 200
        assert (await c.get("/readyz")).status_code == 200
        assert (await c.get("/.well-known/a2m-server.json")).json()["protocol"] == "a2m/0.1"
        await c.post("/", content=BODY)
        metrics = (await c.get("/metrics")).text
        assert 'a2m_requests_total{method="memory/describe",outcome="ok"}' in metrics


@pytest.mark.anyio
async def test_a_metrics_token_closes_metrics_and_nothing_else() -> None:
    """With tokens, every caller holds one, and /metrics counts every tenant's calls by method: a tenant
    scraping it twice read how much the others did. `metrics_token` keeps it to the scraper."""
    async with client(make_app(tokens={"caller": "alice"}, metrics_token="scrape-me")) as c:
        for headers in ({}, {"authorization": "Bearer caller"}, {"authorization": "Basic scrape-me"}):
            refused = await c.get("/metrics", headers=headers)
            assert refused.status_code == 401 and refused.headers["www-authenticate"].startswith("Bearer")
        scraped = await c.get("/metrics", headers={"authorization": "Bearer scrape-me"})
        assert scraped.status_code == 200
        assert 'a2m_http_refused_total{status="401"} 3.0' in scraped.text
        assert (await c.get("/healthz")).status_code == 200 and (await c.get("/readyz")).status_code == 200
        # The token opens /metrics only: it is no caller's.
        assert (await c.post("/", content=BODY, headers={"authorization": "Bearer scrape-me"})).status_code == 401


def test_an_error_code_outside_the_protocols_counts_as_other() -> None:
    """A mounted third-party tier may answer any integer, which the router passes on: labelled by
    it, each new code would be a new series (what decision 106 keeps bounded)."""
    from prometheus_client import generate_latest

    from a2m.http import Metrics

    metrics = Metrics()
    for code in (-32602, 12345, -1, -32602):
        metrics.observe("memory/recall", 0.001, code)
    shown = generate_latest(metrics.registry).decode()
    assert 'a2m_request_errors_total{code="-32602",method="memory/recall"} 2.0' in shown
    assert 'a2m_request_errors_total{code="other",method="memory/recall"} 2.0' in shown
    assert 'code="12345"' not in shown and 'code="-1"' not in shown
