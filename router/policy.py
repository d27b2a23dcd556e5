"""Capacity, spill, promotion, session flush and duplicate repair: the policy only the router can run.

Every move between tiers is **write (original id, full history) -> verify
(read back by id in the destination) -> delete from the source**. The write is
idempotent (a client-supplied id that exists is kept as it is), so a move that
was interrupted after its write and is run again, or found by a later
consolidate, converges on one copy in the destination. A failure at any step
leaves the record in its source: a move can duplicate, never lose.

Groups move whole: the unit of every move is a group (a record without a group
is a unit of one), gathered from every session of the source tier, and a batch
is cut only between units. A unit the destination refuses (a record it cannot
store, an id another owner holds there) stays behind alone; the rest move.

A move reads its records by id under the owner's lock and holds it until it
has deleted them: every move, duplicate repair, forget and write that carries
a key, a group or a client id takes that lock, so none lands inside another
(two moves of one record in opposite directions, or a move and a repair, each
deleting the other's copy, lost it; a key replaced or a group joined mid-move
was deleted or split; a client id looked up mid-move, or by two writes at once,
seemed new and was written a second time elsewhere). Only what the destination
kept under the record's own id counts as verified; a destination that kept a
different record for the key (a newer revision from elsewhere) leaves the
source record where it is.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from weakref import WeakValueDictionary
from typing import Any, AsyncIterator, Iterable, Sequence

import orjson

from a2m.client import Unavailable
from a2m.embedder import Embedder, try_embed_into
from a2m.errors import A2MError, invalid
from a2m.filters import test_matches
from a2m.paging import CrowdedMillisecond, TiersDown, pages_backwards

from .doubts import Doubts
from .federation import Federation, Tier
from .locks import LockFailed, OwnerLock, SharedLocks
from .replies import Malformed
from .scope import with_owner

log = logging.getLogger("a2m.router.policy")
Refusals = list[tuple[list[str], A2MError]]  # units a destination refused: their ids and its answer

MOVE_DROP = ("tier", "score")
# What a record's recalls left on it, kept by its tier's `salience`: a move may let them go (`_kept_whole`).
RECALLS = frozenset({"access_count", "accessed_at"})
MOVE_BYTES = 16 * 1024 * 1024  # JSON per move call: well under a tier's body limit (a2m.http.TIER_MAX_BODY)
MOVE_SLOTS = 256  # owners hashed into this many move counters: bounded memory; a collision costs a read one retry
# Record ids queued for promotion, all owners together (`Policy._queue`): an owner that never
# consolidates nor closes a session (an agent that went away) held its queue for the router's life.
MAX_PENDING = 65_536


def move_form(record: dict[str, Any]) -> dict[str, Any]:
    """A tier's wire record as a write of the move/import extension: everything but where it lived."""
    out = {k: v for k, v in record.items() if k not in MOVE_DROP and v is not None}
    out.setdefault("metadata", {})
    return out


def units(records: Sequence[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Records grouped into the units that move together, in first-seen order."""
    out: list[list[dict[str, Any]]] = []
    by_group: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        group = record.get("group")
        if group is None:
            out.append([record])
        elif group in by_group:
            by_group[group].append(record)
        else:
            by_group[group] = [record]
            out.append(by_group[group])
    return out


def batches(unit_list: list[list[dict[str, Any]]], size: int,
            budget: int = MOVE_BYTES) -> list[list[list[dict[str, Any]]]]:
    """Units packed in order into batches of at most `size` records and about `budget` bytes of JSON,
    cut only between units (a unit past either is a batch of its own, written in several calls).

    The bytes matter as much as the count: 500 tool outputs near `max_content_length` are hundreds of
    megabytes, past any tier's body limit, and a refused batch is placed again one unit at a time."""
    out: list[list[list[dict[str, Any]]]] = []
    filled, weight = size, budget
    for unit in unit_list:
        heavy = sum(len(orjson.dumps(r)) for r in unit)
        if filled + len(unit) > size or (weight + heavy > budget and filled):
            out.append([])
            filled = weight = 0
        out[-1].append(unit)
        filled += len(unit)
        weight += heavy
    return out


def weakest_first(unit_list: list[list[dict[str, Any]]]) -> list[list[dict[str, Any]]]:
    """Oldest first (a unit is as young as its newest record); salience, then recall count break ties."""
    return sorted(unit_list, key=lambda u: (max(r["created_at"] for r in u), max(r.get("salience", 0.5) for r in u),
                                            max(r.get("access_count", 0) for r in u)))


def holds(there: dict[str, Any] | None, write: dict[str, Any]) -> bool:
    """Whether `there`, the destination's record under `write`'s id, holds what a move wrote: its
    content, or a newer revision of the same key (the destination kept its own: decision 3).

    The second is the copy an interrupted move leaves in the source once its key has been replaced
    where the move had written it (a keyed write goes to the deepest of two equal revisions): the
    source's is then an older revision of the very record the destination holds. Counted as not
    held, it stayed in the source for good, a second copy with stale content that every
    consolidate's repair and every spill tried and kept again."""
    if there is None:
        return False
    if there.get("content") == write.get("content"):
        return True
    key = write.get("key")
    return key is not None and there.get("key") == key and \
        int(there.get("revision") or 1) > int(write.get("revision") or 1)


def _limit(tier: Tier, name: str, default: int) -> int:
    value = tier.limit(name)
    return min(default, value) if value else default


def _within(record: dict[str, Any], where: dict[str, Any]) -> bool:
    """Whether a tier's record matches the router's own `where` (session, group or id): a tier that
    ignored the filter would otherwise have a flush or a group move carry away what it was not after."""
    return all(test_matches(name in record, record.get(name), value) for name, value in where.items()
               if name in ("session", "group", "id"))


class Policy:
    def __init__(self, federation: Federation, *, embedder: Embedder | None = None,
                 emit: Any = None, shared_locks: SharedLocks | None = None) -> None:
        self.fed = federation
        self.shared_locks = shared_locks  # the owner locks of every router replica (locks.py), where configured
        self.embedder = embedder
        self.emit = emit  # async (kind, owner, **fields) -> None: the router's event log
        # Weak: a lock lives while a holder or a waiter refers to it, so the maps hold only the
        # sessions and owners being written now, not every one the router has seen.
        self._locks: WeakValueDictionary[tuple[Any, ...], asyncio.Lock] = WeakValueDictionary()
        self._owner_locks: WeakValueDictionary[str | None, OwnerLock] = WeakValueDictionary()
        # (owner, tier) -> ids that earned promotion, least recently queued first (`_queue`)
        self.pending: dict[tuple[str | None, str], set[str]] = {}
        self._pending_size = 0  # ids in `pending`, all entries together
        self._recalls: dict[tuple[str | None, str], Counter[str]] = {}  # recalls not yet counted in the tiers
        self._flushing = False
        self._buffered = 0  # recalls buffered since start; every one up to `_counted` is counted in its tier
        self._counted = 0
        self._progress = asyncio.Event()  # set (and replaced) each time `_counted` moves or a flush stops
        self.observe_move: Any = None  # (reason, source, dest, count) -> None: the router's metrics
        self.observe_drop: Any = None  # (tier, count) -> None: records deleted by retention = "drop"
        # Source deletes begun by moves, per owner slot (`moves_seen`).
        self._deletes = [0] * MOVE_SLOTS
        self._gated_told: set[tuple[str, str]] = set()  # (source, dest) pairs whose skipped moves were logged
        self._unkept_told: set[tuple[str, str, str]] = set()  # (source, dest, field) moves skipped (`_kept_whole`)
        self.doubts = Doubts()  # ids a write the router stopped waiting for may still land (doubts.py)

    def lock(self, *key: Any) -> asyncio.Lock:
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = asyncio.Lock()
        return lock

    def owner_lock(self, owner: str | None) -> OwnerLock:
        """Where an owner's records live changes under this lock only: moves (read, write, verify,
        delete), forgets, and writes that carry a key, a group or a client id (locate, then write
        there). Taken after a session's lock, never before; not reentrant, so a holder never calls
        `move`. Every router replica's, where `lock_url` is set (locks.py)."""
        lock = self._owner_locks.get(owner)
        if lock is None:
            lock = self._owner_locks[owner] = OwnerLock(owner, self.shared_locks)
        return lock

    def moves_seen(self, owner: str | None) -> int:
        """How many source deletes moves of `owner`'s records have begun (shared with the owners
        hashed to the same slot). A read that asks several tiers at once can miss a moving record
        only when the move's delete was sent while the read was out: it asked the destination
        before the write (which precedes the delete), and the source after the delete. So a read
        that finds this number unchanged across its fan-out missed nothing, at the cost of two
        list lookups; one that finds it changed asks again (`reads.settled`)."""
        return self._deletes[hash(owner) % MOVE_SLOTS]

    def _deleting(self, owner: str | None) -> None:
        """Count a move's source delete before it is sent (`moves_seen`): counted after, a read
        answered between the delete and its reply would not see it."""
        self._deletes[hash(owner) % MOVE_SLOTS] += 1

    # ---- reading from a tier -------------------------------------------------

    async def by_ids(self, tier: Tier, owner: str | None, ids: Sequence[str], *,
                     embeddings: bool = False) -> list[dict[str, Any]]:
        """The records with these ids in `tier` (unknown ids left out), via `where: {id: [...]}`."""
        out: list[dict[str, Any]] = []
        page = _limit(tier, "max_recall_limit", 1000)
        unique = list(dict.fromkeys(ids))
        for start in range(0, len(unique), page):
            chunk = unique[start:start + page]
            result = await tier.call("memory/timeline", with_owner(
                {"where": {"id": chunk}, "limit": len(chunk), "embeddings": embeddings}, owner))
            asked = set(chunk)  # a tier that ignores `where` answers with others: never moved nor counted as found
            out.extend(r for r in result["records"] if r["id"] in asked)
        return out

    async def scan(self, tier: Tier, owner: str | None, *, where: dict[str, Any] | None = None,
                   embeddings: bool = False) -> list[dict[str, Any]]:
        """Every record of `owner` in `tier` (matching `where`) in the tier's timeline order, which a
        move keeps: records sharing a millisecond are written on in it, so a transcript's turns stay
        in order (its pages come newest first). Past a millisecond holding more records than a
        timeline returns, on a tier without the cursor extension (`a2m.paging`), the rest of that
        millisecond is left out, logged: they stay where they are."""
        pages = [records async for records in self.scan_pages(tier, owner, where=where, embeddings=embeddings)]
        return [record for records in reversed(pages) for record in records]

    async def scan_pages(self, tier: Tier, owner: str | None, *, where: dict[str, Any] | None = None,
                         embeddings: bool = False) -> AsyncIterator[list[dict[str, Any]]]:
        """`scan` a page at a time, for a caller that need not hold the whole scope at once."""
        page = _limit(tier, "max_recall_limit", 1000)
        capped = tier.limit("max_recall_limit")
        params: dict[str, Any] = with_owner({"embeddings": embeddings}, owner)
        if where:
            params["where"] = where
        try:
            # No waits for a tier that is itself a router answering without some of its tiers: a policy
            # pass holds locks; what it does not read now stays where it is until the next one.
            async for records in pages_backwards(tier.call, params, page=page, cap=capped, waits=()):
                yield records if not where else [r for r in records if _within(r, where)]
        except (CrowdedMillisecond, TiersDown) as exc:
            log.warning("reading %s for %s: %s; the rest of them stay where they are", tier.name, owner, exc)

    # ---- the move -----------------------------------------------------------------

    async def move(self, source: Tier, dest: Tier, owner: str | None, ids: Sequence[str] = (), *,
                   where: dict[str, Any] | None = None, salience: float | None = None,
                   reason: str = "spill", refused: Refusals | None = None) -> list[str]:
        """Write -> verify -> delete these records of `source` (by `ids`, or all that match `where`;
        whole groups) into `dest`. Returns the ids that now live (only) in `dest`; each unit `dest`
        refused is added to `refused` (its ids and the refusal), when given."""
        moved, _ = await self._move_ids(source, dest, owner, ids, where=where, salience=salience, reason=reason,
                                        refused=refused)
        return moved

    async def _move_ids(self, source: Tier, dest: Tier, owner: str | None, ids: Sequence[str], *,
                        where: dict[str, Any] | None = None, salience: float | None = None,
                        reason: str = "spill", duplicates_only: bool = False,
                        refused: Refusals | None = None) -> tuple[list[str], set[str]]:
        """`move`, also returning which records were found in `source`. `duplicates_only`: move
        only those `dest` holds too (repair: what is in one tier alone stays)."""
        if not ids and where is None:
            return [], set()
        if not dest.available():  # waiting out its backoff: the records stay where they are
            log.info("move %s -> %s skipped: %s is down", source.name, dest.name, dest.name)
            return [], set(ids)
        if dest.gated:  # a write there is a proposal no read shows: never verified, so never a move
            if (source.name, dest.name) not in self._gated_told:  # once: a spill pass comes with every write
                self._gated_told.add((source.name, dest.name))
                log.warning("moves %s -> %s are skipped: %s holds writes for review (memory/approve); records "
                            "stay in %s", source.name, dest.name, dest.name, source.name)
            return [], set(ids)
        async with self.owner_lock(owner):
            records = (await self.scan(source, owner, where=where, embeddings=True) if where is not None
                       else await self.by_ids(source, owner, ids, embeddings=True))
            found = {r["id"] for r in records}
            if duplicates_only and records:
                there = {r["id"] for r in await self.by_ids(dest, owner, list(found))}
                records = [r for r in records if r["id"] in there]
            records = await self._whole_groups(source, owner, records)
            records.sort(key=lambda r: r["created_at"])  # oldest first: a move cut short keeps the newest
            return await self._move(source, dest, owner, records, salience, reason, refused), found

    async def _whole_groups(self, source: Tier, owner: str | None, records: Sequence[dict[str, Any]], *,
                            embeddings: bool = True) -> list[dict[str, Any]]:
        """`records` and every other member of their groups in `source`, from any session."""
        groups = sorted({r["group"] for r in records if r.get("group")})
        out = list(records)
        if groups:
            known = {r["id"] for r in records}
            out += [r for r in await self.scan(source, owner, where={"group": groups}, embeddings=embeddings)
                    if r["id"] not in known]
        return out

    async def _move(self, source: Tier, dest: Tier, owner: str | None, records: Sequence[dict[str, Any]],
                    salience: float | None, reason: str, refused: Refusals | None = None) -> list[str]:
        writes = [move_form(r) for r in records]
        if salience is not None:
            for write in writes:
                write["salience"] = salience
        await dest.described()
        movable = self._kept_whole(source, dest, units(writes), refused)
        writes = [w for unit in movable for w in unit]
        if self.embedder is not None and dest.searched:
            missing = [w for w in writes if w.get("embedding") is None and w.get("content")]
            vectors = await try_embed_into(self.embedder, [w["content"] for w in missing], dest.dimensions, dest.name)
            for write, vector in zip(missing, vectors or []):
                if vector is not None:
                    write["embedding"] = vector
        size = _limit(dest, "max_records_per_call", 500)
        moved: list[str] = []
        held = self.owner_lock(owner)  # the caller holds it
        for batch in batches(movable, size):
            await held.check()  # a lapsed hold writes nothing: another replica may have moved or forgotten these
            placed, stop = await self._place(source, dest, owner, batch, size, refused)
            verified = [w["id"] for unit in placed for w in unit]
            if verified:
                self._deleting(owner)
                deleted: list[str] = []
                try:
                    await held.check()  # nor deletes: the copy there may be the only one another replica kept
                    await self._forget_as_read(source, owner, [w for unit in placed for w in unit], deleted)
                except A2MError as exc:  # a duplicate now, repaired by the next consolidate
                    log.warning("move %s -> %s: delete from source failed (%s); %d duplicates until consolidate",
                                source.name, dest.name, exc, len(verified) - len(deleted))
                    moved.extend(deleted)  # those an earlier call of the delete took: moved for good
                    break
                moved.extend(verified)
            if stop:
                break
        if moved:
            done = set(moved)
            self._note_arrivals(dest, owner, [r for r in records if r["id"] in done])
            if self.observe_move is not None:
                self.observe_move(reason, source.name, dest.name, len(moved))
        return moved

    def _kept_whole(self, source: Tier, dest: Tier, unit_list: list[list[dict[str, Any]]],
                    refused: Refusals | None) -> list[list[dict[str, Any]]]:
        """The units `dest` would keep whole. A unit with a field of a capability `dest` does not
        declare (a tier server of another implementation ignores it: `Tier.drops`) stays in
        `source`, as one `dest` refused does: a move never loses a field silently (a session no
        longer listed or closed, an owner's record open to every owner, a salience or vector gone).
        Its recall counts (`RECALLS`) are let go: the source's bookkeeping, not the caller's data,
        and a promotion is earned by them, so none could ever reach a tier without `salience`."""
        out = []
        for unit in unit_list:
            lost = next(((w, drop) for w in unit if (drop := dest.drops(w, RECALLS)) is not None), None)
            if lost is None:
                out.append(unit)
                continue
            (write, (name, capability)) = lost
            error = invalid(f"record {write['id']}: tier {dest.name} does not declare {capability}, so it would not "
                            f"keep the {name}", id=write["id"], field=name, tier=dest.name, capability=capability)
            if (source.name, dest.name, name) not in self._unkept_told:  # once: a spill pass comes with every write
                self._unkept_told.add((source.name, dest.name, name))
                log.warning("move %s -> %s: %s; such records stay in %s", source.name, dest.name, error.message,
                            source.name)
            if refused is not None:
                refused.append(([w["id"] for w in unit], error))
        return out

    async def _place(self, source: Tier, dest: Tier, owner: str | None, batch: list[list[dict[str, Any]]],
                     size: int, refused: Refusals | None = None) -> tuple[list[list[dict[str, Any]]], bool]:
        """Write a batch of units to `dest` and read it back: (the units verified there, whether to stop).

        A refusal (the destination answered with an error) is one unit's fault as often as not: the
        units are then placed one by one and only the refused ones stay behind. A destination that
        cannot be reached stops the move. A unit written in several calls and cut short is taken
        back from `dest` (the source holds all of it), so no group is left half copied."""
        flat = [w for unit in batch for w in unit]
        written: list[str] = []
        sending: list[str] = []  # the ids of the write in flight
        try:
            for start in range(0, len(flat), size):  # one call unless a single unit outgrows a batch
                chunk = flat[start:start + size]
                sending = [w["id"] for w in chunk]
                landed = (await dest.call("memory/remember", with_owner({"records": chunk}, owner)))["ids"]
                sending = []
                self.doubts.settle(owner, dest.name, landed)  # written anew: a late forget must not delete them
                written += landed
            present = {r["id"]: r for r in await self.by_ids(dest, owner, written)}
        except A2MError as exc:
            if isinstance(exc, Unavailable) and sending:  # cut off: it may still land there
                self.doubts.note(owner, dest.name, sending)
            if written:
                await self._take_back(source, dest, owner, [w["id"] for w, got in zip(flat, written) if got == w["id"]])
            if isinstance(exc, Malformed):  # it answered, unusably: named to a caller that asked (promote)
                log.warning("move %s -> %s: %s; %d records stay in %s", source.name, dest.name, exc, len(flat),
                            source.name)
                if refused is not None:
                    refused.append(([w["id"] for w in flat], exc))
                return [], True
            if isinstance(exc, Unavailable):
                log.warning("move %s -> %s: %s; %d records stay in %s", source.name, dest.name, exc, len(flat),
                            source.name)
                return [], True
            if len(batch) == 1:
                log.warning("move %s -> %s: %s refused a unit of %d (%s); it stays in %s", source.name, dest.name,
                            dest.name, len(flat), exc, source.name)
                if refused is not None:
                    refused.append(([w["id"] for w in flat], exc))
                return [], False
            placed: list[list[dict[str, Any]]] = []
            for unit in batch:
                done, stop = await self._place(source, dest, owner, [unit], size, refused)
                placed += done
                if stop:
                    return placed, True
            return placed, False
        kept = dict(zip((w["id"] for w in flat), written))
        verified = []
        for unit in batch:
            # Held there under its own id, with its content: a destination that says it stored a record
            # and shows back something else for that id (or nothing) does not hold it.
            other = [w["id"] for w in unit if kept[w["id"]] != w["id"]]
            unseen = [w["id"] for w in unit if kept[w["id"]] == w["id"] and not holds(present.get(w["id"]), w)]
            if not other and not unseen:
                verified.append(unit)
            elif unseen:  # it said it stored them and does not show them back: whatever it holds, not these
                error = Malformed(f"tier {dest.name} answered memory/remember with ids it then did not show back "
                                  f"with their content: {unseen[:5]}", {"tier": dest.name, "ids": unseen})
                log.warning("move %s -> %s: %s; they stay in %s", source.name, dest.name, error.message, source.name)
                if refused is not None:
                    refused.append(([w["id"] for w in unit], error))
            else:  # the destination kept another record for a key: never delete this one for it
                log.warning("move %s -> %s: %s kept other records for %s; they stay in %s", source.name, dest.name,
                            dest.name, other, source.name)
        return verified, False

    async def _forget_as_read(self, tier: Tier, owner: str | None, records: Sequence[dict[str, Any]],
                              sent: list[str] | None = None) -> int:
        """Delete `records` from `tier`, each only at the revision they were read at; how many went.
        One call per revision: the ids of each call answered go into `sent` as it is, so a caller
        whose later call failed knows what the earlier ones took.

        The owner lock holds back this router's writes, not another replica's: a key replaced there
        through another router between the read and this delete is a newer revision, and deleting it
        by id lost that acknowledged write (a move's destination does not hold it; a drop chose the
        old version). Left in place, a moved one is a duplicate that repair moves on (the newer
        revision replaces the older); a dropped one is no longer the oldest."""
        by_revision: dict[Any, list[str]] = {}
        for record in records:
            by_revision.setdefault(record.get("revision"), []).append(record["id"])
        forgotten = 0
        for revision, ids in by_revision.items():
            params: dict[str, Any] = {"ids": ids} if revision is None else {"ids": ids, "where": {"revision": revision}}
            forgotten += int((await tier.call("memory/forget", with_owner(params, owner))).get("forgotten", 0))
            if sent is not None:
                sent.extend(ids)
        return forgotten

    async def _take_back(self, source: Tier, dest: Tier, owner: str | None, copies: list[str]) -> None:
        try:
            await dest.call("memory/forget", with_owner({"ids": copies}, owner))
        except A2MError as exc:  # duplicates until a consolidate completes the move
            log.warning("move %s -> %s: %d copies of a group cut short stay in %s until consolidate (%s)",
                        source.name, dest.name, len(copies), dest.name, exc)

    def _note_arrivals(self, dest: Tier, owner: str | None, records: Iterable[dict[str, Any]]) -> None:
        """Records that arrive already recalled often enough earn promotion in their new tier."""
        config = dest.config
        if not config.promote_to:
            return
        due = {r["id"] for r in records if int(r.get("access_count") or 0) >= config.promote_after}
        if due:
            self._queue(owner, dest.name, due)

    def _queue(self, owner: str | None, name: str, due: set[str]) -> None:
        """Queue `due` (ids in tier `name` that earned promotion) for `owner`'s next consolidate or
        session close, which alone drain an owner's queue. Bounded by MAX_PENDING ids in all: past
        it the owners queued least recently give theirs up, whole. What is dropped so is not lost:
        a record past `promote_after` is queued again by its next recall (each recall counts it)."""
        key = (owner, name)
        ids = self.pending.pop(key, None)  # put back last: the dict's order is the order of queueing
        if ids is None:
            ids = set()
        before = len(ids)
        ids.update(due)
        self.pending[key] = ids
        self._pending_size += len(ids) - before
        while self._pending_size > MAX_PENDING and len(self.pending) > 1:
            oldest = next(iter(self.pending))
            self._pending_size -= len(self.pending.pop(oldest))
            log.debug("promotions queued for %r in %s dropped: over %d queued ids", oldest[0], oldest[1],
                      MAX_PENDING)

    # ---- capacity ---------------------------------------------------------------------

    async def enforce(self, tier: Tier, owner: str | None, session: str | None) -> dict[str, int]:
        """Bring one (owner, session) of a per-session tier back to its capacity (or the whole
        partition of a tier with a plain capacity). Weakest whole groups go first."""
        config = tier.config
        capacity = config.capacity
        if capacity is None or not tier.writable:
            return {"moved": 0, "dropped": 0}
        key = (tier.name, owner, session if tier.per_session else None)
        async with self.lock(*key):
            victims = await self._victims(tier, owner, session)
            if not victims:
                return {"moved": 0, "dropped": 0}
            if config.retention == "drop":  # never beside spill_to (the config refuses both)
                async with self.owner_lock(owner):
                    # Chosen again under the lock: a key replaced since the first read is the newest
                    # record now (or in another session), and deleting it by id would lose that write.
                    victims = await self._victims(tier, owner, session)
                    if not victims:
                        return {"moved": 0, "dropped": 0}
                    # Whole groups, as a move takes them: members in other sessions go too, never half a group.
                    dropped = await self._forget_as_read(
                        tier, owner, await self._whole_groups(tier, owner, victims, embeddings=False))
                if dropped and self.observe_drop is not None:
                    self.observe_drop(tier.name, dropped)
                return {"moved": 0, "dropped": dropped}
            if not config.spill_to:
                return {"moved": 0, "dropped": 0}
            dest = self.fed[config.spill_to]
            moved = await self.move(tier, dest, owner, [r["id"] for r in victims])
        if not moved or dest.config.capacity is None:
            return {"moved": len(moved), "dropped": 0}
        # The spill can put its destination past a capacity of its own: that tier spills (or drops) on
        # now, down the chain, not only at the next consolidate. Outside this bucket's lock.
        onward = await self.enforce_all(owner, [dest])
        return {"moved": len(moved) + onward["moved"], "dropped": onward["dropped"]}

    async def _victims(self, tier: Tier, owner: str | None, session: str | None) -> list[dict[str, Any]]:
        """The records of the weakest whole groups of the bucket past the tier's capacity (none: within)."""
        config = tier.config
        assert config.capacity is not None
        if tier.per_session:
            where = {"session": session}
            records = (await tier.call("memory/timeline", with_owner({"where": where, "limit": 0}, owner)))["records"]
            if len(records) >= _limit(tier, "max_recall_limit", 1000):
                records = await self.scan(tier, owner, where=where)
            else:
                records = [r for r in records if _within(r, where)]
        else:
            records = await self.scan(tier, owner)
        excess = len(records) - config.capacity
        victims: list[dict[str, Any]] = []
        for unit in weakest_first(units(records)):
            if excess <= 0:
                break
            victims.extend(unit)
            excess -= len(unit)
        return victims

    async def enforce_all(self, owner: str | None, tiers: Iterable[Tier] | None = None) -> dict[str, int]:
        """Every capacity rule of every writable tier, top of the chain first."""
        total = {"moved": 0, "dropped": 0}
        for tier in tiers or list(self.fed):
            if tier.config.capacity is None or not tier.writable:
                continue
            try:
                if tier.per_session:
                    sessions = (await tier.call("memory/session/list", with_owner({}, owner)))["sessions"]
                    buckets: list[str | None] = [s["session"] for s in sessions
                                                 if s.get("records", 0) > tier.config.capacity]
                    buckets.append(None)  # the implicit bucket of records without a session
                else:
                    buckets = [None]
                for bucket in buckets:
                    done = await self.enforce(tier, owner, bucket)
                    total["moved"] += done["moved"]
                    total["dropped"] += done["dropped"]
            except LockFailed:  # nothing of any tier can move now: said, not answered as "moved 0"
                raise
            except A2MError as exc:
                log.warning("capacity pass on %s failed: %s", tier.name, exc)
        return total

    # ---- sessions -------------------------------------------------------------------

    async def flush(self, owner: str | None, session: str) -> int:
        """Move a closed session out of every per-session tier into its spill_to, at once."""
        flushed = 0
        for tier in self.fed:
            config = tier.config
            if not (tier.per_session and config.spill_to and tier.writable):
                continue
            try:
                async with self.lock(tier.name, owner, session):
                    moved = await self.move(tier, self.fed[config.spill_to], owner, where={"session": session},
                                            reason="session_close")
            except Unavailable as exc:  # its records stay where they are; the close names the tier in `degraded`
                log.warning("flushing session %r out of %s failed: %s", session, tier.name, exc)
                continue
            flushed += len(moved)
        return flushed

    # ---- promotion ------------------------------------------------------------------

    async def recalled(self, owner: str | None, by_tier: dict[str, list[str]]) -> None:
        """Count one recall of each record the router returned (a query-less recall by id, which
        the tier touches), and queue the ones that reached `promote_after`."""
        await asyncio.gather(*(self._count(owner, name, ids) for name, ids in by_tier.items() if ids))

    def count_later(self, owner: str | None, by_tier: dict[str, list[str]]) -> bool:
        """Buffer recall counts for `flush_counts`; True when the caller must start a flush.

        Under concurrent recalls the counting calls would otherwise double the tier calls per
        recall; buffered, every recall answered while one flush is in flight shares the next one
        (one call per tier and owner, per distinct multiplicity)."""
        for name, ids in by_tier.items():
            if ids:
                self._recalls.setdefault((owner, name), Counter()).update(ids)
        self._buffered += 1
        if self._flushing:
            return False
        self._flushing = True
        return True

    async def flush_counts(self) -> None:
        try:
            while self._recalls:
                batch, self._recalls, upto = self._recalls, {}, self._buffered
                calls = []
                for (owner, name), counter in batch.items():
                    for round_ in range(1, max(counter.values()) + 1):  # a record returned twice counts twice
                        calls.append(self._count(owner, name, [i for i, n in counter.items() if n >= round_]))
                await asyncio.gather(*calls)
                self._counted = upto
                self._wake()
        finally:
            self._flushing = False
            self._wake()

    def _wake(self) -> None:
        self._progress.set()
        self._progress = asyncio.Event()

    async def counted(self) -> None:
        """Wait until the recalls buffered so far are counted in their tiers, not for the ones
        buffered after this call: under steady recall traffic the flush never runs dry, and
        consolidate and session/close, which wait here, waited as long as the traffic lasted."""
        target = self._buffered
        while self._flushing and self._counted < target:
            await self._progress.wait()

    async def _count(self, owner: str | None, name: str, ids: list[str], hops: int = 2) -> None:
        """Count a recall of `ids` where they were recalled from (a recall by id touches them). One a
        spill or promotion carried away since is counted where that move took it, `hops` links on."""
        tier = self.fed[name]
        if not tier.writable or not tier.has("salience") and not tier.config.promote_to:
            return
        page = _limit(tier, "max_recall_limit", 1000)
        config = tier.config
        onward = list(dict.fromkeys(t for t in (config.spill_to, config.promote_to) if t is not None))
        seen = self.moves_seen(owner)
        gone: list[str] = []
        touched: dict[str, int] = {}  # id -> its access_count after this touch
        for start in range(0, len(ids), page):
            chunk = ids[start:start + page]
            try:
                result = await tier.call("memory/recall",
                                         with_owner({"where": {"id": chunk}, "limit": len(chunk)}, owner))
            except A2MError as exc:
                log.info("could not count recalls on %s: %s", name, exc)
                return
            asked = set(chunk)  # a tier that ignores `where` answers with others: never counted nor promoted
            records = [r for r in result["records"] if r["id"] in asked]
            found = {r["id"] for r in records}
            gone += [i for i in chunk if i not in found]
            touched.update((r["id"], int(r.get("access_count") or 0)) for r in records)
            if config.promote_to:
                due = {r["id"] for r in records if int(r.get("access_count") or 0) >= config.promote_after}
                if due:
                    self._queue(owner, name, due)
        # A move that read these records before the touch copies them without it, then deletes the
        # touched copy. Such a move holds the owner lock now, or has begun its delete since `seen`.
        if touched and hops and onward and (self.moves_seen(owner) != seen or self.owner_lock(owner).locked()):
            gone += await self._carried_off(owner, tier, [self.fed[t] for t in onward], touched)
        if gone and hops:
            await asyncio.gather(*(self._count(owner, t, gone, hops - 1) for t in onward))

    async def _carried_off(self, owner: str | None, tier: Tier, onward: list[Tier],
                           touched: dict[str, int]) -> list[str]:
        """Of the records just counted in `tier`, those a move took on without the count (their copy
        one link on has fewer recalls than the touch answered): they are counted there again. Read
        under the owner lock, when no move is between its read and its delete. A lock that cannot be
        had (`lock_url` unreachable, another replica's hold past its wait) leaves them, as a tier that
        does not answer does: the recall that counted them has its records and must not fail for it."""
        try:
            async with self.owner_lock(owner):
                left = {r["id"] for r in await self.by_ids(tier, owner, list(touched))}
                away = [i for i in touched if i not in left]
                copies = [r for t in onward for r in (await self.by_ids(t, owner, away) if away else [])]
        except A2MError as exc:
            log.info("could not follow recall counts out of %s: %s", tier.name, exc)
            return []
        return [r["id"] for r in copies if int(r.get("access_count") or 0) < touched[r["id"]]]

    async def promote_pending(self, owner: str | None) -> int:
        promoted = 0
        for (pending_owner, name), ids in list(self.pending.items()):
            if pending_owner != owner or not ids:
                continue
            tier = self.fed[name]
            target = tier.config.promote_to
            if target is None:
                continue
            batch = sorted(ids)
            try:
                moved, found = await self._move_ids(tier, self.fed[target], owner, batch, reason="promote")
            except LockFailed:
                raise
            except A2MError as exc:  # still queued: the next consolidate or close tries again
                log.warning("promotion %s -> %s skipped: %s", name, target, exc)
                continue
            # Still queued: what is still here and did not move (its destination refused or was down).
            # Before the event, which can wait on a slow subscriber: a record arriving here meanwhile
            # is queued again on arrival, and must not be dropped as "not found" after that.
            before = len(ids)
            ids.difference_update(set(batch) - (found - set(moved)))
            if self.pending.get((pending_owner, name)) is ids:  # not dropped (`_queue`) meanwhile
                self._pending_size -= before - len(ids)
                if not ids:
                    del self.pending[(pending_owner, name)]  # an entry per owner ever promoted would only grow
            if moved and self.emit is not None:
                await self.emit("promoted", owner, ids=moved, tier=target)
            promoted += len(moved)
        return promoted


    # ---- duplicate repair --------------------------------------------------------------

    def links(self) -> list[tuple[Tier, Tier]]:
        pairs: list[tuple[Tier, Tier]] = []
        for tier in self.fed:
            for target in {tier.config.spill_to, tier.config.promote_to} - {None}:
                pairs.append((tier, self.fed[target]))  # type: ignore[index]
        return pairs

    async def _split_members(self, page_in_source: bool, page: list[dict[str, Any]], other: Tier,
                             owner: str | None) -> list[str]:
        """The ids of a link's source records whose group the other side holds too, of the groups in
        `page` (read from the source where `page_in_source`, else from the destination)."""
        groups = sorted({r["group"] for r in page if r.get("group")})
        if not groups:
            return []
        there = await self.scan(other, owner, where={"group": groups})
        if page_in_source:
            split = {r["group"] for r in there}
            return [r["id"] for r in page if r.get("group") in split]
        return [r["id"] for r in there]

    async def repair(self, owner: str | None) -> int:
        """Same id in a source and its destination (a move interrupted after its write): the move is
        run again, which keeps the destination copy (its write is idempotent) unless the source holds
        a newer revision of the key, which then replaces it (an older one, its key replaced in the
        destination since, is deleted: `holds`), and takes a group split by the
        interruption whole. Scans the smaller side of each link a page at a time and looks each page up in
        the other: holding the whole side was 10^5 records in the router's memory at once.

        A group held on both sides (a member written while the tier holding its group did not answer:
        the write goes where the batch goes, decision 37) is rejoined in the destination, where a later
        member goes too (`writes.locate`: the deepest). Left split, it stayed so for good (review-chaos)."""
        repaired = 0
        for source, dest in self.links():
            if not source.writable:
                continue
            try:
                counts = await asyncio.gather(source.call("memory/describe", with_owner({}, owner)),
                                              dest.call("memory/describe", with_owner({}, owner)))
                n_source = sum(t.get("count", 0) for t in counts[0].get("tiers", []))
                n_dest = sum(t.get("count", 0) for t in counts[1].get("tiers", []))
                if not n_source or not n_dest:
                    continue
                small, other = (source, dest) if n_source <= n_dest else (dest, source)
                both: list[str] = []  # a page of the smaller side at a time: only the duplicates are held
                strays: list[str] = []  # the source's members of groups the destination holds too
                async for page in self.scan_pages(small, owner):
                    both += [r["id"] for r in await self.by_ids(other, owner, [r["id"] for r in page])]
                    strays += await self._split_members(small is source, page, other, owner)
                moved, _ = await self._move_ids(source, dest, owner, both, reason="repair", duplicates_only=True)
                repaired += len(set(moved) & set(both))
                rejoined, _ = await self._move_ids(source, dest, owner, [i for i in strays if i not in set(moved)],
                                                   reason="repair")
                repaired += len(rejoined)
            except LockFailed:
                raise
            except A2MError as exc:
                log.warning("duplicate repair %s -> %s skipped: %s", source.name, dest.name, exc)
        return repaired
