"""The working tier: the live transcript on Redis (see `store.py` for the layout).

Declares every capability the shared surface can offer over a Store except
`summarize`: this tier never runs a model. `embeddings` means caller vectors are
kept verbatim; it never makes one and never searches by one.
"""

from __future__ import annotations

from backends.settings import TierSettings

from .embedded import RedisServer, find_redis_server
from .store import RedisStore

KIND = "working"
CAPABILITIES = frozenset(
    {"core", "tiers", "salience", "scopes", "sessions", "keys", "embeddings", "external", "events", "prompt"}
)


def make_store(settings: TierSettings) -> RedisStore:
    """A Redis store on `settings.url` (`redis://host:6379/0`, `unix:///path`), or an embedded child."""
    return RedisStore(settings)


__all__ = ["CAPABILITIES", "KIND", "RedisServer", "RedisStore", "find_redis_server", "make_store"]
