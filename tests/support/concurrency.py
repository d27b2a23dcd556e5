"""Many clients at once against one tier (or two replicas of it on one engine), and what must hold
of what they were told, whatever the interleaving.

The sequential parity tests (`tests/backends/test_*_parity.py`) compare every call with a model of
its effect; under concurrency the order of effects is the engine's, so this checks invariants of the
acknowledged history instead. Every call gets a logical invocation and answer time (`Log.clock`: one
event loop, so a counter is a total order), and every write's content is unique, so a record read at
the end names the write that made its current version.

The workload, per owner: keyed writes of a few keys (new and replacing; each key has one session, so
a record never leaves a forget's scope by being replaced), writes of a few client ids (idempotent),
move/import writes (fresh id, a revision, an access count) racing those keys, batches of good records,
batches with a bad record (refused whole), forgets by id, by key prefix and by session, recalls that
touch (by id, and by query) and ones that do not, reinforces, fetches. Invariants (`check`):

1. one record per (owner, key), also in every timeline read while writes run; no id twice; `fetch`
   shows the key's record; describe's count and session/list's counts are the timeline's;
2. every record's content is an acknowledged write's; nothing of a refused batch is ever read; a
   client id keeps its first write's content unless a forget came between;
3. a key's record is not older than an acknowledged plain write of it invoked after its write
   answered (acknowledged writes are readable until replaced or forgotten); a key with no record
   was forgotten after its last write was invoked;
4. an acknowledged forget is not undone: no record whose current version was written before a
   forget covering it began survives, nor a server-assigned id made before it (a keyed replace
   resolved before the forget must not write the forgotten id back); no read that begins after a
   forget of an id answered returns that id;
5. revisions never repeat within one id across acknowledged plain writes (the `written` events);
6. a record's `access_count` is the number of touching recalls that returned its id (plus what a
   move carried), each of those recalls showed a count of its own (1, 2, ... n), and its salience is
   0.5 + 0.01 per answered reinforce, for every id no forget could have deleted and recreated meanwhile;
7. a move that answered another id wrote nothing; an id two owners wrote at once is one owner's.
"""

from __future__ import annotations

import asyncio
import math
import random
import uuid
from dataclasses import dataclass, field
from typing import Any, Sequence

from a2m.events import EventLog
from backends.surface import TierServer

from .races import call

KEYS = ["a/0", "a/1", "b/0", "b/1", "c/0", "c/1"]
SESSIONS = ["s0", "s1", "s2"]
PREFIXES = ["a/", "b/", "c/0", "a/1"]
CIDS = [f"cid-{i}" for i in range(4)]
WORDS = ["cat", "sofa", "tea", "rocket", "milan", "green"]
MOVE_STAMP = "2026-01-01T00:00:00.000Z"
AMOUNT = 0.01


def session_of(name: str) -> str:
    """Each key and client id lives in one session for good: a replace never moves it out of a scope."""
    return SESSIONS[sum(map(ord, name)) % len(SESSIONS)]


@dataclass
class Op:
    kind: str
    client: int
    server: int
    owner: str
    params: dict[str, Any]
    inv: int
    ack: int = -1
    result: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return self.result is not None and "error" not in self.result


@dataclass
class Writes:
    """One record of an acknowledged (or refused) write, by its unique content."""
    op: Op
    index: int
    record: dict[str, Any]

    @property
    def content(self) -> str:
        return self.record["content"]


@dataclass
class Log:
    run: str
    owners: list[str]
    ops: list[Op] = field(default_factory=list)
    clock: int = 0
    written_events: list[dict[str, Any]] = field(default_factory=list)
    cursors: list[dict[str | None, str]] = field(default_factory=list)

    def tick(self) -> int:
        self.clock += 1
        return self.clock


class Workload:
    def __init__(self, servers: Sequence[TierServer], seed: int, *, clients: int, calls: int,
                 moves: bool = True) -> None:
        self.servers = list(servers)
        self.seed = seed
        self.clients = clients
        self.calls = calls
        self.moves = moves
        run = uuid.uuid4().hex[:6]
        self.log = Log(run=run, owners=[f"ca-{run}", f"cb-{run}"])
        self.holder = f"holder-{run}"
        self.held_id = f"held-{run}"
        self.shared = [f"x-{run}-{i}" for i in range(3)]  # ids both owners write at once
        self.counter = 0
        self.known: dict[str, list[str]] = {o: [] for o in self.log.owners}  # server-assigned ids seen

    def content(self, rng: random.Random) -> str:
        self.counter += 1
        return f"w{self.counter} {rng.choice(WORDS)}"

    async def prepare(self) -> None:
        for server in self.servers:
            server.events = EventLog(capacity=1_000_000)
        self.log.cursors = []
        for server in self.servers:
            heads: dict[str | None, str] = {}
            for owner in self.log.owners:
                heads[owner] = (await call(server, "memory/events", {"owner": owner}))["cursor"]
            self.log.cursors.append(heads)
        reply = await call(self.servers[0], "memory/remember", {"owner": self.holder, "records": [
            {"id": self.held_id, "content": "held by another owner"}]})
        assert "ids" in reply, reply

    async def run(self) -> Log:
        await self.prepare()
        await asyncio.gather(*(self.client(i) for i in range(self.clients)))
        for index, server in enumerate(self.servers):
            for owner in self.log.owners:
                cursor = self.log.cursors[index][owner]
                while True:
                    page = await call(server, "memory/events", {"owner": owner, "cursor": cursor, "limit": 0,
                                                                 "kinds": ["written"]})
                    assert "events" in page and not page.get("reset"), page
                    self.log.written_events.extend({**e, "owner": owner} for e in page["events"])
                    cursor = page["cursor"]
                    if not page.get("more"):
                        break
        return self.log

    async def client(self, n: int) -> None:
        rng = random.Random(f"{self.seed}/{n}")
        for _ in range(self.calls):
            owner = rng.choice(self.log.owners)
            index = rng.randrange(len(self.servers))
            method, params, kind = self.pick(rng, owner)
            op = Op(kind, n, index, owner, params, self.log.tick())
            self.log.ops.append(op)
            op.result = await call(self.servers[index], method, params)
            op.ack = self.log.tick()
            if kind == "write_key" and op.ok:
                self.known[owner].extend(op.result["ids"])
            if rng.random() < 0.3:
                await asyncio.sleep(0)

    def keyed(self, rng: random.Random, key: str | None = None) -> dict[str, Any]:
        key = key or rng.choice(KEYS)
        return {"key": key, "content": self.content(rng), "session": session_of(key)}

    def pick(self, rng: random.Random, owner: str) -> tuple[str, dict[str, Any], str]:
        roll = rng.random()
        base: dict[str, Any] = {"owner": owner}
        if roll < 0.25:
            return "memory/remember", {**base, "records": [self.keyed(rng)]}, "write_key"
        if roll < 0.32:
            cid = rng.choice(CIDS)
            return "memory/remember", {**base, "records": [
                {"id": f"{owner}-{cid}", "content": self.content(rng), "session": session_of(cid)}]}, "write_cid"
        if roll < 0.38 and self.moves:
            key = rng.choice(KEYS)
            return "memory/remember", {**base, "records": [{
                **self.keyed(rng, key), "id": f"m-{self.log.run}-{rng.getrandbits(48):012x}",
                "revision": rng.randint(1, 6), "access_count": 7, "accessed_at": MOVE_STAMP,
                "created_at": MOVE_STAMP}]}, "move"
        if roll < 0.43:
            keys = rng.sample(KEYS, 2)
            return "memory/remember", {**base, "records": [self.keyed(rng, keys[0]), self.keyed(rng, keys[1]),
                                                            {"content": self.content(rng), "session": "s0"}]}, "batch"
        if roll < 0.48:
            bad: dict[str, Any] = rng.choice([
                {"content": "nul \x00 inside"},
                {"id": self.held_id, "content": self.content(rng)},
                {"content": self.content(rng), "metadata": {"deep": _deep(40)}},
            ])
            records = [self.keyed(rng), {"content": self.content(rng), "session": "s1"}]
            records.insert(rng.randrange(3), bad)
            return "memory/remember", {**base, "records": records}, "bad_batch"
        if roll < 0.52:
            # both owners write one of the shared ids (with a key of their own) at once, now and then
            record = {**self.keyed(rng), "id": rng.choice(self.shared)}
            return "memory/remember", {**base, "records": [self.keyed(rng), record]}, "shared_batch"
        if roll < 0.58:
            known = self.known[owner]
            if known and rng.random() < 0.8:
                return "memory/forget", {**base, "ids": [rng.choice(known[-12:])]}, "forget_id"
            return "memory/forget", {**base, "ids": [f"{owner}-{rng.choice(CIDS)}"]}, "forget_cid"
        if roll < 0.61:
            return "memory/forget", {**base, "key_prefix": rng.choice(PREFIXES)}, "forget_prefix"
        if roll < 0.63:
            return "memory/forget", {**base, "where": {"session": rng.choice(SESSIONS)}}, "forget_session"
        if roll < 0.75:
            known = self.known[owner]
            ids = rng.sample(known[-10:], min(len(known[-10:]), 3)) + [f"{owner}-{rng.choice(CIDS)}"]
            touch = rng.random() < 0.85
            return "memory/recall", {**base, "where": {"id": ids}, "limit": 10,
                                     **({} if touch else {"touch": False})}, "recall_ids"
        if roll < 0.82:
            params = {**base, "query": rng.choice(WORDS), "limit": 5}
            if rng.random() < 0.5:
                params["key_prefix"] = rng.choice(PREFIXES)
            return "memory/recall", params, "recall_query"
        if roll < 0.9:
            known = self.known[owner]
            target = rng.choice(known[-10:]) if known and rng.random() < 0.7 else f"{owner}-{rng.choice(CIDS)}"
            return "memory/reinforce", {**base, "ids": [target], "amount": AMOUNT}, "reinforce"
        if roll < 0.95:
            return "memory/fetch", {**base, "key": rng.choice(KEYS)}, "fetch"
        return "memory/timeline", {**base, "limit": 0}, "timeline"


def _deep(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = {"d": value}
    return value


# ---- the verdict ---------------------------------------------------------------------------------------


def retry_later(op: Op) -> bool:
    """A write refused because other writers kept changing its keys under every attempt (decision 42):
    an answer the protocol allows (-32603, nothing written) and a client retries; checked like any
    refused write (nothing of it is ever read)."""
    return bool(op.result and op.result.get("error") == -32603 and "kept changing" in op.result.get("message", ""))


def _read_records(op: Op) -> list[dict[str, Any]]:
    if not op.ok:
        return []
    assert op.result is not None
    if "records" in op.result:
        return op.result["records"]
    if "record" in op.result:
        return [op.result["record"]] if op.result["record"] else []
    return []


def _covers(forget: Op, owner: str, record_id: str, key: str | None, session: str | None) -> bool:
    """Whether the forget's selector takes a record with these fields (they never change for an id)."""
    if forget.owner != owner:
        return False
    p = forget.params
    if "ids" in p:
        return record_id in p["ids"]
    if "key_prefix" in p:
        return key is not None and key.startswith(p["key_prefix"])
    return session == p["where"]["session"]


async def check(servers: Sequence[TierServer], work: Workload) -> list[str]:
    """Every violated invariant, as lines naming the calls involved (empty when all hold)."""
    log = work.log
    bad: list[str] = []
    writes: dict[str, Writes] = {}  # content -> the write that carried it
    for op in log.ops:
        if op.params.get("records"):
            for i, record in enumerate(op.params["records"]):
                writes[record["content"]] = Writes(op, i, record)
    forgets = [op for op in log.ops if op.kind.startswith("forget")]
    acked_forgets = [op for op in forgets if op.ok]
    plain_keyed: dict[tuple[str, str], list[Writes]] = {}
    for w in writes.values():
        if w.op.ok and w.record.get("key") and "id" not in w.record:  # a client id may win over the key
            plain_keyed.setdefault((w.op.owner, w.record["key"]), []).append(w)
    refused = {c for c, w in writes.items() if w.op.kind == "bad_batch"}
    # ids a client may write again after a forget (a move's id is written by that move alone)
    supplied = {w.record["id"] for w in writes.values() if "id" in w.record and "revision" not in w.record}

    for op in log.ops:
        if op.kind == "bad_batch" and op.ok:
            bad.append(f"a batch with a bad record was accepted: {op.params['records']} -> {op.result}")
        if op.kind in ("write_key", "write_cid", "move", "batch") and not op.ok and not retry_later(op):
            bad.append(f"an ordinary write failed: {op.kind} {op.params['records']} -> {op.result}")
        if op.kind.startswith(("recall", "reinforce", "fetch", "timeline", "forget")) and not op.ok:
            bad.append(f"{op.kind} failed: {op.params} -> {op.result}")
        if op.kind == "shared_batch" and not op.ok and not retry_later(op) and op.result \
                and op.result.get("error") != -32005:  # its own key may keep changing too (decision 42)
            bad.append(f"a batch with a shared id failed other than -32005: {op.result}")
        if op.kind == "timeline" and op.ok:  # a read sees whole writes: never two records on one key
            shown = [r["key"] for r in _read_records(op) if r["key"] is not None]
            if len(shown) != len(set(shown)):
                bad.append(f"timeline at {op.inv}-{op.ack} shows a key twice: "
                           f"{sorted(k for k in shown if shown.count(k) > 1)}")
        for record in _read_records(op):
            if record["content"] in refused or (record["content"] in writes
                                                 and not writes[record["content"]].op.ok):
                bad.append(f"{op.kind} at {op.inv} read a record of a refused batch: {record['content']}")
            # 4: a read that begins after a forget of a server-assigned id answered never sees it
            for f in acked_forgets:
                if f.kind == "forget_id" and f.owner == op.owner and record["id"] in f.params["ids"] \
                        and f.ack < op.inv and record["id"] not in supplied:
                    bad.append(f"{op.kind} at {op.inv} returned {record['id']} (rev {record['revision']}, "
                               f"{record['content']!r}), forgotten by the forget answered at {f.ack}")

    touches: dict[tuple[str, str], list[int]] = {}  # the access_count each touching recall showed
    for op in log.ops:
        if op.kind.startswith("recall") and op.ok and op.params.get("touch", True) is not False:
            for record in _read_records(op):
                touches.setdefault((op.owner, record["id"]), []).append(record["access_count"])
    reinforced: dict[tuple[str, str], int] = {}
    for op in log.ops:
        if op.kind == "reinforce" and op.ok and op.result and op.result["reinforced"] == 1:
            reinforced[(op.owner, op.params["ids"][0])] = reinforced.get((op.owner, op.params["ids"][0]), 0) + 1

    # 7: an id both owners wrote is one owner's
    holders: dict[str, list[str]] = {}
    for index, server in enumerate(servers):
        for owner in log.owners:
            timeline = await call(server, "memory/timeline", {"owner": owner, "limit": 0})
            assert "records" in timeline, timeline
            records = timeline["records"]
            if index == 0:
                for record in records:
                    holders.setdefault(record["id"], []).append(owner)
            bad.extend(await _check_owner(server, index, owner, records, work, writes, plain_keyed, acked_forgets,
                                          forgets, touches, reinforced))
    for record_id, owners in holders.items():
        if len(owners) > 1:
            bad.append(f"id {record_id} is held by {owners}")

    # 5: revisions of one id never repeat across acknowledged plain writes
    plain_ids: dict[tuple[str, str], list[int]] = {}
    move_ids = {w.record["id"] for w in writes.values() if "revision" in w.record}
    for event in log.written_events:
        if event.get("key") is None:
            continue
        plain_ids.setdefault((event["owner"], event["id"]), []).append(event["revision"])
    for (owner, record_id), revisions in plain_ids.items():
        if record_id in supplied and record_id not in move_ids:
            continue  # a client id may be forgotten and written anew, from revision 1 again
        counted = sorted(revisions)
        if record_id in move_ids:  # the move's own write is its revision; the plain ones after it are its own
            counted = counted[1:] if counted else counted
        dupes = sorted({r for r in counted if counted.count(r) > 1})
        if dupes:
            bad.append(f"{owner}: id {record_id} written with revision(s) {dupes} more than once: {sorted(revisions)}")
    return bad


async def _check_owner(server: TierServer, index: int, owner: str, records: list[dict[str, Any]], work: Workload,
                       writes: dict[str, Writes], plain_keyed: dict[tuple[str, str], list[Writes]],
                       acked_forgets: list[Op], forgets: list[Op], touches: dict[tuple[str, str], int],
                       reinforced: dict[tuple[str, str], int]) -> list[str]:
    bad: list[str] = []
    where = f"server {index}, {owner}"
    ids = [r["id"] for r in records]
    if len(ids) != len(set(ids)):
        bad.append(f"{where}: an id twice in the timeline: {sorted(i for i in ids if ids.count(i) > 1)}")
    by_key: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        if record["key"] is not None:
            by_key.setdefault(record["key"], []).append(record)
    for key, held in by_key.items():
        if len(held) > 1:
            bad.append(f"{where}: key {key} held by {[(r['id'], r['revision'], r['content']) for r in held]}")
    for key in {*by_key, *(k for (o, k) in plain_keyed if o == owner)}:
        fetched = (await call(server, "memory/fetch", {"owner": owner, "key": key}))["record"]
        expected = by_key.get(key, [None])[-1]
        if (fetched and fetched["id"]) != (expected and expected["id"]):
            bad.append(f"{where}: fetch {key} gives {fetched and fetched['id']}, "
                       f"the timeline {expected and expected['id']}")
    described = await call(server, "memory/describe", {"owner": owner})
    if described["tiers"][0]["count"] != len(records):
        bad.append(f"{where}: describe counts {described['tiers'][0]['count']}, the timeline holds {len(records)}")
    if "sessions" in server.capabilities:
        listed = await call(server, "memory/session/list", {"owner": owner})
        sessions = {s["session"]: s["records"] for s in listed["sessions"]}
        counted: dict[str, int] = {}
        for record in records:
            if record["session"] is not None:
                counted[record["session"]] = counted.get(record["session"], 0) + 1
        if sessions != counted:
            bad.append(f"{where}: session/list says {sessions}, the timeline {counted}")

    supplied = {w.record["id"] for w in writes.values() if "id" in w.record}
    assigned = {i for w in writes.values() if w.op.ok and w.op.owner == owner for i in w.op.result["ids"]} - supplied
    ignored_moves = {w.record["id"] for w in writes.values() if w.op.kind == "move" and w.op.ok
                     and w.op.result["ids"] != [w.record["id"]]}
    cid_writes: dict[str, list[Writes]] = {}
    for w in writes.values():
        if w.op.kind == "write_cid" and w.op.ok and w.op.owner == owner:
            cid_writes.setdefault(w.record["id"], []).append(w)
    for record in records:
        w = writes.get(record["content"])
        if w is None or w.op.owner != owner:
            if record["content"] != "held by another owner":
                bad.append(f"{where}: {record['id']} holds {record['content']!r}, which no write of this owner carried")
            continue
        if not w.op.ok:
            bad.append(f"{where}: {record['id']} holds {record['content']!r} of a refused write ({w.op.kind}: "
                       f"{w.op.result})")
            continue
        key = record["key"]
        if record["id"] in ignored_moves:
            bad.append(f"{where}: {record['id']} exists, though its move answered another id")
        # an id's first write is kept: a later write of it is idempotent unless a forget came between
        if record["id"] in cid_writes:
            for x in cid_writes[record["id"]]:
                if x.op.ack < w.op.inv and not any(
                        _covers(f, owner, record["id"], key, record["session"]) and f.ack > x.op.inv
                        and f.inv < w.op.ack for f in forgets):
                    bad.append(f"{where}: {record['id']} holds {record['content']!r} ({w.op.inv}-{w.op.ack}), "
                               f"though {x.content!r} was written before it ({x.op.inv}-{x.op.ack})")
        # 3: no acknowledged plain write of this key began after the one shown answered
        if key is not None:
            later = [x for x in plain_keyed.get((owner, key), []) if x.op.inv > w.op.ack]
            if later:
                x = later[0]
                bad.append(f"{where}: key {key} shows {record['content']!r} (answered at {w.op.ack}) though "
                           f"{x.content!r} was written after it ({x.op.inv}-{x.op.ack})")
        # 4: no forget covering this record began after its current version was written...
        for f in acked_forgets:
            if _covers(f, owner, record["id"], key, record["session"]) and f.inv > w.op.ack:
                bad.append(f"{where}: {record['id']} ({key}, {record['content']!r}, written {w.op.inv}-{w.op.ack}) "
                           f"survives {f.kind} {f.params} ({f.inv}-{f.ack}, answered {f.result})")
        # ...nor after the id was first made, for an id the server assigned (nothing writes it again)
        if record["id"] in assigned:
            made = min(x.op.ack for x in writes.values() if x.op.ok and x.op.owner == owner
                       and x.op.result and record["id"] in x.op.result["ids"])
            for f in acked_forgets:
                if _covers(f, owner, record["id"], key, record["session"]) and f.inv > made:
                    bad.append(f"{where}: {record['id']} ({key}, made by {made}) was written back after "
                               f"{f.kind} {f.params} ({f.inv}-{f.ack}, answered {f.result}): now rev "
                               f"{record['revision']} {record['content']!r}")
        # 6: every touch and reinforce counted once, for ids no forget may have deleted and recreated
        recreatable = any(_covers(f, owner, record["id"], key, record["session"]) for f in forgets) \
            and record["id"] not in assigned
        if not recreatable:
            carried = 7 if w.record.get("revision") is not None and w.record.get("id") == record["id"] else 0
            moved = any(x.record.get("id") == record["id"] and "revision" in x.record for x in writes.values())
            if moved and not carried:
                carried = 7
            shown = sorted(touches.get((owner, record["id"]), []))
            expected = carried + len(shown)
            if record["access_count"] != expected:
                bad.append(f"{where}: {record['id']} ({key}) access_count {record['access_count']}, "
                           f"{expected} touches answered")
            elif shown != list(range(carried + 1, expected + 1)):  # each recall shows the count it made
                bad.append(f"{where}: {record['id']} ({key}) recalls showed access counts {shown}")
            salience = 0.5 + AMOUNT * reinforced.get((owner, record["id"]), 0)
            if not math.isclose(record["salience"], min(1.0, salience), abs_tol=1e-9):
                bad.append(f"{where}: {record['id']} ({key}) salience {record['salience']}, expected {salience}")
    # 3: a key with no record was forgotten after its last acknowledged write began
    for (o, key), ws in plain_keyed.items():
        if o != owner or key in by_key:
            continue
        last = max(ws, key=lambda x: x.op.inv)
        if not any(f.owner == owner and f.ack > last.op.inv and f.kind != "forget_cid" for f in acked_forgets
                   if ("key_prefix" in f.params and key.startswith(f.params["key_prefix"]))
                   or ("where" in f.params and f.params["where"]["session"] == session_of(key))
                   or "ids" in f.params):
            bad.append(f"{where}: key {key} is gone, but no forget answered after its last write began "
                       f"({last.content!r}, {last.op.inv}-{last.op.ack})")
    return bad

