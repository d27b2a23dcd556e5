"""The episodic tier: what happened, with its context, on PostgreSQL + pgvector.

`a2m serve episodic` builds a `TierServer` around `make_store(settings)`.
With `settings.url` (a postgresql:// DSN) it uses that database; without one it
starts an embedded PostgreSQL 18 + pgvector in `settings.data_dir`.
"""

from __future__ import annotations

from backends.settings import TierSettings
from backends.store import Store

from .store import PostgresStore

KIND = "episodic"
CAPABILITIES = frozenset(
    {"core", "tiers", "salience", "scopes", "sessions", "keys", "embeddings", "external", "events", "prompt", "summarize"}
)


def make_store(settings: TierSettings) -> Store:
    return PostgresStore(settings)


__all__ = ["CAPABILITIES", "KIND", "PostgresStore", "make_store"]
