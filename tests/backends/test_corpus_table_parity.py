"""The table adapter against the reference semantics of a scope, on a real (embedded) PostgreSQL table
whose metadata columns are of every common kind: what `select` and `search` return must be what
`matches` says of the records the adapter shows (the engine's filter may be wider, never narrower)."""

from __future__ import annotations

import random
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from a2m.filters import Scope, matches
from backends.episodic.embedded import EmbeddedPostgres
from tests.support.corpora import opened_table

SEED = 4312
ROWS = 60  # more than a search's first pool (40), so a widened filter must read on
COLUMNS = ["t", "i", "b", "n", "d", "r", "flag", "ts", "dt", "j", "js", "tags", "nums", "role", "u"]
WORDS = ["zebra", "quartz", "violin", "harbor"]
UTC = timezone.utc
STAMPS = [None, datetime(1960, 5, 1, 12, 0, tzinfo=UTC), datetime(1970, 1, 1, tzinfo=UTC),
          datetime(2026, 1, 2, 9, 0, 0, 123456, tzinfo=UTC), datetime(2026, 1, 2, 9, 0, 0, 123999, tzinfo=UTC),
          datetime(2026, 3, 4, 5, 6, 7, tzinfo=timezone(timedelta(hours=2)))]
POOLS: dict[str, list[Any]] = {
    "t": ["a", "b", "5", "true", "", None],
    "i": [5, 0, -1, None],
    "b": [2**53 + 1, 5, -(2**63), None],
    "n": [Decimal("5.00"), Decimal("5"), Decimal("0.1"), Decimal("1e30"), Decimal("-0.5"), None],
    "d": [5.0, 0.1, 1e20, -0.0, None],
    "r": [0.5, 0.1, None],
    "flag": [True, False, None],
    "ts": [datetime(2026, 1, 2, 9, 0, 0, 123456, tzinfo=UTC), datetime(2025, 6, 1, tzinfo=timezone(timedelta(hours=-5))),
           None],
    "dt": [date(2026, 1, 2), date(1999, 12, 31), None],
    "j": [Jsonb(5), Jsonb(5.0), Jsonb("x"), Jsonb(["x", "y", 5]), Jsonb({"k": 1}), Jsonb(None), Jsonb(True), None],
    "js": ['"x"', "[1, 2]", "5.50", "null", None],  # json (not jsonb), as text
    "tags": [["x", "y"], [], ["5"], None],
    "nums": [[5, 6], [], None],
    "role": ["user", None],  # a column named like a record field: `where.role` tests the field
    "u": ["5f1c2c9e-3d7a-4c59-9a53-1b7e2f0c4a11", None],
}
DDL = ("CREATE TABLE {name} (id serial PRIMARY KEY, body text, emb vector(3), created timestamptz, t text, i integer,"
       " b bigint, n numeric, d double precision, r real, flag boolean, ts timestamptz, dt date, j jsonb, js json,"
       " tags text[], nums integer[], role text, u uuid)")


def make_odd_table(dsn: str, name: str = "odd") -> None:
    rng = random.Random(SEED)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        conn.execute(DDL.format(name=name))
        for n in range(ROWS):
            body = None if n % 17 == 0 else " ".join(rng.sample(WORDS, rng.randint(1, 2)))
            emb = None if n % 13 == 5 else str([rng.random(), rng.random(), rng.random()])
            values = [rng.choice(POOLS[c]) for c in COLUMNS]
            conn.execute(f"INSERT INTO {name} (body, emb, created, {', '.join(COLUMNS)}) VALUES (%s, %s::vector, %s,"
                         f" {', '.join(['%s'] * len(COLUMNS))})", [body, emb, rng.choice(STAMPS), *values])


UUID = "5f1c2c9e-3d7a-4c59-9a53-1b7e2f0c4a11"


def make_few_table(dsn: str) -> None:
    """Four hand-made rows for the regression tests below: one without a time, one before the epoch."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(DDL.format(name="few"))
        rows = [
            ("zebra one", None, "a", 5, Decimal("5.00"), 5.0, 0.1, True, datetime(2026, 1, 2, 9, 0, 0, 123456, tzinfo=UTC),
             date(2026, 1, 2), Jsonb("x"), ["x", "y"], [5, 6], "user", UUID),
            ("zebra two", datetime(1960, 5, 1, tzinfo=UTC), None, None, Decimal("1e30"), None, None, False, None, None,
             Jsonb(["x", 5]), [], None, None, None),
            ("quartz three", datetime(2026, 1, 2, tzinfo=UTC), "b", -1, None, None, None, None, None, None,
             Jsonb(None), None, [], None, None),
            ("quartz four", datetime(2026, 3, 1, tzinfo=UTC), None, None, None, None, None, None, None, None, None, None,
             None, None, None),
        ]
        for row in rows:
            conn.execute("INSERT INTO few (body, created, t, i, n, d, r, flag, ts, dt, j, tags, nums, role, u)"
                         " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)", row)


FEW = dict(table="few", text_column="body", vector_column="emb", created_column="created", metadata_columns=COLUMNS)


async def ids_where(store: Any, where: dict[str, Any], **scope: Any) -> list[str]:
    return [r.id for r in await store.select(Scope(where=where, **scope))]


@pytest.mark.anyio
async def test_table_where_compares_numbers_as_json_does(odd_dsn) -> None:  # type: ignore[no-untyped-def]
    # `column::text = str(value)` missed 5.0 in an integer column, 5 in numeric(5.00), 0.1 in a real.
    async with opened_table(odd_dsn, **FEW) as store:
        assert await ids_where(store, {"i": 5.0}) == ["1"] and await ids_where(store, {"d": 5}) == ["1"]
        assert await ids_where(store, {"n": 5}) == ["1"] and await ids_where(store, {"n": 1e30}) == ["2"]
        assert await ids_where(store, {"r": 0.1}) == ["1"] and await ids_where(store, {"nums": 6.0}) == ["1"]
        assert await ids_where(store, {"i": [5.5, -1]}) == ["3"] and await ids_where(store, {"i": "5"}) == []


@pytest.mark.anyio
async def test_table_where_matches_times_dates_and_uuids_as_the_record_shows_them(odd_dsn) -> None:  # type: ignore[no-untyped-def]
    async with opened_table(odd_dsn, **FEW) as store:
        first = (await store.get(None, ["1"]))[0]
        assert first.metadata["ts"] == "2026-01-02T09:00:00.123Z" and first.metadata["u"] == UUID
        for name in ("ts", "dt", "u"):
            assert await ids_where(store, {name: first.metadata[name]}) == ["1"], name
        assert await ids_where(store, {"ts": "2026-01-02 09:00:00.123456+00"}) == []  # not the form shown
        assert await ids_where(store, {"ts": "9999-12-31T23:59:59.999Z"}) == []


@pytest.mark.anyio
async def test_table_where_tests_json_and_array_members_and_json_null(odd_dsn) -> None:  # type: ignore[no-untyped-def]
    async with opened_table(odd_dsn, **FEW) as store:
        assert await ids_where(store, {"j": "x"}) == ["2", "1"]  # a string, and a member of an array
        assert await ids_where(store, {"j": 5.0}) == ["2"]
        assert await ids_where(store, {"j": None}) == ["3", "4"]  # JSON null shows as null
        assert await ids_where(store, {"tags": "y"}) == ["1"] and await ids_where(store, {"tags": None}) == ["3", "4"]


@pytest.mark.anyio
async def test_table_where_with_an_empty_list_matches_nothing(odd_dsn) -> None:  # type: ignore[no-untyped-def]
    async with opened_table(odd_dsn, **FEW) as store:  # was `WHERE ()`: a syntax error, so an internal error
        assert await ids_where(store, {"t": []}) == []
        assert await store.search(Scope(where={"j": []}), text="zebra", vector=None, limit=5) == []


@pytest.mark.anyio
async def test_table_orders_and_bounds_rows_without_a_time_as_the_epoch(odd_dsn) -> None:  # type: ignore[no-untyped-def]
    async with opened_table(odd_dsn, **FEW) as store:
        assert await ids_where(store, {}) == ["2", "1", "3", "4"]  # NULL sorted after every time before
        assert [r.id for r in await store.select(Scope(), order="desc", limit=2)] == ["4", "3"]
        assert await ids_where(store, {}, before="1971-01-01T00:00:00.000Z") == ["2", "1"]
        assert await ids_where(store, {}, after="1969-01-01T00:00:00.000Z", before="2026-01-02T00:00:00.001Z") == [
            "1", "3"]


@pytest.mark.anyio
async def test_table_where_names_the_record_field_not_a_column_of_that_name(odd_dsn) -> None:  # type: ignore[no-untyped-def]
    async with opened_table(odd_dsn, **FEW) as store:  # `role` is a metadata column, but `where.role` is the field
        assert await ids_where(store, {"role": None}) == ["2", "1", "3", "4"]


@pytest.mark.anyio
async def test_table_timeline_and_recall_read_on_past_a_test_left_to_the_exact_check(odd_dsn) -> None:  # type: ignore[no-untyped-def]
    async with opened_table(odd_dsn, **FEW) as store:  # `where.content` is not in the SQL: LIMIT 1 read row 4 only
        got = await store.select(Scope(where={"content": "zebra one"}), order="desc", limit=1)
        assert [r.id for r in got] == ["1"]
    async with opened_table(odd_dsn, **ODD) as store:  # past the first pool of 40 by vector
        ranked = await store.search(Scope(), text=None, vector=[0.3, 0.2, 0.1], limit=ROWS)
        last = ranked[-1].id
        hits = await store.search(Scope(where={"id": last}), text=None, vector=[0.3, 0.2, 0.1], limit=1)
        assert [r.id for r in hits] == [last]


@pytest.fixture(scope="module")
def odd_dsn(tmp_path_factory):  # type: ignore[no-untyped-def]
    pg = EmbeddedPostgres(tmp_path_factory.mktemp("corpus-table-pg"))
    dsn = pg.start()
    make_odd_table(dsn)
    make_few_table(dsn)
    try:
        yield dsn
    finally:
        pg.stop()


ODD = dict(table="odd", text_column="body", vector_column="emb", metadata_columns=COLUMNS)


async def every_record(store: Any) -> list[Any]:
    """What each row shows (its vector too), read with no filter at all."""
    return await store.select(Scope(), with_embeddings=True)


def wheres_for(every: list[Any]) -> list[dict[str, Any]]:
    """Each value some record shows (list members too) on each column, as a test and as "any of" with
    null, plus values that are equal in JSON but spelled apart in SQL."""
    out: list[dict[str, Any]] = [{}]
    for column in COLUMNS + ["unknown"]:
        seen: list[Any] = []
        for r in every:
            value = r.metadata.get(column)
            for v in value if isinstance(value, list) else [value]:
                if (v is None or isinstance(v, (str, int, float, bool))) and not any(
                        type(v) is type(s) and v == s for s in seen):
                    seen.append(v)
        for v in seen + [5, 5.0, "5", True, 1, 0.1, 2**53 + 1, 1e30, "x", "2026-01-02", "nope"]:
            out.append({column: v})
        out += [{column: None}, {column: [seen[0] if seen else "a", None]}, {column: []},
                {column: [5, "x", True]}]
    out += [{"content": "zebra"}, {"content": ""}, {"id": ["1", "2", "7", "nope"]}, {"id": "3"},
            {"created_at": "1970-01-01T00:00:00.000Z"}, {"t": "a", "i": 5}, {"role": "user"}]
    return out


RANGES = [(None, None), ("1969-12-31T23:59:59.999Z", "1970-01-01T00:00:00.001Z"), ("2026-01-02T09:00:00.123Z", None),
          (None, "2026-01-02T09:00:00.124Z"), ("1950-01-01T00:00:00.000Z", "2026-01-01T00:00:00.000Z")]


async def disagreements(store: Any, every: list[Any], wheres: list[dict[str, Any]]) -> list[Any]:
    wrong: list[Any] = []
    # each where bare and under one time range, the ranges taken in turn (bounded: ~15 s in all)
    for n, where in enumerate(wheres):
        await agree(store, every, where, RANGES[0], wrong)
        await agree(store, every, where, RANGES[1 + n % (len(RANGES) - 1)], wrong)
    return wrong


async def agree(store: Any, every: list[Any], where: dict[str, Any], bounds: tuple[str | None, str | None],
                wrong: list[Any]) -> None:
    after, before = bounds
    scope = Scope(where=where, after=after, before=before)
    want = [r for r in every if matches(r, scope)]
    ids = {r.id for r in want}
    newest = sorted((r.created_at for r in want), reverse=True)
    for limit in (None, 1, 3):
        got = await store.select(scope, order="desc", limit=limit)
        if {r.id for r in got} - ids or [r.created_at for r in got] != newest[:limit] or len(
                {r.id for r in got}) != len(got):
            wrong.append(("timeline", where, after, before, limit, [r.id for r in got], sorted(ids)))
    oldest = [r.created_at for r in await store.select(scope, order="asc")]
    if oldest != sorted(newest):
        wrong.append(("timeline asc", where, after, before, oldest))
    for limit in (2, 100):
        hybrid = await store.search(scope, text="zebra", vector=[0.3, 0.2, 0.1], limit=limit)
        words = await store.search(scope, text="zebra", vector=None, limit=limit)
        with_word = {r.id for r in want if "zebra" in r.content}
        # Every row in scope that either list can hold: one without a vector is no vector match (an
        # index holds none of them, so ranking them last answered differently with one than without).
        ranked = with_word | {r.id for r in want if r.embedding is not None}
        if {r.id for r in hybrid} - ranked or len(hybrid) != min(limit, len(ranked)):
            wrong.append(("hybrid", where, after, before, limit, [r.id for r in hybrid], sorted(ids)))
        if {r.id for r in words} - with_word or len(words) != min(limit, len(with_word)):
            wrong.append(("text", where, after, before, limit, [r.id for r in words], sorted(with_word)))
        scores = [r.score for r in hybrid]
        if scores != sorted(scores, reverse=True) or any(not 0 < (s or 0) <= 1 for s in scores):
            wrong.append(("scores", where, limit, scores))


@pytest.mark.anyio
async def test_table_timeline_and_recall_answer_what_the_reference_matcher_says(odd_dsn) -> None:  # type: ignore[no-untyped-def]
    async with opened_table(odd_dsn, created_column="created", **ODD) as store:
        every = await every_record(store)
        assert len(every) == ROWS and len({r.id for r in every}) == ROWS
        assert {r.created_at for r in every} >= {"1970-01-01T00:00:00.000Z", "2026-01-02T09:00:00.123Z"}
        wrong = await disagreements(store, every, wheres_for(every))
        assert not wrong, f"{len(wrong)} disagreements:\n" + "\n".join(map(str, wrong[:40]))


@pytest.mark.anyio
async def test_table_without_a_created_column_answers_the_same(odd_dsn) -> None:  # type: ignore[no-untyped-def]
    async with opened_table(odd_dsn, **ODD) as store:
        every = await every_record(store)
        assert {r.created_at for r in every} == {"1970-01-01T00:00:00.000Z"}
        wheres = [w for w in wheres_for(every) if len(w) != 1 or next(iter(w)) in ("i", "j", "tags", "t", "unknown")]
        wrong = await disagreements(store, every, wheres[::3])
        assert not wrong, f"{len(wrong)} disagreements:\n" + "\n".join(map(str, wrong[:40]))
