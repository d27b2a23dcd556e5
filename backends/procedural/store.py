"""GitStore: procedural memory as a git repository, one Markdown file per record.

The store composes the package's parts (each module says why it works as it does):

- `files`: a record as a Markdown file, and where in the repository it lives.
- `objects`: commits written in-process, on disk before a branch names them.
- `commits`: what a write changes, who it is by, and its message.
- `index`: the records in memory, and recall (BM25, vectors) over them.
- `review`: the review gate's branch, its fast-forward, what an approve showed.
- `recovery`: one store per repository, and a crash's leftovers discarded at open.
- `sidecar`: access statistics, kept in `.git/a2m/state.json` rather than in the history.
- `history`: the extension methods (history, restore, approve) over this store.

What the store itself decides:

- **One writer.** Writes hold an asyncio lock and run in a worker thread; the
  in-memory index changes only after the commit landed, so a reader never sees
  a write that could still fail.
- **Access statistics are not history.** `touch` counts a recall in the
  sidecar, never in a commit; `reinforce` changes `salience`, a deliberate
  judgement kept in the file, so it is a commit.
- **Review gate** (`options["review"]`): writes commit to the `proposed`
  branch and recall sees main only, until `approve` fast-forwards main.
- **Case-folding file systems** (macOS's default, Windows; found by a probe at
  open, or said by `options["case_insensitive"]`): a new repository takes the
  `case-escaped` layout (`files.Layout`), so owners and ids never share a file;
  a write whose path is one file with another of the owner's (keys `Deploy` and
  `deploy`) is refused, and a repository that already holds such a pair is not
  opened there (`_check_folding`).
- **Remote** (`options["remote"]`): pushed after each commit. A failed push (or
  one cut off after `PUSH_TIMEOUT_S`) is logged and retried with the next commit; the local repository is the
  source of truth and a write is not refused because a mirror is down.
"""

from __future__ import annotations

import io
import logging
import os
import signal
import subprocess
import tempfile
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, AsyncIterator, Collection, Iterable, Literal, Mapping, Sequence

import anyio
import git
from git.objects.commit import Commit
from git.objects.tree import Tree as GitTree
from gitdb.base import IStream

from a2m.filters import Scope, matches
from a2m.records import Record
from a2m.timefmt import shift_ms
from backends.children import die_with_parent
from backends.settings import TierSettings
from backends.store import (Position, SessionInfo, StoreConflict, StoreIdTaken, StoreRejected, StoreUnavailable,
                            StoreWidthMismatch)

from . import files
from .commits import Plan, actor, label, message as commit_message, owner_actor, prune_dirs
from .index import Tree, Visible, copy_out
from .objects import FILE_MODE, InProcessObjectDB, TreeBuilder, fsync_ref, in_process_odb, set_ref
from .recovery import check_place, hold, recover
from .review import PROPOSED, Approval, base_proposed, fast_forward, shown_changes, warn_unapproved
from .sidecar import NO_STATS, Sidecar

log = logging.getLogger("a2m.procedural")

# A push runs under the writer lock: a remote that never answers must not hold every write with it.
PUSH_TIMEOUT_S = 30.0
GC_AUTO = 6700  # git's default `gc.auto`: loose objects past which `git gc --auto` packs them
PACK_TIMEOUT_S = 600.0


class GitStore:
    """The procedural tier's store (the `backends.store` seam) over one git repository.

    Reads answer from memory (`Visible`, main's records); writes plan a change (`Plan`), commit it
    in a worker thread under the one writer lock, and only then update memory, the sidecar, and the
    remote. Behind the review gate writes land on `proposed` (`_proposed`) until `approve`."""

    engine = "git"
    searches_vectors = True

    def __init__(self, settings: TierSettings) -> None:
        self.settings = settings
        self.path = Path(settings.url) if settings.url else Path(settings.data_dir) / "repo"
        options = settings.options or {}
        self.review = bool(options.get("review", False))
        self.remote: str | None = options.get("remote") or None
        self.identity = actor(options.get("author"), git.Actor("a2m", "a2m@a2m.local"))
        # Whether the working tree's file system folds case: None until the probe at open (or set by the option).
        self.folds_case: bool | None = True if options.get("case_insensitive") else None
        self.layout = files.Layout()  # read from the repository at open
        self.repo: git.Repo | None = None
        self.main = "main"
        self._lock = anyio.Lock()  # one writer (and one user of the repo's object database)
        # Serialises every write that resolves keys: the surface holds it from resolving a batch's keys
        # to its write (`TierServer` takes a store's `key_lock`), `memory/restore` for its whole step.
        self.key_lock = anyio.Lock()
        self._trees: TreeBuilder | None = None  # the trees of the branch writes commit to
        self._visible = Visible(Tree())
        self._proposed: Tree | None = None
        self._sidecar = Sidecar()  # access statistics and the vector width, in .git/a2m/state.json
        self._next_seq = 1
        self.push_error: str | None = None
        self._lock_fd: int | None = None  # the flock that makes this the repository's one store
        self._path_max: int | None = None  # bytes a repository-relative path may have (PATH_MAX less the root)
        self._pack_after = GC_AUTO  # loose objects that make a commit pack them (`_pack_if_due`): its `gc.auto`

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
        if (self.path / ".git").exists():
            repo = git.Repo(self.path, odbt=InProcessObjectDB)
        else:
            check_place(self.path)
            self.path.mkdir(parents=True, exist_ok=True)
            repo = git.Repo.init(self.path, initial_branch="main", odbt=InProcessObjectDB)
        try:
            self._lock_fd = hold(Path(repo.git_dir), self.path)
        except BaseException:
            repo.close()
            raise
        self.repo = repo
        self._state_dir.mkdir(exist_ok=True)
        recover(repo, self.path)  # first: it clears the lock files a crash left, `config.lock` among them
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
            in_process_odb(repo).sync()  # then the unborn branch, as `head=True` would make it
            fsync_ref(repo, git.Head.create(repo, repo.head.ref.path, commit, logmsg=f"commit (initial): {message}"))
            index.write()  # a valid (empty) index: git refuses a missing-but-truncated one
        self.main = repo.active_branch.name
        if self.folds_case is None:
            self.folds_case = folds_case(self._state_dir)
        self.layout = self._read_layout(repo)
        self._sidecar.load(self._state_dir / "state.json")
        # From the commit, not the working tree: git writes that through the user's config and attributes
        # (`core.autocrlf`, `eol`), and the store holds what was committed, byte for byte.
        tree = self._load_tree(self._iter_commit(repo.head.commit))
        self._visible = Visible(tree)
        if self.review:
            if base_proposed(repo, self.main, self.path):
                self._sidecar.pending.clear()  # no proposed record differs from main's
            proposed = repo.heads[PROPOSED].commit
            self._proposed = self._load_tree(self._iter_commit(proposed), self._sidecar.pending)
        else:
            warn_unapproved(repo, self.main, self.path)
        self._check_folding(tree, self._proposed)
        self._trees = TreeBuilder.of_commit(repo, repo.heads[PROPOSED].commit if self.review else repo.head.commit)
        self._pack_after = gc_auto(repo)
        self._trees.odb.stored = loose_objects(self.path)  # a repository from before this packing too
        if self._sidecar.dimensions is None:
            self._sidecar.dimensions = next(
                (len(r.embedding) for r in tree.records.values() if r.embedding is not None), None
            )

    def _read_layout(self, repo: git.Repo) -> files.Layout:
        """The layout main's commit records; on a case-folding file system a repository holding no record
        yet on either branch takes the case-escaped one first (a commit of `LAYOUT_FILE`), as no path moves."""
        try:
            text: str | None = (repo.head.commit.tree / files.LAYOUT_FILE).data_stream.read().decode("utf-8")
        except KeyError:
            text = None
        layout = files.Layout.parse(text)  # ValueError for a layout this version does not know: not opened
        if layout.escape_case or not self.folds_case:
            return layout
        heads = [repo.head.commit, *([repo.heads[PROPOSED].commit] if PROPOSED in repo.heads else [])]
        if any(next(self._iter_commit(commit), None) is not None for commit in heads):
            return layout  # the first layout stays; `_check_folding` refuses what is one file here
        layout = files.Layout(escape_case=True)
        data = layout.file()
        (self.path / files.LAYOUT_FILE).write_bytes(data)
        trees = TreeBuilder.of_commit(repo, repo.head.commit)
        trees.set(files.LAYOUT_FILE, FILE_MODE, trees.odb.store(IStream("blob", len(data), io.BytesIO(data))).binsha)
        message = "record the case-escaped layout (this file system folds case)"
        commit = Commit.create_from_tree(repo, GitTree(repo, trees.write()), message, parent_commits=[repo.head.commit],
                                         head=False, author=self.identity, committer=self.identity)
        set_ref(repo, repo.head.ref, commit, f"commit: {message}")
        repo.git.reset("-q")  # the index to the new commit
        return layout

    def _check_folding(self, main: Tree, proposed: Tree | None) -> None:
        """On a case-folding file system, refuse to open a repository two of whose records are one file
        there (written on Linux, or before this check): git checks out only one of them, so the working
        tree, `git status` and every approve's merge would disagree with the commits for good."""
        if not self.folds_case:
            return
        clashes = [pair for tree in (main, proposed) if tree is not None for pair in files.folding_clashes(tree.by_path)]
        if clashes:
            named = "; ".join(f"{a} and {b}" for a, b in list(dict.fromkeys(clashes))[:10])
            raise StoreUnavailable(
                f"the procedural repository {self.path} is on a file system that folds case, where these records "
                f"are one file: {named}. Serve it from a case-sensitive file system, or rename one of each pair "
                f"there (git mv, commit) and start again")

    def _release(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing releases the flock
            self._lock_fd = None

    @property
    def _state_dir(self) -> Path:
        assert self.repo is not None
        return Path(self.repo.git_dir) / "a2m"

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
            except ValueError as exc:
                log.warning("procedural: skipping %s, not a record file: %s", path, exc)
                continue
            self._warn_if_moved(path, record)
            if overrides is not None and record.id in overrides:
                count, at = overrides[record.id]
            else:
                count, at = self._sidecar.access.get(record.id, NO_STATS)
            tree.set(replace(record, access_count=count, accessed_at=at), path, seq)
            self._next_seq = max(self._next_seq, seq + 1)
        self._own_seqs(tree)
        return tree

    def _warn_if_moved(self, path: str, record: Record) -> None:
        """Say so where a file is not where its header places it (a reviewer's `git mv`): the header
        decides what it is, but a write of its key looks at the header's place, finds nothing there and
        makes a second record with that key (review-procedural). Moving it back, or editing the
        header to match, ends it."""
        try:
            placed = self.layout.record_path(record)
        except (ValueError, StoreRejected):  # the layout refuses a key that cannot be a path (`a//b`)
            return  # a key this layout cannot hold: reads still serve it; nothing can be written to it
        if path != placed:
            log.warning("procedural: %s holds the record %r (owner %r, key %r), whose place is %s: a key "
                        "written again makes a second record; move the file back or edit its header",
                        path, record.id, record.owner, record.key, placed)

    def _own_seqs(self, tree: Tree) -> None:
        """A sequence of its own for each record of `tree`. A file committed by hand has none (0), or
        the `seq` of the file it was copied from; but the timeline cursor places a record by
        (created_at, seq) (decision 120), and of two records in one place a walk passes both at
        once. The first by path keeps its sequence, the others take new ones after every other."""
        held: set[int] = set()
        clashing = []
        for record_id in sorted(tree.seqs, key=tree.paths.__getitem__):
            if tree.seqs[record_id] in held:
                clashing.append(record_id)
            held.add(tree.seqs[record_id])
        for record_id in clashing:
            tree.seqs[record_id] = self._next_seq
            self._next_seq += 1

    def _flush_state(self) -> None:
        """Write the sidecar if it changed and the repository is open (a touch may come after a close)."""
        if self.repo is not None:
            self._sidecar.save(self._state_dir / "state.json")

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
            shown = self._visible.tree.records.get(record.id) if self._proposed is not None else None
            self._sidecar.put(record.id, (record.access_count, record.accessed_at),
                              None if shown is None else (shown.access_count, shown.accessed_at))
            if record.embedding is not None and self._sidecar.dimensions is None:
                self._sidecar.dimensions = len(record.embedding)
                self._sidecar.changed()
        if self._proposed is not None:
            for record_id in plan.dropped:
                self._proposed.drop(record_id)
            for record, path, seq in plan.puts:
                self._proposed.set(record, path, seq)
        else:
            self._visible.apply(plan.dropped, plan.puts)
        for record_id in plan.dropped:  # gone from both branches: its statistics go with it
            if self._proposed is None or record_id not in self._proposed.records:
                self._sidecar.forget(record_id, shown=record_id in self._visible.tree.records)
        self._flush_state()  # statistics a write carried were acknowledged with it

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

    def _plan(self, tree: Tree, puts: Sequence[Record], deletes: Sequence[str], message: str | None) -> Plan:
        """Validate everything and work out the change; raises StoreRejected before any byte is written."""
        plan = Plan()
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
                verbs.append(f"forget {label(old_record) if old_record else record_id}")
        width = self._sidecar.dimensions
        for record in puts:
            if record.embedding is not None:  # the surface checked the width it knew; a write since may have fixed it
                if width is None:
                    width = len(record.embedding)
                elif len(record.embedding) != width:
                    raise StoreWidthMismatch(width, len(record.embedding))
            path = self.layout.record_path(record)  # validates the key
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
            verbs.append(f"{'replace' if replacing else 'remember'} {label(record)}")
        plan.puts = list(final.values())
        if self.folds_case:
            self._refuse_folding(by_path, plan, tree)
        plan.message = message or commit_message(verbs)
        owners = [r.owner for r in puts] or [tree.records[i].owner for i in deletes if i in tree.records]
        owner = owners[0] if owners else None
        plan.author = owner_actor(owner) if owner is not None else self.identity
        return plan

    def _refuse_folding(self, by_path: dict[str, str], plan: Plan, tree: Tree) -> None:
        """StoreRejected for a write of a file that is one file with another record's where case folds.
        In the case-escaped layout the other is the writer's own (owners never fold together), named
        then; in the first layout it may be another owner's, and the refusal names nothing of it."""
        clashes = files.folding_clashes(by_path, plan.files)
        if not clashes:
            return
        held, written = clashes[0]
        records = {**tree.records, **{r.id: r for r, _, _ in plan.puts}}
        mine, other = records[by_path[written]], records[by_path[held]]
        what = f"key {mine.key!r}" if mine.key is not None else f"id {mine.id!r}"
        if other.owner == mine.owner:
            theirs = f"key {other.key!r}" if other.key is not None else f"id {other.id!r}"
            raise StoreRejected(f"{what} and this owner's {theirs} differ only in case (or Unicode normalisation), "
                                f"and the procedural tier's file system folds them into one file; use another")
        raise StoreRejected(f"{what} cannot be stored: this procedural repository keeps owner names' case in its "
                            f"paths (its first layout) on a file system that folds case")

    async def _commit(self, plan: Plan) -> None:
        try:
            await anyio.to_thread.run_sync(self._commit_sync, plan)
        except StoreRejected:
            raise
        except Exception as exc:  # noqa: BLE001 - any git failure is the engine refusing
            raise StoreUnavailable(f"git commit failed in {self.path}: {exc}") from exc
        self._next_seq = max([self._next_seq, *(s + 1 for _, _, s in plan.puts)])

    def _commit_sync(self, plan: Plan) -> None:
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
        self._pack_if_due()

    def _pack_if_due(self) -> None:
        """Pack the loose objects once the repository's `gc.auto` of them are stored (git's 6,700 by default;
        0 leaves it to the user), after a commit, under the writer lock: `git repack -d` (those objects into
        one pack, their files removed), then `git gc --auto` (which merges packs past `gc.autoPackLimit`).

        Why: objects are stored in-process (`InProcessObjectDB`), one loose file each (a keyed rewrite
        stores ~6: its blob, the trees on its path, the commit), and only git's porcelain packs them
        (`git commit` runs `gc --auto`). Without it a tier that rewrites its skills grew by a file an
        object for ever: 4,370 loose files and 17 MB after 500 rewrites of 120 records in a soak. Counted
        here, not left to `gc --auto`'s own estimate (the objects in one of the 256 fan-out directories),
        so the bound is exact. A failure is logged: the commit it follows stands."""
        odb = self._trees.odb if self._trees is not None else None
        if odb is None or self._pack_after <= 0 or odb.stored < self._pack_after or odb.unsynced:
            return
        odb.stored = 0
        for command in (["repack", "-d", "-q"], ["-c", "gc.autoDetach=false", "gc", "--auto", "--quiet"]):
            try:
                subprocess.run(["git", *command], cwd=self.path, check=True, capture_output=True,
                               timeout=PACK_TIMEOUT_S, preexec_fn=die_with_parent(signal.SIGKILL))
            except (OSError, subprocess.SubprocessError) as exc:  # tried again after as many more objects
                log.warning("procedural: git %s failed (its loose objects stay until the next try): %s",
                            "gc --auto" if "gc" in command else "repack", exc)
                return

    def _stage(self, plan: Plan) -> bytes:
        """Blobs and trees of the change into the object database; returns the new root tree."""
        assert self.repo is not None and self._trees is not None
        for path in plan.removed:
            self._trees.remove(path)
        for path, data in plan.files.items():
            stream = self._trees.odb.store(IStream("blob", len(data), io.BytesIO(data)))
            self._trees.set(path, FILE_MODE, stream.binsha)
        return self._trees.write()

    def _reload_trees(self) -> None:
        """After a failed commit the in-memory trees may be ahead of the branch: rebuild them from it."""
        repo = self.repo
        assert repo is not None
        branch = repo.heads[PROPOSED] if self.review else repo.head
        self._trees = TreeBuilder.of_commit(repo, branch.commit)

    def _commit_main(self, plan: Plan) -> None:
        repo = self.repo
        assert repo is not None
        for path in plan.removed:
            file = self.path / path
            file.unlink(missing_ok=True)
            prune_dirs(file.parent, self.path)
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

    def _update_index(self, plan: Plan) -> None:
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
            assert self.repo is not None
            recover(self.repo, self.path)
        finally:
            if self.repo is not None:
                self._reload_trees()

    def _commit_proposed(self, plan: Plan) -> None:
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

    async def approve(self) -> Approval:
        """Fast-forward main to `proposed`: the reviewed procedures become recallable."""
        async with self._lock:
            self._require_open()
            if self._proposed is None:
                raise StoreRejected("this procedural tier has no review gate (options.review is off)")
            approval = Approval(*await anyio.to_thread.run_sync(self._approve_sync))
            if approval.approved:
                shown = self._visible.tree
                self._visible = Visible(self._proposed.copy())
                approval.written, approval.forgotten = shown_changes(shown, self._visible.tree)
                self._sidecar.approve(self._proposed.records)
                self._flush_state()
            return approval

    def _approve_sync(self) -> tuple[int, str]:
        """`fast_forward` main, pushing what it approved."""
        assert self.repo is not None
        approved, commit = fast_forward(self.repo, self.main, self.path)
        if approved:
            self._push()
        return approved, commit

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
            record_id = tree.by_path.get(self.layout.path_for(owner, key, ""))
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
                return self.layout.path_for(owner, key, "")
            except StoreRejected:
                return None
        assert record_id is not None
        return self.held_at(owner, record_id) or self.layout.path_for(owner, None, record_id)

    def held_at(self, owner: str | None, record_id: str) -> str | None:
        """The file `owner`'s record `record_id` lives at on the branch writes land on, else on main;
        None when neither holds it (forgotten, or never written)."""
        for tree in (self._target(), self._visible.tree):
            record = tree.records.get(record_id)
            if record is not None and record.owner == owner:
                return tree.paths[record_id]
        return None

    async def get(self, owner: str | None, ids: Sequence[str], *, with_embeddings: bool = False) -> list[Record]:
        pool = self._visible.by_owner.get(owner, {})
        return [copy_out(pool[i], with_embeddings) for i in ids if i in pool]

    async def owners(self, ids: Sequence[str]) -> dict[str, str | None]:
        records = self._visible.tree.records
        return {i: records[i].owner for i in ids if i in records}

    async def get_keys(self, owner: str | None, keys: Sequence[str]) -> dict[str, Record]:
        out: dict[str, Record] = {}
        for key in keys:
            record_id = self._visible.keys.get((owner, key))
            if record_id is not None:
                out[key] = copy_out(self._visible.tree.records[record_id], False)
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
                out[key] = copy_out(tree.records[record_id], False)
        return out

    async def select(
        self,
        scope: Scope,
        *,
        order: Literal["asc", "desc"] = "asc",
        limit: int | None = None,
        with_embeddings: bool = False,
    ) -> list[Record]:
        records = sorted(self._visible.scoped(scope), key=self._visible.order_key, reverse=order == "desc")
        if limit is not None:
            records = records[:limit]
        return [copy_out(r, with_embeddings) for r in records]

    async def timeline_page(self, scope: Scope, *, below: Position | None, limit: int | None,
                            with_embeddings: bool = False) -> list[tuple[Record, Position]]:
        if below is not None and (bound := shift_ms(below[0], 1)) is not None:  # as select narrows by time
            scope = replace(scope, before=bound if scope.before is None else min(scope.before, bound))
        order, records = self._visible.order_key, self._visible.scoped(scope)
        if below is not None:  # only below's own millisecond is left to compare by sequence
            records = [r for r in records if r.created_at < below[0] or order(r) < below[:2]]
        records.sort(key=order, reverse=True)  # each seq is a record's own (_own_seqs): no tie for the id
        return [(copy_out(r, with_embeddings), (*order(r), r.id)) for r in records[:limit]]

    async def search(
        self,
        scope: Scope,
        *,
        text: str | None,
        vector: Sequence[float] | None,
        limit: int,
        with_embeddings: bool = False,
    ) -> list[Record]:
        best = self._visible.ranked(scope, text, vector, limit)
        out = []
        for score, record in best:
            result = copy_out(record, with_embeddings)
            result.score = min(1.0, max(0.0, score))
            out.append(result)
        return out

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
        for record in self._visible.scoped(scope):
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
                self._sidecar.pending.pop(record_id, None)  # the proposed record counts it too: main's again
            self._sidecar.access[record_id] = (updated.access_count, at)
            counts[record_id] = updated.access_count
            changed = True
        if changed:
            self._sidecar.changed()
            if self._sidecar.due():
                self._flush_state()
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
                named = label(changed[0]) if len(changed) == 1 else f"{len(changed)} records"
                await self._write_locked(changed, (), f"reinforce {named} ({amount:+g})", keep_access=True)
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
        return self._sidecar.dimensions




def gc_auto(repo: git.Repo) -> int:
    """The repository's `gc.auto` (git's default where unset, or set in a form this does not read: `7k`)."""
    value = repo.config_reader().get_value("gc", "auto", GC_AUTO)
    return value if isinstance(value, int) else GC_AUTO


def loose_objects(path: Path) -> int:
    """How many loose objects the repository at `path` holds (`git count-objects`)."""
    counted = subprocess.run(["git", "count-objects"], cwd=path, capture_output=True, text=True, check=True)
    return int(counted.stdout.split()[0])


def folds_case(directory: Path) -> bool:
    """Whether `directory`'s file system folds case: a file made there is found by its name in the other case
    (as `git init` probes for `core.ignorecase`; that setting is not read, as it travels with a copied repository)."""
    fd, name = tempfile.mkstemp(prefix="case-probe-", dir=directory)
    os.close(fd)
    try:
        swapped = Path(name).with_name(Path(name).name.swapcase())
        return swapped.exists() and os.path.samefile(name, swapped)
    finally:
        os.unlink(name)
