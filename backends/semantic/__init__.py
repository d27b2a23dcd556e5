"""The semantic tier: facts that are true now, on Qdrant.

`make_store` picks the engine: a Qdrant server when a URL is configured,
Qdrant Edge in the data directory otherwise; `options["engine"] == "local"`
selects qdrant-client's local mode instead (the tests use it so the
qdrant-client code path runs without a server).
"""

from __future__ import annotations

from backends.settings import TierSettings

from .store import SemanticStore

KIND = "semantic"
CAPABILITIES = frozenset(
    {"core", "tiers", "salience", "scopes", "sessions", "keys", "embeddings", "external", "events", "prompt", "summarize"}
)

__all__ = ["CAPABILITIES", "KIND", "SemanticStore", "make_store"]


def make_store(settings: TierSettings) -> SemanticStore:
    options = settings.options
    engine = options.get("engine", "edge")
    if engine not in ("edge", "local"):
        raise ValueError(f"semantic: engine must be 'edge' or 'local', not {engine!r}")
    collection = str(options.get("collection", "a2m_semantic"))
    if settings.url:
        from .client import ClientEngine

        return SemanticStore(ClientEngine(url=settings.url, collection=collection, api_key=options.get("api_key")))
    if engine == "local":
        from .client import ClientEngine

        return SemanticStore(ClientEngine(path=settings.data_dir / "qdrant-local", collection=collection))
    from .edge import EdgeEngine

    return SemanticStore(EdgeEngine(settings.data_dir / "qdrant-edge"))
