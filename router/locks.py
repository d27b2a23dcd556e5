"""The per-owner lock under which where an owner's records live changes (decisions 37, 156).

One router serialises an owner's moves, forgets and keyed writes with an
asyncio lock. A deployment runs several routers (deploy/k8s: two to eight),
and one replica's lock does not hold back another's: two replicas moving one
record in opposite directions each deleted the other's copy, and a forget
acknowledged by one replica was undone by another's move writing the record
it had read before the forget (tests/router/test_router_replicas.py).

With `lock_url` naming a Redis, holding an owner's lock also holds a Redis key
for that owner (redis-py's `Lock`: SET NX PX, released by a script that
checks its token), so every replica waits for every other. The key is leased:
renewed while held, so a replica killed while holding it holds up the others
for at most `LEASE_S`. Without `lock_url`, the lock is this router's alone, as
before. The keys are named within the federation's tiers (`scope_of`): routers
in layers, one a tier of another, may name one Redis without waiting on each
other's holds.

Replicas take turns (`TAKE_IN_TURN`): a replica whose callers queue for one
owner took the key back within a fraction of a millisecond of letting it go,
while another replica polls every 10 ms, so the other's calls could wait out
`WAIT_S` and fail. Waiting replicas queue, first come first served: each poll
keeps a replica's place (a sorted set by arrival, on the lock store's clock),
and only the first in the queue takes the key. One replica in line was not
enough: with three or more, the one that had just let go lined up again the
moment the next took the key, and the others drew lots for each turn.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import time
import uuid
from typing import Any, Awaitable, Callable, Iterable, TypeVar

from a2m import errors
from a2m.errors import A2MError

log = logging.getLogger("a2m.router")
T = TypeVar("T")

LEASE_S = 15.0  # how long a held key outlives a replica that stopped renewing it (killed, frozen)
WAIT_S = 60.0  # how long a call waits for another replica's hold before it fails, to be retried
POLL_S = 0.01  # how often a waiting replica tries the key again
LINE_MS = 250  # how long a place in the queue outlives a waiter that stopped polling (25 polls)
# How long `state` waits for the lock store: describe, /readyz and the router's start ask it, and a
# Redis that accepts connections and never answers held each for the client's 5 s socket timeout.
STATE_WAIT_S = 0.75
# How long one lock command (a take, a renewal, a check, a release) waits for its answer: a Redis that
# accepts connections and never answers (stopped, partitioned past the handshake) held every keyed
# write, forget and move for the client's 5 s socket timeout. A healthy Redis answers in well under
# 10 ms, and a busy one (a fork, a slow script) stalls for tens to hundreds of ms; a call past this
# fails, to be retried. A take under contention polls, each poll bounded so; the whole wait is WAIT_S.
ANSWER_S = 1.0
# How soon a renewal that failed (cut off at ANSWER_S, refused) is tried again, from when it began: a
# stall over a renewal otherwise cost a third of the lease, and two in a row let it lapse while held.
RETRY_S = ANSWER_S
KEY_PREFIX = "a2m:owner-lock:"
# The suffixes of a lock key's line. `:next` is the previous version's line, one token: the replica
# that takes the key next. Kept so that replicas of both versions take turns during a rolling update:
# the first in the queue stands in it, and a replica of either waits while it names another.
LINE = ":next"
QUEUE = ":queue"  # the waiters' tokens by arrival (ms on the lock store's clock)
ALIVE = ":alive"  # the waiters' tokens by their last poll (ms): a place unpolled for LINE_MS is dropped

# KEYS: the lock, `:next`, the queue, its liveness. ARGV: this caller's token, the lease (ms), a
# place's life (ms). One script per poll. Every take is SET NX, here as in every version before, so
# one holder at a time whatever else each version's line does. TIME before writes needs the
# script's effects replicated, Redis 5's default (the project's oldest is 6.2).
TAKE_IN_TURN = """
local me, life = ARGV[1], tonumber(ARGV[3])
local clock = redis.call('TIME')
local now = clock[1] * 1000 + math.floor(clock[2] / 1000)
-- Waiters whose polls stopped (killed, frozen, gone without a word) lose their place.
for _, gone in ipairs(redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now - life)) do
  redis.call('ZREM', KEYS[3], gone)
  redis.call('ZREM', KEYS[4], gone)
end
local first = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
local next = redis.call('GET', KEYS[2])
local mine = (not first or first == me) and (not next or next == me)
-- First in the queue (or none queued), and no other in `:next`: take the key when free.
if mine and redis.call('SET', KEYS[1], me, 'NX', 'PX', ARGV[2]) then
  redis.call('ZREM', KEYS[3], me)
  redis.call('ZREM', KEYS[4], me)
  if next then redis.call('DEL', KEYS[2]) end
  return 1
end
-- Keep my place (its arrival set once), or take the last one; the queue lapses with its waiters.
redis.call('ZADD', KEYS[3], 'NX', now, me)
redis.call('ZADD', KEYS[4], now, me)
redis.call('PEXPIRE', KEYS[3], life)
redis.call('PEXPIRE', KEYS[4], life)
-- The first stands in `:next` too, where the previous version's replicas wait for it.
if mine then redis.call('SET', KEYS[2], me, 'PX', life) end
return 0
"""
# KEYS: the lock, `:next`, the queue, its liveness. ARGV: a token. What a caller that gave up waiting
# may hold is let go: the key, `:next`, its place in the queue.
GIVE_UP = """
for i = 1, 2 do
  if redis.call('GET', KEYS[i]) == ARGV[1] then redis.call('DEL', KEYS[i]) end
end
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('ZREM', KEYS[4], ARGV[1])
return 0
"""


def line_keys(name: str) -> list[str]:
    """A lock key and its line's (`TAKE_IN_TURN`'s and `GIVE_UP`'s KEYS)."""
    return [name, name + LINE, name + QUEUE, name + ALIVE]


class LockFailed(A2MError):
    """The replicas' lock for an owner could not be had: its store did not answer, or another
    replica held it past the wait. A pass that only moves records (consolidate) fails with it
    rather than answer that it moved nothing."""


def unavailable(exc: BaseException) -> LockFailed:
    """The caller's failure for a lock store that did not answer. Its cause (the Redis client's words,
    which name the store's host or socket path) goes to the log, not to a caller, who may be any agent
    holding a token (decision 113, as a tier engine's; `SharedLocks.state` words it the same way)."""
    log.warning("the owner lock store (lock_url) does not answer: %s", exc)
    return LockFailed(errors.INTERNAL_ERROR, "the owner lock store (lock_url) is unavailable (the router's log "
                      "has the cause); try again", {"lock": "unavailable"})


def key_part(name: str | None) -> str:
    """An owner or principal as one part of a key in the shared Redis: fixed-length whatever it
    holds (hashed), `-` for none (the unowned partition, the anonymous caller)."""
    return "-" if name is None else hashlib.sha256(name.encode()).hexdigest()


def scope_of(tier_urls: Iterable[str]) -> str:
    """The lock keys' namespace: the tiers whose records the lock keeps in place, as their URLs.

    Replicas name the same tiers, so they share it. A router that is itself a tier of another
    (layers) names other tiers: with one key per owner for both, the upper router held the owner's
    key while it wrote a keyed record to the lower, which waited on that very key until the upper's
    tier call timed out; every keyed write, forget and move through the layers failed so."""
    joined = "\n".join(sorted({url.rstrip("/") for url in tier_urls}))
    return hashlib.sha256(joined.encode()).hexdigest()[:16]


class SharedLocks:
    """Owner locks held in one Redis, seen by every router replica that names it."""

    def __init__(self, url: str, *, scope: str = "", lease: float = LEASE_S, wait: float = WAIT_S) -> None:
        import redis.asyncio as aioredis

        self.lease, self.wait = lease, wait
        self._prefix = KEY_PREFIX + (f"{scope}:" if scope else "")
        self.redis = aioredis.from_url(url, socket_connect_timeout=2.0, socket_timeout=5.0)  # the rate limit's too
        self._take = self.redis.register_script(TAKE_IN_TURN)
        self._give_up = self.redis.register_script(GIVE_UP)
        self._giving_up: set[asyncio.Task[None]] = set()

    def key(self, owner: str | None) -> str:
        """A fixed-length name whatever the owner holds (hashed), the unowned partition apart, within
        this federation's `scope` (`scope_of`)."""
        return self._prefix + key_part(owner)

    async def acquire(self, owner: str | None) -> "_Lease":
        from redis.exceptions import RedisError

        lock = _turn_taking_lock()(self.redis, self.key(owner), timeout=self.lease, sleep=POLL_S,
                               blocking_timeout=self.wait, thread_local=False)
        lock.take = self._take
        token = uuid.uuid4().hex
        try:
            held = await lock.acquire(token=token)
        except BaseException as exc:
            # A SET sent, its answer lost (cancelled, timed out) may hold the key for the whole lease,
            # and a place in the line holds the key back from other replicas: both are let go.
            self._let_go(lock.name, token)
            if isinstance(exc, (RedisError, OSError)):
                raise unavailable(exc) from exc
            raise
        if not held:
            self._let_go(lock.name, token)
            raise LockFailed(errors.INTERNAL_ERROR, f"another router replica has held this owner's records for "
                             f"over {self.wait:g} s (a move, a forget or a keyed write); try again", {"lock": "busy"})
        return _Lease(lock, self.lease, functools.partial(self._let_go, lock.name, token))

    def _let_go(self, name: str, token: str) -> None:
        """Release what `token` may hold of `name` (the key, a place in its line), in the background:
        a cancelled caller must not wait on the store, which may be what failed."""
        async def give_up() -> None:
            from redis.exceptions import RedisError

            try:
                await self._give_up(keys=line_keys(name), args=[token])
            except (RedisError, OSError) as exc:  # both lapse by themselves
                log.info("letting go of an owner lock not taken failed (%s); it lapses within its lease", exc)

        task = asyncio.get_running_loop().create_task(give_up())
        self._giving_up.add(task)
        task.add_done_callback(self._giving_up.discard)

    async def state(self) -> dict[str, Any]:
        """What describe, /readyz and `a2m doctor` say of the lock store: `status` up or down (with
        `error`; its words, a host or a socket path, go to the log, as a tier engine's do, decision
        113), and `evicts`: the `maxmemory-policy` of a Redis that may evict a held key, whose TTL
        makes it a candidate for every policy but `noeviction` once `maxmemory` is reached. A store
        that says nothing within STATE_WAIT_S is down."""
        from redis.exceptions import RedisError, ResponseError

        try:
            try:
                memory = await answered(self.redis.info("memory"), STATE_WAIT_S)
            except ResponseError:  # INFO renamed or refused (some managed Redis): up, its policy unknown
                await answered(self.redis.ping(), STATE_WAIT_S)
                return {"status": "up"}
        except (RedisError, OSError) as exc:
            log.warning("the owner lock store (lock_url) does not answer: %s", exc)
            return {"status": "down",
                    "error": "the owner lock store (lock_url) does not answer (the router's log has the cause)"}
        policy = memory.get("maxmemory_policy")
        if int(memory.get("maxmemory") or 0) and policy not in (None, "noeviction"):
            return {"status": "up", "evicts": policy}
        return {"status": "up"}

    async def close(self) -> None:
        if self._giving_up:
            await asyncio.wait(self._giving_up, timeout=1.0)
        await self.redis.aclose()


async def answered(call: Awaitable[T], within: float = ANSWER_S) -> T:
    """`call`'s answer from the shared Redis, or TimeoutError (an OSError, as the client's own are)
    after `within` seconds: the client's socket timeout (5 s) is its backstop, not a caller's wait."""
    try:
        async with asyncio.timeout(within):
            return await call
    except TimeoutError as exc:
        raise TimeoutError(f"no answer in {within:g} s") from exc


@functools.cache
def _turn_taking_lock() -> type:
    """redis-py's Lock (its lease, renewal and token-checked release) whose take lets the replica
    first in the queue go first (TAKE_IN_TURN), each of its commands bounded (`answered`). Made on first
    use: a router without `lock_url` does not import redis (0.1 s of its start)."""
    from redis.asyncio.lock import Lock

    class TurnTakingLock(Lock):
        take: Any  # the registered TAKE_IN_TURN script

        async def do_acquire(self, token: str | bytes) -> bool:
            return bool(await answered(self.take(keys=line_keys(self.name),
                                                 args=[token, int(self.timeout * 1000), LINE_MS])))

        async def do_reacquire(self) -> Any:
            return await answered(super().do_reacquire())

        async def do_release(self, expected_token: bytes) -> None:
            await answered(super().do_release(expected_token))

        async def owned(self) -> bool:
            return await answered(super().owned())

    return TurnTakingLock


class _Lease:
    """A held Redis lock, renewed every third of its lease until released; a renewal that failed is
    tried again RETRY_S after it began, while the lease may still be saved."""

    def __init__(self, lock: Any, lease: float, let_go: Callable[[], None]) -> None:
        self._lock = lock
        self._let_go = let_go  # the key let go in the background (`SharedLocks._let_go`)
        self._renewing = asyncio.get_running_loop().create_task(self._renew(lease))

    async def _renew(self, lease: float) -> None:
        """Renew every third of the lease. A renewal cut off by a stall of over ANSWER_S (a fork, a
        slow script) was tried again only a third of the lease later: a second stall there let the
        lease lapse while held, though the store had answered in between. A failed one is tried
        again RETRY_S after it began until one goes through or the lease has run out (then every
        third of it, to say a lapse once the store answers). Said once per outage, and its end."""
        from redis.exceptions import LockNotOwnedError, RedisError

        renewed = time.monotonic()  # when the lease last began (a little after, for the first: the take)
        pause, failed = lease / 3, 0
        while True:
            await asyncio.sleep(pause)
            began = time.monotonic()
            try:
                await self._lock.reacquire()
            except LockNotOwnedError:  # lapsed (or evicted): renewing cannot take it back, nor saying so again
                log.error("an owner lock lapsed while held: another router replica may change the owner's "
                          "records while this one does")
                return
            except (RedisError, OSError) as exc:  # the lease may lapse: another replica could then move too
                failed += 1
                left = renewed + lease - time.monotonic()
                if failed == 1:
                    log.error("renewing an owner lock failed (%s): tried again every %g s while its lease lasts; "
                              "another router replica may take it in %.1f s", exc, RETRY_S, max(0.0, left))
                pause = _retry_in(began, left, lease)
                continue
            if failed:
                log.warning("renewed an owner lock after %d failed %s", failed, "try" if failed == 1 else "tries")
            renewed, pause, failed = began, lease / 3, 0

    async def held(self) -> bool:
        """Whether the key is still this lease's: False once it lapsed (a pause past the lease, an
        eviction) and maybe went to another replica. A store that does not answer cannot say so."""
        from redis.exceptions import RedisError

        try:
            return bool(await self._lock.owned())
        except (RedisError, OSError) as exc:
            raise unavailable(exc) from exc

    async def release(self) -> None:
        """Let go of the key. A release that failed (cut off at ANSWER_S), or a caller cancelled
        meanwhile (a shutdown's deadline, a caller of the router as a library giving up), hands it
        to the background: cut short before its script reached Redis (a connection being made), the
        key held the owner from every replica, this one too, for the rest of its lease."""
        from redis.exceptions import LockError, RedisError

        self._renewing.cancel()
        try:
            await self._lock.release()
        except asyncio.CancelledError:
            self._let_go()
            raise
        except LockError:
            log.error("an owner lock had lapsed before it was released: another router replica may have "
                      "changed the owner's records meanwhile")
        except (RedisError, OSError) as exc:
            # Cut off at ANSWER_S (a stall of a second or more), the release's command went with its
            # connection and never ran: the key held the owner for the rest of its lease. Let go in
            # the background (the client's own 5 s wait), or it lapses within the lease.
            self._let_go()
            log.warning("releasing an owner lock failed (%s); it is let go in the background or lapses "
                        "within its lease", exc)


def _retry_in(began: float, left: float, lease: float) -> float:
    """How long to wait before a failed renewal that began at `began` is tried again, with `left`
    seconds of the lease left: RETRY_S after it began (a try cut off at ANSWER_S goes again at once;
    one refused at once waits), where that is sooner than the usual third of the lease and the lease
    has not run out by then; else a third of the lease, as the renewals that went through."""
    soon = max(0.0, began + RETRY_S - time.monotonic())
    return soon if soon < lease / 3 and soon < left else lease / 3


class OwnerLock:
    """An asyncio.Lock's face (`async with`, `locked()`) over this router's lock for one owner and,
    where `shared`, the replicas' one. The local lock is taken first, so a router has at most one
    call waiting on Redis per owner."""

    def __init__(self, owner: str | None, shared: SharedLocks | None) -> None:
        self.owner = owner
        self._local = asyncio.Lock()
        self._shared = shared
        self._lease: _Lease | None = None

    def locked(self) -> bool:
        return self._local.locked()

    @property
    def here(self) -> asyncio.Lock:
        """This router's lock for the owner alone, not the replicas': what holds back this router's
        own moves (a read that two of them overlapped, router/reads.py)."""
        return self._local

    async def check(self) -> None:
        """Raise LockFailed where the replicas' key this holder took has lapsed: a step that writes
        or deletes records on the lock's word (a move's write, its source delete) asks first. A
        lease is not a fence: a replica frozen past it (a stopped process, a long pause) resumed its
        move after another replica had taken the owner, and wrote back a record that one had
        forgotten. Asking narrows that to a step's own round trip. Without `lock_url`, or not held,
        there is nothing to ask."""
        if self._lease is not None and not await self._lease.held():
            raise LockFailed(errors.INTERNAL_ERROR, "this router's hold of the owner lapsed (a pause longer than "
                             f"its {LEASE_S:g} s lease?): another replica may hold the owner; nothing more was "
                             "written or deleted, retry", {"lock": "lapsed"})

    async def __aenter__(self) -> None:
        await self._local.acquire()
        if self._shared is not None:
            try:
                self._lease = await self._shared.acquire(self.owner)
            except BaseException:
                self._local.release()
                raise

    async def __aexit__(self, *exc: object) -> None:
        lease, self._lease = self._lease, None
        try:
            if lease is not None:
                await lease.release()
        finally:
            self._local.release()
