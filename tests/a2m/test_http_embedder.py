"""`HTTPEmbedder` against a scripted OpenAI-compatible endpoint on loopback: an answer that cannot
be paired with its inputs is refused whole (the callers pair vectors with records by position),
and a rate limit or a busy service is asked again, a few times and briefly."""

from __future__ import annotations

import json
import logging
import threading
import time
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterator

import anyio
import pytest

from a2m.embedder import EmbedderError, HTTPEmbedder, InputRefused, make_embedder, try_embed
from tests.support.procs import free_port

pytestmark = pytest.mark.anyio

Reply = tuple[int, Any, dict[str, str]]  # status, JSON body, headers


def good(texts: list[str]) -> Reply:
    return 200, {"data": [{"index": i, "embedding": [float(len(t)), 1.0, 0.5]} for i, t in enumerate(texts)]}, {}


@contextmanager
def endpoint(replies: list[Callable[[list[str]], Reply]],
             requests: list[tuple[str, str | None]] | None = None) -> Iterator[tuple[list[list[str]], str]]:
    """Answer the n-th request with replies[n] (the last one from then on); yields (the inputs seen, its URL).

    As vLLM and OpenAI do, it serves only POST /v1/embeddings (404 elsewhere); each request's path
    and authorization header go to `requests` when one is given."""
    seen: list[list[str]] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:  # noqa: N802
            raw_body = self.rfile.read(int(self.headers["content-length"]))
            if requests is not None:
                requests.append((self.path, self.headers.get("authorization")))
            if self.path != "/v1/embeddings":
                self.send_response(404)
                self.send_header("content-length", "0")
                self.end_headers()
                return
            texts = json.loads(raw_body)["input"]
            seen.append(texts)
            status, body, headers = replies[min(len(seen), len(replies)) - 1](texts)
            raw = json.dumps(body).encode()
            self.send_response(status)
            for name, value in {"content-type": "application/json", **headers}.items():
                self.send_header(name, value)
            self.send_header("content-length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield seen, f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


async def test_vectors_come_back_in_input_order_whatever_order_the_endpoint_answers() -> None:
    def shuffled(texts: list[str]) -> Reply:
        status, body, headers = good(texts)
        return status, {"data": body["data"][::-1]}, headers

    with endpoint([shuffled]) as (seen, url):
        embedder = HTTPEmbedder(url, "m")
        assert await embedder.embed(["a", "bbb"]) == [[1.0, 1.0, 0.5], [3.0, 1.0, 0.5]]
        assert embedder.dimensions == 3


@pytest.mark.parametrize("answer", [
    lambda texts: {"data": good(texts)[1]["data"][:-1]},  # one short: zip would shift every vector after it
    lambda texts: {"data": [{"index": 0, "embedding": [1.0, 2.0, 3.0]}] * len(texts)},  # one index twice
    lambda texts: {"data": [{"index": i + 1, "embedding": [1.0, 2.0, 3.0]} for i in range(len(texts))]},
    lambda texts: {"data": [{"index": i, "embedding": [1.0, float("nan"), 3.0]} for i in range(len(texts))]},
    lambda texts: {"data": [{"index": i, "embedding": [1.0] * (3 + i)} for i in range(len(texts))]},
    lambda texts: {"data": [{"index": i, "embedding": "1,2,3"} for i in range(len(texts))]},
    lambda texts: {"data": [{"index": i, "embedding": [1.0] * 16_001} for i in range(len(texts))]},  # no tier keeps it
    lambda texts: {"error": "no data"},
    lambda texts: ["not", "an", "object"],
], ids=["short", "index-twice", "index-out-of-range", "nan", "widths-differ", "not-a-list", "too-wide", "no-data",
        "not-object"])
async def test_an_answer_that_cannot_be_paired_with_its_inputs_is_refused_whole(answer: Callable[..., Any]) -> None:
    with endpoint([lambda texts: (200, answer(texts), {})]) as (seen, url):
        embedder = HTTPEmbedder(url, "m")
        with pytest.raises(EmbedderError):
            await embedder.embed(["a", "bb", "ccc"])
        assert await try_embed(embedder, ["a", "bb", "ccc"]) is None  # the callers rank lexically


async def test_a_width_other_than_the_first_seen_is_refused() -> None:
    with endpoint([good, lambda texts: (200, {"data": [{"index": 0, "embedding": [1.0, 2.0]}]}, {})]) as (_, url):
        embedder = HTTPEmbedder(url, "m")
        await embedder.embed(["a"])
        with pytest.raises(EmbedderError, match="2 dimensions, earlier 3"):
            await embedder.embed(["b"])


async def test_a_rate_limit_or_a_busy_service_is_asked_again_then_answers() -> None:
    busy = lambda texts: (503, {"error": "busy"}, {})  # noqa: E731
    limited = lambda texts: (429, {"error": "slow down"}, {"retry-after": "0"})  # noqa: E731
    with endpoint([busy, limited, good]) as (seen, url):
        vectors = await HTTPEmbedder(url, "m", retry_wait=0.01).embed(["a", "bb"])
    assert vectors == [[1.0, 1.0, 0.5], [2.0, 1.0, 0.5]] and len(seen) == 3


async def test_retries_are_bounded_and_a_client_error_is_not_retried() -> None:
    with endpoint([lambda texts: (503, {"error": "down"}, {})]) as (seen, url):
        assert await try_embed(HTTPEmbedder(url, "m", retry_wait=0.01), ["a"]) is None
    assert len(seen) == 3  # the first ask and two more
    with endpoint([lambda texts: (401, {"error": "bad key"}, {})]) as (seen, url):
        assert await try_embed(HTTPEmbedder(url, "m", retry_wait=0.01), ["a", "b"]) is None
    assert len(seen) == 1
    too_long = lambda texts: (400, {"error": "input too long"}, {}) if any(len(t) > 10 for t in texts) \
        else good(texts)  # noqa: E731
    with endpoint([too_long]) as (seen, url):
        assert await try_embed(HTTPEmbedder(url, "m", retry_wait=0.01), ["x" * 50]) == [None]
    assert len(seen) == 2  # the text, once, and a one-character text: the refusal is of the text


async def test_an_endpoint_that_is_not_there_fails_after_its_retries() -> None:
    embedder = HTTPEmbedder(f"http://127.0.0.1:{free_port()}/v1", "m", retry_wait=0.01)
    assert await try_embed(embedder, ["a"]) is None


async def test_a_refused_text_alone_goes_without_a_vector() -> None:
    def limited(texts: list[str]) -> Reply:
        return (400, {"error": "too long"}, {}) if any(len(t) > 10 for t in texts) else good(texts)

    texts = ["a", "bb", "x" * 50, "ccc", "dddd", "y" * 40, "e"]
    with endpoint([limited]) as (seen, url):
        embedder = HTTPEmbedder(url, "m", retry_wait=0.01)
        with pytest.raises(InputRefused):
            await embedder.embed(texts)
        seen.clear()
        vectors = await try_embed(embedder, texts)
    assert vectors is not None
    assert [v is None for v in vectors] == [False, False, True, False, False, True, False]
    assert [v[0] for v in vectors if v is not None] == [1.0, 2.0, 3.0, 4.0, 1.0]
    assert len(seen) <= 2 * len(texts)  # halves, each refused batch asked once (a 400 is not retried)


@pytest.mark.parametrize("suffix", ["", "/", "/v1", "/v1/", "/v1/embeddings", "/v1/embeddings/"])
async def test_the_base_url_may_be_the_host_the_v1_base_or_the_endpoint_itself(suffix: str) -> None:
    """vLLM and Ollama are often given as http://host:port, and some paste the endpoint itself:
    each used to be posted to at <url>/embeddings, a 404 on every call (every record without a vector)."""
    requests: list[tuple[str, str | None]] = []
    with endpoint([good], requests) as (_, url):
        embedder = HTTPEmbedder(url.removesuffix("/v1") + suffix, "m")
        assert await try_embed(embedder, ["a"]) == [[1.0, 1.0, 0.5]]
    assert [path for path, _ in requests] == ["/v1/embeddings"]


async def test_the_api_key_goes_without_the_newline_a_secret_file_leaves_on_it(
        caplog: pytest.LogCaptureFixture) -> None:
    """A key read from a file or a Kubernetes secret often ends in a newline: httpx refused every
    request for it, and the warning logged on each call quoted the whole `Bearer <key>` header."""
    requests: list[tuple[str, str | None]] = []
    with endpoint([good], requests) as (_, url):
        assert await try_embed(HTTPEmbedder(url, "m", api_key=" sk-secret-123\n"), ["a"]) == [[1.0, 1.0, 0.5]]
        assert await try_embed(HTTPEmbedder(url, "m", api_key="\n"), ["a"]) == [[1.0, 1.0, 0.5]]
    assert [auth for _, auth in requests] == ["Bearer sk-secret-123", None]
    assert "sk-secret" not in caplog.text


async def test_a_key_no_header_can_carry_is_refused_at_start_without_showing_it() -> None:
    with pytest.raises(ValueError, match="A2M_EMBEDDER_KEY") as refused:
        make_embedder("http://127.0.0.1:9/v1", api_key="sk-sec\nret")
    assert "sk-sec" not in str(refused.value)


async def test_an_endpoint_that_takes_the_request_and_never_answers_holds_a_call_only_as_long_as_set(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A hung vLLM queue held each write and each recall for a fixed 30 s, a setting no one could change."""
    def hung(texts: list[str]) -> Reply:
        time.sleep(4)
        return good(texts)

    monkeypatch.setenv("A2M_EMBEDDER_TIMEOUT", "0.3")
    with endpoint([hung]) as (seen, url):
        embedder = make_embedder(url)
        with anyio.fail_after(3):
            assert await try_embed(embedder, ["a"]) is None  # ranked lexically, soon
    assert len(seen) == 1  # a timeout is not asked again: its time is spent


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "soon"])
def test_a_timeout_that_is_not_a_positive_number_of_seconds_is_refused_at_start(
        value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("A2M_EMBEDDER_TIMEOUT", value)
    with pytest.raises(ValueError, match="A2M_EMBEDDER_TIMEOUT"):
        make_embedder("http://127.0.0.1:9/v1")


async def test_an_outage_is_logged_when_it_starts_and_ends_and_retried_only_at_its_start(
        caplog: pytest.LogCaptureFixture) -> None:
    """A busy router logged three lines a write and a recall while the endpoint was down, and each
    call waited out both retries (1.25 s): the waits are for a blip, not for an outage."""
    state = {"up": False}

    def flaky(texts: list[str]) -> Reply:
        return good(texts) if state["up"] else (503, {"error": "down"}, {})

    caplog.set_level(logging.INFO, logger="a2m.embedder")
    with endpoint([flaky]) as (seen, url):
        embedder = HTTPEmbedder(url, "m", retry_wait=0.01, ask_every=0)
        for _ in range(5):
            assert await try_embed(embedder, ["a"]) is None
        assert len(seen) == 3 + 4  # the first call and its two retries, then one ask a call
        state["up"] = True
        assert await try_embed(embedder, ["a"]) == [[1.0, 1.0, 0.5]]
        assert await try_embed(embedder, ["a"]) == [[1.0, 1.0, 0.5]]
    lines = [r.getMessage() for r in caplog.records if r.name == "a2m.embedder" and r.levelno >= logging.INFO]
    assert len(lines) == 2, lines
    assert "failed" in lines[0] and "falling back to lexical ranking" in lines[0]
    assert "answers again" in lines[1] and "5 calls went without it" in lines[1]
    state["up"] = False
    with endpoint([flaky]) as (seen, url):  # a new outage retries again at its start
        assert await try_embed(HTTPEmbedder(url, "m", retry_wait=0.01), ["a"]) is None
        assert len(seen) == 3


async def test_a_batch_refused_for_its_size_is_learnt_so_later_calls_are_not_refused_again() -> None:
    """TEI refuses more than 32 inputs a request (413) by default: each call of more texts was
    refused and halved again, about three requests where one does."""
    def at_most_four(texts: list[str]) -> Reply:
        return (413, {"error": f"batch size {len(texts)} > maximum allowed batch size 4"}, {}) \
            if len(texts) > 4 else good(texts)

    texts = [chr(97 + i) * (i + 1) for i in range(20)]
    with endpoint([at_most_four]) as (seen, url):
        embedder = HTTPEmbedder(url, "m")
        first = await try_embed(embedder, texts)
        seen.clear()
        again = await try_embed(embedder, texts)
    assert first == again and again is not None and [v[0] for v in again if v] == [float(i + 1) for i in range(20)]
    # No request is refused any more; the size learnt is the larger half of the smallest batch refused
    # (5 -> 3), so one request or two more than the limit would allow, not three for each.
    assert all(len(batch) <= 4 for batch in seen) and len(seen) == 7


async def test_a_batch_refused_for_one_text_in_it_keeps_the_batch_size() -> None:
    def short_only(texts: list[str]) -> Reply:
        return (400, {"error": "too long"}, {}) if any(len(t) > 10 for t in texts) else good(texts)

    with endpoint([short_only]) as (_, url):
        embedder = HTTPEmbedder(url, "m")
        vectors = await try_embed(embedder, ["a", "b", "x" * 50, "c"])
    assert vectors is not None and vectors[2] is None and embedder.batch_size == 128


async def test_a_failed_batch_costs_only_its_own_and_later_texts_their_vectors() -> None:
    """A write or an import of more texts than one request takes (128) lost every vector of the
    call when one request failed, those already embedded included."""
    requests = [good, good, lambda texts: (401, {"error": "key revoked"}, {})]
    texts = [f"t{i}" for i in range(300)]
    with endpoint(requests) as (seen, url):
        vectors = await try_embed(HTTPEmbedder(url, "m", retry_wait=0.01), texts)
    assert [len(batch) for batch in seen] == [128, 128, 44]
    assert vectors is not None and len(vectors) == 300
    assert all(v is not None for v in vectors[:256]) and all(v is None for v in vectors[256:])


async def test_a_refused_text_has_only_its_own_batch_asked_again() -> None:
    def short_only(texts: list[str]) -> Reply:
        return (400, {"error": "too long"}, {}) if any(len(t) > 10 for t in texts) else good(texts)

    texts = ["a"] * 256 + ["x" * 50] + ["b"] * 43
    with endpoint([short_only]) as (seen, url):
        vectors = await try_embed(HTTPEmbedder(url, "m"), texts)
    assert vectors is not None and [i for i, v in enumerate(vectors) if v is None] == [256]
    assert sum(len(batch) for batch in seen[:2]) == 256 and all(len(batch) <= 44 for batch in seen[2:])


async def test_an_endpoint_that_hangs_holds_one_call_in_each_interval_not_every_call() -> None:
    """An endpoint that took requests and never answered held every write and recall for the whole
    timeout, one after another. Once it has failed, one call asks it each `ask_every` seconds; the
    calls between (at once or after) go without, at once."""
    state = {"hung": True}

    def hanging(texts: list[str]) -> Reply:
        if state["hung"]:
            time.sleep(2)
        return good(texts)

    with endpoint([hanging]) as (seen, url):
        embedder = HTTPEmbedder(url, "m", timeout=0.3, ask_every=0.6)
        assert await try_embed(embedder, ["a"]) is None  # waits its timeout: not known down yet
        with anyio.fail_after(0.25):
            for _ in range(3):
                assert await try_embed(embedder, ["a"]) is None
        assert len(seen) == 1
        await anyio.sleep(0.7)
        results: list[Any] = []

        async def recall() -> None:
            results.append(await try_embed(embedder, ["a"]))

        with anyio.fail_after(1.5):
            async with anyio.create_task_group() as tg:  # at once: one asks, the others do not wait for it
                for _ in range(4):
                    tg.start_soon(recall)
        assert results == [None] * 4 and len(seen) == 2
        state["hung"] = False
        await anyio.sleep(0.7)
        assert await try_embed(embedder, ["a"]) == [[1.0, 1.0, 0.5]]  # back: asked, answered
        assert await try_embed(embedder, ["a"]) == [[1.0, 1.0, 0.5]]


async def test_a_request_refused_whatever_it_holds_is_a_failure_not_one_refusal_a_text(
        caplog: pytest.LogCaptureFixture) -> None:
    """A gateway answering 400 for the request itself (LiteLLM for a model it does not know) had each
    batch split down to single texts: 2n - 1 requests and a warning for every record of every write."""
    caplog.set_level(logging.INFO, logger="a2m.embedder")
    with endpoint([lambda texts: (400, {"error": "Invalid model name passed in model=m"}, {})]) as (seen, url):
        embedder = HTTPEmbedder(url, "m")
        assert await try_embed(embedder, [f"t{i}" for i in range(16)]) is None
        assert await try_embed(embedder, [f"t{i}" for i in range(16)]) is None
    assert len(seen) == 4  # each call: its batch, then one one-character text
    lines = [r.getMessage() for r in caplog.records if r.name == "a2m.embedder" and r.levelno >= logging.WARNING]
    assert len(lines) == 1 and "refuses even a one-character text" in lines[0], lines


async def test_credentials_in_the_url_are_never_logged(caplog: pytest.LogCaptureFixture) -> None:
    """httpx's error for a non-2xx answer quotes the whole URL: a `user:password@` or a `?key=` in
    the embedder URL went into every warning of the outage. Messages name the URL without them,
    and a redirect (an http:// URL for an https:// service) says where to, since it is not followed."""
    with endpoint([lambda texts: (404, {"error": "no such model"}, {})]) as (_, url), \
            caplog.at_level(logging.DEBUG, logger="a2m.embedder"):
        port = url.split(":")[2].split("/")[0]
        embedder = HTTPEmbedder(f"http://someone:hunter2@127.0.0.1:{port}/v1?key=sk-secret", "m", retry_wait=0.01)
        assert await try_embed(embedder, ["hello"]) is None
    logged = caplog.text
    assert "HTTP 404" in logged and "127.0.0.1" in logged, logged
    assert "hunter2" not in logged and "sk-secret" not in logged and "someone" not in logged, logged
    with endpoint([lambda texts: (301, {}, {"location": "https://user:pw@example.org/v1/embeddings"})]) as (_, url):
        with pytest.raises(EmbedderError, match=r"redirects to https://\*\*\*@example.org/v1/embeddings") as moved:
            await HTTPEmbedder(url, "m", retry_wait=0.01).embed(["hello"])
    assert "pw" not in str(moved.value)


async def test_texts_refused_one_by_one_are_logged_once_a_call_and_at_most_each_minute(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """An import of texts too long for the model wrote one warning per text: a batch of 500 such texts,
    500 lines. One line a call now, with the count, and within a minute none, counted for the next."""
    from a2m import embedder as module

    def short_only(texts: list[str]) -> Reply:
        return (400, {"error": "too long"}, {}) if any(len(t) > 10 for t in texts) else good(texts)

    caplog.set_level(logging.INFO, logger="a2m.embedder")
    texts = ["x" * (20 + i) for i in range(40)] + ["a", "b"]
    with endpoint([short_only]) as (_, url):
        embedder = HTTPEmbedder(url, "m")
        vectors = await try_embed(embedder, texts)
        assert vectors is not None and sum(v is None for v in vectors) == 40
        assert await try_embed(embedder, ["y" * 30, "c"]) is not None  # within the minute: counted, not logged
        lines = [r.getMessage() for r in caplog.records if r.name == "a2m.embedder" and r.levelno >= logging.INFO]
        assert len(lines) == 1, lines
        assert "refused 40 of 42 texts (20 to 59 characters" in lines[0] and "too long" in lines[0], lines
        monkeypatch.setattr(module, "OUTAGE_LOG_EVERY_S", 0.0)  # a minute later
        await try_embed(embedder, ["z" * 30])
    lines = [r.getMessage() for r in caplog.records if r.name == "a2m.embedder" and r.levelno >= logging.INFO]
    assert len(lines) == 2 and "refused 1 of 1 texts (30 characters" in lines[1], lines
    assert "1 more refused in the last" in lines[1], lines


async def test_a_tier_server_closes_its_embedders_connections_as_it_stops() -> None:
    """The HTTP embedder's client was never closed: each stop left its connections to the endpoint open."""
    from a2m.dispatch import Context, Dispatcher
    from backends.surface import TierServer
    from tests.support.memstore import CAPABILITIES, MemoryStore

    with endpoint([good]) as (seen, url):
        embedder = HTTPEmbedder(url, "m")
        tier = TierServer(MemoryStore(), name="memory", kind="episodic", capabilities=CAPABILITIES, embedder=embedder)
        await tier.startup()
        await Dispatcher(tier).call("memory/remember", {"records": [{"content": "kettle"}]}, Context())
        assert len(seen) == 1 and not embedder.closed
        await tier.shutdown()
        assert embedder.closed
        assert await try_embed(embedder, ["a"]) == [[1.0, 1.0, 0.5]]  # started again in this process: it reopens
        await embedder.aclose()


async def test_the_router_closes_its_embedders_connections_as_it_stops() -> None:
    """The router's embedder (`embedder = "http://..."`) was never closed either."""
    from router.config import RouterConfig, TierConfig
    from router.server import Router

    with endpoint([good]) as (seen, url):
        router = Router(RouterConfig(tiers=(TierConfig(name="episodic", url="http://127.0.0.1:9/", kind="episodic"),),
                                     embedder=url))
        embedder = router.embedder
        assert isinstance(embedder, HTTPEmbedder)
        assert await try_embed(embedder, ["a"]) == [[1.0, 1.0, 0.5]] and not embedder.closed
        await router.shutdown()
        assert embedder.closed
