"""GitStore: procedural memory as a git repository, one Markdown file per record.

Why it is built this way:

- **One commit per `write`.** A batch is one reviewable, revertible change.
  Commits are made with GitPython's object layer (blobs into the object
  database, a tree from an in-memory index, a commit, a ref update) rather than
  by spawning `git add`/`git commit`: no hooks, no process per write, and the
  ref update is the single atomic step that makes a write exist.
- **One writer.** Writes hold an asyncio lock and run in a worker thread; the
  in-memory index changes only after the commit landed, so a reader never sees
  a write that could still fail.
- **Durable commits.** gitdb fsyncs nothing, and a ref naming an object the
  disk never got (a power loss) is a repository nobody can read: a write's
  objects are fsynced before its branch moves, then the ref (`set_ref`), and
  git's own writes here run with `core.fsync = objects,reference`.
- **Recovery at open.** A write that was not committed was never acknowledged,
  so discarding it is correct: stale lock files are removed and the working
  tree is reset to HEAD (`reset --hard`, then `clean` of the record roots).
- **Recall is in memory.** The tree is parsed once at open into dicts and a
  BM25 index per owner; vectors are compared with numpy over the owner's records.
- **Access statistics are not history.** `touch` happens on every recall;
  committing each would bury real changes in noise. `access_count` and
  `accessed_at` live in a sidecar (`.git/a2m/state.json`, never part of the
  tree), flushed at most once a second and at close: a crash can lose the
  last second of counts, never a procedure. `reinforce` changes `salience`,
  a deliberate judgement kept in the file, so it is a commit. Behind the
  review gate an id can hold other statistics on `proposed` than on main (a
  proposed restore of a forgotten key starts at 0): those are kept apart
  (`pending_access`) until approved, so a restart shows readers main's.
- **Review gate** (`options["review"]`): writes commit to the `proposed`
  branch (built in memory, the working tree stays on main) and recall sees
  main only, until `approve` fast-forwards main.
- **Remote** (`options["remote"]`): pushed after each commit. A failed push (or
  one cut off after `PUSH_TIMEOUT_S`) is logged and retried with the next commit; the local repository is the
  source of truth and a write is not refused because a mirror is down.
"""

from __future__ import annotations

import fcntl
import heapq
import io
import json
import logging
import os
import re
import signal
import subprocess
import time
from collections import defaultdict
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, AsyncIterator, Collection, Iterable, Literal, Mapping, Sequence

import anyio
import git
from git.db import GitCmdObjectDB
from git.objects.commit import Commit
from git.objects.tree import Tree as GitTree
from gitdb import LooseObjectDB
from gitdb.base import IStream

from a2m.filters import Scope, matches
from a2m.records import Record
from a2m.text import BM25, squash
from backends.children import die_with_parent
from backends.settings import TierSettings
from backends.store import (SessionInfo, StoreConflict, StoreIdTaken, StoreRejected, StoreUnavailable,
                            StoreWidthMismatch)

from . import files

log = logging.getLogger("a2m.procedural")

PROPOSED = "proposed"
_FILE_MODE = 0o100644
_FLUSH_EVERY_S = 1.0
LOCK_WAIT_S = 2.0  # how long a starting store waits for a dead predecessor's lock (`_hold`)
# A push runs under the writer lock: a remote that never answers must not hold every write with it.
PUSH_TIMEOUT_S = 30.0


def _actor(spec: Any, default: git.Actor) -> git.Actor:
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

_TREE_MODE = 0o040000


class InProcessObjectDB(GitCmdObjectDB):
    """`repo.odb` that reads through git (packs, alternates) but stores objects in-process.

    GitCmdObjectDB.store pipes each object into `git hash-object -w --stdin --literally`
    through a buffered pipe. A store killed after writing but before flushing leaves the
    child reading EOF, and `--literally` makes it write what it got: an empty commit object
    (`commit 0\\0`, dcf5b16e...) that `git fsck` reports as bogus. This is how
    `Commit.create_from_tree` stores every commit. gitdb's own store writes an obj<random>
    temp file and renames it into place, so an object is either complete or absent.
    """

    def __init__(self, root_path: str, git_cmd: Any) -> None:
        super().__init__(root_path, git_cmd)
        self.unsynced: set[str] = set()  # object files stored since the last `sync`
        # Fan-out directories (objects/ab/) whose entry in objects/ is on disk: those there at open,
        # and those a `sync` made durable since.
        self._durable_dirs = {entry.path for entry in os.scandir(root_path) if entry.is_dir()}

    def store(self, istream: IStream) -> IStream:
        istream = LooseObjectDB.store(self, istream)
        self.unsynced.add(self.db_path(self.object_path(istream.hexsha)))
        return istream

    def sync(self) -> None:
        """Make every object stored since the last sync durable (its data, and its name in its
        directory), before a ref names it: gitdb fsyncs nothing, and after a power loss a ref
        naming an object the disk never got is a repository git and this store cannot read."""
        paths, self.unsynced = self.unsynced, set()
        for path in paths:
            fsync_path(path)
        directories = {os.path.dirname(path) for path in paths}
        for directory in directories:
            fsync_path(directory)
        if directories - self._durable_dirs:  # a directory gitdb made: its own name is in objects/
            fsync_path(self.root_path())
            self._durable_dirs |= directories


def fsync_path(path: str | os.PathLike[str]) -> None:
    """fsync a file or a directory (a directory's entries: a rename into it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def set_ref(repo: git.Repo, ref: git.Reference, commit: Commit, logmsg: str) -> None:
    """Point `ref` at `commit` durably: its objects first, then the ref file and its directory.
    A write is acknowledged after this, so after a power loss it is there (or, cut before the
    ref's fsync, not acknowledged)."""
    sync_objects(repo)
    ref.set_commit(commit, logmsg=logmsg)
    fsync_ref(repo, ref)


def sync_objects(repo: git.Repo) -> None:
    if isinstance(repo.odb, InProcessObjectDB):
        repo.odb.sync()


def fsync_ref(repo: git.Repo, ref: git.Reference) -> None:
    path = Path(repo.common_dir) / ref.path
    fsync_path(path)
    fsync_path(path.parent)


_EMPTY_COMMIT = "dcf5b16e76cce7425d0beaef62d79a7d10fce1f5"  # `git hash-object -t commit --literally </dev/null`


def loose_odb(repo: git.Repo) -> LooseObjectDB:
    """Write objects in-process, whatever odb type `repo` was opened with (the store's own, which
    keeps them for `set_ref` to sync, when it is that)."""
    if isinstance(repo.odb, InProcessObjectDB):
        return repo.odb
    return LooseObjectDB(os.path.join(repo.common_dir, "objects"))


class TreeBuilder:
    """A branch's git trees kept in memory, so a commit rewrites only the directories it touched.

    GitPython's `IndexFile.write_tree` rebuilds every tree from the whole index
    and `IndexFile.write` re-serialises it: both O(records) per commit, ~150 ms
    at 2,000 procedures. Here a one-record commit stores its blob and the few
    trees on its path, whatever the size of the repository.
    """

    def __init__(self, repo: git.Repo, entries: Iterable[tuple[str, int, bytes]]) -> None:
        self.odb = loose_odb(repo)
        self.dirs: dict[str, dict[str, tuple[int, bytes | None]]] = {"": {}}
        self.shas: dict[str, bytes] = {}
        self.dirty: set[str] = {""}
        for path, mode, sha in entries:
            self.set(path, mode, sha)

    @classmethod
    def of_commit(cls, repo: git.Repo, commit: Commit) -> "TreeBuilder":
        index = git.IndexFile.from_tree(repo, commit)
        return cls(repo, ((path, entry.mode, entry.binsha) for (path, _), entry in index.entries.items()))

    def _touch(self, directory: str) -> None:
        while True:
            self.dirty.add(directory)
            if not directory:
                return
            directory = directory.rpartition("/")[0]

    def set(self, path: str, mode: int, sha: bytes) -> None:
        directory, _, name = path.rpartition("/")
        self._ensure_dir(directory)
        self.dirs[directory][name] = (mode, sha)
        self._touch(directory)

    def _ensure_dir(self, directory: str) -> None:
        if directory in self.dirs:
            return
        parent, _, base = directory.rpartition("/")
        self._ensure_dir(parent)
        self.dirs[directory] = {}
        self.dirs[parent][base] = (_TREE_MODE, None)

    def remove(self, path: str) -> None:
        directory, _, name = path.rpartition("/")
        entries = self.dirs.get(directory)
        if entries is None or entries.pop(name, None) is None:
            return
        self._touch(directory)
        while directory and not self.dirs[directory]:  # git has no empty directories
            del self.dirs[directory]
            self.shas.pop(directory, None)
            self.dirty.discard(directory)
            directory, _, name = directory.rpartition("/")
            self.dirs[directory].pop(name, None)

    def write(self, directory: str = "") -> bytes:
        """Store every dirty tree (bottom-up) and return the root tree's sha."""
        if directory not in self.dirty and directory in self.shas:
            return self.shas[directory]
        items = []
        for name, (mode, sha) in self.dirs[directory].items():
            if mode == _TREE_MODE:
                sha = self.write(f"{directory}/{name}" if directory else name)
            assert sha is not None
            items.append((sha, mode, name))
        items.sort(key=lambda e: e[2] + "/" if e[1] == _TREE_MODE else e[2])  # git's tree order
        # Serialised here: GitPython's tree_to_stream re-validates every name on every commit.
        data = b"".join(b"%o %s\0%s" % (mode, name.encode("utf-8"), sha) for sha, mode, name in items)
        sha = self.odb.store(IStream("tree", len(data), io.BytesIO(data))).binsha
        self.shas[directory] = sha
        self.dirty.discard(directory)
        return sha


@dataclass(slots=True)
class Tree:
    """One branch's records as the store knows them (access statistics merged in)."""

    records: dict[str, Record] = field(default_factory=dict)  # id -> record
    paths: dict[str, str] = field(default_factory=dict)  # id -> path
    by_path: dict[str, str] = field(default_factory=dict)  # path -> id
    seqs: dict[str, int] = field(default_factory=dict)  # id -> insertion sequence

    def set(self, record: Record, path: str, seq: int) -> None:
        self.drop(record.id)
        self.records[record.id] = record
        self.paths[record.id] = path
        self.by_path[path] = record.id
        self.seqs[record.id] = seq

    def drop(self, record_id: str) -> None:
        if record_id in self.records:
            del self.records[record_id]
            path = self.paths.pop(record_id)
            # A batch may already have put another record on this path (two records trading keys
            # are set one after the other): the path is theirs now, only this record's entry goes.
            if self.by_path.get(path) == record_id:
                del self.by_path[path]
            del self.seqs[record_id]

    def copy(self) -> "Tree":
        return Tree(dict(self.records), dict(self.paths), dict(self.by_path), dict(self.seqs))


@dataclass(slots=True)
class _Plan:
    """What one write changes: files to (re)write, files to remove, and the index after it."""

    files: dict[str, bytes] = field(default_factory=dict)
    removed: set[str] = field(default_factory=set)
    puts: list[tuple[Record, str, int]] = field(default_factory=list)
    dropped: set[str] = field(default_factory=set)
    message: str = ""
    author: git.Actor | None = None


class _Visible:
    """The searchable view of the branch recall sees: per-owner dicts, keys, BM25, vectors.

    `by_session` indexes the records that name a session, so a session's
    timeline (which the router asks of every tier on each replay) reads only
    that session instead of matching every record of the owner.
    """

    def __init__(self, tree: Tree) -> None:
        self.tree = tree
        self.by_owner: dict[str | None, dict[str, Record]] = defaultdict(dict)
        self.by_session: dict[tuple[str | None, str], dict[str, Record]] = defaultdict(dict)
        self.keys: dict[tuple[str | None, str], str] = {}
        self.bm25: dict[str | None, BM25] = defaultdict(BM25)
        self.vectors: dict[str, Any] = {}
        for record in tree.records.values():
            self._index(record)

    def _index(self, record: Record) -> None:
        self.by_owner[record.owner][record.id] = record
        if record.session is not None:
            self.by_session[(record.owner, record.session)][record.id] = record
        if record.key is not None:
            self.keys[(record.owner, record.key)] = record.id
        self.bm25[record.owner].add(record.id, record.content)
        if record.embedding is not None:
            import numpy as np

            vector = np.asarray(record.embedding, dtype=np.float32)
            norm = float(np.linalg.norm(vector))
            self.vectors[record.id] = vector / norm if norm else vector

    def _unindex(self, record_id: str) -> None:
        record = self.tree.records.get(record_id)
        if record is None:
            return
        self.by_owner[record.owner].pop(record_id, None)
        if record.session is not None:
            session = self.by_session.get((record.owner, record.session))
            if session is not None:
                session.pop(record_id, None)
                if not session:
                    del self.by_session[(record.owner, record.session)]
        if record.key is not None and self.keys.get((record.owner, record.key)) == record_id:
            del self.keys[(record.owner, record.key)]
        self.bm25[record.owner].remove(record_id)
        self.vectors.pop(record_id, None)

    def apply(self, plan: _Plan) -> None:
        for record_id in plan.dropped:
            self._unindex(record_id)
            self.tree.drop(record_id)
        for record, path, seq in plan.puts:
            self._unindex(record.id)
            self.tree.set(record, path, seq)
            self._index(record)

    def replace_record(self, record: Record) -> None:
        """Swap a record in place without re-indexing its text (access statistics only)."""
        self.tree.records[record.id] = record
        self.by_owner[record.owner][record.id] = record
        if record.session is not None:
            self.by_session[(record.owner, record.session)][record.id] = record


def _out(record: Record, with_embeddings: bool) -> Record:
    return replace(record) if with_embeddings else replace(record, embedding=None)


class GitStore:
    engine = "git"
    searches_vectors = True

    def __init__(self, settings: TierSettings) -> None:
        self.settings = settings
        self.path = Path(settings.url) if settings.url else Path(settings.data_dir) / "repo"
        options = settings.options or {}
        self.review = bool(options.get("review", False))
        self.remote: str | None = options.get("remote") or None
        self.identity = _actor(options.get("author"), git.Actor("a2m", "a2m@a2m.local"))
        self.repo: git.Repo | None = None
        self.main = "main"
        self._lock = anyio.Lock()  # one writer (and one user of the repo's object database)
        # Serialises every write that resolves keys: the surface holds it from resolving a batch's keys
        # to its write (`TierServer` takes a store's `key_lock`), `memory/restore` for its whole step.
        self.key_lock = anyio.Lock()
        self._trees: TreeBuilder | None = None  # the trees of the branch writes commit to
        self._visible = _Visible(Tree())
        self._proposed: Tree | None = None
        self._access: dict[str, tuple[int, str | None]] = {}  # id -> statistics (main's, where main holds it)
        # Behind the review gate: id -> the statistics of its proposed record where they are not main's.
        self._pending_access: dict[str, tuple[int, str | None]] = {}
        self._dimensions: int | None = None
        self._next_seq = 1
        self._dirty_since: float | None = None
        self.push_error: str | None = None
        self._lock_fd: int | None = None  # the flock that makes this the repository's one store
        self._path_max: int | None = None  # bytes a repository-relative path may have (PATH_MAX less the root)

    # ---------------------------------------------------------------- lifecycle

    async def open(self) -> None:
        """Open once: the check is repeated under the lock, as a second open queued behind the
        first would re-read the repository and drop the access counts recorded in between."""
        if self.repo is not None:
            return
        async with self._lock:
            if self.repo is not None:
                return
            try:
                await anyio.to_thread.run_sync(self._open_sync)
            except BaseException as exc:
                if self.repo is not None:  # a failed open holds neither the repository nor its lock
                    self.repo.close()
                    self.repo = None
                self._release()
                if isinstance(exc, (git.GitError, OSError)):
                    raise StoreUnavailable(f"cannot open the git repository at {self.path}: {exc}") from exc
                raise

    def _open_sync(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        if (self.path / ".git").exists():
            repo = git.Repo(self.path, odbt=InProcessObjectDB)
        else:
            repo = git.Repo.init(self.path, initial_branch="main", odbt=InProcessObjectDB)
        try:
            self._hold(Path(repo.git_dir))
        except BaseException:
            repo.close()
            raise
        self.repo = repo
        self._state_dir.mkdir(exist_ok=True)
        self._recover_sync()  # first: it clears the lock files a crash left, `config.lock` among them
        with repo.config_writer() as config:  # a commit made by hand in this repo needs an identity too
            if not config.has_option("user", "name"):
                config.set_value("user", "name", self.identity.name)
                config.set_value("user", "email", self.identity.email)
            if not config.has_option("core", "fsync"):  # what git itself writes here (an approve's merge)
                config.set_value("core", "fsync", "objects,reference")
        if not repo.head.is_valid():
            index = git.IndexFile(repo)
            message = "initialise procedural memory"
            commit = Commit.create_from_tree(repo, index.write_tree(), message, parent_commits=[], head=False,
                                             author=self.identity, committer=self.identity)
            sync_objects(repo)  # then the unborn branch, as `head=True` would make it
            fsync_ref(repo, git.Head.create(repo, repo.head.ref.path, commit, logmsg=f"commit (initial): {message}"))
            index.write()  # a valid (empty) index: git refuses a missing-but-truncated one
        self.main = repo.active_branch.name
        self._load_state()
        # From the commit, not the working tree: git writes that through the user's config and attributes
        # (`core.autocrlf`, `eol`), and the store holds what was committed, byte for byte.
        tree = self._load_tree(self._iter_commit(repo.head.commit))
        self._visible = _Visible(tree)
        if self.review:
            self._base_proposed(repo)
            proposed = repo.heads[PROPOSED].commit
            self._proposed = self._load_tree(self._iter_commit(proposed), self._pending_access)
        elif PROPOSED in repo.heads and not repo.is_ancestor(repo.heads[PROPOSED].commit, repo.head.commit):
            # Proposals waiting for approval, which this store neither shows nor approves without the gate.
            log.warning("procedural: %s holds proposals not on %s in %s; they stay unapproved while the review "
                        "gate is off (serve with --option review=true to approve them)", PROPOSED, self.main,
                        self.path)
        self._trees = TreeBuilder.of_commit(repo, repo.heads[PROPOSED].commit if self.review else repo.head.commit)
        if self._dimensions is None:
            self._dimensions = next(
                (len(r.embedding) for r in tree.records.values() if r.embedding is not None), None
            )

    def _base_proposed(self, repo: git.Repo) -> None:
        """Start `proposed` from main where it holds nothing main lacks. Without the gate writes land on
        main, and a `proposed` left where the last approve put it would have the gate's next writes
        resolved against that older state and every later approve refused as diverged."""
        main = repo.head.commit
        if PROPOSED not in repo.heads:
            repo.create_head(PROPOSED, main)
        elif repo.is_ancestor(repo.heads[PROPOSED].commit, main):
            repo.heads[PROPOSED].set_commit(main, logmsg=f"reset: moving to {self.main} (nothing pending)")
            self._pending_access.clear()  # no proposed record differs from main's
        elif not repo.is_ancestor(main, repo.heads[PROPOSED].commit):
            log.warning("procedural: %s has diverged from %s in %s (written while the review gate was off?); "
                        "memory/approve is refused until it is merged by hand", PROPOSED, self.main, self.path)

    def _hold(self, git_dir: Path) -> None:
        """One store per repository, held before recovery touches anything: a second one would reset
        the first's working tree at open and, committing the tree it holds in memory, drop the records
        the first committed since. A flock, so the death of the process releases it.

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
                break
            except BlockingIOError:
                if time.monotonic() < deadline:
                    time.sleep(0.05)
                    continue
                os.close(fd)
                raise StoreUnavailable(
                    f"another process has the procedural repository {self.path} open "
                    "(a second server on this data directory or repository?)") from None
        self._lock_fd = fd

    def _release(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing releases the flock
            self._lock_fd = None

    @property
    def _state_dir(self) -> Path:
        assert self.repo is not None
        return Path(self.repo.git_dir) / "a2m"

    def _recover_sync(self) -> None:
        """Discard a write a crash left uncommitted: nothing of it was acknowledged."""
        repo = self.repo
        assert repo is not None
        git_dir = Path(repo.git_dir)
        # Every lock git or GitPython takes here: index, HEAD, config (set at open), ORIG_HEAD (an
        # approve's merge), packed-refs and the branches. This store holds the repository (`_hold`).
        locks = [*git_dir.glob("*.lock"), *git_dir.glob("refs/**/*.lock")]
        # A killed store's `git` child (update-index) is not killed with it and may still hold
        # a lock for a moment: let it finish before its lock is declared stale.
        deadline = time.monotonic() + 3.0
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
        (git_dir / "objects" / _EMPTY_COMMIT[:2] / _EMPTY_COMMIT[2:]).unlink(missing_ok=True)
        if not repo.head.is_valid():
            return
        if repo.is_dirty(untracked_files=False) or repo.untracked_files:
            log.warning("procedural: discarding uncommitted changes in %s (an interrupted write)", self.path)
        repo.git.reset("--hard", "-q")
        repo.git.clean("-fdq", "--", files.SHARED_ROOT, files.OWNERS_ROOT)

    async def close(self) -> None:
        """Close once: the check is repeated under the lock, where a second close queued behind
        the first finds the repository gone."""
        if self.repo is None:
            return
        async with self._lock:
            if self.repo is None:
                return
            self._flush_state()
            try:
                await anyio.to_thread.run_sync(self.repo.git.reset, "-q")  # leave `git status` clean
            except git.GitError as exc:
                log.warning("procedural: could not refresh the index at close: %s", exc)
            self.repo.close()
            self.repo = None
            self._release()

    async def ping(self) -> None:
        if self.repo is None or not Path(self.repo.git_dir, "HEAD").exists():
            raise StoreUnavailable(f"the git repository at {self.path} is not open")

    # ----------------------------------------------------------------- loading

    def _iter_commit(self, commit: Commit) -> Iterable[tuple[str, bytes]]:
        for item in commit.tree.traverse():
            if item.type == "blob" and item.path.endswith(files.SUFFIX) and item.path.split("/")[0] in (
                files.SHARED_ROOT, files.OWNERS_ROOT,
            ):
                yield item.path, item.data_stream.read()

    def _load_tree(self, items: Iterable[tuple[str, bytes]],
                   overrides: dict[str, tuple[int, str | None]] | None = None) -> Tree:
        tree = Tree()
        for path, data in items:
            try:
                record, seq = files.loads(data)
            except (ValueError, UnicodeDecodeError, TypeError) as exc:
                log.warning("procedural: skipping %s, not a record file: %s", path, exc)
                continue
            if overrides is not None and record.id in overrides:
                count, at = overrides[record.id]
            else:
                count, at = self._access.get(record.id, (0, None))
            tree.set(replace(record, access_count=count, accessed_at=at), path, seq)
            self._next_seq = max(self._next_seq, seq + 1)
        return tree

    def _load_state(self) -> None:
        try:
            state = json.loads((self._state_dir / "state.json").read_text("utf-8"))
        except (OSError, ValueError):
            return
        self._access = {k: (int(v[0]), v[1]) for k, v in state.get("access", {}).items()}
        self._pending_access = {k: (int(v[0]), v[1]) for k, v in state.get("pending_access", {}).items()}
        self._dimensions = state.get("dimensions")

    def _flush_state(self) -> None:
        if self._dirty_since is None or self.repo is None:
            return
        target = self._state_dir / "state.json"
        tmp = target.with_suffix(".tmp")
        state: dict[str, Any] = {"dimensions": self._dimensions, "access": self._access}
        if self._pending_access:
            state["pending_access"] = self._pending_access
        tmp.write_text(json.dumps(state), "utf-8")
        os.replace(tmp, target)
        self._dirty_since = None

    def _mark_dirty(self, *, flush_now: bool = False) -> None:
        if self._dirty_since is None:
            self._dirty_since = time.monotonic()
        if flush_now or time.monotonic() - self._dirty_since >= _FLUSH_EVERY_S:
            self._flush_state()

    # ------------------------------------------------------------------ writes

    def _target(self) -> Tree:
        """The branch writes land on: `proposed` behind the review gate, main otherwise."""
        return self._proposed if self._proposed is not None else self._visible.tree

    async def write(self, puts: Sequence[Record], deletes: Sequence[str] = (), *, message: str | None = None,
                    expect: Mapping[str, int] | None = None,
                    keep: Mapping[str, Collection[str]] | None = None) -> None:
        if not puts and not deletes:
            return
        async with self._lock:
            if expect or keep:
                puts = self._as_resolved(puts, deletes, expect or {}, keep or {})
            await self._write_locked(puts, deletes, message, live_access={i for i, f in (keep or {}).items()
                                                                          if "access_count" in f})

    def _as_resolved(self, puts: Sequence[Record], deletes: Sequence[str], expect: Mapping[str, int],
                     keep: Mapping[str, Collection[str]]) -> Sequence[Record]:
        """On the branch writes land on, under the writer lock (a forget and a reinforce take it
        too): each id in `expect` is as the surface resolved the batch (absent for 0, this owner's
        at that revision otherwise), else StoreConflict; the puts in `keep` take the salience and
        access statistics held now (a touch during the commit is taken again after it)."""
        target = self._target()
        owners = {r.id: r.owner for r in puts}
        for record_id in dict.fromkeys([*owners, *deletes]):
            if record_id not in expect:
                continue
            held = target.records.get(record_id)
            if expect[record_id] == 0:
                if held is not None and held.owner == owners.get(record_id, held.owner):
                    raise StoreConflict(f"record {record_id!r} was written since this batch was resolved")
            elif held is None or held.revision != expect[record_id] or held.owner != owners.get(record_id, held.owner):
                raise StoreConflict(f"record {record_id!r} changed since this batch was resolved")
        out = []
        for record in puts:
            held, fields = target.records.get(record.id), keep.get(record.id, ())
            if fields and held is not None and held.owner == record.owner:
                record = record.with_(**{name: getattr(held, name) for name in fields})
            out.append(record)
        return out

    async def _write_locked(
        self, puts: Sequence[Record], deletes: Sequence[str], message: str | None, *, keep_access: bool = False,
        live_access: Collection[str] = (),
    ) -> None:
        """`write` for a caller that holds `self._lock`, so what it read to build `puts` is still current.

        `keep_access`: the puts do not change access statistics (a reinforce); `live_access`: the
        ids of puts that keep those of the record they replace (a keyed replace). `touch` does not
        take the lock, so recalls counted while the commit runs in its thread would be undone by
        the counts the puts were built with; the record's counts at the end of the commit are kept.
        """
        self._require_open()
        plan = self._plan(self._target(), puts, deletes, message)
        if not plan.files and not plan.removed:
            return
        await self._commit(plan)
        if keep_access or live_access:
            plan.puts = [(self._with_live_access(record) if keep_access or record.id in live_access else record,
                          path, seq) for record, path, seq in plan.puts]
        for record, _, _ in plan.puts:
            # The sidecar is keyed by id, and an id can be forgotten and written again: a put sets
            # the statistics it carries, none included, or a restart would revive the old counts.
            stats = (record.access_count, record.accessed_at)
            shown = self._visible.tree.records.get(record.id) if self._proposed is not None else None
            if shown is not None:
                # Behind the gate, an id main shows keeps main's statistics until approved: the
                # proposed record's go apart where they differ (a restart would show them to readers).
                self._set_stats(self._pending_access, record.id,
                                None if stats == (shown.access_count, shown.accessed_at) else stats)
            else:
                self._set_stats(self._pending_access, record.id, None)
                self._set_stats(self._access, record.id, stats if stats != (0, None) else None)
            if record.embedding is not None and self._dimensions is None:
                self._dimensions = len(record.embedding)
                self._dirty_since = self._dirty_since or time.monotonic()
        if self._proposed is not None:
            for record_id in plan.dropped:
                self._proposed.drop(record_id)
            for record, path, seq in plan.puts:
                self._proposed.set(record, path, seq)
        else:
            self._visible.apply(plan)
        for record_id in plan.dropped:  # gone from both branches: its statistics go with it
            if self._proposed is None or record_id not in self._proposed.records:
                self._set_stats(self._pending_access, record_id, None)
                if record_id not in self._visible.tree.records:
                    self._set_stats(self._access, record_id, None)
        if self._dirty_since is not None:
            self._flush_state()  # statistics a write carried were acknowledged with it

    def _set_stats(self, table: dict[str, tuple[int, str | None]], record_id: str,
                   stats: tuple[int, str | None] | None) -> None:
        """Set (None: remove) an id's entry in a sidecar table, marking the sidecar dirty if it changed."""
        if stats is None:
            changed = table.pop(record_id, None) is not None
        else:
            changed = table.get(record_id) != stats
            table[record_id] = stats
        if changed:
            self._dirty_since = self._dirty_since or time.monotonic()

    def _require_open(self) -> None:
        if self.repo is None:
            raise StoreUnavailable("the procedural store is not open")

    def _check_path_length(self, path: str, record: Record) -> None:
        """Refuse a file the file system cannot name: each segment is bounded by `files`, but owner
        and key together can still pass PATH_MAX, and the commit's ENAMETOOLONG would otherwise
        answer "tier unavailable" (-32603, an outage to the router) for an input that cannot be stored."""
        if self._path_max is None:
            root = self.path.absolute()
            try:
                limit = os.pathconf(root, "PC_PATH_MAX")
            except (OSError, ValueError):
                limit = 4096
            self._path_max = (limit if limit and limit > 0 else 4096) - len(os.fsencode(root)) - 2  # "/", NUL
        if len(path.encode("utf-8", "surrogatepass")) > self._path_max:
            raise StoreRejected(f"record {record.id[:80]!r}: its owner and key make a file path longer than "
                                f"the file system allows in {self.path}; use a shorter key")

    def _plan(self, tree: Tree, puts: Sequence[Record], deletes: Sequence[str], message: str | None) -> _Plan:
        """Validate everything and work out the change; raises StoreRejected before any byte is written."""
        plan = _Plan()
        paths = dict(tree.paths)  # id -> path after the batch so far
        by_path = dict(tree.by_path)
        final: dict[str, tuple[Record, str, int]] = {}
        verbs: list[str] = []
        seq = self._next_seq

        def remove(record_id: str) -> None:
            old = paths.pop(record_id, None)
            if old is not None:
                by_path.pop(old, None)
                plan.removed.add(old)
                plan.files.pop(old, None)
            final.pop(record_id, None)
            plan.dropped.add(record_id)

        for record_id in deletes:
            if record_id in paths:
                old_record = tree.records.get(record_id)
                remove(record_id)
                verbs.append(f"forget {_label(old_record) if old_record else record_id}")
        width = self._dimensions
        for record in puts:
            if record.embedding is not None:  # the surface checked the width it knew; a write since may have fixed it
                if width is None:
                    width = len(record.embedding)
                elif len(record.embedding) != width:
                    raise StoreWidthMismatch(width, len(record.embedding))
            path = files.record_path(record)  # validates the key
            self._check_path_length(path, record)
            if record.id in paths:  # ids are global: a put never takes over another owner's record
                held = final[record.id][0] if record.id in final else tree.records.get(record.id)
                if held is not None and held.owner != record.owner:
                    raise StoreIdTaken(record.id)
            data = files.dumps(record, seq)
            replacing = path in by_path
            occupant = by_path.get(path)
            if occupant is not None and occupant != record.id:
                remove(occupant)  # an occupied key is replaced: never two records on one file
            if paths.get(record.id) not in (None, path):
                remove(record.id)  # the record moved (its key or owner changed)
            paths[record.id] = path
            by_path[path] = record.id
            plan.files[path] = data
            plan.removed.discard(path)
            plan.dropped.discard(record.id)
            final[record.id] = (record, path, seq)
            seq += 1
            verbs.append(f"{'replace' if replacing else 'remember'} {_label(record)}")
        plan.puts = list(final.values())
        plan.message = message or _message(verbs)
        owners = [r.owner for r in puts] or [tree.records[i].owner for i in deletes if i in tree.records]
        owner = owners[0] if owners else None
        plan.author = owner_actor(owner) if owner is not None else self.identity
        return plan

    async def _commit(self, plan: _Plan) -> None:
        try:
            await anyio.to_thread.run_sync(self._commit_sync, plan)
        except StoreRejected:
            raise
        except Exception as exc:  # noqa: BLE001 - any git failure is the engine refusing
            raise StoreUnavailable(f"git commit failed in {self.path}: {exc}") from exc
        self._next_seq = max([self._next_seq, *(s + 1 for _, _, s in plan.puts)])

    def _commit_sync(self, plan: _Plan) -> None:
        repo = self.repo
        assert repo is not None
        if self._proposed is not None:
            self._commit_proposed(plan)
        else:
            try:
                self._commit_main(plan)
            except BaseException:
                self._rollback_main()
                raise
        self._push()

    def _stage(self, plan: _Plan) -> bytes:
        """Blobs and trees of the change into the object database; returns the new root tree."""
        assert self.repo is not None and self._trees is not None
        for path in plan.removed:
            self._trees.remove(path)
        for path, data in plan.files.items():
            stream = self._trees.odb.store(IStream("blob", len(data), io.BytesIO(data)))
            self._trees.set(path, _FILE_MODE, stream.binsha)
        return self._trees.write()

    def _reload_trees(self) -> None:
        """After a failed commit the in-memory trees may be ahead of the branch: rebuild them from it."""
        repo = self.repo
        assert repo is not None
        branch = repo.heads[PROPOSED] if self.review else repo.head
        self._trees = TreeBuilder.of_commit(repo, branch.commit)

    def _commit_main(self, plan: _Plan) -> None:
        repo = self.repo
        assert repo is not None
        for path in plan.removed:
            file = self.path / path
            file.unlink(missing_ok=True)
            _prune_dirs(file.parent, self.path)
        for path, data in plan.files.items():
            file = self.path / path
            file.parent.mkdir(parents=True, exist_ok=True)
            file.write_bytes(data)
        tree = GitTree(repo, self._stage(plan))
        commit = Commit.create_from_tree(
            repo, tree, plan.message, parent_commits=[repo.head.commit], head=False,
            author=plan.author, committer=self.identity,
        )
        set_ref(repo, repo.head.ref, commit, plan.message)  # the reflog line `head=True` writes
        self._update_index(plan)

    def _update_index(self, plan: _Plan) -> None:
        """Keep `.git/index` matching HEAD for people running `git status` in the live repository.

        Only the changed paths, by one `git update-index`: rewriting the whole index
        through GitPython is O(records). Cosmetic: a failure is logged, and
        recovery resets the index anyway.
        """
        assert self._trees is not None
        lines = [f"0 {'0' * 40}\t{path}" for path in plan.removed]
        for path in plan.files:
            directory, _, name = path.rpartition("/")
            mode, sha = self._trees.dirs[directory][name]
            assert sha is not None
            lines.append(f"{mode:o} {sha.hex()}\t{path}")
        try:
            subprocess.run(
                ["git", "update-index", "--index-info"], cwd=self.path, input="\n".join(lines) + "\n",
                text=True, check=True, capture_output=True, timeout=60,
                preexec_fn=die_with_parent(signal.SIGKILL),  # never touch the index after a crash
            )
        except (OSError, subprocess.SubprocessError) as exc:
            log.warning("procedural: could not update the index (git status may be stale): %s", exc)

    def _rollback_main(self) -> None:
        """Put the working tree and index back to HEAD after a failed commit."""
        try:
            self._recover_sync()
        finally:
            if self.repo is not None:
                self._reload_trees()

    def _commit_proposed(self, plan: _Plan) -> None:
        repo = self.repo
        assert repo is not None
        head = repo.heads[PROPOSED]
        try:
            tree = GitTree(repo, self._stage(plan))
            commit = Commit.create_from_tree(
                repo, tree, plan.message, parent_commits=[head.commit], head=False,
                author=plan.author, committer=self.identity,
            )
            set_ref(repo, head, commit, f"commit: {plan.message.splitlines()[0]}")
        except BaseException:
            self._reload_trees()
            raise

    def _push(self) -> None:
        if not self.remote or self.repo is None:
            return
        refspecs = [f"refs/heads/{self.main}:refs/heads/{self.main}"]
        if self.review:
            refspecs.append(f"refs/heads/{PROPOSED}:refs/heads/{PROPOSED}")
        try:
            self.repo.git.push("--quiet", self.remote, *refspecs, kill_after_timeout=PUSH_TIMEOUT_S)
            self.push_error = None
        except git.GitCommandError as exc:
            self.push_error = str(exc)
            log.warning("procedural: push to %s failed (will retry with the next commit): %s", self.remote, exc)

    # ----------------------------------------------------------- review gate

    @property
    def writes_visible(self) -> bool:
        """False behind the review gate: a write lands on `proposed`, recallable (and so told to
        readers, by `memory/approve`) only once approved. See `backends/store.py`."""
        return not self.review

    async def approve(self) -> "Approval":
        """Fast-forward main to `proposed`: the reviewed procedures become recallable."""
        async with self._lock:
            self._require_open()
            if self._proposed is None:
                raise StoreRejected("this procedural tier has no review gate (options.review is off)")
            result = await anyio.to_thread.run_sync(self._approve_sync)
            approval = Approval(result["approved"], result["commit"])
            if result["approved"]:
                shown = self._visible.tree
                self._visible = _Visible(self._proposed.copy())
                approval.written, approval.forgotten = _shown_changes(shown, self._visible.tree)
                # main is the proposed branch now, and so are its statistics
                for record_id in list(self._access):
                    if record_id not in self._proposed.records:
                        self._set_stats(self._access, record_id, None)
                for record_id, stats in list(self._pending_access.items()):
                    self._set_stats(self._pending_access, record_id, None)
                    self._set_stats(self._access, record_id, stats if stats != (0, None) else None)
                if self._dirty_since is not None:
                    self._flush_state()
            return approval

    def _approve_sync(self) -> dict[str, Any]:
        """Fast-forward main, or raise before main moves: StoreRejected for a state of the repository
        someone has to change first (said in the message), StoreUnavailable for git failing."""
        repo = self.repo
        assert repo is not None
        try:
            if repo.head.is_detached or repo.head.ref.name != self.main:
                raise StoreRejected(f"the repository {self.path} is not on {self.main} (checked out by hand?): "
                                    f"check out {self.main} there (git checkout {self.main}), then approve again")
            if PROPOSED not in repo.heads:
                raise StoreRejected(f"the {PROPOSED} branch is gone from {self.path} (deleted by hand?): "
                                    f"restart the tier server, which starts it again from {self.main}")
            main, proposed = repo.head.commit, repo.heads[PROPOSED].commit
            if main == proposed:
                return {"approved": 0, "commit": main.hexsha}
            if not repo.is_ancestor(main, proposed):
                raise StoreRejected(
                    f"{self.main} has moved since {PROPOSED} was started from it (a commit made by hand?), so it "
                    f"cannot be fast-forwarded: stop the tier server, merge {self.main} into {PROPOSED} in "
                    f"{self.path} (git checkout {PROPOSED} && git merge {self.main} && git checkout {self.main}), "
                    f"start it again and approve")
            count = int(repo.git.rev_list("--count", f"{main.hexsha}..{proposed.hexsha}"))
            repo.git.reset("-q")  # the index file is not kept current per commit
            repo.git.merge("--ff-only", "-q", PROPOSED)
        except git.GitCommandError as exc:
            raise self._approve_failure(exc) from exc
        except (git.GitError, OSError, ValueError) as exc:  # an unreadable ref or object
            raise StoreUnavailable(f"git could not approve in {self.path}: {exc}") from exc
        self._push()
        return {"approved": count, "commit": proposed.hexsha}

    def _approve_failure(self, exc: git.GitCommandError) -> Exception:
        """What a failed git command of an approve means to the caller (git speaks C here: GitPython
        runs it with LC_ALL=C). git checks the working tree and takes its locks before it moves main,
        so main is where it was."""
        stderr = exc.stderr if isinstance(exc.stderr, str) else str(exc)
        if "would be overwritten by merge" in stderr:
            paths = [line.strip() for line in stderr.splitlines() if line.startswith("\t")]
            named = f": {', '.join(paths[:10])}{' …' if len(paths) > 10 else ''}" if paths else ""
            return StoreRejected(f"files changed or added by hand in the working tree of {self.path} are in the "
                                 f"way of the approved procedures{named}; move them away or discard them (git "
                                 f"status there shows them), then approve again")
        lock = re.search(r"Unable to create '([^']+\.lock)'", stderr) or re.search(r"'([^']+\.lock)'", stderr)
        if lock is not None:
            return StoreUnavailable(f"another git process holds {lock.group(1)}: let it finish (or remove the "
                                    f"file if no git process is running in {self.path}), then approve again")
        detail = " ".join(stderr.split())[:500] or f"exit status {exc.status}"
        return StoreUnavailable(f"git could not fast-forward {self.main} to {PROPOSED} in {self.path}: {detail}")

    @asynccontextmanager
    async def locked(self) -> AsyncIterator[git.Repo]:
        """The repository under the writer lock, for a read-then-write that must be one step
        (`memory/restore`): write with `write_locked` inside it."""
        async with self._lock:
            self._require_open()
            assert self.repo is not None
            yield self.repo

    async def write_locked(self, puts: Sequence[Record], deletes: Sequence[str] = (), *,
                           message: str | None = None) -> None:
        """`write` inside `locked()`."""
        if puts or deletes:
            await self._write_locked(puts, deletes, message)

    async def run_git(self, fn: Any, *args: Any) -> Any:
        """Run `fn(repo, *args)` in a thread under the writer lock (the object database is not thread-safe);
        git failing is StoreUnavailable, as in every other method."""
        async with self._lock:
            self._require_open()
            try:
                return await anyio.to_thread.run_sync(fn, self.repo, *args)
            except git.GitError as exc:
                raise StoreUnavailable(f"git failed in {self.path}: {exc}") from exc

    # ------------------------------------------------------------------- reads

    def current(self, owner: str | None, key: str) -> Record | None:
        """The record at `key` on the branch writes land on (proposed behind the gate)."""
        tree = self._target()
        if tree is self._visible.tree:
            record_id = self._visible.keys.get((owner, key))
            return tree.records.get(record_id) if record_id else None
        try:
            record_id = tree.by_path.get(files.path_for(owner, key, ""))
        except StoreRejected:
            return None
        return tree.records.get(record_id) if record_id else None

    def holder(self, record_id: str) -> Record | None:
        """The record holding `record_id` on the branch writes land on, else on main (ids are global)."""
        for tree in (self._target(), self._visible.tree):
            record = tree.records.get(record_id)
            if record is not None:
                return record
        return None

    def path_of(self, owner: str | None, *, key: str | None = None, record_id: str | None = None) -> str | None:
        """The file a key or id lives at: None for an invalid key; for an id neither branch holds
        for `owner`, the file an unkeyed record of that id would have (see `held_at`)."""
        if key is not None:
            try:
                return files.path_for(owner, key, "")
            except StoreRejected:
                return None
        assert record_id is not None
        return self.held_at(owner, record_id) or files.path_for(owner, None, record_id)

    def held_at(self, owner: str | None, record_id: str) -> str | None:
        """The file `owner`'s record `record_id` lives at on the branch writes land on, else on main;
        None when neither holds it (forgotten, or never written)."""
        for tree in (self._target(), self._visible.tree):
            record = tree.records.get(record_id)
            if record is not None and record.owner == owner:
                return tree.paths[record_id]
        return None

    def _scoped(self, scope: Scope) -> list[Record]:
        session = scope.where.get("session")
        if isinstance(session, str):
            pool = self._visible.by_session.get((scope.owner, session), {})
        else:
            pool = self._visible.by_owner.get(scope.owner, {})
        ids = scope.named_ids()
        if ids is not None:
            candidates: Iterable[Record] = (pool[i] for i in dict.fromkeys(ids) if i in pool)
        else:
            candidates = pool.values()
        return [r for r in candidates if matches(r, scope)]

    def _order_key(self, record: Record) -> tuple[str, int]:
        return record.created_at, self._visible.tree.seqs.get(record.id, 0)

    async def get(self, owner: str | None, ids: Sequence[str], *, with_embeddings: bool = False) -> list[Record]:
        pool = self._visible.by_owner.get(owner, {})
        return [_out(pool[i], with_embeddings) for i in ids if i in pool]

    async def owners(self, ids: Sequence[str]) -> dict[str, str | None]:
        records = self._visible.tree.records
        return {i: records[i].owner for i in ids if i in records}

    async def get_keys(self, owner: str | None, keys: Sequence[str]) -> dict[str, Record]:
        out: dict[str, Record] = {}
        for key in keys:
            record_id = self._visible.keys.get((owner, key))
            if record_id is not None:
                out[key] = _out(self._visible.tree.records[record_id], False)
        return out

    # What a write is resolved against (the surface's `write_owners`/`write_keys` hook): the branch
    # writes land on. Behind the review gate that is `proposed`, not the main readers see, so a key
    # written twice before an approve is one record at revision 2, and an id written twice is one write.

    async def write_owners(self, ids: Sequence[str]) -> dict[str, str | None]:
        records = self._target().records
        return {i: records[i].owner for i in ids if i in records}

    async def write_keys(self, owner: str | None, keys: Sequence[str]) -> dict[str, Record]:
        tree, out = self._target(), {}
        for key in keys:
            path = self.path_of(owner, key=key)
            record_id = tree.by_path.get(path) if path is not None else None
            if record_id is not None:
                out[key] = _out(tree.records[record_id], False)
        return out

    async def select(
        self,
        scope: Scope,
        *,
        order: Literal["asc", "desc"] = "asc",
        limit: int | None = None,
        with_embeddings: bool = False,
    ) -> list[Record]:
        records = sorted(self._scoped(scope), key=self._order_key, reverse=order == "desc")
        if limit is not None:
            records = records[:limit]
        return [_out(r, with_embeddings) for r in records]

    async def search(
        self,
        scope: Scope,
        *,
        text: str | None,
        vector: Sequence[float] | None,
        limit: int,
        with_embeddings: bool = False,
    ) -> list[Record]:
        pool = self._visible.by_owner.get(scope.owner, {})
        lexical: dict[str, float] = {}
        if text:
            index = self._visible.bm25.get(scope.owner)
            if index is not None:
                lexical = {i: squash(s) for i, s in index.scores(text).items()}
        semantic: dict[str, float] = {}
        if vector is not None and len(vector):
            semantic = self._cosine(scope, vector)
        if not lexical and not semantic:
            return []
        both = bool(text) and vector is not None and bool(lexical or semantic)
        plain = scope.is_empty_selector()  # the owner's pool is already the scope: skip the matcher
        scored: list[tuple[float, Record]] = []
        for record_id in (lexical.keys() | semantic.keys()) if both else (lexical or semantic):
            record = pool.get(record_id)
            if record is None or not (plain or matches(record, scope)):
                continue
            if both:
                score = 0.5 * lexical.get(record_id, 0.0) + 0.5 * semantic.get(record_id, 0.0)
            else:
                score = lexical.get(record_id, semantic.get(record_id, 0.0))
            scored.append((score, record))
        seqs = self._visible.tree.seqs
        best = heapq.nsmallest(limit or len(scored), scored, key=lambda p: (-p[0], p[1].created_at, seqs.get(p[1].id, 0)))
        out = []
        for score, record in best:
            result = _out(record, with_embeddings)
            result.score = min(1.0, max(0.0, score))
            out.append(result)
        return out

    def _cosine(self, scope: Scope, vector: Sequence[float]) -> dict[str, float]:
        import numpy as np

        ids = [r.id for r in self._scoped(scope) if r.id in self._visible.vectors]
        query = np.asarray(vector, dtype=np.float32)
        norm = float(np.linalg.norm(query))
        ids = [i for i in ids if self._visible.vectors[i].shape == query.shape]
        if not ids or not norm:
            return {}
        sims = np.stack([self._visible.vectors[i] for i in ids]) @ (query / norm)
        return {i: float((s + 1.0) / 2.0) for i, s in zip(ids, sims.tolist())}

    async def delete(self, scope: Scope) -> int:
        """Forget what is in `scope` when the forget commits: the ids are chosen under the writer lock.

        Chosen before it, a record that a write waiting ahead of this one moves out of the
        scope (a keyed replace into another session) would be deleted by its bare id anyway.
        """
        async with self._lock:
            ids = self._in_scope_on_target(scope)
            if ids:
                await self._write_locked([], ids, None)
        return len(ids)

    def _in_scope_on_target(self, scope: Scope) -> list[str]:
        """The ids of `scope` (as recall sees it) whose record on the branch writes land on is in it too.

        Behind the review gate a forget is a proposal: a record whose proposed revision has left
        the scope is not in it, whatever main still shows. Call with `self._lock` held.
        """
        target = self._target()
        ids: list[str] = []
        for record in self._scoped(scope):
            held = target.records.get(record.id)
            if held is not None and matches(held, scope):
                ids.append(record.id)
        return ids

    async def touch(self, owner: str | None, ids: Sequence[str], at: str) -> dict[str, int]:
        pool = self._visible.by_owner.get(owner, {})
        changed = False
        counts: dict[str, int] = {}
        for record_id in ids:
            record = pool.get(record_id)
            if record is None:
                continue
            updated = replace(record, access_count=record.access_count + 1, accessed_at=at)
            self._visible.replace_record(updated)
            if self._proposed is not None and record_id in self._proposed.records:
                self._proposed.records[record_id] = replace(
                    self._proposed.records[record_id], access_count=updated.access_count, accessed_at=at
                )
                self._pending_access.pop(record_id, None)  # the proposed record counts it too: main's again
            self._access[record_id] = (updated.access_count, at)
            counts[record_id] = updated.access_count
            changed = True
        if changed:
            self._mark_dirty()
        return counts

    async def reinforce(self, owner: str | None, ids: Sequence[str], amount: float) -> int:
        """Change the salience of the records as they are when the reinforce commits, and nothing else.

        The records are read under the writer lock: read before it, a keyed replace committing
        meanwhile would be undone by the old copy (content and revision) written back after it.
        """
        async with self._lock:
            pool = self._visible.by_owner.get(owner, {})
            found = [i for i in dict.fromkeys(ids) if i in pool]
            changed = self._reinforced(owner, found, amount)
            if changed:
                label = _label(changed[0]) if len(changed) == 1 else f"{len(changed)} records"
                await self._write_locked(changed, (), f"reinforce {label} ({amount:+g})", keep_access=True)
        return len(found)

    def _reinforced(self, owner: str | None, ids: Sequence[str], amount: float) -> list[Record]:
        """The records at `ids` on the branch writes land on, with `amount` added to their salience.

        That branch, not main: behind the review gate main's copy may be older than the proposed
        one. Records whose salience does not change (already at a bound) are left out, and so is
        an id the branch no longer holds. Call with `self._lock` held.
        """
        target = self._target()
        changed: list[Record] = []
        for record_id in ids:
            record = target.records.get(record_id)
            if record is None or record.owner != owner:
                continue
            salience = min(1.0, max(0.0, record.salience + amount))
            if salience != record.salience:
                changed.append(record.with_(salience=salience))
        return changed

    def _with_live_access(self, record: Record) -> Record:
        """`record` with the access statistics its id has now on the branch writes land on.

        For a write that does not change them (`keep_access`), applied after its commit: a
        `touch` during the commit counted on the record as it was, and must not be lost.
        """
        live = self._target().records.get(record.id)
        if live is None:
            return record
        return replace(record, access_count=live.access_count, accessed_at=live.accessed_at)

    async def sessions(self, owner: str | None) -> list[SessionInfo]:
        info: dict[str, SessionInfo] = {}
        for record in self._visible.by_owner.get(owner, {}).values():
            if record.session is None:
                continue
            entry = info.setdefault(record.session, SessionInfo(record.session, 0, record.created_at, record.created_at))
            entry.records += 1
            entry.opened_at = min(entry.opened_at or record.created_at, record.created_at)
            latest = max(record.created_at, record.accessed_at or "")
            entry.touched_at = max(entry.touched_at or latest, latest)
        return sorted(info.values(), key=lambda s: s.session)

    async def count(self, owner: str | None) -> int:
        return len(self._visible.by_owner.get(owner, {}))

    async def dimensions(self) -> int | None:
        return self._dimensions


@dataclass(slots=True)
class Approval:
    """What an approve did: commits merged, main's head, and what readers see differently now."""

    approved: int
    commit: str
    written: list[Record] = field(default_factory=list)  # shown now and not so before, in write order
    forgotten: list[Record] = field(default_factory=list)  # shown before and gone now (as they were)

    def to_wire(self) -> dict[str, Any]:
        return {"approved": self.approved, "commit": self.commit}


def _shown_changes(before: Tree, after: Tree) -> tuple[list[Record], list[Record]]:
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


def _label(record: Record) -> str:
    return f"{record.key} (rev {record.revision})" if record.key is not None else record.id


def _message(verbs: list[str]) -> str:
    """One subject line a reviewer can scan; the full list in the body for a batch."""
    if len(verbs) == 1:
        return verbs[0]
    counts: dict[str, int] = {}
    for verb in verbs:
        counts[verb.split(" ", 1)[0]] = counts.get(verb.split(" ", 1)[0], 0) + 1
    subject = ", ".join(f"{v} {n}" for v, n in counts.items()) + f" record{'s' if len(verbs) > 1 else ''}"
    return subject + "\n\n" + "\n".join(f"- {v}" for v in verbs)


def _prune_dirs(directory: Path, root: Path) -> None:
    """Remove directories a forget left empty, so the tree on disk matches git's (which has no empty dirs)."""
    while directory != root and directory.is_relative_to(root):
        try:
            directory.rmdir()
        except OSError:
            return
        directory = directory.parent
