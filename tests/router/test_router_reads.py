"""The router's read paths and what they report, on real tier servers (and one read-only fixture
tier that says so only in its own describe): which copy of a duplicated record a read shows, what a
vector-only recall ranks, which errors are the caller's, and the events a call leaves."""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest

from a2m.client import HTTPClient
from a2m.errors import A2MError

from .stack import Stack, federation, new_owner as owner, tier_call as direct

# `quiet` is read-only on its own server only: router.toml does not say so.
QUIET = {"name": "quiet", "kind": "semantic", "serve": "fixture", "seed_read_only": True}
TIERS = [
    {"name": "working", "kind": "working", "capacity": 32, "spill_to": "episodic", "timeout": 2.0},
    {"name": "episodic", "kind": "episodic", "spill_to": "semantic", "promote_to": "semantic", "timeout": 2.0},
    {"name": "semantic", "kind": "semantic", "timeout": 2.0},
    QUIET,
]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with federation(tmp_path_factory.mktemp("reads"), TIERS, mode="real") as running:
        yield running


@pytest.mark.anyio
async def test_a_duplicated_record_reads_as_its_newer_revision(stack: Stack) -> None:
    """Same id in working (revision 3) and episodic (revision 1), as an interrupted move can leave
    it: recall, timeline and fetch all show revision 3, the copy repair keeps."""
    me = owner()
    await direct(stack, "episodic", "memory/remember", {"owner": me, "records": [
        {"id": "x", "key": "user/city", "content": "the user lives in Bologna", "revision": 1}]})
    await direct(stack, "working", "memory/remember", {"owner": me, "records": [
        {"id": "x", "key": "user/city", "content": "the user lives in Milan", "revision": 3}]})
    async with HTTPClient(stack.url) as router:
        for fusion in ("rrf", "rerank"):
            hits = (await router.call("memory/recall", {"owner": me, "query": "where does the user live",
                                                        "fusion": fusion}))["records"]
            assert [(h["id"], h["revision"]) for h in hits] == [("x", 3)], fusion
        timeline = (await router.call("memory/timeline", {"owner": me}))["records"]
        assert [(r["id"], r["revision"], r["tier"]) for r in timeline] == [("x", 3, "working")]
        assert (await router.call("memory/fetch", {"owner": me, "key": "user/city"}))["record"]["revision"] == 3


@pytest.mark.anyio
async def test_a_vector_only_recall_asks_only_the_tiers_that_rank_by_vector(stack: Stack) -> None:
    """working keeps caller vectors but does not search by them: asked, it would answer with its
    newest records, and rank fusion would put them first."""
    me = owner()
    near, far = [1.0] + [0.0] * 7, [0.0] * 7 + [1.0]
    async with HTTPClient(stack.url) as router:
        await router.call("memory/remember", {"owner": me, "records": [
            {"content": "the near one", "embedding": near, "tier": "episodic"}]})
        await router.call("memory/remember", {"owner": me, "records": [
            {"content": f"far {i}", "embedding": far} for i in range(3)]})
        for fusion in ("rrf", "rerank"):
            hits = (await router.call("memory/recall", {"owner": me, "embedding": near, "limit": 1,
                                                        "fusion": fusion}))["records"]
            assert [h["content"] for h in hits] == ["the near one"], fusion
        asked = (await router.call("memory/recall", {"owner": me, "embedding": near, "tier": "working"}))["records"]
        assert len(asked) == 3  # a tier named outright is still asked


@pytest.mark.anyio
async def test_a_vector_of_the_wrong_width_is_the_callers_error_even_before_the_router_knows_the_width(
        tmp_path: Path) -> None:
    tiers = [{"name": "working", "kind": "working"}, {"name": "episodic", "kind": "episodic", "timeout": 2.0}]
    with federation(tmp_path, tiers, mode="real") as fresh:
        # the first vectors reach episodic behind this router's back (another router, an import)
        await direct(fresh, "episodic", "memory/remember", {"records": [{"content": "v", "embedding": [0.1] * 8}]})
        async with HTTPClient(fresh.url) as router:
            with pytest.raises(A2MError) as refused:
                await router.call("memory/recall", {"embedding": [0.1] * 5})
    assert refused.value.code == -32008


@pytest.mark.anyio
async def test_written_events_carry_the_revision_an_import_stored(stack: Stack) -> None:
    me = owner()
    async with HTTPClient(stack.url) as router:
        await router.call("memory/remember", {"owner": me, "records": [{"key": "k1", "content": "one"}]})
        cursor = (await router.call("memory/events", {"owner": me}))["cursor"]
        await router.call("memory/remember", {"owner": me, "records": [{"key": "k1", "content": "seven", "revision": 7}]})
        await router.call("memory/remember", {"owner": me, "records": [{"key": "k1", "content": "two", "revision": 2}]})
        await router.call("memory/remember", {"owner": me, "records": [{"key": "k1", "content": "eight"}]})
        events = (await router.call("memory/events", {"owner": me, "cursor": cursor, "kinds": ["written"]}))["events"]
        assert [e["revision"] for e in events] == [7, 8]  # the older import changed nothing: no event
        assert (await router.call("memory/fetch", {"owner": me, "key": "k1"}))["record"]["content"] == "eight"


@pytest.mark.anyio
async def test_one_promote_call_is_one_promoted_event(stack: Stack) -> None:
    me = owner()
    async with HTTPClient(stack.url) as router:
        a = (await router.call("memory/remember", {"owner": me, "records": [{"content": "in working"}]}))["ids"]
        b = (await router.call("memory/remember", {"owner": me, "records": [
            {"content": "in episodic", "tier": "episodic"}]}))["ids"]
        cursor = (await router.call("memory/events", {"owner": me}))["cursor"]
        done = await router.call("memory/promote", {"owner": me, "ids": a + b, "tier": "semantic"})
        events = (await router.call("memory/events", {"owner": me, "cursor": cursor, "kinds": ["promoted"]}))["events"]
    assert done == {"promoted": 2}
    assert [sorted(e["ids"]) for e in events] == [sorted(a + b)]


@pytest.mark.anyio
async def test_a_tier_that_says_it_is_read_only_is_treated_so(stack: Stack) -> None:
    me = owner()
    async with HTTPClient(stack.url) as router:
        layout = {t["name"]: t for t in (await router.call("memory/describe", {"owner": me}))["tiers"]}
        assert layout["quiet"]["read_only"] is True
        await router.call("memory/remember", {"owner": me, "records": [{"content": "zqro a note"}]})
        assert (await router.call("memory/forget", {"owner": me, "query": "zqro"}))["forgotten"] == 1
        with pytest.raises(A2MError) as refused:
            await router.call("memory/remember", {"owner": me, "records": [{"content": "x", "tier": "quiet"}]})
        assert refused.value.code == -32004


@pytest.mark.anyio
async def test_summarize_into_a_tier_does_not_land_where_its_key_lives(stack: Stack) -> None:
    me = owner()
    async with HTTPClient(stack.url) as router:
        ids = (await router.call("memory/remember", {"owner": me, "records": [
            {"content": "met Anna in Rome on 3 May 2023"}, {"content": "an earlier digest", "key": "sum/1"}]}))["ids"]
        ids = ids[:1]  # the key holds no source: a summary never replaces one of its sources
        with pytest.raises(A2MError) as refused:
            await router.call("memory/summarize", {"owner": me, "ids": ids, "into": "episodic", "key": "sum/1"})
        assert refused.value.code == -32602 and refused.value.data["tier"] == "working"
        written = await router.call("memory/summarize", {"owner": me, "ids": ids, "key": "sum/1"})
        assert written["written"] == 1 and written["records"][0]["tier"] == "working"



@pytest.mark.anyio
async def test_a_recall_transcript_shows_turns_written_together_in_the_order_written(stack: Stack) -> None:
    """A question and its answer written in one call share their `created_at`; a router recall's
    transcript showed them in rank order (the answer, the better hit, first), as a tier server no
    longer does. It shows them as timeline replays them; the facts style keeps the rank order."""
    me = owner()
    async with HTTPClient(stack.url) as router:
        for tier in ("working", "episodic"):
            ids = (await router.call("memory/remember", {"owner": me, "records": [
                {"content": f"which city is the capital of Italy, {tier}?", "role": "user", "tier": tier},
                {"content": "Rome: Rome is the capital city of Italy, and Rome is large.", "role": "assistant",
                 "tier": tier}]}))["ids"]
            for fusion in ("rrf", "rerank"):
                asked = {"owner": me, "query": "Rome capital city", "tier": tier, "fusion": fusion, "touch": False}
                result = await router.call("memory/recall", {**asked, "prompt": {"style": "transcript"}})
                assert [r["id"] for r in result["records"]] == ids[::-1], (tier, fusion)  # the answer ranks first
                assert result["prompt_ids"] == ids, (tier, fusion)
                assert result["prompt"].split("\n")[0].startswith("user: which city"), (tier, fusion)
                facts = await router.call("memory/recall", {**asked, "prompt": {"style": "facts"}})
                assert facts["prompt_ids"] == ids[::-1], (tier, fusion)



@pytest.mark.anyio
async def test_a_tier_read_only_by_its_own_word_stays_marked_while_it_is_down(tmp_path: Path) -> None:
    """describe marked `quiet` read-only only while it answered: down, the layout said
    `read_only: false` (router.toml's word alone), though the router still refused to write there."""
    with federation(tmp_path, [{"name": "working", "kind": "working"}, QUIET], mode="real") as fresh:
        async with HTTPClient(fresh.url) as router:
            up = {t["name"]: t for t in (await router.call("memory/describe", {}))["tiers"]}
            assert up["quiet"]["read_only"] is True and up["quiet"]["status"] == "up"
            fresh.tiers["quiet"].kill()
            described = await router.call("memory/describe", {})
            down = {t["name"]: t for t in described["tiers"]}
            assert described["degraded"] == ["quiet"] and down["quiet"]["status"] == "down"
            assert down["quiet"]["read_only"] is True and down["working"]["read_only"] is False
            # a read whose `where.tier` rules the down tier out does not name it as left out
            for method in ("memory/recall", "memory/timeline"):
                assert "degraded" not in await router.call(method, {"where": {"tier": "working"}})
            # every answer that left it out is counted for it in /metrics, fetch, session/list and describe too
            before = _degraded_calls(fresh.url, "quiet")
            for method, params in (("memory/recall", {"query": "x"}), ("memory/timeline", {}),
                                   ("memory/fetch", {"key": "k"}), ("memory/session/list", {}),
                                   ("memory/describe", {})):
                assert (await router.call(method, params))["degraded"] == ["quiet"], method
            assert _degraded_calls(fresh.url, "quiet") == before + 5
            with pytest.raises(A2MError) as refused:
                await router.call("memory/remember", {"records": [{"content": "x", "tier": "quiet"}]})
            assert refused.value.code == -32004


def _degraded_calls(url: str, tier: str) -> float:
    """The router's `a2m_router_degraded_calls` counter for `tier`, read from its /metrics."""
    with urllib.request.urlopen(url.rstrip("/") + "/metrics", timeout=5) as response:
        text = response.read().decode()
    found = re.search(rf'^a2m_router_degraded_calls_total{{tier="{tier}"}} (\S+)$', text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


# `facts` is the router's name for a tier server that calls itself `semantic` (a renamed tier, a
# mounted corpus under a name of the config's choosing); the router declares a larger
# max_recall_limit than the tiers' 1000.
RENAMED = [
    {"name": "working", "kind": "working", "timeout": 5.0},
    {"name": "facts", "kind": "semantic", "timeout": 5.0, "args": ["--name", "semantic"]},
]


@pytest.fixture(scope="module")
def renamed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with federation(tmp_path_factory.mktemp("renamed"), RENAMED, mode="real",
                    top={"limits": {"max_recall_limit": 1500}}) as running:
        yield running


@pytest.mark.anyio
async def test_a_timeline_longer_than_a_tiers_max_recall_limit_reads_it_in_pages(renamed: Stack) -> None:
    """The router declares max_recall_limit 1500, its tiers 1000. A timeline asked each tier for the
    whole limit (by default, the router's cap), every tier refused it, and the answer was empty with
    every tier `degraded`; it now reads a tier past its cap a page at a time."""
    me = owner()
    async with HTTPClient(renamed.url) as router:
        older = (await router.call("memory/remember", {"owner": me, "records": [
            {"content": f"fact {i}", "tier": "facts"} for i in range(3)]}))["ids"]
        turns: list[str] = []
        for start in (0, 600):
            turns += (await router.call("memory/remember", {"owner": me, "records": [
                {"content": f"turn {i}", "role": "user"} for i in range(start, start + 600)]}))["ids"]
        everything = await router.call("memory/timeline", {"owner": me})
        assert "degraded" not in everything
        assert [r["id"] for r in everything["records"]] == older + turns
        recent = await router.call("memory/timeline", {"owner": me, "limit": 1100})
        assert [r["id"] for r in recent["records"]] == turns[-1100:]
        assert len((await router.call("memory/recall", {"owner": me, "limit": 1500}))["records"]) == 1000 + 3


@pytest.mark.anyio
async def test_where_tier_names_the_tier_as_the_router_calls_it(renamed: Stack) -> None:
    """`where: {tier}` went down to every tier as it was, and each tier server tests it against its own
    name: a tier the router calls `facts` but which calls itself `semantic` matched nothing, though
    the router shows its records with `tier: "facts"`."""
    me = owner()
    async with HTTPClient(renamed.url) as router:
        ids = {}
        for tier in ("working", "facts"):
            ids[tier] = (await router.call("memory/remember", {"owner": me, "records": [
                {"content": f"zebra note kept in {tier}", "tier": tier}]}))["ids"][0]
        for method, params in (("memory/recall", {"query": "zebra"}), ("memory/recall", {}),
                               ("memory/timeline", {})):
            for where, expected in (({"tier": "facts"}, ["facts"]), ({"tier": ["facts", "working"]}, ["facts", "working"]),
                                    ({"tier": "semantic"}, []), ({"tier": "working"}, ["working"])):
                got = (await router.call(method, {"owner": me, "where": where, **params}))["records"]
                assert sorted((r["tier"], r["id"]) for r in got) == [(t, ids[t]) for t in expected], (method, where)
        # and a forget: by the router's name it deletes there, by the server's own name nothing
        assert (await router.call("memory/forget", {"owner": me, "where": {"tier": "semantic"}}))["forgotten"] == 0
        assert (await router.call("memory/forget", {"owner": me, "where": {"tier": "facts"}}))["forgotten"] == 1
        left = (await router.call("memory/timeline", {"owner": me}))["records"]
        assert [(r["tier"], r["id"]) for r in left] == [("working", ids["working"])]


@pytest.mark.anyio
async def test_a_timeline_cursor_pages_the_one_tier_it_names(stack: Stack) -> None:
    """1,200 records of one millisecond in episodic, read through the router by the tier's cursor
    (a walk by time stops there: one timeline holds 1,000). A cursor covers one tier only."""
    me, stamp = owner(), "2026-03-01T00:00:00.000Z"
    ids: list[str] = []
    for start in (0, 600):
        ids += (await direct(stack, "episodic", "memory/remember", {"owner": me, "records": [
            {"content": f"note {i}", "created_at": stamp} for i in range(start, start + 600)]}))["ids"]
    async with HTTPClient(stack.url) as router:
        read: list[str] = []
        cursor: object = True
        while cursor is not None:
            answer = await router.call("memory/timeline", {"owner": me, "tier": "episodic", "limit": 500,
                                                           "cursor": cursor})
            read[:0] = [r["id"] for r in answer["records"]]
            cursor = answer["cursor"]
            if cursor is not None:
                last = cursor
        assert read == ids
        # Over several tiers: `true` is answered without one (page by time), a tier's cursor refused.
        assert "cursor" not in await router.call("memory/timeline", {"owner": me, "limit": 5, "cursor": True})
        for params in ({"cursor": last}, {"tier": "episodic", "cursor": "not one"},
                       {"tier": "episodic", "cursor": 3}):
            with pytest.raises(A2MError) as refused:
                await router.call("memory/timeline", {"owner": me, **params})
            assert refused.value.code == -32602, params
        # A tier without the extension answers none: its reader pages by time.
        assert "cursor" not in await router.call("memory/timeline", {"owner": me, "tier": "quiet", "cursor": True})
        # A tier the scope cannot match is not asked: nothing before, null.
        assert (await router.call("memory/timeline", {"owner": me, "tier": "episodic", "cursor": True,
                                                      "where": {"tier": "working"}}))["cursor"] is None
