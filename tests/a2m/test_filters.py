from a2m.filters import Scope


def test_named_ids_come_from_ids_or_where_id() -> None:
    assert Scope(ids=["a"], where={"id": "b"}).named_ids() == ["a"]  # both apply; `ids` is read, where.id filters
    assert Scope(where={"id": "b"}).named_ids() == ["b"]
    assert Scope(where={"id": ["b", "c"], "session": "s"}).named_ids() == ["b", "c"]
    assert Scope(where={"id": []}).named_ids() == []
    for where in ({}, {"session": "s"}, {"id": None}, {"id": 3}, {"id": ["b", 3]}):
        assert Scope(where=where).named_ids() is None  # not ids: the store filters as before


def test_owner_and_content_are_record_fields_not_metadata_keys() -> None:
    from a2m.filters import matches
    from a2m.records import Record

    record = Record(id="r", content="hello", created_at="2026-01-01T00:00:00.000Z", owner="alice",
                    metadata={"owner": "meta", "content": "meta text"})
    scope = Scope(owner="alice")
    assert matches(record, Scope(owner="alice", where={"content": "hello", "owner": "alice"}))
    assert matches(record, Scope(owner="alice", where={"content": ["x", "hello"], "owner": ["bob", "alice"]}))
    for where in ({"content": "meta text"}, {"owner": "meta"}, {"owner": None}, {"owner": "bob"}):
        assert not matches(record, Scope(owner=scope.owner, where=where)), where
    assert not matches(record, Scope(owner="bob", where={"owner": "alice"}))  # never wider than the partition


def test_settle_field_answers_a_field_every_record_shares() -> None:
    from a2m.filters import MATCH_NOTHING, settle_field

    scope = Scope(owner="o", where={"tier": "working", "m": 1}, key_prefix="k/")
    assert settle_field(scope, "tier", "working") == Scope(owner="o", where={"m": 1}, key_prefix="k/")
    assert settle_field(scope, "tier", "episodic").where == MATCH_NOTHING
    assert settle_field(Scope(where={"tier": ["x", "working"]}), "tier", "working").where == {}
    assert settle_field(Scope(where={"tier": None}), "tier", "working").where == MATCH_NOTHING
    assert settle_field(Scope(where={"m": 1}), "tier", "working").where == {"m": 1}
    assert Scope(where=dict(MATCH_NOTHING)).named_ids() == []  # every engine reads no record for it


def test_a_where_of_more_than_max_where_keys_fields_is_refused_before_any_engine_sees_it() -> None:
    """10,000 fields held an episodic connection for PostgreSQL's whole statement timeout (30 s)."""
    import pytest

    from a2m.errors import A2MError
    from a2m.filters import MAX_WHERE_KEYS, parse_scope

    wide = {f"k{i}": "v" for i in range(MAX_WHERE_KEYS)}
    assert parse_scope({"where": wide}, "alice").where == wide
    for n in (MAX_WHERE_KEYS + 1, 10_000):
        with pytest.raises(A2MError) as err:
            parse_scope({"where": {f"k{i}": "v" for i in range(n)}}, "alice")
        assert err.value.code == -32602 and err.value.data == {"field": "where", "max": MAX_WHERE_KEYS}


def test_a_query_is_cut_after_max_query_words_words() -> None:
    from a2m.params import MAX_QUERY_WORDS, query_param

    short = " ".join(f"w{i}" for i in range(MAX_QUERY_WORDS))
    assert query_param({"query": short}) == short and query_param({}) is None
    assert query_param({"query": short + ", and more words"}) == short
    assert query_param({"query": "zebra " * 200_000}) == ("zebra " * MAX_QUERY_WORDS).rstrip()
    assert query_param({"query": "!" * 100_000}) == "!" * 100_000  # no words: nothing to cut


def test_any_of_values_over_metadata_keys_are_bounded_and_record_fields_are_not() -> None:
    """40,000 metadata values were 80,000 PostgreSQL parameters: the recall failed -32603 ("unavailable")."""
    import pytest

    from a2m.errors import A2MError
    from a2m.filters import MAX_WHERE_VALUES, parse_scope

    half = [f"v{i}" for i in range(MAX_WHERE_VALUES // 2)]
    parse_scope({"where": {"a": half, "b": half}}, None)
    parse_scope({"where": {"id": half * 4, "group": half * 4}}, None)  # the router's own look-ups
    with pytest.raises(A2MError) as err:
        parse_scope({"where": {"a": half, "b": [*half, "one more"]}}, None)
    assert err.value.code == -32602 and err.value.data == {"field": "where", "max": MAX_WHERE_VALUES}
