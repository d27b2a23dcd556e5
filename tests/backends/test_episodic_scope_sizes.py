"""The episodic tier's memory of scope sizes: it may be stale for seconds, never for another scope."""

from __future__ import annotations

import pytest
from psycopg.types.json import Jsonb

from backends.episodic import scope_sizes
from backends.episodic.scope_sizes import ScopeSizes


def test_a_size_is_remembered_until_it_expires(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [100.0]
    monkeypatch.setattr(scope_sizes.time, "monotonic", lambda: clock[0])
    sizes = ScopeSizes(ttl=10.0)
    key = sizes.key("owner = %s", ["alice"])
    sizes.put(key, 42)
    clock[0] += 9.9
    assert sizes.get(key) == 42
    clock[0] += 0.2
    assert sizes.get(key) is None


def test_scopes_differing_only_in_a_parameter_or_a_json_value_are_apart() -> None:
    sizes = ScopeSizes()
    sizes.put(sizes.key("owner = %s", ["alice"]), 1)
    sizes.put(sizes.key("metadata @> %s", [Jsonb({"topic": "a"})]), 2)
    assert sizes.get(sizes.key("owner = %s", ["bob"])) is None
    assert sizes.get(sizes.key("metadata @> %s", [Jsonb({"topic": "b"})])) is None
    assert sizes.get(sizes.key("metadata @> %s", [Jsonb({"topic": "a"})])) == 2


def test_the_least_recently_used_scope_goes_first_and_clear_forgets_all() -> None:
    sizes = ScopeSizes(size=2)
    a, b, c = (sizes.key("owner = %s", [name]) for name in "abc")
    sizes.put(a, 1)
    sizes.put(b, 2)
    assert sizes.get(a) == 1  # a is now the most recent
    sizes.put(c, 3)
    assert (sizes.get(a), sizes.get(b), sizes.get(c)) == (1, None, 3)
    sizes.clear()
    assert sizes.get(a) is None and sizes.get(c) is None


def test_a_scope_named_by_a_large_filter_is_not_held() -> None:
    # A `where` of thousands of values made each of MAX_SCOPES entries as large as a request.
    sizes = ScopeSizes()
    large = sizes.key("session = ANY(%s)", [[f"session-{i}" for i in range(1000)]])
    assert len(large) > scope_sizes.MAX_KEY
    sizes.put(large, 7)
    assert sizes.get(large) is None and not sizes._entries
    sizes.put(sizes.key("owner = %s", ["alice"]), 1)
    assert len(sizes._entries) == 1
