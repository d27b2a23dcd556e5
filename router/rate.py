"""Each caller's rate of calls to the router: a token bucket per principal (decision 123).

One agent in a loop (a retry without backoff, a recall per token it streams) is
every other tenant's outage: each of its calls fans out to the tiers. With
`[rate_limit]` set, a caller past its budget is answered `-32006` (quota
exceeded) at once, before any tier is asked, with `data.retry_after` saying
when its next call will go.

The caller is the principal its bearer token maps to. A call without one (a
router without tokens, stdio, its discovery document) draws on one shared
bucket: without tokens a caller names its own `owner`, so a bucket per owner
would let one caller pass as any number of them. The buckets are therefore
bounded by the configured principals, plus the shared one. The anonymous
discovery document of a router with tokens asks no tier and is not counted.

With `lock_url`, the buckets live in that Redis (`SharedBuckets`), so N router
replicas do not let a caller make N times the rate.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Any, Callable

from a2m import errors
from a2m.dispatch import Context, Handler
from a2m.errors import A2MError

from .locks import answered, key_part


log = logging.getLogger("a2m.router")

# The slowest rate `[rate_limit]` takes: a call a day. Below ~1e-305 a refusal's wait overflowed a float
# (every refused call a -32603 and a traceback), and a retry_after of years tells a client nothing.
MIN_PER_SECOND = 1 / 86400


@dataclass(frozen=True)
class RateLimit:
    """`per_second` calls a second on average, and up to `burst` at once after a quiet spell."""

    per_second: float
    burst: int

    def describe(self) -> dict[str, Any]:
        return {"per_second": self.per_second, "burst": self.burst}


class Buckets:
    """One token bucket per principal, full when first seen. `on_refused(method)` is told of each
    refusal (the router's metrics)."""

    def __init__(self, limit: RateLimit, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit = limit
        self.clock = clock
        self.on_refused: Callable[[str], None] | None = None
        self._buckets: dict[str | None, tuple[float, float]] = {}  # principal -> (tokens, at)

    def take(self, principal: str | None) -> float:
        """Take one call from `principal`'s budget: 0.0 when it may go now, else the seconds until
        its next call may (nothing is taken then, so a refused caller does not dig itself deeper)."""
        now = self.clock()
        tokens, at = self._buckets.get(principal, (float(self.limit.burst), now))
        tokens = min(float(self.limit.burst), tokens + (now - at) * self.limit.per_second)
        if tokens >= 1.0:
            self._buckets[principal] = (tokens - 1.0, now)
            return 0.0
        self._buckets[principal] = (tokens, now)
        return (1.0 - tokens) / self.limit.per_second

    async def wait(self, principal: str | None) -> float:
        """`take`, where the buckets are kept (here: this process)."""
        return self.take(principal)

    async def spend(self, principal: str | None, method: str) -> None:
        """Take one call, or raise -32006 saying when the next one will go."""
        wait = await self.wait(principal)
        if not wait:
            return
        if self.on_refused is not None:
            self.on_refused(method)
        retry_after = math.ceil(wait * 1000) / 1000  # never early: a retry at once would be refused again
        raise A2MError(errors.QUOTA_EXCEEDED,
                       f"rate limit: {self.limit.per_second:g} calls a second, bursts of {self.limit.burst}; "
                       f"retry in {retry_after:g} s", {"retry_after": retry_after, **self.limit.describe()})


# How long a call waits on the shared buckets before it counts in this process's: their round trip is well
# under a millisecond. A Redis that accepts connections and never answers held every call (a read too) for
# the client's 5 s socket timeout before the fallback.
SHARED_WAIT_S = 0.25
# How long after the shared buckets failed a call counts in this process's without asking them again: one
# call in this long pays SHARED_WAIT_S while they are away, not every call.
SHARED_RETRY_S = 5.0


# KEYS: the bucket. ARGV: burst, per_second. Returns the wait as a string (a Lua number returned to Redis
# is cut to an integer). The clock is the Redis server's, one for every replica.
SHARED_TAKE = """
if redis.replicate_commands then redis.replicate_commands() end
local burst, rate = tonumber(ARGV[1]), tonumber(ARGV[2])
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
local held = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens = tonumber(held[1]) or burst
tokens = math.min(burst, tokens + math.max(0, now - (tonumber(held[2]) or now)) * rate)
local wait = 0
if tokens >= 1 then tokens = tokens - 1 else wait = (1 - tokens) / rate end
redis.call('HSET', KEYS[1], 'tokens', string.format('%.17g', tokens), 'at', string.format('%.17g', now))
redis.call('PEXPIRE', KEYS[1], math.ceil((burst / rate + 1) * 1000))
return string.format('%.17g', wait)
"""


class SharedBuckets(Buckets):
    """The buckets in the Redis the router replicas share (`lock_url`), one key per principal
    within the federation (`scope`, as the owner locks'). One round trip a call. Where that Redis
    does not answer, this process's own buckets count meanwhile: a rate limit guards the tiers, and
    refusing every call for want of it would be the outage it guards against."""

    def __init__(self, limit: RateLimit, redis: Any, scope: str) -> None:
        super().__init__(limit)
        self._take = redis.register_script(SHARED_TAKE)
        self._prefix = f"a2m:rate:{scope}:"
        self._unshared = False  # said once per outage
        self._retry_at = 0.0  # (monotonic) until when the shared buckets are not asked: they failed

    async def wait(self, principal: str | None) -> float:
        from redis.exceptions import RedisError

        if time.monotonic() < self._retry_at:
            return self.take(principal)
        key = self._prefix + key_part(principal)
        try:
            wait = float(await answered(self._take(keys=[key], args=[self.limit.burst, repr(self.limit.per_second)]),
                                        SHARED_WAIT_S))
        except (RedisError, OSError) as exc:
            self._retry_at = time.monotonic() + SHARED_RETRY_S
            if not self._unshared:
                log.warning("the rate limit's shared buckets (lock_url) do not answer (%s): each router replica "
                            "counts its own calls until they do", exc)
                self._unshared = True
            return self.take(principal)
        if self._unshared:
            log.warning("the rate limit's shared buckets (lock_url) answer again")
            self._unshared = False
        return wait


def rate_limited(handler: Handler, buckets: Buckets, method: str) -> Handler:
    """`handler` behind the caller's budget: refused before any tier is asked."""
    async def limited(params: dict[str, Any], ctx: Context) -> dict[str, Any]:
        await buckets.spend(ctx.principal, method)
        return await handler(params, ctx)

    return limited
