"""The router facing a tier server that misbehaves: any A2M server may be mounted as a tier (a
third-party one, an old version), and what it answers is input like any other.

A scripted tier (tests/support/scripted.py: a real HTTP server on loopback over the in-memory
fixture store) answers correctly unless a test twists one method's reply: bytes that are not
JSON-RPC, a result of the wrong shape, a lie. Expected: the router never fails with an internal
error because of it; the tier counts as failing (`degraded` on reads, -32603 naming it on writes);
the other tiers' answers still come back; no move deletes a record its destination does not hold.
"""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator

import pytest

from a2m.client import HTTPClient, Unavailable
from a2m.dispatch import Context, Dispatcher
from a2m.errors import A2MError
from a2m.http1 import ConnectionFailed, ConnectionPool
from router.config import RouterConfig, TierConfig
from router.server import Router
from tests.support.scripted import ScriptedTier, http_response, with_result

pytestmark = pytest.mark.anyio
ME = "alice"


class Fed:
    def __init__(self, router: Router, tiers: dict[str, ScriptedTier]) -> None:
        self.router, self.tiers = router, tiers
        self.dispatcher = Dispatcher(router)

    async def __call__(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """The router's answer as a client sees it: a result, or its error raised as A2MError."""
        reply = await self.dispatcher.handle({"jsonrpc": "2.0", "id": 1, "method": method,
                                              "params": {"owner": ME, **params}}, Context())
        assert reply is not None
        if "error" in reply:
            assert not reply["error"]["message"].startswith("internal error"), reply  # never a crash
            raise A2MError.from_error(reply["error"])
        return reply["result"]

    async def held(self, tier: str) -> set[str]:
        return {r["id"] for r in (await self.tiers[tier].call("memory/timeline", {"owner": ME}))["records"]}


@pytest.fixture
async def fed() -> AsyncIterator[Fed]:
    tiers = {name: await ScriptedTier(name, kind).start()
             for name, kind in (("working", "working"), ("episodic", "episodic"), ("semantic", "semantic"))}
    config = RouterConfig(tiers=(
        TierConfig("working", tiers["working"].url, kind="working", capacity=3, per_session=True,
                   spill_to="episodic", timeout=1.0),
        TierConfig("episodic", tiers["episodic"].url, kind="episodic", spill_to="semantic", timeout=1.0),
        TierConfig("semantic", tiers["semantic"].url, kind="semantic", timeout=1.0),
    ), background_promotion=False)
    router = Router(config)
    await router.startup()
    try:
        yield Fed(router, tiers)
    finally:
        await router.shutdown()
        for tier in tiers.values():
            await tier.stop()


def on(method: str, result: Any):  # type: ignore[no-untyped-def]
    """A twist: `method`'s reply has this result (a callable: made from the correct one)."""
    def twist(m: str, params: dict[str, Any], response: dict[str, Any]) -> Any:
        if m != method:
            return None
        return with_result(response, result(response["result"]) if callable(result) else result)
    return twist


GOOD = {"id": "x1", "content": "about milan", "created_at": "2026-01-01T00:00:00.000Z"}

BAD_RECORD_LISTS = {
    "records not a list": {"a": GOOD},
    "a record not an object": [GOOD, "x2"],
    "a record without id": [{k: v for k, v in GOOD.items() if k != "id"}],
    "an integer id": [{**GOOD, "id": 7}],
    "no created_at": [{k: v for k, v in GOOD.items() if k != "created_at"}],
    "no content": [{k: v for k, v in GOOD.items() if k != "content"}],
    "a string revision": [{**GOOD, "revision": "two"}],
    "a string salience": [{**GOOD, "salience": "high"}],
    "a list group": [{**GOOD, "group": ["g"]}],
    "a string score": [{**GOOD, "score": "NaN"}],
    "duplicate ids": [GOOD, GOOD],
    "metadata a list": [{**GOOD, "metadata": [1]}],
    "embedding not a list": [{**GOOD, "embedding": "0.1 0.2"}],
}


async def seed(fed: Fed) -> str:
    [rid] = (await fed("memory/remember", {"records": [{"content": "I moved to milan", "tier": "semantic"}]}))["ids"]
    return rid


@pytest.mark.parametrize("fusion", ["rrf", "rerank"])
@pytest.mark.parametrize("case", list(BAD_RECORD_LISTS))
async def test_a_malformed_recall_reply_leaves_that_tier_out(fed: Fed, case: str, fusion: str) -> None:
    rid = await seed(fed)
    fed.tiers["episodic"].twist = on("memory/recall", {"records": BAD_RECORD_LISTS[case]})
    got = await fed("memory/recall", {"query": "milan", "fusion": fusion})
    assert [r["id"] for r in got["records"]] == [rid]
    assert got["degraded"] == ["episodic"]


@pytest.mark.parametrize("case", list(BAD_RECORD_LISTS))
async def test_a_malformed_timeline_reply_leaves_that_tier_out(fed: Fed, case: str) -> None:
    rid = await seed(fed)
    fed.tiers["episodic"].twist = on("memory/timeline", {"records": BAD_RECORD_LISTS[case]})
    got = await fed("memory/timeline", {})
    assert [r["id"] for r in got["records"]] == [rid]
    assert got["degraded"] == ["episodic"]


@pytest.mark.parametrize("record", [{**GOOD, "key": "k", "revision": "x"}, {"id": "x"}, "r", [GOOD]])
async def test_a_malformed_fetch_reply_leaves_that_tier_out(fed: Fed, record: Any) -> None:
    await fed("memory/remember", {"records": [{"content": "Rome", "key": "k", "tier": "semantic"}]})
    fed.tiers["episodic"].twist = on("memory/fetch", {"record": record})
    got = await fed("memory/fetch", {"key": "k"})
    assert got["record"]["content"] == "Rome" and got["degraded"] == ["episodic"]


@pytest.mark.parametrize("sessions", [
    {"s": 1}, [{"session": "s1", "records": "many"}], [{"session": ["s1"], "records": 1}], ["s1"],
    [{"session": "s1", "records": 1, "opened_at": 5}]])
async def test_a_malformed_session_list_leaves_that_tier_out(fed: Fed, sessions: Any) -> None:
    await fed("memory/remember", {"records": [{"content": "hi", "session": "s1"}]})
    fed.tiers["episodic"].twist = on("memory/session/list", {"sessions": sessions})
    got = await fed("memory/session/list", {})
    assert [(s["session"], s["records"]) for s in got["sessions"]] == [("s1", 1)]
    assert got["degraded"] == ["episodic"]


@pytest.mark.parametrize("lie", [
    lambda d: {**d, "tiers": [{**d["tiers"][0], "count": "lots"}]},
    lambda d: {**d, "tiers": "episodic"},
    lambda d: {**d, "capabilities": "core"},
    lambda d: {**d, "embeddings": {**d["embeddings"], "dimensions": "384"}},
    lambda d: {**d, "limits": {"max_recall_limit": "ten"}},
    lambda d: [d],
])
async def test_a_describe_that_lies_leaves_that_tier_out_of_describe(fed: Fed, lie: Any) -> None:
    fed.tiers["episodic"].twist = on("memory/describe", lie)
    got = await fed("memory/describe", {})
    status = {t["name"]: t["status"] for t in got["tiers"]}
    assert status == {"working": "up", "episodic": "down", "semantic": "up"} and got["degraded"] == ["episodic"]
    [entry] = [t for t in got["tiers"] if t["name"] == "episodic"]
    assert "malformed" in entry["error"]  # what `a2m doctor` shows
    # and what the router reads of it later (limits, dimensions) never breaks a read
    await seed(fed)
    assert (await fed("memory/recall", {"query": "milan"}))["records"]


async def test_a_describe_with_unknown_capabilities_and_no_tiers_is_fine(fed: Fed) -> None:
    fed.tiers["episodic"].twist = on("memory/describe", lambda d: {
        **{k: v for k, v in d.items() if k != "tiers"}, "capabilities": [*d["capabilities"], "teleport"]})
    got = await fed("memory/describe", {})
    assert "degraded" not in got
    assert {t["name"]: t["count"] for t in got["tiers"]}["episodic"] == 0


@pytest.mark.parametrize("answer", [{"forgotten": "three"}, {"forgotten": -1}, {}])
async def test_a_malformed_forget_reply_is_an_error_naming_the_tier(fed: Fed, answer: Any) -> None:
    rid = await seed(fed)
    fed.tiers["episodic"].twist = on("memory/forget", answer)
    with pytest.raises(A2MError) as caught:
        await fed("memory/forget", {"ids": [rid]})
    assert caught.value.code == -32603 and "episodic" in caught.value.message
    assert await fed.held("semantic") == set()  # the other tiers' forget still ran


@pytest.mark.parametrize("answer", [{"reinforced": "x"}, {"reinforced": True}])
async def test_a_malformed_reinforce_reply_is_an_error_naming_the_tier(fed: Fed, answer: Any) -> None:
    rid = await seed(fed)
    fed.tiers["episodic"].twist = on("memory/reinforce", answer)
    with pytest.raises(A2MError) as caught:
        await fed("memory/reinforce", {"ids": [rid, "other"]})
    assert caught.value.code == -32603 and "episodic" in caught.value.message


@pytest.mark.parametrize("ids", [lambda r: [], lambda r: r["ids"] + ["extra"], lambda r: "x", lambda r: [1],
                                 lambda r: None])
async def test_a_malformed_remember_reply_fails_the_write_and_takes_it_back(fed: Fed, ids: Any) -> None:
    fed.tiers["episodic"].twist = on("memory/remember", lambda r: {"ids": ids(r)})
    with pytest.raises(A2MError) as caught:
        await fed("memory/remember", {"records": [{"content": "a"}, {"content": "b", "tier": "episodic"}]})
    assert caught.value.code == -32603 and "episodic" in caught.value.message
    assert await fed.held("episodic") == set() and await fed.held("working") == set()


# ---- moves: a destination that lies never costs the source its record -------------------------

async def fill_working(fed: Fed, n: int = 4) -> list[str]:
    return (await fed("memory/remember", {"records": [
        {"content": f"turn {i}", "session": "s1"} for i in range(n)]}))["ids"]


def lying_dest(m: str, params: dict[str, Any], response: dict[str, Any]) -> Any:
    """Says it stored the records and shows them back by id, and keeps nothing."""
    if m == "memory/remember":
        return with_result(response, {"ids": [r["id"] for r in params["records"]]})
    if m == "memory/timeline" and isinstance((params.get("where") or {}).get("id"), list):
        return with_result(response, {"records": [
            {"id": i, "content": "", "created_at": "2026-01-01T00:00:00.000Z"} for i in params["where"]["id"]]})
    return None


@pytest.mark.parametrize("twist", [
    lying_dest,
    on("memory/remember", lambda r: {"ids": "abc"}),
    on("memory/remember", lambda r: {"ids": r["ids"][:-1]}),
    on("memory/timeline", {"records": [{"id": None}]}),
    on("memory/timeline", {"records": "all of them"}),
], ids=["stores nothing", "ids a string", "ids short", "readback without ids", "readback not a list"])
async def test_a_spill_into_a_destination_that_lies_keeps_every_record(fed: Fed, twist: Any) -> None:
    fed.tiers["episodic"].twist = twist
    ids = await fill_working(fed)  # 4 turns past a capacity of 3: the oldest spills into episodic
    assert await fed.held("working") | await fed.held("episodic") == set(ids)
    assert await fed.held("working") == set(ids)  # nothing verified there: nothing left working


async def test_a_promote_into_a_destination_that_lies_keeps_the_record_and_says_so(fed: Fed) -> None:
    [rid] = (await fed("memory/remember", {"records": [{"content": "keep me", "session": "s1"}]}))["ids"]
    fed.tiers["semantic"].twist = lying_dest
    with pytest.raises(A2MError) as caught:
        await fed("memory/promote", {"ids": [rid], "tier": "semantic"})
    assert caught.value.code == -32603 and "tier semantic" in caught.value.message
    assert caught.value.data["refused"] == [rid]
    assert await fed.held("working") == {rid}


async def test_an_error_answered_with_a_null_id_keeps_its_code(fed: Fed) -> None:
    # JSON-RPC lets a server that could not read the id answer null; the error is still its answer
    fed.tiers["episodic"].twist = lambda m, p, r: ({"jsonrpc": "2.0", "id": None, "error": {
        "code": -32602, "message": "records[0].content is too long here"}} if m == "memory/remember" else None)
    with pytest.raises(A2MError) as caught:
        await fed("memory/remember", {"records": [{"content": "b", "tier": "episodic"}]})
    assert caught.value.code == -32602


async def test_a_source_that_ignores_where_moves_only_the_records_asked_for(fed: Fed) -> None:
    ids = (await fed("memory/remember", {"records": [{"content": f"t{i}", "session": "s1"} for i in range(3)]}))["ids"]

    every = (await fed.tiers["working"].call("memory/timeline", {"owner": ME, "embeddings": True}))["records"]
    fed.tiers["working"].twist = lambda m, p, r: (with_result(r, {"records": every})
                                                  if m == "memory/timeline" and "where" in p else None)
    got = await fed("memory/promote", {"ids": [ids[0]], "tier": "semantic"})
    assert got == {"promoted": 1}
    assert await fed.held("semantic") == {ids[0]}
    assert await fed.held("working") == set(ids[1:])


async def test_a_session_list_with_a_string_count_does_not_break_a_write(fed: Fed) -> None:
    # consolidate reads each per-session tier's session list to find buckets over capacity
    await fill_working(fed, 2)
    fed.tiers["working"].twist = on("memory/session/list", {"sessions": [{"session": "s1", "records": "2"}]})
    got = await fed("memory/consolidate", {})
    assert got["moved"] == 0


async def test_repair_with_a_describe_count_that_is_a_string_is_skipped(fed: Fed) -> None:
    fed.tiers["episodic"].twist = on("memory/describe", lambda d: {**d, "tiers": [{**d["tiers"][0], "count": "9"}]})
    got = await fed("memory/consolidate", {})
    assert got["repaired"] == 0


# ---- the wire: bytes that are not a JSON-RPC reply ------------------------------------------

def raw(payload: bytes):  # type: ignore[no-untyped-def]
    return lambda m, p, r: payload if m == "memory/recall" else None


WIRE = {
    "not json": http_response(b"<html>hello</html>", content_type="text/html"),
    "500 html": http_response(b"<html>oops</html>", "500 Internal Server Error", "text/html"),
    "502": http_response(b"bad gateway", "502 Bad Gateway", "text/plain"),
    "429": http_response(b"slow down", "429 Too Many Requests", "text/plain", "retry-after: 1\r\n"),
    "redirect": http_response(b"", "302 Found", "text/plain", "location: http://example.com/\r\n"),
    "json array": http_response(b"[1, 2]"),
    "result a list": http_response(b'{"jsonrpc": "2.0", "id": 1, "result": []}'),
    "not http": b"SSH-2.0-OpenSSH_9.6\r\n",
    "wrong id": None,  # filled per request below
}


@pytest.mark.parametrize("case", list(WIRE))
async def test_a_reply_that_is_not_json_rpc_leaves_that_tier_out(fed: Fed, case: str) -> None:
    rid = await seed(fed)
    if case == "wrong id":
        fed.tiers["episodic"].twist = lambda m, p, r: ({**r, "id": r["id"] + 1000} if m == "memory/recall" else None)
    else:
        fed.tiers["episodic"].twist = raw(WIRE[case])
    got = await fed("memory/recall", {"query": "milan"})
    assert [r["id"] for r in got["records"]] == [rid] and got["degraded"] == ["episodic"]


async def test_a_tier_error_with_a_huge_message_or_odd_code_is_passed_on_bounded(fed: Fed) -> None:
    fed.tiers["episodic"].twist = lambda m, p, r: ({"jsonrpc": "2.0", "id": r["id"], "error": {
        "code": "-32602", "message": "x" * 5_000_000}} if m == "memory/remember" else None)
    with pytest.raises(A2MError) as caught:
        await fed("memory/remember", {"records": [{"content": "b", "tier": "episodic"}]})
    assert caught.value.code == -32603 and len(caught.value.message) < 2000


async def test_a_trickling_reply_ends_at_the_tier_timeout(fed: Fed) -> None:
    rid = await seed(fed)

    def trickle(m: str, p: dict[str, Any], r: dict[str, Any]) -> Any:
        if m != "memory/recall":
            return None

        async def write(writer: asyncio.StreamWriter) -> None:
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n")
            for _ in range(200):
                writer.write(b"1\r\n \r\n")
                await writer.drain()
                await asyncio.sleep(0.05)
        return write

    fed.tiers["episodic"].twist = trickle
    loop = asyncio.get_running_loop()
    started = loop.time()
    got = await fed("memory/recall", {"query": "milan"})
    assert [r["id"] for r in got["records"]] == [rid] and got["degraded"] == ["episodic"]
    assert loop.time() - started < 3.0


# ---- the client's body cap --------------------------------------------------------------------

async def _serve_bytes(chunks: list[bytes]) -> tuple[asyncio.AbstractServer, str]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            for chunk in chunks:
                writer.write(chunk)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/"


@pytest.mark.parametrize("framing", ["sized", "chunked", "until close"])
async def test_a_response_past_the_cap_fails_the_call_without_buffering_it(framing: str) -> None:
    body = b"x" * (1 << 20)
    head = {"sized": b"content-length: %d\r\n" % (8 * len(body)), "chunked": b"transfer-encoding: chunked\r\n",
            "until close": b""}[framing]
    piece = b"%x\r\n%s\r\n" % (len(body), body) if framing == "chunked" else body
    server, url = await _serve_bytes([b"HTTP/1.1 200 OK\r\n" + head + b"\r\n"] + [piece] * 8)
    try:
        pool = ConnectionPool(url, max_response=2 << 20)
        with pytest.raises(ConnectionFailed, match="larger than"):
            await pool.post(b"{}", timeout=5)
    finally:
        server.close()


async def test_a_declared_length_past_the_cap_fails_before_the_body_arrives() -> None:
    server, url = await _serve_bytes([b"HTTP/1.1 200 OK\r\ncontent-length: 99999999999\r\n\r\nxx"])
    try:
        client = HTTPClient(url, max_response=1 << 20)
        with pytest.raises(Unavailable, match="larger than"):
            await client.call("memory/describe", {}, timeout=5)
    finally:
        server.close()


async def test_a_reply_past_the_tiers_max_response_leaves_it_out_and_the_key_is_read(tmp_path: Any) -> None:
    from router.config import load

    tiers = {name: await ScriptedTier(name, kind).start() for name, kind in (("working", "working"),
                                                                             ("episodic", "episodic"))}
    path = tmp_path / "router.toml"
    path.write_text(f'[[tiers]]\nname = "working"\nkind = "working"\nurl = "{tiers["working"].url}"\n'
                    f'[[tiers]]\nname = "episodic"\nkind = "episodic"\nurl = "{tiers["episodic"].url}"\n'
                    f'max_response = 100000\n')
    router = Router(load(str(path)))
    await router.startup()
    try:
        fed = Fed(router, tiers)
        [rid] = (await fed("memory/remember", {"records": [{"content": "milan, small"}]}))["ids"]
        await fed("memory/remember", {"records": [{"content": "milan " * 30000, "tier": "episodic"}]})
        got = await fed("memory/recall", {"query": "milan"})
        assert [r["id"] for r in got["records"]] == [rid] and got["degraded"] == ["episodic"]
    finally:
        await router.shutdown()
        for tier in tiers.values():
            await tier.stop()
    path.write_text(path.read_text().replace("100000", "0"))
    with pytest.raises(Exception, match="max_response"):
        load(str(path))


async def test_a_fetch_answered_with_another_keys_record_leaves_that_tier_out(fed: Fed) -> None:
    await fed("memory/remember", {"records": [{"content": "Rome", "key": "city", "tier": "semantic"}]})
    fed.tiers["episodic"].twist = on("memory/fetch", {"record": {**GOOD, "key": "pet", "revision": 9}})
    got = await fed("memory/fetch", {"key": "city"})
    assert got["record"]["content"] == "Rome" and got["degraded"] == ["episodic"]


def ignoring_where(tier: ScriptedTier, method: str = "memory/timeline"):  # type: ignore[no-untyped-def]
    """`method` answered with every record of the owner, whatever `where` asked for."""
    def twist(m: str, params: dict[str, Any], response: dict[str, Any]) -> Any:
        if m != method or "where" not in params or "result" not in response:
            return None
        every = [record.to_wire(embeddings=bool(params.get("embeddings")))
                 for _, record in sorted(tier.server.store.records.values(), key=lambda p: p[0])
                 if record.owner == params.get("owner")]
        return with_result(response, {"records": every})
    return twist


async def test_a_working_tier_that_ignores_where_spills_and_flushes_only_the_sessions_own(fed: Fed) -> None:
    other = (await fed("memory/remember", {"records": [
        {"content": f"s2 turn {i}", "session": "s2"} for i in range(3)]}))["ids"]
    fed.tiers["working"].twist = ignoring_where(fed.tiers["working"])
    mine = (await fed("memory/remember", {"records": [
        {"content": f"s1 turn {i}", "session": "s1"} for i in range(2)]}))["ids"]
    assert await fed.held("working") == set(other + mine)  # s1 holds 2 of a capacity of 3: nothing spills
    await fed("memory/session/close", {"session": "s1"})
    assert await fed.held("working") == set(other) and await fed.held("episodic") == set(mine)


async def test_a_recall_count_answered_with_other_records_promotes_only_what_was_recalled(fed: Fed) -> None:
    # episodic promotes into semantic after 1 recall here; its count call answers with every record
    fed.router.fed["episodic"].config = TierConfig("episodic", fed.tiers["episodic"].url, kind="episodic",
                                                   promote_to="semantic", promote_after=1, timeout=1.0)
    recalled_before = {"access_count": 5, "accessed_at": "2026-01-01T00:00:00.000Z"}
    ids = (await fed("memory/remember", {"records": [
        {"content": "milan", "tier": "episodic"},
        {"content": "unrelated words", "tier": "episodic", **recalled_before}]}))["ids"]
    fed.tiers["episodic"].twist = ignoring_where(fed.tiers["episodic"], "memory/recall")
    got = await fed("memory/recall", {"query": "milan", "tier": "episodic", "limit": 1})
    assert [r["id"] for r in got["records"]] == [ids[0]]
    fed.tiers["episodic"].twist = None
    await fed("memory/consolidate", {})
    assert await fed.held("semantic") == {ids[0]} and await fed.held("episodic") == {ids[1]}


async def test_a_recalled_vector_that_is_not_numbers_is_left_out_of_the_rerank(fed: Fed) -> None:
    [rid] = (await fed("memory/remember", {"records": [
        {"content": "milan", "tier": "semantic", "embedding": [1.0, 0.0]}]}))["ids"]
    fed.tiers["episodic"].twist = on("memory/recall", {"records": [
        {**GOOD, "embedding": ["a", "b"]}, {**GOOD, "id": "x2", "embedding": [[1.0], [0.0]]}]})
    got = await fed("memory/recall", {"query": "milan", "embedding": [1.0, 0.0], "fusion": "rerank"})
    assert rid in [r["id"] for r in got["records"]]


def _deep(levels: int) -> str:
    """JSON nested `levels` deep, as a server not on orjson (which stops at 254) may send it."""
    return '{"a":' * levels + "1" + "}" * levels


@pytest.mark.parametrize("field", ['"metadata": ' + _deep(300), '"extension": [' + _deep(300) + "]",
                                   '"access_count": 9223372036854775808', '"embedding": [[0.1], [0.2]]'],
                         ids=["deep metadata", "deep unknown field", "count past 2**63", "nested embedding"])
async def test_a_record_the_router_could_not_encode_leaves_its_tier_out(fed: Fed, field: str) -> None:
    rid = await seed(fed)
    good = '"id": "x1", "content": "c", "created_at": "2026-01-01T00:00:00.000Z"'

    def twist(m: str, p: dict[str, Any], r: dict[str, Any]) -> Any:
        if m != "memory/timeline":
            return None
        body = '{"jsonrpc": "2.0", "id": %d, "result": {"records": [{%s, %s}]}}' % (r["id"], good, field)
        return http_response(body.encode())

    fed.tiers["episodic"].twist = twist
    got = await fed("memory/timeline", {"embeddings": True})
    assert [r["id"] for r in got["records"]] == [rid] and got["degraded"] == ["episodic"]


async def test_counts_past_what_json_carries_are_malformed(fed: Fed) -> None:
    rid = await seed(fed)
    for name in ("working", "episodic"):
        fed.tiers[name].twist = on("memory/forget", {"forgotten": 2**63})
    with pytest.raises(A2MError) as caught:
        await fed("memory/forget", {"ids": [rid]})
    assert caught.value.code == -32603 and "working" in caught.value.message


async def test_a_malformed_reply_is_logged_once_until_the_tier_answers_well(fed: Fed, caplog: Any) -> None:
    await seed(fed)
    fed.tiers["episodic"].twist = on("memory/recall", {"records": [{"id": 5}]})
    with caplog.at_level("WARNING", logger="a2m.router"):
        for _ in range(3):
            assert (await fed("memory/recall", {"query": "milan"}))["degraded"] == ["episodic"]
        fed.tiers["episodic"].twist = None
        assert "degraded" not in await fed("memory/recall", {"query": "milan"})
        fed.tiers["episodic"].twist = on("memory/recall", {"records": [{"id": 5}]})
        await fed("memory/recall", {"query": "milan"})
    told = [r.getMessage() for r in caplog.records if "malformed" in r.getMessage()]
    assert told == ["tier episodic answered memory/recall with a malformed reply: records[0].id is not a string"] * 2


async def test_a_timeline_answered_newest_first_is_read_in_order(tmp_path: Any) -> None:
    """A tier whose timeline comes newest first (the protocol says ascending): paging a scope read
    the same records again and again, and a capacity pass counted them twice and spilled too many."""
    tier = await ScriptedTier("episodic", "episodic").start()
    dest = await ScriptedTier("semantic", "semantic").start()
    page = 3

    def twist(m: str, params: dict[str, Any], response: dict[str, Any]) -> Any:
        if m == "memory/describe":
            return with_result(response, {**response["result"], "limits": {"max_recall_limit": page}})
        if m == "memory/timeline" and "result" in response:
            return with_result(response, {"records": response["result"]["records"][::-1]})
        return None

    tier.twist = twist
    config = RouterConfig(tiers=(
        TierConfig("episodic", tier.url, kind="episodic", capacity=5, spill_to="semantic", timeout=1.0),
        TierConfig("semantic", dest.url, kind="semantic", timeout=1.0)), default_tier="episodic",
        background_promotion=False)
    router = Router(config)
    await router.startup()
    try:
        fed = Fed(router, {"episodic": tier, "semantic": dest})
        for i in range(8):
            await fed("memory/remember", {"records": [{"content": f"r{i}", "tier": "episodic"}]})
            await asyncio.sleep(0.003)
        assert len(await fed.held("episodic")) == 5 and len(await fed.held("semantic")) == 3
    finally:
        await router.shutdown()
        await tier.stop()
        await dest.stop()


async def test_paging_a_tier_that_ignores_before_stops_instead_of_reading_forever() -> None:
    """A server without the after/before extension ignores them (unknown params are ignored, §1).
    With no max_recall_limit, a scope scan (capacity, flush, repair, export) read its newest page
    and its whole store again and again, forever, holding the owner's lock and growing."""
    from a2m.paging import CrowdedMillisecond, pages_backwards

    store = [{"id": f"r{i}", "content": "", "created_at": f"2026-01-01T00:00:{i:02d}.000Z"} for i in range(10)]
    calls = 0

    async def call(method: str, params: dict[str, Any]) -> dict[str, Any]:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0)  # a real call yields: the timeout below bounds the test before the fix
        limit = params.get("limit") or 0
        return {"records": store[-limit:] if limit else list(store)}

    read: list[str] = []
    with pytest.raises(CrowdedMillisecond, match="ignores"):
        async with asyncio.timeout(2):
            async for page in pages_backwards(call, {}, page=3, cap=None):
                read += [r["id"] for r in page]
    assert calls <= 3 and len(read) == len(set(read))


def engine_error(method: str, *, only: str | None = None):  # type: ignore[no-untyped-def]
    """A twist: `method` answered as backends.surface answers it when its engine fails the call."""
    def twist(m: str, params: dict[str, Any], response: dict[str, Any]) -> Any:
        if m != method:
            return None
        return {"jsonrpc": "2.0", "id": response["id"], "error": {
            "code": -32603, "message": "tier episodic (postgresql) unavailable: canceling statement due to "
                                       "statement timeout", "data": {"tier": "episodic", "engine": "postgresql"}}}
    return twist


async def test_one_recall_failed_by_its_engine_does_not_take_the_tier_away(fed: Fed) -> None:
    """An engine error on one call (a statement timeout, a busy pool) is that call's failure: the tier
    stays up for every other caller. Marked down, one slow query would leave episodic out of every
    owner's reads for the backoff. The next health check asks it (a describe), and it is up."""
    rid = await seed(fed)
    fed.tiers["episodic"].twist = engine_error("memory/recall")
    got = await fed("memory/recall", {"query": "milan"})
    assert [r["id"] for r in got["records"]] == [rid] and got["degraded"] == ["episodic"]
    tier = fed.router.fed["episodic"]
    assert tier.healthy and tier.unheard(5.0)  # due a health check at once
    assert await fed.router.ready() and tier.healthy and not tier.unheard(5.0)


async def test_a_call_failed_by_its_engine_is_counted_unavailable(fed: Fed) -> None:
    """a2m_router_tier_calls_total counts an answer that the tier's engine is down as `unavailable`
    (docs/operations.md), whatever the call: the tier stays up for a recall (decision 115), but an
    alert on the unavailable rate must see an engine outage before any health check does."""
    await seed(fed)
    fed.tiers["episodic"].twist = engine_error("memory/recall")
    seen: list[tuple[str, str]] = []
    fed.router.fed["episodic"].observe = lambda tier, method, seconds, outcome: seen.append((method, outcome))
    await fed("memory/recall", {"query": "milan"})
    assert ("memory/recall", "unavailable") in seen and ("memory/recall", "error") not in seen, seen


async def test_a_health_check_answered_engine_down_marks_the_tier_down(fed: Fed) -> None:
    """Its describe (which counts its records) failing on the engine: the tier serves nothing, as surely
    as one that does not answer, though its HTTP server is up."""
    fed.tiers["episodic"].twist = engine_error("memory/describe")
    fed.router.fed["episodic"].heard_at = 0.0  # silent for long: the next check asks it
    await fed.router.ready()
    assert not fed.router.fed["episodic"].healthy
    fed.tiers["episodic"].twist = None
    got = await fed("memory/recall", {"query": "milan"})
    assert got["degraded"] == ["episodic"]  # skipped during the backoff, not waited on


async def test_describe_shows_no_caller_data_from_a_malformed_reply(fed: Fed) -> None:
    """What describe says of a failing tier any token holder reads; a malformed reply's detail can
    quote a caller's id or key (decision 113 keeps an engine's words out the same way)."""
    await seed(fed)
    secret = {**GOOD, "id": "alices-secret-id"}
    fed.tiers["episodic"].twist = on("memory/recall", {"records": [secret, secret]})
    assert (await fed("memory/recall", {"query": "milan"}))["degraded"] == ["episodic"]

    def refuse(m: str, p: dict[str, Any], r: dict[str, Any]) -> Any:
        if m != "memory/describe":
            return None
        return http_response(b'{"jsonrpc": "2.0", "id": %d, "error": {"code": -32000, "message": "no"}}' % r["id"])

    fed.tiers["episodic"].twist = refuse
    got = await fed("memory/describe", {})
    [entry] = [t for t in got["tiers"] if t["name"] == "episodic"]
    assert entry["status"] == "down" and "malformed" in entry["error"], entry
    assert "alices-secret-id" not in str(got), entry
