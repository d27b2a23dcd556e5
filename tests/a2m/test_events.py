import pytest

from a2m.errors import A2MError
from a2m.events import EventLog


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
    cursor = log.head()
    await log.emit("written", "alice", id="a1")
    await log.emit("written", "bob", id="b1")
    await log.emit("forgotten", "alice", count=2)
    page = log.poll(cursor, owner="alice", kinds=["written"])
    assert [e.get("id") for e in page["events"]] == ["a1"]
    # the cursor moved past bob's and the filtered event: nothing comes back twice
    assert log.poll(page["cursor"], owner="alice", kinds=["written"])["events"] == []
    assert log.poll(cursor, owner="bob")["events"][0]["id"] == "b1"
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
