"""The episodic tier (PostgreSQL + pgvector, embedded) against the reference semantics of `a2m.filters.matches`.

A seeded sequence of A2M calls runs against an episodic tier server built as `a2m serve episodic` builds
it. Before each call the tier's records are read back whole (a timeline with no limit); every answer is
compared with what `matches` says over them, and every write with what was written (metadata exactly,
types included). Where ranking is not defined (score ties, the scores themselves, the session neighbours
a text search lends score to) only what is defined is compared.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any, AsyncIterator

import pytest

from a2m.filters import matches
from a2m.records import Record
from a2m.text import query_terms, tokenize
from tests.backends.test_working_parity import expect_write
from tests.support import parity
from tests.support.parity import meta_value, same, scalar, text, without_embedding

pytestmark = pytest.mark.anyio

OWNERS = ("alice", "bob", None)
IDS = [f"r{i}" for i in range(30)]
# LIKE's metacharacters and an escape character, which a prefix must take literally
KEYS = ["a%b", "a_b", "a\\b", "a%", "a_", "ab", "a\\", "%", "_x", "k/a", "k/a/x", "é/ü", "A"]
PREFIXES = ["a%", "a_", "a\\", "%", "_", "a", "", "k/", "é", "ab", "a%b", "x"]
STAMPS = [f"2026-03-01T10:00:{s:02d}.{ms:03d}Z" for s in range(0, 8) for ms in (0, 500)]
# exactly representable in float32 (pgvector's storage), so a vector read back equals what was written
VECTORS = [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.75, 0.75, 0.0], [0.0, 0.0, 1.0], [0.5, -0.5, 0.25],
           [-1.0, 0.125, 0.0]]
META_KEYS = ["topic", "n", "ok", "tags", "superseded_by", "x.y", "nested", "a'b", "50%", "_"]


def new_record(rng: random.Random, owner: str | None) -> dict[str, Any]:
    rec: dict[str, Any] = {"id": f"{owner}-{rng.choice(IDS)}", "content": text(rng, rng.randint(1, 5))}
    if rng.random() < 0.8:
        rec["created_at"] = rng.choice(STAMPS)
    if rng.random() < 0.45:
        rec["key"] = rng.choice(KEYS)
    for name, pool in (("session", ["s1", "s2"]), ("group", ["g1", "g2"]), ("role", ["user", "assistant"])):
        if rng.random() < 0.5:
            rec[name] = rng.choice(pool)
    if rng.random() < 0.7:
        rec["metadata"] = {k: meta_value(rng) for k in rng.sample(META_KEYS, rng.randint(1, 4))}
    if rng.random() < 0.5:
        rec["embedding"] = rng.choice(VECTORS)
    if rng.random() < 0.2:
        rec["salience"] = rng.choice([0.0, 0.3, 0.5, 1.0])
    if rng.random() < 0.1:  # the move/import extension
        rec["revision"] = rng.randint(1, 4)
        rec["access_count"] = rng.choice([0, 3, 2**53 - 1])
        rec["accessed_at"] = rng.choice(STAMPS + [None])
    return rec


def where(rng: random.Random, owner: str | None, held: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for _ in range(1 if rng.random() < 0.7 else 2):
        name = rng.choice(META_KEYS * 2 + ["role", "session", "group", "key", "id", "salience", "revision",
                                           "access_count", "accessed_at", "created_at", "tier", "uri", "content"])
        if name == "id":
            out[name] = [f"{owner}-{i}" for i in rng.sample(IDS, rng.randint(0, 4))]
        elif name in ("session", "group", "role"):
            out[name] = rng.choice([None, "s1", "g1", "user", ["s2", "g2", "assistant", None]])
        elif name == "key":
            out[name] = rng.choice(KEYS + [None, KEYS[:3]])
        elif name == "tier":
            out[name] = rng.choice(["episodic", "elsewhere", None])
        elif name in ("created_at", "accessed_at"):
            out[name] = rng.choice(STAMPS + [None, "2026-03-01T10:00:01Z", 5])
        elif name == "content" and held:
            out[name] = rng.choice(held)["content"]
        elif name in META_KEYS and held and rng.random() < 0.7:  # a value some record holds (scalars inside lists too)
            values = [v for r in held for v in ([r["metadata"].get(name)] if not isinstance(r["metadata"].get(name), list)
                                                  else r["metadata"][name]) if not isinstance(v, (dict, list))]
            out[name] = rng.choice(values) if values else scalar(rng)
        elif rng.random() < 0.3:
            out[name] = [scalar(rng) for _ in range(rng.randint(0, 3))]
        else:
            out[name] = scalar(rng)
    return out


def selectors(rng: random.Random, params: dict[str, Any], held: list[dict[str, Any]]) -> None:
    parity.selectors(rng, params, held, where, PREFIXES, STAMPS)


def operation(rng: random.Random, held: list[dict[str, Any]], owner: str | None) -> tuple[str, dict[str, Any]]:
    params: dict[str, Any] = {} if owner is None else {"owner": owner}
    roll = rng.random()
    if roll < 0.35:
        return "memory/remember", {**params, "records": [new_record(rng, owner) for _ in range(rng.randint(1, 4))]}
    if roll < 0.57:
        selectors(rng, params, held)
        params["limit"] = rng.choice([1, 1, 2, 3, 5, 10, 50])
        kind = rng.choice(["text", "vector", "hybrid", "none"])
        if kind in ("text", "hybrid"):
            params["query"] = text(rng, rng.randint(1, 3))
        if kind in ("vector", "hybrid"):
            params["embedding"] = rng.choice(VECTORS)
        if rng.random() < 0.2:
            params["min_score"] = rng.choice([0.1, 0.5, 0.9])
        params["touch"] = rng.random() < 0.5
        params["embeddings"] = rng.random() < 0.3
        return "memory/recall", params
    if roll < 0.72:
        selectors(rng, params, held)
        if rng.random() < 0.5:
            params["limit"] = rng.choice([1, 2, 3, 7])
        params["embeddings"] = rng.random() < 0.3
        return "memory/timeline", params
    if roll < 0.80:
        choice = rng.random()
        if choice < 0.3:
            params["ids"] = [f"{owner}-{i}" for i in rng.sample(IDS, rng.randint(0, 3))]
        elif choice < 0.45:
            params["query"] = text(rng, 1)
        else:
            selectors(rng, params, held)
            if not any(k in params for k in ("where", "key_prefix", "after", "before")):
                params["where"] = where(rng, owner, held)
        return "memory/forget", params
    if roll < 0.89:
        return "memory/reinforce", {**params, "ids": [f"{owner}-{i}" for i in rng.sample(IDS, rng.randint(1, 4))],
                                    "amount": rng.choice([0.1, -0.2, 0.5, 1, -0.3, 0.2])}
    if roll < 0.96:
        return "memory/fetch", {**params, "key": rng.choice(KEYS), "embeddings": rng.random() < 0.5}
    return "memory/session/list", params


Tier = parity.Served


@pytest.fixture
async def tier(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Tier]:
    async with parity.served("episodic", tmp_path / "episodic", monkeypatch) as served:
        yield served


def has_word(record: dict[str, Any], query: str) -> bool:
    """Whether the record holds a searchable query word as a whole word (which full text always finds)."""
    words = {w for w in query.split() if tokenize(w)}
    return bool(words & set(record["content"].split()))


def cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b))
    return dot / ((sum(x * x for x in a) ** 0.5) * (sum(y * y for y in b) ** 0.5))


def check_records(got: list[dict[str, Any]], held: dict[str, dict[str, Any]], params: dict[str, Any],
                  where: str) -> None:
    """Each record returned is the one held, unchanged (bar score, and the touch the call itself made)."""
    for r in got:
        expect = held[r["id"]] if params.get("embeddings") else without_embedding(held[r["id"]])
        shown = {k: v for k, v in r.items() if k != "score"}
        if params.get("touch", True) and "score" in r:
            shown = shown | {"access_count": expect["access_count"], "accessed_at": expect["accessed_at"]}
        assert same(shown, expect), f"record changed: {where}\ngot:  {shown}\nwant: {expect}"


async def check(t: Tier, method: str, params: dict[str, Any], written: dict[str, dict[str, Any]]) -> None:
    owner = params.get("owner")
    before = await t.state(owner)
    answer = await t.call(method, params)
    where = f"{method} {params}"
    by_id = {r["id"]: r for r in before}
    if method == "memory/remember":
        # what the write must answer and leave, as the working tier's parity model says (the surface's
        # rules, not the engine's): only the records that changed were compared, so a store that
        # dropped an acknowledged write passed
        ids, want, _ = expect_write(before, params["records"], owner, t.stamp["now"])
        assert answer == {"ids": ids}, f"{where}\ngot:  {answer}\nwant: {ids}"
        state = await t.state(owner)
        assert [r["id"] for r in state] == [r["id"] for r in want], \
            f"{where}\ngot:  {[r['id'] for r in state]}\nwant: {[r['id'] for r in want]}"
        for got_record, want_record in zip(state, want):
            assert same(got_record, want_record | {"tier": "episodic"}), \
                f"{where}\ngot:  {got_record}\nwant: {want_record}"
        after = {r["id"]: r for r in state}
        for rec, rid in zip(params["records"], answer["ids"]):
            stored = after.get(rid)
            if stored is not None and stored["content"] == rec["content"] and stored != by_id.get(rid):  # written now
                written[rid] = rec
                assert same(stored["metadata"], rec.get("metadata", {})), \
                    f"metadata did not round-trip: {where}\ngot:  {stored['metadata']}\nwant: {rec.get('metadata', {})}"
                if "embedding" in rec:
                    assert stored["embedding"] == rec["embedding"], where
    elif method == "memory/recall":
        assert "records" in answer, f"{where}: {answer}"
        got = answer["records"]
        scope = t.scope(params)
        in_scope = [r for r in before if matches(Record.from_wire(r), scope)]
        limit = params["limit"]
        scores = [r["score"] for r in got]
        assert scores == sorted(scores, reverse=True), f"not by score: {where}"
        if "min_score" in params:
            assert all(s >= params["min_score"] for s in scores), where
        check_records(got, by_id, params, where)
        assert {r["id"] for r in got} <= {r["id"] for r in in_scope}, f"out of scope: {where}"
        assert len(got) <= limit, where
        if "query" not in params and "embedding" not in params:
            want = [r["id"] for r in reversed(in_scope)][:limit]
            if "min_score" in params:
                want = want[:len(got)]
            assert [r["id"] for r in got] == want, f"{where}\ngot:  {[r['id'] for r in got]}\nwant: {want}"
        elif "min_score" not in params:
            hits = [r for r in in_scope if ("query" in params and has_word(r, params["query"]))
                    or ("embedding" in params and r.get("embedding") is not None)]
            assert len(got) >= min(limit, len(hits)), f"{len(got)} of {len(hits)} found: {where}"
            if "query" not in params:  # vector only: exactly the nearest `limit`
                assert len(got) == min(limit, len(hits)), where
                sims = {r["id"]: cosine(r["embedding"], params["embedding"]) for r in hits}
                shown = {r["id"] for r in got}
                if got and len(shown) < len(hits):
                    assert min(sims[i] for i in shown) >= max(s for i, s in sims.items() if i not in shown) - 1e-6, \
                        f"not the nearest: {where}"
    elif method == "memory/timeline":
        assert "records" in answer, f"{where}: {answer}"
        want = [r for r in before if matches(Record.from_wire(r), t.scope(params))]
        if params.get("limit"):
            want = want[-params["limit"]:]
        if not params.get("embeddings"):
            want = [without_embedding(r) for r in want]
        got = answer["records"]
        assert [r["id"] for r in got] == [r["id"] for r in want], \
            f"{where}\ngot:  {[r['id'] for r in got]}\nwant: {[r['id'] for r in want]}"
        assert all(same(g, w) for g, w in zip(got, want)), where
    elif method == "memory/forget":
        assert "forgotten" in answer, f"{where}: {answer}"
        scope = t.scope(params, ids_field=True)
        doomed = {r["id"] for r in before if matches(Record.from_wire(r), scope)
                  and (not params.get("query") or has_word(r, params["query"]))}
        left = {r["id"] for r in await t.state(owner)}
        gone = set(by_id) - left
        assert answer["forgotten"] == len(gone), where
        if params.get("query"):
            # Every record holding a query word as a whole word goes, and nothing without a query term
            # (as the tokenizer stems it): a recall lends score to session neighbours (decision 21),
            # and forget by query once deleted them too.
            assert doomed <= gone, f"{where}: kept {doomed - gone}"
            terms = query_terms(params["query"])
            assert all(matches(Record.from_wire(by_id[i]), scope) and not terms.isdisjoint(tokenize(by_id[i]["content"]))
                       for i in gone), f"{where}: deleted a record out of scope or without a query term"
        else:
            assert gone == doomed, f"{where}\ngone: {sorted(gone)}\nwant: {sorted(doomed)}"
    elif method == "memory/reinforce":
        assert answer == {"reinforced": len(set(params["ids"]) & set(by_id))}, where
        after = {r["id"]: r for r in await t.state(owner)}
        for i in set(params["ids"]) & set(by_id):
            assert after[i]["salience"] == pytest.approx(min(1.0, max(0.0, by_id[i]["salience"] + params["amount"])))
    elif method == "memory/fetch":
        held = [r for r in before if r["key"] == params["key"]]
        assert len(held) <= 1, where
        want = held[0] if held else None
        if want is not None and not params.get("embeddings"):
            want = without_embedding(want)
        assert same(answer["record"], want), f"{where}\ngot:  {answer['record']}\nwant: {want}"
    elif method == "memory/session/list":
        counts: dict[str, int] = {}
        for r in before:
            if r["session"] is not None:
                counts[r["session"]] = counts.get(r["session"], 0) + 1
        assert {s["session"]: s["records"] for s in answer["sessions"]} == counts, where


@pytest.mark.parametrize("seed", [int(s) for s in os.environ.get("SEEDS", "1,2").split(",")])
async def test_the_episodic_tier_answers_as_the_reference_semantics(tier: Tier, seed: int) -> None:
    rng = random.Random(seed)
    written: dict[str, dict[str, Any]] = {}
    held: dict[str | None, list[dict[str, Any]]] = {o: [] for o in OWNERS}
    for _ in range(250):
        owner = rng.choice(OWNERS)
        method, params = operation(rng, held[owner], owner)
        await check(tier, method, params, written)
        held[owner] = await tier.state(owner)
        tier.tick()
