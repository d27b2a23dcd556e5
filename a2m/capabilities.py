"""Which capability each A2M method belongs to: the table of the protocol's §2."""

from __future__ import annotations

PROTOCOL = "a2m/0.1"

CAPABILITIES = (
    "core", "tiers", "salience", "scopes", "sessions", "keys",
    "embeddings", "external", "events", "summarize", "prompt",
)

METHOD_CAPABILITY: dict[str, str] = {
    "memory/describe": "core",
    "memory/remember": "core",
    "memory/recall": "core",
    "memory/timeline": "core",
    "memory/forget": "core",
    "memory/promote": "tiers",
    "memory/consolidate": "tiers",
    "memory/reinforce": "salience",
    "memory/session/list": "sessions",
    "memory/session/close": "sessions",
    "memory/fetch": "keys",
    "memory/events": "events",
    "memory/events/subscribe": "events",
    "memory/events/unsubscribe": "events",
    "memory/summarize": "summarize",
}

# The record fields of each optional capability (§2's table): a server that does not declare one
# ignores them on a write (§4, remember), so what the caller gave is not kept. `tier` (tiers) is
# left out: it names where a record goes, and a write refuses it (-32003) rather than ignoring it.
FIELD_CAPABILITY: dict[str, str] = {
    "salience": "salience", "access_count": "salience", "accessed_at": "salience",
    "owner": "scopes",
    "session": "sessions",
    "key": "keys", "revision": "keys",
    "embedding": "embeddings",
    "uri": "external", "media_type": "external",
}

TIER_KINDS = ("working", "episodic", "semantic", "procedural")


def compatible(protocol: object) -> bool:
    """While the major version is 0, the minor must match exactly."""
    return protocol == PROTOCOL
