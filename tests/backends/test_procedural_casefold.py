"""The procedural tier on a file system that folds case (macOS's default, Windows).

CI runs on Linux, so the store is told the file system folds (`case_insensitive`): the probe's
answer, not the file system, is what is injected; everything after it is the real code path.
A manual run on a case-insensitive FUSE mount is in the procedural decisions (casefs)."""

from __future__ import annotations

import re
import subprocess
import unicodedata
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st

from a2m.records import Record
from backends.procedural import files, make_store
from backends.procedural.store import GitStore, folds_case
from backends.settings import TierSettings
from backends.store import StoreRejected, StoreUnavailable

pytestmark = pytest.mark.anyio


def rec(i: str, owner: str | None, key: str | None, content: str = "") -> Record:
    return Record(id=i, content=content or f"procedure {i}", created_at="2026-01-01T00:00:01.000Z", owner=owner, key=key)


async def opened(data: Path, **options: Any) -> GitStore:
    store = make_store(TierSettings("procedural", data, options=options))
    await store.open()
    return store


def tree(repo: Path) -> list[str]:
    out = subprocess.run(["git", "-C", str(repo), "ls-tree", "-r", "--name-only", "HEAD"], capture_output=True,
                         text=True, check=True).stdout
    return out.splitlines()


def test_the_probe_finds_linux_file_systems_case_sensitive(tmp_path: Path) -> None:
    assert folds_case(tmp_path) is False
    assert list(tmp_path.iterdir()) == []


def _with_case_variants(texts: list[str]) -> list[str]:
    """`texts` and each one's case variants: random text alone almost never holds two names that
    differ only in case, the pairs this property is about (without them it passed with no escaping)."""
    variants = [v for t in texts for v in (t, t.upper(), t.lower(), t.swapcase(), t.title())]
    return list(dict.fromkeys(variants))


@settings(deadline=None)  # a loaded CI machine can stall one example past the 200 ms default: not a failure
@given(st.lists(st.text(max_size=12), min_size=1, max_size=4).map(_with_case_variants))
def test_case_escaped_segments_never_fold_together(texts: list[str]) -> None:
    encoded = [files.encode_segment(t, escape_case=True) for t in texts]
    assert len({files.fold(e) for e in encoded}) == len(texts)


async def test_a_new_store_on_a_folding_file_system_keeps_owners_and_ids_apart(tmp_path: Path) -> None:
    store = await opened(tmp_path, case_insensitive=True)
    await store.write([rec("a1", "Alice", "proc", "ALICE's")])
    await store.write([rec("a2", "alice", "proc", "alice's")])
    await store.write([rec("X1", "alice", None)])
    await store.write([rec("x1", "alice", None)])
    paths = tree(store.path)
    assert files.LAYOUT_FILE in paths and "owners/!alice/proc.md" in paths and "owners/alice/proc.md" in paths
    assert files.folding_clashes(paths) == []
    await store.close()
    # The layout is the repository's: a copy opened where case is kept (a Linux clone) reads it the same,
    # so a keyed replace finds the record it replaces instead of making a second one.
    again = await opened(tmp_path)
    assert again.folds_case is False and again.layout.escape_case
    await again.write([rec("a3", "Alice", "proc", "ALICE's v2")])
    held = await again.get_keys("Alice", ["proc"])
    assert held["proc"].content == "ALICE's v2" and await again.count("Alice") == 1
    assert (await again.get_keys("alice", ["proc"]))["proc"].content == "alice's"
    await again.close()


@pytest.mark.parametrize("first,second", [("Deploy", "deploy"), ("skills/Refund", "skills/refund"),
                                          ("caf\u00e9", unicodedata.normalize("NFD", "caf\u00e9"))])
async def test_an_owners_keys_that_fold_together_are_refused(tmp_path: Path, first: str, second: str) -> None:
    store = await opened(tmp_path, case_insensitive=True)
    await store.write([rec("k1", "alice", first)])
    head = tree(store.path)
    with pytest.raises(StoreRejected, match="differ only in case"):
        await store.write([rec("k2", "alice", second)])
    with pytest.raises(StoreRejected):  # in one batch too
        await store.write([rec("k3", "bob", first), rec("k4", "bob", second)])
    assert tree(store.path) == head and await store.count("alice") == 1 and await store.count("bob") == 0
    await store.write([rec("k5", "Alice", second)])  # another owner's: its own directory
    await store.close()


async def test_a_store_written_where_case_is_kept_stays_byte_for_byte(tmp_path: Path) -> None:
    store = await opened(tmp_path)
    await store.write([rec("a1", "Alice", "proc"), rec("X1", "Alice", None)])
    assert tree(store.path) == ["owners/Alice/_ids/X1.md", "owners/Alice/proc.md"]
    await store.close()


async def test_a_first_layout_store_on_a_folding_file_system(tmp_path: Path) -> None:
    """Written where case is kept, then served where it folds: its paths stay (no migration); a write
    onto another owner's file is refused without naming that owner's key; a pair already there stops open."""
    store = await opened(tmp_path)
    await store.write([rec("a1", "Alice", "Secret-Key")])  # its key differs from the writer's: a refusal naming it shows
    await store.close()
    folding = await opened(tmp_path, case_insensitive=True)
    assert not folding.layout.escape_case and files.LAYOUT_FILE not in tree(folding.path)
    with pytest.raises(StoreRejected) as refused:
        await folding.write([rec("a2", "alice", "secret-key")])
    assert "cannot be stored" in str(refused.value)
    assert not {"Alice", "a1", "Secret-Key"} & set(re.findall(r"[\w-]+", str(refused.value))), str(refused.value)
    await folding.write([rec("a3", "alice", "other")])
    await folding.close()
    plain = await opened(tmp_path)  # where case is kept the pair can be written
    await plain.write([rec("a2", "alice", "secret-key")])
    await plain.close()
    with pytest.raises(StoreUnavailable, match="owners/Alice/Secret-Key.md and owners/alice/secret-key.md"):
        await opened(tmp_path, case_insensitive=True)
