"""Git objects and refs, written in-process and durably.

A write is one commit made with GitPython's object layer (blobs into the
object database, trees, a commit, a ref update) rather than by spawning
`git add`/`git commit`: no hooks, no process per write, and the ref update is
the single atomic step that makes a write exist. Two things make that safe:

- **Objects are written in-process** (`InProcessObjectDB`): each object is a
  temp file renamed into place, complete or absent, never the empty commit a
  killed `git hash-object` pipe leaves (`EMPTY_COMMIT`).
- **A commit is on disk before its branch names it** (decision 108): gitdb
  fsyncs nothing, so `set_ref` fsyncs the write's objects and their
  directories first, then moves the ref and fsyncs it.

`TreeBuilder` keeps a branch's trees in memory so that a commit stores only
the trees on the paths it touched, whatever the size of the repository.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any, Iterable

import git
from git.db import GitCmdObjectDB
from git.objects.commit import Commit
from gitdb import LooseObjectDB
from gitdb.base import IStream

FILE_MODE = 0o100644
TREE_MODE = 0o040000
EMPTY_COMMIT = "dcf5b16e76cce7425d0beaef62d79a7d10fce1f5"  # `git hash-object -t commit --literally </dev/null`


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
        self.stored = 0  # objects stored (each a loose file) since the store last asked git to pack them
        # Fan-out directories (objects/ab/) whose entry in objects/ is on disk: those there at open,
        # and those a `sync` made durable since.
        self._durable_dirs = {entry.path for entry in os.scandir(root_path) if entry.is_dir()}

    def store(self, istream: IStream) -> IStream:
        istream = LooseObjectDB.store(self, istream)
        self.unsynced.add(self.db_path(self.object_path(istream.hexsha)))
        self.stored += 1
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
    in_process_odb(repo).sync()
    ref.set_commit(commit, logmsg=logmsg)
    fsync_ref(repo, ref)


def fsync_ref(repo: git.Repo, ref: git.Reference) -> None:
    """fsync a ref's file and the directory that names it."""
    path = Path(repo.common_dir) / ref.path
    fsync_path(path)
    fsync_path(path.parent)


def in_process_odb(repo: git.Repo) -> InProcessObjectDB:
    """`repo`'s object database, which must be the store's own (`git.Repo(..., odbt=InProcessObjectDB)`):
    any other would write objects that no `sync` makes durable before a ref names them."""
    if not isinstance(repo.odb, InProcessObjectDB):
        raise TypeError(f"the repository at {repo.working_dir} was not opened with odbt=InProcessObjectDB")
    return repo.odb


class TreeBuilder:
    """A branch's git trees kept in memory, so a commit rewrites only the directories it touched.

    GitPython's `IndexFile.write_tree` rebuilds every tree from the whole index
    and `IndexFile.write` re-serialises it: both O(records) per commit, ~150 ms
    at 2,000 procedures. Here a one-record commit stores its blob and the few
    trees on its path, whatever the size of the repository.
    """

    def __init__(self, repo: git.Repo, entries: Iterable[tuple[str, int, bytes]]) -> None:
        self.odb = in_process_odb(repo)
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
        self.dirs[parent][base] = (TREE_MODE, None)

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
            if mode == TREE_MODE:
                sha = self.write(f"{directory}/{name}" if directory else name)
            assert sha is not None
            items.append((sha, mode, name))
        items.sort(key=lambda e: e[2] + "/" if e[1] == TREE_MODE else e[2])  # git's tree order
        # Serialised here: GitPython's tree_to_stream re-validates every name on every commit.
        data = b"".join(b"%o %s\0%s" % (mode, name.encode("utf-8"), sha) for sha, mode, name in items)
        sha = self.odb.store(IStream("tree", len(data), io.BytesIO(data))).binsha
        self.shas[directory] = sha
        self.dirty.discard(directory)
        return sha

