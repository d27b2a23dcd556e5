"""A router declares every capability, and a tier behind it may declare fewer (a tier server of
another implementation): what the router accepts must still be what it can honour there."""

from __future__ import annotations

import asyncio
import json
import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator

import pytest

from a2m.client import HTTPClient
from a2m.dispatch import Context, Dispatcher
from a2m.errors import A2MError
from router.config import RouterConfig, TierConfig
from router.intents import INTENTS, MARK
from router.server import Router
from tests.support.memstore import CAPABILITIES
from tests.support.scripted import ScriptedTier

from .stack import federation, new_owner, tier_call

pytestmark = pytest.mark.anyio

TIERS = [
    {"name": "plain", "kind": "episodic", "serve": "fixture", "args": ["--capabilities", "tiers"]},
    {"name": "keyed", "kind": "semantic", "serve": "fixture"},
]


async def test_a_key_bound_for_a_tier_without_keys_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    """The router declares `keys`, so a keyed write must be fetchable and replaced when written
    again (§3). Sent to a tier that does not declare keys, the key was accepted, then `memory/fetch`
    (which asks only tiers with keys) answered null and a second write made a second record. It is
    refused with -32602 naming the tier, before any tier is written; the same key aimed at a tier
    with keys is written and fetched."""
    me = new_owner()
    with federation(tmp_path, TIERS, top={"default_tier": "plain"}) as stack:
        async with HTTPClient(stack.url) as router:
            for params in ({"records": [{"content": "ok"}, {"content": "city is Rome", "key": "user/city"}]},
                           {"records": [{"content": "city is Rome", "key": "user/city", "tier": "plain"}]}):
                with pytest.raises(A2MError) as refused:
                    await router.call("memory/remember", {"owner": me, **params})
                assert refused.value.code == -32602 and "plain" in refused.value.message, refused.value
            for tier in ("plain", "keyed"):
                assert (await tier_call(stack, tier, "memory/timeline", {"owner": me, "limit": 0}))["records"] == []
            ids = (await router.call("memory/remember", {"owner": me, "records": [
                {"content": "city is Rome", "key": "user/city", "tier": "keyed"}]}))["ids"]
            fetched = (await router.call("memory/fetch", {"owner": me, "key": "user/city"}))["record"]
            assert fetched is not None and fetched["id"] == ids[0]
            # Its key lives in `keyed` now: written again without a tier, it is replaced there.
            again = (await router.call("memory/remember", {"owner": me, "records": [
                {"content": "city is Milan", "key": "user/city"}]}))["ids"]
            assert again == ids


# Every capability but one: a tier server of another implementation that does not do sessions.
SESSIONLESS = ["--capabilities", "tiers,salience,scopes,keys,embeddings,external,events"]


async def held(stack: Any, tier: str, owner: str | None = None) -> list[dict[str, Any]]:
    """The records a tier server holds (for `owner`), asked behind the router's back."""
    params: dict[str, Any] = {"limit": 0} if owner is None else {"owner": owner, "limit": 0}
    return (await tier_call(stack, tier, "memory/timeline", params))["records"]


async def test_a_field_bound_for_a_tier_without_its_capability_is_refused_and_nothing_is_written(
        tmp_path: Path) -> None:
    """The router declares every capability (§2), a tier that does not ignores that capability's
    fields (§4): a session there was never listed or closed, an owner's record was open to every
    owner, a salience, vector or uri was gone, all under a success. Each is refused with -32602
    naming the record, the field and the tier, before any tier is written (the first record of each
    batch goes to a tier that would keep it); the same record without the field is written."""
    with federation(tmp_path, TIERS, top={"default_tier": "plain"}) as stack:
        async with HTTPClient(stack.url) as router:
            for field, value in (("session", "s1"), ("salience", 0.9), ("access_count", 2),
                                 ("embedding", [0.1, 0.2, 0.3]), ("uri", "s3://bucket/doc.pdf"),
                                 ("media_type", "application/pdf")):
                with pytest.raises(A2MError) as refused:
                    await router.call("memory/remember", {"records": [
                        {"content": "fine", "tier": "keyed"}, {"content": "its field", field: value}]})
                error = refused.value
                assert error.code == -32602 and f"records[1].{field}" in error.message and "plain" in error.message
                assert error.data["index"] == 1 and error.data["field"] == field and error.data["tier"] == "plain"
            me = new_owner()  # an owner's record: there it would be every owner's
            with pytest.raises(A2MError) as refused:
                await router.call("memory/remember", {"owner": me, "records": [{"content": "mine"}]})
            assert refused.value.code == -32602 and refused.value.data["field"] == "owner", refused.value
            for tier in ("plain", "keyed"):
                assert await held(stack, tier) == []
            # What the tier keeps is written there: a salience equal to what every record shows is no loss.
            await router.call("memory/remember", {"records": [{"content": "plain", "salience": 0.5}]})
            assert [r["content"] for r in await held(stack, "plain")] == ["plain"]


MOVE_TIERS = [
    {"name": "working", "kind": "working", "serve": "fixture", "capacity": 2, "spill_to": "sessionless"},
    {"name": "sessionless", "kind": "episodic", "serve": "fixture", "args": SESSIONLESS},
]


async def test_a_move_into_a_tier_without_sessions_leaves_a_record_with_a_session_where_it_is(
        tmp_path: Path) -> None:
    """Spill, promote and session close move records with the router's own writes. Into a tier
    that does not declare sessions, a record's session was dropped there: session/list (which asks
    tiers with sessions) lost it, and a close flushed the conversation out of reach of both. Such a
    record stays where it is (a move can duplicate, never lose); a promote says so (-32602); a
    record without a session moves."""
    me = new_owner()
    with federation(tmp_path, MOVE_TIERS, top={"default_tier": "working"}) as stack:
        async with HTTPClient(stack.url) as router:
            ids = {}
            for content, session in (("x", None), ("y", None), ("z", None), ("a", "s1"), ("b", "s1"), ("c", "s1")):
                record = {"content": content} if session is None else {"content": content, "session": session}
                ids[content] = (await router.call("memory/remember", {"owner": me, "records": [record]}))["ids"][0]
            # The implicit bucket spilled its oldest; the session's oldest could not go.
            assert [r["id"] for r in await held(stack, "sessionless", me)] == [ids["x"]]
            with pytest.raises(A2MError) as refused:
                await router.call("memory/promote", {"owner": me, "ids": [ids["b"]], "tier": "sessionless"})
            assert refused.value.code == -32602 and "session" in refused.value.message, refused.value
            assert "sessionless" in refused.value.message and refused.value.data["refused"] == [ids["b"]]
            closed = await router.call("memory/session/close", {"owner": me, "session": "s1"})
            assert closed["flushed"] == 0, closed
            sessions = (await router.call("memory/session/list", {"owner": me}))["sessions"]
            assert [(s["session"], s["records"]) for s in sessions] == [("s1", 3)], sessions
            assert sorted(r["content"] for r in await held(stack, "working", me)) == ["a", "b", "c", "y", "z"]


async def test_a_per_session_tier_without_sessions_is_held_to_its_capacity_as_one_bucket(tmp_path: Path) -> None:
    """A working tier counts its capacity per session (router.toml's per_session, on by default for
    working), found by asking it memory/session/list. A tier server that does not declare sessions
    answers that -32003, so every consolidate's capacity pass on it failed (logged) and it grew past
    its capacity for good. It holds no session's records (a record with one is not written there),
    so its capacity is counted over the whole tier, and consolidate spills it back within it."""
    me = new_owner()
    tiers = [{"name": "working", "kind": "working", "serve": "fixture", "args": SESSIONLESS, "capacity": 2,
              "spill_to": "episodic"},
             {"name": "episodic", "kind": "episodic", "serve": "fixture"}]
    with federation(tmp_path, tiers, top={"default_tier": "working"}) as stack:
        async with HTTPClient(stack.url) as router:
            # Written behind the router's back (a capacity lowered since, another router's writes).
            await tier_call(stack, "working", "memory/remember", {"owner": me, "records": [
                {"content": f"note {n}", "created_at": f"2026-01-0{n}T00:00:00.000Z"} for n in range(1, 5)]})
            result = await router.call("memory/consolidate", {"owner": me})
            assert result["moved"] == 2 and result["counts"] == {"working": 2, "episodic": 2}, result
            layout = {t["name"]: t["per_session"] for t in (await router.call("memory/describe", {}))["tiers"]}
            assert layout == {"working": False, "episodic": False}, layout
            assert [r["content"] for r in await held(stack, "working", me)] == ["note 3", "note 4"]



async def test_an_intent_is_never_held_where_every_owner_would_read_it(tmp_path: Path) -> None:
    """A batch across tiers first writes its intent (decision 166), naming the caller's ids, to the
    default tier. One without `scopes` keeps no owner apart, so every caller reading it saw another's
    batch while it was written; the intent goes to the first tier that keeps owners apart."""
    tiers = [{"name": "open", "kind": "episodic", "serve": "fixture", "args": ["--capabilities", "tiers"]},
             {"name": "a", "kind": "semantic", "serve": "fixture"},
             {"name": "b", "kind": "episodic", "serve": "fixture", "timeout": 5.0}]
    with federation(tmp_path, tiers, top={"default_tier": "open"}) as stack:
        async with HTTPClient(stack.url, timeout=30.0) as router:
            stack.tiers["b"].pause()  # holds the batch between its parts, its intent standing
            try:
                writing = asyncio.create_task(router.call("memory/remember", {"owner": new_owner(), "records": [
                    {"content": "one", "tier": "a"}, {"content": "two", "tier": "b"}]}))
                deadline = time.monotonic() + 10
                # (the fixture server keeps owners apart whatever it declares: ask it as the router would)
                while not (where := [t for t in ("open", "a") if await held(stack, t, INTENTS)]):
                    assert time.monotonic() < deadline and not writing.done(), "no intent while the batch was written"
                    await asyncio.sleep(0.02)
                assert where == ["a"]
            finally:
                stack.tiers["b"].resume()
            await writing



@asynccontextmanager
async def routed(*tiers: ScriptedTier, **config: Any) -> AsyncIterator[Dispatcher]:
    """A router in this process over these scripted tiers (started here, stopped after); the
    dispatcher its callers' JSON-RPC messages go through."""
    for tier in tiers:
        await tier.start()
    router = Router(RouterConfig(tiers=tuple(TierConfig(t.server.name, t.url, kind=t.server.kind) for t in tiers),
                                 background_promotion=False, **config))
    await router.startup()
    try:
        yield Dispatcher(router)
    finally:
        await router.shutdown()
        for tier in tiers:
            await tier.stop()


async def ask(dispatcher: Dispatcher, method: str, params: dict[str, Any]) -> dict[str, Any]:
    reply = await dispatcher.handle({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}, Context())
    assert reply is not None
    return reply


async def test_a_recall_by_vector_alone_leaves_out_a_tier_without_embeddings() -> None:
    """A recall with a vector and no query asks only the tiers that rank by vectors: the others
    would answer their newest records as matches (a server ignores the `embedding` of a capability
    it does not declare, §4). A tier of a searched kind (episodic, semantic) that does not declare
    `embeddings` was asked all the same."""
    textual, vectors = ScriptedTier("textual", "semantic"), ScriptedTier("vectors", "episodic")
    textual.server.capabilities = CAPABILITIES - {"embeddings"}
    async with routed(textual, vectors) as router:
        await vectors.call("memory/remember", {"records": [{"content": "north", "embedding": [1.0, 0.0, 0.0]}]})
        await textual.call("memory/remember", {"records": [{"content": "the ferry leaves at noon"}]})
        textual.calls.clear()
        reply = await ask(router, "memory/recall", {"embedding": [0.9, 0.1, 0.0]})
        assert [r["content"] for r in reply["result"]["records"]] == ["north"], reply
        assert [m for m, _ in textual.calls if m == "memory/recall"] == []


def keeping_no_owners_apart(tier: ScriptedTier) -> None:
    """Make `tier` a server of another implementation without `scopes`: it ignores `owner` (§4),
    so every caller, the router's intents' owner included, reads and forgets one partition."""
    tier.server.capabilities = CAPABILITIES - {"scopes"}
    handle = tier.dispatcher.handle

    async def ignoring_owner(message: dict[str, Any], ctx: Context) -> dict[str, Any] | None:
        params = {k: v for k, v in (message.get("params") or {}).items() if k != "owner"}
        return await handle({**message, "params": params}, ctx)

    tier.dispatcher.handle = ignoring_owner  # type: ignore[method-assign]


async def test_intents_are_not_read_from_a_tier_that_keeps_no_owners_apart() -> None:
    """An intent is only ever written to a tier with `scopes`, yet every consolidate (and the router's
    start) read intents from every writable tier. One without `scopes` answered that read with every
    record it holds, of every owner (a whole shared tier read and parsed on each consolidate), and a
    record there shaped like an intent was resolved as one: the records it named, another owner's,
    forgotten."""
    scoped, shared = ScriptedTier("scoped", "episodic"), ScriptedTier("shared", "episodic")
    keeping_no_owners_apart(shared)
    async with routed(scoped, shared) as router:
        kept = (await scoped.call("memory/remember", {"owner": "alice", "records": [{"content": "alice's"}]}))["ids"]
        shaped = json.dumps({MARK: "not-a-batch", "part": 0, "parts": 1, "owner": "alice",
                             "created_at": "2020-01-01T00:00:00.000Z", "keys": {},
                             "records": [["scoped", kept[0], 1], ["scoped", "never-written", 1]]})
        await shared.call("memory/remember", {"records": [{"content": "a note"}, {"content": shaped}]})
        shared.calls.clear()
        reply = await ask(router, "memory/consolidate", {"owner": "bob"})
        assert "result" in reply, reply
        assert [p for m, p in shared.calls if p.get("owner") == INTENTS] == []
        held = await scoped.call("memory/timeline", {"owner": "alice", "limit": 0})
        assert [r["id"] for r in held["records"]] == kept


async def test_a_summary_goes_where_it_is_kept_whole(tmp_path: Path) -> None:
    """memory/summarize without `into` writes its summary to the first semantic tier. One that does
    not declare `scopes` (or `keys`, for a summary at a key) would drop the caller's owner, so the
    router's own write was refused (-32602 about `records[0].owner`, a record the caller never
    sent) after reading every source: a valid call failed. The summary goes to a tier that keeps
    it; asked `into` such a tier, the refusal names `into`."""
    tiers = [{"name": "working", "kind": "working", "serve": "fixture"},
             {"name": "facts", "kind": "semantic", "serve": "fixture", "args": ["--capabilities", "tiers"]},
             {"name": "episodic", "kind": "episodic", "serve": "fixture"}]
    me = new_owner()
    with federation(tmp_path, tiers, top={"default_tier": "working"}) as stack:
        async with HTTPClient(stack.url) as router:
            await router.call("memory/remember", {"owner": me, "records": [
                {"content": "The ferry to Capri leaves at noon."}, {"content": "Tickets are sold at the pier."}]})
            got = await router.call("memory/summarize", {"owner": me, "tier": "working", "key": "trip/summary"})
            assert got["written"] == 1 and got["records"][0]["tier"] != "facts", got
            assert await held(stack, "facts") == []
            with pytest.raises(A2MError) as refused:
                await router.call("memory/summarize", {"owner": me, "tier": "working", "into": "facts"})
            assert refused.value.code == -32602 and refused.value.data.get("field") == "into", refused.value
            assert "records[0]" not in refused.value.message, refused.value


async def test_a_recalled_record_is_promoted_into_a_tier_without_salience(tmp_path: Path) -> None:
    """A promotion is earned by recalls, which leave `access_count` and `accessed_at` on the record,
    fields of `salience` (§2). A tier that does not declare it had every promotion refused, so no
    record could ever reach it. A move lets the source's recall counts go; a salience the caller
    set still keeps the record where it is."""
    no_salience = ["--capabilities", "tiers,scopes,sessions,keys,embeddings,external,events"]
    tiers = [{"name": "working", "kind": "working", "serve": "fixture", "promote_to": "facts", "promote_after": 1},
             {"name": "facts", "kind": "semantic", "serve": "fixture", "args": no_salience}]
    me = new_owner()
    with federation(tmp_path, tiers, top={"default_tier": "working"}) as stack:
        async with HTTPClient(stack.url) as router:
            [plain] = (await router.call("memory/remember", {"owner": me, "records": [
                {"content": "the ferry leaves at noon"}]}))["ids"]
            assert (await router.call("memory/recall", {"owner": me, "query": "ferry"}))["records"]
            [recalled] = await held(stack, "working", me)
            assert recalled["access_count"] >= 1, recalled
            await router.call("memory/promote", {"owner": me, "ids": [plain], "tier": "facts"})
            assert [r["id"] for r in await held(stack, "facts", me)] == [plain]
            [weighty] = (await router.call("memory/remember", {"owner": me, "records": [
                {"content": "my passport is blue", "salience": 0.9, "tier": "working"}]}))["ids"]
            with pytest.raises(A2MError) as refused:
                await router.call("memory/promote", {"owner": me, "ids": [weighty], "tier": "facts"})
            assert refused.value.code == -32602 and "salience" in refused.value.message, refused.value


async def test_a_batch_across_tiers_none_of_which_keeps_owners_apart_says_how_to_write_it(tmp_path: Path) -> None:
    """Its intent may only be held where owners are kept apart; with no such tier at all, retrying
    (what "no tier is up" tells a caller) can never help: -32602 says to write each tier's part
    alone, and nothing is written. Each part alone is written."""
    shared = ["--capabilities", "tiers,salience,sessions,keys,embeddings,external,events"]
    tiers = [{"name": "a", "kind": "episodic", "serve": "fixture", "args": shared},
             {"name": "b", "kind": "semantic", "serve": "fixture", "args": shared}]
    with federation(tmp_path, tiers, top={"default_tier": "a"}) as stack:
        async with HTTPClient(stack.url) as router:
            batch = [{"content": "one", "tier": "a"}, {"content": "two", "tier": "b"}]
            with pytest.raises(A2MError) as refused:
                await router.call("memory/remember", {"records": batch})
            assert refused.value.code == -32602 and "call of their own" in refused.value.message, refused.value
            assert await held(stack, "a") == [] and await held(stack, "b") == []
            for record in batch:
                await router.call("memory/remember", {"records": [record]})
            assert [r["content"] for r in await held(stack, "b")] == ["two"]


async def test_a_tier_first_described_after_the_router_started_is_checked_before_its_first_write() -> None:
    """A tier whose describe failed when the router started (down, or answering badly) is taken to
    keep everything until described; it was described only after a call reached it, so its first
    write went out unchecked and lost its session. The write describes it first."""
    sessionless = ScriptedTier("sessionless", "episodic")
    sessionless.server.capabilities = CAPABILITIES - {"sessions"}
    busy = {"code": -32000, "message": "busy"}
    sessionless.twist = lambda m, p, r: {"jsonrpc": "2.0", "id": r["id"], "error": busy} if m == "memory/describe" \
        else None
    async with routed(sessionless, default_tier="sessionless") as router:
        assert router.service.fed["sessionless"].info is None
        sessionless.twist = None
        reply = await ask(router, "memory/remember", {"records": [{"content": "hello", "session": "s1"}]})
        assert reply.get("error", {}).get("code") == -32602, reply
        assert (await sessionless.call("memory/timeline", {"limit": 0}))["records"] == []
