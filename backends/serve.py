"""Build a tier server from its engine package and run it over HTTP or stdio.

`a2m serve <tier>` lands here. Each engine package exposes `KIND`,
`CAPABILITIES`, `make_store(settings)` and optionally `extensions(store)` and
`EXTENSION_DOCS`; this module is the only place that turns a name into one.
"""

from __future__ import annotations

import importlib
from typing import Any, Mapping

from a2m.dispatch import Dispatcher
from a2m.embedder import Embedder
from a2m.http import HTTPApp, HTTPSettings

from .settings import TierSettings
from .surface import TierServer

ENGINES = {"working": "backends.working", "episodic": "backends.episodic",
           "semantic": "backends.semantic", "procedural": "backends.procedural", "corpus": "backends.corpus"}


def build(engine: str, settings: TierSettings, *, embedder: Embedder | None = None,
          limits: Mapping[str, int] | None = None) -> TierServer:
    module = importlib.import_module(ENGINES.get(engine, engine))
    store = module.make_store(settings)
    extensions = module.extensions(store) if hasattr(module, "extensions") else None
    return TierServer(
        store, name=settings.name, kind=settings.options.get("kind", module.KIND),
        capabilities=frozenset(module.CAPABILITIES), limits=limits, embedder=embedder, extensions=extensions,
        extension_docs=getattr(module, "EXTENSION_DOCS", None), read_only=getattr(module, "READ_ONLY", False),
    )


def http_app(server: Any, settings: HTTPSettings | None = None) -> HTTPApp:
    """An ASGI app for any service with startup()/shutdown() (a tier server or the router)."""
    return HTTPApp(Dispatcher(server), settings, lifespan=server)
