"""The write path: remember (route, write, take back, enforce capacity), forget and reinforce.

A record goes where its key or group already lives, else where it names, else to the default
tier (decision 12, 37). A batch is all or nothing as far as the router can make it: a tier that
refuses its part has the parts written before it forgotten again, and one the router stopped
waiting for has what it was sent taken back (decision 102). Capacity is enforced where a write
landed, after it (decision 10). Every change of where an owner's records live runs under the
policy's owner lock (`Policy.owner_lock`).
"""

from __future__ import annotations

import asyncio
import logging
import re
from typing import Any, Collection, Iterable, Mapping, Sequence

from a2m import errors
from a2m.client import Unavailable
from a2m.dispatch import Context
from a2m.embedder import Embedder, try_embed_into
from a2m.errors import A2MError, invalid
from a2m.events import EventLog
from a2m.filters import parse_scope
from a2m.params import amount_param, ids_param, query_param, records_param
from a2m.records import Record, parse_write, supplied_history
from a2m.timefmt import now

from .doubts import LATE_FORGETS
from .federation import Federation, Tier
from .intents import Intent, Intents, refuse_reserved
from .policy import Policy
from .scope import SCOPE_PARAMS, VectorWidth, read_only, scope_tiers, settle_tier, tier_named, with_owner

log = logging.getLogger("a2m.router")

TAKE_BACK_PAUSE = 0.5  # before forgetting again what a tier the router stopped waiting for had not applied yet


def batch_owner(records: Sequence[Record], owner: str | None) -> str | None:
    """The owner a batch is written for: the call's, else the one its records name.

    Where a batch lands, which key it replaces, which capacity it counts against and who
    sees its `written` events all follow one owner. A call that names none (a trusted
    transport) but whose records do is that owner's write; records of several owners in
    one such batch are refused (-32602), since the router locates and writes per owner."""
    if owner is not None:
        return owner  # parse_write already refused records naming another owner
    owners = {record.owner for record in records}
    if len(owners) > 1:
        index = next(i for i, record in enumerate(records) if record.owner != records[0].owner)
        raise invalid(f"records[{index}].owner differs from records[0].owner: one batch writes one owner's "
                      "records (name owner on the call, or send one batch per owner)", field="owner", index=index)
    return owners.pop()


def in_caller_batch(exc: A2MError, indexes: list[int]) -> A2MError:
    """A tier's error about records[k] of the part of the batch it was sent, about the caller's record."""
    data = exc.data if isinstance(exc.data, dict) else None
    k = data.get("index") if data else None
    if not isinstance(k, int) or not 0 <= k < len(indexes):
        return exc
    message = re.sub(rf"\brecords\[{k}\]", f"records[{indexes[k]}]", exc.message)
    return A2MError(exc.code, message, {**data, "index": indexes[k]})


class Overtaken(A2MError):
    """A batch whose intent another router resolved while it was written (intents.py): taken back."""


class Writes:
    """remember, forget and reinforce across the federation, and `write` for the router's own writes
    (a summary)."""

    def __init__(self, fed: Federation, policy: Policy, events: EventLog, embedder: Embedder | None,
                 width: VectorWidth, limits: Mapping[str, int], default_tier: str, intents: Intents) -> None:
        self.fed = fed
        self.intents = intents
        self.policy = policy
        self.events = events
        self.embedder = embedder
        self.width = width
        self.limits = limits
        self.default_tier = default_tier
        self._late: set[asyncio.Task[None]] = set()  # forgets sent again where ids are in doubt

    async def remember(self, params: dict[str, Any], ctx: Context) -> dict[str, Any]:
        owner = ctx.owner(params)
        return {"ids": await self.write(records_param(params, self.limits), owner)}

    async def write(self, raw_records: list[Any], owner: str | None, *, tier: str | None = None) -> list[str]:
        """Validate a batch, route each record, write, then enforce capacity where it landed.

        `tier` is where records without a `tier` of their own go unless their key or group
        already lives somewhere (a record's own `tier` must then agree with that place)."""
        stamp = now()
        records = [parse_write(raw, i, owner=owner, stamp=stamp) for i, raw in enumerate(raw_records)]
        owner = batch_owner(records, owner)
        refuse_reserved(owner)  # named by the records alone, on a call that names none
        max_len = self.limits.get("max_content_length")
        targets: list[Tier] = []
        for i, record in enumerate(records):
            if max_len and len(record.content) > max_len:
                raise invalid(f"records[{i}].content exceeds max_content_length ({max_len})", index=i, max=max_len)
            # `is not None`: an empty name is a tier nobody has (-32002, as every tier server says), not "none".
            target = tier_named(self.fed, record.tier if record.tier is not None else tier or self.default_tier)
            if not target.writable:
                raise read_only(target, index=i)
            targets.append(target)
        await self.width.check([r.embedding for r in records if r.embedding is not None])
        # A key, a group or a client id is located, then written there: nothing may move between, and
        # no other write may decide the same id is new (two writes of one id at once gave it two homes).
        if any(r.key or r.group for r in records) or any(w.get("id") is not None for w in raw_records):
            async with self.policy.owner_lock(owner):
                ids, by_tier = await self._write(records, raw_records, targets, owner)
        else:
            ids, by_tier = await self._write(records, raw_records, targets, owner)
        await self._enforce_capacity(records, by_tier, owner)  # outside the owner lock: a move takes it itself
        return ids

    async def _write(self, records: list[Record], raw: list[Any], targets: list[Tier],
                     owner: str | None) -> tuple[list[str], dict[str, list[int]]]:
        """Route the batch, then write each tier's part (taken back if a later part fails); returns
        the ids in batch order and which records (by index) each tier was sent."""
        ids: list[str | None] = [None] * len(records)
        supplied = [r.id for r, w in zip(records, raw) if w.get("id") is not None]
        history = [supplied_history(w) for w in raw]
        revisions, existing = await route(self.fed, records, targets, supplied, history, owner)
        await asyncio.gather(*(t.described() for t in set(targets) if t.info is None))
        unkept(records, raw, targets, existing)
        # A client-supplied id that exists anywhere in the federation is idempotent: returned, not rewritten.
        for i, (record, w) in enumerate(zip(records, raw)):
            if w.get("id") is not None and record.id in existing:
                ids[i] = record.id
                # Told it exists: a late forget of an earlier forget must not delete it now (doubts.py).
                self.policy.doubts.settle(owner, existing[record.id], [record.id])
        by_tier: dict[str, list[int]] = {}
        for i, target in enumerate(targets):
            if ids[i] is None:
                by_tier.setdefault(target.name, []).append(i)
        written: list[tuple[Tier, list[str]]] = []
        down = [name for name in by_tier if not self.fed[name].healthy]
        order = write_order(by_tier, revisions, down)
        intent = await self._open_intent(order, records, revisions, owner)
        for name, indexes in order:
            tier = self.fed[name]
            batch = []
            for i in indexes:
                out = {k: v for k, v in raw[i].items() if k != "tier"}
                out["id"], out["created_at"] = records[i].id, records[i].created_at
                batch.append(out)
            if self.embedder is not None and tier.searched:
                missing = [b for b in batch if b.get("embedding") is None and b.get("content")]
                vectors = await try_embed_into(self.embedder, [b["content"] for b in missing], tier.dimensions, name)
                for b, vector in zip(missing, vectors or []):
                    if vector is not None:
                        b["embedding"] = vector
            try:
                result = await tier.call("memory/remember", with_owner({"records": batch}, owner))
            except A2MError as exc:
                # Cut off (timed out, connection lost after the request went): the tier may still apply its
                # part, so what the router sent it is taken back too. A refusal wrote nothing there. A key
                # replaced there is left, as in a tier that answered: its id is the earlier revision's.
                cut = isinstance(exc, Unavailable)
                sent = [b["id"] for i, b in zip(indexes, batch) if i not in revisions] if cut else []
                if cut:  # a replaced key too: landing after a forget of it, it would be back (doubts.py)
                    self.policy.doubts.note(owner, name, [b["id"] for b in batch])
                undone = await compensate(written, owner, cut_off=(tier, sent))  # all or nothing, as far as we can
                if intent is not None and undone:  # else it stays, for a resolution to finish the take-back
                    await self._close_intent(intent, None)
                raise in_caller_batch(exc, indexes) from None
            new_ids = result["ids"]
            self.policy.doubts.settle(owner, name, new_ids)  # written anew: a late forget must not delete them
            for i, new_id in zip(indexes, new_ids):
                ids[i] = new_id
            written.append((tier, [new_id for i, new_id in zip(indexes, new_ids) if i not in revisions]))
        unconfirmed = None if intent is None else await self._close_intent(intent, [i for i in ids if i is not None])
        if isinstance(unconfirmed, Overtaken):  # resolved meanwhile as a dead router's: none of it, then
            await compensate(written, owner)
            raise unconfirmed
        self.width.learn([r.embedding for r in records])
        # One event per record written, in the batch's order (not tier by tier: a batch that replaces a
        # key and writes a new record elsewhere told the new one first), appended together. An older
        # revision of an imported key is none: the tier kept its own, nothing was written.
        tier_of = {i: name for name, indexes in by_tier.items() for i in indexes if not self.fed[name].gated}
        await self.events.emit_many("written", owner, [
            {"id": ids[i], "tier": tier_of[i], "session": records[i].session, "key": records[i].key,
             "revision": revisions.get(i, records[i].revision) if records[i].key else None}
            for i in sorted(tier_of) if not (i in revisions and revisions[i] is None)])
        if unconfirmed is not None:  # written whole, but its intent stands: never answered as a success
            raise unconfirmed
        return [i for i in ids if i is not None], by_tier

    async def _open_intent(self, order: list[tuple[str, list[int]]], records: list[Record],
                           revisions: Mapping[int, int | None], owner: str | None) -> Intent | None:
        """Write the batch's intent (intents.py) when it is written in several calls and a call
        before the last writes new records: killed after that call, the router would leave them
        as half a batch. A batch written in one call, or whose earlier calls only replace keys
        (which nothing takes back), pays nothing. A gated tier's part is a proposal, not listed."""
        if len(order) < 2 or not any(i not in revisions for _, indexes in order[:-1] for i in indexes):
            return None
        new = [(name, records[i].id, records[i].revision) for name, indexes in order
               for i in indexes if i not in revisions and not self.fed[name].gated]
        keys: dict[str, int] = {}
        for i, revision in revisions.items():
            if revision is not None and records[i].key:
                keys[records[i].key] = max(keys.get(records[i].key, 0), revision)
        return await self.intents.open(owner, new, keys)

    async def _close_intent(self, intent: Intent, ids: list[str] | None) -> A2MError | None:
        """Forget a batch's intent before the caller is answered. After a batch written whole
        (`ids`), a failure is returned as the caller's answer: -32603, the write landed but could
        not be confirmed (a resolution keeps it while every record is there). After a take-back,
        a failure is logged: the call fails anyway, and a resolution forgets the intent later. An
        intent found gone after a batch written whole is `Overtaken`: the batch is taken back."""
        try:
            closed = await self.intents.close(intent)
        except A2MError as exc:
            log.error("could not forget the intent of a batch on %s (%s): left for resolution", intent.tier.name, exc)
            if ids is None:
                return None
            return A2MError(errors.INTERNAL_ERROR, f"the batch was written to every tier, but its intent record "
                            f"on tier {intent.tier.name} could not be forgotten, so the write is "
                            f"not confirmed; memory/consolidate keeps it while every record of it is there",
                            {"ids": ids, "degraded": [intent.tier.name]})
        if not closed and ids is not None:
            log.error("the intent of a batch on %s was resolved by another router while the batch was written "
                      "(for longer than intent_grace): the batch is taken back", intent.tier.name)
            return Overtaken(errors.INTERNAL_ERROR, "the batch took longer to write than intent_grace and was "
                             "taken for a dead router's: it is taken back, nothing of it is kept; retry",
                             {"degraded": [intent.tier.name]})
        return None

    async def _enforce_capacity(self, records: list[Record], by_tier: dict[str, list[int]],
                                owner: str | None) -> None:
        """Capacity is enforced as writes arrive, per (owner, session) where the tier says per_session.

        One write is one spill pass, and one `consolidated` event carries what it moved and dropped
        in all (protocol: coalesced); it names the tier and the session when it trimmed only one."""
        moved = dropped = 0
        trimmed: dict[tuple[str, str | None], None] = {}
        for name, indexes in by_tier.items():
            tier = self.fed[name]
            if tier.config.capacity is None:
                continue
            buckets = dict.fromkeys(records[i].session for i in indexes) if tier.per_session else {None: None}
            for bucket in buckets:
                try:
                    done = await self.policy.enforce(tier, owner, bucket)
                except A2MError as exc:
                    log.warning("capacity pass on %s after a write failed: %s", name, exc)
                    continue
                if done["moved"] or done["dropped"]:
                    moved += done["moved"]
                    dropped += done["dropped"]
                    trimmed[(name, bucket)] = None
        if trimmed:
            tiers = {name for name, _ in trimmed}
            sessions = {bucket for _, bucket in trimmed}
            await self.events.emit("consolidated", owner, moved=moved, promoted=0, dropped=dropped, summarized=0,
                                   tier=tiers.pop() if len(tiers) == 1 else None,
                                   session=sessions.pop() if len(sessions) == 1 else None)

    # ---- forget, reinforce ---------------------------------------------------------------

    async def forget(self, params: dict[str, Any], ctx: Context) -> dict[str, Any]:
        tiers = scope_tiers(self.fed, params)  # before the owner, as a tier server checks its `tier` first
        owner = ctx.owner(params)
        scope = parse_scope(params, owner, ids_field=True)
        query = query_param(params)
        if scope.is_empty_selector() and not query:
            raise invalid("forget needs a selector (ids, query, where, key_prefix, after or before)")
        if params.get("tier") is not None and not tiers[0].writable:
            raise read_only(tiers[0])
        down = {name: params[name] for name in (*SCOPE_PARAMS, "ids") if params.get(name) is not None}
        if query:
            down["query"] = query  # as bounded here
        asked = with_owner(down, owner)
        async with self.policy.owner_lock(owner):  # a record mid-move is forgotten in both tiers, not revived
            fan = await self.fed.fan_out("memory/forget", {}, [t for t in tiers if t.writable], skip_down=False,
                                         per_tier=lambda t: settle_tier(asked, t, keep=True), slow=True)
        self._forget_late(tiers, asked, scope.named_ids(), owner)
        count = sum(int(r.get("forgotten", 0)) for r in fan.results.values())
        told = count - sum(int(r.get("forgotten", 0)) for name, r in fan.results.items() if self.fed[name].gated)
        if told or count == 0:  # a gated tier's forget is a proposal, told at its approve
            await self.events.emit("forgotten", owner, count=told)
        if fan.degraded:
            raise A2MError(errors.INTERNAL_ERROR, f"forget incomplete: tiers {', '.join(fan.degraded)} did not answer "
                           f"({count} forgotten elsewhere; one that ran out of time may still be deleting); repeat it "
                           f"to finish, counting only what is left",
                           {"forgotten": count, "degraded": fan.degraded})
        return {"forgotten": count}

    def _forget_late(self, tiers: list[Tier], asked: dict[str, Any], named: Sequence[str] | None,
                     owner: str | None) -> None:
        """Send a forget again, after each of LATE_FORGETS, to each of `tiers` holding ids in doubt
        (a write the router stopped waiting for may land there after the forget: doubts.py)."""
        for tier in tiers:
            if not tier.writable or tier.gated or (params := settle_tier(asked, tier, keep=True)) is None:
                continue
            ids = self.policy.doubts.held(owner, tier.name, named)
            if ids:
                task = asyncio.get_running_loop().create_task(self._forget_again(tier, params, ids, owner))
                self._late.add(task)
                task.add_done_callback(self._late.discard)

    async def _forget_again(self, tier: Tier, params: dict[str, Any], ids: list[str], owner: str | None) -> None:
        waited = 0.0
        for at in LATE_FORGETS:
            await asyncio.sleep(at - waited)
            waited = at
            still = self.policy.doubts.held(owner, tier.name, ids)
            if not still:
                return
            try:
                result = await tier.call("memory/forget", {**params, "ids": still})
            except A2MError as exc:
                log.info("a late forget on %s failed (%s); asking again later", tier.name, exc)
                continue
            if result.get("forgotten"):
                log.warning("a write to %s that the router had stopped waiting for landed after a forget of its "
                            "records: %s forgotten again there (ids %s)", tier.name, result["forgotten"], still[:5])

    async def close(self) -> None:
        """Stop the late forgets still waiting (at shutdown: they must not hold it for minutes)."""
        for task in self._late:
            task.cancel()
        await asyncio.gather(*self._late, return_exceptions=True)

    async def reinforce(self, params: dict[str, Any], ctx: Context) -> dict[str, Any]:
        ids = ids_param(params)
        owner = ctx.owner(params)
        amount = amount_param(params)
        async with self.policy.owner_lock(owner):  # not between a move's read and its delete: the raise would
            # land on the copy the move deletes (decision 70)
            fan = await self.fed.fan_out("memory/reinforce", with_owner({"ids": ids, "amount": amount}, owner),
                                         [t for t in self.fed if t.writable and t.has("salience")], skip_down=False)
        total = min(sum(int(r.get("reinforced", 0)) for r in fan.results.values()), len(set(ids)))
        if fan.degraded and total < len(set(ids)):  # the rest may live there: not "unknown ids" (decision 14)
            raise A2MError(errors.INTERNAL_ERROR, f"reinforce incomplete: tiers {', '.join(fan.degraded)} did not "
                           f"answer ({total} reinforced elsewhere); the other ids may be there",
                           {"reinforced": total, "degraded": fan.degraded})
        return {"reinforced": total}


def write_order(by_tier: dict[str, list[int]], revisions: Mapping[int, int | None],
                down: Collection[str] = ()) -> list[tuple[str, list[int]]]:
    """The calls that write a batch: (tier, indexes of the records sent there), in the order made.

    A new record can be undone (forgotten) if a later call is refused, a key's replacement cannot,
    so replacements go last. With keys replaced in one tier, that tier's part goes last, whole (one
    call, atomic there). With keys replaced in several, every tier's new records go first and the
    replacements after: written tier by tier, a refusal of a new record in the second tier left the
    first tier's key replaced, under an error. Within that order, the tiers `down` (their last call
    failed) go first: the call likeliest to fail is made before any other tier is written, so its
    failure leaves nothing to take back (taken back, a record was recalled meanwhile, and told in
    its tier's events, or stayed where the take-back failed too)."""
    replacing = [name for name, indexes in by_tier.items() if any(i in revisions for i in indexes)]
    if len(replacing) <= 1:
        return sorted(by_tier.items(), key=lambda part: (part[0] in replacing, part[0] not in down))
    parts = [(name, [i for i in indexes if (i in revisions) == last])
             for last in (False, True) for name, indexes in by_tier.items()]
    return sorted(((name, indexes) for name, indexes in parts if indexes),
                  key=lambda part: (any(i in revisions for i in part[1]), part[0] not in down))


def unkept(records: Sequence[Record], raw: Sequence[Mapping[str, Any]], targets: Sequence[Tier],
           existing: Mapping[str, str]) -> None:
    """Refuse (-32602) a record routed to a tier that does not declare the capability of one of its
    fields (a tier server of another implementation; `Tier.drops`): the router declares them all,
    yet there the field is ignored (§4), silently: a key is not fetched or replaced (a second
    write makes a second record), a session not listed or closed, an owner's record is anyone's,
    a salience, embedding or uri is gone. Not -32003: the router has the capability, this tier
    does not. Checked before any tier is written; a record whose client id already exists is
    returned, not written, so it is let by."""
    for i, (record, target) in enumerate(zip(records, targets)):
        if record.id in existing:
            continue
        lost = target.drops(raw[i]) or (target.drops({"owner": record.owner}) if record.owner is not None else None)
        if lost is not None:
            field, capability = lost
            raise invalid(f"records[{i}].{field}: tier {target.name} does not declare {capability}, so it would not "
                          f"keep the {field}; write the record to a tier that does (its own `tier`) or leave the "
                          f"{field} out", index=i, field=field, tier=target.name, capability=capability)


async def route(fed: Federation, records: list[Record], targets: list[Tier], supplied: list[str],
                history: list[bool], owner: str | None) -> tuple[dict[int, int | None], dict[str, str]]:
    """Send each record whose key or group already lives in a tier to that tier (a key is unique
    per owner across the federation and is replaced where it lives; a group never splits), in
    place in `targets`. Returns index -> the revision a key replacement will have (None: the
    record carries an older revision than the key's, which the tier keeps: decision 3), and
    which of the `supplied` ids exist somewhere already, with the tier holding each (looked up in the
    same round trip).

    A record that names another tier than its key's or group's is refused, as is a batch that
    would put one key, group or id in two tiers: either would leave two homes. A keyed write
    fails while a tier that may hold its key does not answer."""
    keys = sorted({r.key for r in records if r.key})
    groups = sorted({r.group for r in records if r.group})
    writable = [t for t in fed if t.writable]
    (holders, unreached), (homes, _), (existing, _) = await asyncio.gather(
        locate(fed, "key", keys, owner, [t for t in writable if t.has("keys")]),
        locate(fed, "group", groups, owner, writable),
        locate(fed, "id", supplied, owner, list(fed)))
    if unreached:
        raise A2MError(errors.INTERNAL_ERROR, f"cannot tell where keys live: tier {', '.join(unreached)} did "
                       "not answer; nothing was written, retry when it is back", {"degraded": unreached})
    revisions: dict[int, int | None] = {}
    asked = set(supplied)
    kept = [record.id in asked and record.id in existing for record in records]
    for i, record in enumerate(records):
        if kept[i]:
            continue  # an existing id is returned, not written (§3): it cannot give anything a second home
        held = holders.get(record.key) if record.key else None
        home = homes.get(record.group) if record.group else None
        if held and home and held[0] != home[0]:
            raise invalid(f"records[{i}]: its key lives in tier {held[0]} and its group in tier {home[0]}",
                          index=i, field="group")
        place = (held or home or (None, None))[0]
        if place is None:
            continue
        if record.tier is not None and record.tier != place:
            what = f"key {record.key!r}" if held else f"group {record.group!r}"
            raise invalid(f"records[{i}]: {what} lives in tier {place}; write it without a tier to "
                          f"{'replace it' if held else 'join it'} there, or memory/promote it to {record.tier} first",
                          index=i, field="tier", tier=place)
        targets[i] = fed[place]
        if held:
            current = int(held[1].get("revision") or 1)
            if not history[i]:
                revisions[i] = current + 1
            else:  # a move or an import carries its revision: the newer one wins
                revisions[i] = record.revision if record.revision >= current else None
    # A key written again later in the batch replaces what the batch wrote there, as the tier
    # applies a batch record by record: its revision counts from the earlier record's.
    latest: dict[str, int] = {}
    for i, record in enumerate(records):
        if kept[i] or not record.key:
            continue
        if record.key in latest:
            before = latest[record.key]
            if not history[i]:
                revisions[i] = before + 1
            else:
                revisions[i] = record.revision if record.revision >= before else None
        revision = revisions.get(i, record.revision)
        if revision is not None:
            latest[record.key] = revision
        elif record.key not in latest:
            latest[record.key] = int(holders[record.key][1].get("revision") or 1)
    for field, value_of in (("key", lambda r: r.key), ("group", lambda r: r.group), ("id", lambda r: r.id)):
        placed: dict[str, str] = {}
        for i, record in enumerate(records):
            value = value_of(record)
            if value is not None and not kept[i] and placed.setdefault(value, targets[i].name) != targets[i].name:
                raise invalid(f"records[{i}]: {field} {value!r} would be written to tiers {placed[value]} and "
                              f"{targets[i].name} in one batch", index=i, field=field)
    return revisions, {record_id: tier for record_id, (tier, _) in existing.items()}


async def locate(fed: Federation, field: str, values: list[str], owner: str | None,
                 tiers: Iterable[Tier]) -> tuple[dict[str, tuple[str, dict[str, Any]]], list[str]]:
    """value -> (tier, record) for records whose `field` is one of `values` (the highest revision,
    then the deepest tier, wins), and the tiers that did not answer. No values: no call."""
    if not values:
        return {}, []
    fan = await fed.fan_out("memory/timeline", with_owner(
        {"where": {field: values}, "limit": len(values) if field == "id" else 0}, owner), tiers)
    depth = fed.depths
    found: dict[str, tuple[str, dict[str, Any]]] = {}
    for name in sorted(fan.results, key=lambda n: depth.get(n, 0)):
        for record in fan.results[name]["records"]:
            value = record.get(field)
            if value is None:
                continue
            held = found.get(value)
            if held is None or int(record.get("revision") or 1) >= int(held[1].get("revision") or 1):
                found[value] = (name, record)
    return found, fan.degraded


async def compensate(written: list[tuple[Tier, list[str]]], owner: str | None,
                     cut_off: tuple[Tier, list[str]] | None = None) -> bool:
    """Take back a batch that a tier failed: forget the new records the tiers before it wrote
    (`written`; a replaced key is not among them, forgetting its id would delete its earlier
    revision too), and, where the failing tier's call was cut off, the ids the router sent it
    (`cut_off`), since it may apply the write after the router stopped waiting. Best effort:
    what cannot be undone is logged. Returns whether everything was (False: a batch's intent stays)."""
    async def forget(tier: Tier, new_ids: list[str]) -> bool:
        try:
            await tier.call("memory/forget", with_owner({"ids": new_ids}, owner))
        except A2MError as exc:
            log.error("could not undo a partial write on %s (%s): ids %s", tier.name, exc, new_ids)
            return False
        return True

    undo = [forget(tier, new_ids) for tier, new_ids in written if new_ids]
    if cut_off is not None and cut_off[1]:
        undo.append(take_back(*cut_off, owner))
    return all(await asyncio.gather(*undo))


async def take_back(tier: Tier, sent: list[str], owner: str | None) -> bool:
    """Forget `sent` (ids the router assigned or the caller supplied, new in the federation) on a
    tier whose write call was cut off. Bounded: one forget under the tier's timeout; if the tier
    answers but has not every id yet, the write may still be queued behind the forget there, so
    one more after TAKE_BACK_PAUSE. A write that lands later still is left, logged."""
    found = 0
    for attempt in range(2):
        if attempt:
            await asyncio.sleep(TAKE_BACK_PAUSE)
        try:
            result = await tier.call("memory/forget", with_owner({"ids": sent}, owner))
        except A2MError as exc:
            log.error("could not take back a write to %s that the router stopped waiting for (%s): "
                      "ids %s may be stored there", tier.name, exc, sent)
            return False
        forgotten = result.get("forgotten")
        found += forgotten if isinstance(forgotten, int) else 0
        if found >= len(sent):
            log.warning("took back a write to %s that the router stopped waiting for: ids %s", tier.name, sent)
            return True
    log.warning("took back %d of %d records of a write to %s that the router stopped waiting for; the rest "
                "were not written, or are written later and stay: ids %s", found, len(sent), tier.name, sent)
    return False  # the rest may land later: a batch's intent stays, for a resolution to forget them
