"""The real `backends/corpus` server, over a pgvector table or a Qdrant collection this test creates,
mounted behind the router as a read-only tier: recalled and fused with the writable tiers, never
written, spilled, promoted, summarized or consolidated into; a write aimed at it answers -32004.

The writable tiers are the in-memory fixture servers (the policy under test is the router's);
the corpus tier is `a2m serve corpus` on an embedded PostgreSQL or on qdrant-client's local mode,
and the table (row for row) or the collection's files (byte for byte) are checked behind both
servers' backs.
"""

from __future__ import annotations

import uuid
from contextlib import ExitStack
from typing import Any, Callable, Iterator

import pytest

from a2m.client import HTTPClient
from a2m.errors import A2MError
from backends.episodic.embedded import EmbeddedPostgres

from tests.support.corpora import (COLLECTION_ARGS, DOCS, TABLE_ARGS, UUID_ID, make_collection, make_table, table_rows,
                                   tree_digest)

from .stack import Stack, federation

@pytest.fixture(scope="module", params=["pgvector-table", "qdrant-collection"])
def corpus_stack(request: pytest.FixtureRequest,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, Callable[[], Any]]]:
    """The stack with the corpus mounted, and a snapshot of the corpus read behind its server's back."""
    with ExitStack() as cleanup:
        if request.param == "pgvector-table":
            pg = EmbeddedPostgres(tmp_path_factory.mktemp("corpus-pg"))
            dsn = pg.start()
            cleanup.callback(pg.stop)
            make_table(dsn)
            args, snapshot = ["--url", dsn, *TABLE_ARGS], lambda: table_rows(dsn)
        else:
            path = tmp_path_factory.mktemp("corpus-qdrant")
            make_collection(path)
            args, snapshot = ["--url", str(path), *COLLECTION_ARGS, "--option", "metadata_fields=source"], \
                lambda: tree_digest(path)
        corpus = {"name": "kb", "kind": "semantic", "read_only": True, "engine": "corpus", "serve": "real",
                  "args": args}
        tiers = [
            {"name": "working", "kind": "working", "capacity": 4, "spill_to": "episodic", "timeout": 5.0},
            {"name": "episodic", "kind": "episodic", "spill_to": "semantic", "promote_to": "semantic",
             "promote_after": 2},
            {"name": "semantic", "kind": "semantic"},
            corpus,
        ]
        with federation(tmp_path_factory.mktemp("router-corpus"), tiers, mode="fixture",
                        top={"background_promotion": False}) as stack:
            yield stack, snapshot


def owner() -> str:
    return "owner-" + uuid.uuid4().hex[:8]


@pytest.mark.anyio
async def test_corpus_is_described_read_only_and_recalled_fused_with_the_conversation(corpus_stack) -> None:  # type: ignore[no-untyped-def]
    stack, _ = corpus_stack
    me = owner()
    async with HTTPClient(stack.url) as router:
        layout = {t["name"]: t for t in (await router.call("memory/describe", {}))["tiers"]}
        assert layout["kb"]["read_only"] is True and layout["kb"]["status"] == "up"
        assert layout["kb"]["shared"] is True and "shared" not in layout["working"]  # not partitioned by owner
        assert layout["kb"]["count"] == len(DOCS)
        said = (await router.call("memory/remember", {"owner": me, "records": [
            {"content": "the customer asked about refunds for a broken kettle", "session": "s1"}]}))["ids"]
        for strategy in ("rrf", "rerank"):
            hits = (await router.call("memory/recall", {"owner": me, "query": "refunds", "limit": 10,
                                                        "fusion": strategy}))["records"]
            tiers = {h["tier"] for h in hits}
            assert {"working", "kb"} <= tiers, (strategy, hits)
            assert said[0] in {h["id"] for h in hits}
            from_corpus = [h for h in hits if h["tier"] == "kb"]
            assert any(h["content"].startswith("Refunds") for h in from_corpus)
            assert {h["metadata"]["source"] for h in from_corpus} == {"policy"}
            assert all(0.0 <= h["score"] <= 1.0 for h in hits)
        # A caller vector reaches the corpus (it searches vectors): nearest first.
        near = (await router.call("memory/recall", {"owner": me, "embedding": [0.0, 1.0, 0.0, 0.1],
                                                    "tier": "kb", "limit": 2}))["records"]
        assert [h["metadata"]["source"] for h in near] == ["shipping", "shipping"]
        # Scope selectors pass down to the mounted tier too.
        policy = (await router.call("memory/timeline", {"owner": me, "tier": "kb",
                                                        "where": {"source": "policy"}}))["records"]
        assert len(policy) == 2 and {r["tier"] for r in policy} == {"kb"}


@pytest.mark.anyio
async def test_writes_aimed_at_the_corpus_answer_read_only(corpus_stack) -> None:  # type: ignore[no-untyped-def]
    stack, snapshot = corpus_stack
    me = owner()
    before = snapshot()
    async with HTTPClient(stack.url) as router:
        some_id = (await router.call("memory/recall", {"owner": me, "query": "shipping", "tier": "kb"}))["records"][0]["id"]
        mine = (await router.call("memory/remember", {"owner": me, "records": [{"content": "a note"}]}))["ids"]
        attempts = [
            ("memory/remember", {"records": [{"content": "x", "tier": "kb"}]}),
            ("memory/remember", {"records": [{"content": "ok"}, {"content": "x", "tier": "kb"}]}),
            ("memory/forget", {"ids": [some_id], "tier": "kb"}),
            ("memory/promote", {"ids": mine, "tier": "kb"}),
            ("memory/summarize", {"tier": "working", "into": "kb"}),
        ]
        for method, params in attempts:
            with pytest.raises(A2MError) as err:
                await router.call(method, {"owner": me, **params})
            assert err.value.code == -32004, (method, err.value)
            assert "kb" in str(err.value)
        # The mixed batch was refused whole: nothing of it landed in a writable tier either.
        assert not (await router.call("memory/recall", {"owner": me, "query": "ok"}))["records"]
    assert snapshot() == before


@pytest.mark.anyio
async def test_the_corpus_is_never_spilled_promoted_or_consolidated_into(corpus_stack) -> None:  # type: ignore[no-untyped-def]
    stack, snapshot = corpus_stack
    me = owner()
    before = snapshot()
    async with HTTPClient(stack.url) as router:
        ids = []
        for turn in range(12):  # capacity 4: eight of these spill as they arrive
            ids += (await router.call("memory/remember", {"owner": me, "records": [
                {"content": f"turn {turn}: shipping to Italy and refunds again", "session": "long"}]}))["ids"]
        for _ in range(3):  # episodic promote_after = 2: recalled records are promoted on consolidate
            await router.call("memory/recall", {"owner": me, "query": "shipping Italy refunds", "limit": 20})
        closed = await router.call("memory/session/close", {"session": "long", "owner": me})
        done = await router.call("memory/consolidate", {"owner": me})
        assert closed["promoted"] + done["promoted"] > 0
        placed = (await router.call("memory/timeline", {"owner": me, "where": {"session": "long"}}))["records"]
        assert [r["id"] for r in placed] == ids and "kb" not in {r["tier"] for r in placed}
        assert "semantic" in {r["tier"] for r in placed}  # promoted somewhere writable
        # A query-wide forget fans out to writable tiers only: the corpus keeps its matches.
        forgotten = (await router.call("memory/forget", {"owner": me, "query": "shipping"}))["forgotten"]
        assert forgotten >= 1
        still = (await router.call("memory/recall", {"owner": me, "query": "shipping", "limit": 20}))["records"]
        assert {h["tier"] for h in still} == {"kb"}
        layout = {t["name"]: t for t in (await router.call("memory/describe", {"owner": me}))["tiers"]}
        assert layout["kb"]["count"] == len(DOCS)
    async with HTTPClient(stack.tiers["kb"].url) as corpus:
        assert len((await corpus.call("memory/timeline", {"limit": 0}))["records"]) == len(DOCS)
    assert snapshot() == before


@pytest.fixture(scope="module")
def two_corpora(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The same four documents in a pgvector table (ids 1..4) and a Qdrant collection (ids 1, 3, 4 and
    a UUID), both mounted: two RAGs whose ids overlap, as two tables keyed 1..N do."""
    with ExitStack() as cleanup:
        pg = EmbeddedPostgres(tmp_path_factory.mktemp("corpus-pg"))
        dsn = pg.start()
        cleanup.callback(pg.stop)
        make_table(dsn)
        path = tmp_path_factory.mktemp("corpus-qdrant")
        make_collection(path)
        mounted = {"kind": "semantic", "read_only": True, "engine": "corpus", "serve": "real"}
        tiers = [
            {"name": "working", "kind": "working", "capacity": 4, "spill_to": "semantic", "timeout": 5.0},
            {"name": "semantic", "kind": "semantic"},
            {**mounted, "name": "kb_pg", "args": ["--url", dsn, *TABLE_ARGS]},
            {**mounted, "name": "kb_qd", "args": ["--url", str(path), *COLLECTION_ARGS]},
        ]
        with federation(tmp_path_factory.mktemp("router-two-corpora"), tiers, mode="fixture") as stack:
            yield stack


@pytest.mark.anyio
async def test_two_corpora_sharing_ids_are_both_recalled(two_corpora: Stack) -> None:
    """The router drops an id found in two tiers as an interrupted move's second copy. A mounted corpus
    takes part in no move, so its id shared with another corpus is another record: the one listed
    later in router.toml was hidden from every recall and timeline, without a word."""
    me = owner()
    async with HTTPClient(two_corpora.url) as router:
        [said] = (await router.call("memory/remember", {"owner": me, "records": [
            {"content": "the customer asked about refunds for a broken kettle"}]}))["ids"]
        for asked in ({"query": "refunds"}, {"query": "refunds", "fusion": "rerank"},
                      {"embedding": DOCS[0][2]}, {"embedding": DOCS[0][2], "fusion": "rerank"}, {}):
            hits = (await router.call("memory/recall", {"owner": me, "limit": 20, **asked}))["records"]
            refunds = sorted((h["tier"], h["id"]) for h in hits if h["content"] == DOCS[0][0])
            assert refunds == [("kb_pg", "1"), ("kb_qd", "1")], (asked, hits)
            assert said in {h["id"] for h in hits if h["tier"] == "working"} or "query" not in asked
        listed = (await router.call("memory/timeline", {"owner": me, "limit": 0}))["records"]
        by_tier = {tier: sorted(r["id"] for r in listed if r["tier"] == tier) for tier in ("kb_pg", "kb_qd")}
        assert by_tier == {"kb_pg": ["1", "2", "3", "4"], "kb_qd": sorted(["1", "3", "4", UUID_ID])}, listed
