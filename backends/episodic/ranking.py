"""How a recall orders what it found: relevance, then recency and salience blended in lightly.

Relevance comes first: for a vector recall the reciprocal-rank shape over the
nearest rows (`RRF_K`); for text or hybrid recall `text_relevance` sums BM25 with
the rescaled cosine rather than fusing ranks, then lets each top hit lend part
of its score to its session neighbours (decisions 21 and 84). `blend` then
adds recency (1/e after 30 days) and salience at 5% of the score, so they
break near ties without overriding relevance, scored here in Python so the
ranked read stays the plain statement a hand-written query would be
(decision 23).
"""

from __future__ import annotations

import time
from math import exp
from typing import Any, Sequence

from pgvector import Vector
from psycopg import AsyncConnection

from a2m.records import Record
from a2m.timefmt import to_epoch

from .lexical import text_scores
from .rows import to_record
from .vectors import distance

RRF_K = 60
RELEVANCE_WEIGHT, RECENCY_WEIGHT, SALIENCE_WEIGHT = 0.95, 0.03, 0.02
RECENCY_SECONDS = 30 * 86400.0
NEIGHBOURS, NEIGHBOUR_HITS, NEIGHBOUR_WEIGHT = 2, 20, 0.25
HYBRID_POOL = 50  # nearest records a hybrid query weighs (and lexical hits given a cosine)
VECTOR_WEIGHT = 0.5  # the rescaled cosine's share beside BM25 (1.0 for the best match)


def recency(created_at: str, now: float) -> float:
    """1.0 for a record written now (epoch seconds), 1/e after RECENCY_SECONDS; a future timestamp counts as now."""
    return exp(-max(0.0, now - to_epoch(created_at)) / RECENCY_SECONDS)


def blend(rows: Sequence[Sequence[Any]], relevance: Sequence[float], embed: bool, limit: int) -> list[Record]:
    """The best `limit` of `rows` (relevance[i] in [0, 1] for rows[i]) by relevance blended with recency
    and salience, the newer first on a tie. Scored here rather than in SQL so a ranked read is the
    plain statement a hand-written query would be (decision 23)."""
    now = time.time()
    scored = sorted(
        ((RELEVANCE_WEIGHT * rel + RECENCY_WEIGHT * recency(row[2], now) + SALIENCE_WEIGHT * float(row[7]), row)
         for row, rel in zip(rows, relevance)),
        key=lambda pair: (pair[0], pair[1][2]), reverse=True)  # the canonical stamps sort as the times do
    return [to_record(row, with_embedding=embed, score=min(1.0, max(0.0, score))) for score, row in scored[:limit]]


async def text_relevance(conn: AsyncConnection, condition: str, scope_params: list[Any], words: str,
                         text: str, similar: dict[str, float], query: Vector | None, vector_search: str,
                         dims: int | None, size: int, pool: int) -> list[tuple[str, float]]:
    """The best `pool` records for a text (or hybrid) query, best first, each with its relevance in [0, 1].

    Scores are summed, not rank-fused: BM25 over the best match's, plus
    `VECTOR_WEIGHT` times the cosine rescaled between the nearest record and
    the last of the vector pool. Rank fusion gives a weak list the same say
    as a strong one; on LoCoMo, MiniLM beside BM25 cut recall@10 from 0.71
    to 0.66 under RRF and lifts it to 0.73 summed. Then each of the best
    `NEIGHBOUR_HITS` lends `NEIGHBOUR_WEIGHT` of its score to the records up
    to `NEIGHBOURS` before and after it in its session: the answer to "what
    did she say about X" is often the reply to the turn that names X
    (LoCoMo dev, text only, recall@10 at store level: 0.63 -> 0.71).

    Only the records that can reach the top are scored past BM25: the best
    `max(pool, NEIGHBOUR_HITS)` matches, the vector pool and the lenders'
    neighbours. Any other match keeps its BM25 score alone, at most that of
    each of those best matches, which come before it in BM25's order, so
    leaving it out moves no place in the top `pool`, ties included
    (decision 84).
    """
    bm25 = await text_scores(conn, condition, scope_params, words, text, size)
    ranked = list(bm25)  # best first
    top_text = (bm25[ranked[0]] if ranked else 0.0) or 1.0
    place = dict(zip(ranked, range(len(ranked))))  # the order a tie keeps: BM25's, then as first seen

    def own(i: str) -> float:
        return bm25.get(i, 0.0) / top_text

    fused = {i: own(i) for i in ranked[:max(pool, NEIGHBOUR_HITS)]}
    if similar and query is not None:
        sims = list(similar.values())
        high, low = sims[0], sims[-1]
        missing = [i for i in ranked[:HYBRID_POOL] if i not in similar]
        if missing:
            cur = await conn.execute(
                f"SELECT id, {distance(vector_search, dims)} FROM records WHERE id = ANY(%s) AND embedding IS NOT NULL",
                [query, missing], prepare=True)
            similar = similar | {row[0]: 1.0 - float(row[1]) for row in await cur.fetchall()}
        span = (high - low) or 1.0
        for i, sim in similar.items():
            place.setdefault(i, len(place))
            fused[i] = own(i) + VECTOR_WEIGHT * min(1.0, max(0.0, (sim - low) / span))

    def best(scores: dict[str, float], n: int) -> list[str]:
        return sorted(scores, key=lambda i: (-scores[i], place[i]))[:n]

    lenders = [i for i in best(fused, NEIGHBOUR_HITS) if fused[i] > 0]
    final = dict(fused)
    if lenders:
        def side(op: str, direction: str) -> str:
            # Ordered by the whole (owner, session, created_at, seq) index key, constant owner and
            # session included: `owner IS NULL` is no equality to the planner, and ordering by
            # the time alone made it read and sort the session (6.5 of a 20 ms recall) for 2 rows.
            return (f"SELECT id FROM records WHERE {condition} AND session = c.session AND (created_at, seq) {op} "
                    f"(c.created_at, c.seq) ORDER BY owner {direction}, session {direction}, "
                    f"created_at {direction}, seq {direction} LIMIT {NEIGHBOURS:d}")

        cur = await conn.execute(
            f"SELECT c.id, n.id FROM records c CROSS JOIN LATERAL (({side('<', 'DESC')}) UNION ALL "
            f"({side('>', 'ASC')})) n WHERE c.id = ANY(%s)",
            [*scope_params, *scope_params, lenders],
            prepare=True,  # the primary key, then the session index in its order: planning was half its time
        )
        for lender, neighbour in await cur.fetchall():
            place.setdefault(neighbour, len(place))
            final[neighbour] = final.get(neighbour, own(neighbour)) + NEIGHBOUR_WEIGHT * fused[lender]
    top = max(final.values(), default=0.0) or 1.0
    scaled = {i: v / top for i, v in final.items()}
    return [(i, scaled[i]) for i in best(scaled, pool)]
