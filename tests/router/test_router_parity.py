"""The router over real tier servers against a reference model of the federation.

A seeded sequence of router calls from a few owners runs against a real federation (Redis,
PostgreSQL, Qdrant Edge, git, embedded) with a small working capacity, so writes spill, sessions
close, recalls earn promotion. The model holds ONE flat set of records per owner (where a record
lives is observed, not predicted, except where the protocol or the design fixes it). After every
call the tier servers are read directly and checked against the model:

- every record is in exactly one tier, none lost, none duplicated, none changed; groups never
  split; a key has one record per owner, at the model's revision and content;
- working holds at most its capacity per (owner, session); records move only where the policy
  lets them (spill down, promotion, a promote call, a session close);
- recall, timeline, fetch and session/list answer as `a2m.filters.matches` says over the model
  (only what is defined: not scores, not the order of equal timestamps);
- one owner never sees another's records, in reads or events;
- an error carries the protocol's code and changes nothing.

SEEDS=1,2,3 CALLS=250 run more; the default stays small for CI.
"""

from __future__ import annotations

import asyncio
import os
import random
import uuid
from collections import Counter
from typing import Any, Iterator

import pytest

from a2m.client import HTTPClient
from a2m.errors import A2MError
from a2m.filters import parse_scope, matches
from a2m.records import Record
from tests.support.parity import same

from .stack import Stack, federation

pytestmark = pytest.mark.anyio

CAPACITY = 4
PROMOTE_AFTER = 2
TIERS = [
    {"name": "working", "kind": "working", "capacity": CAPACITY, "per_session": True, "spill_to": "episodic",
     "timeout": 10.0},
    {"name": "episodic", "kind": "episodic", "spill_to": "semantic", "promote_to": "semantic",
     "promote_after": PROMOTE_AFTER, "timeout": 10.0},
    {"name": "semantic", "kind": "semantic", "timeout": 10.0},
    {"name": "procedural", "kind": "procedural", "timeout": 10.0},
]
NAMES = [t["name"] for t in TIERS]
DEPTH = {"working": 0, "episodic": 1, "semantic": 2, "procedural": 0}

SEEDS = [int(s) for s in os.environ.get("SEEDS", "1,2").split(",")]
CALLS = int(os.environ.get("CALLS", "200"))

WORDS = ["cat", "sofa", "revenue", "grew", "city", "bologna", "milan", "tea", "green", "rocket", "plan", "river"]
KEYS = ["user/city", "user/name", "app/plan", "app/plan/b", "k1", "k2", "notes/x"]
PREFIXES = ["user/", "app/", "app/plan", "k", "notes/", "zz"]
GROUPS = ["g1", "g2", "g3"]
SESSIONS = ["s1", "s2", "s1", None]
TOPICS = ["food", "work", "travel"]
FIELDS = ("content", "key", "revision", "metadata", "session", "group", "role", "created_at")


# ---- the model ---------------------------------------------------------------------------------


class Model:
    def __init__(self, owners: list[str]) -> None:
        self.owners = owners
        self.records: dict[str, dict[str, dict[str, Any]]] = {o: {} for o in owners}  # owner -> id -> record
        self.ever: dict[str, set[str]] = {o: set() for o in owners}  # every id an owner has held
        self.token = 0

    def snapshot(self) -> dict[str, dict[str, dict[str, Any]]]:
        return {o: {i: dict(r) for i, r in recs.items()} for o, recs in self.records.items()}

    def word(self) -> str:
        self.token += 1
        return f"tok{self.token}"

    def by_key(self, owner: str, key: str) -> dict[str, Any] | None:
        held = [r for r in self.records[owner].values() if r["key"] == key]
        assert len(held) <= 1, f"model holds key {key} twice"
        return held[0] if held else None

    def group_tier(self, owner: str, group: str) -> str | None:
        tiers = {r["tier"] for r in self.records[owner].values() if r["group"] == group}
        assert len(tiers) <= 1
        return tiers.pop() if tiers else None

    def owner_of(self, rid: str) -> str | None:
        return next((o for o, recs in self.records.items() if rid in recs), None)


def as_record(rec: dict[str, Any], owner: str) -> Record:
    return Record(id=rec["id"], content=rec["content"], created_at=rec["created_at"], role=rec["role"],
                  metadata=rec["metadata"], group=rec["group"], tier=rec["tier"], owner=owner,
                  session=rec["session"], key=rec["key"], revision=rec["revision"], salience=rec["salience"])


def in_scope(model: Model, owner: str, params: dict[str, Any], *, ids_field: bool = False) -> list[dict[str, Any]]:
    scope = parse_scope(params, owner, ids_field=ids_field)
    tiers = [params["tier"]] if params.get("tier") else NAMES
    return [r for r in model.records[owner].values() if r["tier"] in tiers and matches(as_record(r, owner), scope)]


# ---- generating calls --------------------------------------------------------------------------


def metadata(rng: random.Random) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if rng.random() < 0.6:
        out["topic"] = rng.choice(TOPICS)
    if rng.random() < 0.4:
        out["n"] = rng.choice([0, 1, 2, 2.5, -3, 2**40])
    if rng.random() < 0.3:
        out["tags"] = rng.sample(["a", "b", "c", 1, True], rng.randint(0, 3))
    if rng.random() < 0.15:
        out["nested"] = {"x": [1, "y", None], "ok": False}
    return out


def new_record(rng: random.Random, model: Model, owner: str, *, tiered: bool = True) -> dict[str, Any]:
    rec: dict[str, Any] = {"content": " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 3))) + " "
                           + model.word()}
    if rng.random() < 0.35:
        rec["key"] = rng.choice(KEYS)
    if rng.random() < 0.25:
        rec["group"] = rng.choice(GROUPS)
    session = rng.choice(SESSIONS)
    if session is not None:
        rec["session"] = session
    if rng.random() < 0.5:
        rec["role"] = rng.choice(["user", "assistant", "tool"])
    if rng.random() < 0.6:
        rec["metadata"] = metadata(rng)
    if rng.random() < 0.15:
        rec["salience"] = rng.choice([0.0, 0.25, 0.75, 1.0])
    if rng.random() < 0.2:  # an explicit id: a new one, or one of this owner's (idempotent)
        held = list(model.records[owner])
        rec["id"] = rng.choice(held) if held and rng.random() < 0.4 else f"{owner}-x{rng.randint(0, 10**6)}"
    if tiered and rng.random() < 0.2:
        rec["tier"] = rng.choice(["working", "episodic", "semantic", "semantic", "procedural"])
    if rng.random() < 0.05:  # an import's own time: older than anything written now
        rec["created_at"] = f"2026-01-01T00:00:{rng.randint(0, 59):02d}.{rng.choice([0, 500]):03d}Z"
    return rec


def batch(rng: random.Random, model: Model, owner: str) -> list[dict[str, Any]]:
    """1-4 records; an id at most once per batch, a key sometimes twice (written one after the
    other: the second replaces the first)."""
    out: list[dict[str, Any]] = []
    for _ in range(rng.choice([1, 1, 1, 2, 3, 4])):
        rec = new_record(rng, model, owner)
        if "id" in rec and any(o.get("id") == rec["id"] for o in out):
            del rec["id"]
        if out and rng.random() < 0.1:
            rec["key"] = rng.choice(KEYS)
            rec.pop("tier", None)
            rec.pop("id", None)
            first = next((o for o in out if o.get("key") == rec["key"]), None)
            if first is not None and "tier" in first:
                rec["tier"] = first["tier"]
        out.append(rec)
    if rng.random() < 0.15 and len(out) > 1:  # a group written together
        group = rng.choice(GROUPS)
        tier = out[0].get("tier")
        for rec in out:
            rec["group"] = group
            rec.pop("tier", None)
            if tier:
                rec["tier"] = tier
    return out


BAD_RECORDS = [
    ({"content": 5}, -32602), ({}, -32602), ({"content": "x", "metadata": "nope"}, -32602),
    ({"content": "x", "key": ""}, -32602), ({"content": "x", "session": ""}, -32602),
    ({"content": "x", "role": 7}, -32602),
    ({"content": "x", "session": ["s"]}, -32602), ({"content": "x", "tier": "nowhere"}, -32002),
    ({"content": "x\u0000y"}, -32602), ({"content": "x", "embedding": "v"}, -32602),
]


def where(rng: random.Random, model: Model, owner: str) -> dict[str, Any]:
    held = list(model.records[owner].values())
    out: dict[str, Any] = {}
    for _ in range(rng.choice([1, 1, 2])):
        name = rng.choice(["session", "group", "role", "key", "topic", "id", "tags", "n", "tier"])
        if name == "session":
            out[name] = rng.choice(SESSIONS + [["s1", "s2"], ["s3", None]])
        elif name == "group":
            out[name] = rng.choice(GROUPS + [None, GROUPS[:2]])
        elif name == "role":
            out[name] = rng.choice(["user", "assistant", None, ["tool", "user"]])
        elif name == "key":
            out[name] = rng.choice(KEYS + [None, KEYS[:3]])
        elif name == "topic":
            out[name] = rng.choice(TOPICS + [None, TOPICS[:2]])
        elif name == "id":
            out[name] = [r["id"] for r in rng.sample(held, min(len(held), rng.randint(0, 4)))] + ["nope"]
        elif name == "tags":
            out[name] = rng.choice(["a", "b", 1, True])
        elif name == "n":
            out[name] = rng.choice([0, 1, 2.5, -3, 2**40])
        else:
            out[name] = rng.choice(NAMES + [["working", "semantic"]])
    return out


def selectors(rng: random.Random, model: Model, owner: str, params: dict[str, Any]) -> None:
    if rng.random() < 0.45:
        params["where"] = where(rng, model, owner)
    stamps = sorted(r["created_at"] for r in model.records[owner].values())
    if stamps and rng.random() < 0.1:
        params["after"] = rng.choice(stamps)
    if stamps and rng.random() < 0.1:
        params["before"] = rng.choice(stamps)
    if rng.random() < 0.2:
        params["key_prefix"] = rng.choice(PREFIXES)
    if rng.random() < 0.25:
        params["tier"] = rng.choice(NAMES)


def operation(rng: random.Random, model: Model, owner: str, last: list[str]) -> tuple[str, dict[str, Any]]:
    params: dict[str, Any] = {"owner": owner}
    held = list(model.records[owner].values())
    roll = rng.random()
    if roll < 0.36:
        records = batch(rng, model, owner)
        if rng.random() < 0.08:  # one bad record: nothing is written
            bad, _ = rng.choice(BAD_RECORDS)
            records.insert(rng.randint(0, len(records)), dict(bad))
        return "memory/remember", {**params, "records": records}
    if roll < 0.40 and held:  # a key (or group) named with another tier than where it lives
        keyed = [r for r in held if r["key"]]
        if keyed:
            target = rng.choice(keyed)
            other = rng.choice([n for n in ("episodic", "semantic", "procedural", "working") if n != target["tier"]])
            rec = new_record(rng, model, owner, tiered=False) | {"key": target["key"], "tier": other}
            rec.pop("group", None)
            rec.pop("id", None)
            return "memory/remember", {**params, "records": [rec]}
    if roll < 0.43 and len(model.owners) > 1:
        # A record the tier it goes to refuses, beside good records for other tiers, written first:
        # an id another owner holds in that tier (-32005), or a key too long for a file path (-32602).
        # (An id another owner holds in ANOTHER tier the router cannot see: tiers answer one owner's
        # partition, so the write succeeds; operations.md lists the record that then never spills.)
        others = [r for o in model.owners if o != owner for r in model.records[o].values()]
        if others and rng.random() < 0.6:
            theirs = rng.choice(others)
            bad = {"id": theirs["id"], "content": "theirs?"} | ({} if theirs["tier"] == "working" else {"tier": theirs["tier"]})
        else:
            bad = {"content": "a long path", "key": "deep/" + "/".join(["a" * 200] * 25), "tier": "procedural"}
        good = [{"content": f"{rng.choice(WORDS)} {model.word()}", "tier": tier}
                for tier in rng.sample(["working", "episodic", "semantic"], rng.randint(0, 2))]
        records = good + [bad]
        rng.shuffle(records)
        return "memory/remember", {**params, "records": records}
    if roll < 0.55:
        selectors(rng, model, owner, params)
        params["limit"] = rng.choice([0, 1, 3, 5, 10, 50, 1000])
        kind = rng.random()
        if kind < 0.35 and held:  # one record's own word: found wherever it lives
            params["query"] = rng.choice(held)["content"].split()[-1]
            params["limit"] = max(params["limit"], 4)
        elif kind < 0.45 and last:
            fresh = [model.records[owner][i] for i in last if i in model.records[owner]]
            if fresh:
                params["query"] = fresh[-1]["content"].split()[-1]
                params["limit"] = max(params["limit"], 4)
        elif kind < 0.75:
            params["query"] = " ".join(rng.sample(WORDS, rng.randint(1, 2)))
        if rng.random() < 0.3:
            params["touch"] = False
        return "memory/recall", params
    if roll < 0.65:
        selectors(rng, model, owner, params)
        if rng.random() < 0.5:
            params["limit"] = rng.choice([1, 2, 5, 20])
        return "memory/timeline", params
    if roll < 0.70:
        return "memory/fetch", {**params, "key": rng.choice(KEYS)}
    if roll < 0.74:  # "fetch by ids"
        ids = [r["id"] for r in rng.sample(held, min(len(held), rng.randint(1, 4)))] + [f"{owner}-missing"]
        return "memory/timeline", {**params, "where": {"id": ids}}
    if roll < 0.79:
        choice = rng.random()
        if choice < 0.15 and held:  # one record's own word
            params["query"] = rng.choice(held)["content"].split()[-1]
        elif choice < 0.4 and held:
            params["ids"] = [r["id"] for r in rng.sample(held, min(len(held), rng.randint(1, 2)))]
        elif choice < 0.7:
            params["where"] = where(rng, model, owner)
        else:
            params["key_prefix"] = rng.choice(PREFIXES)
        if rng.random() < 0.2:
            params["tier"] = rng.choice(NAMES)
        return "memory/forget", params
    if roll < 0.83 and held:
        ids = [r["id"] for r in rng.sample(held, min(len(held), rng.randint(1, 3)))] + [f"{owner}-missing"]
        return "memory/reinforce", {**params, "ids": ids, "amount": rng.choice([0.1, -0.2, 0.5, 1, -1, 0.3])}
    if roll < 0.87 and held:
        ids = [r["id"] for r in rng.sample(held, min(len(held), rng.randint(1, 3)))]
        params = {**params, "ids": ids + [f"{owner}-missing"],
                  "tier": rng.choice(["episodic", "semantic", "episodic", "semantic", "procedural", "working"])}
        if rng.random() < 0.3:
            params["salience"] = rng.choice([0.0, 0.9])
        return "memory/promote", params
    if roll < 0.90:
        return "memory/consolidate", params
    if roll < 0.94:
        return "memory/session/close", {**params, "session": rng.choice(["s1", "s2", "s3", "never"])}
    if roll < 0.96:
        return "memory/session/list", params
    bad: list[tuple[str, dict[str, Any]]] = [
        ("memory/recall", {"tier": "nowhere"}), ("memory/recall", {"limit": -1}),
        ("memory/recall", {"where": "x"}), ("memory/timeline", {"tier": "nowhere"}),
        ("memory/forget", {}), ("memory/forget", {"ids": ["x"], "tier": "nowhere"}),
        ("memory/fetch", {"key": ""}), ("memory/fetch", {}), ("memory/reinforce", {"ids": ["x"], "amount": 2}),
        ("memory/reinforce", {}), ("memory/promote", {"ids": ["x"], "tier": "nowhere"}),
        ("memory/promote", {"ids": ["x"]}), ("memory/session/close", {}),
        ("memory/session/close", {"session": ""}), ("memory/remember", {"records": []}),
    ]
    method, extra = rng.choice(bad)
    return method, {**params, **extra}


def expected_error(method: str, params: dict[str, Any]) -> int | None:
    """The code the protocol gives the malformed calls `operation` makes (None: not one of them)."""
    if params.get("_as", params["owner"]) != params["owner"]:
        return -32005  # an owner other than the authenticated principal (protocol §7)
    if params.get("tier") == "nowhere":
        return -32002
    if method == "memory/remember":
        for rec in params["records"]:
            for bad, code in BAD_RECORDS:
                if rec == bad:
                    return code
        if not params["records"]:
            return -32602
        if any(len(rec.get("key") or "") > 4000 for rec in params["records"]):
            return -32602  # procedural's path limit (decision 54)
        return None
    if method == "memory/recall" and (params.get("limit") == -1 or params.get("where") == "x"):
        return -32602
    if method == "memory/forget" and set(params) == {"owner"}:
        return -32602
    if method == "memory/fetch" and not params.get("key"):
        return -32602
    if method == "memory/reinforce" and ("ids" not in params or params.get("amount") == 2):
        return -32602
    if method == "memory/promote" and "tier" not in params:
        return -32602
    if method == "memory/session/close" and not params.get("session"):
        return -32602
    return None


# ---- the federation as it is ---------------------------------------------------------------------


class Federation:
    """The router, called as each owner: with `tokens`, over HTTP as that owner's principal (the
    call's `owner` sent on every other call, and `_as` naming another principal than the owner);
    without, on a trusted connection that names the owner."""

    def __init__(self, stack: Stack, tokens: dict[str, str] | None = None) -> None:
        self.tokens = tokens
        self.router = HTTPClient(stack.url, timeout=60.0)
        self.as_owner = {o: HTTPClient(stack.url, token=t, timeout=60.0) for o, t in (tokens or {}).items()}
        self.tiers = {name: HTTPClient(stack.tiers[name].url, timeout=60.0) for name in NAMES}
        self.sent = 0

    async def close(self) -> None:
        await asyncio.gather(self.router.close(), *(c.close() for c in self.as_owner.values()),
                             *(t.close() for t in self.tiers.values()))

    async def call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        params = dict(params)
        principal = params.pop("_as", params.get("owner"))
        client = self.router
        if self.tokens is not None:
            client = self.as_owner[principal]
            self.sent += 1
            if self.sent % 2 and principal == params.get("owner"):
                del params["owner"]  # the principal is the owner
        try:
            return await client.call(method, params)
        except A2MError as exc:
            return {"error": exc.code, "message": exc.message}

    async def placement(self, owner: str) -> dict[str, list[dict[str, Any]]]:
        """tier -> every record of `owner` there, read from the tier server itself."""
        answers = await asyncio.gather(*(self.tiers[name].call("memory/timeline", {"owner": owner, "limit": 0})
                                         for name in NAMES))
        return {name: answer["records"] for name, answer in zip(NAMES, answers)}


def found(held: dict[str, list[dict[str, Any]]]) -> dict[str, tuple[str, dict[str, Any]]]:
    """id -> (tier, record); a record in two tiers is a failure."""
    out: dict[str, tuple[str, dict[str, Any]]] = {}
    for name, records in held.items():
        for rec in records:
            assert rec["id"] not in out, f"{rec['id']} is in {out[rec['id']][0]} and {name}"
            out[rec["id"]] = (name, rec)
    return out


def ids_by_time(records: list[dict[str, Any]]) -> list[list[str]]:
    """Ids in runs of equal created_at (the order inside a run is not defined)."""
    runs: list[list[str]] = []
    last = None
    for rec in records:
        if runs and rec["created_at"] == last:
            runs[-1].append(rec["id"])
        else:
            runs.append([rec["id"]])
        last = rec["created_at"]
    return runs


def same_up_to_ties(got: list[dict[str, Any]], want: list[dict[str, Any]], newest_first: bool, where: str) -> None:
    """`got` is `want` in created_at order where it is defined: equal stamps may come in any order,
    and the run of equal stamps a limit cuts may be any part of that run."""
    assert len(got) == len(want), f"{len(got)} records, want {len(want)}: {where}"
    stamps = [r["created_at"] for r in got]
    assert stamps == sorted(stamps, reverse=newest_first), f"not in time order: {where}"
    assert stamps == [r["created_at"] for r in want], f"wrong records: {where}"
    for stamp in set(stamps):
        run = {r["id"] for r in got if r["created_at"] == stamp}
        cut = {r["id"] for r in want if r["created_at"] == stamp}
        if len(run) == len(cut) and run != cut:
            assert len(want) and stamp in (want[0]["created_at"], want[-1]["created_at"]), \
                f"records at {stamp}: got {sorted(run)}, want {sorted(cut)}: {where}"


class Checker:
    def __init__(self, fed: Federation, model: Model, *, exact_counts: bool) -> None:
        self.exact_counts = exact_counts
        self.fed = fed
        self.model = model
        self.cursors: dict[str, Any] = {}
        self.stats: Counter[str] = Counter()
        # (owner, session) a promote into working filled past capacity: nothing spills until the
        # next write there (spilling at once would send the promoted records straight back)
        self.overfull: set[tuple[str, Any]] = set()
        self.expect: dict[str, Any] = {}

    async def start(self) -> None:
        for owner in self.model.owners:
            self.cursors[owner] = (await self.fed.call("memory/events", {"owner": owner}))["cursor"]

    async def state(self) -> dict[str, dict[str, tuple[str, dict[str, Any]]]]:
        held = await asyncio.gather(*(self.fed.placement(o) for o in self.model.owners))
        return {o: found(h) for o, h in zip(self.model.owners, held)}

    def compare(self, state: dict[str, dict[str, tuple[str, dict[str, Any]]]], where: str) -> None:
        """The federation holds exactly the model: every record once, unchanged."""
        for owner in self.model.owners:
            want, got = self.model.records[owner], state[owner]
            assert set(got) == set(want), \
                f"{owner}: lost {sorted(set(want) - set(got))}, unexpected {sorted(set(got) - set(want))}: {where}"
            for rid, rec in want.items():
                tier, stored = got[rid]
                assert tier == rec["tier"], f"{rid} in {tier}, model says {rec['tier']}: {where}"
                for field in FIELDS:
                    assert same(stored[field], rec[field]), \
                        f"{rid}.{field} is {stored[field]!r}, model {rec[field]!r}: {where}"
                assert stored["salience"] == pytest.approx(rec["salience"]), f"{rid}.salience: {where}"
                if self.exact_counts:
                    assert stored["access_count"] == rec["access_count"], \
                        f"{rid} recalled {rec['access_count']} times, access_count {stored['access_count']}: {where}"
                else:
                    assert stored["access_count"] <= rec["access_count"], f"{rid}.access_count: {where}"
            groups: dict[str, set[str]] = {}
            keys: dict[str, list[str]] = {}
            for rid, (tier, stored) in got.items():
                if stored["group"]:
                    groups.setdefault(stored["group"], set()).add(tier)
                if stored["key"]:
                    keys.setdefault(stored["key"], []).append(rid)
            assert all(len(t) == 1 for t in groups.values()), f"{owner}: a group split {groups}: {where}"
            assert all(len(i) == 1 for i in keys.values()), f"{owner}: a key held twice {keys}: {where}"

    def capacity(self, state: dict[str, dict[str, tuple[str, dict[str, Any]]]], where: str) -> None:
        for owner in self.model.owners:
            sessions: dict[Any, int] = {}
            for tier, stored in state[owner].values():
                if tier == "working":
                    sessions[stored["session"]] = sessions.get(stored["session"], 0) + 1
            over = {s: n for s, n in sessions.items() if n > CAPACITY and (owner, s) not in self.overfull}
            assert not over, f"{owner}: working over capacity {over}: {where}"

    def moves(self, state: dict[str, dict[str, tuple[str, dict[str, Any]]]], allowed: Any, where: str) -> dict[str, list[str]]:
        """Update the model's tiers from what moved, each move checked by `allowed(owner, rec, old, new)`."""
        moved: dict[str, list[str]] = {}
        for owner in self.model.owners:
            for rid, rec in self.model.records[owner].items():
                if rid not in state[owner]:
                    continue
                tier = state[owner][rid][0]
                if tier != rec["tier"]:
                    assert allowed(owner, rec, rec["tier"], tier), \
                        f"{owner}: {rid} moved {rec['tier']} -> {tier}: {where}"
                    moved.setdefault(f"{rec['tier']}->{tier}", []).append(rid)
                    rec["tier"] = tier
        return moved

    async def events(self, where: str) -> dict[str, list[dict[str, Any]]]:
        """The events each owner sees since the last call; none names another owner's record."""
        out: dict[str, list[dict[str, Any]]] = {}
        for owner in self.model.owners:
            answer = await self.fed.call("memory/events", {"owner": owner, "cursor": self.cursors[owner],
                                                           "limit": 1000})
            assert "events" in answer, f"{answer}: {where}"
            assert not answer.get("reset"), where
            self.cursors[owner] = answer["cursor"]
            for event in answer["events"]:
                named = [event["id"]] if "id" in event else list(event.get("ids") or [])
                foreign = [i for i in named if i not in self.model.ever[owner]]
                assert not foreign, f"{owner} saw event {event} of ids it never held: {where}"
            out[owner] = answer["events"]
        return out

    def kinds(self, seen: dict[str, list[dict[str, Any]]], owner: str, where: str) -> dict[str, list[dict[str, Any]]]:
        """kind -> the events of this call (only its owner's), other owners' logs untouched."""
        for other, events in seen.items():
            assert other == owner or not events, f"{other} got events of {owner}'s call {events}: {where}"
        out: dict[str, list[dict[str, Any]]] = {}
        for event in seen[owner]:
            out.setdefault(event["kind"], []).append(event)
        return out

    # ---- one call -------------------------------------------------------------------------

    async def run(self, method: str, params: dict[str, Any], step: int) -> list[str]:
        owner = params["owner"]
        where = f"step {step}: {method} {params}"
        before = self.model.snapshot()
        code = expected_error(method, params)
        plan = self.plan_write(owner, params["records"]) if method == "memory/remember" and code is None else None
        if isinstance(plan, int):
            code = plan
        answer = await self.fed.call(method, params)
        where += f" -> {answer}"
        if code is not None:
            assert answer.get("error") == code, f"want error {code}: {where}"
            state = await self.state()
            self.compare(state, where)
            assert self.model.snapshot() == before
            seen = await self.events(where)
            assert not any(seen.values()), f"events of a refused call {seen}: {where}"
            self.stats[f"error {code}"] += 1
            return []
        assert "error" not in answer, where
        self.stats[method] += 1
        fresh: list[str] = []
        self.expect: dict[str, Any] = {}
        if method == "memory/remember":
            fresh = await self.remembered(owner, params["records"], plan, answer, where)
        elif method in ("memory/recall", "memory/timeline", "memory/fetch", "memory/session/list"):
            await self.read(owner, method, params, answer, where)
            state = await self.state()
            self.moves(state, lambda *_: False, where)
            self.compare(state, where)
        elif method == "memory/forget":
            doomed = in_scope(self.model, owner, params, ids_field=True)
            if params.get("query"):  # a word of one record's own: that record, wherever it lives
                doomed = [r for r in doomed if params["query"] in r["content"].split()]
            assert answer == {"forgotten": len(doomed)}, f"want {len(doomed)} forgotten: {where}"
            for rec in doomed:
                del self.model.records[owner][rec["id"]]
            state = await self.state()
            self.moves(state, lambda *_: False, where)
            self.compare(state, where)
        elif method == "memory/reinforce":
            named = set(params["ids"]) & set(self.model.records[owner])
            assert answer == {"reinforced": len(named)}, where
            for rid in named:
                rec = self.model.records[owner][rid]
                rec["salience"] = min(1.0, max(0.0, rec["salience"] + params["amount"]))
            state = await self.state()
            self.moves(state, lambda *_: False, where)
            self.compare(state, where)
        elif method == "memory/promote":
            await self.promoted(owner, params, answer, where)
        elif method in ("memory/consolidate", "memory/session/close"):
            await self.consolidated(owner, method, params, answer, where)
        got = self.kinds(await self.events(where), owner, where)
        want = dict(self.expect)
        if method == "memory/forget":
            want["forgotten"] = [answer["forgotten"]]
        if method == "memory/consolidate":
            want["consolidated"] = 1
        if method == "memory/session/close" and self.closed_known:
            want["session_closed"] = [params["session"]]
        if "written" in want:
            shown = [(e["id"], e["tier"], e.get("key"), e.get("revision")) for e in got.get("written", [])]
            # one per record written; the order inside one batch is not defined (tier by tier)
            assert sorted(shown, key=repr) == sorted(want["written"], key=repr), \
                f"written events {shown}, want {want['written']}: {where}"
        if "forgotten" in want:
            assert [e["count"] for e in got.get("forgotten", [])] == want["forgotten"], f"{got}: {where}"
        if "promoted" in want:
            assert [sorted(e["ids"]) for e in got.get("promoted", [])] == want["promoted"], f"{got}: {where}"
        if "session_closed" in want:
            assert [e["session"] for e in got.get("session_closed", [])] == want["session_closed"], where
        if method == "memory/consolidate":
            assert len(got.get("consolidated", [])) == 1, f"{got}: {where}"
        unexpected = set(got) - set(want) - {"consolidated"}
        assert not unexpected, f"events {unexpected} of {method}: {where}"
        if method not in ("memory/remember", "memory/consolidate", "memory/session/close"):
            assert "consolidated" not in got, f"{got}: {where}"
        return fresh

    # ---- remember ---------------------------------------------------------------------------

    def plan_write(self, owner: str, records: list[dict[str, Any]]) -> int | list[dict[str, Any]]:
        """Where each record of a valid batch goes and what it replaces, as protocol §3 and decision 37
        say, or the error code the batch must get. Keys and groups are located as the federation was
        before the batch; a key written twice is replaced by the batch's later record."""
        mine = self.model.records[owner]
        plan: list[dict[str, Any]] = []
        for rec in records:
            rid = rec.get("id")
            if rid is not None:
                holder = self.model.owner_of(rid)
                if holder is not None and holder != owner:
                    return -32005
                if rid in mine:  # idempotent: returned, nothing written
                    plan.append({"kept": rid})
                    continue
            held = self.model.by_key(owner, rec["key"]) if rec.get("key") else None
            home = self.model.group_tier(owner, rec["group"]) if rec.get("group") else None
            if held and home and held["tier"] != home:
                return -32602
            place = held["tier"] if held else home
            if place and rec.get("tier") and rec["tier"] != place:
                return -32602
            plan.append({"tier": place or rec.get("tier") or "working", "replaces": held})
        for field in ("key", "group", "id"):
            seen: dict[Any, str] = {}
            for rec, p in zip(records, plan):
                if "kept" in p or rec.get(field) is None:
                    continue
                if seen.setdefault(rec[field], p["tier"]) != p["tier"]:
                    return -32602
        return plan

    async def remembered(self, owner: str, records: list[dict[str, Any]], plan: Any, answer: dict[str, Any],
                         where: str) -> list[str]:
        ids = answer["ids"]
        assert len(ids) == len(records), where
        mine = self.model.records[owner]
        written: dict[str, str] = {}  # id -> the tier it was written to
        events: list[tuple[str, str, str | None, int | None]] = []
        now: dict[str, dict[str, Any]] = {}  # key -> its record so far in this batch
        for rec, p, rid in zip(records, plan, ids):
            if "kept" in p:
                assert rid == p["kept"], where
                continue
            held = now.get(rec.get("key")) or p["replaces"]
            if held is not None:
                assert rid == held["id"], f"key {rec['key']} replaced under a new id: {where}"
            elif "id" in rec:
                assert rid == rec["id"], where
            new = {"id": rid, "content": rec["content"], "key": rec.get("key"),
                   "revision": held["revision"] + 1 if held else 1, "metadata": rec.get("metadata", {}),
                   "session": rec.get("session"), "group": rec.get("group"), "role": rec.get("role"),
                   "created_at": None, "tier": p["tier"],
                   "salience": rec["salience"] if "salience" in rec else held["salience"] if held else 0.5,
                   "access_count": held["access_count"] if held else 0}
            mine[rid] = new
            self.model.ever[owner].add(rid)
            written[rid] = p["tier"]
            if rec.get("key"):
                now[rec["key"]] = new
                self.stats["key replaced" if held else "key new"] += 1
            if held and held["tier"] != "working":
                self.stats["key replaced outside working"] += 1
            events.append((rid, p["tier"], new["key"], new["revision"] if new["key"] else None))
        self.expect["written"] = events
        self.overfull -= {(owner, mine[rid]["session"]) for rid, tier in written.items() if tier == "working"}
        state = await self.state()
        for rec, rid in zip(records, ids):
            if rid in written:
                assert rid in state[owner], f"{rid} acknowledged, not stored: {where}"
                mine[rid]["created_at"] = state[owner][rid][1]["created_at"]
                if "created_at" in rec and mine[rid]["revision"] == 1:
                    assert mine[rid]["created_at"] == rec["created_at"], where

        def allowed(o: str, rec: dict[str, Any], old: str, new: str) -> bool:  # a spill out of working
            return o == owner and old == "working" and new == "episodic"

        moved = self.moves(state, allowed, where)
        self.stats["spilled"] += len(moved.get("working->episodic", []))
        self.compare(state, where)
        self.capacity(state, where)
        fresh = [rid for rid, tier in written.items() if tier == "working"]
        if fresh:  # found by its own word wherever it went, and by its owner only
            word = mine[fresh[-1]]["content"].split()[-1]
            for who in self.model.owners:
                got = await self.fed.call("memory/recall", {"owner": who, "query": word, "limit": 4, "touch": False})
                assert "records" in got, f"{got}: {where}"
                shown = [r["id"] for r in got["records"]]
                assert all(i in self.model.records[who] for i in shown), f"{who} sees {shown}: {where}"
                if who == owner:
                    assert fresh[-1] in shown, f"{fresh[-1]} not found by {word!r}: {where}"
        return fresh

    # ---- reads ------------------------------------------------------------------------------

    async def read(self, owner: str, method: str, params: dict[str, Any], answer: dict[str, Any], where: str) -> None:
        assert not answer.get("degraded"), where
        mine = self.model.records[owner]
        if method == "memory/fetch":
            want = self.model.by_key(owner, params["key"])
            got = answer["record"]
            if want is None:
                assert got is None, where
            else:
                assert got is not None and got["id"] == want["id"] and got["tier"] == want["tier"], where
                assert all(same(got[f], want[f]) for f in FIELDS), where
            return
        if method == "memory/session/list":
            counts: dict[str, dict[str, int]] = {}
            for rec in mine.values():
                if rec["session"] is not None:
                    counts.setdefault(rec["session"], {}).setdefault(rec["tier"], 0)
                    counts[rec["session"]][rec["tier"]] += 1
            got_sessions = {s["session"]: {t: n for t, n in s.get("tiers", {}).items() if n}
                            for s in answer["sessions"]}
            assert got_sessions == counts, f"{got_sessions} != {counts}: {where}"
            return
        records = answer["records"]
        for rec in records:
            assert rec["id"] in mine, f"{rec['id']} is not {owner}'s: {where}"
            want = mine[rec["id"]]
            assert rec["tier"] == want["tier"], f"{rec['id']} shown in {rec['tier']}: {where}"
            assert all(same(rec[f], want[f]) for f in FIELDS), f"{rec['id']} changed: {where}"
        scope = in_scope(self.model, owner, params)
        shown = [r["id"] for r in records]
        assert len(set(shown)) == len(shown), f"a record twice: {where}"
        assert set(shown) <= {r["id"] for r in scope}, f"out of scope {set(shown) - {r['id'] for r in scope}}: {where}"
        ordered = sorted(scope, key=lambda r: r["created_at"])
        if method == "memory/timeline":
            want = ordered[-params["limit"]:] if params.get("limit") else ordered
            same_up_to_ties(records, want, False, where)
            return
        limit = params["limit"] or 1000  # 0: no limit but the declared max_recall_limit
        assert len(records) <= limit, where
        scores = [r["score"] for r in records]
        assert scores == sorted(scores, reverse=True), f"not by score: {where}"
        if params.get("touch", True) is not False:  # each record a recall returns is recalled once more
            for rec in records:
                mine[rec["id"]]["access_count"] += 1
        query = params.get("query")
        if not query:  # by recency across the tiers
            same_up_to_ties(records, list(reversed(ordered))[:limit], True, where)
            return
        words = set(query.split())
        hits = [r["id"] for r in scope if words & set(r["content"].split())]
        if len(hits) == 1 and query.startswith("tok"):  # one record's own word: rank 1 where it lives
            assert hits[0] in shown, f"{hits[0]} not found by its word: {where}"
        if limit >= len(mine):
            assert set(hits) <= set(shown), f"missed {set(hits) - set(shown)}: {where}"

    # ---- moves ---------------------------------------------------------------------------

    async def promoted(self, owner: str, params: dict[str, Any], answer: dict[str, Any], where: str) -> None:
        mine = self.model.records[owner]
        dest = params["tier"]
        named = {i for i in params["ids"] if i in mine and mine[i]["tier"] != dest}
        groups = {mine[i]["group"] for i in named if mine[i]["group"]}
        going = named | {i for i, r in mine.items() if r["group"] in groups}
        state = await self.state()
        self.moves(state, lambda o, rec, old, new: o == owner and rec["id"] in going and new == dest, where)
        stayed = {i for i in going if mine[i]["tier"] != dest}
        assert not stayed, f"not promoted: {stayed}: {where}"
        if dest == "working":
            self.overfull |= {(owner, mine[i]["session"]) for i in going}
        if params.get("salience") is not None:  # the records moved (a named one's group too) take it
            for rid in going:
                mine[rid]["salience"] = params["salience"]
        assert answer["promoted"] == len(named), where
        if going:
            self.expect["promoted"] = [sorted(going)]
            self.stats["promoted records"] += len(going)
        self.compare(state, where)

    async def consolidated(self, owner: str, method: str, params: dict[str, Any], answer: dict[str, Any],
                           where: str) -> None:
        mine = self.model.records[owner]
        session = params.get("session")
        closing = {i for i, r in mine.items() if r["tier"] == "working" and r["session"] == session} \
            if session else set()
        groups = {mine[i]["group"] for i in closing if mine[i]["group"]}
        closing |= {i for i, r in mine.items() if r["tier"] == "working" and r["group"] in groups}

        spilling = session is None and any(o == owner for o, _ in self.overfull)
        # closing a session no tier holds is a no-op (the protocol): no event, nothing moves
        known = session is None or any(r["session"] == session for r in mine.values())
        self.closed_known = known

        def allowed(o: str, rec: dict[str, Any], old: str, new: str) -> bool:
            if o != owner or not known:
                return False
            if spilling and (old, new) == ("working", "episodic"):  # capacity, over since a promote
                return True
            # a closed session percolates: flushed into episodic, and on into semantic if it earned it
            return (old, new) == ("episodic", "semantic") or (rec["id"] in closing and old == "working"
                                                              and new in ("episodic", "semantic"))

        state = await self.state()
        moved = self.moves(state, allowed, where)
        self.compare(state, where)
        assert not {i for i in closing if mine[i]["tier"] == "working"}, f"left in working: {where}"
        if session is None:  # consolidate applies every capacity
            self.overfull = {(o, s) for o, s in self.overfull if o != owner}
            self.capacity(state, where)
        up = moved.get("episodic->semantic", []) + moved.get("working->semantic", [])
        promoted = len(up)
        self.stats["earned promotion"] += promoted
        if up:
            self.expect["promoted"] = [sorted(up)]
        assert answer["promoted"] == promoted, f"promoted {promoted}: {where}"
        if session:
            assert answer["flushed"] == len(closing) and answer["closed"] == session, where
        if session is None:
            assert answer["moved"] == sum(len(ids) for ids in moved.values()), f"{moved}: {where}"
        # Every record recalled `promote_after` times has earned promotion, and it runs here (before
        # capacity spills: one that arrives by a spill now goes on at the next pass).
        arrived = set(moved.get("working->episodic", []))
        counts = {name: 0 for name in NAMES}
        for tier, rec in state[owner].values():
            counts[tier] += 1
            assert not known or not (tier == "episodic" and rec["access_count"] >= PROMOTE_AFTER and rec["id"] not in arrived), \
                f"{rec['id']} recalled {rec['access_count']} times, still in episodic: {where}"
        assert answer["counts"] == counts, where


# ---- the test ------------------------------------------------------------------------------------


RUN = uuid.uuid4().hex[:6]  # fresh owners for every run of the module


def owners_of(seed: int) -> list[str]:
    return [f"p{seed}{name}-{RUN}" for name in ("a", "b", "c")]


@pytest.fixture(scope="module", params=[False, True], ids=["inline", "background-auth"])
def stack(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """`inline`: recalls are counted before the recall answers, so the model knows every record's
    access_count exactly; owners are named on a trusted connection. `background-auth` (the default
    deployment): counted after, so the model's count is only an upper bound (a count landing on a
    record mid-move is lost, decision 37); each owner is a bearer token's principal."""
    top: dict[str, Any] = {"background_promotion": request.param}
    if request.param:
        top["auth"] = {"tokens": {f"token-{o}": o for seed in SEEDS for o in owners_of(seed)}}
    with federation(tmp_path_factory.mktemp("parity"), TIERS, mode="real", top=top) as running:
        running.background = request.param  # type: ignore[attr-defined]
        running.tokens = top.get("auth", {}).get("tokens")  # type: ignore[attr-defined]
        yield running


@pytest.mark.parametrize("seed", SEEDS)
async def test_the_router_answers_as_a_model_of_one_flat_federation(stack: Stack, seed: int) -> None:
    rng = random.Random(seed)
    owners = owners_of(seed)[:rng.choice([2, 3])]
    tokens = stack.tokens  # type: ignore[attr-defined]
    fed = Federation(stack, None if tokens is None else {o: t for t, o in tokens.items() if o in owners})
    model = Model(owners)
    checker = Checker(fed, model, exact_counts=not stack.background)  # type: ignore[attr-defined]
    try:
        await checker.start()
        last: list[str] = []
        for step in range(CALLS):
            owner = rng.choice(owners)
            method, params = operation(rng, model, owner, last)
            if tokens is not None and rng.random() < 0.03 and expected_error(method, params) is None:
                # as another owner's principal (on a call that is otherwise well formed: which of two
                # errors a call gets first is not defined)
                params["_as"] = rng.choice([o for o in owners if o != owner])
            fresh = await checker.run(method, params, step)
            if method == "memory/remember":
                last = fresh
        print(f"seed {seed}: {dict(sorted(checker.stats.items()))}")
    finally:
        await fed.close()
