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

TIER_KINDS = ("working", "episodic", "semantic", "procedural")


def compatible(protocol: object) -> bool:
    """While the major version is 0, the minor must match exactly."""
    return protocol == PROTOCOL
