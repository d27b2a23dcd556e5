"""Procedural tier speed: a write (one commit), a recall over 2,000 procedures, a bare commit.

Prints one JSON object. Store-level figures by default (what the engine costs);
`--url` adds recall over HTTP against a running procedural server
(`a2m serve procedural`), the figure the target (≤ 5 ms p50) is about.

    python bench/procedural.py [--records 2000] [--writes 200] [--url http://127.0.0.1:8704/]
"""

from __future__ import annotations

import argparse
import io
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from a2m.filters import Scope  # noqa: E402
from a2m.records import Record  # noqa: E402
from a2m.timefmt import now  # noqa: E402
from backends.procedural import make_store  # noqa: E402
from backends.settings import TierSettings  # noqa: E402

TOPICS = ["refund", "invoice", "shipping", "password", "deploy", "rollback", "backup", "onboarding"]


def pct(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "p50_ms": round(statistics.median(ordered) * 1000, 3),
        "p99_ms": round(ordered[max(0, math.ceil(0.99 * len(ordered) - 1e-9) - 1)] * 1000, 3),
        "n": len(ordered),
    }


def procedure(i: int) -> Record:
    topic = TOPICS[i % len(TOPICS)]
    return Record(
        id=f"p{i}", owner="bench", key=f"skills/{topic}/{i}", created_at=now(),
        content=f"# Handle {topic} case {i}\n\n1. Look up the {topic} record.\n2. Step {i % 13}: verify "
                f"{TOPICS[(i * 3) % 8]} details.\n3. Reply to the customer.",
    )


def bare_commits(path: Path, count: int) -> list[float]:
    """The floor: one blob, one tree, one commit through GitPython, nothing else."""
    import git
    from git.index.typ import BaseIndexEntry, IndexEntry
    from git.objects.commit import Commit
    from gitdb.base import IStream

    repo = git.Repo.init(path, initial_branch="main")
    index = git.IndexFile(repo)
    actor = git.Actor("bench", "bench@a2m.local")
    samples = []
    for i in range(count):
        start = time.perf_counter()
        data = f"bare commit {i}\n".encode()
        blob = repo.odb.store(IStream("blob", len(data), io.BytesIO(data)))
        index.entries[(f"f{i}.md", 0)] = IndexEntry.from_base(BaseIndexEntry((0o100644, blob.binsha, 0, f"f{i}.md")))
        parents = [repo.head.commit] if repo.head.is_valid() else []
        Commit.create_from_tree(repo, index.write_tree(), f"c{i}", parent_commits=parents, head=True,
                                author=actor, committer=actor)
        samples.append(time.perf_counter() - start)
    repo.close()
    return samples


async def http_recall(url: str, queries: list[str]) -> dict[str, float]:
    """Through the a2m client the router uses (httpx's default transport alone costs ~0.5-2 ms a
    call, docs/decisions.md 5), after a warm-up that opens the connection."""
    from a2m.client import HTTPClient

    samples = []
    async with HTTPClient(url) as client:
        for query in queries[:10]:
            await client.call("memory/recall", {"query": query, "limit": 10, "owner": "bench", "touch": False})
        for query in queries:
            start = time.perf_counter()
            await client.call("memory/recall", {"query": query, "limit": 10, "owner": "bench", "touch": False})
            samples.append(time.perf_counter() - start)
    return pct(samples)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=2000)
    parser.add_argument("--writes", type=int, default=200)
    parser.add_argument("--searches", type=int, default=500)
    parser.add_argument("--url", help="a running procedural server: also measure recall over HTTP")
    parser.add_argument("--quick", action="store_true", help="run_all --quick's size: 500 records, 50 writes, 200 searches")
    args = parser.parse_args()
    if args.quick:
        args.records, args.writes, args.searches = 500, 50, 200

    with tempfile.TemporaryDirectory() as tmp:
        store = make_store(TierSettings("procedural", Path(tmp) / "store"))
        await store.open()
        start = time.perf_counter()
        chunk = 250
        for offset in range(0, args.records, chunk):
            await store.write([procedure(i) for i in range(offset, min(args.records, offset + chunk))])
            print(f"loaded {min(args.records, offset + chunk)}/{args.records}", file=sys.stderr, end="\r")
        load_s = time.perf_counter() - start
        print(file=sys.stderr)

        writes = []
        for i in range(args.writes):  # single-record writes into the full repository: the common case
            record = procedure(args.records + i)
            begin = time.perf_counter()
            await store.write([record])
            writes.append(time.perf_counter() - begin)
        replaces = []
        for i in range(min(args.writes, 100)):
            record = procedure(i).with_(content=f"revised procedure {i}", revision=2)
            begin = time.perf_counter()
            await store.write([record])
            replaces.append(time.perf_counter() - begin)

        scope = Scope(owner="bench")
        queries = [f"{TOPICS[i % 8]} case {i} verify" for i in range(args.searches)]
        searches = []
        for query in queries:
            begin = time.perf_counter()
            await store.search(scope, text=query, vector=None, limit=10)
            searches.append(time.perf_counter() - begin)
        await store.close()

        reopen = make_store(TierSettings("procedural", Path(tmp) / "store"))
        begin = time.perf_counter()
        await reopen.open()
        open_s = time.perf_counter() - begin
        await reopen.close()

        bare = bare_commits(Path(tmp) / "bare", args.writes)

    result = {
        "records": args.records,
        "load_s": round(load_s, 3),
        "write_commit": pct(writes),
        "replace_commit": pct(replaces),
        "search_store": pct(searches),
        "bare_gitpython_commit": pct(bare),
        "open_s": round(open_s, 3),
    }
    if args.url:
        result["recall_http"] = await http_recall(args.url, queries[:200])
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    anyio.run(main)
