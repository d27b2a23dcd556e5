"""The router's A2M surface: every method of the protocol, across the federation.

The router stores nothing itself except its event log and the recall counts
that earn promotion: records live in the tiers, and everything here is
routing (where a write lands, which tiers a read covers), policy (capacity,
spill, promotion, session flush: `policy.py`) and fusion (`fusion.py`).
Owner scoping is the dispatcher's `Context.owner`: over authenticated HTTP the
principal is the owner, and it is passed to every tier as `owner` (the tiers
trust the router's service token to name owners).
"""

from __future__ import annotations

import asyncio
import logging
import re
from typing import Any, Awaitable, Callable, Iterable, Mapping, Sequence, TypeVar

from a2m import errors, prompt as prompts
from a2m.capabilities import CAPABILITIES
from a2m.client import Unavailable
from a2m.dispatch import Context, Handler, bound_handlers
from a2m.embedder import close_embedder, make_embedder, try_embed, try_embed_into
from a2m.errors import A2MError, invalid
from a2m.events import EventLog, EventMethods
from a2m.filters import parse_scope, test_matches
from a2m.http import LATENCY_BUCKETS, HTTPSettings
from a2m.paging import CrowdedMillisecond, pages_backwards
from a2m.records import Record, parse_write, supplied_history, validate_embedding
from a2m.summarize import SUMMARY_CHARS, summarize as extract_summary
from a2m.timefmt import now
from a2m.params import bool_param, ids_param, int_param, query_param, str_param

from . import fusion
from .config import RouterConfig, load, unenforced
from .federation import FanOut, Federation, Tier
from .policy import Policy, Refusals

log = logging.getLogger("a2m.router")

# How long /readyz (its ready and health share one wait) and a /metrics scrape wait for the probes of
# tiers: a Kubernetes readiness probe gives up after 2 s (deploy/k8s), Prometheus after 10.
PROBE_WAIT = 0.75
# A tier that is up but has given no good answer for this long is probed by the next check (/readyz,
# a scrape): only a failed call marks a tier down, and an idle router makes none. A busy router hears
# from its tiers in every call, so its checks add no calls.
HEARD_WITHIN = 5.0

DEFAULT_RECALL_LIMIT = 10
TAKE_BACK_PAUSE = 0.5  # before forgetting again what a tier the router stopped waiting for had not applied yet
SCOPE_PARAMS = ("where", "key_prefix", "after", "before")
T = TypeVar("T")


def _anything(answer: Any) -> bool:
    """Any answer may lack a moving record (a recall cannot tell what it did not see)."""
    return True


def _with_owner(params: dict[str, Any], owner: str | None) -> dict[str, Any]:
    if owner is not None:
        params["owner"] = owner
    return params


def _settle_tier(params: dict[str, Any], tier: Tier, *, keep: bool = False) -> dict[str, Any] | None:
    """`params` for `tier` with `where.tier` answered here, by the router's name for the tier (the name
    its records show): a tier server tests it against its own name, which router.toml need not share.
    None when the tier holds nothing that could match: it is not asked. A read drops the test (an
    index answers the rest); with `keep` (forget) it goes down as the server's own name, which alone
    in `where` still selects the whole tier there."""
    where = params.get("where")
    if not isinstance(where, dict) or "tier" not in where:
        return params
    if not test_matches(True, tier.name, where["tier"]):
        return None
    if keep:
        own = (((tier.info or {}).get("tiers") or [{}])[0]).get("name", tier.name)
        return {**params, "where": {**where, "tier": own}}
    rest = {k: v for k, v in where.items() if k != "tier"}
    return {**{k: v for k, v in params.items() if k != "where"}, **({"where": rest} if rest else {})}


def _batch_owner(records: Sequence[Record], owner: str | None) -> str | None:
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


def _in_caller_batch(exc: A2MError, indexes: list[int]) -> A2MError:
    """A tier's error about records[k] of the part of the batch it was sent, about the caller's record."""
    data = exc.data if isinstance(exc.data, dict) else None
    k = data.get("index") if data else None
    if not isinstance(k, int) or not 0 <= k < len(indexes):
        return exc
    message = re.sub(rf"\brecords\[{k}\]", f"records[{indexes[k]}]", exc.message)
    return A2MError(exc.code, message, {**data, "index": indexes[k]})


def _told_plainly(handler: Handler) -> Handler:
    """`handler` whose failures name a tier that failed, never how it failed: an unreachable tier's
    error carries its URL, and a tier's own -32603 its engine's words (a PostgreSQL host and user,
    a Redis socket or git repository path). Those are for the operator, in the router's log; a
    caller, who may be any agent holding a token, is told which tier and that it was unavailable."""
    async def told(params: dict[str, Any], ctx: Context) -> dict[str, Any]:
        try:
            return await handler(params, ctx)
        except A2MError as exc:
            data = exc.data if isinstance(exc.data, dict) else None
            if exc.code != errors.INTERNAL_ERROR or data is None or not ({"url", "engine"} & data.keys()):
                raise
            tier = data.get("tier")
            log.warning("answered a caller that tier %s was unavailable: %s", tier, exc.message)
            kept = {k: v for k, v in data.items() if k not in ("url", "engine")}
            raise A2MError(exc.code, f"tier {tier} unavailable (the router's log has the cause)", kept) from None

    return told


class Router(EventMethods):
    """An A2M service whose storage is other A2M servers."""

    def __init__(self, config: RouterConfig, *, client_factory: Any = None) -> None:
        self.config = config
        self.name = config.name
        self.capabilities = frozenset(CAPABILITIES)
        self.limits = dict(config.limits)
        self.fed = Federation(config, client_factory)
        self.events = EventLog(config.events_capacity)
        self.embedder = make_embedder(config.embedder, model=config.embedder_model)
        self.policy = Policy(self.fed, embedder=self.embedder, emit=self._emit)
        self._dims: int | None = getattr(self.embedder, "dimensions", None)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._probes: dict[str, asyncio.Task[Any]] = {}  # tier -> its describe in flight (`_probe`)
        self._depths: dict[str, int] | None = None

    # ---- plumbing ----------------------------------------------------------------

    def http_settings(self) -> HTTPSettings:
        """Bearer tokens -> principals and allowed origins from the config (for the HTTP binding)."""
        return HTTPSettings(allowed_origins=self.config.allowed_origins, tokens=dict(self.config.tokens))

    async def startup(self) -> None:
        logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per tier call otherwise
        await self.fed.start()
        for line in unenforced(self.config.tiers):
            log.warning(line)
        width = getattr(self.embedder, "dimensions", None)  # an HTTP embedder's is known after first use
        for tier in self.fed:
            if width and tier.searched and tier.dimensions and tier.dimensions != width:
                log.warning("tier %s holds %d-dim vectors and the embedder makes %d: %s is recalled by text "
                            "alone (embed it with the router's model to search it by vector)",
                            tier.name, tier.dimensions, width, tier.name)

    async def shutdown(self) -> None:
        await self.drain()
        await self.fed.close()
        await close_embedder(self.embedder)

    async def ready(self) -> bool:
        """The default tier answers. Every tier due a probe (`_probe`) is probed first, within one
        PROBE_WAIT: /readyz then reads the others' verdicts from health() without a second wait."""
        await self._probe(list(self.fed))
        return self.fed[self.config.default_tier].healthy

    def spawn(self, coro: Any) -> asyncio.Task[Any]:
        """Run `coro` in the background, held until it ends and drained at shutdown."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def drain(self) -> None:
        """Wait for every background task (at shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    def _degraded(self, out: dict[str, Any], fan: FanOut) -> dict[str, Any]:
        """`out` naming the tiers `fan` left out, each counted in `a2m_router_degraded_calls`."""
        if fan.degraded:
            out["degraded"] = fan.degraded
            counter = getattr(self, "_degraded_calls", None)
            if counter is not None:
                for name in fan.degraded:
                    counter.labels(name).inc()
        return out

    async def _emit(self, kind: str, owner: str | None, **fields: Any) -> None:
        await self.events.emit(kind, owner, **fields)

    def handlers(self) -> dict[str, Handler]:
        return {method: _told_plainly(handler) for method, handler in bound_handlers(self).items()}

    def register_metrics(self, registry: Any) -> None:
        """Policy and health on the router's /metrics, beside the binding's request counts."""
        from prometheus_client import Counter, Gauge

        moved = Counter("a2m_router_moved_records", "records moved between tiers", ["reason", "source", "dest"],
                        registry=registry)
        self.policy.observe_move = lambda reason, source, dest, n: moved.labels(reason, source, dest).inc(n)
        dropped = Counter("a2m_router_dropped_records", 'records deleted over capacity (retention = "drop")',
                          ["tier"], registry=registry)
        self.policy.observe_drop = lambda tier, n: dropped.labels(tier).inc(n)
        self._degraded_calls = Counter("a2m_router_degraded_calls", "calls that left a tier out", ["tier"],
                                 registry=registry)
        up = Gauge("a2m_router_tier_up", "1 while the router reaches the tier", ["tier"], registry=registry)
        for name in self.fed.order:  # the tiers themselves exist only once the federation starts
            up.labels(name).set_function(
                lambda name=name: 1.0 if name in self.fed.tiers and self.fed.tiers[name].healthy else 0.0)
        self.fed.observe_calls(_tier_call_metrics(registry))

    async def _probe(self, tiers: Sequence[Tier]) -> None:
        """Describe again each of `tiers` that is down with its backoff run out, or up but not heard
        from within HEARD_WITHIN s, waiting at most PROBE_WAIT s: otherwise a tier that came back
        (or came up after the router: `a2m up` starts them together) reads "down", and one that died
        while nothing called it reads "up", in /readyz and `tier_up` until some request happens to
        reach it; a scrape or a readiness check may be a quiet router's only traffic. A slower probe
        (a hung tier) goes on in the background, one per tier at a time; a later check reads its
        verdict (waiting for it, /readyz took the tier's whole timeout, past a readiness probe's 2 s)."""
        for tier in tiers:
            due = tier.unheard(HEARD_WITHIN) or (not tier.healthy and tier.available())
            if due and tier.name not in self._probes:
                task = self._probes[tier.name] = self.spawn(tier.refresh())
                task.add_done_callback(lambda _, name=tier.name: self._probes.pop(name, None))
        waiting = [self._probes[t.name] for t in tiers if t.name in self._probes]
        if waiting:
            await asyncio.wait(waiting, timeout=PROBE_WAIT)

    async def before_scrape(self) -> None:
        """`tier_up` on /metrics as fresh as /readyz: due tiers are probed first (`_probe`)."""
        await self._probe(list(self.fed))

    async def health(self) -> dict[str, Any]:
        """Per-tier status for /readyz, which asks ready() first: its probes are the ones read here."""
        return {"tiers": {t.name: ("up" if t.healthy else "down") for t in self.fed}}

    # ---- helpers ---------------------------------------------------------------------

    def _tier(self, name: Any, field: str = "tier") -> Tier:
        if not isinstance(name, str):
            raise invalid(f"{field} must be a string (a tier's name)", field=field)
        if name not in self.fed.tiers:
            raise A2MError(errors.UNKNOWN_TIER, f"unknown {field} {name!r}", {"tier": name, "tiers": self.fed.order})
        return self.fed[name]

    def _scope_tiers(self, params: Mapping[str, Any]) -> list[Tier]:
        if params.get("tier") is None:
            return list(self.fed)
        return [self._tier(params["tier"])]

    def _limit(self, params: Mapping[str, Any], default: int) -> int:
        limit = int_param(params, "limit", default)
        assert limit is not None
        cap = self.limits.get("max_recall_limit")
        if cap:
            if limit == 0:
                return cap
            if limit > cap:
                raise invalid(f"limit exceeds max_recall_limit ({cap})", field="limit", max=cap)
        return limit

    def _depth(self) -> dict[str, int]:
        if self._depths is None:  # the layout is fixed at start
            self._depths = {name: self.fed.depth(name) for name in self.fed.order}
        return self._depths

    def dimensions(self) -> int | None:
        """The federation's vector width: the embedder's when one is configured (its vectors are the
        ones the tiers hold), else the first tier that reports one, else the first vector written."""
        width = getattr(self.embedder, "dimensions", None)
        if width:
            return width
        if self._dims is None:
            for tier in self.fed:
                if tier.dimensions:
                    self._dims = tier.dimensions
                    break
        return self._dims

    async def _check_width(self, vectors: Sequence[list[float]]) -> None:
        if not vectors:
            return
        if self.embedder is not None and not getattr(self.embedder, "dimensions", None):
            await try_embed(self.embedder, ["dimensions"])  # an HTTP embedder learns its width on first use
        widths = {len(v) for v in vectors}
        expected = self.dimensions() or next(iter(widths))
        if widths != {expected}:
            raise A2MError(errors.EMBEDDING_MISMATCH, f"embeddings in this federation have {expected} dimensions",
                           {"expected": expected, "got": sorted(widths)})

    def _scope_params(self, params: Mapping[str, Any], owner: str | None) -> dict[str, Any]:
        """Validate the scope selectors once, here, and pass them down verbatim."""
        parse_scope(params, owner)
        out = {name: params[name] for name in SCOPE_PARAMS if params.get(name) is not None}
        return _with_owner(out, owner)

    async def _settled(self, owner: str | None, tiers: Sequence[Tier], read: Callable[[], Awaitable[T]],
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
            seen = self.policy.moves_seen(owner)
            answer = await read()
            if self.policy.moves_seen(owner) == seen or not missed(answer):
                return answer
        async with self.policy.owner_lock(owner):
            return await read()

    @staticmethod
    def _records(result: Mapping[str, Any], tier: str) -> list[Record]:
        """A tier's wire records as Records placed in `tier`."""
        return [Record.from_wire(wire, tier=tier) for wire in result.get("records", [])]

    # ---- remember --------------------------------------------------------------------

    async def remember(self, params: dict[str, Any], ctx: Context) -> dict[str, Any]:
        owner = ctx.owner(params)
        raw_records = params.get("records")
        if not isinstance(raw_records, list) or not raw_records:
            raise invalid("records must be a non-empty array", field="records")
        cap = self.limits.get("max_records_per_call")
        if cap and len(raw_records) > cap:
            raise invalid(f"at most {cap} records per call", field="records", max=cap)
        return {"ids": await self.write(raw_records, owner)}

    async def write(self, raw_records: list[Any], owner: str | None, *, tier: str | None = None) -> list[str]:
        """Validate a batch, route each record, write, then enforce capacity where it landed.

        `tier` is where records without a `tier` of their own go unless their key or group
        already lives somewhere (a record's own `tier` must then agree with that place)."""
        stamp = now()
        records = [parse_write(raw, i, owner=owner, stamp=stamp) for i, raw in enumerate(raw_records)]
        owner = _batch_owner(records, owner)
        max_len = self.limits.get("max_content_length")
        targets: list[Tier] = []
        for i, record in enumerate(records):
            if max_len and len(record.content) > max_len:
                raise invalid(f"records[{i}].content exceeds max_content_length ({max_len})", index=i, max=max_len)
            target = self._tier(record.tier or tier or self.config.default_tier)
            if not target.writable:
                raise A2MError(errors.READ_ONLY, f"tier {target.name} is read-only", {"tier": target.name, "index": i})
            targets.append(target)
        await self._check_width([r.embedding for r in records if r.embedding is not None])
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
        ids: list[str | None] = [None] * len(records)
        supplied = [r.id for r, w in zip(records, raw) if w.get("id") is not None]
        history = [supplied_history(w) for w in raw]
        revisions, existing = await self._route(records, targets, supplied, history, owner)
        # A client-supplied id that exists anywhere in the federation is idempotent: returned, not rewritten.
        for i, (record, w) in enumerate(zip(records, raw)):
            if w.get("id") is not None and record.id in existing:
                ids[i] = record.id
        by_tier: dict[str, list[int]] = {}
        for i, target in enumerate(targets):
            if ids[i] is None:
                by_tier.setdefault(target.name, []).append(i)
        # Tiers where keys are replaced go last: new records elsewhere can be undone if a later tier
        # refuses its part, a replacement cannot.
        order = sorted(by_tier, key=lambda name: any(i in revisions for i in by_tier[name]))
        written: list[tuple[Tier, list[str]]] = []
        for name in order:
            indexes = by_tier[name]
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
                result = await tier.call("memory/remember", _with_owner({"records": batch}, owner))
            except A2MError as exc:
                # Cut off (timed out, connection lost after the request went): the tier may still apply its
                # part, so what the router sent it is taken back too. A refusal wrote nothing there. A key
                # replaced there is left, as in a tier that answered: its id is the earlier revision's.
                sent = [b["id"] for i, b in zip(indexes, batch) if i not in revisions] \
                    if isinstance(exc, Unavailable) else []
                await self._compensate(written, owner, cut_off=(tier, sent))  # all or nothing, as far as we can
                raise _in_caller_batch(exc, indexes) from None
            new_ids = result["ids"]
            for i, new_id in zip(indexes, new_ids):
                ids[i] = new_id
            written.append((tier, [new_id for i, new_id in zip(indexes, new_ids) if i not in revisions]))
        if self._dims is None:
            widths = [len(r.embedding) for r in records if r.embedding]
            if widths:
                self._dims = widths[0]
        # One event per record written, in the batch's order (not tier by tier: a batch that replaces a
        # key and writes a new record elsewhere told the new one first), appended together. An older
        # revision of an imported key is none: the tier kept its own, nothing was written.
        tier_of = {i: name for name, indexes in by_tier.items() for i in indexes if not self.fed[name].gated}
        await self.events.emit_many("written", owner, [
            {"id": ids[i], "tier": tier_of[i], "session": records[i].session, "key": records[i].key,
             "revision": revisions.get(i, records[i].revision) if records[i].key else None}
            for i in sorted(tier_of) if not (i in revisions and revisions[i] is None)])
        return [i for i in ids if i is not None], by_tier

    async def _route(self, records: list[Record], targets: list[Tier], supplied: list[str], history: list[bool],
                     owner: str | None) -> tuple[dict[int, int | None], set[str]]:
        """Send each record whose key or group already lives in a tier to that tier (a key is unique
        per owner across the federation and is replaced where it lives; a group never splits), in
        place in `targets`. Returns index -> the revision a key replacement will have (None: the
        record carries an older revision than the key's, which the tier keeps: decision 3), and
        which of the `supplied` ids exist somewhere already (looked up in the same round trip).

        A record that names another tier than its key's or group's is refused, as is a batch that
        would put one key, group or id in two tiers: either would leave two homes. A keyed write
        fails while a tier that may hold its key does not answer."""
        keys = sorted({r.key for r in records if r.key})
        groups = sorted({r.group for r in records if r.group})
        writable = [t for t in self.fed if t.writable]
        (holders, unreached), (homes, _), (existing, _) = await asyncio.gather(
            self._locate("key", keys, owner, [t for t in writable if t.has("keys")]),
            self._locate("group", groups, owner, writable),
            self._locate("id", supplied, owner, list(self.fed)))
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
            targets[i] = self.fed[place]
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
        return revisions, set(existing)

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
            buckets = dict.fromkeys(records[i].session for i in indexes) if tier.config.per_session else {None: None}
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

    async def _compensate(self, written: list[tuple[Tier, list[str]]], owner: str | None,
                          cut_off: tuple[Tier, list[str]] | None = None) -> None:
        """Take back a batch that a tier failed: forget the new records the tiers before it wrote
        (`written`; a replaced key is not among them, forgetting its id would delete its earlier
        revision too), and, where the failing tier's call was cut off, the ids the router sent it
        (`cut_off`), since it may apply the write after the router stopped waiting. Best effort:
        what cannot be undone is logged."""
        async def forget(tier: Tier, new_ids: list[str]) -> None:
            try:
                await tier.call("memory/forget", _with_owner({"ids": new_ids}, owner))
            except A2MError as exc:
                log.error("could not undo a partial write on %s (%s): ids %s", tier.name, exc, new_ids)

        undo = [forget(tier, new_ids) for tier, new_ids in written if new_ids]
        if cut_off is not None and cut_off[1]:
            undo.append(self._take_back(*cut_off, owner))
        await asyncio.gather(*undo)

    async def _take_back(self, tier: Tier, sent: list[str], owner: str | None) -> None:
        """Forget `sent` (ids the router assigned or the caller supplied, new in the federation) on a
        tier whose write call was cut off. Bounded: one forget under the tier's timeout; if the tier
        answers but has not every id yet, the write may still be queued behind the forget there, so
        one more after TAKE_BACK_PAUSE. A write that lands later still is left, logged."""
        found = 0
        for attempt in range(2):
            if attempt:
                await asyncio.sleep(TAKE_BACK_PAUSE)
            try:
                result = await tier.call("memory/forget", _with_owner({"ids": sent}, owner))
            except A2MError as exc:
                log.error("could not take back a write to %s that the router stopped waiting for (%s): "
                          "ids %s may be stored there", tier.name, exc, sent)
                return
            forgotten = result.get("forgotten")
            found += forgotten if isinstance(forgotten, int) else 0
            if found >= len(sent):
                log.warning("took back a write to %s that the router stopped waiting for: ids %s", tier.name, sent)
                return
        log.warning("took back %d of %d records of a write to %s that the router stopped waiting for; the rest "
                    "were not written, or are written later and stay: ids %s", found, len(sent), tier.name, sent)

    async def _locate(self, field: str, values: list[str], owner: str | None,
                      tiers: Iterable[Tier]) -> tuple[dict[str, tuple[str, dict[str, Any]]], list[str]]:
        """value -> (tier, record) for records whose `field` is one of `values` (the highest revision,
        then the deepest tier, wins), and the tiers that did not answer. No values: no call."""
        if not values:
            return {}, []
        fan = await self.fed.fan_out("memory/timeline", _with_owner(
            {"where": {field: values}, "limit": len(values) if field == "id" else 0}, owner), tiers)
        depth = self._depth()
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

    # ---- recall & timeline ---------------------------------------------------------------

    async def recall(self, params: dict[str, Any], ctx: Context) -> dict[str, Any]:
        owner = ctx.owner(params)
        tiers = self._scope_tiers(params)
        scope = self._scope_params(params, owner)
        limit = self._limit(params, DEFAULT_RECALL_LIMIT)
        asked_vectors = bool_param(params, "embeddings", False)
        touch = bool_param(params, "touch", True)
        query = query_param(params)
        min_score = params.get("min_score")
        if min_score is not None and (not isinstance(min_score, (int, float)) or isinstance(min_score, bool)):
            raise invalid("min_score must be a number", field="min_score")
        options = prompts.parse(params.get("prompt"))
        strategy = params.get("fusion", self.config.fusion.strategy)
        if strategy not in ("rrf", "rerank"):
            raise invalid("fusion must be rrf or rerank", field="fusion")
        vector = params.get("embedding")
        if vector is not None:
            vector = validate_embedding(vector)
            await self._check_width([vector])
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
            cap = ((tier.info or {}).get("limits") or {}).get("max_recall_limit")
            out = {**base, "limit": min(pool, cap) if cap else pool}
            if vector is not None and takes_vector(tier):
                out["embedding"] = vector
            return _settle_tier(out, tier)

        tokenize = strategy == "rerank" and bool(query)
        fan, lists = await self._settled(owner, tiers, lambda: self._ask_recall(tiers, per_tier, tokenize))
        for error in fan.errors.values():
            # The caller's vector is at fault, not the tier; a query the router embedded leaves the
            # tier out (`degraded`) instead: its width was not known yet (vectors it took since).
            if error.code == errors.EMBEDDING_MISMATCH and params.get("embedding") is not None:
                raise error
        depth = self._depth()
        if not query and vector is None:
            fused = fusion.recency(lists, depth, limit=limit, min_score=min_score)
        elif strategy == "rerank":
            fc = self.config.fusion
            fused = fusion.rerank(lists, query=query, vector=vector, weights=fc.weights,
                                  half_life_days=fc.half_life_days, depth=depth, limit=limit, min_score=min_score)
        else:
            fused = fusion.rrf(lists, k=self.config.fusion.rrf_k, depth=depth, limit=limit, min_score=min_score)
        if fused and touch:
            by_tier: dict[str, list[str]] = {}
            for record in fused:
                by_tier.setdefault(record.tier or "", []).append(record.id)
            if not self.config.background_promotion:
                await self.policy.recalled(owner, by_tier)
            elif self.policy.count_later(owner, by_tier):
                self.spawn(self.policy.flush_counts())
        result: dict[str, Any] = {"records": [r.to_wire(embeddings=asked_vectors) for r in fused]}
        self._degraded(result, fan)
        if options is not None:
            written = await self._written_order(owner, fused, options)
            result.update(prompts.render(fused, options, ordered_by_time=False, written=written))
        return result

    async def _written_order(self, owner: str | None, records: Sequence[Record],
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
            if record.tier in self.fed.tiers:
                by_tier.setdefault(record.tier, []).append(record.id)
        read = await asyncio.gather(*(self.policy.by_ids(self.fed[name], owner, ids) for name, ids in by_tier.items()),
                                    return_exceptions=True)  # a tier that fails leaves its records in rank order
        return [r["id"] for r in self._merge_by_time({name: {"records": found} for name, found in zip(by_tier, read)
                                                      if not isinstance(found, BaseException)})]

    async def _ask_recall(self, tiers: list[Tier], per_tier: Callable[[Tier], dict[str, Any] | None],
                          tokenize: bool) -> tuple[FanOut, dict[str, list[Record]]]:
        """One fan-out of a recall: each tier's records, parsed (and for rerank, tokenized) as its
        reply arrives, while the slower tiers still work; in tier order, not arrival order (ties
        are then stable)."""
        parsed: dict[str, list[Record]] = {}

        def arrived(name: str, result: dict[str, Any]) -> None:
            parsed[name] = self._records(result, name)
            if tokenize:
                fusion.prepare(parsed[name])

        fan = await self.fed.fan_out("memory/recall", {}, tiers, per_tier=per_tier, arrived=arrived)
        return fan, {name: parsed[name] for name in fan.results}

    async def timeline(self, params: dict[str, Any], ctx: Context) -> dict[str, Any]:
        owner = ctx.owner(params)
        tiers = self._scope_tiers(params)
        scope = self._scope_params(params, owner)
        limit = self._limit(params, self.limits.get("max_recall_limit") or 0)
        options = prompts.parse(params.get("prompt"))
        asked_vectors = bool_param(params, "embeddings", False)
        asked = {**scope, "limit": limit, "embeddings": asked_vectors}

        def per_tier(tier: Tier) -> dict[str, Any] | None:
            cap = ((tier.info or {}).get("limits") or {}).get("max_recall_limit")
            return _settle_tier({**asked, "limit": min(limit, cap) if cap else limit}, tier)

        fan = await self._settled(owner, tiers, lambda: self._ask_timeline(tiers, per_tier, limit))
        wire = self._merge_by_time(fan.results)
        if limit:
            wire = wire[-limit:]
        result: dict[str, Any] = {"records": wire}
        self._degraded(result, fan)
        if options is not None:
            records = [Record.from_wire(r) for r in wire]
            result.update(prompts.render(records, options, ordered_by_time=True))
        return result

    async def _ask_timeline(self, tiers: list[Tier], per_tier: Callable[[Tier], dict[str, Any] | None],
                            limit: int) -> FanOut:
        """One fan-out of a timeline, each tier asked for at most its own max_recall_limit. A tier whose
        reply stopped there, short of `limit` (the router may declare more than a tier), is read
        again backwards a page at a time (`a2m.paging`) for its newest `limit` records."""
        fan = await self.fed.fan_out("memory/timeline", {}, tiers, per_tier=per_tier)

        async def more(name: str, params: dict[str, Any]) -> None:
            records: list[dict[str, Any]] = []
            try:
                async for page in pages_backwards(self.fed[name].call, params, page=params["limit"],
                                                  cap=params["limit"]):
                    records[:0] = page  # each page checked as every tier reply is (router/replies.py)
                    if len(records) >= limit:
                        break
            except CrowdedMillisecond as exc:
                log.warning("timeline of %s: %s; the rest of them are left out", name, exc)
            except A2MError as exc:  # the first page stands; the tier is named as left out
                fan.errors[name] = exc
                fan.degraded.append(name)
                return
            fan.results[name] = {"records": records[-limit:]}

        full = [(name, params) for name, result in fan.results.items()
                if (params := per_tier(self.fed[name])) is not None and params["limit"] < limit
                and len(result.get("records", [])) >= params["limit"]]
        if full:
            await asyncio.gather(*(more(name, params) for name, params in full))
            fan.degraded.sort(key=self.fed.order.index)
        return fan

    def _merge_by_time(self, results: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Ascending by created_at; equal stamps keep each tier's order, deeper tiers (older by
        construction: records only move down) first. Duplicate ids keep the newer revision, then the
        deeper copy (as fetch and repair do). Works on the tiers' wire records as they came (a session
        replay can be thousands of them)."""
        depth = self._depth()
        keyed: dict[str, tuple[tuple[str, int, int, int], tuple[int, int], dict[str, Any]]] = {}
        for name, result in results.items():
            here = depth.get(name, 0)
            order = self.fed.order.index(name)
            for position, record in enumerate(result.get("records", [])):
                record["tier"] = name
                rank = (int(record.get("revision") or 1), here)
                held = keyed.get(record["id"])
                if held is None or rank > held[1]:
                    keyed[record["id"]] = ((record["created_at"], -here, order, position), rank, record)
        return [r for _, _, r in sorted(keyed.values(), key=lambda p: p[0])]

    # ---- forget, fetch, reinforce --------------------------------------------------------

    async def forget(self, params: dict[str, Any], ctx: Context) -> dict[str, Any]:
        owner = ctx.owner(params)
        tiers = self._scope_tiers(params)
        scope = parse_scope(params, owner, ids_field=True)
        query = query_param(params)
        if scope.is_empty_selector() and not query:
            raise invalid("forget needs a selector (ids, query, where, key_prefix, after or before)")
        if params.get("tier") is not None and not tiers[0].writable:
            raise A2MError(errors.READ_ONLY, f"tier {tiers[0].name} is read-only", {"tier": tiers[0].name})
        down = {name: params[name] for name in (*SCOPE_PARAMS, "ids") if params.get(name) is not None}
        if query:
            down["query"] = query  # as bounded here
        asked = _with_owner(down, owner)
        async with self.policy.owner_lock(owner):  # a record mid-move is forgotten in both tiers, not revived
            fan = await self.fed.fan_out("memory/forget", {}, [t for t in tiers if t.writable], skip_down=False,
                                         per_tier=lambda t: _settle_tier(asked, t, keep=True))
        count = sum(int(r.get("forgotten", 0)) for r in fan.results.values())
        told = count - sum(int(r.get("forgotten", 0)) for name, r in fan.results.items() if self.fed[name].gated)
        if told or count == 0:  # a gated tier's forget is a proposal, told at its approve
            await self.events.emit("forgotten", owner, count=told)
        if fan.degraded:
            raise A2MError(errors.INTERNAL_ERROR, f"forget incomplete: tiers {', '.join(fan.degraded)} did not answer "
                           f"({count} forgotten elsewhere); repeat it when they are back",
                           {"forgotten": count, "degraded": fan.degraded})
        return {"forgotten": count}

    async def fetch(self, params: dict[str, Any], ctx: Context) -> dict[str, Any]:
        key = params.get("key")
        if not isinstance(key, str) or not key:
            raise invalid("key is required", field="key")
        owner = ctx.owner(params)
        asked_vectors = bool_param(params, "embeddings", False)
        keyed = [t for t in self.fed if t.has("keys")]
        best, fan = await self._settled(owner, keyed, lambda: self._fetch(key, owner, asked_vectors, keyed),
                                        missed=lambda found: found[0] is None)  # a key found is no miss
        out: dict[str, Any] = {"record": None if best is None else best.to_wire(embeddings=asked_vectors)}
        self._degraded(out, fan)
        return out

    async def _fetch(self, key: str, owner: str | None, asked_vectors: bool,
                     tiers: list[Tier]) -> tuple[Record | None, FanOut]:
        """The key's record (the highest revision, then the deepest tier) and the fan-out it came from."""
        fan = await self.fed.fan_out("memory/fetch", _with_owner({"key": key, "embeddings": asked_vectors}, owner),
                                     tiers)
        depth = self._depth()
        best: Record | None = None
        for name, result in fan.results.items():
            if result.get("record") is None:
                continue
            record = Record.from_wire(result["record"]).with_(tier=name)
            if best is None or (record.revision, depth.get(name, 0)) > (best.revision, depth.get(best.tier or "", 0)):
                best = record
        return best, fan

    async def reinforce(self, params: dict[str, Any], ctx: Context) -> dict[str, Any]:
        ids = ids_param(params)
        owner = ctx.owner(params)
        amount = params.get("amount", 0.1)
        if amount is None:
            amount = 0.1
        if not isinstance(amount, (int, float)) or isinstance(amount, bool) or not -1 <= amount <= 1:
            raise invalid("amount must be a number in [-1, 1]", field="amount")
        async with self.policy.owner_lock(owner):  # not between a move's read and its delete: the raise would
            # land on the copy the move deletes (decision 70)
            fan = await self.fed.fan_out("memory/reinforce", _with_owner({"ids": ids, "amount": amount}, owner),
                                         [t for t in self.fed if t.writable and t.has("salience")], skip_down=False)
        total = min(sum(int(r.get("reinforced", 0)) for r in fan.results.values()), len(set(ids)))
        if fan.degraded and total < len(set(ids)):  # the rest may live there: not "unknown ids" (decision 14)
            raise A2MError(errors.INTERNAL_ERROR, f"reinforce incomplete: tiers {', '.join(fan.degraded)} did not "
                           f"answer ({total} reinforced elsewhere); the other ids may be there",
                           {"reinforced": total, "degraded": fan.degraded})
        return {"reinforced": total}

    # ---- tiers: promote, consolidate ---------------------------------------------------------

    async def promote(self, params: dict[str, Any], ctx: Context) -> dict[str, Any]:
        ids = ids_param(params)
        if params.get("tier") is None:
            raise invalid("tier is required", field="tier")
        dest = self._tier(params["tier"])
        owner = ctx.owner(params)
        salience = params.get("salience")
        if salience is not None and (not isinstance(salience, (int, float)) or isinstance(salience, bool)
                                     or not 0 <= salience <= 1):
            raise invalid("salience must be a number in [0, 1]", field="salience")
        if not dest.writable:
            raise A2MError(errors.READ_ONLY, f"tier {dest.name} is read-only", {"tier": dest.name})
        if dest.gated:
            raise invalid(f"tier {dest.name} holds writes for review until memory/approve, so a move there cannot be "
                          "verified; write the record there with memory/remember instead", field="tier")
        wanted = set(ids)
        moved: list[str] = []
        refused: Refusals = []
        try:
            for source in self.fed:
                if source is dest or not source.writable or not wanted:
                    continue
                here = await self.policy.move(source, dest, owner, sorted(wanted), reason="promote",
                                              salience=None if salience is None else float(salience),
                                              refused=refused)
                moved += here
                wanted -= set(here)
            promoted = len(set(ids) & set(moved))
            if wanted and not dest.healthy:  # a move into a down tier is skipped: not "unknown ids" (decision 14)
                raise A2MError(errors.INTERNAL_ERROR, f"promote incomplete: tier {dest.name} did not answer "
                               f"({promoted} promoted); the rest stay where they are",
                               {"promoted": promoted, "degraded": [dest.name]})
            if refused:  # the destination's own answer, not "unknown ids" (decision 100)
                kept = sorted({i for unit, _ in refused for i in unit})
                first = refused[0][1]
                raise A2MError(first.code, f"promote incomplete: tier {dest.name} refused {len(kept)} record(s) "
                               f"({first.message}); {promoted} promoted, the refused stay where they are",
                               {"promoted": promoted, "refused": kept, "tier": dest.name})
        finally:  # one event per call, also when a later source failed: what moved before it did move
            if moved:
                await self.events.emit("promoted", owner, ids=moved, tier=dest.name)
        return {"promoted": promoted}

    async def _counts(self, owner: str | None) -> dict[str, Any]:
        """`counts` per tier after a policy pass, and `degraded` naming the tiers that did not answer:
        a move into one of them was skipped (its records stay where they were), so say so."""
        fan = await self.fed.fan_out("memory/describe", _with_owner({}, owner), list(self.fed))
        out: dict[str, Any] = {"counts": {name: sum(int(t.get("count", 0)) for t in result.get("tiers", []))
                                          for name, result in fan.results.items()}}
        self._degraded(out, fan)
        return out

    async def consolidate(self, params: dict[str, Any], ctx: Context) -> dict[str, Any]:
        owner = ctx.owner(params)
        await self.policy.counted()  # its promotions see every recall answered before it (decision 9)
        repaired = await self.policy.repair(owner)
        promoted = await self.policy.promote_pending(owner)  # earned by recall: before capacity pressure
        spilled = await self.policy.enforce_all(owner)
        result = {"moved": spilled["moved"] + promoted, "promoted": promoted, "dropped": spilled["dropped"],
                  "summarized": 0, "repaired": repaired, **await self._counts(owner)}
        await self.events.emit("consolidated", owner, moved=result["moved"], promoted=promoted,
                               dropped=spilled["dropped"], summarized=0, repaired=repaired)
        return result

    # ---- sessions -----------------------------------------------------------------------

    async def session_list(self, params: dict[str, Any], ctx: Context) -> dict[str, Any]:
        owner = ctx.owner(params)
        tiers = [t for t in self.fed if t.has("sessions")]
        fan = await self._settled(owner, tiers, lambda: self.fed.fan_out("memory/session/list",
                                                                           _with_owner({}, owner), tiers))
        merged: dict[str, dict[str, Any]] = {}
        for name in self.fed.order:
            for entry in (fan.results.get(name) or {}).get("sessions", []):
                session = entry.get("session")
                if session is None:
                    continue
                into = merged.setdefault(session, {"session": session, "records": 0, "tiers": {},
                                                   "opened_at": None, "touched_at": None})
                into["records"] += int(entry.get("records", 0))
                into["tiers"][name] = into["tiers"].get(name, 0) + int(entry.get("records", 0))
                for stamp, pick in (("opened_at", min), ("touched_at", max)):
                    if entry.get(stamp):
                        into[stamp] = entry[stamp] if into[stamp] is None else pick(into[stamp], entry[stamp])
        out: dict[str, Any] = {"sessions": sorted(merged.values(), key=lambda e: e["opened_at"] or "")}
        self._degraded(out, fan)
        return out

    async def session_close(self, params: dict[str, Any], ctx: Context) -> dict[str, Any]:
        session = params.get("session")
        if not isinstance(session, str) or not session:
            raise invalid("session is required", field="session")
        owner = ctx.owner(params)
        await self.policy.counted()
        flushed = await self.policy.flush(owner, session)
        if not flushed and not await self._session_known(owner, session):  # the protocol: a no-op
            return {"moved": 0, "promoted": 0, "dropped": 0, "summarized": 0, **await self._counts(owner),
                    "closed": session, "flushed": 0}
        promoted = await self.policy.promote_pending(owner)
        spilled = await self.policy.enforce_all(owner, [t for t in self.fed if not t.config.per_session])
        moved = flushed + promoted + spilled["moved"]
        await self.events.emit("session_closed", owner, session=session)
        if moved or spilled["dropped"]:
            await self.events.emit("consolidated", owner, moved=moved, promoted=promoted,
                                   dropped=spilled["dropped"], summarized=0, session=session)
        return {"moved": moved, "promoted": promoted, "dropped": spilled["dropped"], "summarized": 0,
                **await self._counts(owner), "closed": session, "flushed": flushed}

    async def _session_known(self, owner: str | None, session: str) -> bool:
        """Whether any tier holds a record of `session`; True when a tier that could did not answer,
        so a close is never skipped for a session the router could not see."""
        tiers = [t for t in self.fed if t.has("sessions")]
        fan = await self.fed.fan_out("memory/timeline", _with_owner({"where": {"session": session}, "limit": 1},
                                                                    owner), tiers)
        return bool(fan.degraded) or any(result.get("records") for result in fan.results.values())

    # ---- summarize --------------------------------------------------------------------------

    def _summary_tier(self, params: Mapping[str, Any]) -> Tier:
        if params.get("into") is not None:
            into = self._tier(params["into"], "into")
        else:
            semantic = [t for t in self.fed if t.config.kind == "semantic" and t.writable]
            into = semantic[0] if semantic else self.fed[self.config.default_tier]
        if not into.writable:
            raise A2MError(errors.READ_ONLY, f"tier {into.name} is read-only", {"tier": into.name})
        return into

    async def summarize(self, params: dict[str, Any], ctx: Context) -> dict[str, Any]:
        owner = ctx.owner(params)
        self._scope_tiers(params)  # an unknown `tier` is -32002 before anything is read
        into = self._summary_tier(params)
        scope = parse_scope(params, owner, ids_field=True)
        query = query_param(params)
        key = str_param(params, "key")
        if key == "":  # as remember and fetch answer it: an empty key is no address, not "no key"
            raise invalid("key must not be empty", field="key")
        if scope.is_empty_selector() and not query and params.get("tier") is None:
            raise invalid("summarize needs a selector (ids, query, tier, where or key_prefix)")
        limit = self._limit(params, 50)
        asked = {k: v for k, v in params.items() if k not in ("prompt", "into", "key", "ids")}
        if scope.ids is not None:  # `ids` narrows the other selectors and `limit`, as on a tier server
            where = dict(scope.where)
            named = where.get("id", scope.ids)
            named = {named} if isinstance(named, str) else set(named) if isinstance(named, list) else set()
            asked["where"] = {**where, "id": [i for i in scope.ids if i in named]}  # a set: 200,000 ids in a
            # list took 185 s of the event loop, every other caller's call waiting behind it
        cap = self.limits.get("max_recall_limit")
        wanted = limit + 1 if key and limit and (not cap or limit < cap) else limit  # room for the summary at key
        if query:
            read = await self.recall(asked | {"limit": wanted, "touch": False}, ctx)
        else:
            read = await self.timeline(asked | {"limit": wanted}, ctx)
        sources = read["records"]
        partial = {"degraded": read["degraded"]} if read.get("degraded") else {}  # a tier left out, as a read says
        if key:  # the summary this call replaces is no source of its own next revision, nor takes one's place
            sources = [r for r in sources if not (r.get("key") == key and "summary_of" in (r.get("metadata") or {}))]
            if limit and len(sources) > limit:
                sources = sources[:limit] if query else sources[-limit:]  # the best hits; the newest records
            held = next((r["id"] for r in sources if r.get("key") == key), None)
            if held is not None:  # writing there would replace, so delete, one of the sources
                raise invalid(f"key {key!r} holds {held}, one of the records summarised; a summary never "
                              "replaces its sources: choose another key", field="key", id=held)
        records = [Record.from_wire(r) for r in sources]
        if query:  # told, and listed in summary_of, as timeline replays them: not in rank order
            place = {record_id: i for i, record_id in enumerate(await self._written_order(owner, records) or ())}
            records.sort(key=lambda r: (r.created_at, place.get(r.id, 0)))
        # As long as the router and the tier written to take (a summary refused by its own write
        # answered -32602 about `records[0].content`, a param the caller never sent).
        room = [self.limits.get("max_content_length"), ((into.info or {}).get("limits") or {}).get("max_content_length")]
        text = extract_summary(records, max_chars=min([SUMMARY_CHARS, *(n for n in room if n)]))
        if not text:
            return {"records": [], "read": len(records), "written": 0, **partial}
        summary: dict[str, Any] = {"content": text, "role": "memory", "metadata": {"summary_of": [r.id for r in records]}}
        if key:
            summary["key"] = key
        if params.get("into") is not None:
            summary["tier"] = into.name  # asked for: a key living elsewhere is then refused, as on remember
        ids = await self.write([summary], owner, tier=into.name)
        stored = await self.policy.by_ids(self.fed[into.name], owner, ids)
        if not stored:  # a key write may have landed where the key already lived
            located, _ = await self._locate("id", ids, owner, list(self.fed))
            stored = [record for _, record in located.values()]
        return {"records": stored, "read": len(records), "written": 1, **partial}

    # ---- describe ---------------------------------------------------------------------------

    async def describe_fields(self, params: dict[str, Any], ctx: Context) -> dict[str, Any]:
        owner = ctx.owner(params)
        if ctx.anonymous:
            # The layout and what the federation can do, never what it holds or where it runs: the
            # unowned partition's counts, tier URLs and errors are for a caller with a token.
            return self._described([{**t.config.describe(), "read_only": not t.writable,
                                     "kind": t.config.kind or next((i.get("kind") for i in (t.info or {}).get("tiers", [])), None)}
                                    for t in self.fed], ctx, [t.metrics for t in self.fed if t.metrics is not None])
        fan = await self.fed.fan_out("memory/describe", _with_owner({}, owner), list(self.fed))
        layout = []
        metrics: set[str] | None = None
        for tier in self.fed:
            entry = tier.config.describe()
            result = fan.results.get(tier.name)
            if result is not None:
                tier.info = result
                entry["count"] = sum(int(t.get("count", 0)) for t in result.get("tiers", []))
                if any(t.get("shared") for t in result.get("tiers", [])):
                    entry["shared"] = True  # a mounted corpus: the same records for every owner
                entry["kind"] = entry["kind"] or next((t.get("kind") for t in result.get("tiers", [])), None)
                engines = [t.get("engine") for t in result.get("tiers", []) if t.get("engine")]
                if engines:
                    entry["engine"] = engines[0]
                entry["status"] = "up"
                if tier.metrics is not None:
                    metrics = set(tier.metrics) if metrics is None else metrics & set(tier.metrics)
            else:
                entry["count"] = 0
                entry["status"] = "down"
                if tier.last_error:
                    entry["error"] = tier.last_error
            entry["read_only"] = not tier.writable  # down, as it last said of itself: still never written
            entry["url"] = tier.config.url  # for `a2m doctor`; the tiers listen privately anyway
            layout.append(entry)
        out = self._described(layout, ctx, [] if metrics is None else [metrics])
        if fan.degraded:
            out["degraded"] = fan.degraded
        return out

    def _described(self, layout: list[dict[str, Any]], ctx: Context, metrics: Iterable[Any]) -> dict[str, Any]:
        """describe's capability objects around a tier layout; `metrics`: each tier's (intersected)."""
        metric, common = shared_metrics(metrics)
        return {
            "tiers": layout,
            "events": {"push": ctx.push is not None},
            "embeddings": {"dimensions": self.dimensions(), "metric": metric, "metrics": common,
                           "model": getattr(self.embedder, "model", None)},
            "summarize": {"model": None},
            "prompt": prompts.describe(),
            "fusion": self.config.fusion.strategy,
        }


def _tier_call_metrics(registry: Any) -> Callable[[str, str, float, str], None]:
    """The observer of every call the router makes to a tier: how many, how each ended and how long
    it took, per tier and method. A tier that hangs has no /metrics of its own to scrape, and what a
    tier measures of itself leaves out the network and the router's timeout; this is what callers
    of the router wait for. Labels are bounded: tier names come from router.toml, methods from the
    router's own code, outcomes are ok | error | unavailable."""
    from prometheus_client import Counter, Histogram

    calls = Counter("a2m_router_tier_calls", "calls the router made to a tier, by how they ended",
                    ["tier", "method", "outcome"], registry=registry)
    seconds = Histogram("a2m_router_tier_call_seconds", "latency of the router's calls to a tier, failures included",
                        ["tier", "method"], registry=registry, buckets=LATENCY_BUCKETS)
    children: dict[tuple[str, str, str], tuple[Any, Any]] = {}

    def observe(tier: str, method: str, elapsed: float, outcome: str) -> None:
        found = children.get((tier, method, outcome))
        if found is None:  # label lookup is the costly part of prometheus-client: once per series
            found = children[(tier, method, outcome)] = (calls.labels(tier, method, outcome),
                                                         seconds.labels(tier, method))
        found[0].inc()
        found[1].observe(elapsed)

    return observe


def shared_metrics(per_tier: Iterable[Iterable[str]]) -> tuple[str | None, list[str]]:
    """(the metric a vector query is ranked by, the metrics every store can do): cosine where every
    store can (the router's rerank scores by it too), else one they share; none when a mounted store
    ranks its own way. No store with vectors: cosine."""
    common: set[str] = {"cosine"}
    for index, each in enumerate(per_tier):
        common = set(each) if index == 0 else common & set(each)
    return ("cosine" if "cosine" in common else min(common, default=None)), sorted(common)


def build_router(config_path: str | None = None, **kwargs: Any) -> Router:
    """`a2m serve router --config router.toml` lands here."""
    return Router(load(config_path), **kwargs)
