"""The per-caller rate limit (`[rate_limit]`, router/rate.py): the bucket's arithmetic on a clock the
test moves, then a router with bearer tokens in front of a real working tier (Redis)."""

from __future__ import annotations

import uuid
from typing import Any, Iterator

import httpx
import pytest

from a2m import errors
from a2m.client import HTTPClient
from a2m.errors import A2MError
from router.config import ConfigError, parse
from router.rate import Buckets, RateLimit

from .stack import Stack, federation

pytestmark = pytest.mark.anyio


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_bucket_lets_a_burst_through_then_the_rate() -> None:
    clock = Clock()
    buckets = Buckets(RateLimit(per_second=2.0, burst=3), clock)
    assert [buckets.take("alice") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert buckets.take("alice") == pytest.approx(0.5)  # one call comes back every half second
    clock.now += 0.25
    assert buckets.take("alice") == pytest.approx(0.25)  # a refused call took nothing
    clock.now += 0.25
    assert buckets.take("alice") == 0.0
    assert buckets.take("bob") == 0.0  # each principal has its own
    clock.now += 3600
    assert [buckets.take("alice") for _ in range(4)][-1] > 0  # a quiet hour refills to the burst, not past it


def test_callers_without_a_principal_share_one_bucket() -> None:
    """Without tokens a caller names its own owner: the bucket is the principal's, never the owner's."""
    buckets = Buckets(RateLimit(per_second=1.0, burst=1), Clock())
    assert buckets.take(None) == 0.0
    assert buckets.take(None) > 0


@pytest.mark.parametrize(("table", "message"), [
    ({"burst": 3}, "needs per_second"),
    ({"per_second": 0}, "rate_limit.per_second must be a positive number"),
    ({"per_second": True}, "rate_limit.per_second must be a positive number"),
    ({"per_second": 1e-320}, "at least one call a day"),  # a refusal's wait overflowed: -32603 on every call
    ({"per_second": 5, "burst": 0.5}, "rate_limit.burst must be a positive integer"),
    ({"per_second": 5, "bursts": 3}, "did you mean 'bursts' -> 'burst'"),
])
def test_a_bad_rate_limit_is_refused_by_name(table: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse({"rate_limit": table}, env={})


def test_the_burst_defaults_to_a_seconds_worth() -> None:
    assert parse({"rate_limit": {"per_second": 2.5}}, env={}).rate_limit == RateLimit(2.5, 3)
    assert parse({"rate_limit": {"per_second": 0.1}}, env={}).rate_limit == RateLimit(0.1, 1)
    assert parse({}, env={}).rate_limit is None


TOKEN_OF = {p: f"tok-{p}-{uuid.uuid4().hex}" for p in ("alice", "bob")}
SERVICE = "svc-" + uuid.uuid4().hex
BURST = 4


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    # A call every 100 s: nothing refills while the test runs, however slow the machine.
    top = {"background_promotion": False, "auth": {"tokens": {t: p for p, t in TOKEN_OF.items()}},
           "rate_limit": {"per_second": 0.01, "burst": BURST}}
    tiers = [{"name": "working", "kind": "working", "timeout": 10.0}]
    with federation(tmp_path_factory.mktemp("rate"), tiers, mode="real", top=top,
                    env={"A2M_SERVICE_TOKEN": SERVICE}) as running:
        yield running


async def test_a_caller_past_its_burst_is_refused_and_nothing_is_written(stack: Stack) -> None:
    async with HTTPClient(stack.url, token=TOKEN_OF["alice"]) as alice, \
            HTTPClient(stack.url, token=TOKEN_OF["bob"]) as bob:
        described = await alice.call("memory/describe", {})
        assert described["rate_limit"] == {"per_second": 0.01, "burst": BURST}
        for i in range(BURST - 1):
            await alice.call("memory/remember", {"records": [{"content": f"alice {i}"}]})
        with pytest.raises(A2MError) as caught:
            await alice.call("memory/remember", {"records": [{"content": "one too many"}]})
        refused = caught.value
        assert refused.code == errors.QUOTA_EXCEEDED
        assert refused.data["per_second"] == 0.01 and refused.data["burst"] == BURST
        # One call's worth at 0.01 a second, less what refilled since the first call: 90 leaves a loaded
        # machine 10 s for four calls (99 left it 1 s) and still tells a wait of 100 s from any other.
        assert 90.0 <= refused.data["retry_after"] <= 100.0, refused.data
        async with HTTPClient(stack.tiers["working"].url, token=SERVICE) as tier:
            stored = await tier.call("memory/timeline", {"owner": "alice"})
        assert [r["content"] for r in stored["records"]] == [f"alice {i}" for i in range(BURST - 1)]
        # Every method counts, reads too, and a refusal is not a call that went: still refused.
        with pytest.raises(A2MError) as again:
            await alice.call("memory/recall", {"query": "alice"})
        assert again.value.code == errors.QUOTA_EXCEEDED
        # Bob's budget is his own.
        await bob.call("memory/remember", {"records": [{"content": "bob 0"}]})
        assert [r["content"] for r in (await bob.call("memory/timeline", {}))["records"]] == ["bob 0"]
    # An operator sees the refusals, by method.
    async with httpx.AsyncClient() as http:
        text = (await http.get(stack.url.rstrip("/") + "/metrics",
                               headers={"authorization": f"Bearer {TOKEN_OF['bob']}"})).text
    counted = {line.split("{")[1].split("}")[0]: float(line.rsplit(" ", 1)[1])
               for line in text.splitlines() if line.startswith("a2m_router_rate_limited_calls_total{")}
    assert counted.get('method="memory/remember"', 0) >= 1 and counted.get('method="memory/recall"', 0) >= 1


@pytest.fixture(scope="module")
def paced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A limit an export meets on every few pages: bursts of 2, then 20 calls a second."""
    top = {"background_promotion": False, "auth": {"tokens": {t: p for p, t in TOKEN_OF.items()}},
           "rate_limit": {"per_second": 20, "burst": 2}}
    tiers = [{"name": "working", "kind": "working", "timeout": 10.0}]
    with federation(tmp_path_factory.mktemp("paced"), tiers, mode="real", top=top,
                    env={"A2M_SERVICE_TOKEN": SERVICE}) as running:
        yield running


async def test_export_and_import_wait_out_the_rate_limit(paced: Stack, tmp_path: Any) -> None:
    """`a2m export` / `import` under a caller's rate limit finish, each record once, instead of
    failing at the first refusal: a refused call did nothing, so it is sent again after retry_after."""
    from a2mctl import transfer

    async with HTTPClient(paced.tiers["working"].url, token=SERVICE) as tier:
        await tier.call("memory/remember", {"owner": "alice", "records": [
            {"content": f"alice {i}", "created_at": f"2026-01-01T00:00:{i:02d}Z"} for i in range(30)]})
        dump = tmp_path / "alice.jsonl"
        assert await transfer.export(paced.url, str(dump), token=TOKEN_OF["alice"], quiet=True, page=3) == 0
        assert len(dump.read_text().splitlines()) == 30
        await tier.call("memory/forget", {"owner": "alice", "where": {"tier": "working"}})
        assert await transfer.import_(paced.url, str(dump), token=TOKEN_OF["alice"], batch=4, quiet=True) == 0
        back = await tier.call("memory/timeline", {"owner": "alice"})
    assert [r["content"] for r in back["records"]] == [f"alice {i}" for i in range(30)]


async def test_doctor_waits_out_the_rate_limit(paced: Stack) -> None:
    """`a2m doctor` makes a describe and five probe recalls a tier: past a burst of 2, a refusal was
    reported as the tier down ("rate limit: ..."). It waits them out instead."""
    from a2mctl.doctor import check

    summary, reports = await check(paced.url, TOKEN_OF["bob"])
    assert [(r.name, r.status, r.detail) for r in reports] == [("working", "up", "")]
    assert reports[0].p50_ms is not None


@pytest.fixture(scope="module")
def open_router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A router without tokens: every caller shares one budget, the discovery document included."""
    top = {"background_promotion": False, "rate_limit": {"per_second": 0.01, "burst": 1}}
    tiers = [{"name": "working", "kind": "working", "timeout": 10.0}]
    with federation(tmp_path_factory.mktemp("open"), tiers, mode="real", top=top) as running:
        yield running


async def test_the_discovery_document_past_the_budget_is_a_429_not_a_500(open_router: Stack) -> None:
    """Without tokens the discovery document is a describe that counts; past the budget it is refused
    as HTTP says (429 with Retry-After), not an unhandled -32006 that the server answers 500."""
    async with httpx.AsyncClient() as http:
        url = open_router.url.rstrip("/") + "/.well-known/a2m-server.json"
        first = await http.get(url)
        assert first.status_code == 200 and first.json()["rate_limit"]["burst"] == 1
        refused = await http.get(url)
    assert refused.status_code == 429, refused.text
    assert 90 <= int(refused.headers["retry-after"]) <= 100  # 100 s less what refilled between the GETs
    assert refused.json()["error"]["code"] == errors.QUOTA_EXCEEDED


async def test_replicas_with_lock_url_draw_on_one_bucket_per_caller(tmp_path: Any) -> None:
    """Each router's buckets were its own: behind N replicas a caller made N times the rate (with
    deploy/k8s's autoscaler, a limit that moved with the load). With `lock_url`, in that Redis."""
    import redis.asyncio as aioredis

    from router.rate import SharedBuckets
    from tests.support.redis import own_redis

    limit = RateLimit(per_second=0.5, burst=3)
    with own_redis(tmp_path) as url:
        client = aioredis.from_url(url)
        a, b = SharedBuckets(limit, client, "fed"), SharedBuckets(limit, client, "fed")
        other = SharedBuckets(limit, client, "another-federation")
        try:
            assert [await a.wait("alice"), await b.wait("alice"), await a.wait("alice")] == [0.0, 0.0, 0.0]
            waits = [await b.wait("alice"), await a.wait("alice")]
            assert all(1.9 < w <= 2.0 for w in waits), waits  # a call every 2 s, refused on either replica
            with pytest.raises(A2MError) as refused:
                await b.spend("alice", "memory/recall")
            assert refused.value.code == errors.QUOTA_EXCEEDED and 1.9 < refused.value.data["retry_after"] <= 2.0
            assert await b.wait("bob") == 0.0 and await b.wait(None) == 0.0  # each principal its own
            assert await other.wait("alice") == 0.0  # another router's callers are not these
        finally:
            await client.aclose()
    # The Redis is gone: each replica counts its own calls meanwhile, not refusing every call.
    assert [await a.wait("carol") for _ in range(3)] == [0.0, 0.0, 0.0] and await a.wait("carol") > 0


async def test_a_router_with_lock_url_keeps_its_rate_limit_there() -> None:
    from router.server import Router

    table = {"rate_limit": {"per_second": 5}}
    assert type(Router(parse(table, env={})).buckets) is Buckets
    shared = Router(parse({**table, "lock_url": "redis://127.0.0.1:1/0"}, env={}))
    assert type(shared.buckets).__name__ == "SharedBuckets"
    await shared.policy.shared_locks.close()


async def test_shared_buckets_that_never_answer_hold_no_call_up(caplog: pytest.LogCaptureFixture) -> None:
    """A lock_url Redis that accepts connections and never answers (hung, or behind a firewall that
    passes the handshake) held every rate-limited call, a read too, for the client's 5 s socket timeout
    before it fell back to this router's buckets. The first call waits a quarter second; the next ones
    count here at once, and the outage is said once."""
    import time

    import redis.asyncio as aioredis

    from router.rate import SharedBuckets

    from .stack import black_hole

    limit = RateLimit(per_second=1.0, burst=2)
    with black_hole() as url:
        client = aioredis.from_url(url, socket_connect_timeout=2.0, socket_timeout=5.0)  # SharedLocks' client
        buckets = SharedBuckets(limit, client, "fed")
        try:
            started = time.monotonic()
            assert await buckets.wait("alice") == 0.0
            first = time.monotonic() - started
            started = time.monotonic()
            waits = [await buckets.wait("alice") for _ in range(2)]
            rest = time.monotonic() - started
        finally:
            await client.aclose()
    assert first < 1.0 and rest < 0.1, (first, rest)
    assert waits[0] == 0.0 and waits[1] > 0  # this router's bucket counts meanwhile
    assert sum("do not answer" in r.getMessage() for r in caplog.records) == 1
