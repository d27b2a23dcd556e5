"""The A2M surface every single-tier server offers, written once over a `Store`.

Everything protocol-shaped lives here: validation and limits, owner scoping, id
idempotency, key replacement (same id, revision + 1), the move/import
extension, embedding width checks, touch policy, events, prompt rendering and
summaries. Engines only store and rank (see `store.py`).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import random
from contextlib import contextmanager
from typing import Any, Iterator, Mapping, Sequence

from a2m import errors, prompt as prompts
from a2m.dispatch import Context, Handler, bound_handlers
from a2m.embedder import Embedder, close_embedder, try_embed_into
from a2m.errors import A2MError, invalid
from a2m.events import EventLog, EventMethods
from a2m.filters import Scope, parse_scope, settle_field
from a2m.records import Record, parse_write, supplied_history, validate_embedding
from a2m.summarize import summarize as extract_summary
from a2m.text import query_terms, tokenize
from a2m.timefmt import format_ts, now, parse_ts
from a2m.params import (DEFAULT_LIMITS, amount_param, bool_param, ids_param, limit_param, min_score_param, query_param,
                        records_param, required_str, str_param)

from .settings import SettingsError
from .store import (Position, Store, StoreConflict, StoreIdTaken, StoreReadOnly, StoreRejected, StoreUnavailable,
                    StoreWidthMismatch)

log = logging.getLogger("a2m.tier")

WRITE_ATTEMPTS = 4  # a batch is resolved again this often when another replica changes its keys meanwhile
WRITE_RETRY_PAUSE = 0.01  # s: at most this times the attempt, at random, before resolving again
DEFAULT_RECALL_LIMIT = 10
FORGET_BY_QUERY_LIMIT = 1000
SUMMARY_CHARS = 1200  # the length of a summary, or this server's max_content_length when that is lower


class TierServer(EventMethods):
    """One tier, one engine: a complete, conformant A2M service."""

    def __init__(
        self,
        store: Store,
        *,
        name: str,
        kind: str,
        capabilities: frozenset[str],
        limits: Mapping[str, int] | None = None,
        embedder: Embedder | None = None,
        extensions: Mapping[str, Handler] | None = None,
        extension_docs: Mapping[str, Any] | None = None,
        events: EventLog | None = None,
        read_only: bool = False,
    ) -> None:
        self.store = store
        self.name = name
        self.kind = kind
        self.capabilities = capabilities
        self.limits = dict(DEFAULT_LIMITS if limits is None else limits)
        self.embedder = embedder if store.searches_vectors else None
        self.extensions = dict(extensions or {})
        self.extension_docs = dict(extension_docs or {})
        self.events = events or EventLog()
        self.read_only = read_only
        self._untouched = False  # the engine refused the last recall's touch (said once: `_touch`)
        self._cursor_tag = cursor_tag(name, kind)
        self._dims: int | None = None
        # Held from resolving a batch's keys to writing them. A store whose own methods also replace
        # keys (procedural's memory/restore) lends its lock, so those serialise with remember too.
        self._key_lock = getattr(store, "key_lock", None) or asyncio.Lock()

    # ---- service plumbing -------------------------------------------------

    async def startup(self) -> None:
        await self.store.open()
        width = getattr(self.embedder, "dimensions", None)  # an HTTP embedder's is known after first use
        held = await self.dimensions() if width else None
        if width and held and width != held:
            await self.store.close()
            raise SettingsError(f"tier {self.name} holds {held}-dim vectors and --embedder makes {width}: "
                                f"serve it with the model that embedded them, or with no embedder (text recall)")

    async def shutdown(self) -> None:
        """Close the engine, then the embedder's connections (an HTTP embedder's client was left open)."""
        try:
            await self.store.close()
        finally:
            await close_embedder(self.embedder)

    async def ready(self) -> bool:
        try:
            await self.store.ping()
            return True
        except Exception:
            return False

    def handlers(self) -> dict[str, Handler]:
        if self.read_only:
            return {**self._handlers(), "memory/remember": self._refuse, "memory/forget": self._refuse,
                    "memory/summarize": self._refuse}
        return self._handlers()

    async def _refuse(self, params: dict[str, Any], ctx: Context) -> dict[str, Any]:
        raise A2MError(errors.READ_ONLY, f"tier {self.name} is read-only", {"tier": self.name})

    def _handlers(self) -> dict[str, Handler]:
        return {**bound_handlers(self), **{name: self._engine_mapped(h) for name, h in self.extensions.items()}}

    def _engine_mapped(self, handler: Handler) -> Handler:
        """An extension method answering engine failures as the protocol methods do (`engine`): a down
        engine names the tier, where the dispatcher could only say "internal error: StoreUnavailable"."""
        async def mapped(params: dict[str, Any], ctx: Context) -> dict[str, Any]:
            with self.engine():
                return await handler(params, ctx)

        return mapped

    @contextmanager
    def engine(self) -> Iterator[None]:
        """Map engine failures onto the protocol: down -> -32603 naming the tier; refused -> -32602."""
        try:
            yield
        except StoreUnavailable as exc:
            raise A2MError(errors.INTERNAL_ERROR, f"tier {self.name} ({self.store.engine}) unavailable: {exc}",
                           {"tier": self.name, "engine": self.store.engine}) from exc
        except StoreWidthMismatch as exc:
            self._dims = exc.expected
            raise A2MError(errors.EMBEDDING_MISMATCH, f"embeddings here have {exc.expected} dimensions",
                           {"expected": exc.expected, "got": [exc.got]}) from exc
        except StoreRejected as exc:
            raise invalid(f"tier {self.name} cannot store this input: {exc}", tier=self.name) from exc

    async def describe_fields(self, params: dict[str, Any], ctx: Context) -> dict[str, Any]:
        owner = ctx.owner(params)
        with self.engine():
            count = None if ctx.anonymous else await self.store.count(owner)  # what it holds is for a token
            dims = await self.dimensions()
        tier: dict[str, Any] = {"name": self.name, "kind": self.kind, "count": count, "capacity": None,
                                "engine": self.store.engine}
        if ctx.anonymous:
            del tier["count"], tier["engine"]
        if self.read_only:
            tier["read_only"] = True
        if not self._writes_visible():  # a writer that tells events (the router) must not tell these yet
            tier["gated"] = True
        if "scopes" not in self.capabilities:  # no owner partitions: every caller reads the same records
            tier["shared"] = True
        if self.kind == "working":
            tier["per_session"] = True
        out: dict[str, Any] = {"tiers": [tier]}
        if "events" in self.capabilities:  # fields of an undeclared capability are not described
            out["events"] = {"push": ctx.push is not None}
        if "embeddings" in self.capabilities:
            metric = getattr(self.store, "metric", "cosine")  # a mounted collection ranks by its own
            out["embeddings"] = {"dimensions": dims, "metric": metric, "metrics": [metric],
                                 "model": self.embedder.model if self.embedder else None,
                                 "searched": self.store.searches_vectors}
        if "summarize" in self.capabilities:
            out["summarize"] = {"model": None}
        if "prompt" in self.capabilities:
            out["prompt"] = prompts.describe()
        if self.extension_docs:
            out["extensions"] = self.extension_docs
        return out

    async def dimensions(self) -> int | None:
        if self._dims is None:
            self._dims = await self.store.dimensions()
        return self._dims

    def _check_tier(self, params: Mapping[str, Any], name: str = "tier") -> None:
        tier = params.get(name)
        if tier is not None and not isinstance(tier, str):
            raise invalid(f"{name} must be a string (a tier's name)", field=name)
        if tier is not None and tier != self.name:
            raise A2MError(errors.UNKNOWN_TIER, f"unknown tier {tier!r}; this server holds {self.name!r}",
                           {"tier": tier, "tiers": [self.name]})

    def _scope(self, params: Mapping[str, Any], ctx: Context, *, ids_field: bool = False) -> Scope:
        """The call's scope, `where.tier` answered here: every record this server returns shows
        `tier: <this tier>` whatever was stored, so the engines never compare a stored `tier`."""
        return settle_field(parse_scope(params, ctx.owner(params), ids_field=ids_field), "tier", self.name)

    async def _check_width(self, vectors: Sequence[list[float]]) -> None:
        if not vectors:
            return
        widths = {len(v) for v in vectors}
        dims = await self.dimensions()
        expected = dims if dims is not None else next(iter(widths))
        if widths != {expected}:
            raise A2MError(errors.EMBEDDING_MISMATCH, f"embeddings here have {expected} dimensions",
                           {"expected": expected, "got": sorted(widths)})

    def _wire(self, records: Sequence[Record], params: Mapping[str, Any]) -> list[dict[str, Any]]:
        embeddings = params.get("embeddings") is True
        return [r.to_wire(embeddings=embeddings, tier=self.name) for r in records]

    def _with_prompt(self, result: dict[str, Any], records: Sequence[Record], options: dict[str, Any] | None,
                     ordered_by_time: bool, written: Sequence[str] | None = None) -> dict[str, Any]:
        if options is not None:
            result.update(prompts.render(records, options, ordered_by_time=ordered_by_time, written=written))
        return result

    async def _written_order(self, owner: str | None, records: Sequence[Record],
                             options: dict[str, Any] | None) -> list[str] | None:
        """For a recall's transcript prompt: the records' ids in the order they were written, which
        their `created_at` alone does not tell for records written in one call."""
        if options is None or options["style"] != "transcript" or options["method"] == "none" or len(records) < 2:
            return None
        ordered = await self.store.select(Scope(owner=owner, ids=[r.id for r in records]), order="asc",
                                          limit=len(records))
        return [r.id for r in ordered]

    def _prompt_options(self, params: Mapping[str, Any]) -> dict[str, Any] | None:
        value = params.get("prompt")
        if value is None or value is False:  # not `in (None, False)`: 0 == False, and 0 is no prompt option
            return None
        if "prompt" not in self.capabilities:
            return None  # fields of undeclared capabilities are ignored
        return prompts.parse(params["prompt"])

    # ---- core ---------------------------------------------------------------

    async def remember(self, params: dict[str, Any], ctx: Context) -> dict[str, Any]:
        owner = ctx.owner(params)
        raw_records = records_param(params, self.limits)
        stamp = now()
        records = [parse_write(raw, i, owner=owner, stamp=stamp) for i, raw in enumerate(raw_records)]
        max_len = self.limits.get("max_content_length")
        for i, record in enumerate(records):
            if max_len and len(record.content) > max_len:
                raise invalid(f"records[{i}].content exceeds max_content_length ({max_len})", index=i, max=max_len)
            if record.tier is not None and "tiers" not in self.capabilities:
                raise A2MError(errors.CAPABILITY_NOT_SUPPORTED, f"records[{i}].tier needs the tiers capability",
                               {"capability": "tiers", "field": "tier", "index": i})
            if record.tier is not None and record.tier != self.name:
                raise A2MError(errors.UNKNOWN_TIER, f"records[{i}].tier {record.tier!r} is not this server's tier",
                               {"tier": record.tier, "tiers": [self.name], "index": i})
        with self.engine():
            await self._check_width([r.embedding for r in records if r.embedding is not None])
            await self._embed_missing(records)
            if any(r.key for r in records):
                async with self._key_lock:
                    ids, writes = await self._write(records, raw_records)
            else:
                ids, writes = await self._write(records, raw_records)
        # One event per record of the batch that wrote, in the batch's order and appended together: a
        # key the batch writes twice is two revisions, as the batch is applied (decision 52) and as the
        # router tells it (decision 57); one owner's events at a time (a batch may name several).
        by_owner: dict[str | None, list[dict[str, Any]]] = {}
        for record in writes if self._writes_visible() else ():  # else told when they become recallable
            by_owner.setdefault(record.owner, []).append(
                {"id": record.id, "tier": self.name, "session": record.session, "key": record.key,
                 "revision": record.revision if record.key else None})
        for owner, items in by_owner.items():
            await self.events.emit_many("written", owner, items)
        return {"ids": ids}

    def _writes_visible(self) -> bool:
        """Whether a write is recallable once it returns, so told then: an event reaches only callers
        who could recall its record. Not so behind procedural's review gate, whose approve tells what
        it made recallable (or forgot); see `store.py`."""
        return getattr(self.store, "writes_visible", True)

    async def _write(self, records: list[Record], raw: list[Any]) -> tuple[list[str], list[Record]]:
        """Resolve the batch (`_resolve`) and write it; resolved again when the engine finds that what
        it was resolved against changed meanwhile (another replica wrote one of its keys). Returns the
        ids and each record of the batch that wrote, as it wrote (its id and revision), in order."""
        for attempt in range(1, WRITE_ATTEMPTS + 1):
            ids, puts, deletes, expect, keep, writes = await self._resolve(records, raw)
            try:
                await self.store.write(puts, deletes, expect=expect, keep=keep)
                return ids, writes
            except StoreIdTaken as exc:
                index = next((i for i, r in enumerate(records) if r.id == exc.record_id), None)
                raise A2MError(errors.SCOPE_DENIED, f"records[{index}].id is held by another owner",
                               {"id": exc.record_id, "index": index}) from None
            except StoreConflict:
                if attempt == WRITE_ATTEMPTS:
                    raise StoreUnavailable(f"keys of this batch kept changing under {attempt} attempts "
                                           "(concurrent writers on another replica); retry") from None
                # Two batches on two replicas that keep changing each other's keys, retried at once,
                # could collide on every attempt (seen under 8 clients on 2 cores); a random pause
                # lets one of them commit first, and the other then resolves against it.
                await asyncio.sleep(random.uniform(0, WRITE_RETRY_PAUSE * attempt))
        raise AssertionError("unreachable")

    async def _embed_missing(self, records: list[Record]) -> None:
        if self.embedder is None:
            return
        missing = [r for r in records if r.embedding is None and r.content]
        held = await self.dimensions() or next((len(r.embedding) for r in records if r.embedding is not None), None)
        vectors = await try_embed_into(self.embedder, [r.content for r in missing], held, self.name)
        if vectors is None:
            return
        for record, vector in zip(missing, vectors):
            record.embedding = vector
        await self._check_width([v for v in vectors if v is not None])

    async def _resolve(self, records: list[Record], raw: list[Any]) -> tuple[
            list[str], list[Record], list[str], dict[str, int], dict[str, tuple[str, ...]], list[Record]]:
        """Turn a validated batch into puts and deletes: idempotent ids, keys replaced in place; and
        what the engine must find at the write for them to stand (`expect`: id -> the stored revision
        they replace, 0 for an id they create) and the statistics a replacement keeps from the
        stored record (`keep`), so a concurrent forget, replace, touch or reinforce is not undone.
        Last, each record of the batch that writes, as it writes, in the batch's order (a key written
        twice is there twice, with each revision): one `written` event each."""
        by_owner: dict[str | None, list[Record]] = {}
        for record in records:
            by_owner.setdefault(record.owner, []).append(record)
        # A store whose writes land elsewhere than its reads show (procedural behind its review gate)
        # answers the lookups a write is resolved against itself; any other store's reads are that.
        owners_of = getattr(self.store, "write_owners", self.store.owners)
        keys_of = getattr(self.store, "write_keys", self.store.get_keys)
        held = await owners_of([r.id for r in records])
        for index, record in enumerate(records):
            if record.id in held and held[record.id] != record.owner:
                raise A2MError(errors.SCOPE_DENIED, f"records[{index}].id is held by another owner",
                               {"id": record.id, "index": index})
        existing_ids = {(owner, record_id) for record_id, owner in held.items()}
        keyed: dict[tuple[str | None, str], Record] = {}
        for owner, group in by_owner.items():
            keys = sorted({r.key for r in group if r.key})
            if keys:
                for key, record in (await keys_of(owner, keys)).items():
                    keyed[(owner, key)] = record
        stored = {record.id: record.revision for record in keyed.values()}  # as the engine holds them now
        replaced: set[str] = set()  # stored ids a plain write replaces: their statistics are the engine's
        moved: set[str] = set()  # ids a move writes: its statistics stand
        salience_given: set[str] = set()  # ids a record of the batch gives a salience
        ids: list[str] = []
        puts: dict[tuple[str | None, str], Record] = {}
        writes: list[Record] = []
        deletes: list[str] = []
        for index, record in enumerate(records):
            if (record.owner, record.id) in existing_ids and not supplied_history(raw[index]):
                ids.append(record.id)  # idempotent (a retry): an existing id is returned, its key not replaced
                continue
            slot = (record.owner, record.key) if record.key else None
            current = keyed.get(slot) if slot else None
            if current is not None:
                if supplied_history(raw[index]):  # a move or an import: the newer revision wins, ids kept
                    if record.revision < current.revision:
                        ids.append(current.id)
                        continue
                    if current.id != record.id:
                        deletes.append(current.id)
                        existing_ids.discard((record.owner, current.id))  # a later record of the batch may write it anew
                        puts.pop((record.owner, current.id), None)
                    moved.add(record.id)
                else:
                    keep = raw[index].get("salience") is None
                    record = record.with_(
                        id=current.id, revision=current.revision + 1, access_count=current.access_count,
                        accessed_at=current.accessed_at, salience=current.salience if keep else record.salience,
                    )
                    replaced.add(record.id)
                    if not keep:
                        salience_given.add(record.id)
            elif (record.owner, record.id) in existing_ids or (record.owner, record.id) in puts:
                ids.append(record.id)  # idempotent: the id exists, no second record
                continue
            # Re-inserted, not overwritten in place: a record written twice in one batch (its key
            # replaced again) is written where the batch last writes it, so its insertion order (the
            # tie-break of equal created_at) is the order the batch's records came in.
            puts.pop((record.owner, record.id), None)
            puts[(record.owner, record.id)] = record
            writes.append(record)
            if slot:
                keyed[slot] = record
            ids.append(record.id)
        expect = {record_id: stored[record_id] for record_id in deletes if record_id in stored}
        keep_fields: dict[str, tuple[str, ...]] = {}
        for record in puts.values():
            if record.id in stored:
                expect[record.id] = stored[record.id]
                if record.id in replaced and record.id not in moved:
                    keep_fields[record.id] = ("access_count", "accessed_at") + (
                        () if record.id in salience_given else ("salience",))
            elif record.id not in held:
                expect[record.id] = 0
        return ids, list(puts.values()), deletes, expect, keep_fields, writes

    async def recall(self, params: dict[str, Any], ctx: Context) -> dict[str, Any]:
        self._check_tier(params)
        scope = self._scope(params, ctx)
        limit = limit_param(params, self.limits, DEFAULT_RECALL_LIMIT)
        with_vectors = bool_param(params, "embeddings", False)
        touch = bool_param(params, "touch", True)
        query = query_param(params)
        min_score = min_score_param(params)
        options = self._prompt_options(params)
        vector = params.get("embedding")
        with self.engine():
            if vector is not None:
                vector = validate_embedding(vector)
                await self._check_width([vector])
            elif query and self.embedder is not None:
                # Our own embedder's vector, not the caller's: of another width, the query ranks by text.
                embedded = await try_embed_into(self.embedder, [query], await self.dimensions(), self.name)
                vector = embedded[0] if embedded else None
            if limit == 0:  # no limit (no max_recall_limit declared): every record in scope
                limit = max(await self.store.count(scope.owner), 1)
            # A vector alone asks a tier that never searches by one for nothing it can rank: the newest
            # records, as the router asks it (it passes no vector to such a tier), not none.
            if not query and (vector is None or not self.store.searches_vectors):
                records = await self.store.select(scope, order="desc", limit=limit, with_embeddings=with_vectors)
                for rank, record in enumerate(records):
                    record.score = 1.0 / (1 + rank)
            else:
                use_vector = vector if self.store.searches_vectors else None
                records = await self.store.search(scope, text=query, vector=use_vector, limit=limit,
                                                  with_embeddings=with_vectors)
            if min_score is not None:
                records = [r for r in records if (r.score or 0.0) >= min_score]
            if records and not self.read_only and touch:
                await self._touch(scope.owner, records)
            written = await self._written_order(scope.owner, records, options)
        return self._with_prompt({"records": self._wire(records, params)}, records, options, False, written)

    async def _touch(self, owner: str | None, records: list[Record]) -> None:
        """Count this recall on `records` (access_count, accessed_at), as stored. An engine that serves
        reads only (a standby, a read-only role) leaves them as read: the recall found them, and
        failing it for its bookkeeping made every recall there -32603. Said once in the log."""
        stamp = now()
        try:
            counts = await self.store.touch(owner, [r.id for r in records], stamp) or {}
        except StoreReadOnly as exc:
            if not self._untouched:
                log.warning("%s: recalls are answered without counting them (access_count, accessed_at): %s",
                            self.name, exc)
                self._untouched = True
            return
        self._untouched = False
        for record in records:  # the count this touch made, not the one read before it
            record.access_count = counts.get(record.id, record.access_count + 1)
            record.accessed_at = stamp

    async def timeline(self, params: dict[str, Any], ctx: Context) -> dict[str, Any]:
        self._check_tier(params)
        scope = self._scope(params, ctx)
        limit = limit_param(params, self.limits, self.limits.get("max_recall_limit") or 0)
        with_vectors = bool_param(params, "embeddings", False)
        options = self._prompt_options(params)
        # The cursor extension, where the store can place a record exactly (docs/extensions.md).
        paged = getattr(self.store, "timeline_page", None)
        asked = paged is not None and params.get("cursor") is not None
        below, cursor = cursor_param(params, self._cursor_tag) if asked else None, None
        with self.engine():
            if asked:
                found = await paged(scope, below=below, limit=limit or None, with_embeddings=with_vectors)
                records = [record for record, _ in found]
                if limit and len(found) == limit:  # else this page reached the first record in scope
                    cursor = make_cursor(found[-1][1], self._cursor_tag)
            else:
                records = await self.store.select(scope, order="desc", limit=limit or None,
                                                  with_embeddings=with_vectors)
        records.reverse()
        result: dict[str, Any] = {"records": self._wire(records, params)}
        if asked:
            result["cursor"] = cursor
        return self._with_prompt(result, records, options, True)

    async def forget(self, params: dict[str, Any], ctx: Context) -> dict[str, Any]:
        self._check_tier(params)
        scope = self._scope(params, ctx, ids_field=True)
        query = query_param(params)
        if scope.is_empty_selector() and not query and not params.get("where"):  # where: {tier: <this>} selects all
            raise invalid("forget needs a selector (ids, query, where, key_prefix, after or before)")
        with self.engine():
            if query:
                count = await self._forget_matches(scope, query)
            else:
                count = await self.store.delete(scope)
        if self._writes_visible():  # else told when readers no longer see them
            await self.events.emit("forgotten", scope.owner, count=count, tier=self.name)
        return {"forgotten": count}

    async def _forget_matches(self, scope: Scope, query: str) -> int:
        """Delete every record in scope that holds a query term, a ranked page at a time: a full page
        may hide more matches below it (one page, then the count, silently stopped at 1,000)."""
        wanted = query_terms(query)
        count = 0
        while True:
            found = await self.store.search(scope, text=query, vector=None, limit=FORGET_BY_QUERY_LIMIT)
            # Only records that hold a query term: a ranking may also return records it finds
            # related (episodic lends a hit's score to its session neighbours, decision 21), which
            # a recall should show and a forget must not delete.
            ids = [r.id for r in found if not wanted.isdisjoint(tokenize(r.content))]
            gone = await self.store.delete(Scope(owner=scope.owner, ids=ids)) if ids else 0
            count += gone
            if len(found) < FORGET_BY_QUERY_LIMIT or not gone:  # the last page, or one that changed nothing
                return count

    # ---- tiers, salience, sessions, keys -------------------------------------

    async def promote(self, params: dict[str, Any], ctx: Context) -> dict[str, Any]:
        ids_param(params)  # validated: the ids already live in the only tier here
        tier = params.get("tier")
        if not isinstance(tier, str):
            raise invalid("tier is required", field="tier")
        self._check_tier(params)
        ctx.owner(params)
        salience = params.get("salience")
        if salience is not None and (not isinstance(salience, (int, float)) or isinstance(salience, bool)
                                     or not 0 <= salience <= 1):
            raise invalid("salience must be a number in [0, 1]", field="salience")
        return {"promoted": 0}  # the ids already live in the only tier here

    async def consolidate(self, params: dict[str, Any], ctx: Context) -> dict[str, Any]:
        owner = ctx.owner(params)
        with self.engine():
            count = await self.store.count(owner)
        result = {"moved": 0, "promoted": 0, "dropped": 0, "summarized": 0, "counts": {self.name: count}}
        await self.events.emit("consolidated", owner, tier=self.name, moved=0, promoted=0, dropped=0, summarized=0)
        return result

    async def reinforce(self, params: dict[str, Any], ctx: Context) -> dict[str, Any]:
        ids = ids_param(params)
        owner = ctx.owner(params)
        amount = amount_param(params)
        with self.engine():
            count = await self.store.reinforce(owner, ids, amount)
        return {"reinforced": count}

    async def session_list(self, params: dict[str, Any], ctx: Context) -> dict[str, Any]:
        owner = ctx.owner(params)
        with self.engine():
            sessions = await self.store.sessions(owner)
        return {"sessions": [
            {"session": s.session, "records": s.records, "tiers": {self.name: s.records},
             "opened_at": s.opened_at, "touched_at": s.touched_at} for s in sessions
        ]}

    async def session_close(self, params: dict[str, Any], ctx: Context) -> dict[str, Any]:
        session = required_str(params, "session")
        owner = ctx.owner(params)
        with self.engine():
            known = await self.store.select(Scope(owner=owner, where={"session": session}), limit=1)
            count = await self.store.count(owner)
        if known:  # closing an unknown session is a no-op (the protocol): nothing happened to tell
            await self.events.emit("session_closed", owner, session=session)
        return {"moved": 0, "promoted": 0, "dropped": 0, "summarized": 0, "counts": {self.name: count},
                "closed": session, "flushed": 0}

    async def fetch(self, params: dict[str, Any], ctx: Context) -> dict[str, Any]:
        key = required_str(params, "key")
        owner = ctx.owner(params)
        with_vectors = bool_param(params, "embeddings", False)
        with self.engine():
            found = await self.store.get_keys(owner, [key])
            record = found.get(key)
            if record is not None and with_vectors:
                full = await self.store.get(owner, [record.id], with_embeddings=True)
                record = full[0] if full else record
        return {"record": None if record is None else self._wire([record], params)[0]}

    # ---- summarize -------------------------------------------------------------

    async def summarize(self, params: dict[str, Any], ctx: Context) -> dict[str, Any]:
        self._check_tier(params)
        self._check_tier(params, "into")
        scope = self._scope(params, ctx, ids_field=True)
        query = query_param(params)
        key = str_param(params, "key")
        if key == "":  # as remember and fetch answer it: an empty key is no address, not "no key"
            raise invalid("key must not be empty", field="key")
        if scope.is_empty_selector() and not query and params.get("tier") is None and not params.get("where"):
            raise invalid("summarize needs a selector (ids, query, tier, where or key_prefix)")
        limit = limit_param(params, self.limits, 50)

        def replaced(record: Record) -> bool:  # the summary this call replaces: no source of its next revision
            return record.key == key and "summary_of" in (record.metadata or {})

        with self.engine():
            if limit == 0:  # no limit (no max_recall_limit declared): every record in scope
                limit = max(await self.store.count(scope.owner), 1)
            wanted = limit + 1 if key else limit  # room for the summary at `key`, which takes no source's place
            if query:
                found = [r for r in await self.store.search(scope, text=query, vector=None, limit=wanted)
                         if not (key and replaced(r))][:limit]
                # Told in the order they were written, as timeline replays them: records written in
                # one call share their created_at, and a ranking says nothing of their order.
                sources = await self.store.select(Scope(owner=scope.owner, ids=[r.id for r in found]),
                                                  order="asc", limit=len(found)) if found else []
            else:
                newest = await self.store.select(scope, order="desc", limit=wanted)
                sources = [r for r in newest if not (key and replaced(r))][:limit][::-1]
        if key:
            held = next((r for r in sources if r.key == key), None)
            if held is not None:  # writing there would replace, so delete, one of the sources
                raise invalid(f"key {key!r} holds {held.id}, one of the records summarised; a summary never "
                              "replaces its sources: choose another key", field="key", id=held.id)
        max_len = self.limits.get("max_content_length")
        text = extract_summary(sources, max_chars=min(SUMMARY_CHARS, max_len) if max_len else SUMMARY_CHARS)
        if not text:
            return {"records": [], "read": len(sources), "written": 0}
        record: dict[str, Any] = {"content": text, "role": "memory",
                                  "metadata": {"summary_of": [r.id for r in sources]}}
        if key:
            record["key"] = key
        written = await self.remember({"records": [record], "owner": scope.owner}, Context(principal=None))
        with self.engine():
            stored = await self.store.get(scope.owner, written["ids"])
        return {"records": self._wire(stored, params), "read": len(sources), "written": 1}


def cursor_tag(name: str, kind: str) -> str:
    """What a tier's cursors carry of the tier: another tier's position means nothing here (a
    working tier's sequence is not episodic's), and taken, it answered a page from a place no
    record holds. Replicas of a tier share its name, so each takes the others' cursors."""
    return hashlib.sha256(f"{kind}\x00{name}".encode()).hexdigest()[:8]


def cursor_param(params: Mapping[str, Any], tag: str) -> Position | None:
    """A timeline's `cursor`: `true` asks for the first page (None: no bound), a string for the page
    before the position a previous answer of this tier named. Anything else is `-32602`: a cursor is
    only ever one a timeline of this tier made."""
    value = params.get("cursor")
    if value is True:
        return None
    if isinstance(value, str):
        mark, _, position = value.partition("|")
        if mark != tag and len(mark) == len(tag) and set(mark) <= set("0123456789abcdef") and position.count("|") >= 2:
            raise invalid("cursor was made by another tier than this one: page each tier with its own cursors",
                          field="cursor")
        stamp, _, rest = position.partition("|")
        seq, _, record_id = rest.partition("|")
        try:
            if (mark == tag and seq.isascii() and seq.isdigit() and len(seq) <= 18 and record_id
                    and "\x00" not in record_id and format_ts(parse_ts(stamp)) == stamp):
                return stamp, int(seq), record_id
        except A2MError:
            pass
    raise invalid("cursor must be true or the cursor of a previous timeline answer", field="cursor")


def make_cursor(position: Position, tag: str) -> str:
    """Opaque to callers; here `<tier tag>|<created_at>|<sequence>|<id>`, read back by `cursor_param`.

    The sequence is written at `cursor_param`'s 18 digits, whatever its value: it counts every
    owner's writes, and a cursor sealed by the router is as long as what it seals (decision 167)."""
    return f"{tag}|{position[0]}|{position[1]:018d}|{position[2]}"
