"""A write the router must refuse leaves every tier as it was: not written and then taken back,
which a reader (or a tier's own event log) sees, and which a failed take-back leaves written.

Run on the real tier servers (Redis, Qdrant Edge), one of them killed."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest

from a2m.client import HTTPClient
from a2m.errors import A2MError
from router.writes import write_order

from .stack import Stack, federation, new_owner, tier_call

pytestmark = pytest.mark.anyio

TIERS = [
    {"name": "working", "kind": "working", "capacity": 100, "spill_to": "archive", "timeout": 5.0},
    {"name": "archive", "kind": "semantic", "timeout": 5.0},
]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with federation(tmp_path_factory.mktemp("bad-input"), TIERS, mode="real") as running:
        yield running


async def code(url: str, method: str, params: dict[str, Any]) -> int | None:
    """The error code `url` answers `params` with; None for an answer."""
    async with HTTPClient(url, timeout=30) as client:
        try:
            await client.call(method, params)
        except A2MError as exc:
            return exc.code
    return None


@pytest.mark.parametrize(("method", "params"), [
    ("memory/recall", {"tier": "nope"}),
    ("memory/timeline", {"tier": "nope"}),
    ("memory/forget", {"tier": "nope", "ids": ["x"]}),
    ("memory/summarize", {"tier": "nope", "ids": ["x"]}),
    ("memory/summarize", {"into": "nope", "ids": ["x"]}),
])
async def test_an_unknown_tier_beside_a_bad_owner_is_answered_as_a_tier_answers_it(
        stack: Stack, method: str, params: dict[str, Any]) -> None:
    """Two faults, one answer: a tier server checks `tier` (and `into`) before the owner, so the
    router does too (-32002; it answered -32602 about the owner). With tokens, the same order makes
    a caller naming another owner and no such tier hear -32002 from both, not -32005 from one."""
    params = {**params, "owner": 5}
    assert await code(stack.tiers["archive"].url, method, params) == -32002
    assert await code(stack.url, method, params) == -32002


async def test_a_batch_with_a_part_for_a_tier_known_down_writes_no_other_tier(tmp_path: Path) -> None:
    """A batch whose records go to two tiers, one of them down: the router asks the down one first,
    so its refusal leaves nothing to take back. Before, working was written first and its record
    forgotten again after the archive's part failed: working's own log told both (a `written` and a
    `forgotten` event for a call answered -32603), and a reader in between recalled the record."""
    with federation(tmp_path, TIERS, mode="real") as stack:
        me = new_owner()
        stack.tiers["archive"].kill()
        async with HTTPClient(stack.url, timeout=30) as router:
            # The router learns the archive is down as any read finds out: it leaves it out.
            assert (await router.call("memory/recall", {"owner": me}))["degraded"] == ["archive"]
            head = (await tier_call(stack, "working", "memory/events", {"owner": me}))["cursor"]
            with pytest.raises(A2MError) as refused:
                await router.call("memory/remember", {"owner": me, "records": [
                    {"content": "a note of the conversation", "session": "s1"},
                    {"content": "a fact for the archive", "tier": "archive"}]})
            assert refused.value.code == -32603 and refused.value.data == {"tier": "archive"}, refused.value
            told = await tier_call(stack, "working", "memory/events", {"owner": me, "cursor": head})
            assert told["events"] == [], told
            assert (await tier_call(stack, "working", "memory/timeline", {"owner": me}))["records"] == []


def test_a_tier_known_down_is_written_first_within_the_replacements_last_order() -> None:
    assert write_order({"working": [0], "archive": [1]}, {}, down=["archive"]) == [("archive", [1]), ("working", [0])]
    # A replacement cannot be taken back: it still goes last, a down tier's first among them.
    replacing_down = write_order({"working": [0], "archive": [1]}, {1: 2}, down=["archive"])
    assert replacing_down == [("working", [0]), ("archive", [1])]
    assert write_order({"working": [0, 2], "episodic": [1, 3]}, {0: 2, 3: 5}, down=["episodic"]) == [
        ("episodic", [1]), ("working", [2]), ("episodic", [3]), ("working", [0])]
