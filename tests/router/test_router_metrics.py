"""The router's /metrics counts the records it moves and reports tier health; /readyz names each tier."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import httpx
import pytest

from a2m.client import HTTPClient

from .stack import FOUR, federation


@pytest.mark.anyio
async def test_moves_and_tier_health_are_exported(tmp_path: Path) -> None:
    with federation(tmp_path) as stack:
        async with HTTPClient(stack.url) as router:
            turns = [{"content": f"turn {i}", "session": "metrics", "role": "user"} for i in range(40)]
            for i in range(0, 40, 10):
                await router.call("memory/remember", {"records": turns[i:i + 10], "owner": "m"})
            await router.call("memory/session/close", {"session": "metrics", "owner": "m"})
        metrics = httpx.get(stack.url + "metrics").text
        ready = httpx.get(stack.url + "readyz").json()
    spilled = [line for line in metrics.splitlines()
               if line.startswith('a2m_router_moved_records_total{dest="episodic",reason="spill",source="working"}')]
    closed = [line for line in metrics.splitlines()
              if line.startswith('a2m_router_moved_records_total{dest="episodic",reason="session_close"')]
    assert spilled and float(spilled[0].split()[-1]) >= 8  # capacity 32: at least 8 of 40 spilled on write
    assert closed and float(closed[0].split()[-1]) >= 1  # the rest left working at close
    assert 'a2m_router_tier_up{tier="working"} 1.0' in metrics
    assert ready["status"] == "ready" and ready["tiers"]["episodic"] == "up"


@pytest.mark.anyio
async def test_readyz_sees_a_tier_come_back_without_other_traffic(tmp_path: Path) -> None:
    with federation(tmp_path) as stack:
        stack.tiers["procedural"].kill()
        recall = {"jsonrpc": "2.0", "id": 1, "method": "memory/recall", "params": {"query": "anything"}}
        assert httpx.post(stack.url, json=recall).json()["result"]["degraded"] == ["procedural"]
        assert httpx.get(stack.url + "readyz").json()["tiers"]["procedural"] == "down"  # the probe fails
        stack.tiers["procedural"].start().wait()
        deadline = time.monotonic() + 30  # the backoff after one failure is short; no other request is sent
        while httpx.get(stack.url + "readyz").json()["tiers"]["procedural"] != "up":
            assert time.monotonic() < deadline, "readyz never saw the tier come back"
            time.sleep(0.2)


@pytest.mark.anyio
async def test_readyz_answers_within_a_readiness_probes_time_while_a_tier_hangs(tmp_path: Path) -> None:
    """/readyz probed a down tier whose backoff had run out and waited for it: a hung tier held the
    answer for its whole timeout (4 s here, 5 by default), past the 2 s a Kubernetes readiness probe
    waits (deploy/k8s), so the router read unready through the first part of another tier's outage."""
    tiers = [{**t, "timeout": 4.0} if t["name"] == "procedural" else t for t in FOUR]
    with federation(tmp_path, tiers) as stack:
        stack.tiers["procedural"].pause()
        try:
            recall = {"jsonrpc": "2.0", "id": 1, "method": "memory/recall", "params": {"query": "anything"}}
            assert httpx.post(stack.url, json=recall, timeout=30).json()["result"]["degraded"] == ["procedural"]
            for _ in range(6):  # across several backoffs: each check finds the probe due or in flight
                started = time.monotonic()
                ready = httpx.get(stack.url + "readyz", timeout=30)
                assert time.monotonic() - started < 2.0, "readyz waited for the hung tier"
                assert ready.status_code == 200 and ready.json()["tiers"]["procedural"] == "down", ready.text
                time.sleep(0.5)
        finally:
            stack.tiers["procedural"].resume()


def _sample(metrics: str, name: str) -> float | None:
    """The value of the exposition line whose series is exactly `name` (with its labels), or None."""
    for line in metrics.splitlines():
        series, _, value = line.rpartition(" ")
        if series == name:
            return float(value)
    return None


@pytest.mark.anyio
async def test_tier_up_sees_a_tier_come_back_without_other_traffic(tmp_path: Path) -> None:
    """A scrape is the only traffic a quiet router may get: `a2m_router_tier_up` stayed 0 for a tier
    that was back until some request happened to reach it, so the alert on it never cleared."""
    with federation(tmp_path) as stack:
        stack.tiers["procedural"].kill()
        recall = {"jsonrpc": "2.0", "id": 1, "method": "memory/recall", "params": {"query": "anything"}}
        assert httpx.post(stack.url, json=recall).json()["result"]["degraded"] == ["procedural"]
        assert _sample(httpx.get(stack.url + "metrics").text, 'a2m_router_tier_up{tier="procedural"}') == 0.0
        stack.tiers["procedural"].start().wait()
        deadline = time.monotonic() + 30  # the backoff after one failure is short; only scrapes are sent
        while _sample(httpx.get(stack.url + "metrics").text, 'a2m_router_tier_up{tier="procedural"}') != 1.0:
            assert time.monotonic() < deadline, "a2m_router_tier_up never saw the tier come back"
            time.sleep(0.2)


@pytest.mark.anyio
async def test_each_tiers_latency_and_failures_are_exported_by_the_router(tmp_path: Path) -> None:
    """A tier that is slow or fails must show on the router's /metrics, per tier: a tier that hangs
    has no metrics of its own to scrape, and the router's `degraded` count says neither how long
    it waited nor which calls (writes included) failed."""
    with federation(tmp_path) as stack:
        recall = {"jsonrpc": "2.0", "id": 1, "method": "memory/recall", "params": {"query": "anything"}}
        assert "degraded" not in httpx.post(stack.url, json=recall).json()["result"]
        stack.tiers["working"].pause()  # hangs: the router waits out its 2 s timeout
        try:
            assert httpx.post(stack.url, json=recall, timeout=30).json()["result"]["degraded"] == ["working"]
        finally:
            stack.tiers["working"].resume()
        stack.tiers["procedural"].kill()
        write = {"jsonrpc": "2.0", "id": 2, "method": "memory/remember",
                 "params": {"records": [{"content": "how to", "tier": "procedural"}]}}
        assert httpx.post(stack.url, json=write).json()["error"]["code"] == -32603
        metrics = httpx.get(stack.url + "metrics").text
    ok = _sample(metrics, 'a2m_router_tier_calls_total{method="memory/recall",outcome="ok",tier="episodic"}')
    assert ok is not None and ok >= 2
    hung = _sample(metrics, 'a2m_router_tier_calls_total{method="memory/recall",outcome="unavailable",tier="working"}')
    assert hung == 1.0
    failed = _sample(metrics,
                     'a2m_router_tier_calls_total{method="memory/remember",outcome="unavailable",tier="procedural"}')
    assert failed is not None and failed >= 1
    waited = _sample(metrics, 'a2m_router_tier_call_seconds_sum{method="memory/recall",tier="working"}')
    assert waited is not None and waited >= 2.0  # the timeout it waited out is in the latency
    slow = _sample(metrics, 'a2m_router_tier_call_seconds_bucket{le="1.0",method="memory/recall",tier="working"}')
    total = _sample(metrics, 'a2m_router_tier_call_seconds_count{method="memory/recall",tier="working"}')
    assert slow is not None and total is not None and total - slow == 1  # one call slower than 1 s


@pytest.mark.anyio
async def test_latency_buckets_resolve_sub_millisecond_to_multi_second_calls(tmp_path: Path) -> None:
    """A quantile is interpolated inside one bucket: with bounds 0.25, 1 and 5 s a p99 of 1.2 s and one
    of 4.8 s read the same, and a tier's 100 us describe shared its bucket with 500 us. Every bound
    below 30 s is within 2.5x of the next, from 100 us up, on the router as on each tier."""
    with federation(tmp_path) as stack:
        httpx.post(stack.url, json={"jsonrpc": "2.0", "id": 1, "method": "memory/recall", "params": {}})
        for url in (stack.url, stack.tiers["working"].url):
            metrics = httpx.get(url + "metrics").text
            bounds = sorted({float(line.split('le="')[1].split('"')[0]) for line in metrics.splitlines()
                             if line.startswith("a2m_request_seconds_bucket{") and 'le="+Inf"' not in line})
            assert bounds[0] <= 0.0001 and bounds[-1] >= 30, (url, bounds)
            wide = [(low, high) for low, high in zip(bounds, bounds[1:]) if high < 30 and high / low > 2.5]
            assert not wide, (url, wide)


@pytest.mark.anyio
async def test_refused_requests_are_counted(tmp_path: Path) -> None:
    """Requests refused before any method runs were in no metric and no log: a client with a
    rotated-out token, a browser page from an unlisted origin or a client sending batches failed
    every call while a2m_requests_total stayed flat. They are counted by the HTTP status (transport
    refusals) or under method="invalid" (a body that is no JSON-RPC request), never by what the
    caller sent, so a caller cannot add series."""
    with federation(tmp_path, top={"auth": {"tokens": {"tok-a": "alice"}}}) as stack:
        describe = {"jsonrpc": "2.0", "id": 1, "method": "memory/describe"}
        good = {"authorization": "Bearer tok-a"}
        assert httpx.post(stack.url, json=describe).status_code == 401
        assert httpx.post(stack.url, json=describe, headers={"authorization": "Bearer old"}).status_code == 401
        for header, status in (("origin", 403), ("a2m-protocol-version", 400)):
            value = "https://evil.example" if header == "origin" else "a2m/9"
            assert httpx.post(stack.url, json=describe, headers={**good, header: value}).status_code == status
        assert httpx.post(stack.url, content=b"x", headers={**good, "content-type": "text/plain"}).status_code == 415
        assert httpx.post(stack.url, content=b"{", headers=good).json()["error"]["code"] == -32700
        assert httpx.post(stack.url, json=[describe], headers=good).json()["error"]["code"] == -32600
        assert httpx.post(stack.url, json={"id": 2, "method": 7}, headers=good).json()["error"]["code"] == -32600
        assert "result" in httpx.post(stack.url, json=describe, headers=good).json()
        metrics = httpx.get(stack.url + "metrics").text
    assert _sample(metrics, 'a2m_http_refused_total{status="401"}') == 2.0
    assert _sample(metrics, 'a2m_http_refused_total{status="403"}') == 1.0
    assert _sample(metrics, 'a2m_http_refused_total{status="400"}') == 1.0
    assert _sample(metrics, 'a2m_http_refused_total{status="415"}') == 1.0
    assert _sample(metrics, 'a2m_requests_total{method="invalid",outcome="error"}') == 3.0
    assert _sample(metrics, 'a2m_requests_total{method="memory/describe",outcome="ok"}') == 1.0


@pytest.mark.anyio
async def test_records_the_router_drops_are_counted(tmp_path: Path) -> None:
    """With `retention = "drop"` the router deletes what is over capacity: the only records it ever
    deletes by policy, and the one count /metrics did not have (moves had a counter, drops none)."""
    tiers = [{"name": "working", "kind": "working", "capacity": 4, "per_session": True, "retention": "drop"}]
    with federation(tmp_path, tiers) as stack:
        turns = [{"content": f"turn {i}", "session": "s", "role": "user"} for i in range(10)]
        write = {"jsonrpc": "2.0", "id": 1, "method": "memory/remember", "params": {"records": turns}}
        assert len(httpx.post(stack.url, json=write).json()["result"]["ids"]) == 10
        consolidate = {"jsonrpc": "2.0", "id": 2, "method": "memory/consolidate", "params": {}}
        assert "result" in httpx.post(stack.url, json=consolidate).json()  # whatever the write left over
        timeline = {"jsonrpc": "2.0", "id": 3, "method": "memory/timeline", "params": {}}
        assert len(httpx.post(stack.url, json=timeline).json()["result"]["records"]) == 4
        metrics = httpx.get(stack.url + "metrics").text
    assert _sample(metrics, 'a2m_router_dropped_records_total{tier="working"}') == 6.0


@pytest.mark.anyio
async def test_errors_are_counted_by_code_so_a_callers_mistake_is_not_an_outage(tmp_path: Path) -> None:
    """`outcome="error"` lumped a client's bad params (-32602) with the router failing (-32603): an
    alert on the error rate fired for a buggy client and could not say when the service broke.
    `a2m_request_errors_total{method,code}` tells them apart; codes outside the protocol's own
    set (a mounted third-party tier may answer anything) count as "other"."""
    with federation(tmp_path) as stack:
        def rpc(method: str, params: dict) -> dict:
            return httpx.post(stack.url, json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).json()

        assert rpc("memory/remember", {"records": []})["error"]["code"] == -32602
        assert rpc("memory/recall", {"tier": "nowhere"})["error"]["code"] == -32002
        stack.tiers["procedural"].kill()
        assert rpc("memory/remember", {"records": [{"content": "x", "tier": "procedural"}]})["error"]["code"] == -32603
        assert "result" in rpc("memory/recall", {})
        metrics = httpx.get(stack.url + "metrics").text
    assert _sample(metrics, 'a2m_request_errors_total{code="-32602",method="memory/remember"}') == 1.0
    assert _sample(metrics, 'a2m_request_errors_total{code="-32603",method="memory/remember"}') == 1.0
    assert _sample(metrics, 'a2m_request_errors_total{code="-32002",method="memory/recall"}') == 1.0
    assert _sample(metrics, 'a2m_requests_total{method="memory/remember",outcome="error"}') == 2.0
    recall_errors = [line for line in metrics.splitlines()
                     if line.startswith('a2m_request_errors_total{') and 'method="memory/recall"' in line]
    assert len(recall_errors) == 1  # the recall that came back degraded is no error


def _describes(metrics: str, tier: str) -> float:
    """How many describes the router has sent `tier` (its probes are describes)."""
    return _sample(metrics, f'a2m_router_tier_calls_total{{method="memory/describe",outcome="ok",tier="{tier}"}}') or 0.0


@pytest.mark.anyio
async def test_a_tier_that_dies_while_idle_reads_down_without_other_traffic(tmp_path: Path) -> None:
    """Only a failed call marked a tier down: one killed while the router was idle read
    `a2m_router_tier_up` 1 and /readyz "ready" until some request reached it, so an alert on
    `tier_up == 0` never heard of a tier that died at night. A check now probes a tier not heard
    from within HEARD_WITHIN s, under the same bounded wait."""
    with federation(tmp_path) as stack:
        assert httpx.get(stack.url + "readyz").json()["tiers"]["procedural"] == "up"
        stack.tiers["procedural"].kill()  # nothing calls the router from here on but scrapes and checks
        deadline = time.monotonic() + 20
        while _sample(httpx.get(stack.url + "metrics").text, 'a2m_router_tier_up{tier="procedural"}') != 0.0:
            assert time.monotonic() < deadline, "a2m_router_tier_up never saw the idle tier die"
            time.sleep(0.2)
        stack.tiers["working"].kill()  # the default tier: /readyz itself must turn unready
        deadline = time.monotonic() + 20
        while (ready := httpx.get(stack.url + "readyz")).status_code != 503:
            assert time.monotonic() < deadline, "readyz never saw the idle default tier die"
            assert ready.elapsed.total_seconds() < 2.0
            time.sleep(0.2)
        assert ready.json()["tiers"] == {"working": "down", "episodic": "up", "semantic": "up", "procedural": "down"}
        stack.tiers["procedural"].start().wait()  # and one that comes back reads up again
        deadline = time.monotonic() + 30
        while _sample(httpx.get(stack.url + "metrics").text, 'a2m_router_tier_up{tier="procedural"}') != 1.0:
            assert time.monotonic() < deadline, "a2m_router_tier_up never saw the tier come back"
            time.sleep(0.2)


@pytest.mark.anyio
async def test_checks_never_probe_a_tier_the_router_is_calling(tmp_path: Path) -> None:
    """A busy router hears from its tiers in every call: scrapes and readiness checks must add no
    describes beside them (the probe is for a tier nothing has heard from lately)."""
    with federation(tmp_path) as stack:
        recall = {"jsonrpc": "2.0", "id": 1, "method": "memory/recall", "params": {"query": "anything"}}
        httpx.post(stack.url, json=recall)
        before = _describes(httpx.get(stack.url + "metrics").text, "episodic")
        for _ in range(8):
            assert "degraded" not in httpx.post(stack.url, json=recall).json()["result"]
            assert httpx.get(stack.url + "readyz").status_code == 200
            metrics = httpx.get(stack.url + "metrics").text
            time.sleep(0.5)
        assert _describes(metrics, "episodic") == before


@pytest.mark.anyio
async def test_readyz_waits_once_for_a_default_tier_that_hangs_while_idle(tmp_path: Path) -> None:
    """/readyz waited PROBE_WAIT in ready() for the default tier's probe and again in health() for
    the same probe: 1.5 s of a readiness probe's 2 s. One wait now serves both."""
    from router.server import HEARD_WITHIN, PROBE_WAIT

    with federation(tmp_path) as stack:
        stack.tiers["working"].pause()  # the default tier (timeout 2 s): accepts, never answers
        try:
            time.sleep(HEARD_WITHIN)  # so the next check probes it
            deadline = time.monotonic() + 20
            while True:
                started = time.monotonic()
                ready = httpx.get(stack.url + "readyz", timeout=30)
                assert time.monotonic() - started < PROBE_WAIT + 0.5, "readyz waited twice for one probe"
                if ready.status_code == 503:
                    break
                assert time.monotonic() < deadline, "readyz never saw the hung default tier"
                time.sleep(0.2)
            assert ready.json()["tiers"]["working"] == "down"
        finally:
            stack.tiers["working"].resume()


@pytest.mark.anyio
async def test_a_tier_whose_engine_is_down_reads_down(tmp_path: Path) -> None:
    """A tier server that answers HTTP while its engine is away answers every call -32603 naming its
    engine, and its own /readyz 503; the router took that for "the tier answered" and kept it up in
    `tier_up` and /readyz (and read it on every recall) however long the engine stayed away."""
    from backends.working.embedded import find_redis_server
    from tests.support.procs import free_port, stop

    port = free_port()
    command = [find_redis_server(), "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    redis = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    try:
        tiers = [{**t, "serve": "real", "args": ["--url", f"redis://127.0.0.1:{port}/0"]}
                 if t["name"] == "working" else t for t in FOUR]
        with federation(tmp_path, tiers) as stack:
            assert httpx.get(stack.url + "readyz").json()["tiers"]["working"] == "up"
            redis.kill()
            redis.wait()
            assert httpx.get(stack.tiers["working"].url + "readyz").status_code == 503  # it knows
            recall = {"jsonrpc": "2.0", "id": 1, "method": "memory/recall", "params": {"query": "anything"}}
            assert httpx.post(stack.url, json=recall, timeout=30).json()["result"]["degraded"] == ["working"]
            metrics = httpx.get(stack.url + "metrics", timeout=30).text
            assert _sample(metrics, 'a2m_router_tier_up{tier="working"}') == 0.0
            ready = httpx.get(stack.url + "readyz", timeout=30)
            assert ready.status_code == 503 and ready.json()["tiers"]["working"] == "down", ready.text
            redis = subprocess.Popen(command, stdout=subprocess.DEVNULL)  # the engine is back: so is the tier
            deadline = time.monotonic() + 30
            while httpx.get(stack.url + "readyz", timeout=30).status_code != 200:
                assert time.monotonic() < deadline, "readyz never saw the engine come back"
                time.sleep(0.2)
    finally:
        stop(redis)
