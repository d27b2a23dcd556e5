"""Backup and restore of a whole federation: the router over the four real tier servers (Redis,
PostgreSQL, Qdrant Edge, git, all embedded), filled through the router with awkward records in every
tier and several owners, `a2m export`, `a2m import` into an empty federation, compared record by record.

One federation runs at a time (the source, then each target), so the test stays light on two cores.
"""

from __future__ import annotations

import random
import subprocess
from pathlib import Path
from typing import Any, Sequence

import orjson
import pytest

from a2m.client import HTTPClient
from a2mctl import transfer
from tests.conftest import scale
from tests.router.stack import federation, tier_call
from tests.support.procs import ROOT, a2m_command

pytestmark = pytest.mark.timeout(240)

TIERS = [
    {"name": "working", "kind": "working", "capacity": 6, "spill_to": "episodic", "timeout": 10.0},
    {"name": "episodic", "kind": "episodic", "spill_to": "semantic", "promote_to": "semantic", "promote_after": 3,
     "timeout": 10.0},
    {"name": "semantic", "kind": "semantic", "timeout": 10.0},
    {"name": "procedural", "kind": "procedural", "timeout": 10.0},
]
TOP = {"router": {"background_promotion": False}}  # recalls are counted before the call returns
NAMES = [t["name"] for t in TIERS]
OWNERS: list[str | None] = [None, "alice", "bøb"]
FIELDS = ("id", "content", "created_at", "accessed_at", "access_count", "revision", "salience", "key", "group",
          "session", "role", "owner", "metadata", "uri", "media_type", "tier")

# Values whose type or precision a careless store changes: ints past 2^53 (and at the ends of int64),
# floats that look like ints or sit at the ends of the range, negative zero, unicode, dotted keys.
AWKWARD: list[Any] = [
    2**53 + 1, 2**63 - 1, -(2**63), 9007199254740993, 0, -1,
    1e16, 2.0**60, -0.0, 5e-324, 1.7976931348623157e308, 0.1, 1.0, -2.5e-300,
    "é漢字🙂", "line\u2028sep", "e\u0301", "", "1e5", "007", "null",
    True, False, None, [], {}, [1, "two", 3.0, None, {"x": [2**60]}],
]


def _metadata(rng: random.Random, i: int) -> dict[str, Any]:
    picks = rng.sample(AWKWARD, 6)
    return {"i": i, "a.b": picks[0], "a": {"b": picks[1], "c.d": {"e": picks[2]}}, "list": picks[3:],
            "ünï": {"🙂": picks[0]}, "deep": {"x": {"y": {"z": [picks[4], {"w": picks[5]}]}}}}


def _vector(rng: random.Random) -> list[float]:
    # float32-exact (pgvector and Qdrant store float32): the round trip is then exact at every step.
    return [rng.choice([0.5, -0.25, 1.0, 0.125, -1.0, 0.75, 0.0625]) for _ in range(4)]


async def _fill(client: HTTPClient, owner: str | None, rng: random.Random, n: int) -> None:
    """Records in every tier for one owner, with the history a real federation gives them: spilled,
    promoted (by hand and by recall counts), recalled, reinforced, keys replaced."""
    tag = owner or "anon"

    async def call(method: str, params: dict[str, Any]) -> dict[str, Any]:
        return await client.call(method, params if owner is None else {**params, "owner": owner})

    roles = ["user", "assistant", "tool", "system", "memory"]
    # A conversation over working's capacity (6 per session): the oldest spill to episodic, the
    # tool call and its result (one group) together.
    chat = [{"content": f"turn {i} of {tag} about the ☂ plan", "session": f"chat-{tag}", "role": roles[i % 5],
             "metadata": _metadata(rng, i), **({"embedding": _vector(rng)} if i % 2 else {})} for i in range(n)]
    chat[1]["group"] = chat[2]["group"] = f"call/{tag}.1"
    for start in range(0, n, 3):  # several writes, so the capacity pass runs more than once
        await call("memory/remember", {"records": chat[start:start + 3]})
    # A second session, closed: it leaves working at once.
    await call("memory/remember", {"records": [
        {"content": f"closed talk {i} {tag}", "session": f"done-{tag}", "metadata": _metadata(rng, 100 + i)}
        for i in range(3)]})
    await call("memory/session/close", {"session": f"done-{tag}"})
    # Keys replaced in working and procedural (revision > 1), an old created_at kept by the import extension.
    for revision in range(3):
        await call("memory/remember", {"records": [
            {"content": f"{tag} lives in city {revision}", "key": f"user/{tag}/city", "metadata": {"rev": revision}},
            {"content": f"skill v{revision} for {tag}", "key": f"skills/{tag}.deploy", "tier": "procedural",
             "metadata": _metadata(rng, 200 + revision), "role": "system"}]})
    await call("memory/remember", {"records": [
        {"content": f"old skill {tag}", "key": f"skills/{tag}/old", "tier": "procedural",
         "created_at": "2024-02-29T23:59:59.999Z"}]})
    # Episodic: external references, vectors, a group; semantic: facts with vectors and keys.
    episodic = (await call("memory/remember", {"records": [
        {"content": f"episode {i} {tag} receipt", "tier": "episodic", "metadata": _metadata(rng, 300 + i),
         "uri": f"s3://bucket/{tag}/{i}?v=1", "media_type": "application/pdf", "embedding": _vector(rng),
         "created_at": f"2025-06-0{1 + i}T08:00:00.{i:03d}Z", **({"group": f"doc/{tag}"} if i >= 4 else {})}
        for i in range(6)]}))["ids"]
    await call("memory/remember", {"records": [
        {"content": f"fact {i} about {tag}", "tier": "semantic", "metadata": _metadata(rng, 400 + i),
         "embedding": _vector(rng), **({"key": f"facts/{tag}/{i}"} if i % 2 else {})} for i in range(3)]})
    await call("memory/remember", {"records": [
        {"content": f"fact 1 about {tag}, corrected", "key": f"facts/{tag}/1", "embedding": _vector(rng)}]})
    # Recalled three times: access counts, accessed_at, and promotion earned on consolidate.
    for _ in range(3):
        await call("memory/recall", {"query": "receipt", "tier": "episodic", "where": {"id": episodic[:2]}})
    await call("memory/recall", {"query": "receipt", "tier": "episodic", "where": {"id": episodic[2:3]}})
    await call("memory/recall", {"query": "plan", "tier": "working", "limit": 2})
    await call("memory/promote", {"ids": [episodic[3]], "tier": "semantic"})
    await call("memory/promote", {"ids": [episodic[4]], "tier": "semantic"})  # its group goes with it
    await call("memory/reinforce", {"ids": [episodic[2]], "amount": 1 / 3})
    await call("memory/consolidate", {})
    # A keyed episode, and references with no text (a record with only `uri` may carry empty content).
    await call("memory/remember", {"records": [
        {"content": f"trip {tag}", "key": f"trips/{tag}", "tier": "episodic", "session": f"chat-{tag}"},
        {"content": "", "uri": f"file:///scans/{tag}.png", "media_type": "image/png", "tier": "semantic"},
        {"content": "", "uri": f"https://example.org/{tag}", "tier": "episodic", "group": f"links/{tag}"}]})


async def _snapshot(url: str) -> dict[str, dict[str, Any]]:
    """Every record of every owner, as each tier serves it through the router, with its vector."""
    out: dict[str, dict[str, Any]] = {}
    async with HTTPClient(url, timeout=60) as client:
        for owner in OWNERS:
            for tier in NAMES:
                params: dict[str, Any] = {"tier": tier, "limit": 0, "embeddings": True}
                if owner is not None:
                    params["owner"] = owner
                result = await client.call("memory/timeline", params)
                assert not result.get("degraded")
                for record in result["records"]:
                    assert record["tier"] == tier and record["id"] not in out
                    out[record["id"]] = record
    return out


async def _fetched(url: str, keyed: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    async with HTTPClient(url, timeout=60) as client:
        return [(await client.call("memory/fetch", {"key": r["key"], "embeddings": True,
                                                    **({"owner": r["owner"]} if r["owner"] else {})}))["record"]
                for r in keyed]


def _canon(record: dict[str, Any], embedding: bool) -> bytes:
    """Byte-exact form: 1 and 1.0, 0.0 and -0.0, key order of nothing but types and values."""
    fields = FIELDS + (("embedding",) if embedding else ())
    return orjson.dumps({k: record.get(k) for k in fields}, option=orjson.OPT_SORT_KEYS)


def _assert_same(want: dict[str, dict[str, Any]], got: dict[str, dict[str, Any]], embedding: bool) -> None:
    assert sorted(got) == sorted(want), (f"missing {sorted(set(want) - set(got))}, "
                                         f"extra {sorted(set(got) - set(want))}")
    wrong = [(want[i], got[i]) for i in want if _canon(want[i], embedding) != _canon(got[i], embedding)]
    if wrong:
        w, g = wrong[0]
        diff = {k: (w.get(k), g.get(k)) for k in FIELDS + ("embedding",) if _canon({k: w.get(k)}, True)
                != _canon({k: g.get(k)}, True)}
        raise AssertionError(f"{len(wrong)} of {len(want)} records differ; {w['id']} ({w['tier']}): {diff}")


def _dir(path: Path) -> Path:
    path.mkdir()
    return path


def _cli(*args: str) -> None:
    done = subprocess.run(a2m_command(*args), cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


@pytest.mark.anyio
async def test_a_federation_restores_exactly_into_an_empty_one(tmp_path: Path) -> None:
    rng = random.Random(20260728)
    full, plain = tmp_path / "full.jsonl", tmp_path / "plain.jsonl"
    owned = [a for o in OWNERS if o for a in ("--owner", o)]
    with federation(_dir(tmp_path / "source"), TIERS, mode="real", top=TOP) as source:
        async with HTTPClient(source.url, timeout=60) as client:
            for owner in OWNERS:
                await _fill(client, owner, rng, scale(40, 10))
        before = await _snapshot(source.url)
        _cli("export", source.url, str(full), "--embeddings", "--unowned", *owned)
        _cli("export", source.url, str(plain), "--unowned", *owned)
        # Small pages through the router: the same file, byte for byte.
        paged = tmp_path / "paged.jsonl"
        assert await transfer.export(source.url, str(paged), embeddings=True, owners=OWNERS, quiet=True, page=4) == 0
        assert paged.read_bytes() == full.read_bytes()
    # The fill reached what it claims to: every tier of every owner, and each kind of history.
    by = lambda pred: [r for r in before.values() if pred(r)]  # noqa: E731
    for owner in OWNERS:
        mine = lambda pred: by(lambda r: r["owner"] == owner and pred(r))  # noqa: E731
        assert {r["tier"] for r in mine(lambda r: True)} == set(NAMES), owner
        assert mine(lambda r: r["tier"] == "episodic" and r["session"] == f"chat-{owner or 'anon'}"), "spilled"
        assert mine(lambda r: r["revision"] == 3 and r["tier"] == "working"), "key replaced"
        assert mine(lambda r: r["revision"] == 3 and r["tier"] == "procedural"), "key replaced"
        assert mine(lambda r: r["revision"] == 2 and r["tier"] == "semantic"), "key replaced"
        assert len(mine(lambda r: r["access_count"] == 3 and r["tier"] == "semantic")) == 2, "promoted by recalls"
        assert len(mine(lambda r: r["group"] and r["group"].startswith("doc/") and r["tier"] == "semantic")) == 2
        assert mine(lambda r: r["access_count"] == 1 and r["accessed_at"] and r["salience"] != 0.5), "reinforced"
        assert mine(lambda r: r["access_count"] and r["tier"] == "working"), "recalled in working"
        assert mine(lambda r: r["embedding"] and r["tier"] == "episodic"), "vectors"
        assert mine(lambda r: r["uri"] and not r["content"] and r["tier"] == "semantic"), "a bare reference"
    keyed = sorted(by(lambda r: r["key"]), key=lambda r: r["id"])
    lines = [orjson.loads(line) for line in full.read_bytes().splitlines()]
    assert len(lines) == len(before) == len(plain.read_bytes().splitlines())

    with federation(_dir(tmp_path / "target"), TIERS, mode="real", top=TOP) as target:
        _cli("import", target.url, str(full))
        after = await _snapshot(target.url)
        _assert_same(before, after, embedding=True)
        assert [r and _canon(r, True) for r in await _fetched(target.url, keyed)] == [_canon(r, True) for r in keyed]
        # The same order too, ties within a millisecond included: exported again, the same file.
        again = tmp_path / "again.jsonl"
        assert await transfer.export(target.url, str(again), embeddings=True, owners=OWNERS, quiet=True) == 0
        assert again.read_bytes() == full.read_bytes()
        # The same file again: nothing new, nothing replaced, no revision bumped.
        _cli("import", target.url, str(full), "--batch", "7")
        _assert_same(before, await _snapshot(target.url), embedding=True)

    with federation(_dir(tmp_path / "plain"), TIERS, mode="real", top=TOP) as target:
        _cli("import", target.url, str(plain), "--batch", "5")
        after = await _snapshot(target.url)
        _assert_same(before, after, embedding=False)
        assert not [r for r in after.values() if r.get("embedding")]  # no embedder here: no vectors made up


@pytest.mark.anyio
async def test_a_mounted_read_only_tier_is_left_out_so_the_backup_restores(tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """A read-only tier (a mounted corpus) takes no writes: were its records in the file, the import
    of a backup into a federation mounting the same corpus would be refused, and nothing restored.
    It is restored by mounting it again, so export leaves it out, and says so."""
    tiers = [{"name": "working", "kind": "working"}, {"name": "kb", "kind": "semantic", "read_only": True}]
    with federation(_dir(tmp_path / "a"), tiers) as source, federation(_dir(tmp_path / "b"), tiers) as target:
        for stack in (source, target):  # the same corpus behind both routers (seeded behind their backs)
            await tier_call(stack, "kb", "memory/remember", {"records": [
                {"id": "hb-1", "content": "the handbook", "created_at": "2025-01-01T00:00:00.000Z"}]})
        async with HTTPClient(source.url) as client:
            await client.call("memory/remember", {"records": [{"content": "my note", "metadata": {"n": 2**60}}]})
            want = (await client.call("memory/timeline", {"limit": 0}))["records"]
        dump = tmp_path / "backup.jsonl"
        assert await transfer.export(source.url, str(dump), quiet=True) == 0
        assert [r["tier"] for r in map(orjson.loads, dump.read_bytes().splitlines())] == ["working"]
        assert "kb is read-only" in capsys.readouterr().err
        assert await transfer.import_(target.url, str(dump), quiet=True) == 0
        async with HTTPClient(target.url) as client:
            assert (await client.call("memory/timeline", {"limit": 0}))["records"] == want


@pytest.mark.anyio
async def test_a_record_caught_mid_move_is_restored_once(tmp_path: Path) -> None:
    """A move is write, verify, delete: a backup of a live federation (or of one whose interrupted
    move a consolidate has not repaired yet) may hold a record in two tiers. Such a file imports: the
    first copy is written, the second is an existing id (the protocol's idempotent write)."""
    tiers = [{"name": "working", "kind": "working"}, {"name": "episodic", "kind": "episodic"}]
    copies = [{"id": "plain-1", "content": "caught mid-move", "created_at": "2025-01-01T00:00:00.000Z"},
              {"id": "keyed-1", "content": "my city", "key": "user/city", "revision": 2},
              {"id": "grouped-1", "content": "a tool call", "group": "call-1", "metadata": {"n": -0.0}},
              {"id": "grouped-2", "content": "its result", "group": "call-1"}]
    with federation(_dir(tmp_path / "a"), tiers) as source, federation(_dir(tmp_path / "b"), tiers) as target:
        for tier in ("working", "episodic"):
            await tier_call(source, tier, "memory/remember", {"records": copies, "owner": "alice"})
        dump = tmp_path / "backup.jsonl"
        assert await transfer.export(source.url, str(dump), owners=["alice"], quiet=True) == 0
        assert len(dump.read_bytes().splitlines()) == 8
        for batch in (500, 1):
            assert await transfer.import_(target.url, str(dump), batch=batch, quiet=True) == 0
            async with HTTPClient(target.url) as client:
                held = (await client.call("memory/timeline", {"owner": "alice", "limit": 0}))["records"]
            assert sorted((r["id"], r["tier"]) for r in held) == sorted((c["id"], "working") for c in copies)
