"""The router with an embedder configured: the query is embedded once per recall and the vector goes
only to tiers whose describe says `embeddings.searched: true`; records that enter a searched tier
(written there, or spilled into it) are embedded; a caller vector of the wrong width is -32008.

The embedder is `a2m.embedder.HTTPEmbedder` (the router's `embedder = "http://..."`) against a
small OpenAI-compatible `/v1/embeddings` server run here on loopback, which hashes a bag of words
into a fixed-width vector: a stand-in for a model, so the vectors are known exactly. Between the
router and each tier sits a forwarding proxy that records the JSON-RPC requests, so what each tier
was sent is read off the wire. The working tier is the real Redis-backed server (it does not search
vectors); episodic and semantic are the in-memory fixture servers (they do).
"""

from __future__ import annotations

import http.client
import json
import math
import re
import shutil
import tempfile
import threading
import zlib
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import pytest

from a2m.client import HTTPClient
from a2m.errors import A2MError
from tests.support.procs import PYTHON, free_port

from .stack import Proc, tier_command, write_config

DIMS = 16
CAPACITY = 4
MAX_INPUT = 2000  # characters the stand-in model takes; a batch holding a longer text is refused (400)


def hashed(text: str) -> list[float]:
    vector = [0.0] * DIMS
    for word in re.findall(r"[a-z0-9]+", text.lower()):
        vector[zlib.crc32(word.encode()) % DIMS] += 1.0
    norm = math.sqrt(sum(x * x for x in vector)) or 1.0
    return [x / norm for x in vector]


class _Quiet(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def _body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("content-length") or 0))

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class Embeddings(ThreadingHTTPServer):
    """POST /v1/embeddings {"model", "input": [...]} -> {"data": [{"index", "embedding"}]}."""

    daemon_threads = True

    def __init__(self) -> None:
        self.inputs: list[list[str]] = []
        outer = self

        class Handler(_Quiet):
            def do_POST(self) -> None:  # noqa: N802
                request = json.loads(self._body())
                texts = request["input"] if isinstance(request["input"], list) else [request["input"]]
                outer.inputs.append(texts)
                if any(len(t) > MAX_INPUT for t in texts):  # as a model with a token limit answers
                    self._send(400, b'{"error": {"message": "input too long"}}')
                    return
                data = [{"object": "embedding", "index": i, "embedding": hashed(t)} for i, t in enumerate(texts)]
                self._send(200, json.dumps({"object": "list", "data": data, "model": request["model"]}).encode())

        super().__init__(("127.0.0.1", 0), Handler)


class Recorder(ThreadingHTTPServer):
    """Forwards every request to `target` and keeps the JSON-RPC requests it carried."""

    daemon_threads = True

    def __init__(self, target_port: int) -> None:
        self.calls: list[dict[str, Any]] = []
        outer = self

        class Handler(_Quiet):
            def do_GET(self) -> None:  # noqa: N802  (/readyz)
                self._forward("GET", b"")

            def do_POST(self) -> None:  # noqa: N802
                body = self._body()
                outer.calls.append(json.loads(body))
                self._forward("POST", body)

            def _forward(self, method: str, body: bytes) -> None:
                upstream = http.client.HTTPConnection("127.0.0.1", target_port, timeout=30)
                try:
                    upstream.request(method, self.path, body=body or None,
                                     headers={"content-type": "application/json"})
                    reply = upstream.getresponse()
                    self._send(reply.status, reply.read())
                finally:
                    upstream.close()

        super().__init__(("127.0.0.1", 0), Handler)

    def sent(self, method: str) -> list[dict[str, Any]]:
        return [c["params"] for c in self.calls if c.get("method") == method]


@contextmanager
def serving(server: ThreadingHTTPServer) -> Iterator[ThreadingHTTPServer]:
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


TIERS = [
    {"name": "working", "kind": "working", "capacity": CAPACITY, "spill_to": "episodic", "serve": "real"},
    {"name": "episodic", "kind": "episodic", "spill_to": "semantic", "serve": "fixture"},
    {"name": "semantic", "kind": "semantic", "serve": "fixture"},
]


class Fed:
    def __init__(self, url: str, tiers: dict[str, Proc], proxies: dict[str, Recorder], embedder: Embeddings) -> None:
        self.url, self.tiers, self.proxies, self.embedder = url, tiers, proxies, embedder

    def clear(self) -> None:
        self.embedder.inputs.clear()
        for proxy in self.proxies.values():
            proxy.calls.clear()


@contextmanager
def launched(tiers: list[dict[str, Any]], logs: Path) -> Iterator[tuple[dict[str, Proc], list[Proc]]]:
    """`tiers`' servers, started and ready, and the list of what was started: what the caller starts
    after them (the router) joins it, and all of it is stopped in reverse."""
    data = Path(tempfile.mkdtemp(prefix="a2m-", dir="/tmp"))  # short: redis puts its socket here
    procs = {t["name"]: Proc(t["name"], tier_command(t, port := free_port(), "real", data), port,
                             log=logs / f"{t['name']}.log") for t in tiers}
    started: list[Proc] = []
    try:
        for proc in procs.values():
            started.append(proc.start())
        for proc in procs.values():
            proc.wait()
        yield procs, started
    finally:
        for proc in reversed(started):
            proc.stop()
        shutil.rmtree(data, ignore_errors=True)


def router_over(config: Path, logs: Path, started: list[Proc]) -> Proc:
    router = Proc("router", [PYTHON, "-m", "a2mctl.cli", "serve", "router", "--config", str(config),
                             "--port", str(port := free_port())], port, log=logs / "router.log")
    started.append(router.start())
    router.wait()
    return router


def embedder_table(embedder: Embeddings) -> dict[str, str]:
    return {"url": f"http://127.0.0.1:{embedder.server_address[1]}/v1", "model": "hashed-bow"}


@pytest.fixture(scope="module")
def fed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fed]:
    tmp = tmp_path_factory.mktemp("router-embedder")
    with serving(Embeddings()) as embedder, launched(TIERS, tmp) as (procs, started):
        with serving(Recorder(procs["working"].port)) as pw, serving(Recorder(procs["episodic"].port)) as pe, \
                serving(Recorder(procs["semantic"].port)) as ps:
            proxies = {"working": pw, "episodic": pe, "semantic": ps}
            configured = [{**t, "url": f"http://127.0.0.1:{proxies[t['name']].server_address[1]}/"} for t in TIERS]
            config = write_config(tmp / "router.toml", configured, {
                "background_promotion": False, "embedder": embedder_table(embedder)})
            yield Fed(router_over(config, tmp, started).url, procs, proxies, embedder)


@pytest.mark.anyio
async def test_each_tier_describes_whether_it_searches_vectors(fed: Fed) -> None:
    searched = {}
    for name, proc in fed.tiers.items():
        async with HTTPClient(proc.url) as tier:
            searched[name] = ((await tier.call("memory/describe", {})).get("embeddings") or {}).get("searched", False)
    assert searched == {"working": False, "episodic": True, "semantic": True}


@pytest.mark.anyio
async def test_the_query_is_embedded_once_and_sent_only_to_searched_tiers(fed: Fed) -> None:
    async with HTTPClient(fed.url) as router:
        await router.call("memory/remember", {"owner": "q", "records": [
            {"content": "the blue kettle is broken", "tier": "episodic"},
            {"content": "kettle descaling every month", "tier": "semantic"},
            {"content": "I just bought a kettle", "session": "s"}]})
        await router.call("memory/recall", {"owner": "q", "query": "warm up"})  # any first-use probes
        for strategy in ("rrf", "rerank"):
            fed.clear()
            hits = (await router.call("memory/recall", {"owner": "q", "query": "kettle", "fusion": strategy}))["records"]
            assert {h["tier"] for h in hits} == {"working", "episodic", "semantic"}
            assert fed.embedder.inputs == [["kettle"]], strategy  # one embedder call, one text
            for name, proxy in fed.proxies.items():
                asked = [p for p in proxy.sent("memory/recall") if p.get("query") == "kettle"]
                assert len(asked) == 1, (name, proxy.calls)
                if name == "working":
                    assert "embedding" not in asked[0]
                else:
                    assert asked[0]["embedding"] == pytest.approx(hashed("kettle"))
        # A caller's own vector is not re-embedded, and goes to the searched tiers as given.
        fed.clear()
        mine = hashed("descaling")
        await router.call("memory/recall", {"owner": "q", "query": "kettle", "embedding": mine})
        assert fed.embedder.inputs == []
        assert fed.proxies["semantic"].sent("memory/recall")[0]["embedding"] == pytest.approx(mine)
        assert "embedding" not in fed.proxies["working"].sent("memory/recall")[0]


@pytest.mark.anyio
async def test_records_entering_a_searched_tier_are_embedded_on_write_and_on_spill(fed: Fed) -> None:
    async with HTTPClient(fed.url) as router:
        fed.clear()
        direct = (await router.call("memory/remember", {"owner": "w", "records": [
            {"content": "notes about the quarterly plan", "tier": "episodic"}]}))["ids"]
        fed.clear()
        turns = [f"turn {i} about sailing to Corsica" for i in range(CAPACITY + 3)]
        ids = []
        for text in turns:
            ids += (await router.call("memory/remember", {"owner": "w", "records": [
                {"content": text, "session": "trip"}]}))["ids"]
        # Writes into working (not searched) are sent without vectors ...
        assert all("embedding" not in r for p in fed.proxies["working"].sent("memory/remember") for r in p["records"])
        # ... and the spilled ones arrive in episodic with the embedder's vector of their content.
        spilled = [r for p in fed.proxies["episodic"].sent("memory/remember") for r in p["records"]]
        assert [r["id"] for r in spilled] == ids[:3]
        assert all(r["embedding"] == pytest.approx(hashed(r["content"])) for r in spilled)
        closed = await router.call("memory/session/close", {"owner": "w", "session": "trip"})
        assert closed["flushed"] == CAPACITY
    async with HTTPClient(fed.tiers["episodic"].url) as episodic:
        held = (await episodic.call("memory/timeline", {"owner": "w", "limit": 0, "embeddings": True}))["records"]
    by_id = {r["id"]: r for r in held}
    assert set(by_id) == set(ids) | set(direct)
    for record in held:
        assert record["embedding"] == pytest.approx(hashed(record["content"])), record["content"]
    async with HTTPClient(fed.tiers["working"].url) as working:
        assert (await working.call("memory/timeline", {"owner": "w", "limit": 0}))["records"] == []


@pytest.mark.anyio
async def test_a_text_the_model_refuses_goes_without_a_vector_and_the_rest_of_its_batch_is_embedded(fed: Fed) -> None:
    """The endpoint refuses a whole batch for one text too long (400); that text alone is written
    without a vector (it was the whole batch's vectors, and nothing embeds a stored record again)."""
    texts = [f"note {i} about the harbour" for i in range(5)]
    texts[3] = "a very long tool output " * 200
    async with HTTPClient(fed.url) as router:
        fed.clear()
        ids = (await router.call("memory/remember", {"owner": "long", "records": [
            {"content": t, "tier": "episodic"} for t in texts]}))["ids"]
    (sent,) = fed.proxies["episodic"].sent("memory/remember")
    assert [("embedding" in r) for r in sent["records"]] == [True, True, True, False, True]
    assert [r["id"] for r in sent["records"]] == ids
    assert all(r["embedding"] == pytest.approx(hashed(r["content"])) for r in sent["records"] if "embedding" in r)
    assert len(fed.embedder.inputs) <= 2 * len(texts)  # halves, not one request per text and per retry


@pytest.mark.anyio
async def test_a_caller_vector_of_the_wrong_width_is_refused(fed: Fed) -> None:
    async with HTTPClient(fed.url) as router:
        fed.clear()
        for method, params in [
            ("memory/remember", {"records": [{"content": "x", "embedding": [0.1] * (DIMS + 1)}]}),
            ("memory/remember", {"records": [{"content": "x", "tier": "episodic", "embedding": [0.1] * 3}]}),
            ("memory/recall", {"query": "x", "embedding": [0.1] * (DIMS - 1)}),
        ]:
            with pytest.raises(A2MError) as err:
                await router.call(method, {"owner": "v", **params})
            assert err.value.code == -32008, (method, err.value)
            assert err.value.data["expected"] == DIMS
        assert not any(p.sent("memory/remember") for p in fed.proxies.values())  # refused before any tier
        ok = await router.call("memory/remember", {"owner": "v", "records": [
            {"content": "right width", "tier": "episodic", "embedding": hashed("right width")}]})
        assert len(ok["ids"]) == 1
        described = await router.call("memory/describe", {})
        assert described["embeddings"]["dimensions"] == DIMS and described["embeddings"]["model"] == "hashed-bow"


@pytest.mark.anyio
async def test_a_tier_holding_vectors_of_another_width_is_recalled_by_its_text(tmp_path: Path) -> None:
    """A mounted corpus embedded by another model (4-dim; the router's embedder makes 16): every recall
    with a query failed whole with -32008, working memory's records included. That tier is now asked
    the query alone and ranks by text, and a recall by vector alone leaves it out."""
    tiers = [{"name": "working", "kind": "working", "serve": "real"},
             {"name": "corpus", "kind": "semantic", "serve": "fixture"}]
    with serving(Embeddings()) as embedder, launched(tiers, tmp_path) as (procs, started):
        async with HTTPClient(procs["corpus"].url) as corpus:
            await corpus.call("memory/remember", {"records": [
                {"content": "the kettle manual, page four", "embedding": [1.0, 0.0, 0.0, 0.0]}]})
        config = write_config(tmp_path / "router.toml", [{**t, "url": procs[t["name"]].url} for t in tiers],
                              {"embedder": embedder_table(embedder)})
        async with HTTPClient(router_over(config, tmp_path, started).url) as client:
            await client.call("memory/remember", {"records": [{"content": "I just bought a kettle", "session": "s"}]})
            answer = await client.call("memory/recall", {"query": "kettle"})
            assert sorted(r["tier"] for r in answer["records"]) == ["corpus", "working"], answer
            assert "degraded" not in answer
            assert (await client.call("memory/recall", {"embedding": hashed("kettle")}))["records"] == []
            with pytest.raises(A2MError) as refused:  # named with a vector of the caller's: its own answer
                await client.call("memory/recall", {"embedding": hashed("kettle"), "tier": "corpus"})
            assert refused.value.code == -32008


@pytest.mark.anyio
async def test_a_write_into_a_tier_of_another_width_is_kept_without_the_routers_vectors(tmp_path: Path) -> None:
    """The router's embedder making 16-dim vectors for a tier that holds 4-dim ones (its model was
    changed, say) failed the caller's write with -32008, and every spill into that tier likewise: a
    fault that was not the caller's. Those records are written without vectors, found by text."""
    tiers = [{"name": "working", "kind": "working", "capacity": 1, "spill_to": "notes", "serve": "real"},
             {"name": "notes", "kind": "semantic", "serve": "fixture"}]
    with serving(Embeddings()) as embedder, launched(tiers, tmp_path) as (procs, started):
        async with HTTPClient(procs["notes"].url) as notes:
            await notes.call("memory/remember", {"records": [
                {"content": "the kettle manual, page four", "embedding": [1.0, 0.0, 0.0, 0.0]}]})
        config = write_config(tmp_path / "router.toml", [{**t, "url": procs[t["name"]].url} for t in tiers],
                              {"embedder": embedder_table(embedder), "background_promotion": False})
        async with HTTPClient(router_over(config, tmp_path, started).url) as client:
            await client.call("memory/remember", {"records": [{"content": "the toaster manual", "tier": "notes"}]})
            for n in range(3):  # over working's capacity: the older ones spill into notes
                await client.call("memory/remember", {"records": [{"content": f"toaster note {n}", "session": "s"}]})
            await client.call("memory/consolidate", {})
        async with HTTPClient(procs["notes"].url) as notes:
            held = await notes.call("memory/recall", {"query": "toaster", "embeddings": True, "limit": 10})
    assert sorted(r["content"] for r in held["records"]) == ["the toaster manual", "toaster note 0", "toaster note 1"]
    assert all(r.get("embedding") is None for r in held["records"])
