from typing import Any

import pytest

from a2m.errors import A2MError
from a2m.events import DEFAULT_BOUND, OWNER_UNITS, EventLog


@pytest.mark.anyio
async def test_no_cursor_is_from_now() -> None:
    log = EventLog()
    await log.emit("written", None, id="a")
    head = log.poll(None, owner=None)
    assert head["events"] == []
    await log.emit("written", None, id="b")
    assert [e["id"] for e in log.poll(head["cursor"], owner=None)["events"]] == ["b"]


@pytest.mark.anyio
async def test_exactly_once_in_order_across_polls_with_limit() -> None:
    log = EventLog()
    cursor = log.head()
    for i in range(25):
        await log.emit("written", None, id=str(i))
    seen: list[str] = []
    while True:
        page = log.poll(cursor, limit=7, owner=None)
        seen += [e["id"] for e in page["events"]]
        cursor = page["cursor"]
        if not page.get("more"):
            break
    assert seen == [str(i) for i in range(25)]
    assert log.poll(cursor, owner=None)["events"] == []


@pytest.mark.anyio
async def test_window_overflow_resets_to_oldest() -> None:
    log = EventLog(capacity=5)
    cursor = log.head()
    for i in range(12):
        await log.emit("written", None, id=str(i))
    page = log.poll(cursor, owner=None)
    assert page["reset"] is True
    assert [e["id"] for e in page["events"]] == ["7", "8", "9", "10", "11"]


def test_foreign_or_malformed_cursor_resets() -> None:
    log, other = EventLog(), EventLog()
    assert log.poll(other.head(), owner=None)["reset"] is True
    assert log.poll("garbage", owner=None)["reset"] is True
    with pytest.raises(A2MError) as err:
        log.poll(42, owner=None)
    assert err.value.code == -32602


@pytest.mark.anyio
async def test_owner_scope_and_kinds_filter_without_redelivery() -> None:
    log = EventLog()
    alice, bob = log.head("alice"), log.head("bob")
    await log.emit("written", "alice", id="a1")
    await log.emit("written", "bob", id="b1")
    await log.emit("forgotten", "alice", count=2)
    page = log.poll(alice, owner="alice", kinds=["written"])
    assert [e.get("id") for e in page["events"]] == ["a1"] and "reset" not in page
    # the cursor moved past the filtered event: nothing comes back twice
    assert log.poll(page["cursor"], owner="alice", kinds=["written"])["events"] == []
    assert [e["id"] for e in log.poll(bob, owner="bob")["events"]] == ["b1"]


@pytest.mark.anyio
async def test_a_cursor_tells_nothing_of_other_owners() -> None:
    """Alice's cursor moves with her events only: it was `<salt>.<every owner's events>`, so any
    tenant could count what the others did between two polls."""
    log = EventLog()
    before = log.poll(None, owner="alice")["cursor"]
    for i in range(50):
        await log.emit("written", "bob", id=f"b{i}")
    assert log.poll(None, owner="alice")["cursor"] == before
    await log.emit("written", "alice", id="a1")
    page = log.poll(before, owner="alice")
    assert [e["id"] for e in page["events"]] == ["a1"] and "reset" not in page
    assert int(page["cursor"].split(".")[1]) == int(before.split(".")[1]) + 1


@pytest.mark.anyio
async def test_others_filling_the_window_do_not_reset_a_caller_who_missed_nothing() -> None:
    log = EventLog(capacity=4)
    await log.emit("written", "alice", id="a1")
    seen = log.poll(log.head("alice"), owner="alice")["cursor"]
    for i in range(10):
        await log.emit("written", "bob", id=f"b{i}")
    page = log.poll(seen, owner="alice")
    assert page["events"] == [] and "reset" not in page
    before = log.poll(f"{log.salt}.{int(seen.split('.')[1]) - 1}", owner="alice")  # bob gave up his own
    assert [e["id"] for e in before["events"]] == ["a1"] and "reset" not in before


@pytest.mark.anyio
async def test_another_owners_cursor_resets_instead_of_skipping() -> None:
    log = EventLog()
    bobs = log.head("bob")
    for i in range(3):
        await log.emit("written", "alice", id=f"a{i}")
    page = log.poll(bobs, owner="alice")
    assert page["reset"] is True and [e["id"] for e in page["events"]] == ["a0", "a1", "a2"]


@pytest.mark.anyio
async def test_a_bulk_writer_pushes_out_its_own_events_not_a_quiet_tenants() -> None:
    log = EventLog(capacity=10)
    quiet = log.head("quiet")
    await log.emit("written", "quiet", id="q1")
    await log.emit("written", "quiet", id="q2")
    for i in range(100):
        await log.emit("written", "bulk", id=f"b{i}")
    page = log.poll(quiet, owner="quiet")
    assert [e["id"] for e in page["events"]] == ["q1", "q2"] and "reset" not in page
    bulk = log.poll(f"{log.salt}.0", owner="bulk")
    assert bulk["reset"] is True and [e["id"] for e in bulk["events"]] == [f"b{i}" for i in range(90, 100)]


@pytest.mark.anyio
async def test_each_owner_keeps_its_own_newest_capacity_events_whatever_the_others_do() -> None:
    log = EventLog(capacity=5)
    heads = {o: log.head(o) for o in ("a", "b", "c")}
    for i in range(40):
        owner = ("a", "b", "c")[i % 3] if i < 30 else "c"
        await log.emit("written", owner, id=f"{owner}{i}")
    kept = {o: [e["id"] for e in log.poll(heads[o], owner=o)["events"]] for o in heads}
    assert kept == {"a": ["a15", "a18", "a21", "a24", "a27"], "b": ["b16", "b19", "b22", "b25", "b28"],
                    "c": ["c35", "c36", "c37", "c38", "c39"]}
    assert {len(w.events) for w in log._windows.values()} == {5}


@pytest.mark.anyio
async def test_owners_coming_and_going_stay_within_the_bound() -> None:
    """Owners that ask for a head, write a few events and never come back: what the log holds
    stays within `bound`, however many pass, and its count of what it holds stays exact."""
    log = EventLog(capacity=8, bound=300)
    for i in range(5000):
        if i % 2:
            log.head(f"reader{i}")
        else:
            await log.emit_many("written", f"writer{i}", [{"id": str(n)} for n in range(i % 11)])
        assert log._held <= log.bound
    assert log._held == sum(len(w.events) + OWNER_UNITS for w in log._windows.values())
    assert len(log._windows) <= log.bound // OWNER_UNITS


@pytest.mark.anyio
async def test_past_the_bound_the_least_recently_active_owner_goes_whole_and_resets_once() -> None:
    """The safety valve: nobody else loses an event, and the owner that goes is told once."""
    log = EventLog(capacity=4, bound=3 * (4 + OWNER_UNITS))
    heads = {o: log.head(o) for o in ("a", "b", "c")}
    for o in heads:
        await log.emit_many("written", o, [{"id": f"{o}{i}"} for i in range(4)])
    assert log.poll(heads["a"], owner="a", limit=1)["events"][0]["id"] == "a0"  # a poll: a is active
    await log.emit("written", "d", id="d0")  # over the bound: b, the least recently active, goes
    for o in ("a", "c"):
        page = log.poll(heads[o], owner=o)
        assert [e["id"] for e in page["events"]] == [f"{o}{i}" for i in range(4)] and "reset" not in page
    assert [e["id"] for e in log.poll(log.head("d"), owner="d")["events"]] == []
    gone = log.poll(heads["b"], owner="b")
    assert gone["reset"] is True and gone["events"] == []
    await log.emit("written", "b", id="b4")
    again = log.poll(gone["cursor"], owner="b")
    assert [e["id"] for e in again["events"]] == ["b4"] and "reset" not in again
    assert log._held <= log.bound


def test_the_bound_is_never_below_one_full_window_and_grows_with_the_capacity() -> None:
    assert EventLog(capacity=10, bound=1).bound == 10 + OWNER_UNITS
    assert EventLog().bound == DEFAULT_BOUND
    assert EventLog(capacity=100_000).bound == 4 * (100_000 + OWNER_UNITS)


@pytest.mark.anyio
@pytest.mark.parametrize("shape", ["one owner, many events", "many owners, one event", "many owners, a head"])
async def test_the_default_bound_holds_tens_of_megabytes_at_most(shape: str) -> None:
    """Measured: what a unit of the bound costs, for the shapes at either end (UUID ids and owners)."""
    import tracemalloc
    import uuid

    log = EventLog(capacity=20_000, bound=10**9)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for i in range(5_000 if shape != "one owner, many events" else 1):
            owner = f"tenant-{uuid.uuid4()}"
            if shape == "many owners, a head":
                log.head(owner)
                continue
            n = 1 if shape == "many owners, one event" else 10_000
            await log.emit_many("written", owner, [{"id": str(uuid.uuid4()), "tier": "episodic", "session": "s1"}
                                                   for _ in range(n)])
        per_unit = (tracemalloc.get_traced_memory()[0] - base) / log._held
    finally:
        tracemalloc.stop()
    assert per_unit * DEFAULT_BOUND < 70 * 2**20, per_unit


@pytest.mark.anyio
async def test_a_log_of_capacity_zero_keeps_nothing_and_still_pushes() -> None:
    log = EventLog(capacity=0)
    got: list[dict] = []

    async def push(event: dict) -> None:
        got.append(event)

    log.subscribe("conn", push, owner=None, kinds=None)
    cursor = log.head()
    await log.emit("written", None, id="a")
    assert got and log.poll(cursor, owner=None)["events"] == []
    with pytest.raises(A2MError):
        log.poll(cursor, owner="alice", kinds=["nonsense"])


@pytest.mark.anyio
async def test_subscribers_get_their_owners_events() -> None:
    log = EventLog()
    got: list[dict] = []

    async def push(event: dict) -> None:
        got.append(event)

    log.subscribe("conn", push, owner="alice", kinds=None)
    await log.emit("written", "alice", id="x")
    await log.emit("written", "bob", id="y")
    assert [e["id"] for e in got] == ["x"]
    assert log.unsubscribe("conn") and not log.unsubscribe("conn")


@pytest.mark.anyio
async def test_a_cursor_with_digits_int_refuses_or_too_many_resets() -> None:
    log = EventLog()
    await log.emit("written", None, id="a")
    for seq in ("\u00b2", "1\u00b2", "\u0663", "9" * 5000, "-1", "+1", " 1", "1_0"):
        page = log.poll(f"{log.salt}.{seq}", owner=None)
        assert page["reset"] is True and [e["id"] for e in page["events"]] == ["a"], seq


@pytest.mark.anyio
async def test_unsubscribe_refuses_an_owner_the_caller_may_not_name() -> None:
    from a2m.dispatch import Context
    from a2m.events import EventMethods

    class Service(EventMethods):
        events = EventLog()

    alice = Context(transport="stdio", principal="alice")
    with pytest.raises(A2MError) as refused:
        await Service().unsubscribe({"owner": "bob"}, alice)
    assert refused.value.code == -32005
    assert await Service().unsubscribe({"owner": "alice"}, alice) == {"subscribed": False}


@pytest.mark.anyio
@pytest.mark.parametrize("seed", range(5))
async def test_every_reader_gets_its_owners_events_once_in_order_or_a_reset(seed: int) -> None:
    """Owners writing at different rates into small windows, each read by a poller with a cursor:
    without `reset`, a page continues exactly where the last one stopped; with it, the page starts
    at the owner's oldest kept event, and only events the window dropped were skipped."""
    import random

    rng = random.Random(seed)
    log = EventLog(capacity=12)
    owners = ["a", "b", "c", None]
    weights = [1, 8, 2, 1]
    written: dict[str | None, list[str]] = {o: [] for o in owners}
    cursors = {o: log.head(o) for o in owners}
    read: dict[str | None, list[str]] = {o: [] for o in owners}

    def poll(step: int, owner: str | None, limit: int) -> None:
        page = log.poll(cursors[owner], owner=owner, limit=limit)
        ids = [e["id"] for e in page["events"]]
        if ids:
            start = written[owner].index(ids[0])
            assert ids == written[owner][start:start + len(ids)], (step, owner)
            following = written[owner].index(read[owner][-1]) + 1 if read[owner] else 0
            assert start == following if "reset" not in page else start > following, (step, owner, page)
        read[owner] += ids
        cursors[owner] = page["cursor"]

    for step in range(600):
        owner = rng.choices(owners, weights)[0]
        if rng.random() < 0.7:
            event_id = f"{owner}-{len(written[owner])}"
            written[owner].append(event_id)
            await log.emit("written", owner, id=event_id)
            continue
        poll(step, owner, rng.randint(1, 5))
        assert all(len(w.events) <= log.capacity for w in log._windows.values())
    # each reader then reads to the end: its last event is its owner's last (the checks above hold
    # only of pages that carried events, so a poll answering none passed them all)
    for owner in owners:
        poll(-1, owner, 0)
        assert written[owner] and read[owner][-1:] == written[owner][-1:], owner
    assert sum(map(len, read.values())) > len(owners) * log.capacity  # most pages carried events


@pytest.mark.anyio
async def test_one_calls_events_are_appended_together_and_pushed_in_log_order() -> None:
    """A push is an awaitable. Appended and pushed one by one, a writer waiting on its first push
    let a second writer append (and push) in between: a key's revision 3 came before its revision 2,
    in the log and in the pushes (seen on the tier servers, tests/backends/test_tier_events.py)."""
    import asyncio

    log = EventLog()
    got: list[str] = []
    delays = iter([0.02] + [0.0] * 100)

    async def push(event: dict) -> None:
        await asyncio.sleep(next(delays))  # the first push is slow to be taken
        got.append(event["id"])

    log.subscribe("conn", push, owner="alice", kinds=None)
    head = log.head("alice")

    async def second() -> None:
        await asyncio.sleep(0.005)  # while the first writer waits on its first push
        await log.emit("written", "alice", id="k@3")

    await asyncio.gather(log.emit_many("written", "alice", [{"id": "other"}, {"id": "k@2"}]), second())
    polled = [e["id"] for e in log.poll(head, owner="alice")["events"]]
    assert polled == ["other", "k@2", "k@3"]
    assert got == polled


@pytest.mark.anyio
async def test_a_push_that_emits_does_not_wait_for_itself() -> None:
    """A callback that writes (an agent reacting to an event) emits from inside a push: its event
    is queued behind the one being pushed and delivered by that push's caller, not waited for."""
    import asyncio

    log = EventLog()
    got: list[str] = []

    async def push(event: dict) -> None:
        got.append(event["id"])
        if event["id"] == "a":
            await log.emit("written", "alice", id="reaction")

    log.subscribe("conn", push, owner="alice", kinds=None)
    await asyncio.wait_for(log.emit_many("written", "alice", [{"id": "a"}, {"id": "b"}]), 5)
    assert got == ["a", "b", "reaction"]
    assert [e["id"] for _, e, _ in log._windows["alice"].events] == got


@pytest.mark.anyio
async def test_a_dead_subscriber_releases_the_writers_waiting_on_it() -> None:
    import asyncio

    log = EventLog()
    started = asyncio.Event()

    async def push(event: dict) -> None:
        started.set()
        await asyncio.sleep(0.01)
        raise ConnectionResetError("gone")

    log.subscribe("conn", push, owner=None, kinds=None)
    first = asyncio.create_task(log.emit("written", None, id="a"))
    await started.wait()
    await asyncio.wait_for(asyncio.gather(first, log.emit("written", None, id="b")), 5)
    assert not log.unsubscribe("conn")  # it unsubscribed itself


@pytest.mark.anyio
async def test_subscribing_again_changes_the_filter_and_keeps_the_order() -> None:
    import asyncio

    log = EventLog()
    got: list[str] = []

    async def push(event: dict) -> None:
        await asyncio.sleep(0.005 if event["kind"] == "written" else 0)
        got.append(event["kind"])

    log.subscribe("conn", push, owner=None, kinds=None)
    slow = asyncio.create_task(log.emit("written", None, id="a"))
    await asyncio.sleep(0)
    log.subscribe("conn", push, owner=None, kinds=["forgotten"])
    await asyncio.gather(slow, log.emit("forgotten", None, count=1), log.emit("written", None, id="b"))
    assert got == ["written", "forgotten"]


def _seq(cursor: str) -> int:
    return int(cursor.rpartition(".")[2])


async def _alices_view(others: int) -> list[tuple[list[str], bool, bool, int]]:
    """What alice sees of a log of capacity 8 that she fills, while other owners cause `others`
    events: each page from her first cursor, as (ids, reset, more, where her cursor moved)."""
    log = EventLog(capacity=8)
    start = log.head("alice")
    for i in range(8):
        await log.emit("written", "alice", id=f"a{i}")
    for i in range(others):
        await log.emit("written", f"t{i % 3}", id=f"x{i}")
    await log.emit("written", "alice", id="a8")
    pages = []
    for limit in (3, 0):
        page = log.poll(start, owner="alice", limit=limit)
        pages.append(([e["id"] for e in page["events"]], bool(page.get("reset")), bool(page.get("more")),
                      _seq(page["cursor"]) - _seq(start)))
    return pages


@pytest.mark.anyio
async def test_an_owners_view_of_a_full_log_does_not_count_other_owners_events() -> None:
    """Alice held the most of a full shared window: every event another owner caused took one of
    hers, so her poll's `reset` and the events it still found told her how many they caused."""
    alone = await _alices_view(0)
    for others in (1, 3, 7, 50):
        assert await _alices_view(others) == alone, others


async def _a_view_among(others_seed: int | None, seed: int) -> list[tuple[Any, ...]]:
    """Alice's pages (ids, reset, more, cursor relative to her first) over one run of her own calls,
    with other owners' calls between them drawn from `others_seed` (None: no other owner at all)."""
    import random

    mine, theirs = random.Random(seed), random.Random(others_seed)
    log = EventLog(capacity=6)
    start = log.head("alice")
    cursor, n, pages = start, 0, []
    for _ in range(300):
        if others_seed is not None:
            for _ in range(theirs.randint(0, 6)):
                owner = theirs.choice(["bob", "carol", None, f"passer{theirs.randint(0, 999)}"])
                if theirs.random() < 0.8:
                    kind = theirs.choice(["written", "forgotten"])
                    await log.emit_many(kind, owner, [{"id": "x"}] * theirs.randint(1, 9))
                else:
                    log.poll(log.head(owner), owner=owner)
        if mine.random() < 0.5:
            await log.emit_many(mine.choice(["written", "forgotten"]), "alice",
                                [{"id": f"a{n + i}"} for i in range(mine.randint(1, 4))])
            n += 4
            continue
        if mine.random() < 0.2:
            cursor = start  # back to her first cursor: long since out of her window
        page = log.poll(cursor, owner="alice", limit=mine.randint(0, 4), kinds=mine.choice([None, ["written"]]))
        cursor = page["cursor"]
        pages.append(([e["id"] for e in page["events"]], page.get("reset"), page.get("more"),
                      _seq(cursor) - _seq(start)))
    return pages


@pytest.mark.anyio
@pytest.mark.parametrize("seed", range(4))
async def test_what_an_owner_sees_follows_from_its_own_events_alone(seed: int) -> None:
    """Below the safety bound, every page alice polls (events, reset, more, where her cursor moves)
    is the same whether no one else uses the log or other owners write and poll in between."""
    alone = await _a_view_among(None, seed)
    assert any(p[1] for p in alone) and any(p[2] for p in alone)  # resets and partial pages were seen
    for others in range(3):
        assert await _a_view_among(others, seed) == alone, others


async def _fill(log: EventLog, shape: str) -> None:
    """What a caller can put in a log: long owner names (a router without tokens takes any owner, of
    any length), the longest session, key and id a record may have, and `promoted` events naming
    a thousand records each."""
    if shape == "heads of 16 KB owner names":
        for i in range(2_000):
            log.head(f"{i}-" + "o" * 16_000)
    elif shape == "writes with 1 KB sessions and keys":
        for o in range(20):
            await log.emit_many("written", f"tenant{o}", [
                {"id": f"{i:05d}" + "i" * 507, "tier": "episodic", "session": "s" * 1024, "key": f"{i:05d}" + "k" * 1019,
                 "revision": 1} for i in range(1024)])
    else:
        for j in range(250):
            await log.emit("promoted", "tenant", ids=[f"{j:04d}-{n:04d}-" + "u" * 26 for n in range(1000)],
                           tier="episodic")


@pytest.mark.anyio
@pytest.mark.parametrize("shape", ["heads of 16 KB owner names", "writes with 1 KB sessions and keys",
                                   "promoted events of 1000 ids"])
async def test_the_bound_holds_in_bytes_whatever_a_caller_sends(shape: str) -> None:
    """A unit is ~500 bytes for an ordinary event or owner; one counted as a unit however large it
    was let the default bound hold gigabytes (measured: 16 KB owner names 8.5 KB a unit, `promoted`
    events of 1000 ids 90 KB a unit, one owner alone 90 MB within its 1024 events)."""
    import tracemalloc

    log = EventLog(capacity=1024, bound=20_000)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        await _fill(log, shape)
        used = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert used < log.bound * 600, (used, log._held)
    assert log._held == sum(w.units for w in log._windows.values()) and log._held <= log.bound


@pytest.mark.anyio
async def test_an_owner_of_large_events_keeps_its_newest_within_its_share() -> None:
    """Past a full window's units, an owner's own oldest go as past `capacity`: only its own events
    decide, a poll from before them resets as it would past `capacity`, and an owner of large events
    fills no more of the bound (nor pushes out more owners) than one of ordinary events."""
    log = EventLog(capacity=1024, bound=10**6)
    head = log.head("big")
    for i in range(100):
        await log.emit("promoted", "big", ids=[f"{i}-{n:04d}" + "x" * 60 for n in range(100)], tier="episodic")
    window = log._windows["big"]
    assert window.units <= log.share and 0 < len(window.events) < 100
    page = log.poll(head, owner="big", limit=0)
    assert page["reset"] is True and page["events"][-1]["ids"][0].startswith("99-")
    assert [int(e["ids"][0].split("-")[0]) for e in page["events"]] == list(range(100 - len(page["events"]), 100))
