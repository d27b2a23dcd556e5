"""Opening a repository safely: one store holds it, a crash's leftovers are discarded, and a new one
is never made inside another repository's git directory or another store's working tree (`check_place`).

A write that was not committed was never acknowledged, so discarding it is
correct: at open (and after a failed commit) stale lock files and partial
objects are removed and the working tree is reset to HEAD (`reset --hard`,
then `clean` of the record roots). Records are then read from the commit,
never the working tree (decision 93).
"""

from __future__ import annotations

import fcntl
import logging
import os
import time
from pathlib import Path

import git

from backends.store import StoreUnavailable

from . import files
from .objects import EMPTY_COMMIT

log = logging.getLogger("a2m.procedural")

LOCK_WAIT_S = 2.0  # how long a starting store waits for a dead predecessor's lock (`hold`)
_STALE_LOCK_WAIT_S = 3.0  # how long recovery lets a dead store's git child finish before removing its locks


def hold(git_dir: Path, path: Path) -> int:
    """The descriptor of the flock that makes this the one store of the repository at `path`, held
    before recovery touches anything: a second one would reset the first's working tree at open and,
    committing the tree it holds in memory, drop the records the first committed since. A flock, so
    the death of the process releases it (closing the descriptor does too).

    Asked again for up to `LOCK_WAIT_S`: a server restarted right after a kill -9 can find the lock
    held for a moment longer by a git child of the dead one, forked but not yet exec'd (the lock's
    descriptor closes at exec), which a loaded machine stretches to tens of milliseconds."""
    state = git_dir / "a2m"
    state.mkdir(exist_ok=True)
    fd = os.open(state / "lock", os.O_RDWR | os.O_CREAT, 0o600)
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() < deadline:
                time.sleep(0.05)
                continue
            os.close(fd)
            raise StoreUnavailable(
                f"another process has the procedural repository {path} open "
                "(a second server on this data directory or repository?)") from None


def check_place(path: Path) -> None:
    """StoreUnavailable when `path`, holding no repository of its own yet, is no place to make one: inside a
    git directory (a repository's `.git`, or a bare repository such as the remote a store pushes to), or
    below another procedural store's working tree. `git init` made one there anyway: inside a git directory
    it shadows that repository for git (found first as `<path>/.git`: `git log` and a push into a bare one
    read the new one); below a store's tree it is a second server on that store's files."""
    probe = path
    while not probe.exists() and probe != probe.parent:  # what git would be run in, before mkdir makes it
        probe = probe.parent
    try:
        inside, git_dir = git.Git(str(probe)).rev_parse("--is-inside-git-dir", "--absolute-git-dir").splitlines()
    except (git.GitCommandError, ValueError):
        return  # in no repository (or one git cannot read): a new one is made at `path`
    if inside == "true":
        why = f"it is inside the git directory {git_dir} (give the repository's working tree, or a new directory)"
    elif (Path(git_dir) / "a2m").is_dir():
        why = f"it is inside the working tree of another procedural repository, {Path(git_dir).parent}"
    else:
        return  # below a repository that is not a store's (a project's docs/procedures): a repository of its own
    raise StoreUnavailable(f"{path} is not a place for the procedural repository: {why}")


def recover(repo: git.Repo, path: Path) -> None:
    """Discard a write a crash left uncommitted: nothing of it was acknowledged."""
    git_dir = Path(repo.git_dir)
    # Every lock git or GitPython takes here: index, HEAD, config (set at open), ORIG_HEAD (an
    # approve's merge), packed-refs and the branches. This store holds the repository (`hold`).
    locks = [*git_dir.glob("*.lock"), *git_dir.glob("refs/**/*.lock")]
    # A killed store's `git` child (update-index) is not killed with it and may still hold
    # a lock for a moment: let it finish before its lock is declared stale.
    deadline = time.monotonic() + _STALE_LOCK_WAIT_S
    while any(lock.exists() for lock in locks) and time.monotonic() < deadline:
        time.sleep(0.05)
    for lock in locks:
        lock.unlink(missing_ok=True)
    # gitdb writes each object to objects/obj<random> and renames it into place: a kill
    # mid-write leaves that temp file, which nothing references and `git fsck` calls garbage.
    for partial in (git_dir / "objects").glob("obj*"):
        if partial.is_file():
            partial.unlink(missing_ok=True)
    # Before InProcessObjectDB a kill mid-commit could leave an empty commit object (see
    # there): unparseable, so nothing references it, and `git fsck` fails while it exists.
    (git_dir / "objects" / EMPTY_COMMIT[:2] / EMPTY_COMMIT[2:]).unlink(missing_ok=True)
    if not repo.head.is_valid():
        return
    if repo.is_dirty(untracked_files=False) or repo.untracked_files:
        log.warning("procedural: discarding uncommitted changes in %s (an interrupted write)", path)
    repo.git.reset("--hard", "-q")
    repo.git.clean("-fdq", "--", files.SHARED_ROOT, files.OWNERS_ROOT)
