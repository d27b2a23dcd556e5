"""The review gate (`options["review"]`): writes are proposals until someone approves them.

Behind the gate a write commits to the `proposed` branch (built in memory; the
working tree stays on main) and recall sees main only. `memory/approve`
fast-forwards main to `proposed`, and only then are the proposals recallable,
and told to readers as written (decisions 99, 101). A fast-forward, never a
merge: what is approved is exactly the commits a reviewer saw.

This module holds the git side of that (starting `proposed`, the fast-forward
and what its failures mean) and what an approve changed for readers; the store
moves its in-memory views and access statistics with it.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import git

from a2m.records import Record
from backends.store import StoreRejected, StoreUnavailable

from .index import Tree

log = logging.getLogger("a2m.procedural")

PROPOSED = "proposed"


@dataclass(slots=True)
class Approval:
    """What an approve did: commits merged, main's head, and what readers see differently now."""

    approved: int
    commit: str
    written: list[Record] = field(default_factory=list)  # shown now and not so before, in write order
    forgotten: list[Record] = field(default_factory=list)  # shown before and gone now (as they were)

    def to_wire(self) -> dict[str, Any]:
        return {"approved": self.approved, "commit": self.commit}


def base_proposed(repo: git.Repo, main: str, path: Path) -> bool:
    """Start `proposed` from main where it holds nothing main lacks; True when it was moved back to main
    (no proposed record differs from main's then). Without the gate writes land on main, and a `proposed`
    left where the last approve put it would have the gate's next writes resolved against that older
    state and every later approve refused as diverged."""
    head = repo.head.commit
    if PROPOSED not in repo.heads:
        repo.create_head(PROPOSED, head)
    elif repo.is_ancestor(repo.heads[PROPOSED].commit, head):
        repo.heads[PROPOSED].set_commit(head, logmsg=f"reset: moving to {main} (nothing pending)")
        return True
    elif not repo.is_ancestor(head, repo.heads[PROPOSED].commit):
        log.warning("procedural: %s has diverged from %s in %s (written while the review gate was off?); "
                    "memory/approve is refused until it is merged by hand", PROPOSED, main, path)
    return False


def warn_unapproved(repo: git.Repo, main: str, path: Path) -> None:
    """Log proposals waiting for approval, which a store without the gate neither shows nor approves."""
    if PROPOSED in repo.heads and not repo.is_ancestor(repo.heads[PROPOSED].commit, repo.head.commit):
        log.warning("procedural: %s holds proposals not on %s in %s; they stay unapproved while the review "
                    "gate is off (serve with --option review=true to approve them)", PROPOSED, main, path)


def fast_forward(repo: git.Repo, main: str, path: Path) -> tuple[int, str]:
    """Fast-forward main to `proposed`: (commits merged, main's new head). Raises before main moves:
    StoreRejected for a state of the repository someone has to change first (said in the message),
    StoreUnavailable for git failing."""
    try:
        if repo.head.is_detached or repo.head.ref.name != main:
            raise StoreRejected(f"the repository {path} is not on {main} (checked out by hand?): "
                                f"check out {main} there (git checkout {main}), then approve again")
        if PROPOSED not in repo.heads:
            raise StoreRejected(f"the {PROPOSED} branch is gone from {path} (deleted by hand?): "
                                f"restart the tier server, which starts it again from {main}")
        head, proposed = repo.head.commit, repo.heads[PROPOSED].commit
        if head == proposed:
            return 0, head.hexsha
        if not repo.is_ancestor(head, proposed):
            raise StoreRejected(
                f"{main} has moved since {PROPOSED} was started from it (a commit made by hand?), so it "
                f"cannot be fast-forwarded: stop the tier server, merge {main} into {PROPOSED} in "
                f"{path} (git checkout {PROPOSED} && git merge {main} && git checkout {main}), "
                f"start it again and approve")
        count = int(repo.git.rev_list("--count", f"{head.hexsha}..{proposed.hexsha}"))
        repo.git.reset("-q")  # the index file is not kept current per commit
        repo.git.merge("--ff-only", "-q", PROPOSED)
    except git.GitCommandError as exc:
        raise approve_failure(exc, main, path) from exc
    except (git.GitError, OSError, ValueError) as exc:  # an unreadable ref or object
        raise StoreUnavailable(f"git could not approve in {path}: {exc}") from exc
    return count, proposed.hexsha


def approve_failure(exc: git.GitCommandError, main: str, path: Path) -> Exception:
    """What a failed git command of an approve means to the caller (git speaks C here: GitPython
    runs it with LC_ALL=C). git checks the working tree and takes its locks before it moves main,
    so main is where it was."""
    stderr = exc.stderr if isinstance(exc.stderr, str) else str(exc)
    if "would be overwritten by merge" in stderr:
        paths = [line.strip() for line in stderr.splitlines() if line.startswith("\t")]
        named = f": {', '.join(paths[:10])}{' …' if len(paths) > 10 else ''}" if paths else ""
        return StoreRejected(f"files changed or added by hand in the working tree of {path} are in the "
                             f"way of the approved procedures{named}; move them away or discard them (git "
                             f"status there shows them), then approve again")
    lock = re.search(r"Unable to create '([^']+\.lock)'", stderr) or re.search(r"'([^']+\.lock)'", stderr)
    if lock is not None:
        return StoreUnavailable(f"another git process holds {lock.group(1)}: let it finish (or remove the "
                                f"file if no git process is running in {path}), then approve again")
    detail = " ".join(stderr.split())[:500] or f"exit status {exc.status}"
    return StoreUnavailable(f"git could not fast-forward {main} to {PROPOSED} in {path}: {detail}")


def shown_changes(before: Tree, after: Tree) -> tuple[list[Record], list[Record]]:
    """The records `after` shows that `before` did not show so, and those it no longer shows.

    A record whose salience alone changed (an approved reinforce) is not among them: a reinforce
    is no `written` event without the gate either. Access statistics are not part of a record's
    state here (the store keeps them apart from what is approved)."""
    written = []
    for record_id, record in after.records.items():
        old = before.records.get(record_id)
        if old is None or replace(old, salience=record.salience, access_count=record.access_count,
                                  accessed_at=record.accessed_at) != record:
            written.append(record)
    written.sort(key=lambda r: after.seqs.get(r.id, 0))
    forgotten = [old for record_id, old in before.records.items()
                 if record_id not in after.records or after.records[record_id].owner != old.owner]
    return written, forgotten
