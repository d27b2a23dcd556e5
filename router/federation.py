"""The router's view of its tiers: one pooled client each, health, and fan-out.

A tier is known only by its URL and what its `memory/describe` says. Each call
runs under the tier's own timeout; a tier that cannot be reached is marked down
and, for reads, skipped until its backoff expires (so a dead tier costs one
timeout, not one per request); the first call after the backoff is the probe,
and a tier that comes back is described again (its dimensions or capabilities
may have changed while it was away). Writes are always attempted: a write must
fail loudly rather than be skipped.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Iterable, Mapping

from a2m.capabilities import FIELD_CAPABILITY
from a2m.client import HTTPClient, Unavailable
from a2m.errors import A2MError, INTERNAL_ERROR
from a2m.records import DEFAULT_SALIENCE

from .config import RouterConfig, TierConfig
from .replies import Malformed, problem

log = logging.getLogger("a2m.router")

BACKOFF_MIN = 0.25
BACKOFF_MAX = 15.0
# How much sooner than `timeout` by the monotonic clock a call cut off by it may end: uvloop's timers
# count whole milliseconds (a quarter of the router's timeouts fired up to ~0.6 ms early), and a
# coarse clock's tick (15.6 ms on older Windows Pythons) is the same slip. A failure that late is
# the timeout: a refused connection or an HTTP error comes back in milliseconds.
TIMER_SLACK = 0.02
# What a field of an optional capability reads as on a record that never had it: a record holding
# only these loses nothing where that capability is missing (every record shows a salience).
UNSET: dict[str, Any] = {"salience": DEFAULT_SALIENCE, "access_count": 0, "revision": 1}
FIELD_CAPABILITIES = frozenset(FIELD_CAPABILITY.values())


Observer = Callable[[str, str, float, str], None]


def engine_down(error: A2MError) -> bool:
    """A tier's answer that its engine is unavailable (-32603 naming the engine, as backends.surface
    answers every call while Redis, PostgreSQL, Qdrant or git is away; its /readyz is 503 then). To
    a describe (which counts the tier's records) it means the tier is down as surely as one that
    does not answer, though its HTTP server is up; to a recall it may only mean that statement timed out."""
    return error.code == INTERNAL_ERROR and isinstance(error.data, dict) and "engine" in error.data


def ran_out(started: float, limit: float) -> bool:
    """Whether a call begun at `started` (time.monotonic()) failed only once its `limit` was spent:
    cut off by its timeout, not refused. Within TIMER_SLACK of it counts (at most a tenth of it)."""
    return time.monotonic() - started >= limit - min(TIMER_SLACK, limit / 10)


def _kind(error: BaseException) -> tuple[type, ...]:
    """What an outage is logged by: the error's type and those it was raised from. Every unreachable
    tier is an Unavailable; a refused connection and a certificate the router does not trust (which
    never heals: an https tier without SSL_CERT_FILE) differ only below it, and the log kept the
    first for the whole outage."""
    kinds: list[type] = []
    seen: BaseException | None = error
    while seen is not None and len(kinds) < 4:
        kinds.append(type(seen))
        seen = seen.__cause__
    return tuple(kinds)


@dataclass(eq=False)
class Tier:
    config: TierConfig
    client: Any  # a2m.client.HTTPClient, or anything with `async call(method, params, timeout=)` and `close()`
    info: dict[str, Any] | None = None  # the tier's last describe result
    healthy: bool = True
    failures: int = 0
    retry_at: float = 0.0
    last_error: str | None = None
    _revive: "asyncio.Task[Any] | None" = None  # the describe after a comeback (held: the loop keeps only weak refs)
    reached: bool = False  # has answered at least once (a tier still starting is not news)
    _probe_until: float = 0.0  # a read after the backoff is in flight: the others skip the tier until then
    heard_at: float = 0.0  # monotonic time of its last good answer: a health check probes a tier silent for long
    _down_for: tuple[type, ...] | None = None  # the kind of failure last logged for this outage (`_down`)
    _malformed: set[str] = field(default_factory=set)  # methods whose last reply was malformed (logged once)
    _capabilities_of: dict[str, Any] | None = None  # the describe `_capabilities` was read from
    _capabilities: frozenset[str] = frozenset()
    # (tier, method, seconds, outcome) after every call: the router's per-tier metrics. Outcome is
    # "ok", "error" (the tier answered an A2M error) or "unavailable" (unreachable, timed out, or its
    # engine is down: `engine_down`).
    observe: "Observer | None" = None

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def writable(self) -> bool:
        """Neither marked `read_only` in router.toml nor saying so itself (a mounted corpus does)."""
        return not self.config.read_only and not any(t.get("read_only") for t in (self.info or {}).get("tiers") or ())

    @property
    def gated(self) -> bool:
        """Saying its writes are recallable only once approved (a reviewed procedural tier): the
        router tells no `written` or `forgotten` for them; the tier tells them at the approve."""
        return any(t.get("gated") for t in (self.info or {}).get("tiers") or ())

    @property
    def capabilities(self) -> frozenset[str]:
        # Asked for every record a write checks (`drops`): built once per describe, not per call.
        if self._capabilities_of is not self.info:
            self._capabilities_of = self.info
            self._capabilities = frozenset((self.info or {}).get("capabilities", ()))
        return self._capabilities

    def limit(self, name: str) -> int | None:
        """The tier's described limit `name`, or None where it declares none (or one that is not a
        positive integer: a tier of another implementation's odd value is not a cap)."""
        value = ((self.info or {}).get("limits") or {}).get(name)
        return value if type(value) is int and value > 0 else None

    def has(self, capability: str) -> bool:
        # Before the first describe, assume the protocol's full set; the tier answers -32003 if not.
        return self.info is None or capability in self.capabilities

    @property
    def per_session(self) -> bool:
        """Counting capacity per session (router.toml's per_session) where the tier can tell sessions:
        one that does not declare them answers memory/session/list -32003 and holds no session's
        records (`drops`), so it is one bucket."""
        return self.config.per_session and self.has("sessions")

    def drops(self, record: Mapping[str, Any], spare: frozenset[str] = frozenset()) -> tuple[str, str] | None:
        """(field, capability) of the first field of `record` (wire form) that this tier would not
        keep: set, and of a capability it does not declare (a tier server of another implementation;
        it ignores such fields, §4), `spare`'s fields let go. None when it keeps them all, or is not
        yet described."""
        if self.info is None:
            return None
        lacking = FIELD_CAPABILITIES - self.capabilities
        if not lacking:
            return None
        for name, capability in FIELD_CAPABILITY.items():
            value = record.get(name)
            if capability in lacking and value is not None and value != UNSET.get(name) and name not in spare:
                return name, capability
        return None

    @property
    def searched(self) -> bool:
        """Whether this tier ranks by vectors (only then does the router send it query vectors, or
        embed what it writes there). Not one that does not declare `embeddings`, whatever its kind:
        it ignores a vector (§4), and asked a vector alone it answers its newest records."""
        if not self.has("embeddings"):
            return False
        emb = (self.info or {}).get("embeddings") or {}
        if "searched" in emb:
            return bool(emb["searched"])
        return self.config.kind in ("episodic", "semantic")

    @property
    def dimensions(self) -> int | None:
        return ((self.info or {}).get("embeddings") or {}).get("dimensions")

    @property
    def metrics(self) -> list[str] | None:
        emb = (self.info or {}).get("embeddings")
        if not emb:
            return None
        return list(emb.get("metrics") or [emb.get("metric", "cosine")])

    def available(self) -> bool:
        """False while a down tier waits out its backoff or its probe (reads skip it)."""
        now = time.monotonic()
        return self.healthy or (now >= self.retry_at and now >= self._probe_until)

    def probe(self) -> bool:
        """Claim the probe when a read may call this down tier now (`available()`): until it answers,
        the other reads skip the tier instead of each waiting out a timeout on a hung server.
        Pass the result as `call(probe=)`."""
        if self.healthy:
            return False
        self._probe_until = time.monotonic() + self.config.timeout + 1.0  # lapses by itself if never sent
        return True

    def unheard(self, within: float) -> bool:
        """Up, but no good answer for `within` s: it may have died while nothing called it (only a
        failed call marks a tier down), so a health check asks it before reporting it up."""
        return self.healthy and time.monotonic() - self.heard_at > within

    def _down(self, error: Exception, started: float, *, shown: str | None = None) -> None:
        """Mark the tier down for `error` (logged); `shown`: what describe tells callers instead of it."""
        self.last_error = shown or str(error)
        if not self.healthy and started < self.retry_at:
            # Sent before the latest verdict (in flight when the tier died, a write during the backoff, a
            # probe beside the one that already failed): it says nothing new, so the backoff stays. Else
            # eight concurrent clients would turn one short outage into the 15 s maximum.
            return
        self.failures += 1
        self.healthy = False
        self.retry_at = time.monotonic() + min(BACKOFF_MAX, BACKOFF_MIN * 2 ** (self.failures - 1))
        cause = _kind(error)  # unreachable (refused, a certificate not trusted, ...) or its engine away
        if self.failures == 1 or cause != self._down_for:  # once per outage, and when its cause changes
            # (the tier's server is back, its engine is not): the operator reads the cause at hand
            log.log(logging.WARNING if self.reached else logging.INFO, "tier %s is down: %s", self.name, error)
        self._down_for = cause

    async def call(self, method: str, params: dict[str, Any], *, timeout: float | None = None,
                   probe: bool = False, check: bool = False, slow: bool = False) -> dict[str, Any]:
        """One call under the tier's timeout. Unreachable -> Unavailable (and the tier is marked down);
        a protocol error from the tier is raised as the tier's A2MError. A `check` (a health check's
        describe) that the tier answers with its engine down (`engine_down`) marks it down too; any
        other call does not: one statement timeout or a busy pool must not take a tier away from
        every owner for the backoff. A `slow` call (a forget, whose work grows with the records it
        matches) that runs out its whole timeout leaves the tier up, for the same reason: one owner's
        large forget marked the tier down for every owner's reads. The next health check asks the
        tier at once, and if it hangs, the next ordinary call to time out marks it down."""
        was_down = not self.healthy
        started = time.monotonic()
        outcome: str | None = None  # stays None when cancelled: neither the tier's success nor its fault
        try:
            limit = timeout or self.config.timeout
            async with asyncio.timeout(limit + 1.0):  # not wait_for: on 3.11 that is one more task per call
                result = await self.client.call(method, params, timeout=limit)
            outcome = "ok"
        except (Unavailable, asyncio.TimeoutError, OSError) as exc:
            outcome = "unavailable"
            error = exc if isinstance(exc, Unavailable) else Unavailable(f"{self.name}: {type(exc).__name__}")
            if slow and ran_out(started, limit):  # busy with it, not gone (see above)
                self.heard_at = 0.0
            else:
                self._down(error, started)
            raise Unavailable(f"tier {self.name} unavailable: {error.message}",
                              {"tier": self.name, "url": self.config.url}) from exc
        except A2MError as exc:
            if not engine_down(exc):
                outcome = "error"  # the tier answered a JSON-RPC error: it is up
                raise
            outcome = "unavailable"  # it answers HTTP, but its engine failed the call
            if not check:  # this call's failure only (a statement timeout, a busy pool): the tier stays
                self.heard_at = 0.0  # up for every other owner, and the next health check asks it at once
                raise
            # The engine's words (a PostgreSQL host and user, a repository path) go to the log, not to
            # describe's `error`, which any token holder reads (decision 113).
            self._down(exc, started,
                       shown=f"tier {self.name}: its engine is unavailable (the router's log has the cause)")
            raise Unavailable(f"tier {self.name} unavailable: {exc.message}",
                              {"tier": self.name, "url": self.config.url}) from exc
        except Exception:
            outcome = "error"  # the call broke
            raise
        else:
            wrong = problem(method, params, result)
            if wrong is not None:
                outcome = "error"  # it answered, so it is up; this answer is unusable
                if method not in self._malformed:  # once until it answers this method well again
                    self._malformed.add(method)
                    log.warning("tier %s answered %s with a malformed reply: %s", self.name, method, wrong)
                error = Malformed(f"tier {self.name} answered {method} with a malformed reply: {wrong}",
                                  {"tier": self.name, "url": self.config.url, "method": method})
                if self.healthy:  # what describe and `a2m doctor` show for it; a down tier's outage stays.
                    # Without the detail, which can quote a caller's id or key: any token holder reads
                    # describe (as decision 113 for an engine's words); the log and the caller have it.
                    self.last_error = f"tier {self.name} answered {method} with a malformed reply " \
                                      "(the router's log has the detail)"
                raise error
            self.heard_at = time.monotonic()  # a busy router's calls are its health checks: none is added
            if self._malformed:
                self._malformed.discard(method)
                if self.healthy and self.last_error and f" answered {method} with a malformed" in self.last_error:
                    self.last_error = None
        finally:
            if probe:
                self._probe_until = 0.0
            if self.observe is not None and outcome is not None:
                self.observe(self.name, method, time.monotonic() - started, outcome)
        if was_down and not self.healthy:  # concurrent probes that all succeed announce it once
            self.healthy, self.failures, self.last_error, self.retry_at = True, 0, None, 0.0
            log.log(logging.WARNING if self.reached else logging.INFO, "tier %s is %s", self.name,
                    "back" if self.reached else "up")
            if method != "memory/describe":
                self._revive = asyncio.get_running_loop().create_task(self.refresh())
        self.reached = True
        return result

    async def described(self) -> None:
        """Describe the tier if it never was (down since the router started): what it keeps is known
        only so, and a write or a move into it would go out unchecked (`drops`). One that does not
        answer stays undescribed; the write to it fails anyway."""
        if self.info is None:
            await self.refresh()

    async def refresh(self) -> dict[str, Any] | None:
        """Describe the tier again (start and reconnect); None when it is down."""
        try:
            self.info = await self.call("memory/describe", {}, check=True)
        except A2MError:
            return None
        return self.info

    async def close(self) -> None:
        if self._revive is not None and not self._revive.done():  # a describe after a comeback: not left
            self._revive.cancel()  # pending on a closed client ("Task was destroyed but it is pending")
        await self.client.close()


async def _then(name: str, call: Awaitable[dict[str, Any]],
                arrived: Callable[[str, dict[str, Any]], None]) -> dict[str, Any]:
    result = await call
    arrived(name, result)
    return result


@dataclass
class FanOut:
    """Results of one call sent to several tiers: name -> result, and which tiers were left out."""

    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    degraded: list[str] = field(default_factory=list)
    errors: dict[str, A2MError] = field(default_factory=dict)


class Federation:
    def __init__(self, config: RouterConfig, client_factory: Callable[[TierConfig], Any] | None = None) -> None:
        self.config = config
        self._factory = client_factory or (lambda t: HTTPClient(t.url, token=config.service_token, timeout=t.timeout,
                                                                max_response=t.max_response))
        self.tiers: dict[str, Tier] = {}
        self.order = [t.name for t in config.tiers]
        self.depths = {name: self.depth(name) for name in self.order}  # the layout is fixed at start
        self._observe: Observer | None = None

    def timeline_place(self, name: str) -> tuple[int, int]:
        """Where a tier's records stand among records of one created_at in a timeline: deeper tiers
        first (older by construction: records only move down), then in configured order."""
        return -self.depths.get(name, 0), self.order.index(name)

    def observe_calls(self, observer: Observer | None) -> None:
        """Report every tier call, as it ends, to `observer` (tiers made before or after this)."""
        self._observe = observer
        for tier in self.tiers.values():
            tier.observe = observer

    async def start(self) -> None:
        for tier_config in self.config.tiers:
            self.tiers[tier_config.name] = Tier(tier_config, self._factory(tier_config), observe=self._observe)
        await asyncio.gather(*(t.refresh() for t in self.tiers.values()))
        down = [t.name for t in self.tiers.values() if not t.healthy]
        if down:
            log.warning("router started before these tiers answered: %s (each is retried with backoff; "
                        "/readyz lists them)", ", ".join(down))

    async def close(self) -> None:
        await asyncio.gather(*(t.close() for t in self.tiers.values()), return_exceptions=True)

    def __getitem__(self, name: str) -> Tier:
        return self.tiers[name]

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.tiers[name] for name in self.order)

    def apart(self) -> frozenset[str]:
        """The tiers no record moves into or out of (read-only: a mounted corpus, a read-only engine):
        an id one of them shares with another tier names another record, not a move's two copies."""
        return frozenset(t.name for t in self.tiers.values() if not t.writable)

    def depth(self, name: str) -> int:
        """How far down the spill chain a tier is (0 for a tier nothing spills into)."""
        depth = 0
        current = name
        seen = {name}
        while True:
            parents = [t.name for t in self.config.tiers if current in (t.spill_to, t.promote_to)]
            parents = [p for p in parents if p not in seen]
            if not parents:
                return depth
            depth += 1
            current = parents[0]
            seen.add(current)

    async def fan_out(self, method: str, params: Mapping[str, dict[str, Any]] | dict[str, Any],
                      tiers: Iterable[Tier], *, per_tier: Callable[[Tier], dict[str, Any] | None] | None = None,
                      skip_down: bool = True, arrived: Callable[[str, dict[str, Any]], None] | None = None,
                      slow: bool = False) -> FanOut:
        """Call `method` on every tier concurrently, each under its own timeout. A tier that is down
        (or waiting out its backoff) or fails is listed in `degraded`, never fails the whole call.
        `slow`: see `Tier.call`.

        `arrived(tier, result)` runs on each reply as it comes, so work on the fast tiers' replies
        overlaps the wait for the slowest; an exception there counts as that tier failing."""
        out = FanOut()
        calls: list[tuple[Tier, Awaitable[dict[str, Any]]]] = []
        for tier in tiers:
            tier_params = per_tier(tier) if per_tier is not None else dict(params)  # type: ignore[arg-type]
            if tier_params is None:  # nothing to ask it (a `where.tier` it cannot match): never `degraded`
                continue
            if skip_down and not tier.available():
                out.degraded.append(tier.name)
                out.errors[tier.name] = Unavailable(f"tier {tier.name} is down", {"tier": tier.name})
                continue
            call = tier.call(method, tier_params, probe=skip_down and tier.probe(), slow=slow)
            calls.append((tier, call if arrived is None else _then(tier.name, call, arrived)))
        results = await asyncio.gather(*(c for _, c in calls), return_exceptions=True)
        for (tier, _), result in zip(calls, results):
            if isinstance(result, BaseException):
                if not isinstance(result, A2MError):
                    log.error("tier %s failed %s: %r", tier.name, method, result)
                    result = A2MError(INTERNAL_ERROR, f"tier {tier.name}: {type(result).__name__}")
                elif not isinstance(result, Unavailable):
                    log.warning("tier %s answered %s with %s", tier.name, method, result)
                out.errors[tier.name] = result
                out.degraded.append(tier.name)
            else:
                out.results[tier.name] = result
        out.degraded.sort(key=self.order.index)
        return out
