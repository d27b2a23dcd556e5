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
from typing import Mapping, Sequence

from a2m.records import Record
from a2m.text import BM25
from a2m.timefmt import to_epoch

RANK_K = 10  # rerank's tier-rank signal: 1.0 for a tier's first hit, 0.5 by its 11th


def _dedupe(lists: Mapping[str, Sequence[Record]], depth: Mapping[str, int]) -> dict[str, list[tuple[int, Record]]]:
    """Drop duplicate ids across tiers (an interrupted move), keeping the deeper (destination) copy."""
    best: dict[str, str] = {}
    for tier, records in lists.items():
        for record in records:
            holder = best.get(record.id)
            if holder is None or depth.get(tier, 0) > depth.get(holder, 0):
                best[record.id] = tier
    out: dict[str, list[tuple[int, Record]]] = {}
    for tier, records in lists.items():
        kept = [r for r in records if best.get(r.id) == tier]
        out[tier] = list(enumerate(kept))
    return out


def recency(lists: Mapping[str, Sequence[Record]], depth: Mapping[str, int] | None = None) -> list[Record]:
    """Newest first; score 1/(1+rank) like a single tier without a query."""
    merged = [r for _, ranked in _dedupe(lists, depth or {}).items() for _, r in ranked]
    merged.sort(key=lambda r: r.created_at, reverse=True)
    return [r.with_(score=1.0 / (1 + i)) for i, r in enumerate(merged)]


def rrf(lists: Mapping[str, Sequence[Record]], *, k: int = 60, depth: Mapping[str, int] | None = None) -> list[Record]:
    scores: dict[str, float] = {}
    records: dict[str, Record] = {}
    for tier, ranked in _dedupe(lists, depth or {}).items():
        for rank, record in ranked:
            scores[record.id] = scores.get(record.id, 0.0) + (k + 1) / (k + rank + 1)
            records.setdefault(record.id, record)
    scale = max(1.0, max(scores.values(), default=1.0))
    ordered = sorted(scores, key=lambda i: (-scores[i], _neg_time(records[i])))
    return [records[i].with_(score=min(1.0, scores[i] / scale)) for i in ordered]


def _neg_time(record: Record) -> float:
    try:
        return -to_epoch(record.created_at)
    except Exception:
        return 0.0


def cosine(a: Sequence[float], b: Sequence[float]) -> float | None:
    if len(a) != len(b) or not a:
        return None
    dot = sum(x * y for x, y in zip(a, b))
    na = math.sqrt(sum(x * x for x in a))
    nb = math.sqrt(sum(y * y for y in b))
    if not na or not nb:
        return None
    return dot / (na * nb)


def rerank(lists: Mapping[str, Sequence[Record]], *, query: str | None, vector: Sequence[float] | None,
           weights: Mapping[str, float], half_life_days: float = 30.0, now: float | None = None,
           depth: Mapping[str, int] | None = None) -> list[Record]:
    kept = _dedupe(lists, depth or {})
    pool = [r for _, ranked in kept.items() for _, r in ranked]
    tier_rank = {r.id: (RANK_K + 1) / (RANK_K + 1 + rank) for ranked in kept.values() for rank, r in ranked}
    if not pool:
        return []
    if not query and vector is None:
        return recency(lists, depth)
    now = time.time() if now is None else now
    text_scores: dict[str, float] = {}
    if query:
        index = BM25()
        for record in pool:
            index.add(record.id, record.content)
        raw = index.scores(query)
        top = max(raw.values(), default=0.0)
        if top > 0:
            text_scores = {i: s / top for i, s in raw.items()}
    half_life = max(half_life_days, 1e-6) * 86400.0
    by_rank = weights.get("rank", 0.0) > 0  # a tier's own pick counts as relevant when its rank is weighed
    scored: list[tuple[float, float, Record]] = []
    for record in pool:
        signals: dict[str, float] = {}
        if query:
            signals["text"] = text_scores.get(record.id, 0.0)
        if vector is not None and record.embedding:
            cos = cosine(record.embedding, vector)
            if cos is not None:
                signals["vector"] = max(0.0, cos)
        try:
            age = max(0.0, now - to_epoch(record.created_at))
        except Exception:
            age = half_life
        signals["rank"] = tier_rank[record.id]
        signals["recency"] = 0.5 ** (age / half_life)
        signals["salience"] = record.salience
        relevance = signals.get("text", 0.0) + signals.get("vector", 0.0) + by_rank * signals["rank"]
        if relevance <= 0.0:
            continue  # recency and salience order relevant candidates; they do not make one relevant
        total = sum(weights.get(name, 0.0) for name in signals) or 1.0
        score = sum(weights.get(name, 0.0) * value for name, value in signals.items()) / total
        scored.append((score, -_neg_time(record), record))
    scored.sort(key=lambda t: (-t[0], -t[1]))
    return [r.with_(score=min(1.0, max(0.0, s))) for s, _, r in scored]
