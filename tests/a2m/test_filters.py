from a2m.filters import Scope


def test_named_ids_come_from_ids_or_where_id() -> None:
    assert Scope(ids=["a"], where={"id": "b"}).named_ids() == ["a"]  # both apply; `ids` is read, where.id filters
    assert Scope(where={"id": "b"}).named_ids() == ["b"]
    assert Scope(where={"id": ["b", "c"], "session": "s"}).named_ids() == ["b", "c"]
    assert Scope(where={"id": []}).named_ids() == []
    for where in ({}, {"session": "s"}, {"id": None}, {"id": 3}, {"id": ["b", 3]}):
        assert Scope(where=where).named_ids() is None  # not ids: the store filters as before
