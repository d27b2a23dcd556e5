"""The router under concurrent calls, on real tier servers (Redis, PostgreSQL, Qdrant Edge, git).

The parity test (test_router_parity.py) sends one call at a time; here CLIENTS clients call the
router at once, as one owner, against a small working capacity (4 per session, promotion after 2
recalls): plain writes, batches and groups into shared sessions, keyed writes of the same keys
from several clients at once, fetches of them, client ids (one id from every client at once, and
retries), recalls that earn promotion, memory/promote, forgets (by id and by selector) of records
that may be mid-spill, session/close while the session is still written, consolidate beside
spills, reinforce, and batches a tier refuses. The calls race; the verdict
must not: after the clients stop and one final consolidate, the tier servers are read directly
and must hold what the acknowledged calls allow, in every interleaving:

- every acknowledged record not forgotten since is in exactly one tier, with its content;
  one whose forget was acknowledged after its last write is nowhere (no spill brought it back);
  nothing else is anywhere (a refused batch left nothing);
- groups are whole in one tier; a key is held by one record, whose revision counts every
  acknowledged write of it and whose content is one of its last writes;
- no session of working is over capacity, and after one more consolidate nothing recalled
  PROMOTE_AFTER times is left in episodic;
- a key once written (and never forgotten) is never fetched as absent;
- `memory/events` lists a `written` event for every record written, and a key's revisions never
  repeat.

An operation "happened before" another when its answer came before the other was sent (a logical
clock in the one event loop); only such orders are relied on.

CONC_SEEDS=1,2,3 CONC_CLIENTS=8 CONC_OPS=60 (calls per client) are the defaults, about 15 s on 2
cores; e.g. CONC_SEEDS=21,22,23,24,25,26 CONC_CLIENTS=16 CONC_OPS=120 is a longer run (about 40 s).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import uuid
from dataclasses import dataclass, field
from typing import Any, Iterator

import pytest

from a2m.client import HTTPClient
from a2m.errors import A2MError

from .stack import Stack, federation
from .test_router_parity import CAPACITY, PROMOTE_AFTER
from .test_router_parity import TIERS as PARITY_TIERS

pytestmark = pytest.mark.anyio

# The parity test's layout (capacity 4, promote after 2), with room for many clients' calls queued at once.
TIERS = [{**tier, "timeout": 20.0} for tier in PARITY_TIERS]
NAMES = [t["name"] for t in TIERS]

SEEDS = [int(s) for s in os.environ.get("CONC_SEEDS", "1,2,3").split(",")]
CLIENTS = int(os.environ.get("CONC_CLIENTS", "8"))
OPS = int(os.environ.get("CONC_OPS", "60"))

WORDS = ["harbour", "ferry", "tea", "green", "rocket", "plan", "river", "city"]
SESSIONS = ["s1", "s2", "s3", None]
HOT_KEYS = ["hot/a", "hot/b"]  # written by every client, never forgotten: the revision counts every write
COLD_KEYS = ["cold/a", "cold/b"]  # written and forgotten
GROUPS = ["g1", "g2", "g3"]
FOREIGN = "foreign-held"  # an id another owner holds in semantic: a batch writing it there is refused


@dataclass
class Call:
    client: int
    method: str
    params: dict[str, Any]
    start: int
    end: int = -1
    answer: dict[str, Any] | None = None
    error: A2MError | None = None


@dataclass
class Ledger:
    """What every client sent and was answered, stamped by one logical clock."""

    clock: Iterator[int] = field(default_factory=itertools.count)
    calls: list[Call] = field(default_factory=list)
    acked: dict[str, list[tuple[Call, dict[str, Any]]]] = field(default_factory=dict)  # id -> (write, record)
    hot_ids: set[str] = field(default_factory=set)
    client_ids: dict[int, list[str]] = field(default_factory=dict)  # client -> the ids it chose
    retries: set[int] = field(default_factory=set)  # id() of records sent with an id already acknowledged
    recalled: list[str] = field(default_factory=list)  # words worth recalling again

    def ids(self) -> list[str]:
        return list(self.acked)


class Clients:
    def __init__(self, stack: Stack, owner: str, seed: int) -> None:
        self.stack, self.owner, self.seed = stack, owner, seed
        self.ledger = Ledger()
        self.unexpected: list[str] = []

    async def run(self) -> None:
        await asyncio.gather(*(self.client(n) for n in range(CLIENTS)))

    async def client(self, n: int) -> None:
        rng = random.Random(self.seed * 1000 + n)
        async with HTTPClient(self.stack.url, timeout=120.0) as router:
            for step in range(OPS):
                await asyncio.sleep(rng.uniform(0, 0.004))
                method, params, refusal = self.operation(rng, n, step)
                if method == "memory/remember":
                    self.ledger.retries.update(id(r) for r in params["records"] if r.get("id") in self.ledger.acked)
                call = Call(n, method, params, next(self.ledger.clock))
                try:
                    call.answer = await router.call(method, {"owner": self.owner, **params})
                except A2MError as exc:
                    call.error = exc
                call.end = next(self.ledger.clock)
                self.ledger.calls.append(call)
                if refusal is not None:
                    if call.error is None or call.error.code != refusal:
                        self.unexpected.append(f"want {refusal}: {method} {params} -> {call.answer or call.error}")
                    continue
                if call.error is not None:
                    self.unexpected.append(f"{method} {params} -> {call.error.code} {call.error.message}")
                    continue
                if method == "memory/fetch" and call.answer["record"] is None:
                    if any(r.get("key") == params["key"] for c in self.ledger.calls[:-1] if c.end < call.start
                           and c.method == "memory/remember" and c.error is None for r in c.params["records"]):
                        self.unexpected.append(f"fetch {params['key']} found nothing after it was written")
                if method == "memory/remember":
                    for record, rid in zip(params["records"], call.answer["ids"]):
                        self.ledger.acked.setdefault(rid, []).append((call, record))
                        if record.get("key") in HOT_KEYS:
                            self.ledger.hot_ids.add(rid)

    def content(self, rng: random.Random, n: int, step: int, j: int = 0) -> str:
        return f"{rng.choice(WORDS)} {rng.choice(WORDS)} w{self.seed}c{n}s{step}r{j}"

    def operation(self, rng: random.Random, n: int, step: int) -> tuple[str, dict[str, Any], int | None]:
        known = self.ledger.ids()
        roll = rng.random()

        def rec(j: int = 0) -> dict[str, Any]:
            out: dict[str, Any] = {"content": self.content(rng, n, step, j)}
            session = rng.choice(SESSIONS)
            if session is not None:
                out["session"] = session
            return out

        if step % 7 == 3:  # every client writes this id at about the same time, each into its own tier
            tier = NAMES[n % len(NAMES)]
            return "memory/remember", {"records": [rec() | {"id": f"{self.owner}-twin{step}", "tier": tier}]}, None
        if roll < 0.18:
            return "memory/remember", {"records": [rec()]}, None
        if roll < 0.26:
            return "memory/remember", {"records": [rec(j) for j in range(rng.randint(2, 4))]}, None
        if roll < 0.34:  # a group: written together, or joined later wherever it lives
            group = rng.choice(GROUPS)
            return "memory/remember", {"records": [rec(j) | {"group": group} for j in range(rng.randint(1, 3))]}, None
        if roll < 0.46:  # the same keys from every client at once
            key = rng.choice(HOT_KEYS if rng.random() < 0.6 else COLD_KEYS)
            records = [rec() | {"key": key}]
            if rng.random() < 0.15:  # written twice in one batch: two revisions
                records.append(rec(1) | {"key": key})
            return "memory/remember", {"records": records}, None
        if roll < 0.50:  # a client id, into a tier of its own; or one sent before, again (a retry)
            tier = rng.choice(NAMES)
            mine = self.ledger.client_ids.setdefault(n, [])
            rid = rng.choice(mine) if mine and rng.random() < 0.4 else f"{self.owner}-c{n}-{step}"
            mine.append(rid)
            record = rec() | {"id": rid}
            if rng.random() < 0.8:
                record["tier"] = tier
            return "memory/remember", {"records": [record]}, None
        if roll < 0.53:  # a batch semantic refuses (an id another owner holds there): nothing may stay
            return "memory/remember", {"records": [rec(), rec(1) | {"id": FOREIGN, "tier": "semantic"}]}, -32005
        if roll < 0.56:  # a hot key, once acknowledged, is never gone (it is never forgotten)
            return "memory/fetch", {"key": rng.choice(HOT_KEYS)}, None
        if roll < 0.66:
            words = self.ledger.recalled
            if words and rng.random() < 0.6:
                word = rng.choice(words[-6:])
            else:
                mine = [r["content"] for rid in known[-12:] for _, r in self.ledger.acked[rid]]
                word = rng.choice(mine).split()[-1] if mine else rng.choice(WORDS)
                words.append(word)
            return "memory/recall", {"query": word, "limit": 3}, None
        if roll < 0.72 and known:
            ids = rng.sample(known, min(len(known), rng.randint(1, 2)))
            return "memory/promote", {"ids": ids, "tier": rng.choice(["working", "episodic", "semantic"])}, None
        if roll < 0.74:  # by selector: every cold key, or a session's records that have no key
            if rng.random() < 0.5:
                return "memory/forget", {"key_prefix": "cold/"}, None
            return "memory/forget", {"where": {"session": rng.choice(["s1", "s2", "s3"]), "key": None}}, None
        if roll < 0.81 and known:
            doomed = [i for i in known if i not in self.ledger.hot_ids]
            if doomed:
                return "memory/forget", {"ids": rng.sample(doomed[-10:], min(len(doomed[-10:]), rng.randint(1, 2)))}, None
        if roll < 0.87:
            return "memory/session/close", {"session": rng.choice(["s1", "s2", "s3"])}, None
        if roll < 0.91:
            return "memory/consolidate", {}, None
        if known:
            return "memory/reinforce", {"ids": rng.sample(known, min(len(known), 2)), "amount": 0.1}, None
        return "memory/remember", {"records": [rec()]}, None


async def placement(stack: Stack, owner: str) -> dict[str, list[dict[str, Any]]]:
    out = {}
    for name in NAMES:
        async with HTTPClient(stack.tiers[name].url, timeout=60.0) as tier:
            out[name] = (await tier.call("memory/timeline", {"owner": owner, "limit": 0}))["records"]
    return out


async def all_events(router: HTTPClient, owner: str, cursor: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    while True:
        answer = await router.call("memory/events", {"owner": owner, "cursor": cursor, "limit": 1000})
        assert not answer.get("reset"), "the event window dropped events: raise events_capacity"
        out += answer["events"]
        if not answer["events"]:
            return out
        cursor = answer["cursor"]


def verdict(ledger: Ledger, held: dict[str, list[dict[str, Any]]], events: list[dict[str, Any]]) -> list[str]:
    """Every invariant the acknowledged calls fix, as a list of violations."""
    bad: list[str] = []
    where: dict[str, tuple[str, dict[str, Any]]] = {}
    for tier, records in held.items():
        for record in records:
            if record["id"] in where:
                bad.append(f"{record['id']} is in {where[record['id']][0]} and {tier}")
            where[record["id"]] = (tier, record)

    forgets = [c for c in ledger.calls if c.method == "memory/forget" and c.error is None]

    def hits(forget: Call, rid: str, record: dict[str, Any]) -> bool:
        params = forget.params
        if "ids" in params:
            return rid in params["ids"]
        if "key_prefix" in params:
            return (record.get("key") or "").startswith(params["key_prefix"])
        return not record.get("key") and record.get("session") == params["where"]["session"]

    for rid, writes in ledger.acked.items():
        # which forgets may have taken it (one of its writes matched), and which surely did (all did)
        killers = [f for f in forgets if any(hits(f, rid, r) for _, r in writes)]
        sure = [f for f in killers if all(hits(f, rid, r) for _, r in writes)]
        # present: some write began after every forget that may take it had been answered
        must_be = any(all(f.end < w.start for f in killers) for w, _ in writes)
        # absent: some forget that surely takes it began after every write of it had been answered
        must_not = any(all(w.end < f.start for w, _ in writes) for f in sure)
        if must_be and rid not in where:
            bad.append(f"{rid} acknowledged {[(w.method, r['content']) for w, r in writes]} and lost")
        if must_not and rid in where:
            bad.append(f"{rid} forgotten (acknowledged) and still in {where[rid][0]}: {where[rid][1]['content']!r}")
        if rid in where and not where[rid][1].get("key"):
            # an id sent again after it was acknowledged is kept as it is, unless it was forgotten before
            contents = {r["content"] for w, r in writes if id(r) not in ledger.retries
                        or any(f.start < w.end for f in killers)}
            if where[rid][1]["content"] not in contents:
                bad.append(f"{rid} holds {where[rid][1]['content']!r}, written {contents}")
    for rid, (tier, record) in where.items():
        if rid not in ledger.acked:
            bad.append(f"{rid} in {tier} was never acknowledged: {record['content']!r}")

    groups: dict[str, set[str]] = {}
    for tier, record in where.values():
        if record.get("group"):
            groups.setdefault(record["group"], set()).add(tier)
    bad += [f"group {g} split over {sorted(t)}" for g, t in groups.items() if len(t) > 1]

    keyed_writes: dict[str, list[tuple[Call, dict[str, Any]]]] = {}
    for call in ledger.calls:
        if call.method == "memory/remember" and call.error is None:
            for record in call.params["records"]:
                if record.get("key"):
                    keyed_writes.setdefault(record["key"], []).append((call, record))
    holders: dict[str, list[dict[str, Any]]] = {}
    for tier, record in where.values():
        if record.get("key"):
            holders.setdefault(record["key"], []).append(record)
    for key, records in holders.items():
        if len(records) > 1:
            bad.append(f"key {key} held by {[(r['id'], r['revision'], r['content']) for r in records]}")
    for key in HOT_KEYS:
        writes = keyed_writes.get(key, [])
        if not writes:
            continue
        held_by = holders.get(key, [])
        if len(held_by) != 1:
            bad.append(f"key {key}: {len(held_by)} holders after {len(writes)} writes")
            continue
        record = held_by[0]
        if record["revision"] != len(writes):
            bad.append(f"key {key} at revision {record['revision']} after {len(writes)} acknowledged writes")
        # the content of a write no later write of the key began after (a write a later one follows
        # is superseded; a batch's earlier record is superseded by its later one)
        last = [r for w, r in writes if not any(o.start > w.end for o, _ in writes)
                and r is [x for x in w.params["records"] if x.get("key") == key][-1]]
        if record["content"] not in {r["content"] for r in last}:
            bad.append(f"key {key} holds {record['content']!r}, not one of its last writes {[r['content'] for r in last]}")
        revisions = sorted(e["revision"] for e in events if e["kind"] == "written" and e.get("key") == key)
        if revisions != list(range(1, len(writes) + 1)):
            bad.append(f"key {key}: written events carry revisions {revisions} for {len(writes)} writes")
    seen: dict[tuple[str, int], int] = {}
    for event in events:
        if event["kind"] == "written" and event.get("key"):
            pair = (event["id"], event["revision"])
            seen[pair] = seen.get(pair, 0) + 1
    bad += [f"revision {r} of {i} written twice" for (i, r), n in seen.items() if n > 1]

    sessions: dict[Any, int] = {}
    for record in held["working"]:
        sessions[record.get("session")] = sessions.get(record.get("session"), 0) + 1
    bad += [f"working session {s} holds {n} > {CAPACITY}" for s, n in sessions.items() if n > CAPACITY]

    written: dict[str, int] = {}
    for event in events:
        if event["kind"] == "written":
            written[event["id"]] = written.get(event["id"], 0) + 1
    for rid, writes in ledger.acked.items():
        fresh = sum(1 for _, r in writes if not r.get("id"))  # the router chose the id: written each time
        if not fresh <= written.get(rid, 0) <= len(writes) or not written.get(rid):
            bad.append(f"{rid}: {len(writes)} acknowledged writes, {written.get(rid, 0)} written events")
    bad += [f"written event for {rid}, never acknowledged" for rid in written if rid not in ledger.acked]
    return bad


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with federation(tmp_path_factory.mktemp("conc"), TIERS, mode="real", top={"events_capacity": 100_000}) as running:
        yield running


@pytest.mark.parametrize("seed", SEEDS)
async def test_concurrent_clients_leave_the_federation_as_their_acknowledged_calls_say(stack: Stack, seed: int) -> None:
    owner, other = f"conc{seed}-{uuid.uuid4().hex[:6]}", f"other{seed}-{uuid.uuid4().hex[:6]}"
    async with HTTPClient(stack.url, timeout=120.0) as router:
        try:  # held by another owner (once per federation)
            await router.call("memory/remember", {"owner": other, "records": [
                {"id": FOREIGN, "content": "not yours", "tier": "semantic"}]})
        except A2MError as exc:
            assert exc.code == -32005
        cursor = (await router.call("memory/events", {"owner": owner}))["cursor"]
        clients = Clients(stack, owner, seed)
        await clients.run()
        final = await router.call("memory/consolidate", {"owner": owner})
        events = await all_events(router, owner, cursor)
        held = await placement(stack, owner)
        bad = clients.unexpected + verdict(clients.ledger, held, events)
        # What the final consolidate spilled into episodic having earned promotion is promoted by the
        # next one (decision 9): then nothing recalled PROMOTE_AFTER times is left in episodic.
        await router.call("memory/consolidate", {"owner": owner})
    earned = [(r["id"], r["access_count"]) for r in (await placement(stack, owner))["episodic"]
              if r["access_count"] >= PROMOTE_AFTER]
    bad += [f"recalled {n} times, still in episodic after two consolidates: {rid}" for rid, n in earned]
    methods = sorted({c.method for c in clients.ledger.calls})
    counts = {m: sum(c.method == m for c in clients.ledger.calls) for m in methods}
    print(f"seed {seed}: {counts}; final {final}; held {({t: len(r) for t, r in held.items()})}")
    assert not bad, "\n".join(bad[:40])
