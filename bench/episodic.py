"""Benchmark the episodic store: insert throughput, filtered recall latency and recall@10 vs exact.

Prints one JSON object. Store-level figures go through `PostgresStore.search`;
`raw_sql` runs the same statement shape directly through psycopg in the same
run, so the store's own overhead is visible. `--url` points at an existing
PostgreSQL (else an embedded one starts in a temporary directory); over-HTTP
figures are added by the surface's benchmark.

    python -m bench.episodic [--n 100000] [--quick] [--url postgresql://...]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import anyio
import numpy as np

from a2m.filters import Scope
from a2m.records import Record
from a2m.timefmt import format_ts
from backends.episodic.store import PostgresStore
from backends.settings import TierSettings

WORDS = "deploy release database migration outage latency invoice customer meeting roadmap budget hiring".split()


def _pct(values: list[float], q: float) -> float:
    return round(float(np.percentile(np.array(values) * 1000, q)), 2)


async def run(n: int, dims: int, queries: int, url: str | None) -> dict:
    rnd = random.Random(1)
    rng = np.random.default_rng(1)
    vectors = rng.standard_normal((n, dims)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    start = datetime(2026, 1, 1, tzinfo=timezone.utc)
    owners = [f"user{i}" for i in range(100)]
    rows = []
    for i in range(n):
        owner = owners[i % 100]
        created = start + timedelta(seconds=rnd.uniform(0, 90 * 86400))
        rows.append(dict(owner=owner, session=f"{owner}-s{rnd.randrange(10)}", created=created,
                         text=" ".join(rnd.choices(WORDS, k=8))))
    with tempfile.TemporaryDirectory() as tmp:
        store = PostgresStore(TierSettings(name="episodic", data_dir=Path(tmp), url=url))
        await store.open()
        try:
            t0 = time.perf_counter()
            for lo in range(0, n, 500):
                await store.write([
                    Record(id=f"r{i}", content=rows[i]["text"], created_at=format_ts(rows[i]["created"]),
                           owner=rows[i]["owner"], session=rows[i]["session"], role="user",
                           metadata={"topic": rows[i]["text"].split()[0]}, embedding=vectors[i].tolist())
                    for i in range(lo, min(n, lo + 500))
                ])
                print(f"\rinserted {min(n, lo + 500)}/{n}", end="", file=sys.stderr)
            insert_s = time.perf_counter() - t0
            print(file=sys.stderr)
            owner_of = np.array([i % 100 for i in range(n)])
            session_of = np.array([rows[i]["session"] for i in range(n)])
            created_of = np.array([rows[i]["created"].timestamp() for i in range(n)])
            out: dict = {"n": n, "dims": dims, "vector_search": store.vector_search,
                         "insert_per_s": round(n / insert_s, 1), "cases": {}}
            for case in ("vector", "vector_owner_session", "vector_7_days", "hybrid"):
                lat, recalls = [], []
                for _ in range(queries):
                    o = rnd.randrange(100)
                    q = rng.standard_normal(dims).astype(np.float32)
                    q /= np.linalg.norm(q)
                    mask = owner_of == o
                    scope = Scope(owner=owners[o])
                    text = None
                    if case == "vector_owner_session":
                        sess = f"{owners[o]}-s{rnd.randrange(10)}"
                        scope = Scope(owner=owners[o], where={"session": sess})
                        mask &= session_of == sess
                    elif case == "vector_7_days":
                        lo_t = start + timedelta(days=rnd.uniform(0, 83))
                        scope = Scope(owner=owners[o], after=format_ts(lo_t), before=format_ts(lo_t + timedelta(days=7)))
                        mask &= (created_of > lo_t.timestamp()) & (created_of < (lo_t + timedelta(days=7)).timestamp())
                    elif case == "hybrid":
                        text = " ".join(rnd.sample(WORDS, 2))
                    t = time.perf_counter()
                    found = await store.search(scope, text=text, vector=q.tolist(), limit=10)
                    lat.append(time.perf_counter() - t)
                    if text is None:
                        idx = np.nonzero(mask)[0]
                        exact = idx[np.argsort(-(vectors[idx] @ q))[:10]]
                        truth = {f"r{i}" for i in exact}
                        recalls.append(len(truth & {r.id for r in found}) / max(1, len(truth)))
                out["cases"][case] = {"p50_ms": _pct(lat, 50), "p99_ms": _pct(lat, 99),
                                      "recall_at_10": round(float(np.mean(recalls)), 4) if recalls else None}
            out["raw_sql"] = await _raw(store, vectors, dims, queries, owners, rng)
            return out
        finally:
            await store.close()


async def _raw(store: PostgresStore, vectors: np.ndarray, dims: int, queries: int, owners: list[str], rng) -> dict:
    """The store's vector-only statement shape, straight through psycopg (no Record building)."""
    from pgvector import Vector

    distance = ("embedding <=> %s" if store.vector_search == "hnsw"
                else f"embedding::halfvec({dims}) <=> %s::halfvec({dims})")
    sql = f"SELECT id, {distance} AS d FROM records WHERE owner = %s AND embedding IS NOT NULL ORDER BY d LIMIT 10"
    lat = []
    assert store._pool is not None
    async with store._pool.connection() as conn:
        for k in range(queries):
            q = rng.standard_normal(dims).astype(np.float32)
            t = time.perf_counter()
            await (await conn.execute(sql, [Vector(q.tolist()), owners[k % 100]])).fetchall()
            lat.append(time.perf_counter() - t)
    return {"vector_p50_ms": _pct(lat, 50), "vector_p99_ms": _pct(lat, 99)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--dims", type=int, default=384)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--quick", action="store_true", help="5,000 records, 50 queries")
    parser.add_argument("--url", default=None, help="postgresql:// DSN; default: embedded server in a temp dir")
    args = parser.parse_args()
    n, queries = (5_000, 50) if args.quick else (args.n, args.queries)
    print(json.dumps(anyio.run(run, n, args.dims, queries, args.url), indent=2))


if __name__ == "__main__":
    main()
