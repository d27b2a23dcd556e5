"""The procedural tier (a git repository of Markdown files) against the reference semantics.

A seeded sequence of A2M calls runs against a procedural tier server built as `a2m serve procedural`
builds it, with a restart (close, and a new server on the same data directory) in the middle. A model
of what was written (the protocol's remember: idempotent ids, keys replaced with revision + 1, the
move/import extension; forget, reinforce and touch) is kept beside it. Before each call every owner's
records are read back whole and compared with the model exactly: content byte for byte, metadata with
its types (1 is not 1.0 nor True; -0.0 is stored as 0.0, decision 56), created_at, revision, access
statistics.
Every answer is compared with `a2m.filters.matches` over the records held. Where the protocol leaves
ranking open (scores, their ties) only what is defined is compared.

Every capability the tier's `describe` declares is exercised (session/list counts what the model
holds). Keys are paths in the repository; a key that cannot be one (`..` segments, a backslash,
`.git*`, reserved device names, over-long segments) is stored all the same, encoded (files.key_is_path),
and a key past the protocol's 1,024 bytes is refused with -32602 and nothing of the batch written.

    SEEDS=1,2,3 CALLS=400 pytest tests/backends/test_procedural_parity.py
"""

from __future__ import annotations

import copy
import os
import random
from functools import partial
from pathlib import Path
from typing import Any, AsyncIterator

import pytest

from a2m.filters import matches
from a2m.records import Record
from tests.support import parity
from tests.support.parity import holds_term, text, without_embedding

pytestmark = pytest.mark.anyio

TIER = "procedural"
OWNERS = ("alice", "bob", None, "a/../b %2F é")
IDS = ["r0", "r1", "r2", "r3", "r4", "r5", "r6", "r7", "x/y", "..", ".", ".hidden", "%41", "a b", "é", "CON",
       "A", "a", "x" * 240, "x" * 240 + "y", "寿司"]
# Keys are repository paths: these the tier must take (LIKE and glob metacharacters, dots, unicode, long)
KEYS_OK = ["k/a", "k/a/x", "k", "a%b", "a_b", "a*b", "a?b", "[ab]", "é/ü", ".hidden", "k/.dot", "a..b", "...",
           "k/a.md", "a.md", "寿司/🍣", "A", "a", "k/a ", " k", "x" * 240, "L/" + "/".join(["😀" * 60] * 4),
           "a'b\"c", "#c", "~", "-",
           # ... and these, which cannot be paths, it stores encoded under _ids/_keys/ (files.key_is_path)
           "..", "k/../a", "a\\b", "/k", "k//a", "k/", ".git/x", ".gitignore", "_ids/x", "a.md/b", "nul.txt",
           "x" * 241, "a\tb", "CON", ".github/workflows/x"]
# ... and these the protocol refuses (a key is at most 1,024 bytes), with -32602
KEYS_REFUSED = ["k/" + "x" * 1025,
                "L/" + "/".join(["😀" * 60] * 12)]  # every segment fits a file name, the whole is past 1,024 bytes
PREFIXES = ["k/", "k/a", "", "a%", "a_", "a*", "[", ".", "é", "寿", "x", "K", "a", "L/😀", "..", "k/."]
# Supplied creation times, interleaved with the server's clock (one second per call from 10:00:00)
STAMPS = [f"2026-03-01T10:{m:02d}:{s:02d}.{ms:03d}Z" for m in range(0, 4) for s in (0, 15, 30, 45) for ms in (0, 500)]
VECTORS = [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.7, 0.7, 0.0], [0.0, 0.0, 1.0], [0.1, -0.2, 0.3],
           [-1.0, 1e-7, 2.0**-30]]
META_KEYS = ["topic", "n", "ok", "tags", "superseded_by", "x.y", "nested", "a'b", "50%", "_", "", "<<", "null",
             "true", "1", "? x", ": y", "#c", "é"]
NUMBERS = [*parity.NUMBERS, 0.0, 10**30, -(2**63)]
STRINGS = [*parity.STRINGS, "~", "0o17", "1_000", "2026-03-01", "2026-03-01T10:00:00Z", "a: b", "- x", "# c",
           "\n---\nx: 1\n", "line\nline", " lead", "trail ", "\t", "\u2028", "\x85", "\ufeff", "=", "<<",
           "!!python/none"]
CONTENTS = ["", "\n", "---\nx: 1\n---\n", "line1\r\nline2\r\n", "trailing spaces   ", "a\rb", "\n\nlead",
            "tail\n\n", "\u2028 \x85 \ufeff", "# Heading\n\n- step 1\n- step 2\n"]
meta_value = partial(parity.meta_value, numbers=NUMBERS, strings=STRINGS, nested=[*parity.NESTED, {"x.y": {"": -0.0}}])
scalar = partial(parity.scalar, numbers=NUMBERS, strings=STRINGS)
# a git file keeps its keys in order and a float its sign: both are compared
same = partial(parity.same, signed_zero=True, ordered_keys=True)


def content(rng: random.Random) -> str:
    words = text(rng, rng.randint(1, 5))
    roll = rng.random()
    if roll < 0.3:
        return words
    if roll < 0.8:  # words around an awkward piece: still found by a text search
        return rng.choice(["", words + " "]) + rng.choice(CONTENTS) + rng.choice(["", " " + words, "\n" + words])
    return rng.choice(CONTENTS)


def record_id(rng: random.Random, owner: str | None) -> str:
    # ids are global: mostly the owner's own, now and then one another owner holds (-32005)
    prefix = "" if rng.random() < 0.04 else f"{owner}-"
    return prefix + rng.choice(IDS)


def new_record(rng: random.Random, owner: str | None) -> dict[str, Any]:
    rec: dict[str, Any] = {"content": content(rng)}
    if rng.random() < 0.95:
        rec["id"] = record_id(rng, owner)
    if rng.random() < 0.7:
        rec["created_at"] = rng.choice(STAMPS)
    if rng.random() < 0.55:
        rec["key"] = rng.choice(KEYS_OK) if rng.random() < 0.93 else rng.choice(KEYS_REFUSED)
    for name, pool in (("session", ["s1", "s2"]), ("group", ["g1", "g2"]), ("role", ["user", "assistant"]),
                       ("uri", ["file:///a b.md", "https://x.example/é?q=1"]), ("media_type", ["text/markdown"])):
        if rng.random() < (0.5 if name in ("session", "group", "role") else 0.1):
            rec[name] = rng.choice(pool)
    if rng.random() < 0.7:
        rec["metadata"] = {k: meta_value(rng) for k in rng.sample(META_KEYS, rng.randint(1, 4))}
    if rng.random() < 0.4:
        rec["embedding"] = rng.choice(VECTORS) if rng.random() < 0.97 else [1.0, 0.0]  # -32008
    if rng.random() < 0.2:
        rec["salience"] = rng.choice([0.0, 0.3, 0.5, 1.0, 0.7 - 0.3])
    if rng.random() < 0.1:  # the move/import extension
        rec["revision"] = rng.randint(1, 4)
        rec["access_count"] = rng.choice([0, 3, 2**53 - 1])
        rec["accessed_at"] = rng.choice(STAMPS + [None])
    if rng.random() < 0.05:
        rec["tier"] = TIER
    return rec


def where(rng: random.Random, owner: str | None, held: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for _ in range(1 if rng.random() < 0.7 else 2):
        name = rng.choice(META_KEYS * 2 + ["role", "session", "group", "key", "id", "salience", "revision",
                                           "access_count", "accessed_at", "created_at", "tier", "uri", "content",
                                           "owner", "media_type"])
        if name == "id":
            out[name] = [f"{owner}-{i}" for i in rng.sample(IDS, rng.randint(0, 4))]
        elif name in ("session", "group", "role"):
            out[name] = rng.choice([None, "s1", "g1", "user", ["s2", "g2", "assistant", None]])
        elif name == "key":
            out[name] = rng.choice(KEYS_OK + [None, KEYS_OK[:3]])
        elif name == "tier":
            out[name] = rng.choice([TIER, "elsewhere", None, [TIER, "x"]])
        elif name == "owner":
            out[name] = rng.choice([owner, "someone", None])
        elif name in ("created_at", "accessed_at"):
            out[name] = rng.choice(STAMPS + [None, "2026-03-01T10:00:00Z", 5])
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
    if roll < 0.36:
        return "memory/remember", {**params, "records": [new_record(rng, owner) for _ in range(rng.randint(1, 4))]}
    if roll < 0.56:
        selectors(rng, params, held)
        params["limit"] = rng.choice([1, 1, 2, 3, 5, 10, 50, 0])
        kind = rng.choice(["text", "vector", "hybrid", "none"])
        if kind in ("text", "hybrid"):
            params["query"] = text(rng, rng.randint(1, 3))
        if kind in ("vector", "hybrid"):
            params["embedding"] = rng.choice(VECTORS)
        if rng.random() < 0.2:
            params["min_score"] = rng.choice([0.1, 0.5, 0.9])
        if rng.random() < 0.5:
            params["touch"] = rng.random() < 0.5
        params["embeddings"] = rng.random() < 0.3
        return "memory/recall", params
    if roll < 0.70:
        selectors(rng, params, held)
        if rng.random() < 0.5:
            params["limit"] = rng.choice([1, 2, 3, 7, 0])
        params["embeddings"] = rng.random() < 0.3
        return "memory/timeline", params
    if roll < 0.79:
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
    if roll < 0.87:
        return "memory/reinforce", {**params, "ids": [f"{owner}-{i}" for i in rng.sample(IDS, rng.randint(1, 4))],
                                    "amount": rng.choice([0.1, -0.2, 0.5, 1, -0.3, 0.2, 0.7 - 0.3])}
    if roll < 0.95:
        keys = [r["key"] for r in held if r["key"]]
        key = rng.choice(keys) if keys and rng.random() < 0.6 else rng.choice(KEYS_OK + KEYS_REFUSED)
        return "memory/fetch", {**params, "key": key, "embeddings": rng.random() < 0.5}
    if roll < 0.97:
        return "memory/promote", {**params, "ids": [f"{owner}-{i}" for i in rng.sample(IDS, 2)],
                                  "tier": rng.choice([TIER, "elsewhere"])}
    return "memory/session/list", params


class Model:
    """What the tier must hold: every record written, by id, in its wire form (embedding included)."""

    def __init__(self) -> None:
        self.records: dict[str, dict[str, Any]] = {}
        self.dims: int | None = None  # set by the first vector written, as describe's `dimensions`

    def of(self, owner: str | None) -> dict[str, dict[str, Any]]:
        return {i: r for i, r in self.records.items() if r["owner"] == owner}

    def at_key(self, owner: str | None, key: str) -> dict[str, Any] | None:
        return next((r for r in self.records.values() if r["owner"] == owner and r["key"] == key), None)

    def remember(self, params: dict[str, Any], stamp: str, ids: list[str]) -> list[str] | int:
        """The protocol's remember over the model: the ids it answers, or the error code it must give."""
        owner = params.get("owner")
        raws = params["records"]
        if any(r.get("key") in KEYS_REFUSED for r in raws):  # the protocol's checks come first
            return -32602
        widths = {len(r["embedding"]) for r in raws if "embedding" in r}
        if widths and widths != {self.dims if self.dims is not None else next(iter(widths))}:
            return -32008
        supplied = iter(ids)  # ids the server made up for records that came without one
        batch = []
        for index, raw in enumerate(raws):
            rid = raw["id"] if "id" in raw else next(supplied, f"(an id the server makes up: {index})")
            rec = {"id": rid, "content": raw["content"], "created_at": raw.get("created_at", stamp),
                   "role": raw.get("role"), "metadata": unsigned_zero(raw.get("metadata", {})), "group": raw.get("group"),
                   "tier": TIER, "salience": float(raw.get("salience", 0.5)),
                   "access_count": raw.get("access_count", 0), "accessed_at": raw.get("accessed_at"),
                   "owner": owner, "session": raw.get("session"), "key": raw.get("key"),
                   "revision": raw.get("revision", 1), "uri": raw.get("uri"), "media_type": raw.get("media_type"),
                   "embedding": raw.get("embedding")}
            batch.append((raw, rec))
        for _, rec in batch:
            held = self.records.get(rec["id"])
            if held is not None and held["owner"] != owner:
                return -32005
        out: list[str] = []
        puts: dict[str, dict[str, Any]] = {}
        deletes: list[str] = []
        keyed: dict[str, dict[str, Any]] = {}
        for raw, rec in batch:
            if "id" in raw and raw.get("revision") is None and rec["id"] in self.records and rec["id"] not in deletes:
                out.append(rec["id"])  # idempotent: an existing id is returned, its key not replaced
                continue
            key = rec["key"]
            current = keyed.get(key) or self.at_key(owner, key) if key else None
            if current is not None:
                if raw.get("revision") is not None:  # a move or an import: the newer revision wins, ids kept
                    if rec["revision"] < current["revision"]:
                        out.append(current["id"])
                        continue
                    if current["id"] != rec["id"]:
                        deletes.append(current["id"])  # and a later record of the batch may write it anew
                        puts.pop(current["id"], None)
                else:
                    rec = rec | {"id": current["id"], "revision": current["revision"] + 1,
                                 "access_count": current["access_count"], "accessed_at": current["accessed_at"],
                                 "salience": current["salience"] if raw.get("salience") is None else rec["salience"]}
            elif (rec["id"] in self.records and rec["id"] not in deletes) or rec["id"] in puts:
                out.append(rec["id"])  # idempotent
                continue
            puts.pop(rec["id"], None)
            puts[rec["id"]] = rec
            if key:
                keyed[key] = rec
            out.append(rec["id"])
        if self.dims is None:
            self.dims = next((len(r["embedding"]) for r in puts.values() if r["embedding"] is not None), None)
        for rid in deletes:
            self.records.pop(rid, None)
        for rid, rec in puts.items():
            self.records.pop(rid, None)
            if rec["key"] is not None:  # an occupied key is replaced, never two records on one key
                other = self.at_key(owner, rec["key"])
                if other is not None:
                    self.records.pop(other["id"])
            self.records[rid] = rec
        return out


Tier = parity.Served


@pytest.fixture
async def tier(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Tier]:
    async with parity.served(TIER, tmp_path / TIER, monkeypatch, first_minute=0) as served:
        yield served


def unsigned_zero(value: Any) -> Any:
    """Metadata as every tier stores it: -0.0 written as 0.0 (decision 56), at any depth."""
    if isinstance(value, dict):
        return {k: unsigned_zero(v) for k, v in value.items()}
    if isinstance(value, list):
        return [unsigned_zero(v) for v in value]
    return 0.0 if type(value) is float and value == 0.0 else value


def check_shown(got: list[dict[str, Any]], model: Model, params: dict[str, Any], where: str) -> None:
    """Each record returned is the one held, unchanged (bar score)."""
    for r in got:
        expect = model.records[r["id"]]
        if not params.get("embeddings"):
            expect = without_embedding(expect)
        shown = {k: v for k, v in r.items() if k != "score"}
        assert same(shown, expect), f"record changed: {where}\ngot:  {shown}\nwant: {expect}"


async def check(t: Tier, model: Model, method: str, params: dict[str, Any]) -> None:
    owner = params.get("owner")
    stamp = t.stamp["now"]
    before = await t.state(owner)
    where = f"{method} {params}"
    # what was written is what is held: every field, types included
    held = {r["id"]: r for r in before}
    want_held = model.of(owner)
    assert set(held) == set(want_held), f"before {where}\nheld only: {set(held) - set(want_held)}\n" \
                                         f"missing: {set(want_held) - set(held)}"
    for rid, r in held.items():
        assert same(r, want_held[rid]), f"before {where}\nheld: {r}\nwant: {want_held[rid]}"
    stamps = [r["created_at"] for r in before]
    assert stamps == sorted(stamps), f"timeline not by created_at: {stamps}"

    sent = copy.deepcopy(params)  # what was written, whatever the server does to the request it was handed
    answer = await t.call(method, params)
    if method == "memory/remember":
        made = [i for i in answer.get("ids", [])]
        expect = model.remember(sent, stamp, [i for raw, i in zip(params["records"], made) if "id" not in raw])
        if isinstance(expect, int):
            assert answer == {"error": expect}, f"{where}: {answer}, not {expect}"
        else:
            assert answer == {"ids": expect}, f"{where}: {answer}, not {expect}"
    elif method == "memory/recall" and "embedding" in params and len(params["embedding"]) != (model.dims or 3):
        assert answer == {"error": -32008}, f"{where}: {answer}"
    elif method == "memory/recall":
        assert "records" in answer, f"{where}: {answer}"
        got = answer["records"]
        scope = t.scope(params)
        in_scope = [r for r in before if matches(Record.from_wire(r), scope)]
        limit = params["limit"] or 1000
        scores = [r["score"] for r in got]
        assert scores == sorted(scores, reverse=True), f"not by score: {where}"
        assert all(0.0 <= s <= 1.0 for s in scores), where
        if "min_score" in params:
            assert all(s >= params["min_score"] for s in scores), where
        assert len({r["id"] for r in got}) == len(got), f"a record twice: {where}"
        assert {r["id"] for r in got} <= {r["id"] for r in in_scope}, f"out of scope: {where}"
        if params.get("touch", True) and got:
            for r in got:
                model.records[r["id"]] |= {"access_count": model.records[r["id"]]["access_count"] + 1,
                                           "accessed_at": stamp}
        check_shown(got, model, params, where)
        if "query" not in params and "embedding" not in params:
            want = [r["id"] for r in reversed(in_scope)][:limit]
            if "min_score" in params:
                want = want[:len(got)]
            assert [r["id"] for r in got] == want, f"{where}\ngot:  {[r['id'] for r in got]}\nwant: {want}"
        else:
            hits = [r for r in in_scope if ("query" in params and holds_term(r, params["query"]))
                    or ("embedding" in params and r["embedding"] is not None)]
            assert {r["id"] for r in got} <= {r["id"] for r in hits}, f"found what holds no term nor vector: {where}"
            if "min_score" not in params:
                assert len(got) == min(limit, len(hits)), f"{len(got)} of {len(hits)} found: {where}"
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
                  and (not params.get("query") or holds_term(r, params["query"]))}
        assert answer["forgotten"] == len(doomed), f"{where}: {answer}, not {len(doomed)}"
        for rid in doomed:
            del model.records[rid]
    elif method == "memory/reinforce":
        found = set(params["ids"]) & set(held)
        assert answer == {"reinforced": len(found)}, f"{where}: {answer}"
        for rid in found:
            r = model.records[rid]
            r["salience"] = min(1.0, max(0.0, r["salience"] + float(params["amount"])))
    elif method == "memory/fetch":
        if params["key"] in KEYS_REFUSED:  # no record can be there
            assert answer == {"record": None}, where
            return
        want_record = model.at_key(owner, params["key"])
        if want_record is not None and not params.get("embeddings"):
            want_record = without_embedding(want_record)
        assert "record" in answer, f"{where}: {answer}"
        assert same(answer["record"], want_record), f"{where}\ngot:  {answer['record']}\nwant: {want_record}"
    elif method == "memory/promote":
        assert answer == ({"promoted": 0} if params["tier"] == TIER else {"error": -32002}), f"{where}: {answer}"
    elif method == "memory/session/list":  # what the owner holds, by session; the implicit bucket is none
        want: dict[str, dict[str, Any]] = {}
        for r in model.of(owner).values():
            if r["session"] is None:
                continue
            entry = want.setdefault(r["session"], {"session": r["session"], "records": 0, "tiers": {TIER: 0},
                                                   "opened_at": r["created_at"], "touched_at": r["created_at"]})
            entry["records"] += 1
            entry["tiers"][TIER] += 1
            entry["opened_at"] = min(entry["opened_at"], r["created_at"])
            entry["touched_at"] = max(entry["touched_at"], r["created_at"], r["accessed_at"] or "")
        assert answer == {"sessions": [want[s] for s in sorted(want)]}, f"{where}: {answer}"


# Before the fixes of decision 54 seeds 2 and 3 (and 9 of 1..12) failed. SEEDS=1,...,80 CALLS=400 pass
# (about 4 minutes).
@pytest.mark.parametrize("seed", [int(s) for s in os.environ.get("SEEDS", "1,2,3").split(",")])
async def test_the_procedural_tier_answers_as_the_reference_semantics(tier: Tier, seed: int) -> None:
    rng = random.Random(seed)
    calls = int(os.environ.get("CALLS", "200"))
    described = await tier.call("memory/describe", {})
    assert {"core", "salience", "scopes", "sessions", "keys", "embeddings", "external", "tiers"} <= \
        set(described["capabilities"])
    model = Model()
    held: dict[str | None, list[dict[str, Any]]] = {o: [] for o in OWNERS}
    for n in range(calls):
        if n == calls // 2 or rng.random() < 0.01:  # close, and a new server on the same data directory
            await tier.restart()
        owner = rng.choice(OWNERS)
        method, params = operation(rng, held[owner], owner)
        await check(tier, model, method, params)
        held[owner] = await tier.state(owner)
        tier.tick()
    for owner in OWNERS:  # and after a last restart, all of it still there
        await tier.restart()
        got = {r["id"]: r for r in await tier.state(owner)}
        want = model.of(owner)
        assert set(got) == set(want) and all(same(got[i], want[i]) for i in got), owner
