"""The shared surface over each real engine: the same request gets the same answer on every tier.

The four tier servers run in process, each on its embedded engine (Redis, PostgreSQL + pgvector,
Qdrant Edge, git), behind the dispatcher exactly as `a2m serve` builds them.
"""

from __future__ import annotations

from typing import Any, AsyncIterator

import orjson
import pytest

from a2m.capabilities import METHOD_CAPABILITY
from a2m.dispatch import Context, Dispatcher
from tests.support.inprocess import call, dispatchers, owner

pytestmark = pytest.mark.anyio

TIERS = ("working", "episodic", "semantic", "procedural")


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
async def tiers(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[dict[str, Dispatcher]]:
    async with dispatchers(tmp_path_factory.mktemp("tiers"), TIERS) as running:
        yield running


@pytest.mark.parametrize("tier", TIERS)
async def test_where_tier_is_the_tier_every_record_is_read_from(tiers: dict[str, Dispatcher], tier: str) -> None:
    d, me = tiers[tier], owner()
    # a record written without a tier and one naming this tier: both show `tier: <name>` on the wire
    written = (await call(d, "memory/remember", {"owner": me, "records": [
        {"content": "plain note", "metadata": {"n": 1}}, {"content": "tiered note", "tier": tier}]}))["ids"]
    everything = (await call(d, "memory/timeline", {"owner": me}))["records"]
    assert {r["tier"] for r in everything} == {tier}
    for where, want in (({"tier": tier}, written), ({"tier": [tier, "elsewhere"]}, written),
                        ({"tier": tier, "n": 1}, written[:1]), ({"tier": "elsewhere"}, []), ({"tier": None}, [])):
        assert [r["id"] for r in (await call(d, "memory/timeline", {"owner": me, "where": where}))["records"]] == want
        hits = (await call(d, "memory/recall", {"owner": me, "query": "note", "where": where}))["records"]
        assert sorted(r["id"] for r in hits) == sorted(want), where
    # forget by tier is a deliberate selector: another tier's name forgets nothing, this one everything
    assert await call(d, "memory/forget", {"owner": me, "where": {"tier": "elsewhere"}}) == {"forgotten": 0}
    assert await call(d, "memory/forget", {"owner": me, "where": {"tier": tier}}) == {"forgotten": 2}
    assert await call(d, "memory/forget", {"owner": me, "where": {}}) == {"error": -32602}


@pytest.mark.parametrize("tier", TIERS)
async def test_an_integer_past_64_bits_is_refused_not_stored_as_a_float(tiers: dict[str, Dispatcher],
                                                                        tier: str) -> None:
    """orjson reads 10**30 as 1e30: the write stored the float and said nothing. One within 64 bits
    (a 19-digit snowflake id) is written and read back exactly; 1e20 written out in full is taken."""
    d, me = tiers[tier], owner()

    async def remember(number: bytes) -> dict[str, Any]:
        body = b'{"jsonrpc": "2.0", "id": 1, "method": "memory/remember", "params": {"owner": "%s", "records": ' \
               b'[{"content": "big number", "metadata": {"n": [1, %s]}}]}}' % (me.encode(), number)
        reply = await d.handle_bytes(body, Context())
        assert reply is not None
        return orjson.loads(reply)

    for number in (b"123456789012345678901234567890", b"-9223372036854775809", b"18446744073709551617"):
        error = (await remember(number))["error"]
        assert error["code"] == -32602 and number.decode() in error["message"], error
    assert (await call(d, "memory/timeline", {"owner": me}))["records"] == []
    assert "result" in await remember(b"1234567890123456789")
    (record,) = (await call(d, "memory/timeline", {"owner": me}))["records"]
    assert record["metadata"] == {"n": [1, 1234567890123456789]}
    # a double JavaScript or Go writes out in full: its float is its value, so it is taken
    assert "result" in await remember(b"100000000000000000000")


@pytest.mark.parametrize("tier", TIERS)
async def test_a_turn_with_empty_content_is_kept(tiers: dict[str, Dispatcher], tier: str) -> None:
    """An assistant turn that only calls tools has no text (decision 153): taken, read back, found by
    the timeline and a `where`, never a text match; a record with no content at all needs a uri."""
    d, me = tiers[tier], owner()
    calls = {"tool_calls": [{"name": "weather", "arguments": {"city": "Oslo"}}]}
    [rid] = (await call(d, "memory/remember", {"owner": me, "records": [
        {"content": "", "role": "assistant", "metadata": calls}]}))["ids"]
    (record,) = (await call(d, "memory/timeline", {"owner": me}))["records"]
    assert (record["id"], record["content"], record["metadata"]) == (rid, "", calls)
    assert (await call(d, "memory/recall", {"owner": me, "query": "weather Oslo"}))["records"] == []
    found = (await call(d, "memory/timeline", {"owner": me, "where": {"role": "assistant"}}))["records"]
    assert [r["id"] for r in found] == [rid]
    assert await call(d, "memory/remember", {"owner": me, "records": [{"role": "assistant"}]}) == {"error": -32602}


@pytest.mark.parametrize("tier", TIERS)
async def test_a_where_naming_an_integer_past_64_bits_is_refused_not_matched_as_a_float(
        tiers: dict[str, Dispatcher], tier: str) -> None:
    """A `where` of 10**30 + 1 was read as 1e30: a forget deleted the record holding the float 1e30."""
    d, me = tiers[tier], owner()
    await call(d, "memory/remember", {"owner": me, "records": [{"content": "a float", "metadata": {"n": 1e30}}]})
    for method in ("memory/forget", "memory/timeline", "memory/recall"):
        body = b'{"jsonrpc": "2.0", "id": 1, "method": "%s", "params": {"owner": "%s", ' \
               b'"where": {"n": [2, 1000000000000000000000000000001]}}}' % (method.encode(), me.encode())
        reply = await d.handle_bytes(body, Context())
        assert reply is not None
        error = orjson.loads(reply)["error"]
        assert error["code"] == -32602 and "1000000000000000000000000000001" in error["message"], (method, error)
    assert len((await call(d, "memory/timeline", {"owner": me, "where": {"n": 1e30}}))["records"]) == 1


# (record, a one-word query written as the record writes it): no stopword in the query, so it folds
# as English; the record kept its words unfolded (its stopwords said Spanish, Italian, French, or,
# for the last, Italian for its one stopword "o").
UNFOLDED = [("Compré dos casas en Madrid el año pasado", "casas"),
            ("Le pere sono mature e la torta è pronta", "pere"),
            ("Les maisons sont grandes et les jardins aussi", "jardins"), ("ten o'clock apple", "apple")]


@pytest.mark.parametrize("tier", TIERS)
async def test_a_one_word_query_finds_a_record_not_read_as_english(tiers: dict[str, Dispatcher], tier: str) -> None:
    """Without its unfolded words a query met only English records: each of these found nothing."""
    d, me = tiers[tier], owner()
    ids = (await call(d, "memory/remember", {"owner": me, "records": [{"content": c} for c, _ in UNFOLDED]}))["ids"]
    for (content, query), record_id in zip(UNFOLDED, ids):
        hits = (await call(d, "memory/recall", {"owner": me, "query": query, "touch": False}))["records"]
        assert [r["id"] for r in hits][:1] == [record_id], (query, [r["content"] for r in hits])
    # forget by query reads the same terms
    assert await call(d, "memory/forget", {"owner": me, "query": "casas"}) == {"forgotten": 1}


# Read selectors naming a string with NUL: no stored record can hold one, so each matches nothing.
NUL_READS: list[tuple[str, dict[str, Any], Any]] = [
    ("memory/fetch", {"key": "k\x00"}, {"record": None}),
    ("memory/forget", {"ids": ["a\x00"]}, {"forgotten": 0}),
    ("memory/forget", {"key_prefix": "k\x00"}, {"forgotten": 0}),
    ("memory/forget", {"where": {"m\x00": "v"}}, {"forgotten": 0}),
    ("memory/reinforce", {"ids": ["a\x00"]}, {"reinforced": 0}),
    ("memory/recall", {"owner": "o\x00"}, {"records": []}),
    ("memory/recall", {"query": "note", "where": {"m": "v\x00"}}, {"records": []}),
    ("memory/timeline", {"owner": "o\x00"}, {"records": []}),
    ("memory/timeline", {"key_prefix": "\x00"}, {"records": []}),
    ("memory/timeline", {"where": {"session": ["s\x00"]}}, {"records": []}),
    ("memory/timeline", {"where": {"id": "a\x00", "content": "note\x00"}}, {"records": []}),
    ("memory/session/list", {"owner": "o\x00"}, {"sessions": []}),
]


@pytest.mark.parametrize("method, params, expected", NUL_READS)
async def test_a_selector_holding_nul_gets_the_same_empty_answer_on_every_tier(
        tiers: dict[str, Dispatcher], method: str, params: dict[str, Any], expected: Any) -> None:
    me = owner()
    for tier, d in tiers.items():
        await call(d, "memory/remember", {"owner": me, "records": [
            {"content": "a note", "key": "k", "session": "s", "metadata": {"m": "v"}}]})
        answer = await call(d, method, {"owner": me, **params})
        # -32003 only where the tier does not declare the method's capability (an `if` that passed on
        # any -32003 let a tier refuse a method it declares, and nothing was checked of it)
        declared = METHOD_CAPABILITY[method] in (await call(d, "memory/describe", {}))["capabilities"]
        assert answer == (expected if declared else {"error": -32003}), tier
        assert len((await call(d, "memory/timeline", {"owner": me}))["records"]) == 1, tier
    for tier, d in tiers.items():  # and describe for such an owner counts nothing, without an error
        described = await call(d, "memory/describe", {"owner": "o\x00"})
        assert described["tiers"][0]["count"] == 0, tier


@pytest.mark.parametrize("tier", ["episodic", "semantic"])
async def test_summarize_refuses_an_empty_key_and_writes_nothing(tiers: dict[str, Dispatcher], tier: str) -> None:
    d, me = tiers[tier], owner()
    await call(d, "memory/remember", {"owner": me, "records": [
        {"content": "Anna met Marco in Rome on 3 May 2023."}, {"content": "Marco booked a flight to Rome."}]})
    assert await call(d, "memory/summarize", {"owner": me, "query": "Rome", "key": ""}) == {"error": -32602}
    assert len((await call(d, "memory/timeline", {"owner": me}))["records"]) == 2
    keyed = await call(d, "memory/summarize", {"owner": me, "query": "Rome", "key": "summary/rome"})
    assert keyed["written"] == 1 and keyed["records"][0]["key"] == "summary/rome"


@pytest.mark.parametrize("tier", TIERS)
async def test_forget_by_query_deletes_only_records_holding_a_query_word(tiers: dict[str, Dispatcher], tier: str) -> None:
    """A recall may rank related records too (episodic lends a hit's score to its session
    neighbours); a forget by query deleted them as well: records without the word were lost."""
    d, me = tiers[tier], owner()
    turns = ["we talked about the green city", "the sofa arrives on Tuesday", "rocket launches grew louder",
             "nothing else was said", "the kettle whistled"]
    records = [{"content": text, "session": "s1", "created_at": f"2026-01-01T00:00:0{i}.000Z"}
               for i, text in enumerate(turns)]
    ids = (await call(d, "memory/remember", {"owner": me, "records": records}))["ids"]
    assert (await call(d, "memory/forget", {"owner": me, "query": "sofa"}))["forgotten"] == 1
    left = {r["id"] for r in (await call(d, "memory/timeline", {"owner": me, "limit": 0}))["records"]}
    assert left == set(ids) - {ids[1]}


@pytest.mark.parametrize("tier", TIERS)
async def test_forget_by_query_deletes_every_match_past_one_ranked_page(tiers: dict[str, Dispatcher], tier: str,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A forget by query reads the matches a ranked page at a time; it stopped after the first page
    (1,000 records) and said so in its count, leaving the rest."""
    monkeypatch.setattr("backends.surface.FORGET_BY_QUERY_LIMIT", 3)
    d, me = tiers[tier], owner()
    records = [{"content": f"the sofa note {i}" if i % 4 else f"a kettle note {i}"} for i in range(12)]
    await call(d, "memory/remember", {"owner": me, "records": records})
    assert (await call(d, "memory/forget", {"owner": me, "query": "sofa"}))["forgotten"] == 9
    left = [r["content"] for r in (await call(d, "memory/timeline", {"owner": me, "limit": 0}))["records"]]
    assert sorted(left) == sorted(f"a kettle note {i}" for i in range(0, 12, 4))


@pytest.mark.parametrize("tier", TIERS)
async def test_a_key_replaced_twice_in_one_batch_is_written_where_the_batch_last_writes_it(
        tiers: dict[str, Dispatcher], tier: str) -> None:
    # One stamp for the whole batch: creation order is the batch's order, as three calls would write it.
    # The replacement once kept the first write's place, so the conversation replayed out of order.
    d, me = tiers[tier], owner()
    ids = (await call(d, "memory/remember", {"owner": me, "records": [
        {"id": "a", "content": "first", "key": "k"}, {"id": "b", "content": "second"},
        {"id": "c", "content": "third", "key": "k"}]}))["ids"]
    assert ids == ["a", "b", "a"]
    timeline = (await call(d, "memory/timeline", {"owner": me}))["records"]
    assert [(r["id"], r["content"], r["revision"]) for r in timeline] == [("b", "second", 1), ("a", "third", 2)]


@pytest.mark.parametrize("tier", TIERS)
async def test_a_record_a_move_deletes_is_written_again_by_a_later_record_of_the_batch(
        tiers: dict[str, Dispatcher], tier: str) -> None:
    # "x" holds key k; a move (revision given) of "n" to k deletes "x"; the batch then writes "x" anew.
    # The write once answered "x" as an existing id and wrote nothing: an id answered, no record.
    d, me = tiers[tier], owner()
    await call(d, "memory/remember", {"owner": me, "records": [{"id": "x", "content": "old", "key": "k"}]})
    ids = (await call(d, "memory/remember", {"owner": me, "records": [
        {"id": "n", "content": "moved", "key": "k", "revision": 2}, {"id": "x", "content": "again"}]}))["ids"]
    assert ids == ["n", "x"]
    timeline = (await call(d, "memory/timeline", {"owner": me}))["records"]
    assert sorted((r["id"], r["content"], r["key"]) for r in timeline) == [("n", "moved", "k"), ("x", "again", None)]


@pytest.mark.parametrize("tier", TIERS)
async def test_a_recall_by_vector_alone_of_a_tier_that_never_searches_vectors_is_by_recency(
        tiers: dict[str, Dispatcher], tier: str) -> None:
    # As the router asks such a tier (decision 41: it passes no vector to a tier that does not search
    # by one), so the same recall gets the same records directly; it once answered nothing here.
    d, me = tiers[tier], owner()
    if (await call(d, "memory/describe", {}))["embeddings"]["searched"]:
        pytest.skip("this tier searches by vector")
    await call(d, "memory/remember", {"owner": me, "records": [
        {"content": "one", "embedding": [1.0, 0.0], "created_at": "2026-01-01T00:00:00.000Z"},
        {"content": "two", "created_at": "2026-01-01T00:00:01.000Z"}]})
    newest = await call(d, "memory/recall", {"owner": me, "touch": False})
    by_vector = await call(d, "memory/recall", {"owner": me, "touch": False, "embedding": [0.0, 1.0]})
    assert [r["content"] for r in by_vector["records"]] == [r["content"] for r in newest["records"]] == ["two", "one"]
    assert await call(d, "memory/recall", {"owner": me, "embedding": [1.0]}) == {"error": -32008}


@pytest.mark.parametrize("tier", TIERS)
async def test_a_negative_zero_in_metadata_reads_back_as_zero_on_every_tier(tiers: dict[str, Dispatcher],
                                                                            tier: str) -> None:
    """jsonb has no -0.0, so episodic read it back as 0.0 while the other tiers kept the sign: a
    spill or a backup restored into episodic changed the value. Every tier now stores 0.0."""
    import math

    d, me = tiers[tier], owner()
    await call(d, "memory/remember", {"owner": me, "records": [
        {"content": "signed zero", "metadata": {"z": -0.0, "n": {"x": [-0.0, {"y": -0.0}]}, "one": -1.0}}]})
    (stored,) = (await call(d, "memory/timeline", {"owner": me}))["records"]
    meta = stored["metadata"]
    zeros = [meta["z"], meta["n"]["x"][0], meta["n"]["x"][1]["y"]]
    assert zeros == [0.0] * 3 and all(type(z) is float and math.copysign(1.0, z) == 1.0 for z in zeros), meta
    assert meta["one"] == -1.0
    assert len((await call(d, "memory/timeline", {"owner": me, "where": {"z": -0.0}}))["records"]) == 1


async def _crowd(d: Dispatcher, me: str) -> list[dict[str, Any]]:
    """140 records, 130 of them in one millisecond, alternating between two sessions."""
    stamps = ["2026-03-01T00:00:00.000Z"] * 5 + ["2026-03-01T00:00:00.001Z"] * 130 + ["2026-03-01T00:00:00.002Z"] * 5
    records = [{"id": f"{me}-{i:03d}", "content": f"note {i}", "created_at": stamp, "session": f"s{i % 2}",
                "metadata": {"n": i % 3}, **({"key": f"k/{i:03d}"} if i % 4 == 0 else {})}
               for i, stamp in enumerate(stamps)]
    for start in range(0, len(records), 70):
        await call(d, "memory/remember", {"owner": me, "records": records[start:start + 70]})
    return records


@pytest.mark.parametrize("tier", TIERS)
async def test_a_cursor_pages_a_crowded_millisecond_exactly(tiers: dict[str, Dispatcher], tier: str) -> None:
    d, me = tiers[tier], owner()
    records = await _crowd(d, me)
    ids = [r["id"] for r in records]
    for scope, want in (({}, ids), ({"where": {"session": "s1"}}, ids[1::2]),
                        ({"after": "2026-03-01T00:00:00.000Z"}, ids[5:]),
                        ({"before": "2026-03-01T00:00:00.002Z", "where": {"session": "s0"}}, ids[:135:2]),
                        ({"where": {"n": 0}}, ids[::3]), ({"key_prefix": "k/"}, ids[::4]),
                        ({"where": {"id": ids[::5][::-1]}}, ids[::5])):
        pages, cursor = [], True
        while cursor is not None:
            answer = await call(d, "memory/timeline", {"owner": me, **scope, "limit": 40, "cursor": cursor})
            pages[:0] = [r["id"] for r in answer["records"]]
            assert len(answer["records"]) == 40 or answer["cursor"] is None, scope
            cursor = answer["cursor"]
        assert pages == want, scope
    # A cursor with a narrower scope than the one that made it: the scope still bounds the page.
    late = (await call(d, "memory/timeline", {"owner": me, "limit": 3, "cursor": True}))["cursor"]
    early = await call(d, "memory/timeline", {"owner": me, "limit": 50, "cursor": late,
                                               "before": "2026-03-01T00:00:00.001Z", "where": {"session": "s0"}})
    assert [r["id"] for r in early["records"]] == ids[:5:2] and early["cursor"] is None
    # The plain timeline is unchanged: no cursor unless asked for.
    assert "cursor" not in await call(d, "memory/timeline", {"owner": me, "limit": 3})


@pytest.mark.parametrize("tier", TIERS)
async def test_a_cursor_still_holds_when_what_it_passed_is_forgotten(tiers: dict[str, Dispatcher], tier: str) -> None:
    """A scan may move each page out before it asks for the next (the router's spill): the cursor
    is a position, not a record, so the walk neither skips nor repeats one."""
    d, me = tiers[tier], owner()
    ids = [r["id"] for r in await _crowd(d, me)]
    read: list[str] = []
    cursor: Any = True
    while cursor is not None:
        answer = await call(d, "memory/timeline", {"owner": me, "limit": 25, "cursor": cursor})
        page = [r["id"] for r in answer["records"]]
        read[:0] = page
        assert (await call(d, "memory/forget", {"owner": me, "ids": page}))["forgotten"] == len(page)
        cursor = answer["cursor"]
    assert read == ids
    assert (await call(d, "memory/timeline", {"owner": me}))["records"] == []


@pytest.mark.parametrize("cursor", [False, 5, "", "x", "2026-03-01T00:00:00.001Z", "2026-03-01T00:00:00.001Z|",
                                    "2026-03-01T00:00:00.001Z|-1", "2026-03-01T00:00:00.001Z|1e3",
                                    "2026-03-01T00:00:00.001+00:00|3|a", "2026-03-01T00:00:00.001Z|" + "9" * 19 + "|a",
                                    "2026-03-01T00:00:00.001Z|3", "2026-03-01T00:00:00.001Z|3|",
                                    "2026-03-01T00:00:00.001Z|3|a\x00"])
async def test_a_cursor_no_timeline_made_is_refused_on_every_tier(tiers: dict[str, Dispatcher], cursor: Any) -> None:
    """Each malformed position is refused as it is and behind the tier's own tag, so it is the
    position that is refused there, not the tag."""
    for tier, d in tiers.items():
        for asked in [cursor] + ([f"{d.service._cursor_tag}|{cursor}"] if isinstance(cursor, str) else []):
            assert await call(d, "memory/timeline", {"owner": owner(), "cursor": asked}) == {"error": -32602}, tier


async def test_a_tiers_cursor_is_refused_by_every_other_tier(tiers: dict[str, Dispatcher]) -> None:
    """A working tier's position (its own sequence) means nothing to episodic: taken, it answered a
    page from a place no record of that tier holds, usually an empty one, as if the walk were done."""
    me = owner()
    made = {}
    for tier, d in tiers.items():
        await call(d, "memory/remember", {"owner": me, "records": [{"content": f"{tier} {i}"} for i in range(3)]})
        made[tier] = (await call(d, "memory/timeline", {"owner": me, "limit": 1, "cursor": True}))["cursor"]
        assert isinstance(made[tier], str), tier
    for tier, d in tiers.items():
        for other, cursor in made.items():
            answer = await call(d, "memory/timeline", {"owner": me, "limit": 1, "cursor": cursor})
            if other == tier:
                assert [r["content"] for r in answer["records"]] == [f"{tier} 1"], tier
            else:
                assert answer == {"error": -32602}, (tier, other)


async def test_a_cursor_passes_no_record_that_shares_its_sequence(tiers: dict[str, Dispatcher]) -> None:
    """Semantic replicas on one Qdrant server each count `seq` from their own clock, so two records
    of one millisecond can share it (a batch runs its count a millisecond ahead). Written here as a
    second replica would, by winding this one's count back: the id breaks the tie, and a walk reads
    each record once, in the order a timeline shows them."""
    d, me = tiers["semantic"], owner()
    store = d.service.store
    stamp = "2026-03-01T00:00:00.001Z"
    for batch in ("a", "b"):
        store._seq = 5_000_000_000_000_000  # both batches take the sequences after this one
        await call(d, "memory/remember", {"owner": me, "records": [
            {"id": f"{me}-{batch}{i:02d}", "content": f"fact {batch} {i}", "created_at": stamp} for i in range(30)]})
    shown = [r["id"] for r in (await call(d, "memory/timeline", {"owner": me, "limit": 100}))["records"]]
    assert len(shown) == 60
    for size in (1, 7, 30):
        read: list[str] = []
        cursor: Any = True
        while cursor is not None:
            answer = await call(d, "memory/timeline", {"owner": me, "limit": size, "cursor": cursor})
            read[:0] = [r["id"] for r in answer["records"]]
            cursor = answer["cursor"]
        assert read == shown, size


def test_a_cursor_is_as_long_whatever_the_count_of_writes_before_it() -> None:
    """A tier's position counts every owner's writes; written in as many digits as it had, a cursor
    the router seals for one owner grew with the others' writes (decision 167). Earlier cursors,
    written without leading zeros, still read back."""
    from backends.surface import cursor_param, make_cursor

    stamp = "2026-12-07T20:00:00.000Z"
    cursors = [make_cursor((stamp, seq, "r1"), "ab12") for seq in (1, 9, 10, 123_456, 10**17)]
    assert len({len(c) for c in cursors}) == 1
    for seq, cursor in zip((1, 9, 10, 123_456, 10**17), cursors):
        assert cursor_param({"cursor": cursor}, "ab12") == (stamp, seq, "r1")
    assert cursor_param({"cursor": f"ab12|{stamp}|42|r1"}, "ab12") == (stamp, 42, "r1")
