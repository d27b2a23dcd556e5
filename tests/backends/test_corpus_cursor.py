"""The timeline cursor on a mounted corpus (decision 138): a walk through the corpus tier server reads
every record in scope once, in the order a plain timeline shows, however many share a millisecond,
over a real PostgreSQL table and a real Qdrant collection (qdrant-client's local mode)."""

from __future__ import annotations

import random
from datetime import timezone
from pathlib import Path
from typing import Any, Iterable, Iterator

import pytest

from a2m.dispatch import Context, Dispatcher
from a2m.filters import Scope
from backends.corpus.pgtable import TableSpec, TableStore
from backends.corpus.qdrant import CollectionSpec, CollectionStore
from backends.surface import TierServer, cursor_tag
from tests.support.corpora import UUID_ID as UUID, make_points, postgres_holding

pytestmark = pytest.mark.timeout(300)

CROWD = 1300  # more than one timeline (1,000) in one millisecond
TABLES = f"""
-- (a) a bulk load: every row in one microsecond, and a few around it.
CREATE TABLE crowd (id bigint PRIMARY KEY, body text, written timestamptz);
INSERT INTO crowd SELECT g, 'row ' || g, timestamptz '2026-01-01 00:00:00.123+00' FROM generate_series(1, {CROWD}) g;
INSERT INTO crowd VALUES ({CROWD} + 1, 'later', '2026-01-01 00:00:00.124+00'),
                         ({CROWD} + 2, 'earlier', '2026-01-01 00:00:00.122999+00');
CREATE INDEX crowd_written ON crowd (written);
-- (b) one millisecond, rows apart by microseconds, in an order their keys do not keep (9 before 10 as ints).
CREATE TABLE micro (id int PRIMARY KEY, body text, written timestamp);
INSERT INTO micro SELECT g, 'micro ' || g, timestamp '2026-01-01 00:00:00.123' + ((g * 7) % 13) * interval '1 microsecond'
  FROM generate_series(1, 40) g;
-- (c) rows without a time among rows with one: at the epoch exactly, before it, after it; text keys.
CREATE TABLE mixed (id text PRIMARY KEY, body text, src text, meta jsonb, written timestamptz);
INSERT INTO mixed SELECT 'k' || g, 'mixed ' || g, CASE WHEN g % 3 = 0 THEN 'a' ELSE 'b' END,
    jsonb_build_object('coll', CASE WHEN g % 2 = 0 THEN 'x' ELSE 'y' END),
    CASE g % 5 WHEN 0 THEN NULL WHEN 1 THEN timestamptz '1970-01-01 00:00:00+00'
               WHEN 2 THEN timestamptz '1969-12-31 23:59:59.9995+00' WHEN 3 THEN timestamptz '1970-01-01 00:00:00.0004+00'
               ELSE timestamptz '2026-01-01 00:00:00+00' + (g % 4) * interval '1 ms' END
  FROM generate_series(1, 90) g;
-- (d) `where.content`, which no SQL tests: a page the exact check thins is read on (every 7th row has no time).
CREATE TABLE thinned (id int PRIMARY KEY, body text, written timestamptz);
INSERT INTO thinned SELECT g, CASE WHEN g % 3 = 0 THEN 'kept' ELSE 'left' END,
    CASE WHEN g % 7 <> 0 THEN timestamptz '2026-01-01 00:00:00+00' + g * interval '1 ms' END
  FROM generate_series(1, 60) g;
"""


@pytest.fixture(scope="module")
def pg(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with postgres_holding(tmp_path_factory.mktemp("cursor-pg"), TABLES) as dsn:
        yield dsn


async def walked(store: Any, params: dict[str, Any], page: int) -> tuple[list[str], list[str]]:
    """Through the corpus tier server: the ids a cursor walk reads (newest first) and those a plain
    timeline of the same params shows (newest first)."""
    server = TierServer(store, name="kb", kind="semantic", capabilities=frozenset({"core"}), limits={},
                        read_only=True)
    dispatcher, ctx = Dispatcher(server), Context()
    await server.startup()
    try:
        plain = (await dispatcher.call("memory/timeline", params, ctx))["records"]
        walk: list[str] = []
        cursor: Any = True
        for _ in range(10_000):
            answer = await dispatcher.call("memory/timeline", {**params, "limit": page, "cursor": cursor}, ctx)
            assert "cursor" in answer, "the corpus answered no cursor"
            walk += [r["id"] for r in reversed(answer["records"])]
            cursor = answer["cursor"]
            if cursor is None:
                break
        return walk, [r["id"] for r in reversed(plain)]
    finally:
        await server.shutdown()


def table(dsn: str, **spec: Any) -> TableStore:
    return TableStore(dsn, TableSpec(**spec))


def once_in_order(walk: list[str], plain: list[str]) -> None:
    assert len(walk) == len(set(walk)), "a record read twice"
    assert walk == plain


@pytest.mark.anyio
async def test_a_crowded_millisecond_is_walked_whole_and_once(pg: str) -> None:
    walk, plain = await walked(table(pg, table="crowd", text_column="body", created_column="written"), {}, 500)
    assert len(plain) == CROWD + 2 and plain[0] == str(CROWD + 1) and plain[-1] == str(CROWD + 2)
    once_in_order(walk, plain)


@pytest.mark.anyio
async def test_rows_apart_by_microseconds_keep_their_order(pg: str) -> None:
    for page in (1, 3, 7, 100):
        walk, plain = await walked(table(pg, table="micro", text_column="body", created_column="written"), {}, page)
        assert len(plain) == 40
        once_in_order(walk, plain)


@pytest.mark.anyio
@pytest.mark.parametrize("params", [
    {}, {"where": {"src": "a"}}, {"where": {"coll": "x"}},
    {"after": "1969-12-31T23:59:59.999Z"}, {"before": "1970-01-01T00:00:00.001Z"},
    {"after": "1969-01-01T00:00:00.000Z", "before": "2026-01-01T00:00:00.002Z", "where": {"src": "b"}},
])
async def test_untimed_rows_and_scopes_are_walked_in_timeline_order(pg: str, params: dict[str, Any]) -> None:
    for spec in ({"metadata_columns": ["src"], "metadata_column": "meta"},
                 {"metadata_columns": ["src"], "metadata_column": "meta", "row_filter": ("src", "b")},
                 {"metadata_columns": ["src"]} if "coll" not in str(params) else {"metadata_column": "meta"}):
        for page in (1, 4, 25):
            store = table(pg, table="mixed", text_column="body", created_column="written", **spec)
            walk, plain = await walked(store, params, page)
            assert plain or "row_filter" in spec, params
            once_in_order(walk, plain)


@pytest.mark.anyio
async def test_a_page_the_exact_check_thins_reads_on_past_what_it_kept(pg: str) -> None:
    # Rows kept (every 3rd) newest first; then those of them without a time (42, 21), by key, newest first.
    expected = [str(g) for g in range(60, 0, -3) if g % 7] + ["42", "21"]
    for page in (1, 2, 5):  # 2: the first read keeps 60 and leaves 59; the next starts past 59, keeping 60
        walk, plain = await walked(table(pg, table="thinned", text_column="body", created_column="written"),
                                   {"where": {"content": "kept"}}, page)
        assert plain == expected
        once_in_order(walk, plain)


@pytest.mark.anyio
async def test_a_table_without_a_created_column_is_walked_by_key(pg: str) -> None:
    walk, plain = await walked(table(pg, table="crowd", text_column="body"), {}, 400)
    assert plain[0] == str(CROWD + 2) and len(plain) == CROWD + 2  # every row shows the epoch: newest key first
    once_in_order(walk, plain)


@pytest.mark.anyio
async def test_a_cursor_naming_no_row_of_the_key_type_is_invalid(pg: str) -> None:
    server = TierServer(table(pg, table="micro", text_column="body", created_column="written"), name="kb",
                        kind="semantic", capabilities=frozenset({"core"}), limits={}, read_only=True)
    dispatcher, ctx = Dispatcher(server), Context()
    await server.startup()
    try:
        answer = await dispatcher.call("memory/timeline", {"cursor": f"{cursor_tag('kb', 'semantic')}|2026-01-01T00:00:00.123Z|5|abc"}, ctx)
    except Exception as exc:  # -32602, not an internal error
        assert getattr(exc, "code", None) == -32602, exc
    else:
        raise AssertionError(answer)
    finally:
        await server.shutdown()


# ---- Qdrant --------------------------------------------------------------------------------------------

def collection(path: Path, **spec: Any) -> CollectionStore:
    return CollectionStore(CollectionSpec(collection="kb", text_field="text", **spec), path=str(path))


@pytest.mark.anyio
async def test_a_qdrant_collection_is_walked_whole_and_once(tmp_path: Path) -> None:
    points: dict[int | str, dict[str, Any]] = {
        i: {"text": f"p {i}", "at": "2026-01-01T00:00:00.123000Z", "src": "a" if i % 3 else "b"}
        for i in range(1, CROWD + 1)}  # (a) one microsecond
    points |= {CROWD + i: {"text": "micro", "at": f"2026-01-01T00:00:00.123{(i * 7) % 13:03d}Z", "src": "a"}
               for i in range(1, 30)}  # (b) apart by microseconds
    points |= {CROWD + 100 + i: {"text": "untimed", "src": "b"} for i in range(12)}  # (c) no time
    points |= {CROWD + 200: {"text": "epoch", "at": "1970-01-01T00:00:00Z"},
               CROWD + 201: {"text": "before", "at": "1969-12-31T23:59:59.9995Z"},
               "5f1c2c9e-3d7a-4c59-9a53-1b7e2f0c4a11": {"text": "uuid", "at": "2026-01-01T00:00:00.123Z"}}
    make_points(tmp_path / "q", points)
    for params, page in (({}, 500), ({"where": {"src": "b"}}, 97),
                         ({"after": "1969-12-31T23:59:59.999Z", "before": "2026-01-01T00:00:00.124Z"}, 300)):
        walk, plain = await walked(collection(tmp_path / "q", created_field="at"), params, page)
        assert len(plain) > 400, params
        once_in_order(walk, plain)
    walk, plain = await walked(collection(tmp_path / "q"), {}, 333)  # no created_field: by point id
    assert len(plain) == len(points)
    once_in_order(walk, plain)


@pytest.mark.anyio
async def test_a_qdrant_page_in_time_order_reads_about_a_page_not_the_collection(tmp_path: Path) -> None:
    """Each page read every point in scope and placed them in Python: a walk of n points by pages of
    `limit` read n * n / (2 * limit). In created_field order a page now reads the newest points at or
    before its position by Qdrant's ordered scroll; the points read are counted as the engine
    returns them. The walk is still whole and once."""
    n, page = 2000, 100
    make_points(tmp_path / "q", {i: {"text": f"p {i}", "at": f"2026-01-01T00:{i // 60000:02d}:{i // 1000 % 60:02d}."
                                                            f"{i % 1000:03d}Z"} for i in range(1, n + 1)})
    store = collection(tmp_path / "q", created_field="at")
    server = TierServer(store, name="kb", kind="semantic", capabilities=frozenset({"core"}), limits={},
                        read_only=True)
    dispatcher, ctx = Dispatcher(server), Context()
    await server.startup()
    try:
        scroll, read = store.client.scroll, [0]

        async def counted(*args: Any, **kwargs: Any) -> Any:
            points, offset = await scroll(*args, **kwargs)
            read[0] += len(points)
            return points, offset

        store.client.scroll = counted
        walk: list[str] = []
        cursor: Any = True
        while cursor is not None:
            answer = await dispatcher.call("memory/timeline", {"limit": page, "cursor": cursor}, ctx)
            walk += [r["id"] for r in reversed(answer["records"])]
            cursor = answer["cursor"]
    finally:
        await server.shutdown()
    assert walk == [str(i) for i in range(n, 0, -1)]
    assert read[0] <= 3 * n, f"{read[0]} points read for a walk of {n}"


def timeline_place(point_id: int | str, at: str | None) -> tuple[Any, ...]:
    """Where decision 138 places a point in the timeline, ascending, computed here apart from the store:
    the millisecond it shows (the epoch without a time), its exact microsecond (none: before every
    time at the epoch), then its id (integers by value, then UUIDs by their text)."""
    from datetime import datetime

    if at is None:
        shown, exact = datetime(1970, 1, 1, tzinfo=timezone.utc), -1
    else:
        moment = datetime.fromisoformat(at.replace("Z", "+00:00"))
        shown, exact = moment.replace(microsecond=moment.microsecond // 1000 * 1000), moment.timestamp()
    return shown, exact, (0, point_id) if isinstance(point_id, int) else (1, point_id)


async def first_pages(store: Any, limits: Iterable[int]) -> dict[int, tuple[list[str], list[str]]]:
    """For each limit, the ids (newest first) a plain `memory/timeline` of that limit shows and the
    ids the first page of a cursor walk of that limit holds, through the corpus tier server."""
    server = TierServer(store, name="kb", kind="semantic", capabilities=frozenset({"core"}), limits={},
                        read_only=True)
    dispatcher, ctx = Dispatcher(server), Context()
    await server.startup()
    try:
        out = {}
        for limit in limits:
            plain = (await dispatcher.call("memory/timeline", {"limit": limit}, ctx))["records"]
            page = (await dispatcher.call("memory/timeline", {"limit": limit, "cursor": True}, ctx))["records"]
            out[limit] = [r["id"] for r in reversed(plain)], [r["id"] for r in reversed(page)]
        return out
    finally:
        await server.shutdown()


@pytest.mark.anyio
async def test_a_qdrant_limited_timeline_is_the_first_page_of_a_walk(tmp_path: Path) -> None:
    """A plain timeline of `limit` N and a walk's first page of N are the same records in the same
    order, the reference's: where N cuts a time many points share, or the points without a time,
    both keep the newest by the tie order (highest point id first), whatever order the points were
    written in (Qdrant orders a shared time no further). The plain timeline kept the first points
    its ordered scroll returned there, and the lowest ids of the points without a time. An oldest-
    first `select` of N keeps the reference's first N (the lowest ids first)."""
    crowd = "2026-01-01T00:00:00.123000Z"
    stamps: dict[int | str, str | None] = {i: crowd for i in range(1, 61)}  # more than a page in one µs
    stamps |= {100 + i: f"2026-01-01T00:00:00.123{i * 97 % 1000:03d}Z" for i in range(1, 6)}  # same ms, apart
    stamps |= {200: "2026-01-01T00:00:00.124Z", 201: "2026-01-01T00:00:00.124Z", UUID: crowd}
    stamps |= {300 + i: None for i in range(120)}  # no time: after those timed at the epoch, more than a page
    stamps |= {500: "1970-01-01T00:00:00Z", 501: "1970-01-01T00:00:00.000400Z", 502: "1969-12-31T23:59:59.9995Z"}
    order = list(stamps)
    random.Random(138).shuffle(order)  # written in no order the ids keep
    make_points(tmp_path / "q", {i: {"text": f"p {i}"} | ({} if stamps[i] is None else {"at": stamps[i]})
                                 for i in order})
    expected = [str(i) for i in sorted(stamps, key=lambda i: timeline_place(i, stamps[i]), reverse=True)]
    limits = (1, 2, 3, 5, 9, 17, 40, 66, 70, 71, 75, 80, 150, 191, 192, 250)  # the crowd, untimed, past all
    pages = await first_pages(collection(tmp_path / "q", created_field="at"), limits)
    assert {n: pages[n] for n in limits if pages[n] != (expected[:n], expected[:n])} == {}
    store = collection(tmp_path / "q", created_field="at")
    await store.open()
    try:
        later = Scope(after="2000-01-01T00:00:00.000Z")  # oldest first from the crowd: a limit cuts it
        for n in limits:
            assert [r.id for r in await store.select(Scope(), order="asc", limit=n)] == expected[::-1][:n], n
            assert [r.id for r in await store.select(later, order="asc", limit=n)] == expected[::-1][123:123 + n], n
        scroll, read = store.client.scroll, [0]

        async def counted(*args: Any, **kwargs: Any) -> Any:
            points, offset = await scroll(*args, **kwargs)
            read[0] += len(points)
            return points, offset

        store.client.scroll = counted  # the newest 5 are timed: the 120 points without a time go unread
        assert [r.id for r in await store.select(Scope(), order="desc", limit=5)] == expected[:5]
        assert read[0] <= 16, read[0]
    finally:
        await store.close()


@pytest.mark.anyio
async def test_a_qdrant_page_from_inside_a_shared_time_does_not_end_the_walk(tmp_path: Path) -> None:
    """A page whose position lies inside a time more points share than it holds reads from that time
    on, so the scroll returns the points before the position too (the walk read them already). They
    counted towards the page's `limit`: the page came out short, its cursor null, and the walk ended
    with the older points unread (31 of 50 here, by pages of 16)."""
    points: dict[int | str, dict[str, Any]] = {i: {"text": "c", "at": "2026-01-01T00:00:00.500Z"}
                                               for i in range(1, 21)}
    points |= {100 + i: {"text": "o", "at": f"2026-01-01T00:00:00.{i:03d}Z"} for i in range(1, 31)}
    make_points(tmp_path / "q", points)
    for page in (16, 17, 10):
        walk, plain = await walked(collection(tmp_path / "q", created_field="at"), {}, page)
        assert len(plain) == 50
        once_in_order(walk, plain)
