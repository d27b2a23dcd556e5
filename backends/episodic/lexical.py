"""Text recall's first half: the full-text matches in scope, scored by BM25 in SQL.

PostgreSQL finds the matches (the GIN index over `fts`, inside the scope) and
scores them by BM25 over the terms each row was stored with (decisions 21, 26,
32): `ts_rank` has no IDF, so the commonest query word decided. At most
`LEXICAL_MATCHES` matches are scored, the best by ts_rank past that
(decision 34 says why the cap stays). `ranking.relevance` then weighs these
scores with the cosine and the session neighbours.
"""

from __future__ import annotations

import re
from typing import Any

from psycopg import AsyncConnection

from a2m.text import BM25_B, BM25_K1, detect_language, fold, query_terms, tokenize

LEXICAL_MATCHES = 1000  # full-text matches ranked by BM25; past this, the best by ts_rank
_WORD = re.compile(r"\w+", re.UNICODE)


def query_words(text: str) -> str:
    """The words of `text` worth searching for: stopwords of the detected language removed.

    PostgreSQL's `english` config has its own stopword list, but the `simple`
    half of the index keeps every word, so the query must drop function words
    itself, in whatever language it is written. Empty when nothing is left.
    """
    words = _WORD.findall(text)
    language = detect_language([fold(w) for w in words])
    return " ".join(w for w in words if tokenize(w, language=language))


def bm25_sql(condition: str, terms: int) -> str:
    """The one statement of `text_scores`: (id, BM25) of the full-text matches in
    scope (the best `LEXICAL_MATCHES` by ts_rank; decision 34 says why the cap stays), best first.
    Parameters: the query words twice, each query term, the scope's, the match cap, the scope's size.

    Two things keep PostgreSQL's CPU down without changing a score or a place. Each term's IDF
    (times k1 + 1) is computed once, in `s`: per row it cost a numeric addition and cast for every
    term. Both sorted row shapes lead with their sort keys and end with the id: most matches tie on
    the first key (the same counts, the same length), and reading the next key from behind a text
    column walked the row for every comparison (`nocachegetattr`). The outer SELECT puts (id, score)
    back in the order `text_scores` reads; its ORDER BY repeats the subquery's, so the order is
    guaranteed, and the planner sees it already met (no second Sort)."""
    k1, b = BM25_K1, BM25_B
    counts = "".join(f", cardinality(array_positions(terms, %s::text)) AS f{i}" for i in range(terms))
    held = "".join(f", count(*) FILTER (WHERE f{i} > 0) AS d{i}" for i in range(terms))
    idf = "".join(f", ln(1 + (n - d{i} + 0.5) / (d{i} + 0.5)) * {k1 + 1!r}::float8 AS w{i}" for i in range(terms))
    norm = f"({k1 * (1 - b)!r}::float8 + {k1 * b!r}::float8 * m.len / s.avglen)"  # k1 (1 - b + b len / avg)
    score = " + ".join(f"CASE WHEN f{i} > 0 THEN s.w{i} * f{i} / (f{i} + {norm}) ELSE 0 END"
                       for i in range(terms)) or "0"
    return (
        "WITH q AS (SELECT (replace(plainto_tsquery('english', %s)::text, ' & ', ' | ')::tsquery"
        " || replace(plainto_tsquery('simple', %s)::text, ' & ', ' | ')::tsquery) AS query), "
        f"m AS (SELECT ts_rank(fts, q.query, 1) AS tr, created_at, cardinality(terms) AS len{counts}, id "
        f"FROM records, q WHERE {condition} AND fts @@ q.query ORDER BY tr DESC, created_at DESC LIMIT %s), "
        # MATERIALIZED: inlined, the planner re-ran the aggregate for every match (n^2 rows read)
        f"s AS MATERIALIZED (SELECT n, avglen{idf} FROM (SELECT greatest(count(*), %s)::float8 AS n, "
        f"coalesce(nullif(avg(len), 0), 1)::float8 AS avglen{held} FROM m) c) "
        f"SELECT id, score FROM (SELECT {score} AS score, m.tr, m.created_at, m.id FROM m, s "
        "ORDER BY score DESC, tr DESC, created_at DESC) o ORDER BY score DESC, tr DESC, created_at DESC"
    )


async def text_scores(conn: AsyncConnection, condition: str, scope_params: list[Any], words: str,
                       text: str, size: int) -> dict[str, float]:
    """id -> BM25 for the full-text matches in scope, best first (a sliver where only PostgreSQL's stemmer matched).

    PostgreSQL finds the matches (the GIN index, inside the scope) and ranks
    them by BM25 over the terms each row was stored with (the shared
    tokenizer's), because `ts_rank` has no IDF and lets the commonest query
    word decide. The matches are every record holding a query term (up to
    `LEXICAL_MATCHES`, the best by ts_rank past that), so document
    frequencies are exact; `size` is the scope's size. Scoring in SQL, each
    row counts its query terms with `array_positions` and only (id, score)
    crosses the wire, in binary (no float to text and back): ranking up to
    1,000 matches in Python cost the server about 2 ms of CPU per recall,
    more for longer queries (decision 32).
    """
    wanted = sorted(query_terms(text))
    cur = await conn.execute(bm25_sql(condition, len(wanted)),
                             [words, words, *wanted, *scope_params, LEXICAL_MATCHES, size], binary=True)
    scores = dict(await cur.fetchall())
    if scores and scores[next(reversed(scores))] == 0:
        # A match BM25 does not see (score 0, so last) keeps a sliver, in ts_rank order, below every BM25 hit.
        ranked = list(scores)
        seen = list(scores.values()).index(0.0)
        sliver = 1e-6 * (scores[ranked[seen - 1]] if seen else 1.0)
        for k in range(seen, len(ranked)):
            scores[ranked[k]] = sliver / (1 + k)
    return scores
