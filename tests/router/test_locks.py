"""The owner locks router replicas share through a real Redis (`lock_url`, router/locks.py)."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path
from typing import AsyncIterator, Iterator

import pytest

from a2m.errors import A2MError
from router.config import ConfigError, parse
from router.locks import OwnerLock, SharedLocks
from tests.support.redis import own_redis

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with own_redis(tmp_path_factory.mktemp("locks")) as url:
        yield url


@pytest.fixture
async def replicas(redis_url: str) -> AsyncIterator[tuple[SharedLocks, SharedLocks]]:
    """Two replicas' views of one lock store: a short lease and wait, so a test takes a second."""
    a, b = SharedLocks(redis_url, lease=1.0, wait=0.3), SharedLocks(redis_url, lease=1.0, wait=0.3)
    try:
        yield a, b
    finally:
        await a.close()
        await b.close()


async def test_an_owner_held_by_one_replica_waits_for_it_in_another(replicas: tuple[SharedLocks, SharedLocks]) -> None:
    a, b = replicas
    held = await a.acquire("alice")
    with pytest.raises(A2MError, match="another router replica has held this owner's records") as refused:
        await b.acquire("alice")
    assert refused.value.code == -32603
    other = await b.acquire("bob")  # another owner is not held up
    await other.release()
    unowned = await b.acquire(None)  # nor the unowned partition, which is an owner of its own
    await unowned.release()
    waiting = asyncio.ensure_future(b.acquire("alice"))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    await held.release()
    await (await waiting).release()


async def test_a_held_lock_is_renewed_past_its_lease(replicas: tuple[SharedLocks, SharedLocks]) -> None:
    """A move longer than the lease keeps its hold: the lease is renewed every third of it."""
    a, b = replicas
    held = await a.acquire("carol")
    await asyncio.sleep(2.5)  # the lease is 1 s
    with pytest.raises(A2MError, match="another router replica"):
        await b.acquire("carol")
    await held.release()


async def test_a_replica_that_stopped_holds_an_owner_no_longer_than_its_lease(redis_url: str) -> None:
    """A replica killed while holding an owner (nothing renews, nothing releases) holds up the
    others only until its lease lapses."""
    dead, alive = SharedLocks(redis_url, lease=0.5, wait=3.0), SharedLocks(redis_url, lease=0.5, wait=3.0)
    try:
        held = await dead.acquire("dave")
        held._renewing.cancel()  # as a process killed mid-move: no renewal, no release
        started = time.monotonic()
        await (await alive.acquire("dave")).release()
        assert 0.2 < time.monotonic() - started < 2.0
    finally:
        await dead.close()
        await alive.close()


async def test_a_lock_that_lapsed_while_held_is_said_once_and_no_longer_renewed(
        redis_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """A held key gone (its lease lapsed in a long pause, or evicted): renewal is refused for good,
    and it logged "renewing an owner lock failed" every third of the lease until the release."""
    import logging

    import redis.asyncio as aioredis

    shared = SharedLocks(redis_url, lease=0.3)
    admin = aioredis.from_url(redis_url)
    try:
        held = await shared.acquire("ivan")
        await admin.delete(shared.key("ivan"))
        with caplog.at_level(logging.ERROR, logger="a2m.router"):
            await asyncio.sleep(0.7)  # six renewals due
        assert [r.getMessage() for r in caplog.records if "owner lock" in r.getMessage()] == [
            "an owner lock lapsed while held: another router replica may change the owner's records while this "
            "one does"]
        assert held._renewing.done()
        await held.release()
    finally:
        await shared.close()
        await admin.aclose()


async def test_a_holder_asks_whether_its_hold_is_still_the_owners(redis_url: str) -> None:
    """A lease is not a fence: a step that writes or deletes on the lock's word asks first (`check`),
    and a hold another replica has since taken answers LockFailed."""
    a, b = SharedLocks(redis_url, lease=0.3, wait=2.0), SharedLocks(redis_url, lease=0.3, wait=2.0)
    mine, plain = OwnerLock("judy", a), OwnerLock("judy", None)
    try:
        async with plain:
            await plain.check()  # this router's own lock: nothing to ask
        async with mine:
            await mine.check()
            mine._lease._renewing.cancel()  # frozen past the lease
            taken = await b.acquire("judy")  # within b's wait, once the lease has run out
            with pytest.raises(A2MError, match="this router's hold of the owner lapsed") as lapsed:
                await mine.check()
            assert lapsed.value.data == {"lock": "lapsed"}
            await taken.release()
    finally:
        await a.close()
        await b.close()


async def test_an_unreachable_lock_store_fails_the_call_in_words(tmp_path: Path,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    """Nothing that changes where records live runs unlocked: the call fails, to be retried. The
    caller is told the lock store is unavailable, not where it is (its socket path or host, in the
    Redis client's words): those go to the router's log, as a tier engine's do (decision 113)."""
    socket = f"{tmp_path}/no-redis.sock"
    shared = SharedLocks(f"unix://{socket}")
    lock = OwnerLock("erin", shared)
    try:
        with caplog.at_level("WARNING", logger="a2m.router"):
            with pytest.raises(A2MError, match=r"the owner lock store \(lock_url\) is unavailable") as refused:
                async with lock:
                    raise AssertionError("ran without the lock")
        assert refused.value.code == -32603 and not lock.locked()  # this router's lock is let go too
        assert socket not in refused.value.message and "router's log" in refused.value.message
        said = [r.getMessage() for r in caplog.records if "does not answer" in r.getMessage()]
        assert said and said[0].startswith("the owner lock store (lock_url) does not answer: ") and socket in said[0]
    finally:
        await shared.close()


async def test_an_owner_lock_serialises_this_routers_callers_as_before(redis_url: str) -> None:
    shared = SharedLocks(redis_url)
    order: list[str] = []

    async def hold(name: str) -> None:
        async with lock:
            order.append(f"{name} in")
            await asyncio.sleep(0.05)
            order.append(f"{name} out")

    lock = OwnerLock("frank", shared)
    try:
        await asyncio.gather(hold("one"), hold("two"))
        assert order == ["one in", "one out", "two in", "two out"] and not lock.locked()
    finally:
        await shared.close()


async def test_a_replica_kept_waiting_goes_before_the_holder_takes_the_owner_again(redis_url: str) -> None:
    """Replica A's callers queue for one owner, each holding it 50 ms. Each took the key again within
    a fraction of a millisecond of the last letting it go, while replica B polled every 10 ms: B
    waited out the whole queue (up to the 60 s wait, then failed). B, first in line, goes next."""
    a, b = SharedLocks(redis_url, wait=5.0), SharedLocks(redis_url, wait=5.0)
    order: list[str] = []

    async def hold(lock: OwnerLock, name: str) -> None:
        async with lock:
            order.append(name)
            await asyncio.sleep(0.05)

    here, there = OwnerLock("grace", a), OwnerLock("grace", b)
    try:
        queue = [asyncio.ensure_future(hold(here, f"a{i}")) for i in range(12)]
        while not order:
            await asyncio.sleep(0.005)
        await asyncio.gather(hold(there, "b"), *queue)
        assert order.index("b") <= 2, order
    finally:
        await a.close()
        await b.close()


async def test_a_replica_that_gave_up_waiting_keeps_no_place_in_line(redis_url: str) -> None:
    """A caller cancelled while first in line (its client went away) let go of its place: a third
    replica takes the owner at once when the holder lets go, not after the place lapses."""
    a, b, c = (SharedLocks(redis_url, wait=wait) for wait in (5.0, 5.0, 0.1))
    try:
        held = await a.acquire("heidi")
        waiting = asyncio.ensure_future(b.acquire("heidi"))
        await asyncio.sleep(0.05)  # b has polled: first in line
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        await asyncio.sleep(0.05)  # its place is let go in the background
        await held.release()
        await (await c.acquire("heidi")).release()  # within c's 0.1 s wait; a place lasts 0.25 s
    finally:
        for one in (a, b, c):
            await one.close()


async def test_a_lock_store_that_may_evict_a_held_key_is_said(tmp_path: Path) -> None:
    """A lock key has a TTL: a Redis at its maxmemory evicts it under any policy but noeviction
    (the working tier's Redis may run volatile-lru, decision 154), and another replica then takes an
    owner that is held. describe and `a2m doctor` say so; noeviction, or no maxmemory, is quiet."""
    import redis.asyncio as aioredis

    with own_redis(tmp_path) as url:
        shared, admin = SharedLocks(url), aioredis.from_url(url)
        try:
            assert await shared.state() == {"status": "up"}
            await admin.config_set("maxmemory", "100mb")
            await admin.config_set("maxmemory-policy", "volatile-lru")
            assert await shared.state() == {"status": "up", "evicts": "volatile-lru"}
            await admin.config_set("maxmemory-policy", "noeviction")
            assert await shared.state() == {"status": "up"}
        finally:
            await shared.close()
            await admin.aclose()


def test_lock_url_is_a_redis_url_from_the_file_or_the_environment() -> None:
    assert parse({"lock_url": "redis://locks:6379/1"}).lock_url == "redis://locks:6379/1"
    assert parse({}, env={"A2M_LOCK_URL": "rediss://:pw@locks:6380/0"}).lock_url == "rediss://:pw@locks:6380/0"
    assert parse({}, env={}).lock_url is None
    with pytest.raises(ConfigError, match=r"lock_url must be a Redis URL .*not http") as bad:
        parse({"router": {"lock_url": "http://user:secret@locks/"}})
    assert "secret" not in str(bad.value)  # a URL may hold a password: it is not repeated
    with pytest.raises(ConfigError, match=r"\$A2M_LOCK_URL must be a Redis URL"):
        parse({}, env={"A2M_LOCK_URL": "locks:6379"})


async def test_a_lock_store_that_never_answers_is_down_within_a_second() -> None:
    """describe (`a2m doctor`), /readyz and the router's start ask the lock store's state: one that
    accepts connections and never answers held each for the client's 5 s socket timeout."""
    from .stack import black_hole

    with black_hole() as url:
        shared = SharedLocks(url)
        try:
            started = time.monotonic()
            state = await shared.state()
            took = time.monotonic() - started
        finally:
            await shared.close()
    assert state["status"] == "down" and took < 1.5, (state, took)


async def test_a_caller_cancelled_while_it_lets_go_leaves_the_owner_free(redis_url: str) -> None:
    """A holder cancelled while its release waits for a connection to the lock store (a shutdown's
    deadline, a library caller giving up) left the key held, from every replica and this one, for
    the rest of its lease (15 s in production). The release goes on in the background."""
    import redis.asyncio as aioredis

    a, b = SharedLocks(redis_url, lease=30.0, wait=0.5), SharedLocks(redis_url, lease=30.0, wait=0.5)
    admin = aioredis.from_url(redis_url)
    lock = OwnerLock("ivan", a)
    try:
        await lock.__aenter__()
        await a.redis.connection_pool.disconnect()  # the release has a connection to make: an await
        leaving = asyncio.ensure_future(lock.__aexit__(None, None, None))
        await asyncio.sleep(0)  # in the release, its script not yet sent
        leaving.cancel()
        with pytest.raises(asyncio.CancelledError):
            await leaving
        assert not lock.locked()
        for _ in range(50):  # let go in the background: within a few round trips
            if not await admin.exists(a.key("ivan")):
                break
            await asyncio.sleep(0.01)
        await (await b.acquire("ivan")).release()  # within b's 0.5 s wait, not after a 30 s lease
    finally:
        await a.close()
        await b.close()
        await admin.aclose()


async def test_a_lock_store_that_never_answers_fails_a_keyed_call_within_a_second_or_so(
        caplog: pytest.LogCaptureFixture) -> None:
    """A lock store that accepts connections and never answers (a stopped Redis, a partition past
    the handshake) held every keyed write, forget and move for the client's 5 s socket timeout before
    it failed; an agent retrying in a loop stalled 5 s a call. Each lock command waits ANSWER_S."""
    from .stack import black_hole

    with black_hole() as url:
        shared = SharedLocks(url)
        lock = OwnerLock("kim", shared)
        try:
            for _ in range(2):  # a retry waits as long again: no call runs unlocked
                started = time.monotonic()
                with caplog.at_level("WARNING", logger="a2m.router"):
                    with pytest.raises(A2MError, match=r"the owner lock store \(lock_url\) is unavailable") as refused:
                        async with lock:
                            raise AssertionError("ran without the lock")
                took = time.monotonic() - started
                assert refused.value.code == -32603 and refused.value.data == {"lock": "unavailable"}
                assert 0.5 < took < 2.0 and not lock.locked(), took
        finally:
            await shared.close()
    said = [r.getMessage() for r in caplog.records if "does not answer" in r.getMessage()]
    assert said and said[0] == "the owner lock store (lock_url) does not answer: no answer in 1 s", said


async def test_a_held_lock_whose_store_stops_answering_neither_checks_nor_lets_go_for_seconds(tmp_path: Path) -> None:
    """Redis paused while an owner is held (CLIENT PAUSE: a real redis-server that takes commands and
    answers none, as one stopped mid-move): a move's `check` before its delete fails in about a
    second, not the client's 5 s, and the release after a write does not hold its caller that long.
    A pause of a few hundred ms (a busy Redis) fails nothing."""
    import redis.asyncio as aioredis

    with own_redis(tmp_path) as url:
        shared, admin = SharedLocks(url), aioredis.from_url(url)
        lock = OwnerLock("liam", shared)
        try:
            await lock.__aenter__()
            await admin.client_pause(300, all=True)  # busy, not gone (a fork, a slow script): still held
            await lock.check()
            await admin.client_pause(4000, all=True)
            started = time.monotonic()
            with pytest.raises(A2MError, match=r"the owner lock store \(lock_url\) is unavailable"):
                await lock.check()
            checked = time.monotonic() - started
            started = time.monotonic()
            await lock.__aexit__(None, None, None)  # logged; the key lapses within its lease
            released = time.monotonic() - started
            assert checked < 2.0 and released < 2.0 and not lock.locked(), (checked, released)
        finally:
            await shared.close()
            await admin.aclose()


async def test_a_router_whose_lock_store_never_answers_refuses_keyed_writes_and_forgets_quickly(
        tmp_path: Path) -> None:
    """Through the router: a keyed remember and a forget fail with LockFailed (-32603) in about a
    second, not the 5 s they took, and neither reached the tier."""
    from dataclasses import replace

    from a2m.dispatch import Context
    from router.config import load
    from router.server import Router

    from .stack import black_hole, federation, new_owner, tier_call

    with federation(tmp_path, [{"name": "episodic", "kind": "episodic"}]) as stack, black_hole() as url:
        me = new_owner()
        [kept] = (await tier_call(stack, "episodic", "memory/remember", {"owner": me, "records": [
            {"content": "the ferry leaves at nine"}]}))["ids"]
        router = Router(replace(load(str(stack.config)), lock_url=url))
        await router.startup()
        try:
            handlers = router.handlers()
            for method, params in (
                    ("memory/remember", {"owner": me, "records": [{"content": "the ferry leaves at ten", "key": "f"}]}),
                    ("memory/forget", {"owner": me, "ids": [kept]})):
                started = time.monotonic()
                with pytest.raises(A2MError, match=r"the owner lock store \(lock_url\) is unavailable") as refused:
                    await asyncio.wait_for(handlers[method](params, Context()), 10)
                took = time.monotonic() - started
                assert refused.value.code == -32603 and took < 2.0, (method, took)
        finally:
            await router.shutdown()
        held = (await tier_call(stack, "episodic", "memory/timeline", {"owner": me, "limit": 0}))["records"]
        assert [r["content"] for r in held] == ["the ferry leaves at nine"]


async def test_a_release_cut_off_by_a_stall_lets_go_once_the_store_answers_again(tmp_path: Path) -> None:
    """A release that waits ANSWER_S and no longer (a lock store stalled 1-5 s: a fork, a slow script)
    was only logged, and its command, dropped with the connection it was cut off on, never ran: the
    key held the owner from every replica, this one too, for the rest of its 15 s lease, where the
    client's 5 s wait had let go as soon as the stall ended. The release goes on in the background."""
    import redis.asyncio as aioredis

    with own_redis(tmp_path) as url:
        a, b = SharedLocks(url), SharedLocks(url, wait=6.0)  # the default 15 s lease
        admin = aioredis.from_url(url)
        lock = OwnerLock("kai", a)
        try:
            await lock.__aenter__()
            await admin.client_pause(2500, all=True)
            started = time.monotonic()
            await lock.__aexit__(None, None, None)  # cut off at ANSWER_S, logged
            assert time.monotonic() - started < 2.0 and not lock.locked()
            await asyncio.sleep(2.7 - (time.monotonic() - started))  # the stall over
            await (await b.acquire("kai")).release()  # at once, not after the 15 s lease (b waits 6 s)
            assert time.monotonic() - started < 4.0
        finally:
            await a.close()
            await b.close()
            await admin.aclose()


async def test_a_renewal_cut_off_by_a_stall_is_tried_again_before_the_lease_runs_out(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Two stalls of over ANSWER_S, each over a renewal (forks, slow scripts): the renewal cut off at
    the first was tried again only a third of the lease later, which the second cut off too, and
    the lease lapsed while held, though the store had answered between the stalls. A failed renewal
    is tried again ANSWER_S after it began. The lease is 6 s here (15 s in production), renewed
    every 2 s; the key set at t=0 would lapse at t=6."""
    import logging

    import redis.asyncio as aioredis

    with own_redis(tmp_path) as url:
        a, b = SharedLocks(url, lease=6.0), SharedLocks(url, lease=6.0, wait=0.3)
        admin = aioredis.from_url(url)
        try:
            with caplog.at_level(logging.WARNING, logger="a2m.router"):
                started = time.monotonic()
                held = await a.acquire("lena")

                async def stall(at: float, seconds: float) -> None:
                    await asyncio.sleep(at - (time.monotonic() - started))
                    await admin.client_pause(int(seconds * 1000), all=True)

                await stall(1.5, 2.0)  # over the renewal at t=2, cut off at t=3; tried again at t=3, renewed at 3.5
                await stall(4.5, 2.5)  # over the next: at t=5 (cut off at t=6, the lapse) or at 5.5, again at 6.5
                await asyncio.sleep(7.5 - (time.monotonic() - started))
                assert await held.held()
                with pytest.raises(A2MError, match="another router replica"):
                    await b.acquire("lena")
                assert await admin.pttl(a.key("lena")) > 3000
                await held.release()
            said = [r.getMessage() for r in caplog.records if "owner lock" in r.getMessage()]
            assert len(said) == 4 and all(s.startswith("renewing an owner lock failed") for s in said[::2]), said
            assert all(s.startswith("renewed an owner lock after") for s in said[1::2]), said  # once per outage
        finally:
            await a.close()
            await b.close()
            await admin.aclose()


async def test_a_lock_store_gone_while_held_is_tried_about_once_a_second_and_said_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A failed renewal is tried again sooner, but not in a loop against a store that refuses at
    once (shut down): about once a second while the lease may be saved, then every third of it, and
    one line in the log for the outage. The lease is 4.5 s here, renewed every 1.5 s."""
    import logging

    import redis.asyncio as aioredis

    with own_redis(tmp_path) as url:
        shared, admin = SharedLocks(url, lease=4.5), aioredis.from_url(url)
        try:
            with caplog.at_level(logging.WARNING, logger="a2m.router"):
                held = await shared.acquire("mona")
                tries: list[float] = []
                renew = held._lock.reacquire

                async def counted() -> object:
                    tries.append(time.monotonic())
                    return await renew()

                held._lock.reacquire = counted
                await admin.shutdown(nosave=True)  # refused at once from now on
                await asyncio.sleep(6.0)  # due: t=1.5, then again at 2.5, 3.5 (lease out at 4.5), 5.0 or 6.0
                assert 4 <= len(tries) <= 5, [round(t - tries[0], 2) for t in tries]
                assert all(b - a > 0.9 for a, b in zip(tries, tries[1:])), tries
                await held.release()  # logged: the store is gone
            said = [r.getMessage() for r in caplog.records if "renewing an owner lock" in r.getMessage()]
            assert len(said) == 1, said
            assert re.search(r"tried again every 1 s while its lease lasts; .* may take it in [23]\.\d s$", said[0])
        finally:
            await shared.close()
            await admin.aclose()


async def contend(shared: list[SharedLocks], owner: str, rounds: int, hold: float) -> list[tuple[int, float, float]]:
    """Each replica in `shared` takes `owner` `rounds` times, again as soon as it let go, holding it
    `hold` s, and never two at once: each hold's (replica, arrived, took), in the order they began."""
    holds: list[tuple[int, float, float]] = []
    inside: list[int] = []

    async def take_turns(me: int) -> None:
        lock = OwnerLock(owner, shared[me])
        for _ in range(rounds):
            arrived = time.monotonic()
            async with lock:
                holds.append((me, arrived, time.monotonic()))
                inside.append(me)
                assert inside == [me], inside  # one holder at a time
                await asyncio.sleep(hold)
                inside.remove(me)

    try:
        done = await asyncio.gather(*(take_turns(i) for i in range(len(shared))), return_exceptions=True)
    finally:
        for one in shared:
            await one.close()
    assert not [e for e in done if e is not None], done  # none waited out its wait, none held with another
    assert len(holds) == len(shared) * rounds
    return holds


def worst_waits(holds: list[tuple[int, float, float]]) -> dict[int, tuple[int, float]]:
    """Each replica's most holds by others between its arrival and its own hold, and longest wait (s)."""
    worst: dict[int, tuple[int, float]] = {}
    for me, arrived, took in holds:
        passed = sum(1 for other, _, t in holds if other != me and arrived < t < took)
        most, longest = worst.get(me, (0, 0.0))
        worst[me] = (max(most, passed), round(max(longest, took - arrived), 3))
    return worst


async def test_four_replicas_contending_for_one_owner_each_wait_about_three_holds_at_most(redis_url: str) -> None:
    """Four replicas each take one owner again as soon as they let it go, for a short hold each. With
    one replica in line (`:next`), the one that had just let go lined up again the moment the next
    took the key, so the other two drew lots for each turn: one could be passed over until its 60 s
    wait ran out. Now the first come is served first: between a replica's arrival and its hold, the
    others hold at most once each, and none waits out its wait (1 s here; 2 s of holds in all)."""
    replicas = 4
    started = time.monotonic()
    holds = await contend([SharedLocks(redis_url, wait=1.0) for _ in range(replicas)], "olga", 20, 0.02)
    took = time.monotonic() - started
    worst = worst_waits(holds)
    assert all(passed <= replicas - 1 for passed, _ in worst.values()), worst
    assert took < 8.0, took


async def test_a_replica_killed_while_it_waits_holds_up_the_queue_no_longer_than_a_place_lasts(
        redis_url: str) -> None:
    """A replica killed while first in the queue (no give-up sent) keeps its place only while its
    polls would keep it, LINE_MS: the waiter behind it, whose own polls keep the queue alive, takes
    the owner once the holder lets go and that place lapses, not after its whole wait."""
    import os
    import signal
    import subprocess
    import sys

    import redis.asyncio as aioredis

    from router.locks import LINE_MS, QUEUE

    holder, behind = SharedLocks(redis_url), SharedLocks(redis_url, wait=1.0)
    admin = aioredis.from_url(redis_url)
    queue = holder.key("pia") + QUEUE

    async def queued(n: int) -> None:
        for _ in range(500):
            if await admin.zcard(queue) == n:
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"{n} waiters never queued")

    child = subprocess.Popen([sys.executable, "-c", (
        "import asyncio, sys\nfrom router.locks import SharedLocks\n"
        "asyncio.run(SharedLocks(sys.argv[1], wait=30.0).acquire('pia'))"), redis_url],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    try:
        held = await holder.acquire("pia")
        await queued(1)  # the child, first in the queue
        waiting = asyncio.ensure_future(behind.acquire("pia"))
        await queued(2)
        child.send_signal(signal.SIGKILL)
        child.wait()
        killed = time.monotonic()
        await held.release()
        await (await waiting).release()  # within its 1 s wait
        assert time.monotonic() - killed < LINE_MS / 1000 + 0.25
    finally:
        child.kill()
        child.wait()
        await holder.close()
        await behind.close()
        await admin.aclose()


# The previous version's take (decision 156 before the queue), as its replicas run it during a
# rolling update: one token in `:next`, the key by SET NX.
PREVIOUS_TAKE = """
local next = redis.call('GET', KEYS[2])
if next and next ~= ARGV[1] then return 0 end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  if next then redis.call('DEL', KEYS[2]) end
  return 1
end
redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[3])
return 0
"""


async def test_replicas_of_the_previous_version_and_this_one_never_hold_an_owner_at_once(redis_url: str) -> None:
    """During a rolling update, replicas of both versions take the same keys: two of each take one
    owner in turn, and no two hold it at once (each take is SET NX, whichever script)."""
    shared = [SharedLocks(redis_url, wait=3.0) for _ in range(4)]
    for old in shared[:2]:
        old._take = old.redis.register_script(PREVIOUS_TAKE)
    await contend(shared, "quinn", 10, 0.02)


async def test_a_replica_of_the_previous_version_takes_turns_with_this_ones(redis_url: str) -> None:
    """The previous version's replica took the key back at once on letting it go, unless `:next`
    named another: the first in the queue stands in it, so the two versions alternate rather than
    the new one waiting out the old one's queue of callers."""
    shared = [SharedLocks(redis_url, wait=3.0) for _ in range(2)]
    shared[0]._take = shared[0].redis.register_script(PREVIOUS_TAKE)
    worst = worst_waits(await contend(shared, "rosa", 15, 0.02))
    assert all(passed <= 1 for passed, _ in worst.values()), worst
