"""Benchmark of the semantic store: prints one JSON object.

    python bench/semantic.py                 # 50,000 facts of 384 dims on Qdrant Edge
    python bench/semantic.py --quick         # 2,000 facts, a smoke run
    python bench/semantic.py --engine local  # qdrant-client local mode
    python bench/semantic.py --url http://127.0.0.1:6333   # a Qdrant server (over HTTP)

Half the facts belong to no owner (the large partition, "all"), the rest are
spread over 10 owners (one of them is the selective "owner" case). Reported:
upsert throughput through `Store.write` and as the raw engine write of the same
points (built before the clock) in the same run, search latency p50/p99 for dense,
BM25 and hybrid at the store level and as the raw engine call in the same run,
and dense recall@10 against exact (numpy) cosine search in the same partition.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

import anyio
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from a2m.filters import Scope  # noqa: E402
from a2m.records import Record  # noqa: E402
from backends.semantic import make_store  # noqa: E402
from a2m.text import sparse_vector  # noqa: E402
from backends.semantic.store import (Match, PointData, SemanticStore, partition, point_id, query_sparse,  # noqa: E402
                                     to_payload)
from backends.settings import TierSettings  # noqa: E402

WORDS = [f"w{i:04d}" for i in range(5000)]
OWNERS = [f"o{i}" for i in range(10)]


def owner_of(i: int) -> str | None:
    return None if i % 2 == 0 else OWNERS[(i // 2) % 10]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered) - 1e-9) - 1)]  # nearest rank: p99 of 100 is the 99th


def _summary(samples: list[float]) -> dict[str, float]:
    return {"p50_ms": round(statistics.median(samples), 3), "p99_ms": round(percentile(samples, 0.99), 3)}


async def timed_pair(store_call: Callable[[int], Awaitable[Any]], raw_call: Callable[[int], Awaitable[Any]],
                     next_q: Callable[[], int], runs: int) -> dict[str, dict[str, float]]:
    """Store and raw engine calls alternated on the same query, so paging in the index after
    optimize() (seconds at 50,000 points) and machine drift hit both: timed one after the
    other, whichever ran first looked twice as slow."""
    for _ in range(min(5, runs)):
        k = next_q()
        await store_call(k)
        await raw_call(k)
    samples: dict[str, list[float]] = {"store": [], "raw_engine": []}
    for _ in range(runs):
        k = next_q()  # both sides answer the same question
        for label, call in (("store", store_call), ("raw_engine", raw_call)):
            start = time.perf_counter()
            await call(k)
            samples[label].append((time.perf_counter() - start) * 1000)
    return {label: _summary(values) for label, values in samples.items()}


async def raw_upsert(batches: list[list[Record]], data_dir: Path, options: dict[str, Any]) -> float:
    """The same-run baseline for upserts: the same points, already built, straight into
    a fresh engine of the same kind, so what `Store.write` adds is visible on a noisy
    machine. Records are built before the clock in both cases."""
    raw: SemanticStore = make_store(TierSettings("semantic", data_dir, options=options))
    await raw.open()
    engine = raw._engine
    await engine.create_dense(len(batches[0][0].embedding or ()))
    points = [[PointData(point_id(r.id), to_payload(r, seq), r.embedding, sparse_vector(r.content))
               for seq, r in enumerate(batch)] for batch in batches]
    start = time.perf_counter()
    for chunk in points:
        await engine.write(chunk, [])
    rate = sum(map(len, points)) / (time.perf_counter() - start)
    await raw.close()
    return round(rate, 1)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    """The figures, on `--data` (kept) or a temporary directory removed afterwards (50,000 records
    and their raw twin take ~650 MB: each run left them in /tmp)."""
    if args.data:
        return await measure(args, Path(args.data))
    with tempfile.TemporaryDirectory(prefix="a2m-bench-semantic-") as data_dir:
        return await measure(args, Path(data_dir))


async def measure(args: argparse.Namespace, data_dir: Path) -> dict[str, Any]:
    rng = np.random.default_rng(7)
    wrand = random.Random(7)
    n, dims = args.n, args.dims
    # clustered, like real embeddings (uniform random vectors have no neighbours to find)
    centers = rng.standard_normal((max(1, n // 250), dims), dtype=np.float32)
    vectors = centers[rng.integers(0, len(centers), n)] + 0.6 * rng.standard_normal((n, dims), dtype=np.float32)
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    options = {"engine": "local"} if args.engine == "local" else {}
    store: SemanticStore = make_store(TierSettings("semantic", data_dir, url=args.url, options=options))
    await store.open()
    engine = store._engine  # the raw engine, for the same-run comparison

    batches = [
        [Record(id=f"f{i}", content=" ".join(wrand.choices(WORDS, k=12)),
                created_at="2026-03-01T10:00:00.000Z", owner=owner_of(i), key=f"fact/{i}",
                embedding=vectors[i].tolist())
         for i in range(lo, min(n, lo + args.batch))]
        for lo in range(0, n, args.batch)
    ]
    start = time.perf_counter()
    for batch in batches:
        await store.write(batch)
    upsert_s = time.perf_counter() - start
    result: dict[str, Any] = {"engine": store.engine, "n": n, "dims": dims,
                              "upsert_records_per_s": round(n / upsert_s, 1)}
    if args.url is None:
        result["upsert_raw_engine_records_per_s"] = await raw_upsert(batches, data_dir / "raw", options)
    if hasattr(engine, "optimize"):
        start = time.perf_counter()
        await engine.optimize()
        result["optimize_s"] = round(time.perf_counter() - start, 2)

    queries = [int(i) for i in rng.integers(0, n, args.queries)]
    qvec = [(unit[i] + (0.3 / dims ** 0.5) * rng.standard_normal(dims).astype(np.float32)).tolist() for i in queries]
    qtext = [" ".join(wrand.choices(WORDS, k=3)) for _ in queries]
    cycle = {"i": 0}

    def next_q() -> int:
        cycle["i"] = (cycle["i"] + 1) % len(queries)
        return cycle["i"]

    scopes = {"all": None, "owner": OWNERS[3]}
    latency: dict[str, Any] = {}
    for label, owner in scopes.items():
        scope = Scope(owner=owner)
        must = [Match("part", partition(owner))]
        for mode in ("dense", "bm25", "hybrid"):
            def store_call(k: int, mode: str = mode, scope: Scope = scope) -> Awaitable[Any]:
                return store.search(scope, text=None if mode == "dense" else qtext[k],
                                    vector=None if mode == "bm25" else qvec[k], limit=10)

            def raw_call(k: int, mode: str = mode, must: list[Any] = must) -> Awaitable[Any]:
                return engine.query(must, dense=None if mode == "bm25" else qvec[k],
                                    sparse=None if mode == "dense" else query_sparse(qtext[k]),
                                    limit=10, candidates=64, with_embedding=False)

            latency[f"{mode}/{label}"] = await timed_pair(store_call, raw_call, next_q, args.runs)
    result["search"] = latency

    recall: dict[str, float] = {}
    for label, owner in scopes.items():
        members = np.array([i for i in range(n) if owner_of(i) == owner])
        hits = 0
        for k in range(min(args.recall_queries, len(queries))):
            exact = members[np.argsort(-(unit[members] @ np.asarray(qvec[k], dtype=np.float32)))[:10]]
            got = await store.search(Scope(owner=owner), text=None, vector=qvec[k], limit=10)
            hits += len({f"f{i}" for i in exact} & {r.id for r in got})
        recall[label] = round(hits / (10 * min(args.recall_queries, len(queries))), 4)
    result["dense_recall_at_10"] = recall
    await store.close()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=50_000)
    parser.add_argument("--dims", type=int, default=384)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--recall-queries", type=int, default=100)
    parser.add_argument("--engine", choices=["edge", "local"], default="edge")
    parser.add_argument("--url", default=None, help="a Qdrant server, e.g. http://127.0.0.1:6333")
    parser.add_argument("--data", default=None, help="data directory (default: a fresh temp dir)")
    parser.add_argument("--quick", action="store_true", help="a small smoke run")
    args = parser.parse_args()
    if args.quick:
        args.n, args.queries, args.runs, args.recall_queries = 2_000, 50, 50, 20
    print(json.dumps(anyio.run(run, args), indent=2))


if __name__ == "__main__":
    main()
