"""The working tier's Store on Redis: the live transcript, replayed before every model call.

Layout (P is the key prefix, `a2m:<tier name>` by default; `<o>`, `<s>`, `<g>` are
the owner, session and group encoded by `_enc`, so `None` is its own partition
and no name can collide with another):

    P:seq              global insertion counter (breaks created_at ties)
    P:dims             embedding width, fixed by the first stored vector
    P:r:<id>           HASH  one record: j (JSON of the immutable fields), e (embedding
                             JSON), sal / ac / aa (salience, access_count, accessed_at,
                             kept apart so touch and reinforce never rewrite the JSON),
                             o / s / g / k / m (its index entries)
    P:o:<o>:all        ZSET  every record of the owner
    P:o:<o>:s:<s>      ZSET  one session (`!` is the records without a session)
    P:o:<o>:g:<g>      ZSET  one group, so a tool call and its results read together
    P:o:<o>:k          HASH  key -> id
    P:o:<o>:kz         ZSET  keys at score 0, for key_prefix by ZRANGEBYLEX
    P:o:<o>:sess       HASH  <s> -> session name: the session registry
    P:o:<o>:tch        HASH  <s> -> latest accessed_at in that session
    P:o:<o>:ver        a stamp set by every write that changes the owner's indexes
    P:vers             the count in those stamps

Every ZSET scores a record by the epoch milliseconds of its `created_at` (exact
in a double) and names it `<16-digit seq><id>`: Redis orders equal scores by
member, so the order is created_at, then insertion, in the index itself, and a
time range is a score range.

Every operation is one Lua script, so one round trip, and writes are atomic: a
script runs alone (a recall's read of one index's members is a plain ZRANGEBYSCORE,
which Lua would only slow down), and the write script checks everything that can fail (the
embedding width) before its first write. Input that cannot be encoded is
refused in Python before anything is sent. The scripts build key names from the
prefix, so this layout assumes one Redis, not a Redis Cluster.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta, timezone
from typing import Any, Awaitable, Callable, Collection, Literal, Mapping, Sequence
from urllib.parse import quote, unquote

import anyio
import orjson
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import AuthenticationError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from a2m.filters import Scope, matches
from a2m.records import Record
from a2m.text import HeldTerms, rank, tokenize
from a2m.timefmt import format_ts
from backends.settings import SettingsError, TierSettings
from backends.store import (Position, SessionInfo, StoreConflict, StoreIdTaken, StoreReadOnly, StoreRejected,
                            StoreUnavailable, StoreWidthMismatch)

from .embedded import RedisServer

log = logging.getLogger("a2m.working")

_REJECT = "A2M-REJECT"
_WIDTH = "A2M-WIDTH"  # an embedding not as wide as the store's: the store's width, the put's
_TAKEN = "A2M-TAKEN"  # an id another owner holds
_CONFLICT = "A2M-CONFLICT"  # a key another writer took since the batch was resolved
_POLL_S = 0.5  # how stale the embedded child's liveness may be on the happy path
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MS = timedelta(milliseconds=1)
_MUTABLE = ("salience", "access_count", "accessed_at", "embedding")
_TERMS_HELD = 65_536  # records whose BM25 terms a server keeps for recall; past this it starts over
_HOLD_ATTEMPTS = 3  # reads of a recall's unheld members before it ranks only those held
_RANGES_KEPT = 64  # index ranges of one owner whose members a server remembers between recalls...
_MEMBERS_KEPT = _TERMS_HELD  # ...and members in all of them (an empty range counts one)
_DELETE_ATTEMPTS = 8  # reads again of records a forget found re-put (in place) between its read and its delete

_LIB = """
local P = ARGV[1]
local changed = {}  -- owners whose indexes this script changed: their `ver` is stamped at the end
local function unindex(id, expect)
  local rk = P .. ':r:' .. id
  local h = redis.call('HMGET', rk, 'o', 's', 'g', 'k', 'm')
  local o, s, g, k, m = h[1], h[2], h[3], h[4], h[5]
  if not o then return 0 end
  if expect ~= nil and expect ~= '' and expect ~= m then return 0 end
  changed[o] = true
  local base = P .. ':o:' .. o
  redis.call('ZREM', base .. ':all', m)
  local sk = base .. ':s:' .. s
  redis.call('ZREM', sk, m)
  if redis.call('ZCARD', sk) == 0 then
    redis.call('HDEL', base .. ':sess', s)
    redis.call('HDEL', base .. ':tch', s)
  end
  if g then redis.call('ZREM', base .. ':g:' .. g, m) end
  if k and redis.call('HGET', base .. ':k', k) == id then
    redis.call('HDEL', base .. ':k', k)
    redis.call('ZREM', base .. ':kz', k)
  end
  redis.call('DEL', rk)
  return 1
end
"""

# ARGV: P, nputs, ndeletes, batch width ('' if no vector),
#       per put: id o s session-name g key score json sal ac aa emb expect keep  (14)
#       per delete: id expected-member expect                                     (3)
# expected-member: '' = unconditional. expect: '' = unconditional, 0 = the id must not exist, n = it
# must be this owner's at revision n. keep: '' = the put's statistics, 'a' = access_count and
# accessed_at as stored, 'as' = those and salience.
# Deletes run before puts, so a batch may delete one id and put another in its place.
_WRITE = _LIB + """
local n, d, width = tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
if width ~= '' then
  local stored = redis.call('GET', P .. ':dims')
  if stored and stored ~= width then
    return redis.error_reply('A2M-WIDTH ' .. stored .. ' ' .. width)
  end
end
-- Whether id is as the caller resolved it (see `expect` above); o = nil: any owner (a delete's id
-- was checked to be the caller's when the batch was resolved).
local function as_expected(id, o, expect)
  if expect == '' then return true end
  local h = redis.call('HMGET', P .. ':r:' .. id, 'o', 'j')
  if expect == '0' then return not h[1] end
  if not h[1] or (o and h[1] ~= o) then return false end
  return cjson.decode(h[2])['revision'] == tonumber(expect)
end
-- Checked before anything changes: a put's id held by another owner, or its key held by another
-- live record not deleted here, or an id not as the caller resolved it, means the caller resolved
-- the batch against a store that has since changed (another writer, another replica, a forget or
-- a replace on this one): nothing is written.
local deleted = {}
local i = 5 + 14 * n
for _ = 1, d do
  deleted[ARGV[i]] = true
  if not as_expected(ARGV[i], nil, ARGV[i + 2]) then
    return redis.error_reply('A2M-CONFLICT ' .. ARGV[i])
  end
  i = i + 3
end
i = 5
for _ = 1, n do
  local id, o, k, expect = ARGV[i], ARGV[i + 1], ARGV[i + 5], ARGV[i + 12]
  local held = redis.call('HGET', P .. ':r:' .. id, 'o')
  if held and held ~= o then return redis.error_reply('A2M-TAKEN ' .. id) end
  if (expect == '0' and held) or (expect ~= '0' and expect ~= '' and not as_expected(id, o, expect)) then
    return redis.error_reply('A2M-CONFLICT ' .. id)
  end
  if k ~= '!' then
    local holder = redis.call('HGET', P .. ':o:' .. o .. ':k', string.sub(k, 2))
    if holder and holder ~= id and not deleted[holder] then
      return redis.error_reply('A2M-CONFLICT ' .. string.sub(k, 2))
    end
  end
  i = i + 14
end
local removed = 0
i = 5 + 14 * n
for _ = 1, d do
  removed = removed + unindex(ARGV[i], ARGV[i + 1])
  i = i + 3
end
i = 5
for _ = 1, n do
  local id, o, s, sname, g, k = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4], ARGV[i + 5]
  local score, j, sal, ac, aa, e = ARGV[i + 6], ARGV[i + 7], ARGV[i + 8], ARGV[i + 9], ARGV[i + 10], ARGV[i + 11]
  local keep = ARGV[i + 13]
  i = i + 14
  if keep ~= '' then  -- touches and reinforces since the caller read the record are kept
    local h = redis.call('HMGET', P .. ':r:' .. id, 'o', 'ac', 'aa', 'sal')
    if h[1] == o then
      ac, aa = h[2], h[3] or ''
      if keep == 'as' then sal = h[4] end
    end
  end
  unindex(id, nil)
  local m = string.format('%016d', redis.call('INCR', P .. ':seq')) .. id
  local rk = P .. ':r:' .. id
  redis.call('HSET', rk, 'o', o, 's', s, 'm', m, 'j', j, 'sal', sal, 'ac', ac)
  if aa ~= '' then redis.call('HSET', rk, 'aa', aa) end
  if e ~= '' then redis.call('HSET', rk, 'e', e) end
  local base = P .. ':o:' .. o
  changed[o] = true
  redis.call('ZADD', base .. ':all', score, m)
  redis.call('ZADD', base .. ':s:' .. s, score, m)
  if s ~= '!' then redis.call('HSET', base .. ':sess', s, sname) end
  if g ~= '!' then
    redis.call('HSET', rk, 'g', g)
    redis.call('ZADD', base .. ':g:' .. g, score, m)
  end
  if k ~= '!' then
    k = string.sub(k, 2)
    redis.call('HSET', rk, 'k', k)
    redis.call('HSET', base .. ':k', k, id)
    redis.call('ZADD', base .. ':kz', 0, k)
  end
end
if width ~= '' then redis.call('SETNX', P .. ':dims', width) end
if next(changed) then
  -- A count and the server's clock: unique even if the data is flushed and the count starts again.
  local t = redis.call('TIME')
  local stamp = redis.call('INCR', P .. ':vers') .. '@' .. t[1] .. '.' .. t[2]
  for o in pairs(changed) do redis.call('SET', P .. ':o:' .. o .. ':ver', stamp) end
end
return removed
"""

# ARGV: P, owner, want-embeddings, mode, mode args.  Returns the index member of each
# record, then one JSON array of the records with their mutable fields spliced into
# the stored JSON (server-made text: a timestamp, numbers, a vector), so Python
# decodes one document, not six values a record.
#   z      <index suffix> <min> <max> <rev 0|1> <limit, -1 = all>
#   zb     <index suffix> <min> <max> <ms> <16-digit seq> <limit, -1 = all>: newest first, before (ms, seq)
#   ids    <id>...
#   keys   <key>...
#   prefix <key prefix>
_FETCH = """
local P, o, want, mode = ARGV[1], ARGV[2], ARGV[3] == '1', ARGV[4]
local base = P .. ':o:' .. o
local ids, members = {}, nil
if mode == 'z' then
  local key, lo, hi, rev, limit = base .. ARGV[5], ARGV[6], ARGV[7], ARGV[8] == '1', tonumber(ARGV[9])
  if rev then
    members = redis.call('ZREVRANGEBYSCORE', key, hi, lo, 'LIMIT', 0, limit)
  else
    members = redis.call('ZRANGEBYSCORE', key, lo, hi, 'LIMIT', 0, limit)
  end
  for x = 1, #members do ids[x] = string.sub(members[x], 17) end
elseif mode == 'zb' then
  -- Newest first, strictly before the position (<ms>, <seq>), found by rank: within one score a
  -- sorted set orders by member, whose 16-digit prefix is the seq, so a crowded millisecond is
  -- searched, not read.
  local key, lo, hi, ms, seq, limit = base .. ARGV[5], ARGV[6], ARGV[7], ARGV[8], ARGV[9], tonumber(ARGV[10])
  local a = redis.call('ZCOUNT', key, '-inf', '(' .. ms)
  local b = a + redis.call('ZCOUNT', key, ms, ms)
  while a < b do
    local mid = math.floor((a + b) / 2)
    if string.sub(redis.call('ZRANGE', key, mid, mid)[1], 1, 16) < seq then a = mid + 1 else b = mid end
  end
  local stop, first = a, 0  -- ranks [first, stop) are in scope and before the position
  if hi ~= '+inf' then stop = math.min(stop, redis.call('ZCOUNT', key, '-inf', hi)) end
  if lo ~= '-inf' then first = redis.call('ZCOUNT', key, '-inf', string.sub(lo, 2)) end
  if limit >= 0 then first = math.max(first, stop - limit) end
  members = {}
  if stop > first then members = redis.call('ZRANGE', key, first, stop - 1) end
  for x = 1, #members do ids[x] = string.sub(members[#members + 1 - x], 17) end
elseif mode == 'ids' then
  for x = 5, #ARGV do ids[#ids + 1] = ARGV[x] end
elseif mode == 'keys' then
  if #ARGV >= 5 then
    local found = redis.call('HMGET', base .. ':k', unpack(ARGV, 5))
    for x = 1, #found do if found[x] then ids[#ids + 1] = found[x] end end
  end
else
  local p = ARGV[5]
  local keys
  if p == '' then
    keys = redis.call('ZRANGEBYLEX', base .. ':kz', '-', '+')
  else
    keys = redis.call('ZRANGEBYLEX', base .. ':kz', '[' .. p, '(' .. p .. '\\255')
  end
  for x = 1, #keys do ids[#ids + 1] = redis.call('HGET', base .. ':k', keys[x]) end
end
local out, bodies = {}, {}
for x = 1, #ids do
  local h = redis.call('HMGET', P .. ':r:' .. ids[x], 'o', 'm', 'j', 'sal', 'ac', 'aa', 'e')
  if h[1] == o then
    out[#out + 1] = h[2]
    local aa, e = 'null', 'null'
    if h[6] and h[6] ~= '' then aa = '"' .. h[6] .. '"' end
    if want and h[7] and h[7] ~= '' then e = h[7] end
    bodies[#bodies + 1] = string.sub(h[3], 1, -2) .. ',"salience":' .. h[4] .. ',"access_count":' .. h[5]
      .. ',"accessed_at":' .. aa .. ',"embedding":' .. e .. '}'
  end
end
out[#out + 1] = '[' .. table.concat(bodies, ',') .. ']'
return out
"""

# ARGV: P, owner, at, ids...  Returns id, access_count after the touch, for each id touched.
_TOUCH = """
local P, o, at = ARGV[1], ARGV[2], ARGV[3]
local tch = P .. ':o:' .. o .. ':tch'
local out = {}
for x = 4, #ARGV do
  local rk = P .. ':r:' .. ARGV[x]
  local h = redis.call('HMGET', rk, 'o', 's')
  if h[1] == o then
    out[#out + 1] = ARGV[x]
    out[#out + 1] = redis.call('HINCRBY', rk, 'ac', 1)
    redis.call('HSET', rk, 'aa', at)
    if h[2] ~= '!' then
      local last = redis.call('HGET', tch, h[2])
      if not last or last < at then redis.call('HSET', tch, h[2], at) end
    end
  end
end
return out
"""

# ARGV: P, owner, amount, ids...  salience = clamp(salience + amount) in doubles, like Python.
_REINFORCE = """
local P, o, amount = ARGV[1], ARGV[2], tonumber(ARGV[3])
local n = 0
for x = 4, #ARGV do
  local rk = P .. ':r:' .. ARGV[x]
  local h = redis.call('HMGET', rk, 'o', 'sal')
  if h[1] == o then
    local v = tonumber(h[2]) + amount
    if v > 1 then v = 1 elseif v < 0 then v = 0 end
    local s = string.format('%.17g', v)
    if not string.find(s, '[.e]') then s = s .. '.0' end  -- 1, not 1.0, would read back as an integer
    redis.call('HSET', rk, 'sal', s)
    n = n + 1
  end
end
return n
"""

# ARGV: P, owner.  Returns name count first-score last-score touched per named session.
_SESSIONS = """
local P, o = ARGV[1], ARGV[2]
local base = P .. ':o:' .. o
local reg = redis.call('HGETALL', base .. ':sess')
local out = {}
for x = 1, #reg, 2 do
  local zk = base .. ':s:' .. reg[x]
  local first = redis.call('ZRANGE', zk, 0, 0, 'WITHSCORES')
  local last = redis.call('ZRANGE', zk, -1, -1, 'WITHSCORES')
  out[#out + 1] = reg[x + 1]
  out[#out + 1] = redis.call('ZCARD', zk)
  out[#out + 1] = first[2] or false
  out[#out + 1] = last[2] or false
  out[#out + 1] = redis.call('HGET', base .. ':tch', reg[x]) or false
end
return out
"""

_INFO = """
local P, o = ARGV[1], ARGV[2]
return {redis.call('ZCARD', P .. ':o:' .. o .. ':all'), redis.call('GET', P .. ':dims') or false}
"""


def _enc(value: str | None) -> str:
    """A key segment: `!` for None, `=` + percent-encoding otherwise (no `:` survives)."""
    return "!" if value is None else "=" + quote(value, safe="")


def _dec(segment: bytes | str) -> str | None:
    text = segment.decode() if isinstance(segment, bytes) else segment
    return None if text == "!" else unquote(text[1:])


def _millis(ts: str) -> int:
    return (datetime.fromisoformat(ts) - _EPOCH) // _MS


def _from_millis(raw: bytes | str) -> str:
    return format_ts(_EPOCH + timedelta(milliseconds=int(float(raw))))


def _index(scope: Scope) -> tuple[str, str, str, dict[str, Any]]:
    """The narrowest index of a scope (without ids or key_prefix): its suffix, the score range,
    and what of `where` it does not answer."""
    where = dict(scope.where)
    index = ":all"
    for name, suffix in (("session", ":s:"), ("group", ":g:")):
        usable, value = _single(where, name)
        if usable and (name == "session" or value is not None):
            index = suffix + _enc(value)
            del where[name]
            break
    lo = "-inf" if scope.after is None else f"({_millis(scope.after)}"
    hi = "+inf" if scope.before is None else f"({_millis(scope.before)}"
    return index, lo, hi, where


def _single(where: Mapping[str, Any], name: str) -> tuple[bool, str | None]:
    """(usable, value) when `where[name]` selects exactly one index bucket."""
    if name not in where:
        return False, None
    value = where[name]
    if isinstance(value, list):
        if len(value) != 1:
            return False, None
        value = value[0]
    if value is None or isinstance(value, str):
        return True, value
    return False, None


class _Unreachable(StoreUnavailable):
    """The connection failed: the one failure worth a retry on a restarted child."""


def _evicting(info: Mapping[str, Any]) -> str | None:
    """The `maxmemory-policy` of an INFO answer where it evicts any key (`allkeys-*`): at maxmemory Redis
    would drop records and the indexes that list them. `volatile-*` evicts only keys with a TTL, which
    this tier never sets."""
    policy = str(info.get("maxmemory_policy", ""))
    return policy if policy.startswith("allkeys-") else None


class RedisStore:
    """`Store` on Redis; an embedded `redis-server` child when no URL is given."""

    engine = "redis"
    searches_vectors = False

    def __init__(self, settings: TierSettings) -> None:
        self.settings = settings
        self.prefix: str = settings.options.get("prefix") or f"a2m:{settings.name}"
        self.server: RedisServer | None = None
        if settings.url is None:
            self.server = RedisServer(
                settings.data_dir,
                appendfsync=settings.options.get("appendfsync", "everysec"),
                binary=settings.options.get("redis_server"),
            )
        self._timeout = float(settings.options.get("timeout", 5.0))  # how long one Redis command may take
        self._redis: aioredis.Redis | None = None
        self._restart_lock: anyio.Lock | None = None
        self._failed_restart_at = 0.0
        self._polled_at = 0.0
        self._evicting_said: str | None = None  # the evicting policy `ping` last logged (once per change)
        # the tokenized texts of index members, for recall (see `_held_scope`)
        self._held: HeldTerms[bytes] = HeldTerms(_TERMS_HELD)
        # owner -> (index key, lo, hi) -> (the owner's `ver` stamp when read, `_held.generation`, members, their
        # total length): what a recall of that range read last
        self._scopes: dict[str, dict[tuple[str, str, str], tuple[bytes, int, set[bytes], int]]] = {}
        self._members_kept = 0  # an upper bound: ranges dropped one at a time are not subtracted

    # -- lifecycle ---------------------------------------------------------

    async def open(self) -> None:
        if self._redis is not None:
            return
        if self.server is not None:
            await self.server.start()
            url = self.server.url
        else:
            assert self.settings.url is not None
            url = self.settings.url
        self._restart_lock = anyio.Lock()
        self._redis = aioredis.Redis.from_url(
            url,
            decode_responses=False,
            # One immediate retry replaces a pooled connection that died with a
            # restarted server; more would only delay the -32603 a caller needs.
            retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
            socket_timeout=self._timeout,
            socket_connect_timeout=float(self.settings.options.get("connect_timeout", 2.0)),
            health_check_interval=0,
        )
        client = self._redis
        self._write = client.register_script(_WRITE)
        self._fetch = client.register_script(_FETCH)
        self._touch = client.register_script(_TOUCH)
        self._reinforce = client.register_script(_REINFORCE)
        self._sessions = client.register_script(_SESSIONS)
        self._info = client.register_script(_INFO)
        await self._answers()
        if self.server is None:
            try:
                await self._refuse_an_unsafe_redis()
            except BaseException:
                await self.close()
                raise

    async def _refuse_an_unsafe_redis(self) -> None:
        """Refuse a Redis at `--url` that would drop acknowledged records without a word, or split a batch.

        - `maxmemory-policy allkeys-*`: at `maxmemory` Redis evicts any key, a record or one of the
          indexes that lists it; a tier writing 4,000 records into 3 MB then counted 200, selected
          155 and listed a session of 2,320. Refused whatever `maxmemory` is now: the policy is
          the intent, and a `maxmemory` set later would start evicting. The `volatile-*` policies
          evict only keys with a TTL, which this tier never sets: at `maxmemory` they refuse a
          write (`OOM`), as `noeviction` does, with nothing written.
        - A replica (`role:slave`): it starts, then refuses every write (`READONLY`), or, where
          writable, keeps them only until it next syncs from its primary.
        - Redis Cluster: the scripts name keys themselves (module docstring), and a key on another
          node stops a script halfway, after some of its writes.

        INFO, not CONFIG GET: managed services (ElastiCache) rename or refuse CONFIG. A Redis that
        refuses INFO too (an ACL) is not checked, and a warning says so.
        """
        assert self._redis is not None
        try:
            info = await self._redis.info()
        except ResponseError as exc:
            log.warning("working: cannot check the Redis at --url for eviction, replication or cluster mode "
                        "(INFO refused: %s); keep maxmemory-policy noeviction and use a primary, not a cluster", exc)
            return
        except RedisError as exc:
            raise StoreUnavailable(f"redis: {exc}") from exc
        except OSError as exc:
            raise StoreUnavailable(f"redis unreachable: {exc}") from exc
        policy = _evicting(info)
        if policy:
            raise SettingsError(
                f"working: the Redis at --url has maxmemory-policy {policy}: it would evict records and their "
                "indexes without a word once it reaches maxmemory; set maxmemory-policy noeviction "
                "(a full Redis then refuses writes), or give the tier a Redis of its own")
        if str(info.get("role", "master")) != "master":
            raise SettingsError(
                "working: the Redis at --url is a replica (role:slave), which refuses writes or loses them at "
                "its next sync; give the primary's address")
        if str(info.get("cluster_enabled", "0")) == "1":
            raise SettingsError(
                "working: the Redis at --url runs in cluster mode (cluster_enabled:1); the tier needs one "
                "Redis, not a Redis Cluster (its scripts name keys on any node): give a standalone Redis")

    async def close(self) -> None:
        if self._redis is not None:
            try:
                await self._redis.aclose()
            finally:
                self._redis = None
        if self.server is not None:
            await self.server.stop()

    async def ping(self) -> None:
        """Ready while Redis answers; a Redis at --url also while it keeps the policy start checked. An
        operator's `CONFIG SET maxmemory-policy allkeys-lru` after start would let it evict records
        without a word: readiness fails instead, naming it, until the policy is set back."""
        await self._answers()
        if self.server is not None:
            return
        assert self._redis is not None
        try:
            policy = _evicting(await self._redis.info("memory"))
        except ResponseError:  # INFO refused (an ACL): start said it cannot check
            return
        except (RedisError, OSError) as exc:
            raise StoreUnavailable(f"redis: {exc}") from exc
        if policy != self._evicting_said:  # /readyz says only "unavailable": the log says why, once
            if policy:
                log.error("working: the Redis at --url now has maxmemory-policy %s: not ready until it is set "
                          "back to noeviction", policy)
            self._evicting_said = policy
        if policy:
            raise StoreUnavailable(f"the Redis at --url now has maxmemory-policy {policy} (set since the tier "
                                   "started): it would evict records without a word; set maxmemory-policy noeviction")

    async def _answers(self) -> None:
        """StoreUnavailable, saying why, unless Redis answers a PING (an embedded one restarted if it died)."""
        await self._ready(check=True)
        assert self._redis is not None
        try:
            await self._redis.ping()
        except RedisError as exc:
            raise StoreUnavailable(f"redis: {self._explain(exc)}") from exc
        except OSError as exc:
            raise StoreUnavailable(f"redis unreachable: {exc}") from exc

    def _explain(self, exc: RedisError) -> str:
        """Redis's own words, or what they mean for the URL where they name something the user never did:
        a missing password reads `HELLO must be called with the client already authenticated` (redis-py
        opens with HELLO), and a `rediss://` URL to a Redis without TLS waits out the connect timeout."""
        if isinstance(exc, AuthenticationError):
            given = self._redis is not None and self._redis.connection_pool.connection_kwargs.get("password")
            why = "the password or user in the URL is wrong" if given else "the URL has no password"
            return f"authentication failed ({why}): give it as redis://:PASSWORD@host:port/0, or USER:PASSWORD@ " \
                   "for an ACL user"
        if isinstance(exc, RedisTimeoutError) and (self.settings.url or "").startswith("rediss:"):
            return f"{exc} (a rediss:// URL: does that Redis speak TLS? redis:// is one without)"
        return str(exc)

    async def _ready(self, *, check: bool = False) -> None:
        """Restart an embedded child that died; wait for a restart under way; fail fast while a
        restart keeps failing.

        Polling the child costs a waitpid per call, a tenth of a timeline's CPU,
        so the happy path polls at most every `_POLL_S`; a connection error
        polls at once (`check`), and `_call` retries once after it. While another
        call restarts the child, its new Redis is alive but not yet answering (it
        starts, it loads the AOF): every call waits for the restart, never tries it,
        but no longer than a Redis command may take (`timeout`).
        """
        if self._redis is None:
            raise StoreUnavailable("the working store is not open")
        server = self.server
        if server is None:
            return
        assert self._restart_lock is not None
        clock = time.monotonic()
        if not check and clock - self._polled_at < _POLL_S and not self._restart_lock.locked():
            return
        self._polled_at = clock
        with anyio.move_on_after(self._timeout) as waiting:
            await self._restart_lock.acquire()
        if waiting.cancelled_caught:
            raise StoreUnavailable(f"redis-server is restarting and did not answer within {self._timeout} s")
        try:
            if server.alive():
                return
            if time.monotonic() - self._failed_restart_at < 1.0:
                raise StoreUnavailable("redis-server is down and did not restart")
            try:
                await server.restart()
            except StoreUnavailable:
                self._failed_restart_at = time.monotonic()
                raise
            await self._redis.connection_pool.disconnect()
        finally:
            self._restart_lock.release()

    async def _eval(self, script: Any, args: list[Any]) -> Any:
        return await self._call(lambda: script(args=[self.prefix, *args], client=self._redis))

    async def _call(self, command: Callable[[], Awaitable[Any]]) -> Any:
        """`command()`, with Redis errors mapped to the Store's, repeated once on a restarted child."""
        await self._ready()
        try:
            return await self._run(command)
        except _Unreachable:
            if self.server is None:
                raise
        # The embedded child died under this call, or was being restarted when it began (alive, not
        # answering yet): once it answers, the call is repeated. Writes are idempotent by id, so
        # repeating on a new child is safe; a touch or reinforce that reached the AOF before the
        # crash may count twice, which beats losing the call. A timeout is not repeated (`_run`).
        await self._ready(check=True)
        return await self._run(command)

    async def _run(self, command: Callable[[], Awaitable[Any]]) -> Any:
        try:
            return await command()
        except ResponseError as exc:
            text = str(exc)
            if _WIDTH in text:
                expected, got = text.split(_WIDTH, 1)[1].split()[:2]
                raise StoreWidthMismatch(int(expected), int(got)) from None
            if _REJECT in text:
                raise StoreRejected(text.split(_REJECT, 1)[1].strip()) from None
            if _TAKEN in text:
                raise StoreIdTaken(text.split(_TAKEN, 1)[1].strip()) from None
            if _CONFLICT in text:
                raise StoreConflict(text.split(_CONFLICT, 1)[1].strip()) from None
            if "OOM command not allowed" in text:  # a script is refused at its first write: none of it was made
                raise StoreUnavailable("redis is at its maxmemory and refused the write, none of which was "
                                       "made: raise maxmemory, or forget or spill records") from None
            if "READONLY You can't write" in text:  # a primary that became a replica (a failover) under the tier
                raise StoreReadOnly("redis is a read-only replica now and refused the write: the tier "
                                    "needs the primary (--url)") from None
            raise StoreUnavailable(f"redis: {text}") from exc
        except (RedisTimeoutError, TimeoutError) as exc:  # a Redis that is slow or stopped: waiting again doubles the wait
            raise StoreUnavailable(f"redis did not answer: {exc}") from exc
        except (RedisConnectionError, OSError) as exc:
            raise _Unreachable(f"redis unreachable: {exc}") from exc
        except RedisError as exc:
            raise StoreUnavailable(f"redis: {exc}") from exc
        except UnicodeEncodeError as exc:
            raise StoreRejected(f"text that is not valid UTF-8: {exc.reason}") from None

    # -- encoding ----------------------------------------------------------

    @staticmethod
    def _put_args(record: Record) -> list[Any]:
        body = record.to_dict()
        for name in _MUTABLE:
            body.pop(name, None)
        try:
            j = orjson.dumps(body)
            e = b"" if record.embedding is None else orjson.dumps(record.embedding)
            owner, session, group = _enc(record.owner), _enc(record.session), _enc(record.group)
            score = _millis(record.created_at)
        except (TypeError, ValueError) as exc:  # orjson.JSONEncodeError is a TypeError
            raise StoreRejected(f"record {record.id!r} cannot be stored: {exc}") from None
        return [
            record.id, owner, session, record.session or "", group,
            "!" if record.key is None else "=" + record.key,
            score, j, repr(float(record.salience)), int(record.access_count),
            record.accessed_at or "", e,
        ]

    @staticmethod
    def _records(flat: list[Any]) -> list[tuple[bytes, Record]]:
        """(index member, record) pairs from a fetch reply."""
        return [(member, Record.from_wire(body)) for member, body in zip(flat, orjson.loads(flat[-1]))]

    # -- writes ------------------------------------------------------------

    async def write(self, puts: Sequence[Record], deletes: Sequence[str] = (), *,
                    expect: Mapping[str, int] | None = None,
                    keep: Mapping[str, Collection[str]] | None = None) -> None:
        await self._write_batch(puts, [(i, "") for i in deletes], expect or {}, keep or {})

    async def _write_batch(self, puts: Sequence[Record], deletes: Sequence[tuple[str, str | bytes]],
                           expect: Mapping[str, int] | None = None,
                           keep: Mapping[str, Collection[str]] | None = None) -> int:
        if not puts and not deletes:
            return 0
        expect, keep = expect or {}, keep or {}
        args: list[Any] = []
        width = ""
        for record in puts:
            args.extend(self._put_args(record))
            kept = keep.get(record.id, ())
            args.extend((expect.get(record.id, ""), ("a" if kept else "") + ("s" if "salience" in kept else "")))
            if record.embedding is not None:
                size = str(len(record.embedding))
                if width and size != width:
                    raise StoreRejected(f"embeddings of {width} and {size} dimensions in one batch")
                width = size
        for record_id, member in deletes:
            args.extend((record_id, member, expect.get(record_id, "")))
        try:
            return int(await self._eval(self._write, [len(puts), len(deletes), width, *args]))
        finally:  # this server's next recall of these owners reads their members at once, without asking `ver`
            if deletes:  # by bare id: any owner's
                self._scopes.clear()
                self._members_kept = 0
            for record in puts:
                self._scopes.pop(_enc(record.owner), None)

    async def delete(self, scope: Scope) -> int:
        found = await self._scan(scope, order="asc", limit=None, with_embeddings=False)
        removed = 0
        for _ in range(_DELETE_ATTEMPTS):
            if not found:
                break
            # Conditional on the index member: a record re-put since the read is a new version
            # that may be out of scope, so it is left alone...
            gone = await self._write_batch((), [(r.id, m) for m, r in found])
            removed += gone
            if gone == len(found):
                break
            # ...unless it is in scope still: a forget must not miss a record that a keyed replace
            # re-put in place (same id, new member) between its read and its delete.
            members = {m for m, _ in found}
            ids = dict.fromkeys(r.id for _, r in found)
            flat = await self._eval(self._fetch, [_enc(scope.owner), "0", "ids", *ids])
            found = [(m, r) for m, r in self._records(flat) if m not in members and matches(r, scope)]
        return removed

    async def touch(self, owner: str | None, ids: Sequence[str], at: str) -> dict[str, int]:
        if not ids:
            return {}
        flat = await self._eval(self._touch, [_enc(owner), at, *ids])
        return {flat[x].decode(): int(flat[x + 1]) for x in range(0, len(flat), 2)}

    async def reinforce(self, owner: str | None, ids: Sequence[str], amount: float) -> int:
        unique = list(dict.fromkeys(ids))
        if not unique:
            return 0
        return int(await self._eval(self._reinforce, [_enc(owner), repr(float(amount)), *unique]))

    # -- reads -------------------------------------------------------------

    async def get(self, owner: str | None, ids: Sequence[str], *, with_embeddings: bool = False) -> list[Record]:
        unique = list(dict.fromkeys(ids))
        if not unique:
            return []
        flat = await self._eval(self._fetch, [_enc(owner), "1" if with_embeddings else "0", "ids", *unique])
        return [r for _, r in self._records(flat)]

    async def owners(self, ids: Sequence[str]) -> dict[str, str | None]:
        unique = list(dict.fromkeys(ids))
        if not unique:
            return {}

        async def read() -> list[bytes | None]:
            assert self._redis is not None
            async with self._redis.pipeline(transaction=False) as pipe:
                for record_id in unique:
                    pipe.hget(f"{self.prefix}:r:{record_id}", "o")
                return await pipe.execute()

        # Through `_call`, as every other read: a remember starts here, and it must restart a dead child too.
        found = await self._call(read)
        return {i: _dec(o) for i, o in zip(unique, found) if o is not None}

    async def get_keys(self, owner: str | None, keys: Sequence[str]) -> dict[str, Record]:
        unique = list(dict.fromkeys(keys))
        if not unique:
            return {}
        flat = await self._eval(self._fetch, [_enc(owner), "0", "keys", *unique])
        return {r.key: r for _, r in self._records(flat) if r.key is not None}

    async def _scan(
        self, scope: Scope, *, order: Literal["asc", "desc"], limit: int | None, with_embeddings: bool
    ) -> list[tuple[bytes, Record]]:
        """Records in scope with their index member, in order, from the narrowest index."""
        want = "1" if with_embeddings else "0"
        owner = _enc(scope.owner)
        ids = scope.named_ids()
        if ids is not None or scope.key_prefix is not None:
            if ids is not None:
                if not ids:
                    return []
                flat = await self._eval(self._fetch, [owner, want, "ids", *dict.fromkeys(ids)])
            else:
                flat = await self._eval(self._fetch, [owner, want, "prefix", scope.key_prefix])
            found = [(m, r) for m, r in self._records(flat) if matches(r, scope)]
            found.sort(key=lambda p: (p[1].created_at, p[0][:16]), reverse=order == "desc")
            return found if limit is None else found[:limit]
        index, lo, hi, where = _index(scope)
        exact = not where  # the index alone is the scope: the limit can run in Redis
        pushed = -1 if limit is None or not exact else limit
        flat = await self._eval(self._fetch, [owner, want, "z", index, lo, hi, "1" if order == "desc" else "0", pushed])
        found = self._records(flat)
        if not exact:
            found = [(m, r) for m, r in found if matches(r, scope)]
            if limit is not None:
                found = found[:limit]
        return found

    async def select(
        self,
        scope: Scope,
        *,
        order: Literal["asc", "desc"] = "asc",
        limit: int | None = None,
        with_embeddings: bool = False,
    ) -> list[Record]:
        if limit is not None and limit <= 0:
            return []
        found = await self._scan(scope, order=order, limit=limit, with_embeddings=with_embeddings)
        return [r for _, r in found]

    async def timeline_page(self, scope: Scope, *, below: Position | None, limit: int | None,
                            with_embeddings: bool = False) -> list[tuple[Record, Position]]:
        """`select` newest first from strictly before `below`, which an index finds by rank (the
        `zb` fetch), however many records share its millisecond."""
        if limit is not None and limit <= 0:
            return []
        if below is None:
            found = await self._scan(scope, order="desc", limit=limit, with_embeddings=with_embeddings)
        elif scope.named_ids() is not None or scope.key_prefix is not None:  # read whole by _scan anyway
            every = await self._scan(scope, order="desc", limit=None, with_embeddings=with_embeddings)
            found = [(m, r) for m, r in every if (r.created_at, int(m[:16])) < below[:2]][:limit]
        else:
            index, lo, hi, where = _index(scope)
            pushed = -1 if limit is None or where else limit
            found = self._records(await self._eval(self._fetch, [
                _enc(scope.owner), "1" if with_embeddings else "0", "zb", index, lo, hi, _millis(below[0]),
                f"{below[1]:016d}", pushed]))
            if where:
                found = [(m, r) for m, r in found if matches(r, scope)][:limit]
        return [(r, (r.created_at, int(m[:16]), r.id)) for m, r in found]  # INCR's seq: no tie for the id

    async def search(
        self,
        scope: Scope,
        *,
        text: str | None,
        vector: Sequence[float] | None,
        limit: int,
        with_embeddings: bool = False,
    ) -> list[Record]:
        """BM25 over the scope's records (a working set is small), newest first among ties.

        Within one index (the common case: an owner's records, one session) only
        the index is read and the texts come from memory; the best `limit` are
        then read whole. Decoding every record in scope on every recall was
        most of a recall's cost (decision 24).
        """
        if not text or not tokenize(text) or limit <= 0:
            return []
        index, lo, hi, unanswered = _index(scope)
        if scope.ids is not None or scope.key_prefix is not None or unanswered:
            found = await self._scan(scope, order="desc", limit=None, with_embeddings=with_embeddings)
            by_id = {r.id: r for _, r in found}
            ranked = rank({r.id: r.content for r in by_id.values()}, text)
            return [by_id[i].scored(s) for i, s in ranked[:limit]]
        scope_members, total = await self._held_scope(_enc(scope.owner), index, lo, hi)
        ranked = self._held.rank(scope_members, text, total=total)[:limit]
        best = {r.id: r for r in await self.get(scope.owner, [i for i, _ in ranked], with_embeddings=with_embeddings)}
        return [best[i].scored(s) for i, s in ranked if i in best]

    async def _held_scope(self, owner: str, index: str, lo: str, hi: str) -> tuple[set[bytes], int]:
        """The members of one index's score range, each held in `_held`, and their total length.

        Read again only when the owner's `ver` stamp has changed since this
        range was last read (a write changed the owner's indexes, through any
        server): a GET of the stamp, not the range's members read, put in a set
        and their lengths summed on every recall (decision 85). A member is
        tokenized only when not seen before: it is one version of one record,
        whose text never changes.
        """
        key = f"{self.prefix}:o:{owner}{index}"  # a plain command: through Lua, 1,000 members cost 4x the CPU
        stamp_key = f"{self.prefix}:o:{owner}:ver"
        ranges = self._scopes.get(owner)
        last = ranges.get((key, lo, hi)) if ranges else None
        if last is not None and last[1] == self._held.generation:
            if await self._call(lambda: self._redis.get(stamp_key)) == last[0]:
                return last[2], last[3]

        async def read() -> list[Any]:
            # The stamp first: a write between the two reads leaves a newer range under an older
            # stamp, which the next recall finds changed; never an older range under a newer stamp.
            async with self._redis.pipeline(transaction=False) as pipe:
                return await pipe.get(stamp_key).zrangebyscore(key, lo, hi).execute()

        stamp, listed = await self._call(read)
        members = set(listed)
        whole = True
        for _ in range(_HOLD_ATTEMPTS):
            missing = self._held.missing(members)
            if not missing:
                break
            fetched = self._records(await self._eval(
                self._fetch, [owner, "0", "ids", *(member[16:].decode() for member in missing)]))
            for member, record in fetched:
                self._held.add(member, record.id, record.content)
            if len(fetched) < len(missing):  # deleted between the two reads
                members -= missing.difference(member for member, _ in fetched)
                whole = False
            # and again: a concurrent recall past the capacity may have let go of all while this one read
        else:
            members = {member for member in members if member in self._held}  # three races lost: rank what is held
            whole = False
        total = self._held.total(members)
        if whole and stamp is not None:
            # A range counts one at least: empty ones (a session the owner has none in) added nothing,
            # and one per owner that recalled such a range was kept until the next forget.
            weight = max(1, len(members))
            if self._members_kept + weight > _MEMBERS_KEPT:
                self._scopes.clear()
                self._members_kept = 0
            ranges = self._scopes.setdefault(owner, {})
            if len(ranges) >= _RANGES_KEPT:
                ranges.clear()
            ranges[(key, lo, hi)] = (stamp, self._held.generation, members, total)
            self._members_kept += weight
        return members, total

    async def sessions(self, owner: str | None) -> list[SessionInfo]:
        flat = await self._eval(self._sessions, [_enc(owner)])
        out = []
        for x in range(0, len(flat), 5):
            name, count, first, last, touched = flat[x : x + 5]
            latest = _from_millis(last) if last is not None else None
            if touched is not None and (latest is None or touched.decode() > latest):
                latest = touched.decode()
            out.append(SessionInfo(
                session=name.decode(),
                records=int(count),
                opened_at=_from_millis(first) if first is not None else None,
                touched_at=latest,
            ))
        out.sort(key=lambda s: (s.opened_at or "", s.session))
        return out

    async def count(self, owner: str | None) -> int:
        records, _ = await self._eval(self._info, [_enc(owner)])
        return int(records)

    async def dimensions(self) -> int | None:
        _, dims = await self._eval(self._info, ["!"])
        return None if dims is None else int(dims)
