"""The procedural tier's extension methods: history, restore, approve.

A procedure is only as trustworthy as the ability to see who changed it and to
undo the change, so git's history is exposed on the wire instead of only to
people with a clone. These are extensions (listed in describe's `methods` and
described under `extensions`); `capabilities` keeps only the protocol's names.

A handler is `async (params, ctx) -> dict`; `ctx.owner(params)` gives the
owner the request is scoped to (the surface decides trust, not this module).
"""

from __future__ import annotations

import re
from typing import Any, Awaitable, Callable

import anyio
import git

from a2m.errors import SCOPE_DENIED, A2MError, invalid
from a2m.events import EventLog
from a2m.records import Record, new_id
from a2m.timefmt import format_ts
from backends.store import StoreIdTaken, StoreRejected

from . import files
from .review import PROPOSED, Approval
from .store import GitStore

Handler = Callable[[dict[str, Any], Any], Awaitable[dict[str, Any]]]

_COMMIT = re.compile(r"[0-9a-fA-F]{4,40}")
MAX_HISTORY = 1000

EXTENSION_DOCS: dict[str, Any] = {
    "memory/history": {
        "summary": "The revisions of one procedure, newest first: every commit that changed its file.",
        "params": {"key": "string (or id)", "id": "string (or key)", "limit": "int, default 100, at most 1000",
                   "owner": "string|null"},
        "result": {"revisions": [{"commit": "hex", "author": "string", "email": "string", "at": "RFC 3339",
                                  "message": "string", "revision": "int|null (null: the commit removed it)",
                                  "pending": "bool (review gate: not yet approved)"}]},
    },
    "memory/restore": {
        "summary": "Write a procedure's content as it was at a commit, as a new revision (history is never rewritten). "
                   "A forgotten key gets its old id back unless another record holds it now: another owner's "
                   "answers -32005, one of this owner's leaves the restore a fresh id.",
        "params": {"key": "string", "commit": "hex commit id from memory/history", "owner": "string|null"},
        "result": {"record": "the record written"},
    },
    "memory/approve": {
        "summary": "Review gate: fast-forward main to the proposed branch, making proposed procedures recallable.",
        "params": {},
        "result": {"approved": "int (commits merged)", "commit": "hex (main's new head)"},
    },
}


def _text(params: dict[str, Any], name: str) -> str | None:
    value = params.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise invalid(f"{name} must be a non-empty string", field=name)
    return value


def _pending(repo: git.Repo, store: GitStore) -> set[str]:
    if not store.review or PROPOSED not in repo.heads:
        return set()
    out = repo.git.rev_list(f"{store.main}..{PROPOSED}")
    return set(out.split())


def _log(repo: git.Repo, store: GitStore, path: str, limit: int) -> list[dict[str, Any]]:
    branch = PROPOSED if store.review else store.main
    pending = _pending(repo, store)
    revisions = []
    # `:(literal)`: git reads a path it is given as a glob, and a key may hold `*`, `?` or `[`.
    for commit in repo.iter_commits(branch, paths=f":(literal){path}", max_count=limit):
        record = _record_at(commit, path)
        revisions.append({
            "commit": commit.hexsha,
            "author": commit.author.name,
            "email": commit.author.email,
            "at": format_ts(commit.authored_datetime),
            "message": commit.message.strip(),
            "revision": record.revision if record is not None else None,
            "pending": commit.hexsha in pending,
        })
    return revisions


def _last_path(repo: git.Repo, store: GitStore, owner: str | None, record_id: str) -> str | None:
    """The file `owner`'s record `record_id` last left on the branch history reads (a forget, or
    another record taking its key), or None if it never had one there. Found by the text each file
    of the record begins with: the commits that changed how often it occurs in the owner's files
    (`git log -S`, newest first), and among their files the one the record left."""
    needle = files.id_header(record_id)
    if needle is None:
        return None
    branch = PROPOSED if store.review else store.main
    out = repo.git.log(branch, f"-S{needle}", "--no-renames", "--format=commit %H", "--name-only", "-z", "--",
                       f":(literal){store.layout.owner_root(owner)}")
    commits: list[tuple[str, list[str]]] = []
    for token in out.split("\0"):  # every path starts with the owner's root, never with "commit "
        token = token.lstrip("\n")
        if token.startswith("commit "):
            commits.append((token[len("commit "):], []))
        elif token and commits:
            commits[-1][1].append(token)
    for sha, paths in commits:
        commit = repo.commit(sha)
        if not commit.parents:
            continue
        for path in paths:
            if _id_at(commit.parents[0], path) == record_id and _id_at(commit, path) != record_id:
                return path
    return None


def _record_at(commit: Any, path: str) -> Record | None:
    """The record in `path` at `commit`; None where there is no file, or not a record's."""
    try:
        record, _ = files.loads((commit.tree / path).data_stream.read())
    except (KeyError, ValueError):  # KeyError: no such path in the commit's tree
        return None
    return record


def _id_at(commit: Any, path: str) -> str | None:
    record = _record_at(commit, path)
    return record.id if record is not None else None


def _at(repo: git.Repo, store: GitStore, rev: str, path: str) -> tuple[Record | None, int]:
    """The record file at `rev` (None when absent there) and the highest revision the file ever had."""
    try:
        commit = repo.commit(rev)
    except (git.BadName, ValueError, git.GitCommandError):
        return None, -1
    old = _record_at(commit, path)
    highest = max((r["revision"] or 0 for r in _log(repo, store, path, MAX_HISTORY)), default=0)
    return old, highest


def _free_id(store: GitStore, old: Record, owner: str | None, key: str) -> str:
    """The id a restore of a key that is empty now writes under: the old record's, unless that id
    has since gone to another record. Writing it anyway would move that record onto this key,
    deleting it from where it is (ids are global), so:

    - held by another owner: refused with -32005, as `memory/remember` refuses such an id, and
      nothing is written (the caller learns no more than remember would tell it);
    - held by another record of this owner (a client reused the id for another key): the restore
      gets a fresh id. The key's content comes back; the record now at the old id is not touched.
      Refusing would leave the procedure unrestorable through this method, and the old id names
      nothing a client could still hold for this key, which was empty.
    """
    holder = store.holder(old.id)
    if holder is None or (holder.owner == owner and holder.key == key):
        return old.id
    if holder.owner != owner:
        raise A2MError(SCOPE_DENIED, f"the id {key} had at that commit is now held by another owner",
                       {"id": old.id, "key": key})
    return new_id()


def approver_names(value: Any) -> frozenset[str] | None:
    """The `approvers` option as a set of owners, from a list or a comma-separated string
    (`--option approvers=lead,ops`): a set either way, so "le" is not an approver because "lead" is."""
    if value is None:
        return None
    names = value.split(",") if isinstance(value, str) else [str(v) for v in value]
    return frozenset(n.strip() for n in names if n.strip())


def extensions(store: GitStore, events: EventLog | None = None) -> dict[str, Handler]:
    """The extension methods over `store`; a restore is a write, told on `events` (the tier server's
    log) as remember's are, and an approve tells readers what it made recallable (`_tell_approved`):
    behind the review gate that is the only telling of a write (`GitStore.writes_visible`)."""

    async def history(params: dict[str, Any], ctx: Any) -> dict[str, Any]:
        owner = ctx.owner(params)
        key, record_id = _text(params, "key"), _text(params, "id")
        if (key is None) == (record_id is None):
            raise invalid("memory/history needs exactly one of key or id", field="key")
        limit = params.get("limit", 100)
        if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_HISTORY:
            raise invalid(f"limit must be an integer in [1, {MAX_HISTORY}]", field="limit")
        if key is not None and store.path_of(owner, key=key) is None:
            raise invalid("key is not a valid procedure key", field="key")

        def revisions(repo: git.Repo) -> list[dict[str, Any]]:  # under the writer lock: the id stays put
            path = store.path_of(owner, key=key, record_id=record_id)
            assert path is not None
            if record_id is not None and store.held_at(owner, record_id) is None:
                # Forgotten: its commits are those of the file it was last at, found in git (a keyed
                # record's file is named by its key, which the id alone does not give).
                path = _last_path(repo, store, owner, record_id) or path
            return _log(repo, store, path, limit)

        return {"revisions": await store.run_git(revisions)}

    async def restore(params: dict[str, Any], ctx: Any) -> dict[str, Any]:
        owner = ctx.owner(params)
        key, rev = _text(params, "key"), _text(params, "commit")
        if key is None:
            raise invalid("memory/restore needs a key", field="key")
        if rev is None or not _COMMIT.fullmatch(rev):
            raise invalid("commit must be a commit id (hex) from memory/history", field="commit")
        path = store.path_of(owner, key=key)
        if path is None:
            raise invalid("key is not a valid procedure key", field="key")
        # One step under the writer lock, from reading the commit to the write: read before it, the
        # key's current record and the id's holder could change under a write queued on the lock
        # meanwhile (two restores of one key both wrote the same revision). And under the key lock
        # the surface holds from resolving a remember's keys to writing them, or a remember resolved
        # before this restore would write the same revision after it.
        async with store.key_lock, store.locked() as repo:
            old, highest = await anyio.to_thread.run_sync(_at, repo, store, rev, path)
            if highest < 0:
                raise invalid(f"unknown commit {rev}", field="commit")
            if old is None:
                raise invalid(f"{key} did not exist at commit {rev}", field="commit")
            current = store.current(owner, key)
            base = current.revision if current is not None else highest
            restored = old.with_(
                id=current.id if current is not None else _free_id(store, old, owner, key),
                revision=base + 1,
                created_at=current.created_at if current is not None else old.created_at,
                access_count=current.access_count if current is not None else 0,
                accessed_at=current.accessed_at if current is not None else None,
                owner=owner,
                score=None,
            )
            try:
                await store.write_locked([restored], message=f"restore {key} to {rev[:12]} (rev {restored.revision})")
            except StoreIdTaken:  # refused inside the write's atomic step too, as every put is
                raise A2MError(SCOPE_DENIED, f"the id {key} had at that commit is now held by another owner",
                               {"id": restored.id, "key": key}) from None
            except StoreRejected as exc:
                raise invalid(str(exc)) from None
        if events is not None and store.writes_visible:  # behind the gate the approve tells it
            await events.emit("written", owner, id=restored.id, tier=store.settings.name, session=restored.session,
                              key=key, revision=restored.revision)
        return {"record": restored.to_wire(tier=store.settings.name)}  # as every read shows it

    async def approve(params: dict[str, Any], ctx: Any) -> dict[str, Any]:
        approvers = approver_names(store.settings.options.get("approvers"))
        if approvers is not None and ctx.owner(params) not in approvers:
            raise A2MError(SCOPE_DENIED, "only a configured approver may approve proposed procedures")
        try:
            approval = await store.approve()
        except StoreRejected as exc:
            raise invalid(f"tier {store.settings.name} cannot approve: {exc}", tier=store.settings.name) from None
        if events is not None:
            await _tell_approved(events, store.settings.name, approval)
        return approval.to_wire()

    return {"memory/history": history, "memory/restore": restore, "memory/approve": approve}


async def _tell_approved(events: EventLog, tier: str, approval: Approval) -> None:
    """An approve is, to readers, the write of what it made recallable: one `written` event per record
    main shows now that it did not show so (at its approved revision), and one `forgotten` event
    counting the records it no longer shows, each told to the owner who can recall the record."""
    gone: dict[str | None, int] = {}
    for record in approval.forgotten:
        gone[record.owner] = gone.get(record.owner, 0) + 1
    for owner, count in gone.items():
        await events.emit("forgotten", owner, count=count, tier=tier)
    written: dict[str | None, list[dict[str, Any]]] = {}
    for record in approval.written:
        written.setdefault(record.owner, []).append(
            {"id": record.id, "tier": tier, "session": record.session, "key": record.key,
             "revision": record.revision if record.key else None})
    for owner, items in written.items():
        await events.emit_many("written", owner, items)

