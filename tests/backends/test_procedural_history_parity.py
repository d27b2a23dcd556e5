"""The procedural tier's history, restore and review gate against a model.

`test_procedural_parity.py` checks what the tier holds; this checks its extensions
(`memory/history`, `memory/restore`, `memory/approve`) with the review gate off and on. A seeded
sequence of remember/forget/reinforce/restore/history/approve/recall/timeline/fetch runs against a
tier server built as `a2m serve procedural` builds it (reusing `tests/support/parity.served`), with
restarts in the middle. Beside it a model keeps:

- `prop`: the branch writes land on (`proposed` behind the gate, else main), and `main`: what
  readers see. Behind the gate readers see only approved state; `memory/approve` makes main the
  proposed branch. Without the gate they are one model.
- every commit, numbered, and for each file the states it had (a commit that changed it: the record
  written, or None for a removal). `memory/history` must list exactly the commits that changed the
  key's (or id's) file, newest first, with the revision each wrote, the author (the owner's git
  identity), and `pending` for commits not yet approved. The commit ids it answers are learnt, and
  restores are made to them (to commits of other keys too, and to ids that are not commits).
- restore: the key's content and fields as at that commit, as a new revision above every revision
  the key had on the branch (current revision + 1 when the key is occupied), its id by
  `history._free_id` (the old id; a fresh one when another record of the owner holds it; -32005 and
  nothing written when another owner does).
- approve: only the configured approvers (-32005 for anyone else, -32602 without the gate); it
  merges every commit since the last approve, answers their count and main's new head, and twice
  in a row merges nothing.

Before each call the records each owner sees are compared with `main` (every field), and the
branch writes land on with `prop` (white-box: the store's in-memory tree, which a restart rebuilds
from git). An answer that is an error must leave both, and the branch head, unchanged.

Behind the gate a write is resolved against the proposed branch, where it lands (decision 60):
remembers here name ids and keys whose proposed state differs from main's too.

    SEEDS=1,2,3 CALLS=600 pytest tests/backends/test_procedural_history_parity.py
"""

from __future__ import annotations

import copy
import os
import random
from pathlib import Path
from typing import Any, AsyncIterator

import pytest

from a2m.filters import matches
from a2m.records import Record
from backends.procedural import files
from backends.procedural.commits import owner_actor
from backends.procedural.review import PROPOSED
from backends.serve import build
from backends.settings import TierSettings
from tests.backends import test_procedural_parity as P
from tests.support import parity
from tests.support.parity import holds_term, without_embedding

pytestmark = pytest.mark.anyio

TIER = "procedural"
OWNERS = ("alice", "bob", None)
APPROVERS = "alice, lead"  # as the command line gives it
CALLERS = ("alice", "lead", "bob", None, "ali", "lead, ops")  # who asks memory/approve
KEYS = ["k/a", "k/b", "deploy", "é/ü", "k/a.md", "a b",
        "..", "k//a", ".git/x"]  # these cannot be paths: their files are under _ids/_keys/, encoded
REFUSED_KEYS = P.KEYS_REFUSED  # past the protocol's 1,024 bytes: no record has one, nor a history
IDS = [f"r{i}" for i in range(6)]
VECTORS = [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.7, 0.7, 0.0]]
ACCESS = ("access_count", "accessed_at")
same = P.same


def record_id(rng: random.Random, owner: str | None) -> str:
    # ids are global: now and then one another owner may hold
    prefix = rng.choice(OWNERS) if rng.random() < 0.1 else owner
    return f"{prefix}-{rng.choice(IDS)}"


def new_record(rng: random.Random, owner: str | None) -> dict[str, Any]:
    rec: dict[str, Any] = {"content": P.content(rng)}
    if rng.random() < 0.8:
        rec["id"] = record_id(rng, owner)
    if rng.random() < 0.75:
        rec["key"] = rng.choice(KEYS) if rng.random() < 0.95 else rng.choice(REFUSED_KEYS)
    if rng.random() < 0.5:
        rec["created_at"] = rng.choice(P.STAMPS)
    if rng.random() < 0.3:
        rec["session"] = rng.choice(["s1", "s2"])
    if rng.random() < 0.4:
        rec["metadata"] = {k: P.meta_value(rng) for k in rng.sample(P.META_KEYS, rng.randint(1, 3))}
    if rng.random() < 0.3:
        rec["embedding"] = rng.choice(VECTORS)
    if rng.random() < 0.2:
        rec["salience"] = rng.choice([0.0, 0.3, 1.0])
    return rec


def body(record: dict[str, Any] | None) -> dict[str, Any] | None:
    """What a commit holds of a record: access statistics are not history."""
    return None if record is None else {k: v for k, v in record.items() if k not in ACCESS}


def path_of(record: dict[str, Any]) -> str:
    return files.path_for(record["owner"], record["key"], record["id"])


def author(owner: str | None) -> tuple[str, str]:
    actor = owner_actor(owner) if owner is not None else None
    return (actor.name, actor.email) if actor else ("a2m", "a2m@a2m.local")


class History:
    """The model of both branches and of every commit."""

    def __init__(self, gated: bool) -> None:
        self.gated = gated
        self.prop = P.Model()
        self.main = P.Model() if gated else self.prop
        self.commits = 0  # commits made since the repository's first
        self.approved = 0  # commits main holds (behind the gate)
        self.events: dict[str, list[tuple[int, dict[str, Any] | None, str, str, str]]] = {}  # path -> (n, rec, ...)
        self.sha: dict[str, int] = {}  # commit id learnt from memory/history -> commit number
        self.messages: dict[int, str] = {}

    def pending_ids(self) -> set[str]:
        ids = self.prop.records.keys() | self.main.records.keys()
        return {i for i in ids if body(self.prop.records.get(i)) != body(self.main.records.get(i))}

    def pending_keys(self, owner: str | None) -> set[str]:
        return {k for k in KEYS if body(self.prop.at_key(owner, k)) != body(self.main.at_key(owner, k))}

    def committed(self, before: dict[str, dict[str, Any]], owner: str | None, message: str | None = None) -> None:
        """Record the commit (if any) that took the write branch from `before` to `self.prop`."""
        after = self.prop.records
        touched: set[str] = set()
        for rid, old in before.items():
            new = after.get(rid)
            if new is None or body(new) != body(old):
                touched.add(path_of(old))
        for rid, new in after.items():
            if body(before.get(rid)) != body(new):
                touched.add(path_of(new))
        if not touched:
            return
        self.commits += 1
        by_path = {path_of(r): r for r in after.values()}
        name, email = author(owner)
        for path in touched:
            self.events.setdefault(path, []).append(
                (self.commits, copy.deepcopy(by_path.get(path)), name, email, message or ""))

    def state_at(self, path: str, n: int) -> dict[str, Any] | None:
        state = None
        for seq, rec, *_ in self.events.get(path, []):
            if seq <= n:
                state = rec
        return state

    def history_path(self, owner: str | None, params: dict[str, Any]) -> str:
        if "key" in params:
            return files.path_for(owner, params["key"], "")
        rid = params["id"]
        for model in (self.prop, self.main):
            rec = model.records.get(rid)
            if rec is not None and rec["owner"] == owner:
                return path_of(rec)
        # Held by neither branch: the file the owner's record last left (its key's, if it had one).
        left = [(n, path) for path, changes in self.events.items()
                for (_, prev, *_), (n, rec, *_) in zip([(0, None)] + changes, changes)
                if prev is not None and prev["id"] == rid and prev["owner"] == owner
                and (rec is None or rec["id"] != rid)]
        return max(left)[1] if left else files.path_for(owner, None, rid)


@pytest.fixture(params=[False, True], ids=["plain", "gated"])
async def tier(request: pytest.FixtureRequest, tmp_path: Path,
               monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[parity.Served, bool]]:
    gated = request.param
    options = {"review": True, "approvers": APPROVERS} if gated else {}
    # served() builds the tier as `a2m serve` does; only the options differ
    monkeypatch.setattr(parity, "build", lambda name, settings: build(
        name, TierSettings(name, settings.data_dir, options=options)))
    async with parity.served(TIER, tmp_path / TIER, monkeypatch, first_minute=0) as served:
        yield served, gated


def store_of(t: parity.Served) -> Any:
    assert t.server is not None
    return t.server.store


def head(t: parity.Served, gated: bool) -> str:
    repo = store_of(t).repo
    return (repo.heads[PROPOSED].commit if gated else repo.head.commit).hexsha


def check_branch(t: parity.Served, model: History, where: str) -> None:
    """White-box: the branch writes land on holds what the model says, every field."""
    store = store_of(t)
    held = {i: r.to_wire(embeddings=True, tier=TIER) for i, r in store._target().records.items()}
    want = model.prop.records
    assert held.keys() == want.keys(), f"write branch before {where}\nheld only: {held.keys() - want.keys()}\n" \
                                       f"missing: {want.keys() - held.keys()}"
    for rid in held:
        assert same(held[rid], want[rid]), f"write branch before {where}\nheld: {held[rid]}\nwant: {want[rid]}"
    count = int(store.repo.git.rev_list("--count", PROPOSED if model.gated else "HEAD"))
    assert count == model.commits + 1, f"{count - 1} commits, not {model.commits}, before {where}"
    if model.gated:
        assert int(store.repo.git.rev_list("--count", "HEAD")) == model.approved + 1, where


def restore_params(rng: random.Random, t: parity.Served, model: History, owner: str | None) -> dict[str, Any]:
    params: dict[str, Any] = {} if owner is None else {"owner": owner}
    params["key"] = rng.choice(KEYS) if rng.random() < 0.95 else rng.choice([*REFUSED_KEYS, ""])
    roll = rng.random()
    shas = list(model.sha)
    there = [(key, sha) for key in KEYS for sha in shas  # a commit the key's file was there at
             if model.state_at(files.path_for(owner, key, ""), model.sha[sha]) is not None]
    if there and roll < 0.6:
        params["key"], params["commit"] = rng.choice(there)
    elif shas and roll < 0.85:
        params["commit"] = rng.choice(shas)
        if rng.random() < 0.1:
            params["commit"] = params["commit"][:rng.choice([7, 12])]
    elif shas and roll < 0.9:  # an object that is not a commit
        params["commit"] = store_of(t).repo.commit(rng.choice(shas)).tree.hexsha
    else:
        params["commit"] = rng.choice(["0" * 40, "abc", "zzzz", "HEAD", "", 12])
    if rng.random() < 0.02:
        del params["key"]
    return params


def history_params(rng: random.Random, model: History, owner: str | None) -> dict[str, Any]:
    params: dict[str, Any] = {} if owner is None else {"owner": owner}
    roll = rng.random()
    if roll < 0.75:
        params["key"] = rng.choice(KEYS)
    elif roll < 0.93:
        ids = [i for i in {*model.prop.records, *model.main.records}] or ["x"]
        params["id"] = rng.choice(sorted(ids, key=str)) if rng.random() < 0.8 else record_id(rng, owner)
    elif roll < 0.97:
        params["key"] = rng.choice(KEYS)
        params["id"] = record_id(rng, owner)  # both: -32602
    else:
        params["key"] = rng.choice(REFUSED_KEYS)
    if rng.random() < 0.3:
        params["limit"] = rng.choice([1, 2, 3, 50, 0, 1001, True, "2"])
    return params


def operation(rng: random.Random, t: parity.Served, model: History, owner: str | None) -> tuple[str, dict[str, Any]]:
    params: dict[str, Any] = {} if owner is None else {"owner": owner}
    roll = rng.random()
    if roll < 0.30:
        records = [new_record(rng, owner) for _ in range(rng.randint(1, 3))]
        return "memory/remember", {**params, "records": records}
    if roll < 0.44:
        return "memory/restore", restore_params(rng, t, model, owner)
    if roll < 0.60:
        return "memory/history", history_params(rng, model, owner)
    if roll < (0.70 if model.gated else 0.63):
        caller = rng.choice(CALLERS)
        return "memory/approve", {} if caller is None else {"owner": caller}
    held = list(model.main.of(owner).values())
    keyed = [r["id"] for r in held if r["key"] is not None]
    if keyed and roll < 0.73:  # a key emptied: its restore may find its old id taken since
        return "memory/forget", {**params, "ids": [rng.choice(keyed)]}
    wanted = "memory/forget" if roll < 0.76 else "memory/reinforce" if roll < 0.80 else "read"
    while True:  # the other calls as the plain parity test makes them
        method, params = P.operation(rng, held, owner)
        if method == wanted or (wanted == "read" and method in ("memory/recall", "memory/timeline", "memory/fetch")):
            return method, params


async def check(t: parity.Served, model: History, method: str, params: dict[str, Any]) -> None:
    owner = params.get("owner")
    where = f"{method} {params}"
    check_branch(t, model, where)
    if method in ("memory/recall", "memory/timeline", "memory/fetch"):
        counts = {rid: (r["access_count"], r["accessed_at"]) for rid, r in model.main.records.items()}
        await P.check(t, model.main, method, params)  # what readers see: main, and nothing pending
        for rid, rec in model.main.records.items():  # a touch counts on the proposed record too
            touched = counts[rid] != (rec["access_count"], rec["accessed_at"])
            if touched and rid in model.prop.records and model.prop is not model.main:
                model.prop.records[rid] |= {k: rec[k] for k in ACCESS}
        return
    before_head = head(t, model.gated)
    visible = await t.state(owner)
    assert {r["id"] for r in visible} == set(model.main.of(owner)), f"before {where}"
    for r in visible:
        assert same(r, model.main.records[r["id"]]), f"before {where}\nheld: {r}\nwant: {model.main.records[r['id']]}"
    before = copy.deepcopy(model.prop.records)
    sent = copy.deepcopy(params)
    answer = await t.call(method, params)
    if method == "memory/remember":
        made = answer.get("ids", [])
        expect = model.prop.remember(sent, t.stamp["now"], [i for raw, i in zip(sent["records"], made)
                                                            if "id" not in raw])
        want = {"error": expect} if isinstance(expect, int) else {"ids": expect}
        assert answer == want, f"{where}: {answer}, not {want}"
        model.committed(before, owner)
    elif method == "memory/forget":
        await forget(t, model, params, answer, owner, where, before)
    elif method == "memory/reinforce":
        found = set(params["ids"]) & set(model.main.of(owner))
        assert answer == {"reinforced": len(found)}, f"{where}: {answer}"
        for rid in found:
            rec = model.prop.records.get(rid)
            if rec is not None and rec["owner"] == owner:
                rec["salience"] = min(1.0, max(0.0, rec["salience"] + float(params["amount"])))
        model.committed(before, owner)
    elif method == "memory/history":
        history(model, params, answer, owner, where)
    elif method == "memory/restore":
        restore(t, model, params, answer, owner, where, before)
    elif method == "memory/approve":
        if not model.gated:
            assert answer == {"error": -32602}, f"{where}: {answer}"
        elif owner not in {"alice", "lead"}:
            assert answer == {"error": -32005}, f"{where}: {answer}"
        else:
            want = {"approved": model.commits - model.approved, "commit": before_head}
            assert answer == want, f"{where}: {answer}, not {want}"
            model.approved = model.commits
            model.main.records = copy.deepcopy(model.prop.records)
            model.main.dims = model.prop.dims
    if "error" in answer:  # nothing half-applied: the models are unchanged, so is the branch
        assert head(t, model.gated) == before_head, f"{where} answered {answer} yet committed"


async def forget(t: parity.Served, model: History, params: dict[str, Any], answer: dict[str, Any],
                 owner: str | None, where: str, before: dict[str, dict[str, Any]]) -> None:
    """Chosen on what readers see, acted on the write branch: behind the gate a forget is a proposal,
    and a record whose proposed revision left the scope is spared."""
    assert "forgotten" in answer, f"{where}: {answer}"
    scope = t.scope(params, ids_field=True)
    shown = [r for r in model.main.of(owner).values() if matches(Record.from_wire(r), scope)]
    if params.get("query"):
        shown = [r for r in shown if holds_term(r, params["query"])]
        doomed = {r["id"] for r in shown if r["id"] in model.prop.of(owner)}
    else:
        doomed = {r["id"] for r in shown if r["id"] in model.prop.records
                  and matches(Record.from_wire(model.prop.records[r["id"]]), scope)}
    assert answer["forgotten"] == len(doomed), f"{where}: {answer}, not {len(doomed)}"
    for rid in doomed:
        del model.prop.records[rid]
    model.committed(before, owner)


def history(model: History, params: dict[str, Any], answer: dict[str, Any], owner: str | None, where: str) -> None:
    limit = params.get("limit", 100)
    if ("key" in params) == ("id" in params) or type(limit) is not int or not 1 <= limit <= 1000:
        assert answer == {"error": -32602}, f"{where}: {answer}"
        return
    path = model.history_path(owner, params)
    want = list(reversed(model.events.get(path, [])))[:limit]
    assert "revisions" in answer, f"{where}: {answer}"
    got = answer["revisions"]
    assert len(got) == len(want), f"{where}: {len(got)} revisions, not {len(want)}\n" \
        f"got:  {[g['revision'] for g in got]}\nwant: {[w[1] and w[1]['revision'] for w in want]}"
    for g, (n, rec, name, email, message) in zip(got, want):
        expect = {"revision": None if rec is None else rec["revision"], "author": name, "email": email,
                  "pending": model.gated and n > model.approved}
        assert {k: g[k] for k in expect} == expect, f"{where}: commit {n}\ngot:  {g}\nwant: {expect}"
        assert model.sha.setdefault(g["commit"], n) == n, f"{where}: {g['commit']} was commit {model.sha[g['commit']]}"
        if message:
            assert g["message"] == message, f"{where}: {g['message']!r}"
        assert isinstance(g["at"], str) and g["at"].endswith("Z"), g


def restore(t: parity.Served, model: History, params: dict[str, Any], answer: dict[str, Any], owner: str | None,
            where: str, before: dict[str, dict[str, Any]]) -> None:
    key, rev = params.get("key"), params.get("commit")
    matched = [s for s in model.sha if isinstance(rev, str) and len(rev) >= 4 and s.startswith(rev.lower())]
    if not isinstance(key, str) or not key or key in REFUSED_KEYS or len(matched) != 1:
        assert answer == {"error": -32602}, f"{where}: {answer}"
        return
    path = files.path_for(owner, key, "")
    old = model.state_at(path, model.sha[matched[0]])
    if old is None:  # not there at that commit
        assert answer == {"error": -32602}, f"{where}: {answer}"
        return
    current = model.prop.at_key(owner, key)
    highest = max((rec["revision"] if rec else 0 for _, rec, *_ in model.events.get(path, [])), default=0)
    rid = old["id"]
    if current is not None:
        rid = current["id"]
    else:
        holder = model.prop.records.get(rid) or model.main.records.get(rid)
        if holder is not None and holder["owner"] != owner:
            assert answer == {"error": -32005}, f"{where}: {answer}"
            return
        if holder is not None and holder["key"] != key:
            rid = None  # a fresh id
    assert "record" in answer, f"{where}: {answer}"
    got = answer["record"]
    if rid is None:
        rid = got["id"]
        assert rid not in before and rid not in model.main.records, f"{where}: a fresh id that is held: {rid}"
    want = old | {"id": rid, "revision": (current["revision"] if current else highest) + 1,
                  "created_at": current["created_at"] if current else old["created_at"],
                  "access_count": current["access_count"] if current else 0,
                  "accessed_at": current["accessed_at"] if current else None, "owner": owner}
    assert same(got, without_embedding(want)), f"{where}\ngot:  {got}\nwant: {without_embedding(want)}"
    if current is not None:
        del model.prop.records[current["id"]]
    model.prop.records[rid] = want
    message = f"restore {key} to {rev[:12]} (rev {want['revision']})"
    model.committed(before, owner, message)


# CI: the two gate settings x these seeds in about 15 s. Before decision 59's fix seed 4 (gated) failed, and at
# CALLS=300 seeds 2, 3 and 4. SEEDS=1,...,24 CALLS=400 pass (about 5 minutes).
@pytest.mark.parametrize("seed", [int(s) for s in os.environ.get("SEEDS", "1,2,4").split(",")])
async def test_history_restore_and_the_review_gate_answer_as_the_model(
        tier: tuple[parity.Served, bool], seed: int) -> None:
    t, gated = tier
    rng = random.Random(seed)
    calls = int(os.environ.get("CALLS", "200"))
    model = History(gated)
    method = ""
    for n in range(calls):
        # close, and a new server on the same data directory: often right after a restore, which
        # behind the gate leaves main and the proposed branch apart in what they keep outside git
        if n == calls // 2 or rng.random() < (0.25 if method == "memory/restore" else 0.03):
            await t.restart()
        owner = rng.choice(OWNERS)
        method, params = operation(rng, t, model, owner)
        await check(t, model, method, params)
        t.tick()
    await t.restart()
    check_branch(t, model, "the end")
    for owner in OWNERS:
        got = {r["id"]: r for r in await t.state(owner)}
        want = model.main.of(owner)
        assert got.keys() == want.keys() and all(same(got[i], want[i]) for i in got), owner
