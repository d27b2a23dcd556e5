"""The read path: recall, timeline and fetch across the federation.

A read asks every tier it covers at once and fuses what they answer (`fusion.py`); a tier that
fails or is down is left out and named in `degraded` (decision 14), never fails the read. A read
of several tiers that a move overlapped is asked again (`settled`, decision 70). A recall works
on each tier's reply as it arrives (decision 31), counts what it returned toward promotion
(decision 9), and a timeline pages a tier past its own cap (decision 92) or passes one tier's cursor
(decision 120).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable, Mapping, Sequence, TypeVar

from a2m import errors, prompt as prompts
from a2m.client import Unavailable
from a2m.dispatch import Context
from a2m.embedder import Embedder, try_embed
from a2m.errors import A2MError, invalid
from a2m.paging import CrowdedMillisecond, TiersDown, pages_backwards
from a2m.params import bool_param, limit_param, min_score_param, query_param, required_str
from a2m.records import Record, validate_embedding

from . import fusion
from .config import RouterConfig
from .cursors import Cursors, CursorSeal
from .federation import FanOut, Federation, Tier
from .policy import Policy
from .scope import VectorWidth, scope_params, scope_tiers, settle_tier, with_owner
from .walk import PerTier, walk_page

log = logging.getLogger("a2m.router")

DEFAULT_RECALL_LIMIT = 10
T = TypeVar("T")


def _anything(answer: Any) -> bool:
    """Any answer may lack a moving record (a recall cannot tell what it did not see)."""
    return True


async def settled(policy: Policy, owner: str | None, tiers: Sequence[Tier], read: Callable[[], Awaitable[T]],
                  missed: Callable[[T], bool] = _anything) -> T:
    """`read`'s answer (it asks `tiers` at once) with no record of `owner`'s missed for moving.

    A move writes its destination, then deletes its source: a read that asked the destination
    before the write and the source after the delete saw neither copy. That needs the delete
    to have been sent while the read was out (`Policy.moves_seen`), which the read checks
    after its answer rather than by taking a lock: reads are the hot path, and one that no
    move overlapped pays two list lookups. If one was and `missed(answer)` says the answer
    may lack something, the read is asked again; if a move overlapped that one too, once more
    under the owner lock, where none is in flight. A record seen in both tiers (between write
    and delete) is the callers' to dedupe by id, as they do."""
    if len(tiers) < 2:
        return await read()  # one tier: a record that left it is gone from what it covers
    for _ in range(2):
        seen = policy.moves_seen(owner)
        answer = await read()
        if policy.moves_seen(owner) == seen or not missed(answer):
            return answer
    # This router's lock alone: `moves_seen` counts this router's moves, so theirs are what the third
    # read must not overlap; the replicas' lock (lock_url) would make a read fail with its store.
    # Named while held: the lock map is weak, and an OwnerLock nothing refers to leaves it, so a move
    # begun meanwhile would take a new one and not wait for this read.
    lock = policy.owner_lock(owner)
    async with lock.here:
        return await read()


class Reads:
    """recall, timeline and fetch; `degraded(out, fan)` names (and counts) the tiers `fan` left out."""

    def __init__(self, fed: Federation, policy: Policy, config: RouterConfig, embedder: Embedder | None,
                 width: VectorWidth, limits: Mapping[str, int], *, spawn: Callable[[Any], Any],
                 degraded: Callable[[dict[str, Any], FanOut], dict[str, Any]]) -> None:
        self.fed = fed
        self.policy = policy
        self.config = config
        self.embedder = embedder
        self.width = width
        self.limits = limits
        self.spawn = spawn
        self.degraded = degraded
        # `Router.take_tokens` may widen the tokens, and seals again
        self.cursors = Cursors(CursorSeal.of(config.tokens, config.service_token, config.cursor_secret))

    async def recall(self, params: dict[str, Any], ctx: Context) -> dict[str, Any]:
        tiers = scope_tiers(self.fed, params)  # before the owner, as a tier server checks its `tier` first
        owner = ctx.owner(params)
        scope = scope_params(params, owner)
        limit = limit_param(params, self.limits, DEFAULT_RECALL_LIMIT)
        asked_vectors = bool_param(params, "embeddings", False)
        touch = bool_param(params, "touch", True)
        query = query_param(params)
        min_score = min_score_param(params)
        options = prompts.parse(params.get("prompt"))
        strategy = self.config.fusion.strategy if params.get("fusion") is None else params["fusion"]
        if strategy not in ("rrf", "rerank"):
            raise invalid("fusion must be rrf or rerank", field="fusion")
        vector = params.get("embedding")
        if vector is not None:
            vector = validate_embedding(vector)
            await self.width.check([vector])
        elif query and self.embedder is not None and any(t.searched for t in tiers):
            embedded = await try_embed(self.embedder, [query])  # once per recall, for every searched tier
            vector = embedded[0] if embedded else None
        def takes_vector(tier: Tier) -> bool:
            """A searched tier, unless it holds vectors of another width (a mounted corpus embedded by
            another model): asked the query alone, that one ranks by text. A tier the caller named
            with a vector of its own gets it anyway: its -32008 is the answer to that."""
            fits = vector is None or not tier.dimensions or tier.dimensions == len(vector)
            named = params.get("tier") is not None and params.get("embedding") is not None
            return tier.searched and (fits or named)

        if not query and vector is not None and params.get("tier") is None:
            tiers = [t for t in tiers if takes_vector(t)]  # the others would answer with their newest records
        pool = limit if strategy == "rrf" else max(limit, self.config.fusion.pool)
        base = {**scope, "touch": False, "embeddings": asked_vectors or (strategy == "rerank" and vector is not None)}
        if query:
            base["query"] = query

        def per_tier(tier: Tier) -> dict[str, Any] | None:
            cap = tier.limit("max_recall_limit")
            out = {**base, "limit": min(pool, cap) if cap else pool}
            if vector is not None and takes_vector(tier):
                out["embedding"] = vector
            return settle_tier(out, tier)

        tokenize = strategy == "rerank" and bool(query)
        fan, lists = await settled(self.policy, owner, tiers,
                                   lambda: ask_recall(self.fed, tiers, per_tier, tokenize))
        for error in fan.errors.values():
            # The caller's vector is at fault, not the tier; a query the router embedded leaves the
            # tier out (`degraded`) instead: its width was not known yet (vectors it took since).
            if error.code == errors.EMBEDDING_MISMATCH and params.get("embedding") is not None:
                raise error
        depth, apart = self.fed.depths, self.fed.apart()
        if not query and vector is None:
            fused = fusion.recency(lists, depth, apart=apart, limit=limit, min_score=min_score)
        elif strategy == "rerank":
            fc = self.config.fusion
            fused = fusion.rerank(lists, query=query, vector=vector, weights=fc.weights,
                                  half_life_days=fc.half_life_days, depth=depth, apart=apart, limit=limit,
                                  min_score=min_score)
        else:
            fused = fusion.rrf(lists, k=self.config.fusion.rrf_k, depth=depth, apart=apart, limit=limit,
                               min_score=min_score)
        if fused and touch:
            by_tier: dict[str, list[str]] = {}
            for record in fused:
                by_tier.setdefault(record.tier or "", []).append(record.id)
            if not self.config.background_promotion:
                await self.policy.recalled(owner, by_tier)
            elif self.policy.count_later(owner, by_tier):
                self.spawn(self.policy.flush_counts())
        result: dict[str, Any] = {"records": [r.to_wire(embeddings=asked_vectors) for r in fused]}
        self.degraded(result, fan)
        if options is not None:
            written = await written_order(self.fed, self.policy, owner, fused, options)
            result.update(prompts.render(fused, options, ordered_by_time=False, written=written))
        return result

    async def timeline(self, params: dict[str, Any], ctx: Context) -> dict[str, Any]:
        tiers = scope_tiers(self.fed, params)  # before the owner, as a tier server checks its `tier` first
        owner = ctx.owner(params)
        scope = scope_params(params, owner)
        limit = limit_param(params, self.limits, self.limits.get("max_recall_limit") or 0)
        options = prompts.parse(params.get("prompt"))
        asked_vectors = bool_param(params, "embeddings", False)
        asked = {**scope, "limit": limit, "embeddings": asked_vectors}

        def per_tier(tier: Tier) -> dict[str, Any] | None:
            cap = tier.limit("max_recall_limit")
            return settle_tier({**asked, "limit": min(limit, cap) if cap else limit}, tier)

        result: dict[str, Any]
        if len(tiers) != 1:
            result = await self._walk(params, tiers, per_tier, owner, limit)
        else:
            result = await self._one_tier(params, tiers[0], per_tier, owner, limit)
        wire = result["records"]
        if options is not None:
            records = [Record.from_wire(r) for r in wire]
            result.update(prompts.render(records, options, ordered_by_time=True))
        return result

    async def _one_tier(self, params: dict[str, Any], tier: Tier, per_tier: PerTier, owner: str | None,
                        limit: int) -> dict[str, Any]:
        """A timeline of one tier: its cursor passed down and back, else its newest `limit` records."""
        cursor = self.cursors.down(params, tier, owner)

        def with_cursor(tier: Tier) -> dict[str, Any] | None:
            asked = per_tier(tier)
            return None if asked is None else {**asked, "cursor": cursor}

        if cursor is None:
            fan = await ask_timeline(self.fed, [tier], per_tier, limit)
        else:  # the tier's page as it answered it (it may hold fewer than `limit`: its cursor says more)
            fan = await self.fed.fan_out("memory/timeline", {}, [tier], per_tier=with_cursor)
        wire = merge_by_time(self.fed, fan.results)
        result: dict[str, Any] = {"records": wire[-limit:] if limit else wire}
        self.degraded(result, fan)
        if cursor is not None:
            self.cursors.up(result, fan, tier.name, owner)
        return result

    async def _walk(self, params: dict[str, Any], tiers: list[Tier], per_tier: PerTier, owner: str | None,
                    limit: int) -> dict[str, Any]:
        """A timeline of several tiers: merged, and a page of a walk where a cursor is asked (`walk.py`)."""
        positions = self.cursors.positions(params, tiers, owner)
        if positions is None:
            fan = await settled(self.policy, owner, tiers, lambda: ask_timeline(self.fed, tiers, per_tier, limit))
            pages, after = {name: r.get("records", []) for name, r in fan.results.items()}, None
        else:
            pages, after, fan = await walk_page(self.fed, tiers, per_tier, positions, limit)
            for name, error in fan.errors.items():  # a tier's cursor it refused: the caller's mistake
                if error.code == errors.INVALID_PARAMS and isinstance(positions[name], str):
                    raise error
            if after is None and all(p is True for p in positions.values()):
                # No walk (a tier without the cursor extension, or not answering): the reader pages by
                # time from this page, so it must be the timeline's, each tier read past its cap.
                await read_past_caps(self.fed, fan, per_tier, limit)
                pages = {name: r.get("records", []) for name, r in fan.results.items()}
        wire = merge_by_time(self.fed, {name: {"records": records} for name, records in pages.items()})
        result: dict[str, Any] = {"records": wire[-limit:] if limit else wire}
        self.degraded(result, fan)
        if after is not None:
            result["cursor"] = self.cursors.walked(after, owner, tiers)
        return result

    async def fetch(self, params: dict[str, Any], ctx: Context) -> dict[str, Any]:
        key = required_str(params, "key")
        owner = ctx.owner(params)
        asked_vectors = bool_param(params, "embeddings", False)
        keyed = [t for t in self.fed if t.has("keys")]
        best, fan = await settled(self.policy, owner, keyed,
                                  lambda: fetch_key(self.fed, key, owner, asked_vectors, keyed),
                                  missed=lambda found: found[0] is None)  # a key found is no miss
        out: dict[str, Any] = {"record": None if best is None else best.to_wire(embeddings=asked_vectors)}
        self.degraded(out, fan)
        return out


async def written_order(fed: Federation, policy: Policy, owner: str | None, records: Sequence[Record],
                        options: dict[str, Any] | None = None) -> list[str] | None:
    """For a recall's transcript prompt (`options`), or a query's summary (none): the records' ids
    in the order timeline shows them, which their `created_at` alone does not tell for records
    written in one call (each tier ranked them by relevance). Read only when two share a stamp."""
    if options is not None and (options["style"] != "transcript" or options["method"] == "none"):
        return None
    if len({r.created_at for r in records}) == len(records):
        return None
    by_tier: dict[str, list[str]] = {}
    for record in records:
        if record.tier in fed.tiers:
            by_tier.setdefault(record.tier, []).append(record.id)
    read = await asyncio.gather(*(policy.by_ids(fed[name], owner, ids) for name, ids in by_tier.items()),
                                return_exceptions=True)  # a tier that fails leaves its records in rank order
    return [r["id"] for r in merge_by_time(fed, {name: {"records": found} for name, found in zip(by_tier, read)
                                                 if not isinstance(found, BaseException)})]


async def ask_recall(fed: Federation, tiers: list[Tier], per_tier: Callable[[Tier], dict[str, Any] | None],
                     tokenize: bool) -> tuple[FanOut, dict[str, list[Record]]]:
    """One fan-out of a recall: each tier's records, parsed (and for rerank, tokenized) as its
    reply arrives, while the slower tiers still work; in tier order, not arrival order (ties
    are then stable)."""
    parsed: dict[str, list[Record]] = {}

    def arrived(name: str, result: dict[str, Any]) -> None:
        parsed[name] = records_of(result, name)
        if tokenize:
            fusion.prepare(parsed[name])

    fan = await fed.fan_out("memory/recall", {}, tiers, per_tier=per_tier, arrived=arrived)
    return fan, {name: parsed[name] for name in fan.results}


async def ask_timeline(fed: Federation, tiers: list[Tier], per_tier: Callable[[Tier], dict[str, Any] | None],
                       limit: int) -> FanOut:
    """One fan-out of a timeline, each tier asked for at most its own max_recall_limit, and read
    past it (`read_past_caps`)."""
    fan = await fed.fan_out("memory/timeline", {}, tiers, per_tier=per_tier)
    await read_past_caps(fed, fan, per_tier, limit)
    return fan


async def read_past_caps(fed: Federation, fan: FanOut, per_tier: Callable[[Tier], dict[str, Any] | None],
                         limit: int) -> None:
    """A tier in `fan` whose reply stopped at its max_recall_limit, short of `limit` (the router may
    declare more than a tier), read again backwards a page at a time (`a2m.paging`) for its newest
    `limit` records."""

    async def more(name: str, params: dict[str, Any]) -> None:
        records: list[dict[str, Any]] = []
        try:
            # No waits for a tier that is itself a router answering without some of its tiers: this
            # read is under the caller's time, so the tier is named as left out at once.
            async for page in pages_backwards(fed[name].call, params, page=params["limit"],
                                              cap=params["limit"], waits=()):
                records[:0] = page  # each page checked as every tier reply is (router/replies.py)
                if len(records) >= limit:
                    break
        except CrowdedMillisecond as exc:
            log.warning("timeline of %s: %s; the rest of them are left out", name, exc)
        except (A2MError, TiersDown) as exc:  # the first page stands; the tier is named as left out
            fan.errors[name] = exc if isinstance(exc, A2MError) else Unavailable(str(exc), {"tier": name})
            fan.degraded.append(name)
            return
        fan.results[name] = {"records": records[-limit:]}

    full = [(name, params) for name, result in fan.results.items()
            if (params := per_tier(fed[name])) is not None and params["limit"] < limit
            and len(result.get("records", [])) >= params["limit"]]
    if full:
        await asyncio.gather(*(more(name, params) for name, params in full))
        fan.degraded.sort(key=fed.order.index)


def merge_by_time(fed: Federation, results: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Ascending by created_at; equal stamps keep each tier's order, deeper tiers (older by
    construction: records only move down) first. Duplicate ids keep the newer revision, then the
    deeper copy (as fetch and repair do), except in a tier apart (`Federation.apart`: its ids are
    its own). Works on the tiers' wire records as they came (a session replay can be thousands)."""
    keyed: dict[Any, tuple[tuple[str, int, int, int], tuple[int, int], dict[str, Any]]] = {}
    apart = fed.apart()
    for name, result in results.items():
        shallow, order = fed.timeline_place(name)
        for position, record in enumerate(result.get("records", [])):
            record["tier"] = name
            rank = (int(record.get("revision") or 1), -shallow)
            identity = (name, record["id"]) if name in apart else record["id"]
            held = keyed.get(identity)
            if held is None or rank > held[1]:
                keyed[identity] = ((record["created_at"], shallow, order, position), rank, record)
    return [r for _, _, r in sorted(keyed.values(), key=lambda p: p[0])]


async def fetch_key(fed: Federation, key: str, owner: str | None, asked_vectors: bool,
                    tiers: list[Tier]) -> tuple[Record | None, FanOut]:
    """The key's record (the highest revision, then the deepest tier) and the fan-out it came from."""
    fan = await fed.fan_out("memory/fetch", with_owner({"key": key, "embeddings": asked_vectors}, owner), tiers)
    depth = fed.depths
    best: Record | None = None
    for name, result in fan.results.items():
        if result.get("record") is None:
            continue
        record = Record.from_wire(result["record"]).with_(tier=name)
        if best is None or (record.revision, depth.get(name, 0)) > (best.revision, depth.get(best.tier or "", 0)):
            best = record
    return best, fan


def records_of(result: Mapping[str, Any], tier: str) -> list[Record]:
    """A tier's wire records as Records placed in `tier`."""
    return [Record.from_wire(wire, tier=tier) for wire in result.get("records", [])]

