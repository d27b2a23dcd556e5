import math

import pytest

from a2m.errors import A2MError
from a2m.records import MAX_DIMENSIONS, MAX_NAME_BYTES, Record, parse_write, validate_embedding
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


@pytest.mark.parametrize("bad", ["2026-02-30T00:00:00.000Z", "2026-13-01T00:00:00.000Z", "2026-01-01T24:00:00.000Z",
                                 "0000-01-01T00:00:00.000Z", "2026-01-01T00:00:00,000Z", "2026-01-01T00:00:00.0a0Z",
                                 "\uff12026-01-01T00:00:00.000Z", "2026-01-01T00:00:00.000z0"])
def test_canonical_looking_stamps_are_still_checked(bad: str) -> None:
    """normalize_ts passes a canonical stamp through without re-printing it: only real dates."""
    with pytest.raises(A2MError) as err:
        normalize_ts(bad)
    assert err.value.code == -32602


def test_parse_write_keeps_every_field_and_metadata_verbatim() -> None:
    raw = {"id": "r1", "content": "hello", "role": "user", "metadata": {"a": [1, {"b": None}]}, "group": "g",
           "salience": 0.9, "session": "s", "key": "k/1", "uri": "s3://x", "media_type": "text/plain",
           "embedding": [1, 2.5], "created_at": "2026-01-01T00:00:00Z", "access_count": 3,
           "accessed_at": "2026-01-02T00:00:00.000Z", "revision": 4, "unknown_field": "ignored"}
    record = parse_write(raw, 0, owner="alice")
    assert record.metadata == {"a": [1, {"b": None}]}
    # each field read from the write (the round trip below holds of a field dropped to None as well)
    assert (record.id, record.content, record.role, record.group, record.salience, record.session, record.key,
            record.uri, record.media_type, record.accessed_at) == (
        "r1", "hello", "user", "g", 0.9, "s", "k/1", "s3://x", "text/plain", "2026-01-02T00:00:00.000Z")
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
    ({"content": "x", "session": ""}, "session"),
    ({"content": "x", "group": ""}, "group"),
])
def test_parse_write_refuses_malformed_fields(raw: dict, field: str | None) -> None:
    with pytest.raises(A2MError) as err:
        parse_write(raw, 3, owner="alice")
    assert err.value.code == -32602
    if field:
        assert err.value.data["field"] == field and err.value.data["index"] == 3


def test_a_record_naming_another_owner_than_the_call_is_scope_denied() -> None:
    with pytest.raises(A2MError) as err:
        parse_write({"content": "x", "owner": "mallory"}, 3, owner="alice")
    assert err.value.code == -32005 and err.value.data == {"field": "owner", "index": 3}


def test_uri_only_record_may_have_no_content() -> None:
    assert parse_write({"uri": "https://example.org/a.pdf"}, 0, owner=None).content == ""


# ---- what every tier can store: one set of limits, checked once (parse_write) ----------------------

def nested(levels: int, leaf: object = 0) -> object:
    """A JSON value `levels` containers deep (objects and arrays in turn) around `leaf`."""
    value = leaf
    for i in range(levels):
        value = [value] if i % 2 else {"x": value}
    return value


def refused(raw: dict, owner: str | None = None) -> A2MError:
    with pytest.raises(A2MError) as err:
        parse_write(raw, 2, owner=owner)
    assert err.value.code == -32602
    assert err.value.data["index"] == 2
    return err.value


@pytest.mark.parametrize("field", ["content", "id", "role", "group", "session", "key", "uri", "media_type",
                                   "owner", "tier"])
def test_nul_in_any_text_field_is_refused(field: str) -> None:
    assert refused({"content": "x", field: "a\x00b"}).data["field"] == field
    parse_write({"content": "x", field: "a\\u0000b"}, 0, owner=None)  # the six characters are fine


@pytest.mark.parametrize("metadata", [
    {"k\x00": 1}, {"k": "v\x00"}, {"k": ["a", "b\x00"]}, {"k": {"inner\x00": None}},
    {"k": [{"deep": [[{"x": "\x00"}]]}]}, {"ok": 1, "k": {"a": [1, 2, {"b": "c\x00d"}]}},
])
def test_nul_anywhere_in_metadata_is_refused(metadata: dict) -> None:
    assert refused({"content": "x", "metadata": metadata}).data["field"] == "metadata"


@pytest.mark.parametrize("field", ["key", "session", "group"])
def test_a_key_session_or_group_past_the_b_tree_budget_is_refused(field: str) -> None:
    """PostgreSQL cannot index a longer key or session: a record written to working with one was
    accepted and then could never spill (nor close its session) into episodic."""
    parse_write({"content": "x", field: "k" * MAX_NAME_BYTES}, 0, owner=None)
    parse_write({"content": "x", field: "\U0001f600" * (MAX_NAME_BYTES // 4)}, 0, owner=None)
    assert refused({"content": "x", field: "k" * (MAX_NAME_BYTES + 1)}).data == {
        "field": field, "index": 2, "max": MAX_NAME_BYTES}
    assert refused({"content": "x", field: "\u00e9" * (MAX_NAME_BYTES // 2 + 1)}).data["field"] == field
    assert refused({"content": "x", field: "s" * 3_000_000}).data["field"] == field


def test_the_requests_owner_with_nul_is_refused_as_the_records() -> None:
    assert refused({"content": "x"}, owner="al\x00ice").data["field"] == "owner"


def test_metadata_up_to_32_levels_is_kept_and_deeper_is_refused() -> None:
    for levels in (31, 32):  # the metadata object is the first level
        deepest = {"d": nested(levels - 1, "leaf"), "flat": 1}
        assert parse_write({"content": "x", "metadata": deepest}, 0, owner=None).metadata == deepest
    for too_deep in ({"d": nested(32)}, {"d": nested(32, {})}, {"a": [1, {"b": nested(31)}]}, {"d": nested(5000)}):
        error = refused({"content": "x", "metadata": too_deep})
        assert error.data["field"] == "metadata" and error.data["max"] == 32


def test_metadata_keys_must_be_strings_in_process() -> None:
    assert refused({"content": "x", "metadata": {1: "a"}}).data["field"] == "metadata"
    assert refused({"content": "x", "metadata": {"a": {2: "b"}}}).data["field"] == "metadata"


@pytest.mark.parametrize("field, least", [("access_count", 0), ("revision", 1)])
def test_counters_stop_at_the_largest_safe_json_integer(field: str, least: int) -> None:
    top = 2**53 - 1
    assert getattr(parse_write({"content": "x", field: top}, 0, owner=None), field) == top
    assert getattr(parse_write({"content": "x", field: least}, 0, owner=None), field) == least
    for value in (2**53, 2**63, 2**64 - 1, 2**64):
        assert refused({"content": "x", field: value}).data == {"field": field, "index": 2, "max": top}


@pytest.mark.parametrize("vector", [[1e300], [0.5, -3.5e38], [3.5e38], [2.0**128 - 2.0**103], [10**400],
                                    [0.1] * 383 + [1e39], [1, 2, -(10**39)]])
def test_embedding_values_beyond_float32_are_refused(vector: list) -> None:
    assert refused({"content": "x", "embedding": vector}).data["field"] == "embedding"
    with pytest.raises(A2MError) as err:
        validate_embedding(vector)
    assert err.value.code == -32602


def test_embedding_values_that_round_to_float32s_largest_are_kept() -> None:
    flt_max = 3.4028234663852886e38
    # 3.4028235e38 is how pgvector prints FLT_MAX back: a record read from episodic must move anywhere
    for vector in ([flt_max, -flt_max, 1.0], [3.4028235e38], [2.0**128 - 2.0**103 * 1.5], [1e38] * 64,
                   [3, -(10**38)]):
        assert validate_embedding(vector) == [float(x) for x in vector]


def test_a_records_vector_wider_than_pgvector_stores_is_refused_and_a_query_vector_is_not() -> None:
    # Redis and Qdrant take wider vectors: such a record written to working could never spill to episodic
    widest = parse_write({"content": "x", "embedding": [0.5] * MAX_DIMENSIONS}, 0, owner="alice")
    assert len(widest.embedding or []) == MAX_DIMENSIONS
    with pytest.raises(A2MError) as refused:
        parse_write({"content": "x", "embedding": [0.5] * (MAX_DIMENSIONS + 1)}, 3, owner="alice")
    assert refused.value.code == -32602 and refused.value.data == {"field": "embedding", "index": 3}
    assert "16000" in refused.value.message
    assert len(validate_embedding([0.5] * (MAX_DIMENSIONS + 1))) == MAX_DIMENSIONS + 1  # a query: -32008 at the tier


@pytest.mark.parametrize("stamp", ["9999-12-31T23:30:00-01:00", "0001-01-01T00:30:00+01:00",
                                   "9999-12-31T23:59:59.9999-00:01"])
def test_timestamps_outside_utc_years_1_to_9999_are_invalid_params(stamp: str) -> None:
    with pytest.raises(A2MError) as err:
        normalize_ts(stamp, "after")
    assert err.value.code == -32602 and err.value.data == {"field": "after"}
    for field in ("created_at", "accessed_at"):
        with pytest.raises(A2MError) as err:
            parse_write({"content": "x", field: stamp}, 0, owner=None)
        assert err.value.code == -32602 and err.value.data == {"field": f"records[0].{field}"}


def test_the_first_and_last_utc_milliseconds_are_timestamps() -> None:
    assert normalize_ts("0001-01-01T00:00:00Z") == "0001-01-01T00:00:00.000Z"
    assert normalize_ts("9999-12-31T23:59:59.999Z") == "9999-12-31T23:59:59.999Z"
    assert normalize_ts("0001-01-01T00:30:00+00:30") == "0001-01-01T00:00:00.000Z"


def test_a_negative_zero_is_written_as_zero_without_touching_the_callers_objects() -> None:
    sent = {"content": "x", "metadata": {"z": -0.0, "n": {"x": [-0.0, 1.5, {"y": -0.0}]}, "k": "v"}}
    record = parse_write(sent, 0, owner=None)
    assert record.metadata == {"z": 0.0, "n": {"x": [0.0, 1.5, {"y": 0.0}]}, "k": "v"}
    assert math.copysign(1.0, record.metadata["n"]["x"][2]["y"]) == 1.0
    assert math.copysign(1.0, sent["metadata"]["n"]["x"][2]["y"]) == -1.0  # the request is as it was sent
    plain = {"content": "x", "metadata": {"z": 0.0, "n": [1]}}
    assert parse_write(plain, 0, owner=None).metadata is plain["metadata"]  # nothing to change: no copy


@pytest.mark.parametrize("given, canonical", [
    ("2016-12-31T23:59:60Z", "2016-12-31T23:59:59.999Z"),
    ("2016-12-31T23:59:60.5Z", "2016-12-31T23:59:59.999Z"),
    ("2017-01-01T05:29:60.25+05:30", "2016-12-31T23:59:59.999Z"),
    ("2015-06-30t23:59:60z", "2015-06-30T23:59:59.999Z"),
    ("9999-12-31T23:59:60.999Z", "9999-12-31T23:59:59.999Z"),
])
def test_a_leap_second_is_a_timestamp_in_the_last_millisecond_of_its_minute(given: str, canonical: str) -> None:
    """RFC 3339 §5.6 allows second 60; datetime has no such second, so it was refused as -32602. It is kept
    as the minute's last millisecond: never earlier than a stamp before it, never past the next minute."""
    assert normalize_ts(given) == canonical
    assert parse_write({"content": "x", "created_at": given}, 0, owner=None).created_at == canonical


@pytest.mark.parametrize("bad", ["2016-12-31T23:59:61Z", "2016-12-31T23:60:60Z", "2016-12-31T24:59:60Z"])
def test_only_second_60_is_a_leap_second(bad: str) -> None:
    with pytest.raises(A2MError) as err:
        normalize_ts(bad)
    assert err.value.code == -32602
