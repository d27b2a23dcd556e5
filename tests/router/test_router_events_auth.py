"""The router's event log and owner scoping, in front of the real tier servers (Redis,
PostgreSQL, Qdrant Edge, git, all embedded). Ground truth is read from the tiers directly."""

from __future__ import annotations

from typing import Any, Iterator

import httpx
import pytest

from a2m.client import HTTPClient
from a2m.errors import A2MError

from .stack import Stack, federation, new_owner, tier_call

TIERS = [
    {"name": "working", "kind": "working", "capacity": 3, "spill_to": "episodic", "timeout": 10.0},
    {"name": "episodic", "kind": "episodic", "timeout": 10.0},
]
APP = "https://app.example"


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with federation(tmp_path_factory.mktemp("events"), TIERS, mode="real",
                    top={"auth": {"allowed_origins": [APP]}}) as stack:
        yield stack


async def events_since(router: HTTPClient, cursor: str, owner: str | None) -> list[dict[str, Any]]:
    params: dict[str, Any] = {"cursor": cursor, "limit": 0}
    if owner is not None:
        params["owner"] = owner
    return (await router.call("memory/events", params))["events"]


@pytest.mark.anyio
async def test_records_that_name_their_owner_are_written_as_that_owner(real: Stack) -> None:
    """A call without `owner` (a trusted transport) whose records name one: the key is found
    and replaced where it lives, capacity counts in that owner's session, and the `written`
    events reach that owner, not the owner-less partition."""
    bob = new_owner()
    async with HTTPClient(real.url, timeout=30) as router:
        bob_head = (await router.call("memory/events", {"owner": bob}))["cursor"]
        anon_head = (await router.call("memory/events", {}))["cursor"]
        first = (await router.call("memory/remember", {"records": [{"content": "v1", "owner": bob, "key": "k"}]}))["ids"]
        await router.call("memory/promote", {"ids": first, "tier": "episodic", "owner": bob})
        again = (await router.call("memory/remember", {"records": [{"content": "v2", "owner": bob, "key": "k"}]}))["ids"]
        turns = (await router.call("memory/remember", {"records": [
            {"content": f"turn {i}", "owner": bob, "session": "s"} for i in range(5)]}))["ids"]

        assert again == first  # replaced in place, in episodic
        assert (await router.call("memory/fetch", {"key": "k", "owner": bob}))["record"]["content"] == "v2"
        working = (await tier_call(real, "working", "memory/timeline", {"owner": bob, "limit": 0}))["records"]
        episodic = (await tier_call(real, "episodic", "memory/timeline", {"owner": bob, "limit": 0}))["records"]
        assert [r["content"] for r in working] == ["turn 2", "turn 3", "turn 4"]  # capacity 3 per session
        assert sorted(r["content"] for r in episodic) == ["turn 0", "turn 1", "v2"]

        mine = await events_since(router, bob_head, bob)
        written = [(e["id"], e.get("revision")) for e in mine if e["kind"] == "written"]
        assert written == [(first[0], 1), (first[0], 2), *((i, None) for i in turns)]
        assert [e["moved"] for e in mine if e["kind"] == "consolidated"] == [2]
        leaked = {e.get("id") for e in await events_since(router, anon_head, None)}
        assert not leaked & {first[0], *turns}


@pytest.mark.anyio
async def test_a_batch_of_several_owners_without_a_call_owner_is_refused(real: Stack) -> None:
    alice, bob = new_owner(), new_owner()
    async with HTTPClient(real.url, timeout=30) as router:
        with pytest.raises(A2MError) as refused:
            await router.call("memory/remember", {"records": [{"content": "a", "owner": alice},
                                                              {"content": "b", "owner": bob}]})
        assert refused.value.code == -32602 and refused.value.data["index"] == 1
        with pytest.raises(A2MError) as refused:
            await router.call("memory/remember", {"records": [{"content": "a", "owner": alice}, {"content": "b"}]})
        assert refused.value.code == -32602
        for owner in (alice, bob):
            assert (await router.call("memory/timeline", {"owner": owner}))["records"] == []


@pytest.mark.anyio
async def test_a_record_naming_another_owner_than_the_call_is_scope_denied(real: Stack) -> None:
    """Protocol §7: a client-supplied owner that disagrees with the call's scope is refused with
    -32005 (it was -32602, as if the record were malformed), and nothing of the batch is written."""
    alice, bob = new_owner(), new_owner()
    async with HTTPClient(real.url, timeout=30) as router:
        with pytest.raises(A2MError) as refused:
            await router.call("memory/remember", {"owner": alice, "records": [{"content": "mine"},
                                                                              {"content": "b", "owner": bob}]})
        assert refused.value.code == -32005 and refused.value.data["index"] == 1
        for owner in (alice, bob):
            assert (await router.call("memory/timeline", {"owner": owner}))["records"] == []
    with pytest.raises(A2MError) as refused:  # a tier server answers the same
        await tier_call(real, "episodic", "memory/remember", {"owner": alice, "records": [{"content": "x", "owner": bob}]})
    assert refused.value.code == -32005


@pytest.mark.anyio
async def test_an_allowed_browser_origin_can_call_and_read_the_answer(real: Stack) -> None:
    """A browser calls with `Authorization` and a JSON body, so it sends a CORS preflight first,
    and reads an answer only when it names the origin: an allowed origin must get both."""
    body = {"jsonrpc": "2.0", "id": 1, "method": "memory/describe", "params": {}}
    preflight = {"origin": APP, "access-control-request-method": "POST",
                 "access-control-request-headers": "authorization, content-type"}
    async with httpx.AsyncClient(timeout=30) as web:
        allowed = await web.options(real.url, headers=preflight)
        assert allowed.status_code == 204, allowed.text
        assert allowed.headers["access-control-allow-origin"] == APP
        assert "POST" in allowed.headers["access-control-allow-methods"]
        assert {"authorization", "content-type"} <= {
            h.strip() for h in allowed.headers["access-control-allow-headers"].lower().split(",")}
        reply = await web.post(real.url, json=body, headers={"origin": APP})
        assert reply.status_code == 200 and reply.json()["result"]["protocol"] == "a2m/0.1"
        assert reply.headers["access-control-allow-origin"] == APP and "origin" in reply.headers["vary"].lower()

        evil = {**preflight, "origin": "https://evil.example"}
        assert (await web.options(real.url, headers=evil)).status_code == 403
        refused = await web.post(real.url, json=body, headers={"origin": "https://evil.example"})
        assert refused.status_code == 403 and "access-control-allow-origin" not in refused.headers
        assert (await web.options(real.url)).status_code == 405  # no Origin: no preflight, POST only
        plain = await web.post(real.url, json=body)
        assert plain.status_code == 200 and "access-control-allow-origin" not in plain.headers


@pytest.mark.anyio
async def test_a_key_written_twice_in_one_batch_says_each_revision_it_wrote(real: Stack) -> None:
    """The tier applies a batch record by record, so the second write of a key is its next
    revision; the `written` events said the first one's revision twice (found by the router's
    differential test, tests/router/test_router_parity.py)."""
    me = new_owner()
    async with HTTPClient(real.url, timeout=30) as router:
        head = (await router.call("memory/events", {"owner": me}))["cursor"]
        first = (await router.call("memory/remember", {"owner": me, "records": [
            {"content": "v1", "key": "twice"}, {"content": "v2", "key": "twice"}]}))["ids"]
        again = (await router.call("memory/remember", {"owner": me, "records": [
            {"content": "v3", "key": "twice"}, {"content": "x", "key": "other"}, {"content": "v4", "key": "twice"}]}))["ids"]
        assert first[0] == first[1] == again[0] == again[2]
        held = (await router.call("memory/fetch", {"owner": me, "key": "twice"}))["record"]
        assert (held["content"], held["revision"]) == ("v4", 4)
        written = [(e["key"], e["revision"]) for e in await events_since(router, head, me) if e["kind"] == "written"]
        assert written == [("twice", 1), ("twice", 2), ("twice", 3), ("other", 1), ("twice", 4)]
