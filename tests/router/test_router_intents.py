"""A batch written across tiers leaves an intent until it is answered (router/intents.py,
decision 166), on real tier servers.

While a spanning batch is written its intent stands in the default tier under the reserved owner;
an acknowledged batch leaves none. An intent left behind (a router killed mid-batch: forged here,
behind the router's back, as that router would have left it) is resolved by `memory/consolidate`
once older than `intent_grace`: a batch that landed whole is kept, one that did not has what
landed forgotten, at the revision written (a key replaced since by an acknowledged write stays);
a younger intent, or one whose records' tiers do not all answer, is left. The kill itself is
`test_router_crashkill.py`'s.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any, Iterator

import pytest

from a2m.client import HTTPClient
from a2m.errors import A2MError
from a2m.timefmt import format_ts
from router.config import ConfigError, parse
from router.intents import INTENTS, MARK, contents

from .stack import Stack, federation, new_owner, tier_call

pytestmark = pytest.mark.anyio

TIERS = [
    {"name": "working", "kind": "working", "timeout": 5.0},
    {"name": "episodic", "kind": "episodic", "timeout": 5.0},
    {"name": "semantic", "kind": "semantic", "timeout": 5.0},
]
NAMES = [t["name"] for t in TIERS]
GRACE = 30.0  # forged intents are an hour old, unless a test means one younger


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    top = {"router": {"intent_grace": GRACE, "background_promotion": False}}
    with federation(tmp_path_factory.mktemp("intents"), TIERS, mode="real", top=top) as running:
        yield running


async def call(stack: Stack, method: str, params: dict[str, Any]) -> dict[str, Any]:
    async with HTTPClient(stack.url, timeout=30.0) as client:
        return await client.call(method, params)


async def held(stack: Stack, tier: str, owner: str) -> list[dict[str, Any]]:
    return (await tier_call(stack, tier, "memory/timeline", {"limit": 0, "owner": owner}))["records"]


async def intents(stack: Stack, owner: str | None = None,
                  tiers: tuple[str, ...] = ("working",)) -> list[tuple[str, str, dict[str, Any]]]:
    """(tier, intent record id, content) of the intents in `tiers` (the default tier holds them, and
    a stopped tier cannot be read), of one batch owner's batches."""
    out = []
    for name in tiers:
        for record in await held(stack, name, INTENTS):
            body = json.loads(record["content"])
            if owner is None or body.get("owner") == owner:
                out.append((name, record["id"], body))
    return out


async def forge(stack: Stack, owner: str, records: list[tuple[str, str, int]], *, keys: dict[str, int] | None = None,
                age: float = 3600.0) -> str:
    """The intent a router killed mid-batch leaves in working: returns its record id."""
    stamp = format_ts(datetime.now(timezone.utc) - timedelta(seconds=age))
    [content] = contents(owner, records, keys or {}, 1_000_000, stamp)
    return (await tier_call(stack, "working", "memory/remember",
                            {"records": [{"content": content}], "owner": INTENTS}))["ids"][0]


async def put(stack: Stack, tier: str, owner: str, content: str, **fields: Any) -> str:
    """A record written to one tier directly (a part of a batch that landed before the kill)."""
    record = {"content": content, "id": f"r-{uuid.uuid4().hex[:12]}", **fields}
    return (await tier_call(stack, tier, "memory/remember", {"records": [record], "owner": owner}))["ids"][0]


async def consolidate(stack: Stack, owner: str) -> dict[str, Any]:
    return await call(stack, "memory/consolidate", {"owner": owner})


def contents_of(records: list[dict[str, Any]]) -> list[str]:
    return sorted(r["content"] for r in records)


async def test_a_spanning_batch_holds_an_intent_until_answered_and_an_acknowledged_one_leaves_none(
        stack: Stack) -> None:
    """Semantic stopped holds the batch between its parts: the intent stands in working (the default
    tier) naming both records, unseen by a caller's timeline; once answered, no intent is left."""
    owner = new_owner()
    batch = [{"content": "span one", "tier": "working"}, {"content": "span two", "tier": "semantic"}]
    stack.tiers["semantic"].pause()
    try:
        writing = asyncio.create_task(call(stack, "memory/remember", {"records": batch, "owner": owner}))
        deadline = time.monotonic() + 10
        while not (standing := await intents(stack, owner)):
            assert time.monotonic() < deadline and not writing.done(), "no intent while the batch was written"
            await asyncio.sleep(0.02)
        [(tier, _, body)] = standing
        assert tier == "working" and body[MARK] and len(body["records"]) == 2
        assert {r[0] for r in body["records"]} == {"working", "semantic"}
    finally:
        stack.tiers["semantic"].resume()
    ids = (await writing)["ids"]
    assert [r[1] for r in body["records"]] == ids
    assert await intents(stack, owner, tuple(NAMES)) == []
    single = await call(stack, "memory/remember", {"records": [{"content": "one tier", "tier": "episodic"}] * 2,
                                                    "owner": owner})
    assert len(single["ids"]) == 2 and await intents(stack, owner) == []


async def test_an_intent_whose_batch_landed_whole_is_resolved_by_keeping_the_batch(stack: Stack) -> None:
    owner = new_owner()
    one = await put(stack, "working", owner, "whole one")
    two = await put(stack, "semantic", owner, "whole two")
    await forge(stack, owner, [("working", one, 1), ("semantic", two, 1)])
    await consolidate(stack, owner)
    assert contents_of(await held(stack, "working", owner)) == ["whole one"]
    assert contents_of(await held(stack, "semantic", owner)) == ["whole two"]
    assert await intents(stack, owner) == []


async def test_an_intent_whose_batch_landed_in_part_is_resolved_by_forgetting_what_landed(stack: Stack) -> None:
    """The part in working landed and was then moved on to episodic (same id): found and forgotten
    there; the part for semantic never landed."""
    owner = new_owner()
    one = await put(stack, "episodic", owner, "half one")
    await forge(stack, owner, [("working", one, 1), ("semantic", f"r-{uuid.uuid4().hex[:12]}", 1)])
    answer = await consolidate(stack, owner)
    assert answer["repaired"] >= 1
    assert [await held(stack, name, owner) for name in NAMES] == [[], [], []]
    assert await intents(stack, owner) == []


async def test_an_intent_younger_than_the_grace_is_left_alone(stack: Stack) -> None:
    """Another replica's batch may still be in flight: neither its intent nor its records are touched."""
    owner = new_owner()
    one = await put(stack, "working", owner, "young one")
    intent = await forge(stack, owner, [("working", one, 1), ("semantic", f"r-{uuid.uuid4().hex[:12]}", 1)],
                         age=1.0)
    try:
        await consolidate(stack, owner)
        assert contents_of(await held(stack, "working", owner)) == ["young one"]
        assert [i[1] for i in await intents(stack, owner)] == [intent]
    finally:
        await tier_call(stack, "working", "memory/forget", {"ids": [intent], "owner": INTENTS})


async def test_a_record_of_a_half_batch_replaced_since_under_its_key_is_not_forgotten(stack: Stack) -> None:
    """The half batch wrote key `plan` at revision 1; an acknowledged write replaced it since
    (revision 2, same id): the resolution forgets at revision 1 only, so the acknowledged one stays."""
    owner = new_owner()
    one = await put(stack, "working", owner, "plan v1", key="plan")
    replaced = await call(stack, "memory/remember", {"records": [{"content": "plan v2", "key": "plan"}],
                                                      "owner": owner})
    assert replaced["ids"] == [one]
    other = await put(stack, "episodic", owner, "half other")
    await forge(stack, owner, [("working", one, 1), ("episodic", other, 1),
                               ("semantic", f"r-{uuid.uuid4().hex[:12]}", 1)])
    await consolidate(stack, owner)
    kept = await held(stack, "working", owner)
    assert [(r["id"], r["content"], r["revision"]) for r in kept] == [(one, "plan v2", 2)]
    assert await held(stack, "episodic", owner) == []
    assert await intents(stack, owner) == []


async def test_an_intent_whose_batch_replaced_a_key_that_never_landed_is_undone(stack: Stack) -> None:
    """The batch's new record landed, its key replacement (written last) did not: not whole."""
    owner = new_owner()
    await put(stack, "semantic", owner, "pet v1", key="pet")
    one = await put(stack, "working", owner, "with the pet")
    await forge(stack, owner, [("working", one, 1)], keys={"pet": 2})
    await consolidate(stack, owner)
    assert await held(stack, "working", owner) == []
    assert contents_of(await held(stack, "semantic", owner)) == ["pet v1"]
    assert await intents(stack, owner) == []


async def test_a_tier_down_during_resolution_leaves_the_intent_for_the_next(stack: Stack) -> None:
    owner = new_owner()
    one = await put(stack, "working", owner, "down one")
    intent = await forge(stack, owner, [("working", one, 1), ("semantic", f"r-{uuid.uuid4().hex[:12]}", 1)])
    stack.tiers["semantic"].pause()
    try:
        await consolidate(stack, owner)
        assert contents_of(await held(stack, "working", owner)) == ["down one"]
        assert [i[1] for i in await intents(stack, owner)] == [intent]
    finally:
        stack.tiers["semantic"].resume()
    deadline = time.monotonic() + 30
    while await intents(stack, owner):
        assert time.monotonic() < deadline, "the intent was never resolved once semantic was back"
        await consolidate(stack, owner)
        await asyncio.sleep(0.3)
    assert await held(stack, "working", owner) == []


async def test_a_batch_whose_intent_cannot_be_forgotten_is_not_answered_as_a_success(stack: Stack) -> None:
    """Working (holding the intent) stops once the batch's episodic part landed: the batch lands
    whole, yet its intent stands, so the caller is told -32603 (landed, not confirmed), never its ids."""
    owner = new_owner()
    await consolidate(stack, owner)  # every tier heard from: none is written first as one down (write_order)
    batch = [{"content": "unconfirmed one", "tier": "episodic"}, {"content": "unconfirmed two", "tier": "semantic"}]
    stack.tiers["semantic"].pause()
    paused = ["semantic"]
    try:
        writing = asyncio.create_task(call(stack, "memory/remember", {"records": batch, "owner": owner}))
        deadline = time.monotonic() + 10
        while not await held(stack, "episodic", owner):
            assert time.monotonic() < deadline and not writing.done(), "episodic's part never landed"
            await asyncio.sleep(0.02)
        standing = await intents(stack, owner)
        stack.tiers["working"].pause()
        paused.append("working")
        stack.tiers["semantic"].resume()
        paused.remove("semantic")
        with pytest.raises(A2MError) as caught:
            await writing
    finally:
        for name in paused:
            stack.tiers[name].resume()
    assert caught.value.code == -32603 and "not confirmed" in caught.value.message, caught.value
    assert [i[1] for i in await intents(stack, owner)] == [i[1] for i in standing]
    assert contents_of(await held(stack, "semantic", owner)) == ["unconfirmed two"]
    for unowned in (await call(stack, "memory/timeline", {"limit": 0}), await call(stack, "memory/describe", {})):
        assert MARK not in json.dumps(unowned)  # a caller's unowned partition is not the intents'
    await tier_call(stack, "working", "memory/forget", {"ids": [i[1] for i in standing], "owner": INTENTS})


async def test_no_caller_may_name_the_reserved_owner(stack: Stack) -> None:
    for method, params in (("memory/remember", {"records": [{"content": "forged"}]}),
                           ("memory/timeline", {}), ("memory/forget", {"ids": ["x"]}),
                           ("memory/consolidate", {})):
        with pytest.raises(A2MError) as caught:
            await call(stack, method, {**params, "owner": INTENTS})
        assert caught.value.code == -32005, (method, caught.value)
    # Named by the records alone, on a call that names no owner (a trusted transport's batch).
    with pytest.raises(A2MError) as caught:
        await call(stack, "memory/remember", {"records": [{"content": "forged", "owner": INTENTS}]})
    assert caught.value.code == -32005, caught.value
    assert "forged" not in contents_of(await held(stack, "working", INTENTS))


def test_a_token_for_the_reserved_owner_is_refused_at_load() -> None:
    token = "t" * 40
    with pytest.raises(ConfigError, match="reserved"):
        parse({"auth": {"tokens": {token: INTENTS}}})


async def test_a_batch_whose_intent_was_resolved_while_it_was_written_is_taken_back_and_refused(
        stack: Stack) -> None:
    """A batch held past the grace is taken for a dead router's by another replica, which forgets
    its intent and the part that had landed (done here behind the router's back, as that replica
    would). The router finds its intent gone once the last part lands: it takes the batch back and
    refuses it, never answering success for half a batch."""
    owner = new_owner()
    await consolidate(stack, owner)  # every tier heard from: none is written first as one down (write_order)
    batch = [{"content": "overtaken one", "tier": "working"}, {"content": "overtaken two", "tier": "semantic"}]
    stack.tiers["semantic"].pause()
    try:
        writing = asyncio.create_task(call(stack, "memory/remember", {"records": batch, "owner": owner}))
        deadline = time.monotonic() + 10
        while not (landed := await held(stack, "working", owner)):
            assert time.monotonic() < deadline and not writing.done(), "working's part never landed"
            await asyncio.sleep(0.02)
        [(_, intent, _)] = await intents(stack, owner)
        await tier_call(stack, "working", "memory/forget", {"ids": [landed[0]["id"]], "owner": owner})
        await tier_call(stack, "working", "memory/forget", {"ids": [intent], "owner": INTENTS})
    finally:
        stack.tiers["semantic"].resume()
    with pytest.raises(A2MError) as caught:
        await writing
    assert caught.value.code == -32603 and "taken back" in caught.value.message, caught.value
    assert [await held(stack, name, owner) for name in NAMES] == [[], [], []]


def test_an_intent_of_the_longest_ids_and_keys_fits_its_tier_in_parts_that_list_everything() -> None:
    """A batch of 1,000 records with 512-character ids, replacing 1,000 keys of 1,024 bytes, under
    an owner of 1,024 bytes: its intent is several records, each within the holding tier's
    `max_content_length`, which together list every record and key (packed by measured length:
    an estimate of 96 characters a record put every key in the first part, past the limit)."""
    owner = "é" * 512
    records = [("semantic" if i % 2 else "working", f"{i:04d}" + "i" * 508, 1) for i in range(1000)]
    keys = {f"{i:04d}" + "\u00e9" * 510: 2 for i in range(1000)}
    for max_len in (1_000_000, 60_000):
        parts = [json.loads(c) for c in contents(owner, records, keys, max_len)]
        assert all(len(c) <= max_len for c in contents(owner, records, keys, max_len))
        assert len(parts) > 1 and {p["parts"] for p in parts} == {len(parts)} and len({p[MARK] for p in parts}) == 1
        assert [tuple(r) for p in parts for r in p["records"]] == records
        assert {k: v for p in parts for k, v in p["keys"].items()} == keys
