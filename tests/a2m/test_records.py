import pytest

from a2m.errors import A2MError
from a2m.records import Record, parse_write
from a2m.timefmt import normalize_ts, now, parse_ts


def test_now_is_canonical() -> None:
    value = now()
    assert len(value) == 24 and value.endswith("Z") and value[19] == "."


@pytest.mark.parametrize("given, canonical", [
    ("2026-07-28T10:15:30.123Z", "2026-07-28T10:15:30.123Z"),
    ("2026-07-28T10:15:30Z", "2026-07-28T10:15:30.000Z"),
    ("2026-07-28T12:15:30.123456+02:00", "2026-07-28T10:15:30.123Z"),
    ("2026-07-28t10:15:30.5z", "2026-07-28T10:15:30.500Z"),
])
def test_timestamps_normalise_to_utc_millis(given: str, canonical: str) -> None:
    assert normalize_ts(given) == canonical


@pytest.mark.parametrize("bad", [1690000000, "2026-07-28", "2026-07-28 10:15:30Z", "2026-07-28T10:15:30",
                                 "2026-13-01T00:00:00Z", None, "yesterday"])
def test_bad_timestamps_are_invalid_params(bad: object) -> None:
    with pytest.raises(A2MError) as err:
        parse_ts(bad)
    assert err.value.code == -32602


def test_parse_write_keeps_every_field_and_metadata_verbatim() -> None:
    raw = {"id": "r1", "content": "hello", "role": "user", "metadata": {"a": [1, {"b": None}]}, "group": "g",
           "salience": 0.9, "session": "s", "key": "k/1", "uri": "s3://x", "media_type": "text/plain",
           "embedding": [1, 2.5], "created_at": "2026-01-01T00:00:00Z", "access_count": 3,
           "accessed_at": "2026-01-02T00:00:00.000Z", "revision": 4, "unknown_field": "ignored"}
    record = parse_write(raw, 0, owner="alice")
    assert record.metadata == {"a": [1, {"b": None}]}
    assert (record.owner, record.created_at, record.access_count, record.revision) == (
        "alice", "2026-01-01T00:00:00.000Z", 3, 4)
    assert record.embedding == [1.0, 2.5]
    wire = record.to_wire()
    assert "embedding" not in wire and record.to_wire(embeddings=True)["embedding"] == [1.0, 2.5]
    assert Record.from_wire(record.to_dict()) == record


@pytest.mark.parametrize("raw, field", [
    ({"role": "user"}, "content"),
    ({"content": "x", "metadata": []}, "metadata"),
    ({"content": "x", "salience": 2}, "salience"),
    ({"content": "x", "salience": True}, "salience"),
    ({"content": "x", "access_count": -1}, "access_count"),
    ({"content": "x", "revision": 0}, "revision"),
    ({"content": "x", "created_at": 5}, None),
    ({"content": "x", "embedding": []}, "embedding"),
    ({"content": "x", "embedding": [1, "2"]}, "embedding"),
    ({"content": "x", "id": ""}, "id"),
    ({"content": "x", "key": ""}, "key"),
    ({"content": "x", "owner": "mallory"}, "owner"),
])
def test_parse_write_refuses_malformed_fields(raw: dict, field: str | None) -> None:
    with pytest.raises(A2MError) as err:
        parse_write(raw, 3, owner="alice")
    assert err.value.code == -32602
    if field:
        assert err.value.data["field"] == field and err.value.data["index"] == 3


def test_uri_only_record_may_have_no_content() -> None:
    assert parse_write({"uri": "https://example.org/a.pdf"}, 0, owner=None).content == ""
