"""Fusion never compares raw tier scores: RRF by rank, rerank by one scorer over the pool."""

from __future__ import annotations

from a2m.records import Record
from router import fusion


def rec(id_: str, content: str = "", created_at: str = "2026-01-01T00:00:00.000Z", score: float = 0.5,
        **kw) -> Record:
    return Record(id=id_, content=content, created_at=created_at, score=score, **kw)


def test_rrf_interleaves_by_rank_ignoring_raw_scores() -> None:
    lists = {
        "a": [rec("a1", score=0.99), rec("a2", score=0.98), rec("a3", score=0.97)],
        "b": [rec("b1", score=0.01, created_at="2026-01-02T00:00:00.000Z"), rec("b2", score=0.005)],
    }
    fused = fusion.rrf(lists, k=60)
    assert [r.id for r in fused] == ["b1", "a1", "a2", "b2", "a3"]  # equal ranks: the newer first, then stable
    scores = [r.score for r in fused]
    assert scores == sorted(scores, reverse=True) and scores[0] == 1.0 and all(0 < s <= 1 for s in scores)


def test_duplicates_keep_the_deeper_copy() -> None:
    lists = {"working": [rec("x", tier="working"), rec("w")], "episodic": [rec("x", tier="episodic")]}
    fused = fusion.rrf(lists, depth={"working": 0, "episodic": 1})
    assert sorted(r.id for r in fused) == ["w", "x"]
    assert next(r for r in fused if r.id == "x").tier == "episodic"


def test_recency_without_query() -> None:
    lists = {"a": [rec("old", created_at="2026-01-01T00:00:00.000Z")],
             "b": [rec("new", created_at="2026-03-01T00:00:00.000Z"), rec("mid", created_at="2026-02-01T00:00:00.000Z")]}
    assert [r.id for r in fusion.recency(lists)] == ["new", "mid", "old"]


def test_rerank_scores_the_pool_with_one_scorer() -> None:
    lists = {
        "working": [rec("w1", "the weather is nice today", score=0.9), rec("w2", "parrots can talk", score=0.8)],
        "semantic": [rec("s1", "my parrot is called Kiwi and the parrot talks", score=0.1)],
    }
    fused = fusion.rerank(lists, query="parrot", vector=None, weights={"text": 1, "vector": 1, "recency": 0, "salience": 0},
                          now=0)
    assert [r.id for r in fused] == ["s1", "w2"]  # w1 shares no term: not relevant, left out
    assert all(0 <= r.score <= 1 for r in fused)


def test_rerank_uses_cosine_when_vectors_exist() -> None:
    lists = {"a": [rec("near", "alpha", embedding=[1.0, 0.0]), rec("far", "alpha", embedding=[0.0, 1.0])]}
    fused = fusion.rerank(lists, query="alpha", vector=[1.0, 0.1],
                          weights={"text": 0.5, "vector": 0.5, "recency": 0, "salience": 0})
    assert [r.id for r in fused] == ["near", "far"]
    pool = [rec("same", "x", embedding=[2.0, 0.0]), rec("opposite", "x", embedding=[-1.0, 0.0]),
            rec("narrow", "x", embedding=[1.0]), rec("zero", "x", embedding=[0.0, 0.0]), rec("none", "x")]
    # a vector of another width, a zero vector or none gives no vector signal; a negative cosine gives 0
    assert fusion._cosines(pool, [1.0, 0.0]) == {0: 1.0, 1: 0.0}  # by position in the pool


def test_rerank_scores_text_like_a_bm25_index_over_the_pool() -> None:
    from a2m.text import BM25

    texts = {"a": "deploy the release to production", "b": "the release notes of the deploy",
             "c": "lunch with the team", "d": "release release release"}
    index = BM25()
    for doc_id, text in texts.items():
        index.add(doc_id, text)
    expected = index.scores("release deploy")
    top = max(expected.values())
    fused = fusion.rerank({"t": [rec(i, t) for i, t in texts.items()]}, query="release deploy", vector=None,
                          weights={"text": 1, "recency": 0, "salience": 0}, now=0)
    assert {r.id: round(r.score, 9) for r in fused} == {i: round(s / top, 9) for i, s in expected.items()}


def test_rerank_keeps_a_tiers_own_pick_when_rank_is_weighed() -> None:
    # the episodic tier's second hit holds no query word (a session neighbour it lent score to)
    lists = {"episodic": [rec("q", "did you finish the pottery class"), rec("a", "yes, a blue bowl")],
             "semantic": [rec("s", "pottery is fun, pottery is messy")]}
    weights = {"text": 0.25, "vector": 0.2, "rank": 0.45, "recency": 0, "salience": 0}
    fused = [r.id for r in fusion.rerank(lists, query="pottery", vector=None, weights=weights, now=0)]
    assert "a" in fused and fused.index("q") < fused.index("a")
    assert "a" not in [r.id for r in fusion.rerank(lists, query="pottery", vector=None,
                                                  weights={**weights, "rank": 0}, now=0)]


def test_limit_and_min_score_cut_the_fused_order_without_reordering_it() -> None:
    lists = {"a": [rec(f"a{i}", f"deploy note {i}", created_at=f"2026-01-0{i + 1}T00:00:00.000Z") for i in range(5)],
             "b": [rec(f"b{i}", "deploy deploy" if i == 0 else f"lunch {i}") for i in range(3)]}
    strategies = {
        "rrf": lambda **kw: fusion.rrf(lists, k=60, **kw),
        "rerank": lambda **kw: fusion.rerank(lists, query="deploy", vector=None, now=0,
                                             weights={"text": 1, "rank": 0.5, "recency": 0.1, "salience": 0}, **kw),
        "recency": lambda **kw: fusion.recency(lists, **kw)}
    for name, fuse in strategies.items():
        full = [(r.id, r.score) for r in fuse()]
        assert len(full) >= 5, name
        assert [(r.id, r.score) for r in fuse(limit=3)] == full[:3], name
        cut = full[2][1]
        assert [(r.id, r.score) for r in fuse(min_score=cut)] == [p for p in full if p[1] >= cut], name
        assert [(r.id, r.score) for r in fuse(min_score=cut, limit=1)] == full[:1], name


def test_describe_names_the_metric_every_store_shares() -> None:
    """`embeddings.metric` said cosine even where a mounted store ranks by dot product only."""
    from router.server import shared_metrics

    assert shared_metrics([]) == ("cosine", ["cosine"])
    assert shared_metrics([["cosine", "dot"], ["cosine"]]) == ("cosine", ["cosine"])
    assert shared_metrics([["dot"], ["cosine", "dot"]]) == ("dot", ["dot"])
    assert shared_metrics([["dot"], ["cosine"]]) == (None, [])


def test_a_tier_apart_keeps_the_ids_another_tier_holds_too() -> None:
    """An id in two tiers is an interrupted move's two copies, one kept; a tier `apart` (a mounted
    corpus, in no move) shares an id with another as another record: both are kept, and ranked apart."""
    lists = {"kb1": [rec("1", "refund policy", embedding=[1.0, 0.0], tier="kb1")],
             "kb2": [rec("1", "refund window", embedding=[0.0, 1.0], tier="kb2"), rec("2", "shipping", tier="kb2")],
             "working": [rec("2", "shipping", tier="working")]}
    for fused in (fusion.rrf(lists, apart={"kb1", "kb2"}), fusion.recency(lists, apart={"kb1", "kb2"}),
                  fusion.rerank(lists, query="refund", vector=[1.0, 0.0], apart={"kb1", "kb2"},
                                weights={"text": 0.5, "vector": 0.5, "recency": 0, "salience": 0})):
        assert sorted((r.tier, r.id) for r in fused if r.id == "1") == [("kb1", "1"), ("kb2", "1")], fused
    assert [r.content for r in fusion.rerank(lists, query="refund", vector=[1.0, 0.0], apart={"kb1", "kb2"},
                                             weights={"text": 0.5, "vector": 0.5})][:2] == \
        ["refund policy", "refund window"]
    assert sorted(r.id for r in fusion.rrf(lists)) == ["1", "2"]  # without: one copy of each, as a move's
