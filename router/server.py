"""The router: one A2M service whose storage is other A2M servers, composed of its parts.

The router stores nothing itself except its event log and the recall counts that earn
promotion: records live in the tiers. Where each method is answered:

- `writes.py`: remember (route, write, take back, capacity), forget, reinforce;
- `reads.py`: recall, timeline, fetch (fused by `fusion.py`; a timeline's cursor is `cursors.py`'s);
- `moves.py`: promote, consolidate, session list and close (the moves are `policy.py`'s);
- `summarize.py`: summarize, over the reads and the write path;
- here: the events methods, describe, health (/readyz and the probes of tiers), metrics, and the
  handler table that joins them, each handler behind the caller's budget of calls (`rate.py`).

What they share (the tiers a call covers, what each tier is asked, the vector width) is
`scope.py`; the tiers themselves, their health and fan-out are `federation.py`. Owner scoping
is the dispatcher's `Context.owner`: over authenticated HTTP the principal is the owner, and it
is passed to every tier as `owner` (the tiers trust the router's service token to name owners).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable, Iterable, Mapping, Sequence

from a2m import errors, prompt as prompts
from a2m.capabilities import CAPABILITIES
from a2m.dispatch import Context, Handler, bound_handlers
from a2m.embedder import close_embedder, make_embedder
from a2m.errors import A2MError
from a2m.events import EventLog, EventMethods
from a2m.http import LATENCY_BUCKETS, HTTPSettings

from .config import RouterConfig, load, unenforced
from .federation import FanOut, Federation, Tier
from .intents import Intents, refuse_reserved
from .limits import Limits
from .locks import SharedLocks, scope_of
from .moves import Moves
from .policy import Policy
from .cursors import CursorSeal
from .rate import Buckets, SharedBuckets, rate_limited
from .reads import Reads
from .scope import VectorWidth, with_owner
from .summarize import Summaries
from .writes import Writes

log = logging.getLogger("a2m.router")

# How long /readyz (its ready and health share one wait) and a /metrics scrape wait for the probes of
# tiers: a Kubernetes readiness probe gives up after 2 s (deploy/k8s), Prometheus after 10.
PROBE_WAIT = 0.75
# A tier that is up but has given no good answer for this long is probed by the next check (/readyz,
# a scrape): only a failed call marks a tier down, and an idle router makes none. A busy router hears
# from its tiers in every call, so its checks add no calls.
HEARD_WITHIN = 5.0


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


def _not_reserved(handler: Handler) -> Handler:
    """`handler` refusing (-32005) a call naming, or a caller authenticated as, the router's reserved
    owner (`intents.py`): a batch's intent is the router's, never a caller's to read, forge or forget."""
    async def guarded(params: dict[str, Any], ctx: Context) -> dict[str, Any]:
        refuse_reserved(params.get("owner") if isinstance(params, dict) else None)
        refuse_reserved(ctx.principal)
        return await handler(params, ctx)

    return guarded


class Router(EventMethods):
    """An A2M service whose storage is other A2M servers: the parts that answer its methods, and
    the plumbing, health and metrics they share."""

    def __init__(self, config: RouterConfig, *, client_factory: Any = None) -> None:
        self.config = config
        self.name = config.name
        self.capabilities = frozenset(CAPABILITIES)
        self.fed = Federation(config, client_factory)
        self.limits = Limits(config.limits, self.fed)
        self.events = EventLog(config.events_capacity)
        self.embedder = make_embedder(config.embedder, model=config.embedder_model)
        scope = scope_of(tier.url for tier in config.tiers)
        shared = None if config.lock_url is None else SharedLocks(config.lock_url, scope=scope)
        self.policy = Policy(self.fed, embedder=self.embedder, emit=self.events.emit, shared_locks=shared)
        self.width = VectorWidth(self.embedder, self.fed)
        self.intents = Intents(self.fed, self.policy, config.default_tier, config.intent_grace)
        self.writes = Writes(self.fed, self.policy, self.events, self.embedder, self.width, self.limits,
                             config.default_tier, self.intents)
        self.reads = Reads(self.fed, self.policy, config, self.embedder, self.width, self.limits,
                           spawn=self.spawn, degraded=self._degraded)
        self.moves = Moves(self.fed, self.policy, self.events, self.intents, degraded=self._degraded)
        self.summaries = Summaries(self.fed, self.policy, self.reads, self.writes, self.limits, config.default_tier)
        self._degraded_calls: Any = None  # a2m_router_degraded_calls, once metrics are registered
        self.buckets: Buckets | None = None
        if config.rate_limit is not None:  # in the replicas' Redis where there is one
            self.buckets = Buckets(config.rate_limit) if shared is None else \
                SharedBuckets(config.rate_limit, shared.redis, scope)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._locks_status: str | None = None  # the lock store's, as the last ready() found it
        self._probes: dict[str, asyncio.Task[Any]] = {}  # tier -> its describe in flight (`_probe`)
        self._resolving: asyncio.Task[Any] | None = None  # the startup's resolution of intents

    # ---- plumbing ------------------------------------------------------------------------

    def http_settings(self) -> HTTPSettings:
        """Bearer tokens -> principals and allowed origins from the config (for the HTTP binding)."""
        return HTTPSettings(allowed_origins=self.config.allowed_origins, tokens=dict(self.config.tokens))

    def take_tokens(self, tokens: Mapping[str, Any]) -> None:
        """The bearer tokens the binding takes in the end (router.toml's and `--token`'s): the
        timeline cursors it answers are sealed with them (`CursorSeal`), not only with router.toml's."""
        self.reads.cursors.seal = CursorSeal.of(tokens, self.config.service_token, self.config.cursor_secret)

    async def startup(self) -> None:
        logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per tier call otherwise
        await self.fed.start()
        if self.policy.shared_locks is not None:
            evicts = (await self.policy.shared_locks.state()).get("evicts")
            if evicts:
                log.warning("the owner lock store (lock_url) evicts keys at its maxmemory (maxmemory-policy %s): "
                            "a held lock may be evicted and another replica move the same records; set "
                            "noeviction there", evicts)
        for line in [*unenforced(self.config.tiers), *self.limits.capped()]:
            log.warning(line)
        width = getattr(self.embedder, "dimensions", None)  # an HTTP embedder's is known after first use
        for tier in self.fed:
            if width and tier.searched and tier.dimensions and tier.dimensions != width:
                log.warning("tier %s holds %d-dim vectors and the embedder makes %d: %s is recalled by text "
                            "alone (embed it with the router's model to search it by vector)",
                            tier.name, tier.dimensions, width, tier.name)
        slowest = 2 * sum(t.timeout for t in self.config.tiers if not t.read_only)
        if self.config.intent_grace < slowest:
            log.warning("intent_grace (%g s) is shorter than a batch across tiers may take (twice the writable tiers' "
                        "timeouts: %g s): a batch still being written may be resolved as a dead router's, and is "
                        "then taken back and refused", self.config.intent_grace, slowest)
        self._resolving = self.spawn(self._resolve_intents())

    async def _resolve_intents(self) -> None:
        """Resolve the intents a router that stopped mid-batch left (intents.py), in the background;
        those still younger than the grace (maybe another replica's batch in flight) once more
        after it. Each `memory/consolidate` resolves them too."""
        for attempt in range(2):
            if attempt:
                await asyncio.sleep(self.config.intent_grace)
            try:
                tally = await self.intents.resolve()
            except Exception as exc:  # never a crash of the router: the next consolidate tries again
                log.warning("resolving intents at startup failed: %s", exc)
                return
            if tally["kept"] or tally["undone"]:
                log.info("intents resolved at startup: %s", tally)
            if not tally["left"]:
                return

    async def shutdown(self) -> None:
        if self._resolving is not None:
            self._resolving.cancel()  # it may be waiting out the grace: never hold a shutdown for it
        await self.writes.close()
        await self.drain()
        await self.fed.close()
        await close_embedder(self.embedder)
        if self.policy.shared_locks is not None:
            await self.policy.shared_locks.close()

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

    # ---- handlers ------------------------------------------------------------------------

    def handlers(self) -> dict[str, Handler]:
        """Every A2M method, from the part that answers it (the events methods are the router's own),
        each behind the caller's rate limit where one is set."""
        parts = (self, self.writes, self.reads, self.moves, self.summaries)
        table = {method: _not_reserved(_told_plainly(handler))
                 for part in parts for method, handler in bound_handlers(part).items()}
        if self.buckets is not None:
            table = {method: rate_limited(handler, self.buckets, method) for method, handler in table.items()}
        return table

    def _degraded(self, out: dict[str, Any], fan: FanOut) -> dict[str, Any]:
        """`out` naming the tiers `fan` left out, each counted in `a2m_router_degraded_calls`."""
        if fan.degraded:
            out["degraded"] = fan.degraded
            if self._degraded_calls is not None:
                for name in fan.degraded:
                    self._degraded_calls.labels(name).inc()
        return out

    # ---- health --------------------------------------------------------------------------

    async def ready(self) -> bool:
        """The default tier answers. Every tier due a probe (`_probe`) is probed first, and the lock
        store asked, within one PROBE_WAIT: /readyz then reads the verdicts from health() without a
        second wait."""
        shared = self.policy.shared_locks
        if shared is None:
            await self._probe(list(self.fed))
        else:
            _, state = await asyncio.gather(self._probe(list(self.fed)), shared.state())
            self._locks_status = state["status"]
        return self.fed[self.config.default_tier].healthy

    async def health(self) -> dict[str, Any]:
        """Per-tier status for /readyz, which asks ready() first: its probes are the ones read here.
        With `lock_url`, whether the lock store answered: while it does not, every move, forget and
        keyed write fails, though the router stays ready for reads and other writes."""
        out: dict[str, Any] = {"tiers": {t.name: ("up" if t.healthy else "down") for t in self.fed}}
        shared = self.policy.shared_locks
        if shared is not None:
            out["owner_locks"] = self._locks_status or (await shared.state())["status"]
        return out

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

    # ---- metrics -------------------------------------------------------------------------

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
        if self.buckets is not None:
            limited = Counter("a2m_router_rate_limited_calls", "calls refused by the per-caller rate limit "
                              "([rate_limit])", ["method"], registry=registry)
            self.buckets.on_refused = lambda method: limited.labels(method).inc()
        up = Gauge("a2m_router_tier_up", "1 while the router reaches the tier", ["tier"], registry=registry)
        for name in self.fed.order:  # the tiers themselves exist only once the federation starts
            up.labels(name).set_function(
                lambda name=name: 1.0 if name in self.fed.tiers and self.fed.tiers[name].healthy else 0.0)
        self.fed.observe_calls(_tier_call_metrics(registry))

    # ---- describe ------------------------------------------------------------------------

    def dimensions(self) -> int | None:
        """The federation's vector width (`VectorWidth.known`)."""
        return self.width.known()

    async def describe_fields(self, params: dict[str, Any], ctx: Context) -> dict[str, Any]:
        owner = ctx.owner(params)
        if self.buckets is not None and not ctx.anonymous:  # the discovery document asks no tier
            await self.buckets.spend(ctx.principal, "memory/describe")
        if ctx.anonymous:
            # The layout and what the federation can do, never what it holds or where it runs: the
            # unowned partition's counts, tier URLs and errors are for a caller with a token.
            return self._described([{**t.config.describe(), "read_only": not t.writable,
                                     "kind": t.config.kind or next((i.get("kind") for i in (t.info or {}).get("tiers", [])), None)}
                                    for t in self.fed], ctx, [t.metrics for t in self.fed if t.metrics is not None])
        fan = await self.fed.fan_out("memory/describe", with_owner({}, owner), list(self.fed))
        layout = []
        metrics: set[str] | None = None
        for tier in self.fed:
            entry = tier.config.describe()
            result = fan.results.get(tier.name)
            if result is not None:
                tier.info = result
                entry["per_session"] = tier.per_session  # as counted: not where the tier keeps no sessions
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
        described = self._described(layout, ctx, [] if metrics is None else [metrics])
        described["owner_locks"] = await self._owner_locks()
        return self._degraded(described, fan)

    async def _owner_locks(self) -> dict[str, Any]:
        """Whether this router's owner locks are shared with other replicas (`lock_url`), and whether
        their store answers: `a2m doctor` says so, as an operator scaling the router must know."""
        shared = self.policy.shared_locks
        return {"shared": False} if shared is None else {"shared": True, **await shared.state()}

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
            **({"rate_limit": self.config.rate_limit.describe()} if self.config.rate_limit else {}),
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

