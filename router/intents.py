"""Intents: a batch written tier by tier leaves a durable note of itself until it is answered.

A remember batch whose new records go to several tiers is written one tier's part at a time
(writes.py `write_order`); a part that fails has the earlier parts taken back (decision 102),
but that take-back lives in the router's memory. Killed between the parts, the router left
the parts already written, though the caller was never told the write succeeded. So, before
the first part, the router writes one INTENT record (a few, for a very large batch) to one
writable tier under the reserved owner `INTENTS`, naming every new record it is about to
write and at which revision; it forgets the intent before it answers. An intent still there
later is a batch whose router died (or whose take-back failed): `resolve` keeps the batch if
every record of it landed, else forgets the records that did, at the revision the intent
names (decision 152), and then the intent. The router keeps no state of its own: the intents
live in the tiers, and any replica resolves them once they are older than `intent_grace`
(another replica's batch may still be in flight before that). Decision 166.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections import defaultdict
from datetime import datetime, timezone
from typing import Any, Iterable, Mapping, Sequence

from a2m import errors
from a2m.errors import A2MError, invalid
from a2m.params import DEFAULT_LIMITS
from a2m.timefmt import now, parse_ts

from .config import INTENTS
from .federation import Federation, Tier
from .policy import Policy
from .scope import with_owner

log = logging.getLogger("a2m.router")

MARK = "a2m_intent"  # the content field naming the batch an intent record belongs to
ENVELOPE = 8192  # characters of an intent record besides what it lists: the owner (escaped), the batch, the time


def reserved(owner: object) -> bool:
    return owner == INTENTS


def refuse_reserved(owner: object) -> None:
    """-32005: the intents' owner is the router's own partition, never a caller's scope (no caller
    may read, write or forget a batch's intent, and none may write records there to be resolved)."""
    if reserved(owner):
        raise A2MError(errors.SCOPE_DENIED, f"owner {INTENTS!r} is reserved by the router", {"owner": owner})


def holds_intents(tier: Tier) -> bool:
    """Whether `tier` may hold intents: writable, not gated (a gated tier holds a write for review: not
    stored) and declaring `scopes`. The last also for reading them back: one without ignores the
    intents' owner, so its answer is every record it holds, of every owner (a whole tier read at
    every consolidate), and a caller's record shaped like an intent would be resolved as one, the
    records it names forgotten."""
    return tier.writable and not tier.gated and tier.has("scopes")


class Intent:
    """One batch's intent as written: the tier holding it and its record ids there."""

    def __init__(self, tier: Tier, ids: list[str]) -> None:
        self.tier = tier
        self.ids = ids


def contents(owner: str | None, records: Sequence[tuple[str, str, int]], keys: Mapping[str, int],
             max_len: int, stamp: str | None = None) -> list[str]:
    """The intent's record contents: the batch's owner, each new record as (tier, id, revision),
    each replaced key with the revision it is written at, and when. Packed by measured length into
    as many records (one batch mark, each naming how many there are) as keep each within `max_len`
    characters, the holding tier's limit: an id may take 512 characters and a key 1,024 bytes."""
    batch, stamp = uuid.uuid4().hex, stamp or now()
    room = max(ENVELOPE, max_len - ENVELOPE)  # the owner (at most 1,024 bytes) and the rest of the frame
    chunks: list[tuple[list[Any], dict[str, int]]] = [([], {})]
    used = 0
    entries: list[tuple[str, Any]] = [*(("record", list(r)) for r in records), *(("key", k) for k in keys.items())]
    for kind, entry in entries:
        cost = len(_json(entry)) + 2
        if used + cost > room and (chunks[-1][0] or chunks[-1][1]):
            chunks.append(([], {}))
            used = 0
        if kind == "record":
            chunks[-1][0].append(entry)
        else:
            chunks[-1][1][entry[0]] = entry[1]
        used += cost
    return [_json({MARK: batch, "part": k, "parts": len(chunks), "owner": owner, "created_at": stamp,
                   "records": listed, "keys": replaced}) for k, (listed, replaced) in enumerate(chunks)]


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)  # length in characters, as tiers count


class Intents:
    """Open and close a batch's intent; resolve the intents a dead router (or replica) left."""

    def __init__(self, fed: Federation, policy: Policy, default_tier: str, grace: float) -> None:
        self.fed = fed
        self.policy = policy
        self.default_tier = default_tier
        self.grace = grace
        self._resolving = asyncio.Lock()

    def place(self) -> Tier | None:
        """Where an intent is written: the default tier, else the first writable tier in router.toml's
        order, among those up, not gated (a gated tier holds a write for review: not stored) and
        declaring `scopes` (an intent names a caller's ids and keys: one without would show it to all)."""
        fit = [t for t in self.fed if t.healthy and holds_intents(t)]
        return next((t for t in fit if t.name == self.default_tier), fit[0] if fit else None)

    async def open(self, owner: str | None, records: Sequence[tuple[str, str, int]],
                   keys: Mapping[str, int]) -> Intent:
        """Write the intent; only once it is acknowledged may the batch's first part be written."""
        tier = self.place()
        if tier is None:
            if not any(holds_intents(t) for t in self.fed):  # described so: retrying will not help
                raise invalid("cannot write a batch across tiers here: no writable tier that keeps owners apart "
                              "(declares scopes) may hold its intent; nothing was written: write each tier's "
                              "records in a call of their own", field="records")
            raise A2MError(errors.INTERNAL_ERROR, "cannot write a batch across tiers: no writable tier is up to "
                           "hold its intent; nothing was written, retry when one is back")
        max_len = tier.limit("max_content_length") or DEFAULT_LIMITS["max_content_length"]
        batch = [{"content": content} for content in contents(owner, records, keys, max_len)]
        try:
            result = await tier.call("memory/remember", with_owner({"records": batch}, INTENTS))
        except A2MError as exc:  # its words stay in the log: a tier's may name its engine (server.py)
            log.warning("could not write a batch's intent to %s: %s", tier.name, exc)
            raise A2MError(errors.INTERNAL_ERROR, f"cannot write a batch across tiers: its intent could not be "
                           f"written to tier {tier.name}; nothing was written, retry",
                           {"degraded": [tier.name]}) from None
        return Intent(tier, list(result["ids"]))

    async def close(self, intent: Intent) -> bool:
        """Forget the intent (owner-scoped to the reserved owner); raises the tier's error. False: it
        was gone already, resolved by a router that took the batch for a dead one (written for
        longer than `intent_grace`), which may have forgotten parts of it."""
        result = await intent.tier.call("memory/forget", with_owner({"ids": intent.ids}, INTENTS))
        return int(result.get("forgotten") or 0) >= len(intent.ids)

    # ---- resolution -----------------------------------------------------------------

    async def resolve(self) -> dict[str, Any]:
        """Resolve every intent older than the grace in every writable tier that answers: keep a
        batch that landed whole, forget the records of one that did not. Returns counts: `kept`
        and `undone` batches, `forgotten` records, `left` intents (too young, or a tier down), and
        `owners`: owner -> records forgotten of theirs (a consolidate counts its caller's alone)."""
        async with self._resolving:
            found: dict[str, list[tuple[Tier, str, dict[str, Any]]]] = defaultdict(list)
            tally: dict[str, Any] = {"kept": 0, "undone": 0, "forgotten": 0, "left": 0, "owners": {}}
            for tier in [t for t in self.fed if holds_intents(t)]:
                try:
                    held = await self._read(tier)
                except A2MError as exc:
                    log.info("intents on %s not read (%s): resolved later", tier.name, exc)
                    tally["left"] += 1
                    continue
                for record_id, body in held:
                    found[body[MARK]].append((tier, record_id, body))
            cutoff = datetime.now(timezone.utc).timestamp() - self.grace
            for batch, parts in found.items():
                try:
                    stamp = parse_ts(parts[0][2].get("created_at"), "created_at").timestamp()
                except (A2MError, ValueError):
                    stamp = 0.0  # unreadable: as old as can be
                if stamp > cutoff:
                    tally["left"] += 1
                    continue
                try:
                    outcome = await self._resolve_one(batch, parts)
                except A2MError as exc:
                    log.warning("intent %s not resolved (%s): left for the next resolution", batch, exc)
                    tally["left"] += 1
                    continue
                if outcome is None:
                    tally["left"] += 1
                elif outcome == 0:
                    tally["kept"] += 1
                else:
                    tally["undone"] += 1
                    tally["forgotten"] += outcome
                    owner = parts[0][2].get("owner")
                    tally["owners"][owner] = tally["owners"].get(owner, 0) + outcome
            return tally

    async def _read(self, tier: Tier) -> list[tuple[str, dict[str, Any]]]:
        """(record id, parsed content) of the intents in `tier`; content that is no intent is skipped."""
        out = []
        for record in await self.policy.scan(tier, INTENTS):
            try:
                body = json.loads(record.get("content") or "")
            except ValueError:
                continue
            if isinstance(body, dict) and isinstance(body.get(MARK), str):
                out.append((record["id"], body))
        return out

    async def _resolve_one(self, batch: str, parts: list[tuple[Tier, str, dict[str, Any]]]) -> int | None:
        """Keep (0) or undo (the count forgotten) one batch, then forget its intent; None: left."""
        body = parts[0][2]
        owner = body.get("owner")
        listed = {str(r[1]): int(r[2]) for _, _, b in parts for r in b.get("records") or ()
                  if isinstance(r, list) and len(r) == 3}
        keys = {str(k): int(v) for _, _, b in parts for k, v in (b.get("keys") or {}).items()}
        async with self.policy.owner_lock(owner):  # not while this router moves the same records
            where = await self._where(owner, list(listed))
            if where is None:
                return None
            whole = len(where) == len(listed) and await self._keys_landed(owner, keys)
            if whole is None:
                return None
            forgotten = 0 if whole else await self._undo(owner, where, listed)
            if forgotten is None:
                return None
        for tier, ids in _by_tier((tier, record_id) for tier, record_id, _ in parts).items():
            await tier.call("memory/forget", with_owner({"ids": ids}, INTENTS))
        if whole:
            log.warning("resolved an intent left by a router that stopped mid-batch: its %d record(s) of owner %r "
                        "all landed and are kept (batch %s)", len(listed), owner, batch)
        else:
            log.warning("resolved an intent left by a router that stopped mid-batch: %d of its %d record(s) of "
                        "owner %r had landed and are forgotten, at the revision written (batch %s)",
                        forgotten, len(listed), owner, batch)
        return forgotten

    async def _where(self, owner: str | None, ids: list[str]) -> dict[str, list[Tier]] | None:
        """id -> the writable tiers holding each of `ids` found (a move since keeps the id; one cut off
        mid-way is in two); None when a tier did not answer (a record there may be the batch's)."""
        tiers = [t for t in self.fed if t.writable]  # a read-only tier's ids are its own (decision 162)
        answers = await asyncio.gather(*(self.policy.by_ids(t, owner, ids) for t in tiers), return_exceptions=True)
        where: dict[str, list[Tier]] = defaultdict(list)
        for tier, answer in zip(tiers, answers):
            if isinstance(answer, BaseException):
                if not isinstance(answer, A2MError):
                    raise answer
                log.info("intent resolution: tier %s did not answer (%s); left for later", tier.name, answer)
                return None
            for record in answer:
                where[record["id"]].append(tier)
        return dict(where)

    async def _keys_landed(self, owner: str | None, keys: Mapping[str, int]) -> bool | None:
        """Whether every key the batch replaced is at (or past) the revision it wrote; None: a tier
        did not answer."""
        if not keys:
            return True
        tiers = [t for t in self.fed if t.writable and t.has("keys")]
        fan = await self.fed.fan_out("memory/timeline", with_owner({"where": {"key": sorted(keys)}, "limit": 0},
                                                                    owner), tiers)
        if fan.degraded:
            return None
        at: dict[str, int] = {}
        for result in fan.results.values():
            for record in result.get("records", []):
                if record.get("key") in keys:
                    at[record["key"]] = max(at.get(record["key"], 0), int(record.get("revision") or 1))
        return all(at.get(key, 0) >= revision for key, revision in keys.items())

    async def _undo(self, owner: str | None, where: Mapping[str, list[Tier]],
                    listed: Mapping[str, int]) -> int | None:
        """Forget each landed record where it is, at the revision the intent names: one replaced
        since under its key by an acknowledged write is at a later revision, and stays."""
        calls: dict[tuple[str, int], list[str]] = defaultdict(list)
        for record_id, tiers in where.items():
            for tier in tiers:
                calls[(tier.name, listed[record_id])].append(record_id)
        forgotten = 0
        for (name, revision), ids in calls.items():
            try:
                result = await self.fed[name].call("memory/forget", with_owner(
                    {"ids": ids, "where": {"revision": revision}}, owner))
            except A2MError as exc:
                log.info("intent resolution: forget on %s failed (%s); left for later", name, exc)
                return None
            forgotten += int(result.get("forgotten") or 0)
        return forgotten


def _by_tier(pairs: Iterable[tuple[Tier, str]]) -> dict[Tier, list[str]]:
    out: dict[Tier, list[str]] = defaultdict(list)
    for tier, record_id in pairs:
        out[tier].append(record_id)
    return out
