"""Owner isolation at the router over authenticated HTTP, against a per-principal model.

Three principals (bearer tokens) share one real federation (Redis, PostgreSQL, Qdrant Edge, git,
embedded), and the tiers trust only the router's service token. A seeded sequence of calls, each
from one principal, uses the same keys, groups and session names as the others, names the others'
ids (from their answers) in every selector that takes ids, their tokens in queries, their names as
`owner` (on the call, on records, in `where`), their event cursors, and sends calls with no, wrong
or malformed credentials, JSON-RPC batches and notifications. After every call:

- every other principal's records, read from the tier servers themselves, are exactly as they were
  (tier, content, salience, access counts: recall counting is inline here), and its event poll is
  empty: a call changes only its caller's partition, and tells nobody else;
- the caller's records are its model (content, key, revision, session, group, role, metadata,
  salience; where a record lives is observed: placement is the policy's, not this test's);
- the caller's answer is its model (timeline, fetch, session/list, describe counts, forget /
  reinforce / promote counts, summarize's `read` and sources), names no id the caller never held,
  and holds no other principal's name or content marker;
- nothing is ever written to the unowned partition of any tier (the principal is passed down);
- an error (-32005 for another owner, 401 at the door, -32600 for a batch) changes nothing.

SEEDS=1,2,3 CALLS=300 run more; the default stays small for CI.
"""

from __future__ import annotations

import asyncio
import os
import random
import uuid
from collections import Counter
from typing import Any, Iterator

import httpx
import orjson
import pytest

from a2m.client import HTTPClient
from a2m.errors import A2MError
from a2m.filters import matches, parse_scope
from a2m.records import Record
from a2m.text import tokenize
from router.config import INTENTS
from tests.support.parity import same

from .stack import Stack, federation

pytestmark = pytest.mark.anyio

SEEDS = [int(s) for s in os.environ.get("SEEDS", "1,2,3").split(",")]
CALLS = int(os.environ.get("CALLS", "300"))

CAPACITY = 3
TIERS = [
    {"name": "working", "kind": "working", "capacity": CAPACITY, "spill_to": "episodic", "timeout": 10.0},
    {"name": "episodic", "kind": "episodic", "spill_to": "semantic", "promote_to": "semantic",
     "promote_after": 2, "timeout": 10.0},
    {"name": "semantic", "kind": "semantic", "timeout": 10.0},
    {"name": "procedural", "kind": "procedural", "timeout": 10.0},
]
NAMES = [t["name"] for t in TIERS]
PRINCIPALS = ["alice", "bob", "carol"]
TOKENS = {f"tok-{p}-{uuid.uuid4().hex[:8]}": p for p in PRINCIPALS}
TOKEN_OF = {p: t for t, p in TOKENS.items()}
SERVICE = "svc-" + uuid.uuid4().hex

WORDS = ["cat", "sofa", "river", "plan", "tea", "green"]
# LIKE (%, _), glob (*, ?, [) and percent-encoding metacharacters: a prefix must match as text,
# inside the caller's partition only.
KEYS = ["user/city", "user/name", "app/plan", "k1", "p%2F/x", "a_b", "g*b?[c]"]
PREFIXES = ["user/", "app/", "k", "zz", "p%", "a_", "g*", "%", "_", "*", "["]
GROUPS = ["g1", "g2"]
SESSIONS = ["s1", "s2", None]
FIELDS = ("content", "key", "revision", "metadata", "session", "group", "role")


def marker(principal: str) -> str:
    return f"mk{principal}"


# ---- the model ---------------------------------------------------------------------------------


# Every id a principal held or named, over the module's seeds (a reset poll reads earlier seeds' events).
EVER: dict[str, set[str]] = {p: set() for p in PRINCIPALS}


class Model:
    """Per principal: id -> the record's fields (and its tier as last observed)."""

    def __init__(self, seed: int) -> None:
        self.records: dict[str, dict[str, dict[str, Any]]] = {p: {} for p in PRINCIPALS}
        self.ever = EVER
        self.seed = seed
        self.counter = 0

    def fresh(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}" if prefix == "tok" else f"{prefix}{self.seed}x{self.counter}"

    def by_key(self, p: str, key: str) -> dict[str, Any] | None:
        held = [r for r in self.records[p].values() if r["key"] == key]
        assert len(held) <= 1
        return held[0] if held else None

    def group_tier(self, p: str, group: str) -> str | None:
        tiers = {r["tier"] for r in self.records[p].values() if r["group"] == group}
        assert len(tiers) <= 1, f"{p}: group {group} split over {tiers}"
        return tiers.pop() if tiers else None

    def holder_in(self, rid: str, tier: str, but: str) -> str | None:
        """Another principal holding `rid` in `tier` (ids are global per engine)."""
        return next((q for q in PRINCIPALS if q != but and rid in self.records[q]
                     and self.records[q][rid]["tier"] == tier), None)

    def others(self, p: str) -> list[dict[str, Any]]:
        return [r for q in PRINCIPALS if q != p for r in self.records[q].values()]


def as_record(rec: dict[str, Any], owner: str) -> Record:
    return Record(id=rec["id"], content=rec["content"], created_at=rec["created_at"], role=rec["role"],
                  metadata=rec["metadata"], group=rec["group"], tier=rec["tier"], owner=owner,
                  session=rec["session"], key=rec["key"], revision=rec["revision"], salience=rec["salience"])


def in_scope(model: Model, p: str, params: dict[str, Any], *, ids_field: bool = False) -> list[dict[str, Any]]:
    scope = parse_scope(params, p, ids_field=ids_field)
    tiers = [params["tier"]] if params.get("tier") else NAMES
    return [r for r in model.records[p].values() if r["tier"] in tiers and matches(as_record(r, p), scope)]


# ---- generating calls --------------------------------------------------------------------------


def content(rng: random.Random, model: Model, p: str) -> str:
    return " ".join(rng.sample(WORDS, rng.randint(1, 2)) + [marker(p), model.fresh("tok")])


def new_record(rng: random.Random, model: Model, p: str) -> dict[str, Any]:
    rec: dict[str, Any] = {"content": content(rng, model, p)}
    if rng.random() < 0.4:
        rec["key"] = rng.choice(KEYS)
    if rng.random() < 0.2:
        rec["group"] = rng.choice(GROUPS)
    session = rng.choice(SESSIONS)
    if session is not None:
        rec["session"] = session
    if rng.random() < 0.3:
        rec["role"] = rng.choice(["user", "tool"])
    if rng.random() < 0.4:
        rec["metadata"] = {"topic": rng.choice(["food", "work"])}
    if rng.random() < 0.1:
        rec["salience"] = rng.choice([0.0, 1.0])
    if rng.random() < 0.1:
        rec["owner"] = p  # the principal itself: fine
    free = "key" not in rec and "group" not in rec
    roll = rng.random()
    if roll < 0.12:
        rec["id"] = model.fresh("c")
    elif roll < 0.2 and model.records[p]:
        rec["id"] = rng.choice(list(model.records[p]))  # idempotent: returned, nothing written
    elif roll < 0.3 and free and model.others(p):
        theirs = rng.choice(model.others(p))  # another principal's id: -32005 where it lives
        rec["id"] = theirs["id"]
        rec["tier"] = theirs["tier"] if rng.random() < 0.7 else rng.choice(NAMES)
        model.ever[p].add(theirs["id"])
    if free and "tier" not in rec and rng.random() < 0.25:
        rec["tier"] = rng.choice(NAMES)
    return rec


def foreign_ids(rng: random.Random, model: Model, p: str, n: int) -> list[str]:
    theirs = [r["id"] for r in model.others(p)]
    picked = rng.sample(theirs, min(len(theirs), n))
    model.ever[p].update(picked)  # named by the caller: may be echoed in its own answers
    return picked


def own_ids(rng: random.Random, model: Model, p: str, n: int) -> list[str]:
    mine = list(model.records[p])
    return rng.sample(mine, min(len(mine), n))


def other(rng: random.Random, p: str) -> str:
    return rng.choice([q for q in PRINCIPALS if q != p])


def token_of(rng: random.Random, model: Model, p: str, mine: bool) -> str | None:
    pool = list(model.records[p].values()) if mine else model.others(p)
    return rng.choice(pool)["content"].split()[-1] if pool else None


def where(rng: random.Random, model: Model, p: str) -> dict[str, Any]:
    name = rng.choice(["session", "group", "key", "topic", "id", "owner", "owner"])
    if name == "session":
        return {"session": rng.choice(SESSIONS + [["s1", "s2"]])}
    if name == "group":
        return {"group": rng.choice(GROUPS + [GROUPS])}
    if name == "key":
        return {"key": rng.choice(KEYS + [KEYS[:2]])}
    if name == "topic":
        return {"topic": rng.choice(["food", "work"])}
    if name == "id":
        return {"id": own_ids(rng, model, p, 2) + foreign_ids(rng, model, p, 3)}
    return {"owner": rng.choice([other(rng, p), [p, other(rng, p)], p])}  # never widens the partition


def selectors(rng: random.Random, model: Model, p: str, params: dict[str, Any]) -> None:
    if rng.random() < 0.5:
        params["where"] = where(rng, model, p)
    if rng.random() < 0.2:
        params["key_prefix"] = rng.choice(PREFIXES)
    stamps = sorted(r["created_at"] for r in model.records[p].values() if r["created_at"])
    if stamps and rng.random() < 0.1:
        params[rng.choice(["after", "before"])] = rng.choice(stamps)
    if rng.random() < 0.2:
        params["tier"] = rng.choice(NAMES)


def operation(rng: random.Random, model: Model, p: str) -> tuple[str, dict[str, Any]]:
    params: dict[str, Any] = {}
    if rng.random() < 0.3:
        params["owner"] = p  # naming the principal itself is allowed
    roll = rng.random()
    if roll < 0.34:
        records = [new_record(rng, model, p) for _ in range(rng.choice([1, 1, 2, 3]))]
        if any(r.get("id") in model.ever[p] and r["id"] not in model.records[p] for r in records):
            # A batch another principal's id may refuse replaces no key: a replacement written to one
            # tier before another refuses its part stays (decision 37's cost), new records are undone.
            for rec in records:
                rec.pop("key", None)
        return "memory/remember", {**params, "records": records}
    if roll < 0.44:
        selectors(rng, model, p, params)
        params["limit"] = rng.choice([0, 3, 50])
        kind = rng.random()
        word = token_of(rng, model, p, mine=kind < 0.4)
        if word is not None and kind < 0.7:
            params["query"] = word
        elif kind < 0.85:
            params["query"] = rng.choice(WORDS + [marker(other(rng, p))])
        if rng.random() < 0.2:
            params["fusion"] = "rerank"
        if rng.random() < 0.2:
            params["prompt"] = True
        return "memory/recall", params
    if roll < 0.52:
        selectors(rng, model, p, params)
        if rng.random() < 0.4:
            params["limit"] = rng.choice([1, 3])
        if rng.random() < 0.2:
            params["prompt"] = {"style": "transcript"}
        return "memory/timeline", params
    if roll < 0.56:
        return "memory/fetch", {**params, "key": rng.choice(KEYS)}
    if roll < 0.62:
        choice = rng.random()
        if choice < 0.4:
            params["ids"] = own_ids(rng, model, p, rng.randint(0, 1)) + foreign_ids(rng, model, p, 3) + ["nope"]
        elif choice < 0.55:
            params["query"] = token_of(rng, model, p, mine=rng.random() < 0.4) or "nothing"
        elif choice < 0.85:
            params["where"] = where(rng, model, p)
        else:
            params["key_prefix"] = rng.choice(PREFIXES)
        if rng.random() < 0.2:
            params["tier"] = rng.choice(NAMES)
        return "memory/forget", params
    if roll < 0.67:
        ids = own_ids(rng, model, p, rng.randint(0, 2)) + foreign_ids(rng, model, p, 3) + ["nope"]
        return "memory/reinforce", {**params, "ids": ids, "amount": rng.choice([0.2, -0.3, 1])}
    if roll < 0.73:
        ids = own_ids(rng, model, p, rng.randint(0, 2)) + foreign_ids(rng, model, p, 3)
        return "memory/promote", {**params, "ids": ids or ["nope"], "tier": rng.choice(NAMES)}
    if roll < 0.76:
        return "memory/consolidate", params
    if roll < 0.80:
        return "memory/session/close", {**params, "session": rng.choice(["s1", "s2", "never"])}
    if roll < 0.83:
        return "memory/session/list", params
    if roll < 0.86:
        return "memory/describe", params
    if roll < 0.92:
        choice = rng.random()
        if choice < 0.45:
            params["ids"] = own_ids(rng, model, p, rng.randint(0, 2)) + foreign_ids(rng, model, p, 3) + ["nope"]
        elif choice < 0.75:
            params["query"] = token_of(rng, model, p, mine=rng.random() < 0.5) or "nothing"
        else:
            params["where"] = {"session": rng.choice(["s1", "s2"])}
        if rng.random() < 0.5:
            params["into"] = rng.choice(NAMES)
        if rng.random() < 0.4:
            params["key"] = rng.choice(KEYS)
        return "memory/summarize", params
    return "memory/events", params


# ---- the federation as it is ---------------------------------------------------------------------


class Federation:
    def __init__(self, stack: Stack) -> None:
        self.url = stack.url
        self.as_ = {p: HTTPClient(stack.url, token=TOKEN_OF[p], timeout=60.0) for p in PRINCIPALS}
        self.tiers = {name: HTTPClient(stack.tiers[name].url, token=SERVICE, timeout=60.0) for name in NAMES}
        self.web = httpx.AsyncClient(timeout=60.0)

    async def close(self) -> None:
        await asyncio.gather(*(c.close() for c in self.as_.values()), *(t.close() for t in self.tiers.values()),
                             self.web.aclose())

    async def call(self, p: str, method: str, params: dict[str, Any]) -> dict[str, Any]:
        try:
            return await self.as_[p].call(method, params)
        except A2MError as exc:
            return {"error": exc.code, "message": exc.message, "data": exc.data}

    async def post(self, body: Any, headers: dict[str, str]) -> httpx.Response:
        return await self.web.post(self.url, content=orjson.dumps(body),
                                   headers={"content-type": "application/json", **headers})

    async def state(self, principals: list[str] = PRINCIPALS) -> dict[str | None, dict[str, tuple[str, dict[str, Any]]]]:
        """owner -> id -> (tier, record), read from the tier servers as the service; None: the
        unowned partition."""
        owners: list[str | None] = [*principals, None]

        async def read(owner: str | None, name: str) -> list[dict[str, Any]]:
            params: dict[str, Any] = {"limit": 0}
            if owner is not None:
                params["owner"] = owner
            return (await self.tiers[name].call("memory/timeline", params))["records"]

        answers = await asyncio.gather(*(read(o, n) for o in owners for n in NAMES))
        out: dict[str | None, dict[str, tuple[str, dict[str, Any]]]] = {o: {} for o in owners}
        it = iter(answers)
        for owner in owners:
            for name in NAMES:
                for rec in next(it):
                    assert rec["id"] not in out[owner], f"{owner}: {rec['id']} in {out[owner][rec['id']][0]} and {name}"
                    assert rec.get("owner") == owner, f"{rec} read as {owner}'s"
                    out[owner][rec["id"]] = (name, rec)
        return out


BAD_AUTH = [None, "Bearer", "Basic {t}", "{t}", "Bearer {t}x", "Bearer x{t}", "Bearer {T}",
            "Bearer {t} {t}", "Bearer {svc}", "Token {t}", "Bearer\t{t}"]


class Checker:
    """`concurrent`: the principals call at once, each from its own task; each checks its own
    partition after its own calls (the others' change meanwhile), and an outcome that depends on
    where another principal's record is right now (an id it holds) may go either way. `background`:
    the router counts recalls after answering them, so a principal's access counts move after its
    own recall has returned (they are left out of the comparison; nothing else may move)."""

    def __init__(self, fed: Federation, model: Model, *, concurrent: bool = False, background: bool = False) -> None:
        self.fed = fed
        self.model = model
        self.concurrent = concurrent
        self.background = background
        self.cursors: dict[str, str] = {}
        self.stats: Counter[str] = Counter()
        self.state: dict[str | None, dict[str, tuple[str, dict[str, Any]]]] = {}

    async def start(self) -> None:
        for p in PRINCIPALS:
            self.cursors[p] = (await self.fed.call(p, "memory/events", {}))["cursor"]
        self.state = await self.fed.state()

    # ---- after every call ----------------------------------------------------------------

    async def events(self, where: str, principals: list[str] = PRINCIPALS) -> dict[str, list[dict[str, Any]]]:
        out = {}
        for p in principals:
            answer = await self.fed.call(p, "memory/events", {"cursor": self.cursors[p], "limit": 0})
            assert "events" in answer and not answer.get("reset"), f"{p}: {answer}: {where}"
            self.cursors[p] = answer["cursor"]
            for event in answer["events"]:
                named = [event["id"]] if "id" in event else list(event.get("ids") or [])
                assert set(named) <= self.model.ever[p], f"{p} saw {event}, of ids it never held: {where}"
            out[p] = answer["events"]
        return out

    async def settle(self, caller: str, where: str, *, changed: bool) -> dict[str, list[dict[str, Any]]]:
        """Read everything back: only the caller's partition may have changed (and only if `changed`),
        the unowned one is empty, other principals got no events. The caller's tiers are observed."""
        before = self.state
        principals = [caller] if self.concurrent else PRINCIPALS
        now = await self.fed.state(principals)
        assert now[None] == {}, f"records written without an owner: {list(now[None])}: {where}"
        for p in principals:
            if p != caller or not changed:
                was, nowp = self.unchanging(before[p]), self.unchanging(now[p])
                assert nowp == was, f"{p}'s records changed by {caller}'s call: {diff(was, nowp)}: {where}"
        self.state = {**self.state, **now}
        mine = self.model.records[caller]
        got = now[caller]
        assert set(got) == set(mine), \
            f"{caller}: lost {sorted(set(mine) - set(got))}, unexpected {sorted(set(got) - set(mine))}: {where}"
        for rid, rec in mine.items():
            tier, stored = got[rid]
            rec["tier"] = tier  # placement is observed
            rec["created_at"] = stored["created_at"]
            for field in FIELDS:
                assert same(stored[field], rec[field]), f"{rid}.{field} is {stored[field]!r}, model {rec[field]!r}: {where}"
            assert stored["salience"] == pytest.approx(rec["salience"]), f"{rid}.salience: {where}"
        groups: dict[str, set[str]] = {}
        for tier, stored in got.values():
            if stored["group"]:
                groups.setdefault(stored["group"], set()).add(tier)
        assert all(len(t) == 1 for t in groups.values()), f"{caller}: a group split {groups}: {where}"
        seen = await self.events(where, principals)
        for p in principals:
            assert p == caller or not seen[p], f"{p} got events of {caller}'s call: {seen[p]}: {where}"
        if not changed:
            assert not seen[caller], f"events of a call that changed nothing: {seen[caller]}: {where}"
        return seen

    def unchanging(self, held: dict[str, tuple[str, dict[str, Any]]]) -> dict[str, Any]:
        if not self.background:
            return held
        return {rid: (tier, {k: v for k, v in rec.items() if k not in ("access_count", "accessed_at")})
                for rid, (tier, rec) in held.items()}

    def no_leak(self, caller: str, answer: Any, where: str, *, new: bool = False) -> None:
        """Nothing of another principal in an answer: its name, its content marker, an id the caller
        never held or named."""
        text = orjson.dumps(answer).decode()
        for q in PRINCIPALS:
            if q != caller:
                assert marker(q) not in text and f'"{q}"' not in text, f"{caller}'s answer names {q}: {where}"
        for rec in answer.get("records") or []:
            assert new or rec["id"] in self.model.ever[caller] or rec["id"] in self.model.records[caller], \
                f"{caller} was shown {rec['id']}: {where}"
            assert rec.get("owner") == caller, f"{caller} was shown {rec}: {where}"

    # ---- one call -------------------------------------------------------------------------

    async def run(self, rng: random.Random, p: str, method: str, params: dict[str, Any], step: int) -> None:
        where = f"step {step}: {p} {method} {params}"
        roll = rng.random()
        if roll < 0.05:
            await self.refused_at_the_door(rng, p, method, params, where)
            return
        if roll < 0.08:
            await self.batch(rng, p, method, params, where)
            return
        if roll < 0.13:
            q = other(rng, p)
            answer = await self.fed.call(p, method, {**params, "owner": q})  # another principal's scope
            assert answer.get("error") == -32005, f"want -32005: {where} as {q} -> {answer}"
            await self.settle(p, where, changed=False)
            self.stats["error -32005 owner"] += 1
            return
        if method == "memory/remember" and roll < 0.17:
            await self.notification(rng, p, params, where)
            return
        if method == "memory/events" and roll < 0.5:
            await self.foreign_cursor(rng, p, where)
            return
        await self.call(p, method, params, where)

    async def refused_at_the_door(self, rng: random.Random, p: str, method: str, params: dict[str, Any],
                                  where: str) -> None:
        shape = rng.choice(BAD_AUTH)
        headers = {} if shape is None else {"authorization": shape.format(t=TOKEN_OF[p], T=TOKEN_OF[p].upper(),
                                                                          svc=SERVICE)}
        body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
        if rng.random() < 0.3:
            del body["id"]  # a notification is authenticated too
        reply = await self.fed.post(body, headers)
        assert reply.status_code == 401, f"{headers}: HTTP {reply.status_code} {reply.text}: {where}"
        assert b"mk" not in reply.content and b"records" not in reply.content, where
        await self.settle(p, where, changed=False)
        self.stats["401"] += 1

    async def batch(self, rng: random.Random, p: str, method: str, params: dict[str, Any], where: str) -> None:
        """A JSON-RPC array (protocol §1: refused with -32600), even of one well-formed call."""
        body = [{"jsonrpc": "2.0", "id": 1, "method": method, "params": params}]
        if rng.random() < 0.5:
            body.append({"jsonrpc": "2.0", "id": 2, "method": "memory/forget", "params": {"key_prefix": ""}})
        reply = await self.fed.post(body, {"authorization": f"Bearer {TOKEN_OF[p]}"})
        assert reply.status_code == 200 and reply.json()["error"]["code"] == -32600, f"{reply.text}: {where}"
        await self.settle(p, where, changed=False)
        self.stats["error -32600 batch"] += 1

    async def notification(self, rng: random.Random, p: str, params: dict[str, Any], where: str) -> None:
        """A notification is run as its principal (202, no answer): records with fresh ids of their
        own, so the model knows them; or as another owner, which changes nothing."""
        records = [{"content": content(rng, self.model, p), "id": self.model.fresh("n")}
                   for _ in range(rng.randint(1, 2))]
        for rec in records:
            if rng.random() < 0.5:
                rec["tier"] = rng.choice(NAMES)
        foreign = rng.random() < 0.4
        sent = {**params, "records": records}
        if foreign:
            sent["owner" if rng.random() < 0.5 else "_"] = other(rng, p)
            if "_" in sent:
                records[0]["owner"] = sent.pop("_")
        reply = await self.fed.post({"jsonrpc": "2.0", "method": "memory/remember", "params": sent},
                                    {"authorization": f"Bearer {TOKEN_OF[p]}"})
        assert reply.status_code == 202 and reply.content == b"", f"HTTP {reply.status_code} {reply.text}: {where}"
        if not foreign:
            for rec in records:
                self.remember_one(p, rec, rec["id"], None)
        await self.settle(p, where + f" (notification {sent})", changed=not foreign)
        self.stats["notification" + (" as another" if foreign else "")] += 1

    async def foreign_cursor(self, rng: random.Random, p: str, where: str) -> None:
        """Another principal's cursor: a reset to the caller's own oldest event, never the other's."""
        q = other(rng, p)
        answer = await self.fed.call(p, "memory/events", {"cursor": self.cursors[q], "limit": 0})
        assert "events" in answer and answer.get("reset") is True, f"{answer}: {where}"
        for event in answer["events"]:
            named = [event["id"]] if "id" in event else list(event.get("ids") or [])
            assert set(named) <= self.model.ever[p], f"{p} read {event} with {q}'s cursor: {where}"
        self.no_leak(p, answer, where)
        await self.settle(p, where, changed=False)
        self.stats["foreign cursor"] += 1

    async def call(self, p: str, method: str, params: dict[str, Any], where: str) -> None:
        mine = self.model.records[p]
        named = set(params.get("ids") or []) | set((params.get("where") or {}).get("id") or [])
        if any(rid in mine and any(rid in self.model.records[q] for q in PRINCIPALS if q != p) for rid in named):
            self.stats[f"{method} naming an id two principals hold"] += 1
        plan = self.plan_write(p, params["records"]) if method == "memory/remember" else None
        if method == "memory/summarize":
            plan = self.plan_summary(p, params)
        before = {rid: dict(rec) for rid, rec in mine.items()}
        answer = await self.fed.call(p, method, params)
        where += f" -> {answer}"
        self.no_leak(p, answer, where, new=method == "memory/summarize")  # a summary is a new record
        if self.concurrent and method == "memory/remember" and answer.get("error") == -32005 and (
                isinstance(plan, int) or any(step.get("maybe") for step in plan)):
            plan = -32005
        elif self.concurrent and isinstance(plan, int) and plan == -32005 and "error" not in answer and not any(
                rec.get("owner", p) != p for rec in params["records"]):
            plan = self.plan_write(p, params["records"], foreign=False)  # it moved away meanwhile
        if isinstance(plan, dict) and plan.get("refusable") and answer.get("error") == -32602:
            plan = -32602
        if isinstance(plan, int):
            assert answer.get("error") == plan, f"want error {plan}: {where}"
            await self.settle(p, where, changed=False)
            self.stats[f"error {plan} {method}"] += 1
            return
        if method == "memory/promote" and "error" in answer:
            await self.promote_refused(p, params, answer, before, where)
            return
        assert "error" not in answer, where
        self.stats[method] += 1
        if method == "memory/remember":
            for rec, step, rid in zip(params["records"], plan, answer["ids"]):
                self.remember_one(p, rec, rid, step)
            seen = await self.settle(p, where, changed=True)
            written = {e["id"] for e in seen[p] if e["kind"] == "written"}
            fresh = {rid for rid, step in zip(answer["ids"], plan) if "kept" not in step}
            assert written == fresh, f"written events for {written}, want {fresh}: {where}"
            return
        if method == "memory/forget":
            doomed = in_scope(self.model, p, params, ids_field=True)
            if params.get("query"):
                doomed = [r for r in doomed if holds(r, params["query"])]
            assert answer == {"forgotten": len(doomed)}, f"want {len(doomed)}: {where}"
            for rec in doomed:
                del mine[rec["id"]]
            await self.settle(p, where, changed=True)  # a `forgotten` event even for 0
            return
        if method == "memory/reinforce":
            named = set(params["ids"]) & set(mine)
            assert answer == {"reinforced": len(named)}, where
            for rid in named:
                mine[rid]["salience"] = min(1.0, max(0.0, mine[rid]["salience"] + params["amount"]))
            await self.settle(p, where, changed=True)
            return
        if method == "memory/promote":
            await self.settle(p, where, changed=True)
            dest = params["tier"]
            moved = {rid for rid in params["ids"] if rid in mine and before[rid]["tier"] != dest and mine[rid]["tier"] == dest}
            assert answer == {"promoted": len(moved)}, f"moved {moved}: {where}"
            for rid in params["ids"]:
                if rid in mine and mine[rid]["tier"] != dest and not self.blocked(p, rid, dest):
                    raise AssertionError(f"{rid} not promoted to {dest}: {where}")
            return
        if method in ("memory/consolidate", "memory/session/close"):
            await self.settle(p, where, changed=True)
            counts = Counter(rec["tier"] for rec in mine.values())
            assert answer["counts"] == {name: counts[name] for name in NAMES}, where
            return
        if method == "memory/summarize":
            await self.summarized(p, params, plan, answer, where)
            return
        # reads: nothing changes (recall counts its own records' access)
        await self.settle(p, where, changed=method == "memory/recall")
        self.read(p, method, params, answer, where)

    async def promote_refused(self, p: str, params: dict[str, Any], answer: dict[str, Any],
                              before: dict[str, dict[str, Any]], where: str) -> None:
        """A promote the destination refused in part (decision 100): only another principal's id
        there refuses here (-32005); what moved is counted, what stayed is named, and nothing that
        was free to move stayed."""
        await self.settle(p, where, changed=True)
        mine, dest = self.model.records[p], params["tier"]
        moved = {rid for rid in params["ids"] if rid in mine and before[rid]["tier"] != dest and mine[rid]["tier"] == dest}
        data = answer.get("data") or {}
        assert answer["error"] == -32005 and data.get("promoted") == len(moved) and data.get("tier") == dest, where
        stayed = set(data.get("refused") or [])
        assert stayed and all(rid in mine and mine[rid]["tier"] != dest for rid in stayed), where
        assert any(self.blocked(p, rid, dest) for rid in stayed), where
        for rid in params["ids"]:
            if rid in mine and mine[rid]["tier"] != dest and not self.blocked(p, rid, dest):
                raise AssertionError(f"{rid} not promoted to {dest}: {where}")
        self.stats["memory/promote refused in part"] += 1

    def blocked(self, p: str, rid: str, dest: str) -> bool:
        """A move of `rid` (or of its group) into `dest` that another principal's id there refuses."""
        group = self.model.records[p][rid]["group"]
        unit = [r for r in self.model.records[p].values() if r["id"] == rid or (group and r["group"] == group)]
        if self.concurrent:  # where the other principal's record is now is not known here
            return any(r["id"] in self.model.records[q] for r in unit for q in PRINCIPALS if q != p)
        return any(self.model.holder_in(r["id"], dest, p) for r in unit)

    # ---- reads --------------------------------------------------------------------------------

    def read(self, p: str, method: str, params: dict[str, Any], answer: dict[str, Any], where: str) -> None:
        mine = self.model.records[p]
        if method == "memory/fetch":
            want = self.model.by_key(p, params["key"])
            got = answer["record"]
            assert (got and got["id"]) == (want and want["id"]), where
            if got:
                assert got["tier"] == want["tier"] and all(same(got[f], want[f]) for f in FIELDS), where
            return
        if method == "memory/session/list":
            counts: dict[str, dict[str, int]] = {}
            for rec in mine.values():
                if rec["session"] is not None:
                    counts.setdefault(rec["session"], {}).setdefault(rec["tier"], 0)
                    counts[rec["session"]][rec["tier"]] += 1
            got = {s["session"]: {t: n for t, n in s.get("tiers", {}).items() if n} for s in answer["sessions"]}
            assert got == counts, f"{got} != {counts}: {where}"
            return
        if method == "memory/describe":
            counts = Counter(rec["tier"] for rec in mine.values())
            assert {t["name"]: t["count"] for t in answer["tiers"]} == {n: counts[n] for n in NAMES}, where
            return
        if method == "memory/events":
            assert answer["events"] == [] and "cursor" in answer, where
            return
        records = answer["records"]
        if params.get("prompt"):  # rendered from the records shown, and only those
            assert set(answer["prompt_ids"]) <= {r["id"] for r in records}, where
        scope = {r["id"] for r in in_scope(self.model, p, params)}
        shown = [r["id"] for r in records]
        assert len(set(shown)) == len(shown) and set(shown) <= scope, f"out of scope {set(shown) - scope}: {where}"
        for rec in records:
            want = mine[rec["id"]]
            assert rec["tier"] == want["tier"] and all(same(rec[f], want[f]) for f in FIELDS), f"{rec}: {where}"
        limit = params.get("limit") or 1000
        if method == "memory/timeline" or not params.get("query"):
            assert len(shown) == min(limit, len(scope)), f"{len(shown)} of {len(scope)}: {where}"
            return
        hits = {r["id"] for r in in_scope(self.model, p, params) if holds(r, params["query"])}
        if params["query"].startswith("tok"):  # one record's own token: found wherever it lives, or not at all
            # (episodic lends a hit's score to its session neighbours, decision 21: never without a hit)
            assert hits or not shown, f"{params['query']}: {shown}, want none: {where}"
            if len(hits) <= limit:  # (summaries repeat their sources' tokens: a token may have several)
                assert hits <= set(shown), f"{params['query']}: {shown}, want {hits}: {where}"
            else:
                assert len(shown) == limit, f"{params['query']}: {shown}, want {limit} of {hits}: {where}"
        elif params["query"].startswith("mk"):  # another principal's marker: none of the caller's hold it
            assert shown == [], where

    # ---- writes -------------------------------------------------------------------------------

    def plan_write(self, p: str, records: list[dict[str, Any]], *, foreign: bool = True) -> int | list[dict[str, Any]]:
        """Where each record goes and what it replaces (protocol §3, decision 37), or the error the
        batch gets: -32005 for a record naming another owner, or an id another principal holds in
        the tier the record goes to (decision 37: ids are global; elsewhere the router cannot see it,
        decision 57)."""
        mine = self.model.records[p]
        for rec in records:
            if rec.get("owner", p) != p:
                return -32005
        plan: list[dict[str, Any]] = []
        for rec in records:
            rid = rec.get("id")
            if rid is not None and rid in mine:
                plan.append({"kept": rid})
                continue
            held = self.model.by_key(p, rec["key"]) if rec.get("key") else None
            home = self.model.group_tier(p, rec["group"]) if rec.get("group") else None
            if held and home and held["tier"] != home:
                return -32602
            place = held["tier"] if held else home
            if place and rec.get("tier") and rec["tier"] != place:
                return -32602
            plan.append({"tier": place or rec.get("tier") or "working", "replaces": held})
        for fld in ("key", "group", "id"):
            seen: dict[Any, str] = {}
            for rec, step in zip(records, plan):
                if "kept" in step or rec.get(fld) is None:
                    continue
                if seen.setdefault(rec[fld], step["tier"]) != step["tier"]:
                    return -32602
        for rec, step in zip(records, plan):
            if foreign and "kept" not in step and rec.get("id") and self.model.holder_in(rec["id"], step["tier"], p):
                return -32005
            if self.concurrent and "kept" not in step and rec.get("id") in self.model.ever[p]:
                step["maybe"] = True  # another principal's id: where it lives now decides
        return plan

    def remember_one(self, p: str, rec: dict[str, Any], rid: str, step: dict[str, Any] | None) -> None:
        mine = self.model.records[p]
        self.model.ever[p].add(rid)
        if step is not None and "kept" in step:
            assert rid == step["kept"]
            return
        if any(rid in self.model.records[q] for q in PRINCIPALS if q != p):
            self.stats["an id two principals hold (in two tiers)"] += 1
        held = self.model.by_key(p, rec["key"]) if rec.get("key") else None
        if held is not None:
            assert rid == held["id"], f"key {rec['key']} replaced under a new id"
        elif rec.get("id"):
            assert rid == rec["id"]
        mine[rid] = {"id": rid, "content": rec["content"], "key": rec.get("key"),
                     "revision": held["revision"] + 1 if held else 1, "metadata": rec.get("metadata", {}),
                     "session": rec.get("session"), "group": rec.get("group"), "role": rec.get("role"),
                     "created_at": None, "tier": (step or {}).get("tier") or rec.get("tier") or "working",
                     "salience": rec["salience"] if "salience" in rec else held["salience"] if held else 0.5}

    def plan_summary(self, p: str, params: dict[str, Any]) -> int | dict[str, Any]:
        """The caller's sources, in scope as the caller's own records only."""
        mine = self.model.records[p]
        if params.get("ids") is not None:
            sources = [mine[i] for i in dict.fromkeys(params["ids"]) if i in mine]
        elif params.get("query"):
            sources = [r for r in mine.values() if holds(r, params["query"])]
        else:
            sources = [r for r in mine.values() if r["session"] == params["where"]["session"]]
        key = params.get("key")
        held = self.model.by_key(p, key) if key else None
        if key:  # the summary this call replaces is no source of its own next revision
            sources = [r for r in sources if not (r["key"] == key and "summary_of" in r["metadata"])]
        read = sources[-50:] if len(sources) > 50 else sources
        if held and any(r["id"] == held["id"] for r in read):
            return -32602  # writing at the key would replace, so delete, one of the sources
        if held and params.get("into") and held["tier"] != params["into"]:
            return -32602 if sources else {"sources": sources, "held": held}
        # A query reads a hit's session neighbours too (decision 21): the key's record may be read then.
        refusable = bool(held and params.get("query") and "summary_of" not in held["metadata"])
        return {"sources": read, "held": held, "refusable": refusable}

    async def summarized(self, p: str, params: dict[str, Any], plan: dict[str, Any], answer: dict[str, Any],
                         where: str) -> None:
        mine = self.model.records[p]
        sources = {r["id"] for r in plan["sources"]}
        if params.get("query") and sources:  # episodic lends a hit's score to its session neighbours (decision 21)
            assert answer["read"] >= len(sources), f"read {answer['read']}, want at least {len(sources)}: {where}"
        else:
            assert answer["read"] == len(sources), f"read {answer['read']}, want {len(sources)}: {where}"
        if not answer["written"]:
            assert answer["records"] == [], where
            await self.settle(p, where, changed=False)
            return
        assert sources and answer["written"] == 1 and len(answer["records"]) == 1, where
        summary = answer["records"][0]
        summary_of = set(summary["metadata"]["summary_of"])
        assert sources <= summary_of <= set(mine), f"summary of {summary['metadata']}: {where}"
        assert len(summary_of) == answer["read"], where
        held = plan["held"]
        if held is not None:
            assert summary["id"] == held["id"] and summary["revision"] == held["revision"] + 1, where
        rid = summary["id"]
        self.model.ever[p].add(rid)
        mine[rid] = {"id": rid, "content": summary["content"], "key": summary.get("key"),
                     "revision": summary["revision"], "metadata": summary["metadata"], "session": None,
                     "group": None, "role": "memory", "created_at": None, "tier": summary["tier"],
                     "salience": held["salience"] if held else 0.5}
        await self.settle(p, where, changed=True)
        if params.get("into") and not held:
            assert mine[rid]["tier"] == params["into"] or params["into"] == "working", where
        self.stats["summary written"] += 1


def holds(rec: dict[str, Any], word: str) -> bool:
    """A record holds a query word as the servers' tokenizer reads both."""
    return set(tokenize(word)) <= set(tokenize(rec["content"]))


def diff(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for rid in set(a) | set(b):
        if a.get(rid) != b.get(rid):
            out[rid] = (a.get(rid), b.get(rid))
    return out


# ---- the test ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The tiers accept only the service token; the router takes one bearer token per principal and
    counts recalls inline (so another principal's access counts are exact: any change is a leak)."""
    top = {"background_promotion": False, "auth": {"tokens": TOKENS}}
    with federation(tmp_path_factory.mktemp("auth"), TIERS, mode="real", top=top,
                    env={"A2M_SERVICE_TOKEN": SERVICE}) as running:
        yield running


async def test_the_tiers_answer_only_the_service_token(stack: Stack) -> None:
    """What the model reads as ground truth is reachable only as the router: a principal's token,
    or none, is refused by every tier, and the service token is refused by the router."""
    body = {"jsonrpc": "2.0", "id": 1, "method": "memory/timeline", "params": {"owner": "alice"}}
    async with httpx.AsyncClient(timeout=30.0) as web:
        for name in NAMES:
            for headers in ({}, {"authorization": f"Bearer {TOKEN_OF['alice']}"}):
                reply = await web.post(stack.tiers[name].url, json=body, headers=headers)
                assert reply.status_code == 401, f"{name} {headers}: {reply.status_code}"
        reply = await web.post(stack.url, json=body, headers={"authorization": f"Bearer {SERVICE}"})
        assert reply.status_code == 401


def _describes(metrics: str) -> float:
    """How many memory/describe calls a server's /metrics has counted."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
               if line.startswith("a2m_requests_total{") and 'method="memory/describe"' in line)


async def test_the_anonymous_discovery_document_holds_no_partition_data(stack: Stack) -> None:
    """`GET /.well-known/a2m-server.json` needs no token (protocol §8), but POST memory/describe does
    (§7): the document must not be a way around it. It showed the live counts of the unowned
    partition (records from before auth was turned on, say), every tier's private URL and status,
    and each GET cost a describe of every tier."""
    async with HTTPClient(stack.tiers["episodic"].url, token=SERVICE) as tier, \
            httpx.AsyncClient(timeout=30.0) as web:
        legacy = (await tier.call("memory/remember", {"records": [{"content": "unowned, from before auth"}]}))["ids"]
        try:
            asked = _describes((await web.get(stack.tiers["episodic"].url + "metrics")).text)
            reply = await web.get(stack.url + ".well-known/a2m-server.json")
            assert reply.status_code == 200
            doc = reply.json()
            assert doc["protocol"] == "a2m/0.1" and "memory/remember" in doc["methods"]
            assert [t["name"] for t in doc["tiers"]] == NAMES  # the layout is discovery; its contents are not
            for entry in doc["tiers"]:
                assert not {"count", "url", "status", "error", "engine"} & set(entry), entry
            assert _describes((await web.get(stack.tiers["episodic"].url + "metrics")).text) == asked
            refused = await web.post(stack.url, json={"jsonrpc": "2.0", "id": 1, "method": "memory/describe"})
            assert refused.status_code == 401
            async with HTTPClient(stack.url, token=TOKEN_OF["alice"]) as alice:  # a principal's describe: all of it
                mine = await alice.call("memory/describe", {})
                assert all({"count", "url", "status"} <= set(t) for t in mine["tiers"])
        finally:
            await tier.call("memory/forget", {"ids": legacy})


def test_a_tier_with_tokens_keeps_its_counts_from_the_discovery_document(stack: Stack) -> None:
    """The binding marks the document's caller anonymous wherever tokens are set: a tier server too."""
    reply = httpx.get(stack.tiers["episodic"].url + ".well-known/a2m-server.json", timeout=30.0)
    assert reply.status_code == 200
    assert [{k for k in t if k in ("count", "engine")} for t in reply.json()["tiers"]] == [set()]


class Recording:
    """A tier client that keeps every call the router makes (what the tier receives)."""

    def __init__(self, url: str, name: str, calls: list[tuple[str, str, dict[str, Any]]]) -> None:
        self.client = HTTPClient(url, token=SERVICE, timeout=30.0)
        self.name, self.calls = name, calls

    async def call(self, method: str, params: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        self.calls.append((self.name, method, orjson.loads(orjson.dumps(params))))
        return await self.client.call(method, params, timeout=timeout)

    async def close(self) -> None:
        await self.client.close()


EVERY_CALL: list[tuple[str, dict[str, Any]]] = [
    ("memory/describe", {}),
    ("memory/remember", {"records": [{"content": f"turn {i} river", "session": "s1"} for i in range(5)]}),
    ("memory/remember", {"records": [{"content": "keyed", "key": "user/city"}, {"content": "grouped", "group": "g1"},
                                     {"content": "deep", "tier": "semantic", "id": "rx-1"},
                                     {"content": "how to", "tier": "procedural", "key": "proc/a"}]}),
    ("memory/remember", {"records": [{"content": "keyed again", "key": "user/city"}, {"content": "more", "group": "g1"},
                                     {"content": "again", "id": "rx-1"}]}),
    ("memory/recall", {"query": "river"}),
    ("memory/recall", {"query": "river", "fusion": "rerank", "prompt": True}),
    ("memory/recall", {}),
    ("memory/timeline", {"where": {"session": "s1"}, "prompt": True}),
    ("memory/fetch", {"key": "user/city"}),
    ("memory/reinforce", {"ids": ["rx-1"], "amount": 0.2}),
    ("memory/promote", {"ids": ["rx-1"], "tier": "episodic"}),
    ("memory/session/list", {}),
    ("memory/summarize", {"query": "river", "into": "semantic", "key": "digest"}),
    ("memory/summarize", {"where": {"session": "s1"}}),
    ("memory/session/close", {"session": "s1"}),
    ("memory/consolidate", {}),
    ("memory/events", {}),
    ("memory/forget", {"query": "keyed"}),
    ("memory/forget", {"ids": ["rx-1"]}),
    ("memory/forget", {"key_prefix": ""}),
    ("memory/forget", {"where": {"key": None}}),
]


async def test_every_tier_call_carries_the_principal_and_a_foreign_owner_reaches_no_tier(stack: Stack) -> None:
    """The router in process over the same tier servers, every tier client recorded: each call of
    every method, made as a principal, sends that principal as `owner` on every tier call (and no
    record naming another); the same call naming another owner is -32005 before any tier call."""
    from a2m.dispatch import Context, Dispatcher
    from router.config import load
    from router.server import Router

    calls: list[tuple[str, str, dict[str, Any]]] = []
    router = Router(load(stack.config, env={"A2M_SERVICE_TOKEN": SERVICE}),
                    client_factory=lambda t: Recording(t.url, t.name, calls))
    await router.startup()
    try:
        dispatcher = Dispatcher(router)
        me = "dave-" + uuid.uuid4().hex[:6]
        ctx = Context(principal=me, transport="http")
        calls.clear()  # the start's own describe of each tier (its layout, no owner's data)
        for method, params in EVERY_CALL:
            for owner in ("eve", None):  # another owner first: refused before any tier is asked
                sent = dict(params) if owner is None else {**params, "owner": owner}
                before = len(calls)
                try:
                    await dispatcher.call(method, sent, ctx)
                except A2MError as exc:
                    assert owner is not None and exc.code == -32005, f"{method} {sent}: {exc}"
                    assert len(calls) == before, f"{method} as another owner reached {calls[before:]}"
                    continue
                assert owner is None, f"{method} as another owner was answered"
        await router.drain()
        assert {method for _, method, _ in calls} >= {"memory/remember", "memory/recall", "memory/timeline",
                                                      "memory/forget", "memory/fetch", "memory/reinforce",
                                                      "memory/describe", "memory/session/list"}
        for tier, method, params in calls:
            if params.get("owner") == INTENTS:  # the router's own partition: batches' intents (decision 166)
                assert method in ("memory/timeline", "memory/remember", "memory/forget"), (tier, method, params)
                assert all(set(r) == {"content"} for r in params.get("records") or []), (tier, method, params)
                continue
            assert params.get("owner") == me, f"{tier} got {method} {params}"
            for record in params.get("records") or []:
                assert record.get("owner") in (None, me), f"{tier} got {method} {params}"
    finally:
        await router.shutdown()


@pytest.mark.parametrize("seed", SEEDS)
async def test_each_principal_sees_only_its_own_partition(stack: Stack, seed: int) -> None:
    await one_after_another(stack, seed, background=False)


@pytest.fixture(scope="module")
def background_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """As `stack`, with recalls counted after they answer, all owners' counts in one flush (the
    default deployment)."""
    top = {"background_promotion": True, "auth": {"tokens": TOKENS}}
    with federation(tmp_path_factory.mktemp("auth-bg"), TIERS, mode="real", top=top,
                    env={"A2M_SERVICE_TOKEN": SERVICE}) as running:
        yield running


@pytest.mark.parametrize("seed", SEEDS)
async def test_counting_recalls_in_the_background_keeps_principals_apart(background_stack: Stack, seed: int) -> None:
    await one_after_another(background_stack, seed, background=True)


async def one_after_another(stack: Stack, seed: int, *, background: bool) -> None:
    rng = random.Random(seed)
    fed = Federation(stack)
    model = Model(seed + (2000 if background else 0))
    # Each seed starts from what earlier seeds left: forget it all first (as each principal).
    for p in PRINCIPALS:
        await fed.call(p, "memory/forget", {"key_prefix": ""})
        await fed.call(p, "memory/forget", {"where": {"key": None}})
    checker = Checker(fed, model, background=background)
    try:
        await checker.start()
        assert all(not checker.state[p] for p in PRINCIPALS), "a principal's records survived forgetting all"
        for step in range(CALLS):
            p = rng.choice(PRINCIPALS)
            method, params = operation(rng, model, p)
            await checker.run(rng, p, method, params, step)
        print(f"seed {seed}{' (background)' if background else ''}: {dict(sorted(checker.stats.items()))}")
    finally:
        await fed.close()


@pytest.mark.parametrize("seed", SEEDS)
async def test_principals_calling_at_once_stay_apart(stack: Stack, seed: int) -> None:
    """The same calls, each principal from its own task at the same time: one principal's moves,
    locks, capacity passes and events never touch another's partition mid-flight."""
    fed = Federation(stack)
    model = Model(seed + 1000)
    for p in PRINCIPALS:
        await fed.call(p, "memory/forget", {"key_prefix": ""})
        await fed.call(p, "memory/forget", {"where": {"key": None}})
    checker = Checker(fed, model, concurrent=True)

    async def principal(p: str, rng: random.Random) -> None:
        for step in range(CALLS // len(PRINCIPALS)):
            method, params = operation(rng, model, p)
            await checker.run(rng, p, method, params, step)

    try:
        await checker.start()
        await asyncio.gather(*(principal(p, random.Random(f"{seed}-{p}")) for p in PRINCIPALS))
        print(f"seed {seed} at once: {dict(sorted(checker.stats.items()))}")
    finally:
        await fed.close()
