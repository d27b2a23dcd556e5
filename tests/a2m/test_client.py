"""The async client against real server processes: results, error codes, notifications, unreachable servers."""

from __future__ import annotations

import asyncio

import pytest

from a2m.client import HTTPClient, StdioClient, Unavailable, connect
from a2m.errors import A2MError
from tests.support.procs import fixture_server_command, free_port, http_server


@pytest.mark.anyio
async def test_http_client_calls_and_surfaces_codes() -> None:
    port = free_port()
    with http_server(fixture_server_command("--port", str(port)), port) as url:
        async with HTTPClient(url) as client:
            ids = (await client.call("memory/remember", {"records": [{"content": "pooled keep-alive"}]}))["ids"]
            results = await asyncio.gather(*(client.call("memory/recall", {"query": "keep-alive"}) for _ in range(20)))
            assert all(r["records"][0]["id"] == ids[0] for r in results)
            with pytest.raises(A2MError) as err:
                await client.call("memory/fetch", {})
            assert err.value.code == -32602 and not isinstance(err.value, Unavailable)


@pytest.mark.anyio
async def test_http_client_unreachable_is_unavailable() -> None:
    async with HTTPClient(f"http://127.0.0.1:{free_port()}/", timeout=2) as client:
        with pytest.raises(Unavailable) as err:
            await client.call("memory/describe")
        assert err.value.code == -32603


@pytest.mark.anyio
async def test_stdio_client_concurrent_calls_and_notifications() -> None:
    events: list[dict] = []
    client = connect(" ".join(fixture_server_command("--stdio")), on_notify=events.append)
    assert isinstance(client, StdioClient)
    async with client:
        await client.call("memory/events/subscribe", {})
        await asyncio.gather(*(client.call("memory/remember", {"records": [{"content": f"n{i}"}]}) for i in range(5)))
        await asyncio.sleep(0.2)
        assert len([e for e in events if e["params"]["kind"] == "written"]) == 5
        with pytest.raises(A2MError) as err:
            await client.call("memory/no_such")
        assert err.value.code == -32601
