import pytest

from a2m.dispatch import Context, Dispatcher
from backends.surface import TierServer
from tests.support.memstore import MemoryStore


def dispatcher(caps: frozenset[str]) -> Dispatcher:
    return Dispatcher(TierServer(MemoryStore(), name="m", kind="episodic", capabilities=caps))


@pytest.mark.anyio
@pytest.mark.parametrize("id_", ["abc", 7, 7.5, None, "0"])
async def test_id_is_echoed_exactly(id_: object) -> None:
    reply = await dispatcher(frozenset({"core"})).handle({"jsonrpc": "2.0", "id": id_, "method": "memory/describe"},
                                                         Context())
    assert reply is not None and reply["id"] == id_ and type(reply["id"]) is type(id_)


@pytest.mark.anyio
@pytest.mark.parametrize("protocol, code", [(None, None), ("a2m/0.1", None), ("a2m/0.2", -32007), (1, -32602),
                                            (["a2m/0.1"], -32602)])
async def test_describe_reads_a_null_protocol_as_absent(protocol: object, code: int | None) -> None:
    """null is "not given" for every param; only a version this server cannot speak is -32007, a
    protocol that is not a string is a malformed param (-32602), as every other param's wrong type is."""
    reply = await dispatcher(frozenset({"core"})).handle(
        {"jsonrpc": "2.0", "id": 1, "method": "memory/describe", "params": {"protocol": protocol}}, Context())
    assert reply.get("error", {}).get("code") == code and (code is not None or reply["result"]["protocol"] == "a2m/0.1")


@pytest.mark.anyio
async def test_gating_and_unknown_names() -> None:
    d = dispatcher(frozenset({"core"}))
    for method in ("memory/fetch", "memory/session/close", "memory/events/subscribe", "memory/summarize"):
        reply = await d.handle({"jsonrpc": "2.0", "id": 1, "method": method, "params": {}}, Context())
        assert reply["error"]["code"] == -32003, method
    reply = await d.handle({"jsonrpc": "2.0", "id": 1, "method": "memory/nope"}, Context())
    assert reply["error"]["code"] == -32601
    describe = (await d.handle({"jsonrpc": "2.0", "id": 1, "method": "memory/describe"}, Context()))["result"]
    assert describe["capabilities"] == ["core"] and "memory/fetch" not in describe["methods"]


@pytest.mark.anyio
@pytest.mark.parametrize("message, code", [
    ([], -32600), ([{"jsonrpc": "2.0", "id": 1, "method": "memory/describe"}], -32600), ("x", -32600),
    ({"jsonrpc": "1.0", "id": 1, "method": "memory/describe"}, -32600), ({"jsonrpc": "2.0", "id": 1}, -32600),
    ({"jsonrpc": "2.0", "id": {"x": 1}, "method": "memory/describe"}, -32600),
    ({"jsonrpc": "2.0", "id": 1, "method": "memory/recall", "params": [1, 2]}, -32602),
])
async def test_invalid_envelopes(message: object, code: int) -> None:
    reply = await dispatcher(frozenset({"core"})).handle(message, Context())
    assert reply["error"]["code"] == code


@pytest.mark.anyio
async def test_parse_error_bytes() -> None:
    import orjson

    reply = orjson.loads(await dispatcher(frozenset({"core"})).handle_bytes(b"{nope", Context()))
    assert reply["error"]["code"] == -32700 and reply["id"] is None


def test_unknown_capability_is_a_programming_error() -> None:
    with pytest.raises(ValueError):
        dispatcher(frozenset({"core", "telepathy"}))


def deep(levels: int) -> object:
    value: object = 0
    for _ in range(levels):
        value = [value]
    return value


@pytest.mark.anyio
@pytest.mark.parametrize("result", [{"v": deep(300)}, {"v": object()}, {"v": {1: "non-string key"}}])
async def test_a_result_that_cannot_be_serialised_is_a_logged_internal_error(
        result: dict, caplog: pytest.LogCaptureFixture) -> None:
    import orjson

    async def odd(params: dict, ctx: Context) -> dict:
        return result

    d = Dispatcher(TierServer(MemoryStore(), name="m", kind="episodic", capabilities=frozenset({"core"}),
                              extensions={"x/odd": odd}))
    body = await d.handle_bytes(b'{"jsonrpc": "2.0", "id": "q-1", "method": "x/odd"}', Context())
    assert body is not None
    reply = orjson.loads(body)
    assert reply["id"] == "q-1" and reply["error"]["code"] == -32603 and "result" not in reply
    assert any(r.levelname == "ERROR" and "x/odd" in r.getMessage() for r in caplog.records)
    assert await d.handle_bytes(b'{"jsonrpc": "2.0", "method": "x/odd"}', Context()) is None  # a notification
