"""What one write commits: the change, who it is by, and a message a reviewer can scan.

A batch is one commit, so one reviewable, revertible change. It is authored
by the owner whose records it writes (`owner_actor`), committed by the store's
identity (`options["author"]`), and its message names each record by key and
revision (`forget skills/refund (rev 3)`), so `git log` reads as a changelog.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import git

from a2m.records import Record


@dataclass(slots=True)
class Plan:
    """What one write changes: files to (re)write, files to remove, and the index after it."""

    files: dict[str, bytes] = field(default_factory=dict)
    removed: set[str] = field(default_factory=set)
    puts: list[tuple[Record, str, int]] = field(default_factory=list)
    dropped: set[str] = field(default_factory=set)
    message: str = ""
    author: git.Actor | None = None


def actor(spec: Any, default: git.Actor) -> git.Actor:
    """`"Name <email>"` or `{"name":..., "email":...}` from config, else `default`."""
    if isinstance(spec, dict):
        return git.Actor(str(spec.get("name", default.name)), str(spec.get("email", default.email)))
    if isinstance(spec, str) and spec:
        match = re.fullmatch(r"\s*(.*?)\s*<([^>]*)>\s*", spec)
        return git.Actor(match.group(1), match.group(2)) if match else git.Actor(spec, default.email)
    return default


def owner_actor(owner: str) -> git.Actor:
    """The git identity of an owner: git forbids `<`, `>` and newlines in names."""
    name = re.sub(r"[<>\n\r\x00]", "_", owner).strip() or "_"
    local = re.sub(r"[^A-Za-z0-9._+-]", "-", owner).strip(".-") or "owner"
    return git.Actor(name, f"{local}@a2m.local")


def label(record: Record) -> str:
    """How a commit message names a record: its key and revision, or its id when it has no key."""
    return f"{record.key} (rev {record.revision})" if record.key is not None else record.id


def message(verbs: list[str]) -> str:
    """One subject line a reviewer can scan; the full list in the body for a batch."""
    if len(verbs) == 1:
        return verbs[0]
    counts = Counter(verb.split(" ", 1)[0] for verb in verbs)
    subject = ", ".join(f"{v} {n}" for v, n in counts.items()) + " records"
    return subject + "\n\n" + "\n".join(f"- {v}" for v in verbs)


def prune_dirs(directory: Path, root: Path) -> None:
    """Remove directories a forget left empty, so the tree on disk matches git's (which has no empty dirs)."""
    while directory != root and directory.is_relative_to(root):
        try:
            directory.rmdir()
        except OSError:
            return
        directory = directory.parent
