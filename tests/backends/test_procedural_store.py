"""GitStore against real git repositories in temporary directories."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import statistics
import subprocess
import sys
import textwrap
import time
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import git.cmd as git_cmd
import pytest
from hypothesis import given, settings as hsettings, strategies as st

from a2m.dispatch import Context
from a2m.errors import A2MError
from a2m.filters import Scope
from a2m.records import Record
from backends.procedural import CAPABILITIES, EXTENSION_DOCS, KIND, extensions, files, make_store
from backends.procedural.store import GitStore
from backends.settings import TierSettings
from backends.store import StoreRejected, StoreUnavailable
from tests.conftest import scale
from tests.support.inprocess import call as inprocess_call, dispatchers

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parents[2]


class Ctx:
    """What the surface hands an extension handler: the owner the request is scoped to."""

    def owner(self, params: dict[str, Any]) -> str | None:
        return params.get("owner")


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    assert done.returncode == 0, f"git {' '.join(args)} failed: {done.stdout}{done.stderr}"
    return done.stdout


def rec(i: int | str, content: str = "", *, owner: str | None = "alice", key: str | None = None, **kw: Any) -> Record:
    created = kw.pop("created_at", f"2026-01-01T00:00:{int(i) % 60 if str(i).isdigit() else 0:02d}.000Z")
    return Record(id=str(i), content=content or f"procedure {i}", created_at=created, owner=owner, key=key, **kw)


async def opened(tmp_path: Path, **options: Any) -> GitStore:
    store = make_store(TierSettings("procedural", tmp_path, options=options))
    await store.open()
    return store


@pytest.fixture
async def store(tmp_path: Path):
    s = await opened(tmp_path, author="Reviewer Bot <bot@example.org>")
    yield s
    await s.close()


def repo_of(store: GitStore) -> Path:
    return store.path


def test_package_surface() -> None:
    assert KIND == "procedural"
    assert {"core", "sessions", "keys", "embeddings"} <= CAPABILITIES
    assert set(EXTENSION_DOCS) == {"memory/history", "memory/restore", "memory/approve"}


async def test_owners_whose_records_are_all_gone_leave_nothing_in_the_index(store: GitStore) -> None:
    """The in-memory index is per owner; owners come and go by the million over a server's life. An
    owner whose last record was forgotten kept an empty dict and an empty BM25 (~2 KB) until restart."""
    for i in range(30):
        me = f"agent-{i}"
        await store.write([rec(i, f"procedure {i} for the harbour", owner=me, session="s", key=f"k{i}")])
        assert await store.delete(Scope(owner=me)) == 1
    await store.write([rec("kept", "the harbour ferry", owner="alice")])
    visible = store._visible
    assert list(visible.by_owner) == ["alice"] and list(visible.bm25) == ["alice"]
    assert not visible.by_session and list(visible.keys) == []
    assert [r.id for r in await store.search(Scope(owner="alice"), text="harbour", vector=None, limit=5)] == ["kept"]


async def test_every_write_is_one_commit_by_the_owner(store: GitStore) -> None:
    repo = repo_of(store)
    base = int(git(repo, "rev-list", "--count", "HEAD"))
    await store.write([rec(1, key="skills/refund/verify")])
    await store.write([rec(2, owner="bob"), rec(3, owner="bob"), rec(4, owner="bob", key="b/x")])
    await store.write([rec(5, owner=None, key="shared/one")])
    await store.write([], ["2", "3"])
    assert int(git(repo, "rev-list", "--count", "HEAD")) == base + 4
    log = git(repo, "log", "--format=%an|%ae|%cn|%s", "-4").splitlines()
    assert log[3] == "alice|alice@a2m.local|Reviewer Bot|remember skills/refund/verify (rev 1)"
    assert log[2].startswith("bob|bob@a2m.local|Reviewer Bot|remember 3 records")
    assert log[1] == "Reviewer Bot|bot@example.org|Reviewer Bot|remember shared/one (rev 1)"
    assert log[0].startswith("bob|bob@a2m.local|Reviewer Bot|forget 2 records")
    assert git(repo, "status", "--porcelain") == ""
    assert (repo / "owners/alice/skills/refund/verify.md").is_file()
    assert (repo / "shared/shared/one.md").is_file()
    assert not list((repo / "owners/bob/_ids").glob("*")) if (repo / "owners/bob/_ids").exists() else True
    # An empty write (deleting ids that do not exist) makes no commit.
    await store.write([], ["nope"])
    assert int(git(repo, "rev-list", "--count", "HEAD")) == base + 4


@pytest.mark.parametrize("review", [False, True])
async def test_a_writes_objects_are_on_disk_before_its_ref_names_them(tmp_path: Path, monkeypatch: Any,
                                                                      review: bool) -> None:
    """gitdb fsyncs nothing: after a power loss the ref could name a commit whose objects never
    reached the disk, a repository neither git nor the store can read. Every object a write adds
    is fsynced while its branch still names the old commit; then the ref file and its directory."""
    store = await opened(tmp_path, review=review)
    try:
        repo = repo_of(store)
        branch = "proposed" if review else "main"
        ref_file = Path(os.path.realpath(repo / ".git" / "refs" / "heads" / branch))
        synced: list[tuple[str, str]] = []  # (path fsynced, what the branch named then)
        fsync = os.fsync

        def recording(fd: int) -> None:
            synced.append((os.readlink(f"/proc/self/fd/{fd}"), ref_file.read_text().strip()))
            fsync(fd)

        before = git(repo, "rev-parse", branch).strip()
        monkeypatch.setattr(os, "fsync", recording)
        await store.write([rec(1, key="skills/refund/verify"), rec(2, owner="bob")])
        monkeypatch.setattr(os, "fsync", fsync)
        after = git(repo, "rev-parse", branch).strip()
        added = {line.split()[0] for line in git(repo, "rev-list", "--objects", after, f"^{before}").splitlines()}
        when = dict(synced)
        objects = Path(os.path.realpath(repo / ".git" / "objects"))
        assert added and all(when.get(str(objects / sha[:2] / sha[2:])) == before for sha in added), synced
        assert when.get(str(ref_file)) == after and when.get(str(ref_file.parent)) == after, synced
        # What git itself writes there (an approve's fast-forward of main) is fsynced by git.
        assert git(repo, "config", "core.fsync").strip() == "objects,reference"
    finally:
        await store.close()


async def test_a_new_object_directory_is_on_disk_before_its_ref_names_it(tmp_path: Path, monkeypatch: Any) -> None:
    """An object in a fan-out directory (objects/ab/) the write created is named by that directory's
    entry in objects/, which an fsync of the object and of objects/ab/ does not make durable: after a
    power loss the directory, and the objects in it, could be gone while the ref names them. So
    objects/ itself is fsynced too, before the branch moves, when the write made a directory there."""
    store = await opened(tmp_path)
    try:
        repo = repo_of(store)
        objects = Path(os.path.realpath(repo / ".git" / "objects"))
        ref_file = Path(os.path.realpath(repo / ".git" / "refs" / "heads" / "main"))
        synced: list[tuple[str, str]] = []
        fsync = os.fsync

        def recording(fd: int) -> None:
            synced.append((os.readlink(f"/proc/self/fd/{fd}"), ref_file.read_text().strip()))
            fsync(fd)

        before = git(repo, "rev-parse", "main").strip()
        had = {d.name for d in objects.iterdir()}
        monkeypatch.setattr(os, "fsync", recording)
        await store.write([rec(i, f"step {i} of the runbook", key=f"skills/step-{i}") for i in range(12)])
        monkeypatch.setattr(os, "fsync", fsync)
        after = git(repo, "rev-parse", "main").strip()
        added = {line.split()[0] for line in git(repo, "rev-list", "--objects", after, f"^{before}").splitlines()}
        assert {sha[:2] for sha in added} - had, "the write made no new fan-out directory: nothing to test"
        assert before in [named for path, named in synced if path == str(objects)], synced
    finally:
        await store.close()


async def test_git_log_and_history_show_revisions(store: GitStore) -> None:
    for revision in (1, 2, 3):
        await store.write([rec("p", f"step version {revision}", key="skills/refund/verify", revision=revision)])
    path = "owners/alice/skills/refund/verify.md"
    assert len(git(repo_of(store), "log", "--format=%H", "--", path).split()) == 3
    history = extensions(store)["memory/history"]
    result = await history({"key": "skills/refund/verify", "owner": "alice"}, Ctx())
    assert [r["revision"] for r in result["revisions"]] == [3, 2, 1]
    first = result["revisions"][0]
    assert first["author"] == "alice" and first["at"].endswith("Z") and len(first["at"]) == 24
    assert first["message"] == "replace skills/refund/verify (rev 3)" and first["pending"] is False
    by_id = await history({"id": "p", "owner": "alice"}, Ctx())
    assert by_id == result
    # Another owner sees no history for the same key.
    assert (await history({"key": "skills/refund/verify", "owner": "bob"}, Ctx()))["revisions"] == []
    with pytest.raises(A2MError) as err:
        await history({"owner": "alice"}, Ctx())
    assert err.value.code == -32602


async def test_restore_writes_an_earlier_content_as_a_new_revision(store: GitStore) -> None:
    from a2m.events import EventLog

    log = EventLog()
    handlers = extensions(store, log)
    head = log.poll(None, owner="alice")["cursor"]
    for revision in (1, 2, 3):
        # the stored `tier` is what the writer said (a router's name for this tier); reads show this server's
        await store.write([rec("p", f"step version {revision}", key="k/p", revision=revision, metadata={"v": revision},
                               tier="skills")])
    revisions = (await handlers["memory/history"]({"key": "k/p", "owner": "alice"}, Ctx()))["revisions"]
    first = revisions[-1]["commit"]
    out = await handlers["memory/restore"]({"key": "k/p", "commit": first, "owner": "alice"}, Ctx())
    assert out["record"]["content"] == "step version 1" and out["record"]["tier"] == "procedural"
    assert out["record"]["revision"] == 4 and out["record"]["id"] == "p" and out["record"]["metadata"] == {"v": 1}
    current = (await store.get_keys("alice", ["k/p"]))["k/p"]
    assert current.content == "step version 1" and current.revision == 4
    assert git(repo_of(store), "log", "-1", "--format=%s").strip() == f"restore k/p to {first[:12]} (rev 4)"
    # a restore is a write: told as one, or an event consumer would miss revision 4
    [event] = log.poll(head, owner="alice")["events"]
    assert (event["kind"], event["id"], event["key"], event["revision"]) == ("written", "p", "k/p", 4)
    revisions = (await handlers["memory/history"]({"key": "k/p", "owner": "alice"}, Ctx()))["revisions"]
    assert [r["revision"] for r in revisions] == [4, 3, 2, 1]
    # A forgotten procedure can be restored too, above every revision it ever had.
    await store.write([], ["p"])
    out = await handlers["memory/restore"]({"key": "k/p", "commit": revisions[1]["commit"], "owner": "alice"}, Ctx())
    assert out["record"]["revision"] == 5 and out["record"]["content"] == "step version 3"
    for bad in ({"key": "k/p", "commit": "zz"}, {"key": "k/p", "commit": "abcdef0"}, {"key": "nope", "commit": first},
                {"key": "../x", "commit": first}, {"commit": first}):
        with pytest.raises(A2MError) as err:
            await handlers["memory/restore"]({**bad, "owner": "alice"}, Ctx())
        assert err.value.code == -32602, bad


async def test_restore_never_takes_an_id_that_went_to_another_record(store: GitStore) -> None:
    """Restoring a forgotten key reuses its old id only while nobody holds it: ids are global, so
    writing it would move the holder onto this key (deleting it where it is)."""
    handlers = extensions(store)
    restore, history = handlers["memory/restore"], handlers["memory/history"]
    await store.write([rec("p", "alice's steps v1", key="k/p")])
    commit = (await history({"key": "k/p", "owner": "alice"}, Ctx()))["revisions"][0]["commit"]
    await store.write([], ["p"])
    await store.write([rec("p", "bob's own record", owner="bob", key="b/q")])  # the id goes to bob
    with pytest.raises(A2MError) as err:
        await restore({"key": "k/p", "commit": commit, "owner": "alice"}, Ctx())
    assert err.value.code == -32005 and err.value.data == {"id": "p", "key": "k/p"}
    assert (await store.get("bob", ["p"]))[0].content == "bob's own record"
    assert await store.get_keys("alice", ["k/p"]) == {}
    # the same owner reusing the id for another key: the restore gets a fresh id, that record stays
    await store.write([], ["p"])
    await store.write([rec("p", "alice's other procedure", key="k/other")])
    out = await restore({"key": "k/p", "commit": commit, "owner": "alice"}, Ctx())
    assert out["record"]["id"] != "p" and out["record"]["content"] == "alice's steps v1"
    assert (await store.get_keys("alice", ["k/p"]))["k/p"].id == out["record"]["id"]
    assert (await store.get_keys("alice", ["k/other"]))["k/other"].id == "p"
    # nobody holds it any more: the old id comes back with the content
    await store.write([], ["p", out["record"]["id"]])
    again = await restore({"key": "k/p", "commit": commit, "owner": "alice"}, Ctx())
    assert again["record"]["id"] == "p" and await store.count("bob") == 0


async def test_a_put_never_takes_over_another_owners_id(store: GitStore) -> None:
    await store.write([rec("x", "alice's", key="a/x")])
    with pytest.raises(StoreRejected):
        await store.write([rec("y", "fine", owner="bob"), rec("x", "bob's", owner="bob", key="b/x")])
    assert (await store.get("alice", ["x"]))[0].content == "alice's" and await store.count("bob") == 0


async def test_a_key_too_long_for_the_file_system_is_refused_not_an_outage(tmp_path: Path) -> None:
    """Each segment fits NAME_MAX, but the whole path passed PATH_MAX: the commit failed with
    ENAMETOOLONG and the tier answered -32603, "unavailable", which the router counts as an outage
    (found by test_procedural_parity.py). The caller's input is what cannot be stored: -32602."""
    from a2m.dispatch import Context, Dispatcher
    from backends.serve import build

    deep = tmp_path / ("d" * 200)
    server = build("procedural", TierSettings("procedural", deep))
    await server.startup()
    try:
        call = Dispatcher(server).handle
        key = "/".join(["\U0001F600" * 60] * 16)  # 975 characters, 3,855 bytes: each segment 240
        params = {"owner": "é" * 300, "records": [{"id": "fits", "content": "steps", "key": "short"},
                                                  {"id": "long", "content": "steps", "key": key}]}
        reply = await call({"jsonrpc": "2.0", "id": 1, "method": "memory/remember", "params": params}, Context())
        assert reply["error"]["code"] == -32602, reply
        assert await server.store.count("é" * 300) == 0
        params["records"] = params["records"][:1]
        reply = await call({"jsonrpc": "2.0", "id": 2, "method": "memory/remember", "params": params}, Context())
        assert reply["result"] == {"ids": ["fits"]}
    finally:
        await server.shutdown()


async def test_records_trading_places_in_one_batch_leave_no_ghost(store: GitStore) -> None:
    """Two records swapping keys in one batch (a move, or a move and a re-write of the id it
    deleted): the in-memory path index lost the file of the first, so the next write to that key
    kept it as a ghost beside its replacement, and forgetting it raised KeyError, -32603 (found by
    test_procedural_parity.py)."""
    await store.write([rec("x", "x at a", key="a"), rec("y", "y at b", key="b")])
    await store.write([rec("x", "x at b", key="b"), rec("y", "y at a", key="a")])
    assert {k: r.id for k, r in (await store.get_keys("alice", ["a", "b"])).items()} == {"a": "y", "b": "x"}
    await store.write([rec("w", "w takes b", key="b")])  # replaces x
    assert sorted(r.id for r in await store.select(Scope(owner="alice"))) == ["w", "y"]
    assert await store.delete(Scope(owner="alice")) == 2 and await store.count("alice") == 0
    assert git(repo_of(store), "ls-files") == ""


async def test_owner_and_content_in_where_are_the_record_fields(store: GitStore) -> None:
    await store.write([rec(1, "alpha steps", metadata={"content": "beta steps", "owner": "meta"}),
                       rec(2, "beta steps"), rec(3, "beta steps", owner="bob")])
    for where, want in (({"content": "beta steps"}, ["2"]), ({"content": ["alpha steps", "x"]}, ["1"]),
                        ({"owner": "alice"}, ["1", "2"]), ({"owner": "meta"}, []), ({"owner": None}, []),
                        ({"owner": "bob"}, [])):
        scope = Scope(owner="alice", where=where)
        assert [r.id for r in await store.select(scope)] == want, where
        assert sorted(r.id for r in await store.search(scope, text="steps", vector=None, limit=10)) == want, where


KEYS_NOT_PATHS = [
    "../escape", "a/../../b", "/etc/passwd", "a//b", "a/", "a\\b", "a/\nb", ".git/config",
    "x/.git/hooks/pre-commit", ".gitattributes", "_ids/forged", "a/./b", "..", ".", "con", "x/NUL.txt",
    "a.md/b", "x" * 300, "a/" + "b" * 250, "", ".github/workflows/ci",
]


@pytest.mark.parametrize("key", KEYS_NOT_PATHS)
async def test_a_key_that_cannot_be_a_path_is_stored_encoded_in_its_owners_folder(tmp_path: Path, key: str) -> None:
    """Every other tier stores these keys, so procedural refusing them (-32602) left a record that
    could never be promoted here, and a router batch holding one was written to the other tiers, then
    taken back. Each is now one encoded file under the owner's `_ids/_keys/`: nothing lands outside
    the owner's folder or in git's files, the key reads back, is replaced in place and survives a
    restart, and `git fsck` finds nothing."""
    store = await opened(tmp_path)
    repo = repo_of(store)
    try:
        await store.write([rec(1, key="fine"), rec(2, "first", key=key)])
        await store.write([rec(3, "second", key=key, revision=2)])  # replaces the record: still one file
        encoded = files.path_for("alice", key, "")
        assert encoded.startswith("owners/alice/_ids/_keys/") and encoded.count("/") == 4
        assert sorted(git(repo, "ls-files").splitlines()) == sorted(["owners/alice/fine.md", encoded])
        assert git(repo, "status", "--porcelain", "--untracked-files=all") == ""
    finally:
        await store.close()
    store = await opened(tmp_path)
    try:
        held = await store.get_keys("alice", [key])
        assert (held[key].id, held[key].content, held[key].revision) == ("3", "second", 2)
        assert await store.count("alice") == 2
        fsck = subprocess.run(["git", "-C", str(repo), "fsck", "--no-progress"], capture_output=True, text=True)
        assert fsck.returncode == 0 and "warning" not in fsck.stdout + fsck.stderr, fsck.stdout + fsck.stderr
    finally:
        await store.close()


@pytest.mark.parametrize("key", ["a\x00b", "a\ud800b"])
async def test_a_key_no_tier_stores_is_refused_and_writes_nothing(store: GitStore, key: str) -> None:
    """NUL and a lone surrogate: the protocol refuses both, so only an in-process caller sends them."""
    repo = repo_of(store)
    await store.write([rec(1, key="fine")])
    head = git(repo, "rev-parse", "HEAD")
    with pytest.raises(StoreRejected):
        await store.write([rec(2, key="also/fine"), rec(3, key=key)])
    assert git(repo, "rev-parse", "HEAD") == head
    assert git(repo, "status", "--porcelain", "--untracked-files=all") == ""
    assert await store.count("alice") == 1


def test_key_paths_and_owner_encoding() -> None:
    assert files.path_for(None, "skills/refund/verify", "x") == "shared/skills/refund/verify.md"
    assert files.path_for("alice", None, "id/1") == "owners/alice/_ids/id%2F1.md"
    assert files.owner_root("../x") == "owners/%2E.%2Fx"
    assert files.owner_root("") == "owners/%"
    assert files.owner_root("con") == "owners/%63on"
    encoded = {files.encode_segment(s) for s in ["a/b", "a%2Fb", "a b", "a_b", "x" * 500, "x" * 501]}
    assert len(encoded) == 6 and all("/" not in e and len(e) <= 200 for e in encoded)
    # a key that cannot be a path is encoded as an id is, beside the ids: never the file of a key that can
    assert files.path_for("alice", "a//b", "x") == "owners/alice/_ids/_keys/a%2F%2Fb.md"
    assert files.path_for(None, "CON", "x") == "shared/_ids/_keys/%43ON.md"
    assert files.Layout(escape_case=True).path_for("Al", ".git/X", "x") == "owners/!al/_ids/_keys/%2Egit%2F!x.md"
    assert files.path_for("alice", "a%2F%2Fb", "x") == "owners/alice/a%2F%2Fb.md"
    assert files.path_for("alice", "_keys/a", "x") == "owners/alice/_keys/a.md"


async def test_crash_before_commit_is_discarded_at_reopen(tmp_path: Path) -> None:
    """The process dies after writing files and staging, just before the ref update."""
    script = textwrap.dedent(f"""
        import os, signal, anyio
        from pathlib import Path
        from git.objects.commit import Commit
        from a2m.records import Record
        from backends.procedural import make_store
        from backends.settings import TierSettings

        async def main():
            store = make_store(TierSettings("procedural", Path({str(tmp_path)!r})))
            await store.open()
            await store.write([Record(id="kept", content="committed", created_at="2026-01-01T00:00:00.000Z", key="a/kept")])
            def die(*a, **k):
                os.kill(os.getpid(), signal.SIGKILL)
            Commit.create_from_tree = die
            await store.write([Record(id="lost", content="never acknowledged", created_at="2026-01-01T00:00:01.000Z", key="a/lost"),
                               Record(id="kept", content="overwritten?", created_at="2026-01-01T00:00:00.000Z", key="a/kept", revision=2)])
        anyio.run(main)
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    repo = tmp_path / "repo"
    assert (repo / "shared/a/lost.md").exists()  # the crash left a half-done write behind
    assert git(repo, "status", "--porcelain") != ""
    store = await opened(tmp_path)
    try:
        assert git(repo, "status", "--porcelain", "--untracked-files=all") == ""
        assert not (repo / "shared/a/lost.md").exists()
        assert await store.get(None, ["lost"]) == []
        [kept] = await store.get(None, ["kept"])
        assert kept.content == "committed" and kept.revision == 1
        await store.write([rec("after", owner=None, key="a/after")])  # the store works after recovery
        git(repo, "fsck", "--no-progress")
    finally:
        await store.close()


async def test_kill_during_batch_writes_leaves_repo_consistent(tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        import anyio, sys
        from pathlib import Path
        from a2m.records import Record
        from backends.procedural import make_store
        from backends.settings import TierSettings

        async def main():
            store = make_store(TierSettings("procedural", Path({str(tmp_path)!r})))
            await store.open()
            i = 0
            while True:
                batch = [Record(id=f"r{{i}}-{{j}}", content=f"batch {{i}} item {{j}}", created_at="2026-01-01T00:00:00.000Z",
                                key=f"b{{i}}/{{j}}") for j in range(20)]
                await store.write(batch)
                print(i, flush=True)
                i += 1
        anyio.run(main)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        for _ in range(3):
            proc.stdout.readline()  # a few batches committed
        time.sleep(0.013)  # land somewhere inside a later batch
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    repo = tmp_path / "repo"
    store = await opened(tmp_path)
    try:
        assert git(repo, "status", "--porcelain", "--untracked-files=all") == ""
        tracked = [p for p in git(repo, "ls-files").split() if p.endswith(".md")]
        assert await store.count(None) == len(tracked) and len(tracked) % 20 == 0 and tracked
        git(repo, "fsck", "--no-progress")
    finally:
        await store.close()


@pytest.mark.parametrize("where", ["git dir", "bare", "inside a store's tree"])
async def test_a_repository_path_inside_a_git_directory_or_another_stores_tree_is_refused(
        tmp_path: Path, where: str) -> None:
    """`--url` at a served store's `.git`, at a bare repository (the remote a store pushes to), or below
    another store's working tree was taken for an empty directory: `git init` there made a repository
    inside it. One at `.git` or in a bare repository shadows it for git (`git -C remote.git log` and a
    push into it read the new one, found first as `<path>/.git`); one below a store's tree is a second
    server on that store's files. Nothing is made there, and the store says why."""
    first = await opened(tmp_path / "first")
    try:
        await first.write([rec(1, key="a/one")])
        bare = tmp_path / "remote.git"
        git(tmp_path, "init", "-q", "--bare", str(bare))
        url = {"git dir": first.path / ".git", "bare": bare,
               "inside a store's tree": first.path / "owners" / "x"}[where]
        second = make_store(TierSettings("procedural", tmp_path / "second", url=str(url)))
        with pytest.raises(StoreUnavailable, match="not a place for the procedural repository"):
            await second.open()
        assert not (url / ".git").exists()
        assert not (bare / ".git").exists()
        assert git(bare, "rev-parse", "--is-bare-repository") == "true\n"
        assert git(first.path, "status", "--porcelain", "--untracked-files=all") == ""
        await first.write([rec(2, key="a/two")])
    finally:
        await first.close()


async def test_a_store_waits_a_moment_for_a_dead_predecessors_lock(tmp_path: Path) -> None:
    """After a kill -9 the lock can outlive the dead server for a moment (a git child forked, not yet
    exec'd, holds its descriptor): a restart then refused to open (seen once in a loaded CI run)."""
    first = await opened(tmp_path)
    await first.close()
    lock = tmp_path / "repo" / ".git" / "a2m" / "lock"
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import fcntl, os, time
        fd = os.open({str(lock)!r}, os.O_RDWR)
        fcntl.flock(fd, fcntl.LOCK_EX)
        print("held", flush=True)
        time.sleep(0.5)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        store = await opened(tmp_path)  # waits for the holder to end, then opens
        await store.close()
    finally:
        holder.wait(timeout=30)


async def test_a_second_store_on_one_repository_is_refused(tmp_path: Path) -> None:
    """Two servers on one repository each commit the tree they hold in memory: the second's commit
    dropped the first's acknowledged record (and its open reset the first's working tree). One store
    per repository; the lock is released by a close (and by the death of the process)."""
    first = await opened(tmp_path)
    try:
        await first.write([rec(1, key="a/one")])
        second = make_store(TierSettings("procedural", tmp_path))
        with pytest.raises(StoreUnavailable, match="another process has the procedural repository"):
            await second.open()
        await second.close()  # a refused open leaves nothing to close
        await first.write([rec(2, key="a/two")])
    finally:
        await first.close()
    again = await opened(tmp_path)
    try:
        assert [r.id for r in await again.select(Scope(owner="alice"))] == ["1", "2"]
    finally:
        await again.close()


async def test_commits_are_stored_in_process_and_recovery_drops_empty_commits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GitPython's default odb stores a commit through `git hash-object --literally` over a buffered
    pipe: a kill before the flush made git write an empty, unparseable commit that `git fsck` rejects.
    Objects must be written in-process (temp file + rename); one left by an older version is removed."""
    def no_hash_object(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("an object was stored through `git hash-object`")

    with monkeypatch.context() as patch:
        patch.setattr(git_cmd.Git, "hash_object", no_hash_object, raising=False)
        store = await opened(tmp_path)  # the initial commit
        await store.write([rec(1, key="a/one")])
        await store.close()
        store = await opened(tmp_path, review=True)  # a commit to `proposed`
        await store.write([rec(2, key="a/two")])
    repo = tmp_path / "repo"
    try:
        empty = subprocess.run(["git", "-C", str(repo), "hash-object", "-t", "commit", "-w", "--stdin", "--literally"],
                               input="", capture_output=True, text=True, check=True).stdout.strip()
        assert subprocess.run(["git", "-C", str(repo), "fsck", "--no-progress"], capture_output=True).returncode != 0
        await store.close()
        store = await opened(tmp_path)
        assert not (repo / ".git/objects" / empty[:2] / empty[2:]).exists()
        git(repo, "fsck", "--no-progress")
    finally:
        await store.close()


async def test_review_gate_hides_proposals_until_approved(tmp_path: Path) -> None:
    store = await opened(tmp_path, review=True)
    handlers = extensions(store)
    try:
        await store.write([rec(1, "refund: check the receipt first", key="skills/refund")])
        scope = Scope(owner="alice")
        assert await store.get("alice", ["1"]) == []
        assert await store.select(scope) == []
        assert await store.search(scope, text="receipt", vector=None, limit=5) == []
        assert await store.get_keys("alice", ["skills/refund"]) == {}
        assert not (tmp_path / "repo/owners/alice/skills/refund.md").exists()  # main's tree is untouched
        history = (await handlers["memory/history"]({"key": "skills/refund", "owner": "alice"}, Ctx()))["revisions"]
        assert len(history) == 1 and history[0]["pending"] is True
        result = await handlers["memory/approve"]({}, Ctx())
        assert result["approved"] == 1
        assert [r.id for r in await store.search(scope, text="receipt", vector=None, limit=5)] == ["1"]
        assert (tmp_path / "repo/owners/alice/skills/refund.md").exists()
        assert (await handlers["memory/approve"]({}, Ctx()))["approved"] == 0
        # A forget is a proposal as well.
        await store.write([], ["1"])
        assert len(await store.get("alice", ["1"])) == 1
        await handlers["memory/approve"]({}, Ctx())
        assert await store.get("alice", ["1"]) == []
        # Pending proposals survive a restart and stay hidden.
        await store.write([rec(2, "pending procedure", key="skills/pending")])
        await store.close()
        store = await opened(tmp_path, review=True)
        handlers = extensions(store)
        assert await store.count("alice") == 0
        await handlers["memory/approve"]({}, Ctx())
        assert await store.count("alice") == 1
    finally:
        await store.close()
    # Without the gate, approve is refused; with approvers, only they may approve.
    plain = await opened(tmp_path / "plain")
    try:
        with pytest.raises(A2MError) as err:
            await extensions(plain)["memory/approve"]({}, Ctx())
        assert err.value.code == -32602
    finally:
        await plain.close()
    gated = await opened(tmp_path / "gated", review=True, approvers=["lead"])
    try:
        with pytest.raises(A2MError) as err:
            await extensions(gated)["memory/approve"]({"owner": "agent"}, Ctx())
        assert err.value.code == -32005
        assert (await extensions(gated)["memory/approve"]({"owner": "lead"}, Ctx()))["approved"] == 0
    finally:
        await gated.close()
    # From the command line the option is one string: a comma-separated list, not a substring test.
    listed = await opened(tmp_path / "listed", review=True, approvers="lead, ops")
    try:
        for denied in ("le", "ad,op", None):
            with pytest.raises(A2MError) as err:
                await extensions(listed)["memory/approve"]({"owner": denied} if denied else {}, Ctx())
            assert err.value.code == -32005
        assert (await extensions(listed)["memory/approve"]({"owner": "ops"}, Ctx()))["approved"] == 0
    finally:
        await listed.close()


async def test_push_to_a_bare_remote(tmp_path: Path) -> None:
    remote = tmp_path / "team.git"
    subprocess.run(["git", "init", "--bare", "-q", str(remote)], check=True)
    store = await opened(tmp_path / "data", remote=str(remote))
    try:
        await store.write([rec(1, "push me", key="skills/push")])
        assert git(remote, "log", "main", "-1", "--format=%an %s").strip() == "alice remember skills/push (rev 1)"
        assert git(remote, "rev-parse", "main") == git(store.path, "rev-parse", "HEAD")
        assert store.push_error is None
    finally:
        await store.close()
    # The review gate pushes `proposed` too, so reviewers can open a pull request from it.
    gated_remote = tmp_path / "gated.git"
    subprocess.run(["git", "init", "--bare", "-q", str(gated_remote)], check=True)
    gated = await opened(tmp_path / "gated", remote=str(gated_remote), review=True)
    try:
        await gated.write([rec(1, "proposal", key="skills/p")])
        assert "proposal" in git(gated_remote, "show", "proposed:owners/alice/skills/p.md")
    finally:
        await gated.close()
    # A remote that is gone does not fail the write.
    broken = await opened(tmp_path / "broken", remote=str(tmp_path / "missing.git"))
    try:
        await broken.write([rec(1, key="x")])
        assert broken.push_error and await broken.count("alice") == 1
    finally:
        await broken.close()


async def test_owners_are_isolated(store: GitStore) -> None:
    await store.write([rec("a", "alice refund steps", owner="alice", key="skills/refund")])
    await store.write([rec("b", "bob refund steps", owner="bob", key="skills/refund")])
    await store.write([rec("n", "shared refund steps", owner=None, key="skills/refund")])
    for owner, rid in (("alice", "a"), ("bob", "b"), (None, "n")):
        assert (await store.get_keys(owner, ["skills/refund"]))["skills/refund"].id == rid
        assert [r.id for r in await store.select(Scope(owner=owner))] == [rid]
        assert [r.id for r in await store.search(Scope(owner=owner), text="refund", vector=None, limit=10)] == [rid]
        assert await store.count(owner) == 1
    assert await store.get("bob", ["a"]) == []
    assert await store.delete(Scope(owner="bob")) == 1
    assert await store.count("alice") == 1 and await store.count(None) == 1


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**63), max_value=2**63) | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)


@hsettings(max_examples=150, deadline=None)
@given(
    content=st.text(),
    metadata=st.dictionaries(st.text(max_size=10), json_values, max_size=5),
    role=st.none() | st.text(max_size=10),
    embedding=st.none() | st.lists(st.floats(allow_nan=False, allow_infinity=False, width=32), min_size=1, max_size=8),
)
def test_file_round_trip_is_lossless(content: str, metadata: dict, role: str | None, embedding: list | None) -> None:
    record = Record(id="x", content=content, created_at="2026-01-01T00:00:00.000Z", role=role, metadata=metadata,
                    key="k", owner="o", embedding=embedding, salience=0.25)
    try:
        data = files.dumps(record, 7)
    except StoreRejected:
        assert any(0xD800 <= ord(c) <= 0xDFFF for c in content + str(metadata) + str(role))
        return
    back, seq = files.loads(data)
    assert back == record and seq == 7


ODD = [
    ("---\nnot: a header\n---\n", {"---": "---"}),
    ("trailing newlines\n\n\n", {"nested": {"a": [1, 2.5, None, True, {"b": []}]}}),
    ("città 東京 🚀\r\nwindows line\ttab", {"yes": "no", "null": None, "date": "2026-01-01", "n": "1.0"}),
    ("", {"": {"": ""}, "big": 2**70, "neg0": -0.0, "e": 1e-300}),
    ("\ufeffbom and \u2028 separators \x85", {"list": ["- a", ": b", "# c", "&x", "*y", "!z"]}),
]


async def test_odd_records_survive_a_restart(tmp_path: Path) -> None:
    store = await opened(tmp_path)
    written = [
        Record(id=f"odd/{i} ✓", content=c, created_at="2026-01-01T00:00:00.000Z", metadata=m, owner="ödön <x>",
               key=None if i % 2 else f"odd/{i}", role="tool", session="s1", group="g", tier="procedural",
               uri="s3://b/k", media_type="text/markdown", salience=0.9, revision=3, embedding=[0.1, -2.0, 3e-8])
        for i, (c, m) in enumerate(ODD)
    ]
    await store.write(written)
    await store.touch("ödön <x>", [written[0].id], "2026-02-02T00:00:00.000Z")
    await store.close()
    store = await opened(tmp_path)
    try:
        back = await store.get("ödön <x>", [r.id for r in written], with_embeddings=True)
        expected = [r.with_(access_count=1, accessed_at="2026-02-02T00:00:00.000Z") if i == 0 else r
                    for i, r in enumerate(written)]
        assert back == expected
        assert await store.dimensions() == 3
        assert (await store.get("ödön <x>", [written[0].id]))[0].embedding is None
    finally:
        await store.close()


async def test_session_scope_follows_writes_moves_and_deletes(tmp_path: Path) -> None:
    """A session-scoped read (a timeline replay) goes through the session index: it must see a
    record's session change, its deletion, other owners' same-named session never, and a restart."""
    store = await opened(tmp_path)

    async def session(name: str, owner: str = "alice") -> list[str]:
        return [r.id for r in await store.select(Scope(owner=owner, where={"session": name}))]

    try:
        await store.write([rec(1, session="s1"), rec(2, session="s1"), rec(3, session="s2"), rec(4),
                           rec(5, session="s1", owner="bob")])
        assert await session("s1") == ["1", "2"] and await session("s2") == ["3"] and await session("s1", "bob") == ["5"]
        await store.write([rec(2, "moved", session="s2")], deletes=["1"])
        assert await session("s1") == [] and await session("s2") == ["2", "3"]
        await store.touch("alice", ["3"], "2026-02-02T00:00:00.000Z")  # access statistics swap the record in place
        assert [r.access_count for r in await store.select(Scope(owner="alice", where={"session": "s2"}))] == [0, 1]
        assert [r.id for r in await store.select(Scope(owner="alice", where={"session": ["s1", "s2"]}))] == ["2", "3"]
        await store.close()
        store = await opened(tmp_path)
        assert await session("s2") == ["2", "3"] and await session("s1", "bob") == ["5"]
    finally:
        await store.close()


async def test_where_id_is_read_by_id_and_still_filtered(store: GitStore) -> None:
    """`where: {id: ...}` (how the router counts its recalls) reads the named records, and the rest
    of the scope, owner included, still applies to them."""
    await store.write([rec(1, session="s1"), rec(2, session="s2"), rec(3, owner="bob")])
    for where, owner, expected in (({"id": ["1", "2", "3", "9"]}, "alice", ["1", "2"]),
                                   ({"id": "2", "session": "s1"}, "alice", []),
                                   ({"id": ["3"]}, "alice", []), ({"id": ["3"]}, "bob", ["3"])):
        assert [r.id for r in await store.select(Scope(owner=owner, where=where))] == expected


async def test_select_order_and_limits(store: GitStore) -> None:
    same = "2026-01-01T00:00:00.000Z"
    await store.write([rec("c", created_at="2026-01-01T00:00:02.000Z"), rec("a", created_at=same), rec("b", created_at=same)])
    scope = Scope(owner="alice")
    assert [r.id for r in await store.select(scope)] == ["a", "b", "c"]
    assert [r.id for r in await store.select(scope, order="desc", limit=2)] == ["c", "b"]
    await store.write([rec("a", "again", created_at=same)])  # a re-put takes a new place among ties
    assert [r.id for r in await store.select(scope)] == ["b", "a", "c"]
    assert [r.id for r in await store.select(Scope(owner="alice", ids=["c", "a", "zz"]))] == ["a", "c"]
    assert [r.id for r in await store.select(Scope(owner="alice", after=same))] == ["c"]


async def test_keys_replace_move_and_prefix(store: GitStore) -> None:
    repo = repo_of(store)
    await store.write([rec("1", "v1", key="skills/a")])
    await store.write([rec("1", "moved", key="skills/b", revision=2)])  # same id, new key: the file moves
    assert not (repo / "owners/alice/skills/a.md").exists() and (repo / "owners/alice/skills/b.md").exists()
    assert await store.get_keys("alice", ["skills/a", "skills/b"]) == {"skills/b": (await store.get("alice", ["1"]))[0]}
    await store.write([rec("2", "usurper", key="skills/b")])  # another id on an occupied key replaces it
    assert await store.get("alice", ["1"]) == [] and (await store.get_keys("alice", ["skills/b"]))["skills/b"].id == "2"
    await store.write([rec("3", key="other/x")])
    assert [r.id for r in await store.select(Scope(owner="alice", key_prefix="skills/"))] == ["2"]
    assert await store.delete(Scope(owner="alice", key_prefix="skills/")) == 1
    assert not (repo / "owners/alice/skills").exists()  # no empty directories left behind


async def test_touch_is_not_a_commit_and_reinforce_is(store: GitStore) -> None:
    repo = repo_of(store)
    await store.write([rec("1", key="k")])
    head = git(repo, "rev-parse", "HEAD")
    await store.touch("alice", ["1", "missing"], "2026-03-03T00:00:00.000Z")
    [r] = await store.get("alice", ["1"])
    assert r.access_count == 1 and r.accessed_at == "2026-03-03T00:00:00.000Z"
    assert git(repo, "rev-parse", "HEAD") == head
    assert await store.reinforce("alice", ["1", "missing"], 0.7) == 1
    [r] = await store.get("alice", ["1"])
    assert r.salience == 1.0 and r.access_count == 1
    assert git(repo, "log", "-1", "--format=%s").strip() == "reinforce k (rev 1) (+0.7)"


async def test_a_forgotten_id_written_again_starts_with_no_access_statistics(tmp_path: Path) -> None:
    """The sidecar kept the counts of a forgotten id, and a restart put them on the next record
    written under it (found by test_procedural_parity.py); a write that sets them to none cleared
    nothing either."""
    store = await opened(tmp_path)
    await store.write([rec("1"), rec("2", access_count=3, accessed_at="2026-03-03T00:00:00.000Z", revision=2)])
    await store.touch("alice", ["1"], "2026-03-03T00:00:00.000Z")
    await store.write([], ["1"])
    await store.write([rec("1", "written again"), rec("2", revision=3)])  # an import that resets the counts
    await store.close()
    store = await opened(tmp_path)
    try:
        assert [(r.id, r.access_count, r.accessed_at) for r in await store.get("alice", ["1", "2"])] == \
            [("1", 0, None), ("2", 0, None)]
    finally:
        await store.close()


async def test_vector_and_hybrid_search(store: GitStore) -> None:
    await store.write([
        rec("x", "deploy the service", embedding=[1.0, 0.0]),
        rec("y", "rollback the service", embedding=[0.0, 1.0]),
        rec("z", "unrelated words"),
    ])
    scope = Scope(owner="alice")
    by_vector = await store.search(scope, text=None, vector=[0.9, 0.1], limit=5)
    assert [r.id for r in by_vector] == ["x", "y"] and all(0 <= r.score <= 1 for r in by_vector)
    hybrid = await store.search(scope, text="rollback", vector=[0.9, 0.1], limit=5)
    assert hybrid[0].id in {"x", "y"} and {r.id for r in hybrid} == {"x", "y"}
    assert await store.search(scope, text="the and of", vector=None, limit=5) == []


@pytest.mark.slow
async def test_search_over_thousands_of_procedures_is_fast(store: GitStore) -> None:
    n = scale(2000, 300)
    topics = ["refund", "invoice", "shipping", "password", "deploy", "rollback", "backup", "onboarding"]
    batch = [rec(i, f"How to handle {topics[i % 8]} case {i}: step {i % 13} then verify {topics[(i * 3) % 8]}",
                 key=f"skills/{topics[i % 8]}/{i}") for i in range(n)]
    await store.write(batch)  # one commit
    scope = Scope(owner="alice")
    times = []
    for i in range(50):
        start = time.perf_counter()
        hits = await store.search(scope, text=f"{topics[i % 8]} case {i}", vector=None, limit=10)
        times.append(time.perf_counter() - start)
        assert hits and hits[0].id == str(i)
    assert statistics.median(times) < 0.02
    start = time.perf_counter()
    await store.write([rec("new", "a brand new escalation procedure", key="skills/escalation")])
    assert time.perf_counter() - start < 1.0
    assert [r.id for r in await store.search(scope, text="escalation", vector=None, limit=3)] == ["new"]


# ---- writes that race: what a call reads to decide its change is read under the writer lock


async def test_reinforce_racing_a_keyed_replace_keeps_the_replace(store: GitStore) -> None:
    """A reinforce that read the record before a replace committed must not write that old copy back."""
    import anyio

    await store.write([rec("1", "version 0", key="deploy")])
    for n in range(1, 11):
        async with anyio.create_task_group() as tg:
            tg.start_soon(store.write, [rec("1", f"version {n}", key="deploy", revision=n + 1)])
            tg.start_soon(store.reinforce, "alice", ["1"], 0.01 if n % 2 else -0.01)
        [current] = (await store.get_keys("alice", ["deploy"])).values()
        assert (current.content, current.revision) == (f"version {n}", n + 1), f"round {n}"
    assert files.loads((store.path / "owners/alice/deploy.md").read_bytes())[0].content == "version 10"


async def test_forget_by_scope_spares_a_record_a_concurrent_write_moved_out_of_it(store: GitStore) -> None:
    """forget {session: s1} deletes what is in s1 when it commits, not what was there when it was asked."""
    import anyio

    for n in range(10):
        await store.write([rec(f"k{n}", f"old {n}", key=f"k{n}", session="s1")])
        counts: list[int] = []

        async def forget() -> None:
            counts.append(await store.delete(Scope(owner="alice", where={"session": "s1"})))

        async with anyio.create_task_group() as tg:
            tg.start_soon(store.write, [rec(f"k{n}", f"new {n}", key=f"k{n}", session="s2", revision=2)])
            tg.start_soon(forget)
        kept = (await store.get_keys("alice", [f"k{n}"])).get(f"k{n}")
        assert kept is not None and kept.content == f"new {n}", f"round {n}: forgotten {counts}"
        assert counts == [0]


async def test_touches_during_a_reinforce_are_kept(store: GitStore) -> None:
    """A reinforce changes salience only: recalls counted while its commit runs are not undone by it."""
    import anyio

    await store.write([rec("1", key="k")])
    touches = 0
    for n in range(10):
        done = anyio.Event()

        async def reinforce() -> None:
            await store.reinforce("alice", ["1"], 0.01 if n % 2 else -0.01)
            done.set()

        async def recall_meanwhile() -> None:
            nonlocal touches
            while not done.is_set():  # touch does not wait for the writer lock: it lands mid-commit
                touches += 1
                await store.touch("alice", ["1"], f"2026-03-03T00:00:{n:02d}.000Z")
                await anyio.sleep(0.001)

        async with anyio.create_task_group() as tg:
            tg.start_soon(reinforce)
            tg.start_soon(recall_meanwhile)
    [r] = await store.get("alice", ["1"])
    assert (r.access_count, r.accessed_at) == (touches, "2026-03-03T00:00:09.000Z")
    await store.close()
    reopened = await opened(store.path.parent)
    try:
        [r] = await reopened.get("alice", ["1"])
        assert r.access_count == touches
    finally:
        await reopened.close()


async def test_behind_the_review_gate_reinforce_and_forget_act_on_the_proposed_record(tmp_path: Path) -> None:
    """The gate's writes land on `proposed`: a reinforce must not write main's older copy over the
    proposed one, and a forget by scope must not delete a proposed record that left the scope."""
    store = await opened(tmp_path, review=True)
    try:
        await store.write([rec("1", "v1", key="deploy", session="s1")])
        await store.approve()
        await store.write([rec("1", "v2", key="deploy", session="s2", revision=2)])
        assert await store.reinforce("alice", ["1"], 0.2) == 1
        assert await store.delete(Scope(owner="alice", where={"session": "s1"})) == 0
        await store.approve()
        [r] = await store.get("alice", ["1"])
        assert (r.content, r.revision, r.session, r.salience) == ("v2", 2, "s2", pytest.approx(0.7))
    finally:
        await store.close()


async def test_concurrent_closes_and_opens_act_once(tmp_path: Path) -> None:
    """open and close decide under the writer lock whether there is anything to do: a second
    close queued behind the first found no repository, a second open re-read the repository
    and dropped the access counts recorded since the first."""
    import anyio

    store = await opened(tmp_path)
    await store.write([rec("1", key="k")])
    await store.touch("alice", ["1"], "2026-03-02T00:00:00.000Z")  # flushed to the sidecar at close
    async with anyio.create_task_group() as tg:
        tg.start_soon(store.close)
        tg.start_soon(store.close)
    assert store.repo is None

    async def open_and_recall() -> None:
        await store.open()
        await store.touch("alice", ["1"], "2026-03-03T00:00:00.000Z")  # before the other open resumes

    async with anyio.create_task_group() as tg:
        tg.start_soon(open_and_recall)
        tg.start_soon(open_and_recall)
    try:
        [r] = await store.get("alice", ["1"])
        assert r.access_count == 3
    finally:
        await store.close()


async def test_behind_the_review_gate_a_proposed_write_leaves_mains_access_counts_across_restarts(
        tmp_path: Path) -> None:
    """The sidecar held one entry per id for both branches: a proposed restore of a forgotten key
    (which starts at no accesses) emptied the entry of the approved record main still shows, so a
    restart changed what readers see before anything was approved."""
    at = "2026-01-02T00:00:00.000Z"
    store = await opened(tmp_path, review=True)
    try:
        await store.write([rec(1, "tea", key="k")])
        await store.approve()
        await store.touch("alice", ["1"], at)
        await store.write([], ["1"])  # a proposed forget ...
        handlers = extensions(store)
        [first] = (await handlers["memory/history"]({"key": "k", "owner": "alice"}, Ctx()))["revisions"][-1:]
        out = await handlers["memory/restore"]({"key": "k", "commit": first["commit"], "owner": "alice"}, Ctx())
        assert (out["record"]["access_count"], out["record"]["revision"]) == (0, 2)  # ... and a proposed restore
        [shown] = await store.get("alice", ["1"])
        assert (shown.access_count, shown.accessed_at, shown.revision) == (1, at, 1)
    finally:
        await store.close()
    approved = False
    for approve in (False, True, False):  # reopened: main's still until approved, then the restore's
        store = await opened(tmp_path, review=True)
        try:
            if approve:
                await store.approve()
                approved = True
            [shown] = await store.get("alice", ["1"])
            want = (0, None, 2) if approved else (1, at, 1)
            assert (shown.access_count, shown.accessed_at, shown.revision) == want
            assert (store._proposed.records["1"].access_count, store._proposed.records["1"].revision) == (0, 2)
        finally:
            await store.close()


async def test_behind_the_review_gate_a_key_proposed_twice_is_one_record_with_two_revisions(tmp_path: Path) -> None:
    """A key written twice before an approve: the second write replaces the proposed record (same id,
    revision 2), and an id written twice is idempotent, as without the gate. The surface resolved writes
    against main (what readers see), so the second write of the key got a fresh id and revision 1
    again, and the id the first answered was gone once approved."""
    async with dispatchers(tmp_path, ["procedural"], {"review": True}) as running:
        call = partial(inprocess_call, running["procedural"])
        first = {"id": "p", "content": "v1", "key": "k"}
        assert await call("memory/remember", {"owner": "alice", "records": [first]}) == {"ids": ["p"]}
        assert await call("memory/remember", {"owner": "alice", "records": [{"content": "v2", "key": "k"}]}) \
            == {"ids": ["p"]}
        assert await call("memory/remember", {"owner": "alice", "records": [{"id": "p", "content": "v3"}]}) \
            == {"ids": ["p"]}
        revisions = (await call("memory/history", {"owner": "alice", "key": "k"}))["revisions"]
        assert [r["revision"] for r in revisions] == [2, 1]
        await call("memory/approve", {})
        record = (await call("memory/fetch", {"owner": "alice", "key": "k"}))["record"]
        assert (record["id"], record["content"], record["revision"]) == ("p", "v2", 2)



async def test_two_restores_of_one_key_at_once_write_two_revisions(store: GitStore) -> None:
    """A restore read the key's current record after reading the commit, outside the writer lock:
    two restores at once both read revision 1 and both wrote revision 2. From reading the commit
    to the write is one step under the lock now (reinforce and forget read under it too)."""
    import anyio

    handlers = extensions(store)
    await store.write([rec("p", "v1", key="k")])
    await store.write([rec("p", "v2", key="k", revision=2)])
    history = (await handlers["memory/history"]({"key": "k", "owner": "alice"}, Ctx()))["revisions"]
    commits = [r["commit"] for r in history]
    answers: list[dict[str, Any]] = []

    async def restore(commit: str) -> None:
        answers.append(await handlers["memory/restore"]({"key": "k", "commit": commit, "owner": "alice"}, Ctx()))

    async with anyio.create_task_group() as tg:
        for commit in reversed(commits):
            tg.start_soon(restore, commit)
    revisions = (await handlers["memory/history"]({"key": "k", "owner": "alice"}, Ctx()))["revisions"]
    assert [r["revision"] for r in revisions] == [4, 3, 2, 1]
    assert sorted(a["record"]["revision"] for a in answers) == [3, 4]
    assert (await store.get_keys("alice", ["k"]))["k"].revision == 4


async def test_a_remember_and_a_restore_of_one_key_at_once_write_two_revisions(tmp_path: Path) -> None:
    """A remember resolves its key's revision before it writes; a restore that wrote in between
    used to write that same revision, and the remember then wrote it again (history [4, 4, ...])."""
    async with dispatchers(tmp_path, ["procedural"]) as running:
        call = partial(inprocess_call, running["procedural"])
        for version in (1, 2, 3):
            await call("memory/remember", {"owner": "alice", "records": [{"content": f"v{version}", "key": "k"}]})
        first = (await call("memory/history", {"owner": "alice", "key": "k"}))["revisions"][-1]["commit"]
        store = running["procedural"].service.store
        write = store.write

        async def slow_write(*args: Any, **kwargs: Any) -> None:
            await asyncio.sleep(0.1)  # the remember has resolved revision 4 and not written it yet
            await write(*args, **kwargs)

        store.write = slow_write  # type: ignore[method-assign]

        async def restore_meanwhile() -> dict[str, Any]:
            await asyncio.sleep(0.02)
            return await call("memory/restore", {"owner": "alice", "key": "k", "commit": first})

        await asyncio.gather(call("memory/remember", {"owner": "alice", "records": [{"content": "v4", "key": "k"}]}),
                             restore_meanwhile())
        revisions = (await call("memory/history", {"owner": "alice", "key": "k"}))["revisions"]
        assert [r["revision"] for r in revisions] == [5, 4, 3, 2, 1]
        current = (await call("memory/fetch", {"owner": "alice", "key": "k"}))["record"]
        assert (current["revision"], current["content"]) == (5, "v1")


GIT_DOTGIT_KEYS = ["git~1/hooks/x", "GIT~1/x", "a/git~1. /b", "a/git~1:stream", ".g\u200cit/config", "x/\ufeff.GIT/y"]


async def test_a_key_git_would_refuse_to_check_out_is_kept_out_of_paths_and_the_store_still_opens(
        tmp_path: Path) -> None:
    """`git~1` is .git's NTFS short name and `.g\u200cit` is .git on HFS+: git refuses to check out
    such a path (core.protectNTFS is on by default on every platform) and `git fsck` reports
    hasDotgit. A key `git~1/x` was committed, and the next open's `git reset --hard` failed: the
    tier never opened again. Such keys are now encoded into one segment, which names no such file."""
    store = await opened(tmp_path)
    try:
        await store.write([rec(1, key="fine")])
        for n, key in enumerate(GIT_DOTGIT_KEYS, start=2):
            await store.write([rec(n, key=key)])
    finally:
        await store.close()
    store = await opened(tmp_path)
    try:
        assert len(await store.select(Scope(owner="alice"), limit=100)) == 1 + len(GIT_DOTGIT_KEYS)
        assert set(await store.get_keys("alice", GIT_DOTGIT_KEYS)) == set(GIT_DOTGIT_KEYS)
        fsck = subprocess.run(["git", "-C", str(store.path), "fsck", "--no-progress"], capture_output=True, text=True)
        assert fsck.returncode == 0 and "hasDotgit" not in fsck.stdout + fsck.stderr
    finally:
        await store.close()


async def test_history_of_a_key_with_glob_characters_is_that_keys_alone(store: GitStore) -> None:
    """A key is a path, and git reads a path given to `git log` as a glob: the history of `a*` also
    listed the commits of `ab` and `x/aq` (with revision null, "the commit removed it")."""
    await store.write([rec("1", "ab steps", key="ab")])
    await store.write([rec("2", "star steps", key="a*")])
    await store.write([rec("3", "deep steps", key="x/a[q]")])
    await store.write([rec("4", "q steps", key="x/aq")])
    history = extensions(store)["memory/history"]
    for key, revisions in (("a*", ["remember a* (rev 1)"]), ("a?", []), ("x/a[q]", ["remember x/a[q] (rev 1)"])):
        result = await history({"key": key, "owner": "alice"}, Ctx())
        assert [r["message"] for r in result["revisions"]] == revisions, key


async def test_the_review_gate_turned_on_again_proposes_on_top_of_what_main_holds(tmp_path: Path) -> None:
    """Writes made while the gate was off land on main, and `proposed` stayed where the last approve
    left it: once the gate was back, a write was resolved against that old branch (revision 2 again,
    for a key main held at 2) and every approve was refused, "proposed has diverged from main"."""
    store = await opened(tmp_path, review=True)
    await store.write([rec("p", "v1", key="k")])
    await extensions(store)["memory/approve"]({}, Ctx())
    await store.close()
    store = await opened(tmp_path)  # the gate off: straight to main
    await store.write([rec("p", "v2", key="k", revision=2), rec("q", "main only", key="q")])
    await store.close()
    store = await opened(tmp_path, review=True)
    try:
        assert (await store.write_keys("alice", ["k", "q"])).keys() == {"k", "q"}
        await store.write([rec("p", "v3", key="k", revision=3)])
        assert (await extensions(store)["memory/approve"]({}, Ctx()))["approved"] == 1
        [record] = (await store.get_keys("alice", ["k"])).values()
        assert (record.content, record.revision) == ("v3", 3) and await store.count("alice") == 2
    finally:
        await store.close()


async def test_proposals_left_pending_are_named_when_the_gate_is_off(tmp_path: Path,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    """A store served without the gate neither shows nor approves what waits on `proposed`: it said
    nothing, and the proposals looked lost. It is logged at open; nothing pending, nothing said."""
    store = await opened(tmp_path, review=True)
    await store.write([rec("p", "v1", key="k")])
    await store.close()
    with caplog.at_level("WARNING", logger="a2m"):
        store = await opened(tmp_path)
        await store.close()
    assert any("holds proposals not on" in r.getMessage() for r in caplog.records)
    store = await opened(tmp_path, review=True)
    await extensions(store)["memory/approve"]({}, Ctx())
    await store.close()
    caplog.clear()
    with caplog.at_level("WARNING", logger="a2m"):
        store = await opened(tmp_path)
        await store.close()
    assert not any("holds proposals" in r.getMessage() for r in caplog.records)


async def test_records_survive_recovery_under_a_user_git_config_that_converts_line_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tree was read back from the working tree, which `git reset --hard` writes through the
    user's git config: with `core.autocrlf=true` (a ~/.gitconfig brought from Windows) the files an
    interrupted write left behind came back with CRLF line ends, and the store skipped them as "not
    a record file": committed procedures vanished at the restart after a crash."""
    config = tmp_path / "gitconfig"
    config.write_text("[core]\n\tautocrlf = true\n")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(config))
    store = await opened(tmp_path)
    written = [rec(i, f"step one\nstep two of {i}\n", key=f"k{i}") for i in range(3)]
    await store.write(written)
    await store.close()
    repo = tmp_path / "repo"
    (repo / "owners/alice/k1.md").write_text("---\nid: '1'\n---\nhalf of a replace\n")  # what a kill -9 leaves
    (repo / "owners/alice/k2.md").unlink()  # ... and half of a forget
    store = await opened(tmp_path)
    try:
        assert await store.get("alice", ["0", "1", "2"]) == written
    finally:
        await store.close()


async def test_git_lock_files_a_crash_left_are_cleared_at_open(tmp_path: Path) -> None:
    """A kill while git holds a lock leaves it behind: `config.lock` (the identity set at every open)
    made every later open fail, "Lock for file ... did already exist", and `ORIG_HEAD.lock` (taken by
    the merge of an approve) made every later approve fail."""
    store = await opened(tmp_path, review=True)
    await store.write([rec(1, key="a/one")])
    await store.close()
    git_dir = tmp_path / "repo" / ".git"
    for name in ("config.lock", "ORIG_HEAD.lock", "packed-refs.lock"):
        (git_dir / name).write_text("")
    store = await opened(tmp_path, review=True)
    try:
        await store.write([rec(2, key="a/two")])
        assert (await extensions(store)["memory/approve"]({}, Ctx()))["approved"] == 2
        assert [r.id for r in await store.select(Scope(owner="alice"))] == ["1", "2"]
        assert not list(git_dir.glob("*.lock"))
    finally:
        await store.close()


async def test_a_remote_that_never_answers_delays_a_write_only_by_the_push_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The push runs after each commit under the writer lock, and had no time limit: a remote that
    accepts the connection and never answers (a stalled network, a hung ssh) held every write, and
    every read-then-write, forever. A down mirror must not stop the tier."""
    from backends.procedural import store as store_module

    monkeypatch.setattr(store_module, "PUSH_TIMEOUT_S", 1.0)
    monkeypatch.setenv("GIT_SSH_COMMAND", "sleep 60; :")  # what a black-holed remote looks like to git
    store = await opened(tmp_path, remote="ssh://mirror.invalid/team.git")
    try:
        start = time.monotonic()
        with anyio.fail_after(20):
            await store.write([rec(1, key="a/one")])
        assert time.monotonic() - start < 10
        assert store.push_error and await store.count("alice") == 1
    finally:
        await store.close()


async def _wire(d: Any, method: str, params: dict[str, Any]) -> dict[str, Any]:
    """The whole reply, error message and data included."""
    from a2m.dispatch import Context

    reply = await d.handle({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}, Context())
    assert reply is not None
    return reply


async def test_an_approve_git_refuses_says_why_and_changes_nothing(tmp_path: Path) -> None:
    """git's refusals came out as `-32603 internal error: GitCommandError`: a file a person left in
    the working tree, a lock another git process holds, main moved by hand, a proposed object gone.
    The repository's state someone must change first is -32602 saying what to change; git failing
    is the tier unavailable (-32603 naming it). Either way main, `proposed` and what readers see are
    as before, and the approve goes through once the cause is gone."""
    async with dispatchers(tmp_path, ["procedural"], {"review": True}) as running:
        d = running["procedural"]
        call = partial(inprocess_call, d)
        repo = tmp_path / "procedural" / "repo"
        assert await call("memory/remember", {"owner": "alice", "records": [
            {"id": "r", "content": "refund: check the receipt", "key": "skills/refund"}]}) == {"ids": ["r"]}
        proposed = git(repo, "rev-parse", "proposed").strip()

        async def refused(code: int, *words: str) -> None:
            main = git(repo, "rev-parse", "main").strip()
            shown = await call("memory/fetch", {"owner": "alice", "key": "skills/refund"})
            reply = await _wire(d, "memory/approve", {})
            error = reply.get("error")
            assert error is not None and error["code"] == code, reply
            assert error["data"]["tier"] == "procedural", error
            assert "internal error" not in error["message"] and all(w in error["message"] for w in words), error
            assert git(repo, "rev-parse", "main").strip() == main
            assert git(repo, "rev-parse", "proposed").strip() == proposed
            assert await call("memory/fetch", {"owner": "alice", "key": "skills/refund"}) == shown

        in_the_way = repo / "owners/alice/skills/refund.md"
        in_the_way.parent.mkdir(parents=True)
        in_the_way.write_text("a draft someone saved here\n")
        await refused(-32602, "owners/alice/skills/refund.md", "move them away or discard them")
        assert in_the_way.read_text() == "a draft someone saved here\n"  # not the store's to throw away
        in_the_way.unlink()

        lock = repo / ".git/index.lock"
        lock.write_text("")
        await refused(-32603, "tier procedural (git) unavailable", "index.lock", "then approve again")
        lock.unlink()

        path = "owners/alice/skills/refund.md"
        blob = git(repo, "rev-parse", f"proposed:{path}").strip()
        loose = repo / ".git/objects" / blob[:2] / blob[2:]
        saved = loose.read_bytes()
        loose.unlink()  # an object the fast-forward must check out, lost (a disk error, a bad copy)
        await refused(-32603, "tier procedural (git) unavailable")
        assert not (repo / path).exists()
        loose.write_bytes(saved)

        assert (await call("memory/approve", {}))["approved"] == 1
        assert (await call("memory/fetch", {"owner": "alice", "key": "skills/refund"}))["record"]["id"] == "r"

        # main moved by hand: it cannot be fast-forwarded to what was proposed since.
        assert await call("memory/remember", {"owner": "alice", "records": [
            {"content": "v2", "key": "skills/refund"}]}) == {"ids": ["r"]}
        proposed = git(repo, "rev-parse", "proposed").strip()
        git(repo, "commit", "-q", "--allow-empty", "-m", "a commit made by hand on main")
        await refused(-32602, "merge main into proposed")
        assert git(repo, "log", "-1", "--format=%s", "main").strip() == "a commit made by hand on main"


async def test_an_approve_tells_each_owner_what_it_made_recallable(tmp_path: Path) -> None:
    """Behind the gate a record becomes recallable at the approve, which emitted no event: a poller
    or subscriber waiting for a procedure never learnt it was there. Now each owner is told of their
    own records as a write would tell them: one `written` per record main shows anew (at the revision
    approved, in write order) and one `forgotten` counting what it no longer shows. A reinforce alone
    is no event (as without the gate), nor is an approve of nothing."""
    async with dispatchers(tmp_path, ["procedural"], {"review": True}) as running:
        call = partial(inprocess_call, running["procedural"])
        await call("memory/remember", {"owner": "alice", "records": [
            {"id": "old", "content": "v1", "key": "deploy"}, {"id": "gone", "content": "to forget"},
            {"id": "kept", "content": "reinforced only"}]})
        await call("memory/approve", {})
        await call("memory/remember", {"owner": "alice", "records": [
            {"content": "v2", "key": "deploy", "session": "s1"}, {"id": "new", "content": "new one", "key": "k/new"}]})
        await call("memory/remember", {"owner": "alice", "records": [{"id": "loose", "content": "no key"}]})
        await call("memory/remember", {"owner": "bob", "records": [{"id": "b", "content": "bob's", "key": "k/new"}]})
        assert await call("memory/reinforce", {"owner": "alice", "ids": ["kept"], "amount": 0.2}) == {"reinforced": 1}
        assert await call("memory/forget", {"owner": "alice", "ids": ["gone"]}) == {"forgotten": 1}
        heads = {who: (await call("memory/events", {"owner": who} if who else {}))["cursor"]
                 for who in ("alice", "bob", None)}

        async def told(who: str | None) -> list[tuple[Any, ...]]:
            params = {"cursor": heads[who], **({"owner": who} if who else {})}
            polled = (await call("memory/events", params))["events"]
            return [(e["kind"], e.get("id"), e.get("tier"), e.get("session"), e.get("key"), e.get("revision"),
                     e.get("count")) for e in polled]

        assert (await call("memory/approve", {}))["approved"] == 5
        assert await told("alice") == [
            ("forgotten", None, "procedural", None, None, None, 1),
            ("written", "old", "procedural", "s1", "deploy", 2, None),
            ("written", "new", "procedural", None, "k/new", 1, None),
            ("written", "loose", "procedural", None, None, None, None),
        ]
        assert await told("bob") == [("written", "b", "procedural", None, "k/new", 1, None)]
        assert await told(None) == []
        heads = {who: (await call("memory/events", {"owner": who} if who else {}))["cursor"]
                 for who in ("alice", "bob", None)}
        assert (await call("memory/approve", {}))["approved"] == 0
        assert await told("alice") == [] and await told("bob") == []


@pytest.mark.parametrize("review", [True, False])
async def test_a_gated_write_is_told_once_when_approved_not_when_proposed(tmp_path: Path, review: bool) -> None:
    """Behind the gate remember, restore and forget told their `written` / `forgotten` events when the
    write landed on `proposed`, where nobody can recall it, and the approve told them again: a reader
    heard of each record twice, first of one it could not fetch. An event reaches only callers who
    could have recalled its record (protocol, memory/events), so a gated write is told by the approve
    alone, to poller and subscriber alike. Without the gate each write is told as it lands."""
    async with dispatchers(tmp_path, ["procedural"], {"review": review}) as running:
        d = running["procedural"]
        call = partial(inprocess_call, d)
        pushed: list[dict[str, Any]] = []

        async def push(event: dict[str, Any]) -> None:
            pushed.append(event)

        await d.service.subscribe({"owner": "alice"}, Context(push=push))
        cursor = (await call("memory/events", {"owner": "alice"}))["cursor"]

        async def told() -> list[tuple[Any, ...]]:
            nonlocal cursor
            answer = await call("memory/events", {"owner": "alice", "cursor": cursor})
            cursor = answer["cursor"]
            polled = [(e["kind"], e.get("id"), e.get("revision"), e.get("count")) for e in answer["events"]]
            assert polled == [(e["kind"], e.get("id"), e.get("revision"), e.get("count")) for e in pushed]
            pushed.clear()
            return polled

        async def approve() -> None:
            if review:
                await call("memory/approve", {})

        await call("memory/remember", {"owner": "alice", "records": [{"id": "p", "content": "v1", "key": "deploy"}]})
        if review:
            assert await told() == []
            assert (await call("memory/fetch", {"owner": "alice", "key": "deploy"}))["record"] is None
        await approve()
        assert await told() == [("written", "p", 1, None)]

        await call("memory/remember", {"owner": "alice", "records": [{"content": "v2", "key": "deploy"}]})
        first = (await call("memory/history", {"owner": "alice", "key": "deploy"}))["revisions"][-1]["commit"]
        await call("memory/restore", {"owner": "alice", "key": "deploy", "commit": first})
        if review:
            assert await told() == []
            await approve()
            assert await told() == [("written", "p", 3, None)]  # what main shows now, once
        else:
            assert await told() == [("written", "p", 2, None), ("written", "p", 3, None)]

        assert await call("memory/forget", {"owner": "alice", "ids": ["p"]}) == {"forgotten": 1}
        if review:
            assert await told() == []
            assert (await call("memory/fetch", {"owner": "alice", "key": "deploy"}))["record"]["revision"] == 3
        await approve()
        assert await told() == [("forgotten", None, None, 1)]


async def test_the_sessions_procedures_hold_are_listed_and_a_close_leaves_them(tmp_path: Path) -> None:
    """The tier stores a record's `session`, returns it, selects by it (`where.session`) and names it in
    its events, yet did not declare `sessions`: session/list answered -32003, so the router's
    session/list (which asks only tiers that declare it) never counted a conversation's procedures.
    Declared, session/list counts what a recall can see (behind the gate: what is approved), per
    owner, and session/close is the protocol's close of a procedural tier: nothing moved or deleted
    (it "never touches procedural"), the close told."""
    async with dispatchers(tmp_path, ["procedural"], {"review": True}) as running:
        call = partial(inprocess_call, running["procedural"])
        assert "sessions" in (await call("memory/describe", {}))["capabilities"]
        await call("memory/remember", {"owner": "alice", "records": [
            {"id": "a", "content": "first", "session": "s1", "created_at": "2026-01-01T00:00:01.000Z"},
            {"id": "b", "content": "second", "session": "s1", "key": "k/b", "created_at": "2026-01-01T00:00:03.000Z"},
            {"id": "c", "content": "other", "session": "s2", "created_at": "2026-01-01T00:00:02.000Z"},
            {"id": "d", "content": "no session"}]})
        await call("memory/remember", {"owner": "bob", "records": [{"content": "bob's", "session": "s1"}]})
        assert await call("memory/session/list", {"owner": "alice"}) == {"sessions": []}  # proposed only
        await call("memory/approve", {})
        await call("memory/remember", {"owner": "alice", "records": [{"content": "pending", "session": "s1"}]})
        assert await call("memory/session/list", {"owner": "alice"}) == {"sessions": [
            {"session": "s1", "records": 2, "tiers": {"procedural": 2},
             "opened_at": "2026-01-01T00:00:01.000Z", "touched_at": "2026-01-01T00:00:03.000Z"},
            {"session": "s2", "records": 1, "tiers": {"procedural": 1},
             "opened_at": "2026-01-01T00:00:02.000Z", "touched_at": "2026-01-01T00:00:02.000Z"}]}
        assert [(s["session"], s["records"]) for s in
                (await call("memory/session/list", {"owner": "bob"}))["sessions"]] == [("s1", 1)]
        before = (await call("memory/timeline", {"owner": "alice"}))["records"]
        cursor = (await call("memory/events", {"owner": "alice"}))["cursor"]
        closed = await call("memory/session/close", {"owner": "alice", "session": "s1"})
        assert closed == {"moved": 0, "promoted": 0, "dropped": 0, "summarized": 0, "counts": {"procedural": 4},
                          "closed": "s1", "flushed": 0}
        assert (await call("memory/timeline", {"owner": "alice"}))["records"] == before
        told = (await call("memory/events", {"owner": "alice", "cursor": cursor}))["events"]
        assert [(e["kind"], e["session"]) for e in told] == [("session_closed", "s1")]
        assert await call("memory/session/close", {"owner": "alice", "session": ""}) == {"error": -32602}


async def test_history_by_id_of_a_forgotten_keyed_record_lists_its_commits(store: GitStore) -> None:
    """History by id read the file an id's record lives at now, else the file an unkeyed record of
    that id would have: a keyed record, once forgotten, answered no revisions by its id, though its
    key's history (the removal included, revision null) was all there. Its id finds the file it
    last left now; another owner asking finds nothing, as for any record not theirs."""
    history = extensions(store)["memory/history"]
    await store.write([rec("p", "v1", key="skills/deploy")])
    await store.write([rec("p", "v2", key="skills/deploy", revision=2)])
    await store.write([rec("q", "unkeyed")])
    await store.write([], ["p", "q"])

    async def revisions(**params: Any) -> list[Any]:
        return [r["revision"] for r in (await history({"owner": "alice", **params}, Ctx()))["revisions"]]

    assert await revisions(key="skills/deploy") == [None, 2, 1]
    assert await revisions(id="p") == [None, 2, 1]
    assert await revisions(id="q") == [None, 1]
    assert await revisions(owner="bob", id="p") == [] and await revisions(id="never") == []


@pytest.mark.parametrize("header", ["id: [unclosed\n", "id: x\nsalience: null\n", "id: x\nseq: [1]\n"])
async def test_a_committed_file_that_is_not_a_record_is_skipped_not_fatal(tmp_path: Path, header: str) -> None:
    """A file committed by hand (a reviewer's edit) whose header is not a record's is logged and
    skipped at open, and `memory/history` shows its commit without a revision: `files.loads` says
    so with ValueError, its contract. Broken YAML and wrong types escaped it, and the tier could
    not open at all (a raw ScannerError / TypeError)."""
    store = await opened(tmp_path)
    await store.write([rec(1, key="skills/good"), rec(2, key="skills/broken")])
    await store.close()
    repo = tmp_path / "repo"
    (repo / "owners/alice/skills/broken.md").write_text(f"---\n{header}---\nbody\n", "utf-8")
    git(repo, "-c", "user.name=Hand", "-c", "user.email=hand@example.org", "commit", "-qam", "hand edit")
    store = await opened(tmp_path)
    try:
        assert [r.key for r in await store.select(Scope(owner="alice"))] == ["skills/good"]
        history = extensions(store)["memory/history"]
        result = await history({"key": "skills/broken", "owner": "alice"}, Ctx())
        assert [r["revision"] for r in result["revisions"]] == [None, 1]
    finally:
        await store.close()


async def test_a_file_moved_by_hand_from_its_place_is_said_at_open(tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    """A reviewer's `git mv` leaves the header naming the old key: reads take the header, a write of
    that key finds nothing at its place and makes a second record. Nothing said it; now open does."""
    store = await opened(tmp_path)
    await store.write([rec(1, key="skills/deploy"), rec(2, key="skills/other")])
    await store.close()
    repo = tmp_path / "repo"
    git(repo, "mv", "owners/alice/skills/deploy.md", "owners/alice/skills/deploy-prod.md")
    git(repo, "-c", "user.name=Hand", "-c", "user.email=hand@example.org", "commit", "-qm", "rename by hand")
    with caplog.at_level(logging.WARNING, logger="a2m.procedural"):
        store = await opened(tmp_path)
    await store.close()
    moved = [r.getMessage() for r in caplog.records if "whose place is" in r.getMessage()]
    assert len(moved) == 1 and "owners/alice/skills/deploy-prod.md" in moved[0] and "skills/deploy.md" in moved[0]


async def test_files_committed_by_hand_each_have_a_place_of_their_own_in_the_timeline(tmp_path: Path) -> None:
    """A file a reviewer copied (its `seq` with it) or wrote anew (no `seq`: 0) shares its insertion
    sequence with another record of the same millisecond. The timeline cursor names a record's place
    by (created_at, seq) (decision 120), so a walk past one of the two skipped the other: each record
    loaded takes a sequence no other one holds."""
    stamp = "2026-03-01T00:00:00.000Z"
    store = await opened(tmp_path)
    await store.write([rec(1, key="skills/good", created_at=stamp), rec(2, key="skills/other", created_at=stamp)])
    await store.close()
    repo = tmp_path / "repo"
    copied = (repo / "owners/alice/skills/good.md").read_text("utf-8")
    assert "\nseq: 1\n" in copied, copied
    (repo / "owners/alice/skills/better.md").write_text(
        copied.replace("id: '1'", "id: '3'").replace("key: skills/good", "key: skills/better"), "utf-8")
    for n in (1, 2):
        (repo / f"owners/alice/skills/hand{n}.md").write_text(
            f"---\nid: h{n}\nkey: skills/hand{n}\nowner: alice\ncreated_at: '{stamp}'\n---\nby hand\n", "utf-8")
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=Hand", "-c", "user.email=hand@example.org", "commit", "-qm", "hand edit")
    store = await opened(tmp_path)
    try:
        every = [r.id for r in await store.select(Scope(owner="alice"), order="desc")]
        assert sorted(every) == ["1", "2", "3", "h1", "h2"]
        walked: list[str] = []
        below = None
        while page := await store.timeline_page(Scope(owner="alice"), below=below, limit=1):
            walked += [r.id for r, _ in page]
            below = page[-1][1]
        assert walked == every
        await store.write([rec(4, key="skills/new", created_at=stamp)])  # a write after them comes after them
        assert [r.id for r, _ in await store.timeline_page(Scope(owner="alice"), below=None, limit=1)] == ["4"]
    finally:
        await store.close()


@pytest.mark.parametrize("key", ["skills//deploy", "skills\\\\deploy", "skills/.git/deploy"])
async def test_a_file_whose_header_key_cannot_be_a_path_is_served_not_fatal_at_open(tmp_path: Path, key: str) -> None:
    """The check that a file sits at its header's place asks the layout for that place, which refuses
    a key that cannot be a path (StoreRejected, not a ValueError): one such file committed by hand
    stopped the whole tier at open. Reads still serve it, as before the check."""
    store = await opened(tmp_path)
    await store.write([rec(1, key="skills/deploy")])
    await store.close()
    repo = tmp_path / "repo"
    path = repo / "owners" / "alice" / "skills" / "deploy.md"
    text = path.read_text()
    path.write_text(text.replace("key: skills/deploy", f"key: \"{key}\"", 1))
    assert f'key: "{key}"' in path.read_text()
    git(repo, "-c", "user.name=Hand", "-c", "user.email=hand@example.org", "commit", "-qam", "edit by hand")
    store = await opened(tmp_path)
    try:
        assert [r.content for r in await store.select(Scope(owner="alice"), order="asc", limit=10)] == [rec(1).content]
    finally:
        await store.close()


def loose_objects(repo: Path) -> int:
    counts = dict(line.split(": ") for line in git(repo, "count-objects", "-v").splitlines())
    return int(counts["count"])


async def test_rewrites_leave_a_bounded_number_of_loose_objects(tmp_path: Path) -> None:
    """Every write stores its objects as loose files, and nothing but git's porcelain packs them: a tier
    that rewrote its skills grew by a file an object for ever (found by a soak: 4,370 loose objects for
    500 rewrites of 120 records). The store packs them once the repository's `gc.auto` of them are stored
    (64 here, git's 6,700 by default), and what was packed still reads back, after a restart too."""
    store = await opened(tmp_path)
    git(store.path, "config", "gc.auto", "64")
    await store.close()
    store = await opened(tmp_path)
    writes, skills = 150, 6
    for i in range(writes):
        await store.write([rec(i % skills, f"procedure {i} for the harbour", key=f"skills/s{i % skills}")])
    assert loose_objects(store.path) < 64 + 10  # ~6 objects a write: ~900 stored
    assert git(store.path, "count-objects", "-v").count("packs: 0") == 0
    git(store.path, "fsck", "--no-progress")
    await store.close()
    store = await opened(tmp_path)
    try:
        got = {r.id: r.content for r in await store.get("alice", [str(s) for s in range(skills)])}
        assert got == {str(s): f"procedure {writes - skills + s} for the harbour" for s in range(skills)}
    finally:
        await store.close()
