"""A seeded random workload through the router while its processes crash: "no lost record on a
crash between two servers", checked against a model of what was acknowledged.

Real processes on loopback: the router and the tier servers on their embedded engines (Redis,
PostgreSQL, Qdrant Edge). The workload remembers into a working tier with a tiny per-session
capacity (so nearly every write spills), closes sessions, recalls (so records earn promotion),
consolidates, forgets acknowledged ids and reinforces. At random steps, with the step's call in
flight, a fault lands: a tier server SIGKILLed and restarted on its data, a tier SIGSTOPped past
its timeout and continued, or the router itself SIGKILLed (mid-move: the call in flight is one
that moves) and restarted.

The model: an acknowledged write must exist afterwards unless an acknowledged forget took it; an
acknowledged forget must never come back; a call that failed or timed out allows either outcome.
After the faults, `memory/consolidate` (its duplicate repair runs interrupted moves again) until
it repairs nothing; then every tier is read directly: nothing acknowledged lost, nothing
forgotten back, each record in one tier, one record per key holding a current revision, and the
router shows what the tiers hold.

Deterministic in its choices given the seed (which call, which fault, where); the timing of a
fault against a move is not. `A2M_SCALE=full` runs a long soak.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable

import pytest

from a2m.client import HTTPClient

from tests.conftest import scale
from .stack import Stack, federation, tier_call

TIMEOUT = 1.0
TIERS = [
    {"name": "working", "kind": "working", "capacity": 3, "per_session": True, "spill_to": "episodic",
     "timeout": TIMEOUT},
    {"name": "episodic", "kind": "episodic", "capacity": 12, "spill_to": "semantic", "promote_to": "semantic",
     "promote_after": 2, "timeout": TIMEOUT},
    {"name": "semantic", "kind": "semantic", "timeout": TIMEOUT},
]
NAMES = [t["name"] for t in TIERS]
STEPS = scale(400, 60)
FAULTS = scale(60, 9)
SESSIONS = ["s0", "s1", "s2"]
KEYS = ["user/city", "user/pet", "plan"]
WORDS = ["harbour", "ferry", "quarterly", "plan", "garden", "invoice", "meeting", "river"]
CALL_TIMEOUT = 20.0


@dataclass
class Model:
    """What the router acknowledged. `allowed[id]`: the contents that id may hold (a failed replace of
    its key may or may not have landed); `must`: ids that have to exist; `gone`: ids an acknowledged
    forget took; `orphans`: contents of failed writes whose id the router never told."""
    allowed: dict[str, set[str]] = field(default_factory=dict)
    must: set[str] = field(default_factory=set)
    gone: set[str] = field(default_factory=set)
    orphans: set[str] = field(default_factory=set)
    key_id: dict[str, str] = field(default_factory=dict)
    recent: list[str] = field(default_factory=list)  # acknowledged ids, oldest first

    def acked_write(self, records: list[dict[str, Any]], ids: list[str]) -> None:
        for record, rid in zip(records, ids):
            if rid in self.gone:  # never reused: an id the router gave back after its forget is a new finding
                raise AssertionError(f"the router answered a write with forgotten id {rid}")
            if record.get("key"):
                self.key_id[record["key"]] = rid
            self.allowed[rid] = {record["content"]}
            self.must.add(rid)
            self.recent.append(rid)

    def failed_write(self, records: list[dict[str, Any]]) -> None:
        for record in records:
            rid = record.get("id") or (self.key_id.get(record["key"]) if record.get("key") else None)
            if rid is not None and rid not in self.gone:
                self.allowed.setdefault(rid, set()).add(record["content"])
            if rid is None or record.get("key"):  # a key may also have been written anew under a fresh id
                self.orphans.add(record["content"])

    def acked_forget(self, ids: list[str]) -> None:
        self.gone |= set(ids)
        self.must -= set(ids)

    def failed_forget(self, ids: list[str]) -> None:
        self.must -= set(ids)

    def live(self) -> list[str]:
        return sorted(self.must)


@dataclass
class Tally:
    calls: Counter[str] = field(default_factory=Counter)
    failed: Counter[str] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)
    interrupted: int = 0  # ids seen in two tiers right after a fault: a move cut between write and delete
    repaired: int = 0


async def holdings(stack: Stack) -> dict[str, list[dict[str, Any]]]:
    """tier -> every record it holds (owner null), read from the tier server itself."""
    out = {}
    for name in NAMES:
        out[name] = (await tier_call(stack, name, "memory/timeline", {"limit": 0}))["records"]
    return out


def doubles(held: dict[str, list[dict[str, Any]]]) -> set[str]:
    seen: Counter[str] = Counter(r["id"] for records in held.values() for r in records)
    return {i for i, n in seen.items() if n > 1}


class Workload:
    def __init__(self, stack: Stack, seed: int) -> None:
        self.stack = stack
        self.rng = random.Random(seed)
        self.seed = seed
        self.model = Model()
        self.tally = Tally()
        self.n = 0
        self.step = 0
        self.log: list[str] = []  # what each step did to which ids, and each fault: printed for a finding
        self.router = HTTPClient(stack.url, timeout=CALL_TIMEOUT)

    async def fresh_client(self) -> None:
        await self.router.close()
        self.router = HTTPClient(self.stack.url, timeout=CALL_TIMEOUT)

    async def call(self, method: str, params: dict[str, Any]) -> dict[str, Any] | None:
        """The router's answer, or None when the call failed or timed out (either outcome allowed)."""
        self.tally.calls[method] += 1
        try:
            return await self.router.call(method, params)
        except Exception as exc:  # noqa: BLE001 - any failure is "not acknowledged"
            self.tally.failed[f"{method}: {type(exc).__name__}"] += 1
            return None

    # ---- the steps ------------------------------------------------------------------

    def pick(self, moving: bool) -> Callable[[], Awaitable[None]]:
        """A step; `moving`: one whose call moves records (for a router crash to cut into)."""
        if moving:
            return self.rng.choice([self.remember, self.remember, self.close, self.consolidate])
        return self.rng.choices([self.remember, self.close, self.recall, self.forget, self.reinforce,
                                 self.consolidate], weights=[8, 2, 4, 2, 1, 1])[0]

    async def remember(self) -> None:
        session = self.rng.choice(SESSIONS)
        records = []
        for _ in range(self.rng.randint(1, 4)):
            self.n += 1
            content = f"{self.rng.choice(WORDS)} {self.rng.choice(WORDS)} seed{self.seed} n{self.n}"
            record: dict[str, Any] = {"content": content, "session": session}
            shape = self.rng.random()
            if shape < 0.3 and not any(r.get("key") for r in records):
                record["key"] = self.rng.choice(KEYS)
            elif shape < 0.55:
                record["id"] = f"c{self.seed}-{self.n}"
            records.append(record)
        answer = await self.call("memory/remember", {"records": records})
        if answer is None:
            self.model.failed_write(records)
        else:
            self.model.acked_write(records, answer["ids"])
        self.note(f"remember {'failed' if answer is None else answer['ids']} {[r['content'] for r in records]}")

    async def close(self) -> None:
        await self.call("memory/session/close", {"session": self.rng.choice(SESSIONS)})

    async def consolidate(self) -> None:
        answer = await self.call("memory/consolidate", {})
        if answer:
            self.tally.repaired += int(answer.get("repaired", 0))

    async def recall(self) -> None:
        await self.call("memory/recall", {"query": self.rng.choice(WORDS), "limit": 5})

    async def forget(self, recent: bool = False) -> None:
        """Forget one or two acknowledged ids (`recent`: of the latest written, the ones moving now)."""
        live = [i for i in self.model.recent[-8:] if i in self.model.must] if recent else self.model.live()
        if not live:
            return
        ids = self.rng.sample(live, min(len(live), self.rng.randint(1, 2)))
        answer = await self.call("memory/forget", {"ids": ids})
        (self.model.acked_forget if answer is not None else self.model.failed_forget)(ids)
        self.note(f"forget {ids} {'failed' if answer is None else answer}")

    def note(self, what: str) -> None:
        self.log.append(f"step {self.step} t={time.monotonic():.2f}: {what}")

    def story(self, rid: str) -> list[str]:
        """The steps that named `rid`, and the faults from the first of them on."""
        named = [i for i, line in enumerate(self.log) if rid in line]
        return [line for i, line in enumerate(self.log) if named and i >= named[0]
                and (rid in line or line.split(": ", 1)[1].startswith("fault"))][:40]

    async def reinforce(self) -> None:
        live = self.model.live()
        if live:
            await self.call("memory/reinforce", {"ids": self.rng.sample(live, 1), "amount": 0.1})

    # ---- the faults -----------------------------------------------------------------

    async def faulted(self, step: Callable[[], Awaitable[None]], kind: str) -> None:
        """Run `step` with `kind` of fault landing a random few milliseconds into its call."""
        tier = self.rng.choice(NAMES)
        delay = self.rng.uniform(0.0, 0.04)
        pause = self.rng.uniform(TIMEOUT * 0.5, TIMEOUT * 2)
        running = asyncio.create_task(step())
        await asyncio.sleep(delay)
        self.tally.faults[kind if kind == "router_kill" else f"{kind}:{tier}"] += 1
        self.note(f"fault {kind}" + ("" if kind == "router_kill" else f" {tier}"))
        if kind == "router_kill":
            self.stack.router.kill()
            await running
            self.tally.interrupted += len(doubles(await holdings(self.stack)))
            await asyncio.to_thread(self.stack.router.restart)
            await self.fresh_client()
        elif kind == "tier_kill":
            self.stack.tiers[tier].kill()
            await running
            await asyncio.to_thread(self.stack.tiers[tier].restart)
            self.tally.interrupted += len(doubles(await holdings(self.stack)))
        else:  # the step's call times out on the stopped tier; a forget is answered once it goes on
            self.stack.tiers[tier].pause()
            try:
                await running
                forgetting = asyncio.create_task(self.forget(recent=True))
                await asyncio.sleep(pause - TIMEOUT * 0.5)
            finally:
                self.stack.tiers[tier].resume()
            await forgetting
            self.tally.interrupted += len(doubles(await holdings(self.stack)))

    async def run(self) -> None:
        kinds = ["router_kill", "tier_kill", "tier_pause"]
        plan = {step: kinds[i % 3] for i, step in enumerate(sorted(self.rng.sample(range(3, STEPS), FAULTS)))}
        for step in range(STEPS):
            self.step = step
            kind = plan.get(step)
            if kind is None:
                await self.pick(False)()
            else:
                await self.faulted(self.pick(kind == "router_kill"), kind)

    async def heal(self) -> None:
        """Every tier answering the router again, then consolidate (duplicate repair) until it repairs
        nothing and leaves no tier out."""
        deadline = time.monotonic() + 40
        while True:
            answer = await self.call("memory/consolidate", {})
            if answer is not None:
                self.tally.repaired += int(answer.get("repaired", 0))
                if "degraded" not in answer and not answer.get("repaired"):
                    return
            assert time.monotonic() < deadline, f"the federation never healed: {answer}"
            await asyncio.sleep(0.5)


async def check(work: Workload) -> None:
    model, stack = work.model, work.stack
    await asyncio.sleep(TIMEOUT)  # a write a stopped tier took in before the router gave up on it lands now
    held = await holdings(stack)
    where: dict[str, list[str]] = {}
    for name, records in held.items():
        for record in records:
            where.setdefault(record["id"], []).append(name)
    records = {r["id"]: r for rs in held.values() for r in rs}
    problems = []
    problems += [f"{i} in tiers {where[i]}" for i in sorted(doubles(held))]
    problems += [f"lost acknowledged {i} ({sorted(model.allowed[i])})" for i in sorted(model.must - set(records))]
    problems += [f"forgotten {i} is back in {where[i]}" for i in sorted(model.gone & set(records))]
    for rid, record in sorted(records.items()):
        allowed = model.allowed.get(rid, model.orphans)
        if record["content"] not in allowed:
            problems.append(f"{rid} in {where[rid]} holds {record['content']!r}, none of {sorted(allowed)}")
    keyed = Counter(r["key"] for r in records.values() if r.get("key"))
    problems += [f"key {k} has {n} records" for k, n in keyed.items() if n > 1]
    routed = (await work.router.call("memory/timeline", {"limit": 0}))["records"]
    if sorted(r["id"] for r in routed) != sorted(records):
        problems.append(f"the router shows {len(routed)} records, the tiers hold {len(records)}")
    for key in keyed:
        fetched = (await work.router.call("memory/fetch", {"key": key}))["record"]
        if fetched is None or fetched["content"] not in model.allowed.get(fetched["id"], model.orphans):
            problems.append(f"fetch {key}: {fetched}")
    summary = (f"seed {work.seed}: {dict(work.tally.faults)} faults, {work.tally.interrupted} records in two tiers "
               f"after a fault, {work.tally.repaired} repaired, calls {dict(work.tally.calls)}, failed "
               f"{dict(work.tally.failed)}, {len(records)} held ({len(model.must)} must, {len(model.gone)} forgotten)")
    print(summary)
    stories = [line for rid in sorted(model.gone & set(records))[:3] for line in [f"-- {rid}", *work.story(rid)]]
    assert not problems, summary + "\n" + "\n".join(problems[:20] + stories)


@pytest.mark.anyio
@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_crashes_between_servers_lose_nothing_revive_nothing_and_leave_one_copy(tmp_path: Path, seed: int) -> None:
    with federation(tmp_path, TIERS, mode="real") as stack:
        work = Workload(stack, seed)
        try:
            await work.run()
            for proc in stack.tiers.values():  # nothing left stopped (a pause ends in its own step)
                proc.resume()
            await work.heal()
            await check(work)
        finally:
            await work.router.close()
