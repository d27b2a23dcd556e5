"""Access statistics, kept beside the history rather than in it (decisions 19, 59).

`touch` happens on every recall; committing each would bury the changes people
made in noise, and a procedure's diff should show only those. So
`access_count` and `accessed_at` live in `.git/a2m/state.json` (inside `.git`,
never part of a tree), keyed by id, with the vector width the tier holds. It is
flushed at most once a second and with every write and close: a crash can lose
the last second of counts, never a procedure.

Behind the review gate an id can hold other statistics on `proposed` than on
main (a proposed restore of a forgotten key starts at none). Those are kept
apart (`pending`) until approved, so a restart shows readers main's.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Collection

Stats = tuple[int, str | None]  # (access_count, accessed_at)
NO_STATS: Stats = (0, None)
FLUSH_EVERY_S = 1.0


class Sidecar:
    """The statistics in memory, and when they last differed from the file."""

    def __init__(self) -> None:
        self.access: dict[str, Stats] = {}  # id -> statistics (main's, where main holds it)
        # Behind the review gate: id -> the statistics of its proposed record where they are not main's.
        self.pending: dict[str, Stats] = {}
        self.dimensions: int | None = None
        self.dirty_since: float | None = None

    def load(self, path: Path) -> None:
        """Read the file at open; an absent or unreadable one leaves what is held (none, at first open)."""
        try:
            state = json.loads(path.read_text("utf-8"))
        except (OSError, ValueError):
            return
        self.access = {k: (int(v[0]), v[1]) for k, v in state.get("access", {}).items()}
        self.pending = {k: (int(v[0]), v[1]) for k, v in state.get("pending_access", {}).items()}
        self.dimensions = state.get("dimensions")

    def save(self, path: Path) -> None:
        """Replace the file (a rename: it is the old one or the new one, whole) if anything changed."""
        if self.dirty_since is None:
            return
        tmp = path.with_suffix(".tmp")
        state: dict[str, Any] = {"dimensions": self.dimensions, "access": self.access}
        if self.pending:
            state["pending_access"] = self.pending
        tmp.write_text(json.dumps(state), "utf-8")
        os.replace(tmp, path)
        self.dirty_since = None

    def changed(self) -> None:
        if self.dirty_since is None:
            self.dirty_since = time.monotonic()

    def due(self) -> bool:
        """Whether a change has waited `FLUSH_EVERY_S` for the file."""
        return self.dirty_since is not None and time.monotonic() - self.dirty_since >= FLUSH_EVERY_S

    def set(self, table: dict[str, Stats], record_id: str, stats: Stats | None) -> None:
        """Set (None: remove) an id's entry in `access` or `pending`, noting a change if there is one."""
        if stats is None:
            changed = table.pop(record_id, None) is not None
        else:
            changed = table.get(record_id) != stats
            table[record_id] = stats
        if changed:
            self.changed()

    def put(self, record_id: str, stats: Stats, shown: Stats | None) -> None:
        """A committed put carrying `stats`; `shown`: the statistics of the record main shows at that id
        while the put waits on `proposed` (None without the gate, or when main shows none).

        The file is keyed by id, and an id can be forgotten and written again: a put sets the
        statistics it carries, none included, or a restart would revive the old counts. Behind the
        gate, an id main shows keeps main's until approved: the proposed record's go apart where
        they differ (a restart would show them to readers)."""
        if shown is not None:
            self.set(self.pending, record_id, None if stats == shown else stats)
        else:
            self.set(self.pending, record_id, None)
            self.set(self.access, record_id, stats if stats != NO_STATS else None)

    def forget(self, record_id: str, *, shown: bool) -> None:
        """A record gone from the branch writes land on; `shown`: main still shows it (behind the gate,
        until approved), and keeps its statistics."""
        self.set(self.pending, record_id, None)
        if not shown:
            self.set(self.access, record_id, None)

    def approve(self, approved: Collection[str]) -> None:
        """Main is the proposed branch now (the ids in `approved`), and so are its statistics."""
        for record_id in list(self.access):
            if record_id not in approved:
                self.set(self.access, record_id, None)
        for record_id, stats in list(self.pending.items()):
            self.set(self.pending, record_id, None)
            self.set(self.access, record_id, stats if stats != NO_STATS else None)
