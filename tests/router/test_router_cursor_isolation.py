"""The timeline cursor (docs/extensions.md) through a router with bearer tokens, over the real tier
servers (Redis, PostgreSQL, Qdrant Edge, git, embedded).

A tier's cursor is its position `<created_at>|<seq>|<id>`, and `seq` counts every write of the
tier, whoever's it was (a PostgreSQL sequence, a Redis INCR, the git store's counter; the semantic
tier's is the clock in microseconds, pushed ahead by bursts). Passed to a principal as it is, two
cursors of its own told it how many records every other owner wrote in between: the router seals
them, as the event log's cursors already say nothing of other owners (a2m/events.py).
"""

from __future__ import annotations

import base64
import uuid
from typing import Any, Iterator

import pytest

from a2m.client import HTTPClient
from a2m.errors import A2MError

from .stack import Stack, federation, write_config

pytestmark = pytest.mark.anyio

TIERS = [
    {"name": "working", "kind": "working", "capacity": 100, "spill_to": "episodic", "timeout": 10.0},
    {"name": "episodic", "kind": "episodic", "timeout": 10.0},
    {"name": "semantic", "kind": "semantic", "timeout": 10.0},
    {"name": "procedural", "kind": "procedural", "timeout": 10.0},
]
NAMES = [t["name"] for t in TIERS]
SERVICE = "svc-" + uuid.uuid4().hex
TOKEN_OF = {p: f"tok-{p}-{uuid.uuid4().hex}" for p in ("alice", "bob")}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    top = {"background_promotion": False, "auth": {"tokens": {t: p for p, t in TOKEN_OF.items()}}}
    with federation(tmp_path_factory.mktemp("cursor-auth"), TIERS, mode="real", top=top,
                    env={"A2M_SERVICE_TOKEN": SERVICE}) as running:
        yield running


async def _refused(client: HTTPClient, params: dict[str, Any]) -> A2MError:
    with pytest.raises(A2MError) as caught:
        await client.call("memory/timeline", params)
    return caught.value


@pytest.mark.parametrize("tier", NAMES)
async def test_a_cursor_tells_a_principal_nothing_of_other_owners_writes(stack: Stack, tier: str) -> None:
    """Alice pages her records between bob's writes: her cursors carry no tier position (whose
    `seq` moved by every record bob wrote), only what the router can read back for her."""
    async with HTTPClient(stack.url, token=TOKEN_OF["alice"]) as alice, \
            HTTPClient(stack.url, token=TOKEN_OF["bob"]) as bob, \
            HTTPClient(stack.tiers[tier].url, token=SERVICE) as direct:
        await alice.call("memory/remember", {"records": [{"content": "alice one", "tier": tier}]})
        await bob.call("memory/remember", {"records": [{"content": f"bob {i}", "tier": tier} for i in range(7)]})
        await alice.call("memory/remember", {"records": [{"content": "alice two", "tier": tier}]})
        page = {"tier": tier, "limit": 1, "cursor": True}
        mine = await alice.call("memory/timeline", page)
        theirs = await direct.call("memory/timeline", {"owner": "alice", "limit": 1, "cursor": True})
        assert mine["records"] == theirs["records"]
        _, stamp, _, record_id = theirs["cursor"].split("|")
        assert "|" not in mine["cursor"], (mine["cursor"], theirs["cursor"])  # no `seq` to read
        assert stamp not in mine["cursor"] and record_id not in mine["cursor"]
        # Still a cursor: the next page is alice's first record, then none.
        older = await alice.call("memory/timeline", {**page, "cursor": mine["cursor"]})
        assert [r["content"] for r in older["records"]] == ["alice one"] and isinstance(older["cursor"], str)
        last = await alice.call("memory/timeline", {**page, "cursor": older["cursor"]})
        assert last == {"records": [], "cursor": None}


async def test_a_cursor_is_the_principals_and_the_tiers_it_was_made_for(stack: Stack) -> None:
    """A cursor replayed by another principal, or on another tier, or a tier's own cursor (which
    a caller could build from its records' `created_at` and ids) is -32602, like any cursor the
    router never made; the walk it would have answered was the caller's own scope anyway."""
    async with HTTPClient(stack.url, token=TOKEN_OF["alice"]) as alice, \
            HTTPClient(stack.url, token=TOKEN_OF["bob"]) as bob, \
            HTTPClient(stack.tiers["episodic"].url, token=SERVICE) as direct:
        await alice.call("memory/remember", {"records": [{"content": f"alice {i}", "tier": "episodic"}
                                                         for i in range(3)]})
        cursor = (await alice.call("memory/timeline", {"tier": "episodic", "limit": 1, "cursor": True}))["cursor"]
        plain = (await direct.call("memory/timeline", {"owner": "alice", "limit": 1, "cursor": True}))["cursor"]
        for client, params in ((bob, {"tier": "episodic", "cursor": cursor}),
                               (alice, {"tier": "semantic", "cursor": cursor}),
                               (alice, {"tier": "episodic", "cursor": plain}),
                               (alice, {"tier": "episodic", "cursor": cursor[:-2]}),
                               (alice, {"tier": "episodic", "cursor": cursor + "AA"})):
            error = await _refused(client, params)
            assert error.code == -32602 and error.data == {"field": "cursor"}, (params, error)
        assert (await alice.call("memory/timeline", {"tier": "episodic", "cursor": cursor}))["records"]


async def test_tokens_given_on_the_command_line_seal_cursors_too(tmp_path_factory: pytest.TempPathFactory) -> None:
    """`a2m serve router --token T=P` without an [auth] table: the binding takes the tokens from the
    command line, and the cursors are sealed all the same."""
    token = "tok-cli-" + uuid.uuid4().hex
    tiers = [{"name": "episodic", "kind": "episodic", "timeout": 10.0}]
    with federation(tmp_path_factory.mktemp("cursor-cli"), tiers, mode="real",
                    router_args=["--token", f"{token}=carol"]) as running:
        async with HTTPClient(running.url, token=token) as carol:
            await carol.call("memory/remember", {"records": [{"content": f"carol {i}"} for i in range(2)]})
            cursor = (await carol.call("memory/timeline", {"limit": 1, "cursor": True}))["cursor"]
            assert "|" not in cursor, cursor
            older = await carol.call("memory/timeline", {"limit": 1, "cursor": cursor})
            assert [r["content"] for r in older["records"]] == ["carol 0"]


async def test_a_cursor_secret_keeps_a_walk_open_across_a_change_of_tokens(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """Rotating tokens (here: adding one) drew a new sealing key, and every walk in flight -- an
    export half done -- was refused from then on. With `cursor_secret` the key is the secret's: the
    router restarted with other tokens still opens the cursor it handed out; without it, it does not."""
    token = "tok-dave-" + uuid.uuid4().hex
    secret = uuid.uuid4().hex
    tiers = [{"name": "episodic", "kind": "episodic", "timeout": 10.0}]
    tmp = tmp_path_factory.mktemp("cursor-secret")

    def auth(*tokens: str, with_secret: bool) -> dict[str, Any]:
        table: dict[str, Any] = {"tokens": {t: "dave" for t in tokens}}
        return {"auth": table | ({"cursor_secret": secret} if with_secret else {})}

    with federation(tmp, tiers, mode="real", top=auth(token, with_secret=True)) as running:
        async with HTTPClient(running.url, token=token) as dave:
            await dave.call("memory/remember", {"records": [{"content": f"dave {i}"} for i in range(3)]})
            cursor = (await dave.call("memory/timeline", {"limit": 1, "cursor": True}))["cursor"]
        configured = [{**t, "url": running.tiers[t["name"]].url} for t in tiers]
        for with_secret, opens in ((True, True), (False, False)):
            running.router.stop()
            write_config(running.config, configured, auth(token, "tok-new-" + uuid.uuid4().hex,
                                                          with_secret=with_secret))
            running.router.start().wait()
            async with HTTPClient(running.url, token=token) as dave:
                if opens:
                    older = await dave.call("memory/timeline", {"limit": 1, "cursor": cursor})
                    assert [r["content"] for r in older["records"]] == ["dave 1"]
                else:
                    assert (await _refused(dave, {"limit": 1, "cursor": cursor})).code == -32602


async def test_a_router_built_in_process_seals_with_its_cursor_secret_from_the_start() -> None:
    """`Reads` takes the secret when the router is built, not only when `a2m serve` hands it the tokens
    (`take_tokens`): a router embedded without that call sealed with its tokens, and its walks broke
    at the next change of them."""
    from router.config import RouterConfig, TierConfig
    from router.cursors import CursorSeal
    from router.server import Router

    secret = uuid.uuid4().hex
    config = RouterConfig(tiers=(TierConfig(name="episodic", url="http://127.0.0.1:9/", kind="episodic"),),
                          tokens={"tok-dave-" + uuid.uuid4().hex: "dave"}, cursor_secret=secret)
    router = Router(config)
    seal = router.reads.cursors.seal
    assert seal is not None
    sealed = seal.close("2026-01-01T00:00:00.000Z|7|r1", "dave", "episodic")
    rotated = CursorSeal.of({"tok-other-" + uuid.uuid4().hex: "dave"}, None, secret)
    assert rotated is not None and rotated.open(sealed, "dave", "episodic") == "2026-01-01T00:00:00.000Z|7|r1"
    await router.fed.close()


async def test_a_walk_over_every_tier_is_sealed_for_its_principal(stack: Stack) -> None:
    """A cursor over several tiers holds every tier's position: sealed, it shows none of them, it
    walks alice's records of all four tiers, and bob cannot replay it."""
    async with HTTPClient(stack.url, token=TOKEN_OF["alice"]) as alice, \
            HTTPClient(stack.url, token=TOKEN_OF["bob"]) as bob:
        wrote = set()
        for tier in NAMES:
            wrote |= set((await alice.call("memory/remember", {"records": [
                {"content": f"alice walks {tier} {i}", "tier": tier} for i in range(3)]}))["ids"])
            await bob.call("memory/remember", {"records": [{"content": f"bob {tier}", "tier": tier}]})
        first = await alice.call("memory/timeline", {"limit": 5, "cursor": True})
        cursor = first["cursor"]
        assert cursor.startswith("s2.") and "|" not in cursor
        assert (await _refused(bob, {"limit": 5, "cursor": cursor})).code == -32602
        assert (await _refused(alice, {"tier": "episodic", "limit": 5, "cursor": cursor})).code == -32602
        read = {r["id"] for r in first["records"]}
        while cursor is not None:
            page = await alice.call("memory/timeline", {"limit": 5, "cursor": cursor})
            read |= {r["id"] for r in page["records"]}
            cursor = page["cursor"]
        everything = (await alice.call("memory/timeline", {"limit": 1000}))["records"]
        assert wrote <= read == {r["id"] for r in everything}


async def _seq(direct: HTTPClient, owner: str) -> int:
    """The tier's write counter as its own cursor shows it (`<tag>|<created_at>|<seq>|<id>`)."""
    plain = (await direct.call("memory/timeline", {"owner": owner, "limit": 1, "cursor": True}))["cursor"]
    return int(plain.split("|")[2])


@pytest.mark.parametrize("tier", [name for name in NAMES if name != "semantic"])  # its seq: the clock in µs
async def test_a_cursors_length_tells_nothing_of_other_owners_writes(stack: Stack, tier: str) -> None:
    """A sealed cursor is as long as what it seals, and a tier's `seq` is written in as many digits as
    it has: alice's cursors grew by a character each time bob's writes took the tier's counter past
    a power of ten, which told her how many records all other owners wrote (writing one at a time,
    exactly, at each crossing). Her cursors, of records whose ids are as long, are as long."""
    async with HTTPClient(stack.url, token=TOKEN_OF["alice"]) as alice, \
            HTTPClient(stack.url, token=TOKEN_OF["bob"]) as bob, \
            HTTPClient(stack.tiers[tier].url, token=SERVICE) as direct:
        lengths = []
        for step in range(2):
            await alice.call("memory/remember", {"records": [{"content": "alice", "tier": tier,
                                                              "id": f"len-{tier}-{step}-{uuid.uuid4().hex}"}]})
            one = (await alice.call("memory/timeline", {"tier": tier, "limit": 1, "cursor": True}))["cursor"]
            walk = (await alice.call("memory/timeline", {"limit": 1, "cursor": True}))["cursor"]
            lengths.append((len(one), len(walk)))
            seq = await _seq(direct, "alice")
            more = 10 ** len(str(seq)) - seq + 1  # bob's writes take the counter past the next power of ten
            for start in range(0, more, 500):
                await bob.call("memory/remember", {"records": [{"content": f"bob {i}", "tier": tier}
                                                               for i in range(start, min(more, start + 500))]})
        assert lengths[0] == lengths[1], lengths


def test_a_padded_cursor_opens_to_what_was_sealed_and_one_sealed_before_padding_still_opens() -> None:
    """Padding is unambiguous (an id may end in a byte the padding begins with), every cursor of a size
    seals to one length, and a cursor sealed unpadded (`s1.`, by a replica not yet upgraded) still opens."""
    from router.cursors import CursorSeal

    seal = CursorSeal.of({"tok-erin-" + uuid.uuid4().hex: "erin"}, None)
    assert seal is not None
    for cursor in ("t|2026-01-01T00:00:00.000Z|7|r1", "t|2026-01-01T00:00:00.000Z|1234567|r1", "t|x|1|idÀ",
                   "é" * 200):
        assert seal.open(seal.close(cursor, "erin", "episodic"), "erin", "episodic") == cursor
    assert len(seal.close("t|s|7|r1", "erin", "w")) == len(seal.close("t|s|1234567|r1", "erin", "w"))
    legacy = seal._siv.encrypt(b"t|s|7|r1", seal._bound("erin", "w"))
    old = "s1." + base64.urlsafe_b64encode(legacy).decode().rstrip("=")
    assert seal.open(old, "erin", "w") == "t|s|7|r1"
