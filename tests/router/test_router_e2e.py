"""End-to-end: the router in front of real tier-server processes (the in-memory fixture servers).

Ground truth is read from each tier server directly, never through the router,
so "every record is in exactly one tier" is checked where the records live.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest

from a2m.client import HTTPClient, Unavailable
from a2m.errors import A2MError

from .stack import FOUR, Stack, federation

CORPUS = {"name": "corpus", "kind": "semantic", "read_only": True, "serve": "fixture"}
RAG = {"name": "rag", "kind": "semantic", "read_only": True, "serve": "fixture", "seed_read_only": True}


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with federation(tmp_path_factory.mktemp("router"), [*FOUR, CORPUS, RAG]) as stack:
        yield stack


def owner() -> str:
    return "owner-" + uuid.uuid4().hex[:8]


async def where_is(stack: Stack, owner_: str | None, tiers: list[str] | None = None) -> dict[str, list[dict]]:
    """tier -> records of this owner, read from each tier server directly."""
    out = {}
    for name in tiers or list(stack.tiers):
        async with HTTPClient(stack.tiers[name].url) as client:
            params: dict[str, Any] = {"limit": 0, "embeddings": True}
            if owner_ is not None:
                params["owner"] = owner_
            out[name] = (await client.call("memory/timeline", params))["records"]
    return out


def exactly_once(placement: dict[str, list[dict]], ids: list[str]) -> dict[str, str]:
    where: dict[str, str] = {}
    for tier, records in placement.items():
        for record in records:
            assert record["id"] not in where, f"{record['id']} is in {where.get(record['id'])} and {tier}"
            where[record["id"]] = tier
    assert set(ids) <= set(where), f"lost: {set(ids) - set(where)}"
    return where


@pytest.mark.anyio
async def test_200_turns_with_capacity_32_keep_working_at_32_and_lose_nothing(shared: Stack) -> None:
    me = owner()
    ids: list[str] = []
    async with HTTPClient(shared.url) as router:
        for turn in range(200):
            result = await router.call("memory/remember", {"owner": me, "records": [
                {"content": f"turn {turn} of the conversation", "session": "talk", "role": "user" if turn % 2 else "assistant"}]})
            ids += result["ids"]
            if turn % 40 == 39 or turn == 10:
                working = (await where_is(shared, me, ["working"]))["working"]
                assert len(working) == min(turn + 1, 32)
        replay = (await router.call("memory/timeline", {"owner": me, "where": {"session": "talk"}, "limit": 0}))["records"]
    placement = await where_is(shared, me, ["working", "episodic", "semantic"])
    where = exactly_once(placement, ids)
    assert len(placement["working"]) == 32 and [r["id"] for r in placement["working"]] == ids[-32:]
    assert sum(1 for t in where.values() if t == "episodic") == 168
    assert [r["id"] for r in replay] == ids  # the whole conversation, in order, across tiers


@pytest.mark.anyio
async def test_a_move_keeps_id_history_key_and_embedding(shared: Stack) -> None:
    me = owner()
    vector = [0.1 * (i + 1) for i in range(8)]
    async with HTTPClient(shared.url) as router:
        first = await router.call("memory/remember", {"owner": me, "records": [
            {"content": "the user lives in Bologna", "key": "user/city", "session": "s1", "embedding": vector}]})
        await router.call("memory/remember", {"owner": me, "records": [
            {"content": "the user lives in Milan", "key": "user/city", "session": "s1", "embedding": vector}]})
        for _ in range(2):
            assert (await router.call("memory/recall", {"owner": me, "query": "Milan"}))["records"]
        await router.call("memory/consolidate", {"owner": me})  # the recall counts land in the background: drain them
        before = (await where_is(shared, me, ["working"]))["working"][0]
        closed = await router.call("memory/session/close", {"owner": me, "session": "s1"})
    assert closed["flushed"] == 1 and closed["closed"] == "s1"
    placement = await where_is(shared, me, ["working", "episodic"])
    assert placement["working"] == []
    moved = placement["episodic"][0]
    assert moved["id"] == first["ids"][0] == before["id"]
    for name in ("created_at", "accessed_at", "key", "session", "content", "salience"):
        assert moved[name] == before[name], name
    assert moved["revision"] == 2 and moved["access_count"] == 2
    assert moved["embedding"] == pytest.approx(vector)


@pytest.mark.anyio
async def test_two_sessions_never_evict_each_other(shared: Stack) -> None:
    me = owner()
    async with HTTPClient(shared.url) as router:
        quiet = (await router.call("memory/remember", {"owner": me, "records": [
            {"content": f"quiet {i}", "session": "quiet"} for i in range(10)]}))["ids"]
        for i in range(80):
            await router.call("memory/remember", {"owner": me, "records": [{"content": f"busy {i}", "session": "busy"}]})
    working = (await where_is(shared, me, ["working"]))["working"]
    assert sorted(r["id"] for r in working if r["session"] == "quiet") == sorted(quiet)
    assert sum(1 for r in working if r["session"] == "busy") == 32


@pytest.mark.anyio
async def test_groups_never_split_across_tiers(shared: Stack) -> None:
    me = owner()
    async with HTTPClient(shared.url) as router:
        group = (await router.call("memory/remember", {"owner": me, "records": [
            {"content": f"tool call part {i}", "session": "g", "group": "call-1"} for i in range(5)]}))["ids"]
        for i in range(40):
            await router.call("memory/remember", {"owner": me, "records": [{"content": f"turn {i}", "session": "g"}]})
            placement = await where_is(shared, me, ["working", "episodic"])
            homes = {t for t, records in placement.items() for r in records if r["id"] in group}
            assert len(homes) == 1, f"group split after turn {i}: {homes}"
    assert homes == {"episodic"}
    assert len(placement["working"]) <= 32


@pytest.mark.anyio
async def test_recalled_three_times_is_promoted(shared: Stack) -> None:
    me = owner()
    async with HTTPClient(shared.url) as router:
        hot, cold = (await router.call("memory/remember", {"owner": me, "records": [
            {"content": "zqhot the wifi password is hunter2", "tier": "episodic"},
            {"content": "zqcold the printer is on floor two", "tier": "episodic"}]}))["ids"]
        head = (await router.call("memory/events", {"owner": me}))["cursor"]
        for _ in range(3):
            found = (await router.call("memory/recall", {"owner": me, "query": "zqhot"}))["records"]
            assert [r["id"] for r in found] == [hot]
        for _ in range(2):
            await router.call("memory/recall", {"owner": me, "query": "zqcold"})
        result = await router.call("memory/consolidate", {"owner": me})
        events = (await router.call("memory/events", {"owner": me, "cursor": head}))["events"]
    assert result["promoted"] == 1
    placement = exactly_once(await where_is(shared, me, ["episodic", "semantic"]), [hot, cold])
    assert placement == {hot: "semantic", cold: "episodic"}
    promoted = [e for e in events if e["kind"] == "promoted"]
    assert promoted and promoted[0]["ids"] == [hot] and promoted[0]["tier"] == "semantic"
    assert sum(1 for e in events if e["kind"] == "consolidated") == 1


@pytest.mark.anyio
async def test_explicit_promote_moves_whole_groups(shared: Stack) -> None:
    me = owner()
    async with HTTPClient(shared.url) as router:
        ids = (await router.call("memory/remember", {"owner": me, "records": [
            {"content": f"doc chunk {i}", "group": "doc-1", "tier": "episodic"} for i in range(3)]}))["ids"]
        result = await router.call("memory/promote", {"owner": me, "ids": ids[:1], "tier": "semantic", "salience": 0.9})
        again = await router.call("memory/promote", {"owner": me, "ids": ids[:1], "tier": "semantic"})
        with pytest.raises(A2MError) as refused:
            await router.call("memory/promote", {"owner": me, "ids": ids, "tier": "corpus"})
    assert result == {"promoted": 1} and again == {"promoted": 0} and refused.value.code == -32004
    placement = await where_is(shared, me, ["episodic", "semantic"])
    assert placement["episodic"] == [] and sorted(r["id"] for r in placement["semantic"]) == sorted(ids)
    assert all(r["salience"] == 0.9 for r in placement["semantic"])


@pytest.mark.anyio
async def test_a_corrected_key_is_recalled_only_in_its_new_form(shared: Stack) -> None:
    me = owner()
    async with HTTPClient(shared.url) as router:
        first = (await router.call("memory/remember", {"owner": me, "records": [
            {"content": "zqcity the user lives in Bologna", "key": "user/city", "session": "k"}]}))["ids"]
        await router.call("memory/session/close", {"owner": me, "session": "k"})  # the fact is in episodic now
        second = (await router.call("memory/remember", {"owner": me, "records": [
            {"content": "zqcity the user lives in Milan", "key": "user/city", "session": "k2"}]}))["ids"]
        hits = (await router.call("memory/recall", {"owner": me, "query": "zqcity Bologna Milan"}))["records"]
        fetched = (await router.call("memory/fetch", {"owner": me, "key": "user/city"}))["record"]
    assert first == second
    assert [h["content"] for h in hits] == ["zqcity the user lives in Milan"]
    assert fetched["revision"] == 2 and fetched["tier"] == "episodic"
    placement = await where_is(shared, me)
    assert sum(1 for records in placement.values() for r in records if r.get("key") == "user/city") == 1


@pytest.mark.anyio
async def test_read_only_mounted_tier_is_recalled_and_never_written(shared: Stack) -> None:
    me = owner()
    async with HTTPClient(shared.tiers["corpus"].url) as corpus:  # seeded behind the router's back
        seeded = (await corpus.call("memory/remember", {"owner": me, "records": [
            {"content": "zqcorpus the handbook says holidays are 25 days", "session": "hr"},
            {"content": "zqcorpus expense reports are due monthly", "session": "hr"}]}))["ids"]
    before = (await where_is(shared, me, ["corpus"]))["corpus"]
    async with HTTPClient(shared.url) as router:
        await router.call("memory/remember", {"owner": me, "records": [
            {"content": f"zqcorpus chat {i}", "session": "hr"} for i in range(40)]})
        hits = (await router.call("memory/recall", {"owner": me, "query": "zqcorpus holidays", "limit": 50}))
        assert "degraded" not in hits
        assert {h["id"] for h in hits["records"] if h["tier"] == "corpus"} == set(seeded)
        with pytest.raises(A2MError) as refused:
            await router.call("memory/remember", {"owner": me, "records": [{"content": "x", "tier": "corpus"}]})
        assert refused.value.code == -32004
        with pytest.raises(A2MError) as refused:
            await router.call("memory/forget", {"owner": me, "tier": "corpus", "query": "zqcorpus"})
        assert refused.value.code == -32004
        await router.call("memory/session/close", {"owner": me, "session": "hr"})
        await router.call("memory/consolidate", {"owner": me})
        await router.call("memory/forget", {"owner": me, "query": "zqcorpus"})
        await router.call("memory/summarize", {"owner": me, "query": "zqcorpus"})
        rag = (await router.call("memory/recall", {"owner": me, "query": "anything", "tier": "rag"}))
        layout = {t["name"]: t for t in (await router.call("memory/describe", {"owner": me}))["tiers"]}
    assert (await where_is(shared, me, ["corpus"]))["corpus"] == before  # not written, not touched
    assert rag["records"] == [] and "degraded" not in rag
    assert layout["corpus"]["read_only"] is True and layout["corpus"]["count"] == 2
    assert layout["working"]["spill_to"] == "episodic" and layout["episodic"]["promote_to"] == "semantic"


@pytest.mark.anyio
async def test_session_close_flushes_lists_and_leaves_procedural_alone(shared: Stack) -> None:
    me = owner()
    async with HTTPClient(shared.url) as router:
        ids = (await router.call("memory/remember", {"owner": me, "records": [
            {"content": f"line {i}", "session": "meeting"} for i in range(5)]}))["ids"]
        howto = (await router.call("memory/remember", {"owner": me, "records": [
            {"content": "how to deploy: run make deploy", "session": "meeting", "tier": "procedural"}]}))["ids"]
        closed = await router.call("memory/session/close", {"owner": me, "session": "meeting"})
        listed = (await router.call("memory/session/list", {"owner": me}))["sessions"]
        replay = (await router.call("memory/timeline", {"owner": me, "where": {"session": "meeting"}}))["records"]
        unknown = await router.call("memory/session/close", {"owner": me, "session": "never-opened"})
    assert closed["flushed"] == 5 and closed["counts"]["working"] == 0
    where = exactly_once(await where_is(shared, me, ["working", "episodic", "procedural"]), ids + howto)
    assert {where[i] for i in ids} == {"episodic"} and where[howto[0]] == "procedural"
    assert [r["id"] for r in replay if r["tier"] == "episodic"] == ids
    entry = next(e for e in listed if e["session"] == "meeting")
    assert entry["records"] == 6 and entry["tiers"] == {"episodic": 5, "procedural": 1}
    assert unknown["flushed"] == 0 and unknown["closed"] == "never-opened"


@pytest.mark.anyio
async def test_spills_are_one_consolidated_event_each(shared: Stack) -> None:
    me = owner()
    async with HTTPClient(shared.url) as router:
        head = (await router.call("memory/events", {"owner": me}))["cursor"]
        await router.call("memory/remember", {"owner": me, "records": [
            {"content": f"bulk {i}", "session": "bulk"} for i in range(50)]})
        events = (await router.call("memory/events", {"owner": me, "cursor": head, "limit": 0}))["events"]
    assert sum(1 for e in events if e["kind"] == "written") == 50
    consolidated = [e for e in events if e["kind"] == "consolidated"]
    assert len(consolidated) == 1 and consolidated[0]["moved"] == 18


@pytest.mark.anyio
async def test_fusion_null_is_the_configured_strategy_and_an_unknown_one_touches_nothing(shared: Stack) -> None:
    """`fusion: null` is absent, as every other param's null is; a strategy the router does not know is
    -32602 before any tier is asked, so the record's access count is what it was."""
    me = owner()
    async with HTTPClient(shared.url) as router:
        kept = (await router.call("memory/remember", {"owner": me, "records": [
            {"content": "zqfusion the heron waits", "tier": "semantic"}]}))["ids"][0]
        plain = await router.call("memory/recall", {"owner": me, "query": "zqfusion heron", "touch": False})
        nulled = await router.call("memory/recall", {"owner": me, "query": "zqfusion heron", "fusion": None,
                                                     "touch": False})
        with pytest.raises(A2MError) as refused:
            await router.call("memory/recall", {"owner": me, "query": "zqfusion heron", "fusion": "borda"})
        (record,) = (await router.call("memory/timeline", {"owner": me, "tier": "semantic"}))["records"]
    assert [r["id"] for r in nulled["records"]] == [r["id"] for r in plain["records"]] == [kept]
    assert refused.value.code == -32602 and "fusion" in refused.value.message
    assert record["id"] == kept and record["access_count"] == 0


@pytest.mark.anyio
async def test_rerank_fusion_and_describe(shared: Stack) -> None:
    me = owner()
    async with HTTPClient(shared.url) as router:
        await router.call("memory/remember", {"owner": me, "records": [
            {"content": "zqrerank parrots are clever birds", "tier": "semantic"},
            {"content": "zqrerank the cat sleeps", "tier": "episodic"},
            {"content": "a zqrerank parrot said hello", "session": "r"}]})
        fused = (await router.call("memory/recall", {"owner": me, "query": "zqrerank parrot", "fusion": "rerank"}))
        described = await router.call("memory/describe", {"owner": me})
    assert [r["content"] for r in fused["records"]][:2] == ["a zqrerank parrot said hello",
                                                            "zqrerank parrots are clever birds"] or \
        [r["content"] for r in fused["records"]][:2] == ["zqrerank parrots are clever birds",
                                                         "a zqrerank parrot said hello"]
    scores = [r["score"] for r in fused["records"]]
    assert scores == sorted(scores, reverse=True) and all(0 <= s <= 1 for s in scores)
    assert set(described["capabilities"]) == {"core", "tiers", "salience", "scopes", "sessions", "keys", "embeddings",
                                              "external", "events", "summarize", "prompt"}
    assert described["embeddings"]["metrics"] == ["cosine"]
    counts = {t["name"]: t["count"] for t in described["tiers"]}
    assert counts["semantic"] == 1 and counts["episodic"] == 1 and counts["working"] == 1


# ---------------------------------------------------------------- failures (own stacks)

SMALL = [
    {"name": "working", "kind": "working", "capacity": 8, "spill_to": "episodic", "timeout": 1.0},
    {"name": "episodic", "kind": "episodic", "spill_to": "semantic", "promote_to": "semantic", "timeout": 1.0},
    {"name": "semantic", "kind": "semantic", "timeout": 1.0},
]


@pytest.mark.anyio
async def test_one_tier_down_recall_answers_with_degraded(tmp_path: Path) -> None:
    with federation(tmp_path, SMALL) as stack:
        async with HTTPClient(stack.url) as router:
            await router.call("memory/remember", {"records": [
                {"content": "zqdown in working", "session": "d"}, {"content": "zqdown in episodic", "tier": "episodic"},
                {"content": "zqdown in semantic", "tier": "semantic"}]})
            stack.tiers["semantic"].kill()
            hit = await router.call("memory/recall", {"query": "zqdown"})
            assert hit["degraded"] == ["semantic"]
            assert sorted(r["tier"] for r in hit["records"]) == ["episodic", "working"]
            again = await router.call("memory/recall", {"query": "zqdown"})  # skipped while backing off: fast
            assert again["degraded"] == ["semantic"]
            tl = await router.call("memory/timeline", {})
            assert tl["degraded"] == ["semantic"] and len(tl["records"]) == 2
            described = await router.call("memory/describe", {})
            assert {t["name"]: t["status"] for t in described["tiers"]}["semantic"] == "down"
            # a policy pass that cannot reach a tier says so, rather than reporting partial counts as whole
            await router.call("memory/remember", {"records": [{"content": "closing while a tier is down", "session": "d2"}]})
            closed = await router.call("memory/session/close", {"session": "d2"})
            assert closed["degraded"] == ["semantic"] and "semantic" not in closed["counts"]
            assert closed["flushed"] == 1 and closed["counts"]["episodic"] == 2  # episodic is up: it moved
            assert (await router.call("memory/consolidate", {}))["degraded"] == ["semantic"]
            stack.tiers["episodic"].pause()  # a hung tier: its timeout, not the request's
            try:
                started = time.monotonic()
                slow = await router.call("memory/recall", {"query": "zqdown"})
                assert time.monotonic() - started < 4.0
                assert slow["degraded"] == ["episodic", "semantic"] and [r["tier"] for r in slow["records"]] == ["working"]
            finally:
                stack.tiers["episodic"].resume()


@pytest.mark.anyio
async def test_a_session_closed_while_working_is_down_answers_with_degraded(tmp_path: Path) -> None:
    """Closing a session while the tier it flushes from did not answer failed with -32603 (and promoted
    and spilled nothing else), where consolidate, and a close whose destination was down, answer with
    `degraded` (decision 14). The records stay where they are; a later close moves them."""
    with federation(tmp_path, SMALL) as stack:
        async with HTTPClient(stack.url) as router:
            [rid] = (await router.call("memory/remember", {"records": [{"content": "one turn", "session": "w"}]}))["ids"]
            stack.tiers["working"].pause()
            try:
                closed = await router.call("memory/session/close", {"session": "w"})
            finally:
                stack.tiers["working"].resume()
            assert closed["degraded"] == ["working"] and closed["flushed"] == 0 and closed["closed"] == "w"
            await asyncio.sleep(1.0)  # past the backoff
            assert (await router.call("memory/session/close", {"session": "w"}))["flushed"] == 1
        assert [r["id"] for r in (await where_is(stack, None, ["episodic"]))["episodic"]] == [rid]


@pytest.mark.anyio
async def test_episodic_hung_mid_spill_loses_nothing_and_consolidate_repairs(tmp_path: Path) -> None:
    with federation(tmp_path, SMALL) as stack:
        async with HTTPClient(stack.url) as router:
            ids = []
            for i in range(8):
                ids += (await router.call("memory/remember", {"records": [{"content": f"t{i}", "session": "c"}]}))["ids"]
            stack.tiers["episodic"].pause()
            try:
                for i in range(8, 20):  # every spill fails (timeout, then backoff): the writes still land
                    ids += (await router.call("memory/remember", {"records": [{"content": f"t{i}", "session": "c"}]}))["ids"]
            finally:
                stack.tiers["episodic"].resume()
            await asyncio.sleep(0.3)  # the resumed tier finishes the writes it had queued
            placement = await where_is(stack, None, ["working", "episodic"])
            held = {r["id"] for records in placement.values() for r in records}
            assert set(ids) <= held  # duplicated (a write landed after its timeout), never lost
            assert len(placement["working"]) >= 8
            # A move interrupted after its write leaves the same id in working and episodic.
            async with HTTPClient(stack.tiers["episodic"].url) as episodic:
                victim = placement["working"][0]
                copy = {k: v for k, v in victim.items() if k not in ("tier", "score") and v is not None}
                await episodic.call("memory/remember", {"records": [copy]})
            await asyncio.sleep(0.5)  # past the backoff
            result = await router.call("memory/consolidate", {})
            assert result["repaired"] >= 1
            placement = await where_is(stack, None, ["working", "episodic"])
            where = exactly_once(placement, ids)
            assert len(placement["working"]) == 8 and where[victim["id"]] == "episodic"
            replay = (await router.call("memory/timeline", {"where": {"session": "c"}}))["records"]
            assert [r["id"] for r in replay] == ids


@pytest.mark.anyio
async def test_auth_token_a_never_sees_b(tmp_path: Path) -> None:
    top = {"auth": {"tokens": {"tok-alice": "alice", "tok-bob": "bob"}}}
    with federation(tmp_path, SMALL, top=top) as stack:
        async with HTTPClient(stack.url, token="tok-alice") as alice, HTTPClient(stack.url, token="tok-bob") as bob:
            bob_head = (await bob.call("memory/events", {}))["cursor"]
            await alice.call("memory/remember", {"records": [
                {"content": "zqsecret alice's diary", "key": "diary", "session": "a"},
                {"content": "zqsecret alice deep", "tier": "episodic"}]})
            mine = await alice.call("memory/recall", {"query": "zqsecret"})
            assert len(mine["records"]) == 2 and all(r["owner"] == "alice" for r in mine["records"])
            assert (await bob.call("memory/recall", {"query": "zqsecret"}))["records"] == []
            assert (await bob.call("memory/timeline", {}))["records"] == []
            assert (await bob.call("memory/fetch", {"key": "diary"}))["record"] is None
            assert (await bob.call("memory/events", {"cursor": bob_head}))["events"] == []
            assert (await bob.call("memory/session/list", {}))["sessions"] == []
            with pytest.raises(A2MError) as denied:
                await bob.call("memory/recall", {"query": "zqsecret", "owner": "alice"})
            assert denied.value.code == -32005
            assert (await bob.call("memory/forget", {"query": "zqsecret"}))["forgotten"] == 0
            assert len((await alice.call("memory/timeline", {}))["records"]) == 2
        async with HTTPClient(stack.url) as anonymous:
            with pytest.raises(Unavailable) as refused:
                await anonymous.call("memory/recall", {"query": "zqsecret"})
            assert refused.value.data["status"] == 401
