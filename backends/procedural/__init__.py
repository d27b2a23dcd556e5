"""The procedural tier: procedures stored like code, in a git repository.

`make_store` gives a `GitStore` (a repository at `settings.url` when it is a
path, else `<data_dir>/repo`); `extensions` adds `memory/history`,
`memory/restore` and `memory/approve`, documented in `EXTENSION_DOCS`.
Options: `review` (bool, the review gate), `remote` (push target),
`author` ("Name <email>", the identity for unowned writes and the committer),
`approvers` (owners allowed to call `memory/approve`; default anyone),
`case_insensitive` (treat the file system as folding case, which open otherwise probes).

`sessions` is declared: a record's `session` is stored, and `memory/session/list`
counts what a recall sees (behind the gate, what is approved), so the router's
list counts a conversation's procedures too; `memory/session/close` moves and
deletes nothing (the protocol's close "never touches procedural").
"""

from __future__ import annotations

from backends.settings import TierSettings

from .history import EXTENSION_DOCS, Handler, extensions
from .store import GitStore

KIND = "procedural"
CAPABILITIES = frozenset(
    {"core", "tiers", "salience", "scopes", "sessions", "keys", "embeddings", "external", "events", "prompt"}
)


def make_store(settings: TierSettings) -> GitStore:
    return GitStore(settings)


__all__ = ["CAPABILITIES", "EXTENSION_DOCS", "GitStore", "Handler", "KIND", "extensions", "make_store"]
