"""Fusing ranked lists from several tiers into one, without comparing raw scores.

Tier scores are ranking information local to one call on one server, so they
are never compared across tiers. Two strategies:

- **rrf** (default): reciprocal rank fusion. Each tier's list contributes
  1 / (k + rank); the sum is scaled by (k + 1) so a tier's best hit scores 1.0
  and `min_score` keeps a usable [0, 1] meaning. Ties (every tier's first hit)
  go to the more recent record.
- **rerank**: every candidate of the broad pool is scored by one scorer: BM25
  over the pool (so IDF is the pool's, shared by all candidates), cosine to the
  query vector where both vectors exist, its rank in its own tier's list (what
  the tier knew that the pool does not: collection-wide IDF, session
  neighbours), recency (exponential decay) and salience. Weights are
  renormalised over the signals present, so a pool without vectors is not
  penalised for it.

Without a query (and without a vector) there is nothing to rank by relevance:
both strategies order by recency, as a single tier does.
"""

from __future__ import annotations

import math
import time
from typing import AbstractSet, Any, Iterable, Mapping, Sequence

import numpy as np

from a2m.records import Record
from a2m.text import bm25_scores, cache_terms
from a2m.timefmt import to_epoch

RANK_K = 10  # rerank's tier-rank signal: 1.0 for a tier's first hit, 0.5 by its 11th


def _dedupe(lists: Mapping[str, Sequence[Record]], depth: Mapping[str, int],
            apart: AbstractSet[str] = frozenset()) -> dict[str, list[tuple[int, Record]]]:
    """Drop duplicate ids across tiers (an interrupted move), keeping the newer revision, then the
    deeper (destination) copy: the copy fetch returns and duplicate repair keeps. A tier in `apart`
    (read-only: a mounted corpus) takes part in no move, so an id it shares with another tier is
    another record (two RAGs keyed 1..N): all its records are kept."""
    best: dict[str, tuple[int, int, str]] = {}
    for tier, records in lists.items():
        if tier in apart:
            continue
        for record in records:
            rank = (record.revision, depth.get(tier, 0), tier)
            holder = best.get(record.id)
            if holder is None or rank[:2] > holder[:2]:
                best[record.id] = rank
    out: dict[str, list[tuple[int, Record]]] = {}
    for tier, records in lists.items():
        kept = records if tier in apart else [r for r in records if best[r.id][2] == tier]
        out[tier] = list(enumerate(kept))
    return out


def _top(ranked: Iterable[tuple[float, Record]], limit: int, min_score: float | None) -> list[Record]:
    """The first `limit` (0: all) of `ranked` (best first) scoring at least `min_score`, as scored
    copies: only what the caller keeps is copied (a rerank pool is ~100 candidates, a reply ~10)."""
    out: list[Record] = []
    for score, record in ranked:
        if min_score is not None and score < min_score:
            break
        out.append(record.scored(score))
        if len(out) == limit:
            break
    return out


def recency(lists: Mapping[str, Sequence[Record]], depth: Mapping[str, int] | None = None, *,
            apart: AbstractSet[str] = frozenset(), limit: int = 0, min_score: float | None = None) -> list[Record]:
    """Newest first; score 1/(1+rank) like a single tier without a query."""
    merged = [r for _, ranked in _dedupe(lists, depth or {}, apart).items() for _, r in ranked]
    merged.sort(key=lambda r: r.created_at, reverse=True)
    return _top(((1.0 / (1 + i), r) for i, r in enumerate(merged)), limit, min_score)


def rrf(lists: Mapping[str, Sequence[Record]], *, k: int = 60, depth: Mapping[str, int] | None = None,
        apart: AbstractSet[str] = frozenset(), limit: int = 0, min_score: float | None = None) -> list[Record]:
    scores: dict[tuple[str, str], float] = {}  # by (tier, id): a tier `apart` may share an id with another
    records: dict[tuple[str, str], Record] = {}
    for tier, ranked in _dedupe(lists, depth or {}, apart).items():
        for rank, record in ranked:
            held = (tier, record.id)
            scores[held] = scores.get(held, 0.0) + (k + 1) / (k + rank + 1)
            records.setdefault(held, record)
    scale = max(1.0, max(scores.values(), default=1.0))
    ordered = sorted(scores, key=lambda i: (-scores[i], _neg_time(records[i])))
    return _top(((min(1.0, scores[i] / scale), records[i]) for i in ordered), limit, min_score)


def prepare(records: Sequence[Record]) -> None:
    """Tokenize a tier's candidates into the tokenizer's cache as its reply arrives: `rerank`, run
    once the slowest tier has answered, then finds them there (tokenizing is most of its cost)."""
    cache_terms(r.content for r in records)


def _epoch(record: Record) -> float | None:
    try:
        return to_epoch(record.created_at)
    except Exception:
        return None


def _neg_time(record: Record) -> float:
    return -(_epoch(record) or 0.0)


def _numeric(vector: Any, width: int) -> bool:
    try:
        return np.asarray(vector, dtype=np.float64).shape == (width,)
    except (TypeError, ValueError):
        return False


def _cosines(pool: Sequence[Record], vector: Sequence[float]) -> dict[int, float]:
    """Position in `pool` -> max(0, cosine to `vector`) for the candidates whose embedding has its
    width, in one matrix product (a pool is ~100 vectors of 384 dims: ~4 ms as Python loops)."""
    width = len(vector)
    having = [(i, r.embedding) for i, r in enumerate(pool) if r.embedding and len(r.embedding) == width]
    if not having or not width:
        return {}
    try:
        matrix = np.asarray([v for _, v in having], dtype=np.float64)
    except (TypeError, ValueError):  # a mounted tier's vector that is not numbers: that one is left out
        having = [(i, v) for i, v in having if _numeric(v, width)]
        if not having:
            return {}
        matrix = np.asarray([v for _, v in having], dtype=np.float64)
    q = np.asarray(vector, dtype=np.float64)
    norms = np.linalg.norm(matrix, axis=1) * np.linalg.norm(q)
    with np.errstate(divide="ignore", invalid="ignore"):
        values = np.where(norms > 0, matrix @ q / norms, np.nan)
    return {i: max(0.0, float(v)) for (i, _), v in zip(having, values) if not math.isnan(v)}


def rerank(lists: Mapping[str, Sequence[Record]], *, query: str | None, vector: Sequence[float] | None,
           weights: Mapping[str, float], half_life_days: float = 30.0, now: float | None = None,
           depth: Mapping[str, int] | None = None, apart: AbstractSet[str] = frozenset(), limit: int = 0,
           min_score: float | None = None) -> list[Record]:
    kept = _dedupe(lists, depth or {}, apart)
    # Scores are kept by position in the pool: a tier `apart` may hold an id another tier holds too.
    pool = [r for _, ranked in kept.items() for _, r in ranked]
    tier_rank = [(RANK_K + 1) / (RANK_K + 1 + rank) for ranked in kept.values() for rank, _ in ranked]
    if not pool:
        return []
    if not query and vector is None:
        return recency(lists, depth, apart=apart, limit=limit, min_score=min_score)
    now = time.time() if now is None else now
    text_scores: dict[int, float] = {}
    if query:  # one pass over the pool's (cached) tokens: no index is built for one query
        raw = bm25_scores(dict(enumerate(r.content for r in pool)), query)
        top = max(raw.values(), default=0.0)
        if top > 0:
            text_scores = {i: s / top for i, s in raw.items()}
    cosines = _cosines(pool, vector) if vector is not None else {}
    half_life = max(half_life_days, 1e-6) * 86400.0
    w_text, w_vector, w_rank, w_recency, w_salience = (
        weights.get(name, 0.0) for name in ("text", "vector", "rank", "recency", "salience"))
    by_rank = w_rank > 0  # a tier's own pick counts as relevant when its rank is weighed
    # Weights renormalise over the signals a candidate has: text (when there is a query) and vector
    # (when both vectors exist) may be missing; rank, recency and salience never are.
    base_total = w_rank + w_recency + w_salience + (w_text if query else 0.0)
    scored: list[tuple[float, float, Record]] = []
    for i, record in enumerate(pool):
        text_s = text_scores.get(i, 0.0)
        vector_s = cosines.get(i)
        rank_s = tier_rank[i]
        if text_s + (vector_s or 0.0) + by_rank * rank_s <= 0.0:
            continue  # recency and salience order relevant candidates; they do not make one relevant
        created = _epoch(record)
        age = half_life if created is None else max(0.0, now - created)
        total = (base_total + (w_vector if vector_s is not None else 0.0)) or 1.0
        score = (w_text * text_s + w_vector * (vector_s or 0.0) + w_rank * rank_s
                 + w_recency * 0.5 ** (age / half_life) + w_salience * record.salience) / total
        scored.append((score, created or 0.0, record))
    scored.sort(key=lambda t: (-t[0], -t[1]))
    return _top(((min(1.0, max(0.0, s)), r) for s, _, r in scored), limit, min_score)
