"""`a2m export` / `a2m import` round-trip records exactly between real servers over HTTP."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path
from typing import Any, Iterator

import orjson
import pytest

from a2m.client import HTTPClient
from a2mctl import transfer
from tests.conftest import scale
from tests.support.procs import ROOT, a2m_command, fixture_server_command, free_port, http_server


@pytest.fixture
def two_fixture_servers() -> Iterator[tuple[str, str]]:
    a, b = free_port(), free_port()
    with http_server(fixture_server_command("--port", str(a)), a) as one, \
            http_server(fixture_server_command("--port", str(b)), b) as two:
        yield one, two


def _record(i: int) -> dict[str, object]:
    # 7 records per millisecond, so paging must cross shared timestamps correctly.
    second, ms = divmod(i // 7, 1000)
    record: dict[str, object] = {
        "id": f"r{i:06d}", "content": f"record {i} about topic {i % 17}",
        "created_at": f"2026-01-01T{second // 3600:02d}:{second // 60 % 60:02d}:{second % 60:02d}.{ms:03d}Z",
        "metadata": {"i": i, "tags": ["a", str(i % 3)], "nested": {"x": i / 3}},
        "session": f"s{i % 5}", "role": "user" if i % 2 else "assistant",
        "access_count": i % 4, "revision": 1 + i % 3, "salience": round((i % 10) / 10, 1),
    }
    if i % 10 == 0:
        record["key"] = f"app/k{i}"
    if i % 13 == 0:
        record["accessed_at"] = "2026-02-01T00:00:00.000Z"
    if i % 29 == 0:
        record["group"] = f"g{i // 29 % 50}"
    if i % 31 == 0:
        record["uri"], record["media_type"] = f"s3://bucket/{i}", "text/plain"
    if i % 3 == 0:
        record["embedding"] = [float(i % 7), 1.0, -0.5]
    return record


async def _fill(url: str, records: list[dict[str, object]], owner: str | None = None) -> None:
    async with HTTPClient(url) as client:
        for start in range(0, len(records), 500):
            params: dict[str, object] = {"records": records[start:start + 500]}
            if owner is not None:
                params["owner"] = owner
            await client.call("memory/remember", params)


def _lines(path: Path) -> list[dict[str, object]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


@pytest.mark.slow
@pytest.mark.anyio
async def test_round_trip_is_exact(two_fixture_servers: tuple[str, str], tmp_path: Path) -> None:
    source, target = two_fixture_servers
    n = scale(10_000, 3_000)
    originals = [_record(i) for i in range(n)]
    await _fill(source, originals)
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    assert await transfer.export(source, str(first), embeddings=True, quiet=True) == 0
    exported = _lines(first)
    assert [r["id"] for r in exported] == [r["id"] for r in originals]  # creation order, ties kept
    for want, got in zip(originals, exported):
        for name, value in want.items():
            assert got[name] == value, (want["id"], name)
    assert await transfer.import_(target, str(first), quiet=True) == 0
    assert await transfer.export(target, str(second), embeddings=True, quiet=True) == 0
    assert first.read_bytes() == second.read_bytes()


@pytest.mark.anyio
async def test_owners_and_a_crowded_millisecond(two_fixture_servers: tuple[str, str], tmp_path: Path) -> None:
    """More records in one millisecond than one page holds; two owners exported and restored apart."""
    source, target = two_fixture_servers
    crowded = [{"id": f"c{i:04d}", "content": f"same ms {i}", "created_at": "2026-03-01T00:00:00.000Z"}
               for i in range(250)]
    before = [{"id": f"b{i}", "content": f"before {i}", "created_at": "2026-02-28T23:59:59.999Z"} for i in range(5)]
    await _fill(source, before + crowded)
    await _fill(source, [{"id": "alice-1", "content": "alice's note"}], owner="alice")
    out = tmp_path / "all.jsonl"
    assert await transfer.export(source, str(out), owners=[None, "alice"], quiet=True, page=100) == 0
    ids = [r["id"] for r in _lines(out)]
    assert ids == [r["id"] for r in before + crowded] + ["alice-1"]
    assert await transfer.import_(target, str(out), batch=400, quiet=True) == 0
    async with HTTPClient(target) as client:
        alice = await client.call("memory/timeline", {"owner": "alice"})
        assert [(r["id"], r["owner"]) for r in alice["records"]] == [("alice-1", "alice")]
        assert (await client.call("memory/describe", {}))["tiers"][0]["count"] == 255


@pytest.mark.anyio
async def test_a_millisecond_beyond_the_recall_cap_fails_loudly(two_fixture_servers: tuple[str, str],
                                                               tmp_path: Path) -> None:
    """On a server without the cursor extension (the fixture) a walk by time cannot cross it."""
    source, _ = two_fixture_servers
    await _fill(source, [{"content": f"x {i}", "created_at": "2026-03-01T00:00:00.000Z"} for i in range(1001)])
    out = tmp_path / "x.jsonl"
    assert await transfer.export(source, str(out), quiet=True) == 1
    assert not out.exists()  # no half export under the real name


@pytest.mark.anyio
async def test_cli_through_the_working_tier(tmp_path: Path) -> None:
    """The real Redis-backed tier as both ends; the export through the `a2m` command line to stdout."""
    port_a, port_b = free_port(), free_port()
    records = [_record(i) for i in range(300)]
    for r in records:
        r.pop("embedding", None)
        r.pop("uri", None)
    with http_server(a2m_command("serve", "working", "--port", str(port_a), "--data", str(tmp_path / "a")), port_a) as a, \
            http_server(a2m_command("serve", "working", "--port", str(port_b), "--data", str(tmp_path / "b")), port_b) as b:
        await _fill(a, records)
        dump = subprocess.run(a2m_command("export", a, "-"), cwd=ROOT, capture_output=True, check=True).stdout
        assert len(dump.splitlines()) == 300
        (tmp_path / "dump.jsonl").write_bytes(dump)
        assert await transfer.import_(b, str(tmp_path / "dump.jsonl"), quiet=True) == 0
        assert await transfer.export(b, str(tmp_path / "again.jsonl"), quiet=True) == 0
        assert (tmp_path / "again.jsonl").read_bytes() == dump
        mine = {r["id"]: r for r in map(orjson.loads, dump.splitlines())}
        for want in records:
            got = mine[want["id"]]
            assert {k: got[k] for k in want} == want


@pytest.mark.anyio
async def test_a_millisecond_beyond_the_recall_cap_is_exported_by_cursor(tmp_path: Path) -> None:
    """1,500 records of one millisecond on the real working tier (one timeline holds 1,000): the
    export pages by the tier's cursor, keeps their order, and the restore exports byte-identical."""
    port_a, port_b = free_port(), free_port()
    records = [{"id": f"c{i:04d}", "content": f"same ms {i}", "created_at": "2026-03-01T00:00:00.000Z"}
               for i in range(1500)]
    with http_server(a2m_command("serve", "working", "--port", str(port_a), "--data", str(tmp_path / "a")), port_a) as a, \
            http_server(a2m_command("serve", "working", "--port", str(port_b), "--data", str(tmp_path / "b")), port_b) as b:
        await _fill(a, records)
        first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
        assert await transfer.export(a, str(first), quiet=True) == 0
        assert [r["id"] for r in _lines(first)] == [r["id"] for r in records]
        assert await transfer.import_(b, str(first), quiet=True) == 0
        assert await transfer.export(b, str(second), quiet=True) == 0
        assert first.read_bytes() == second.read_bytes()


@pytest.mark.anyio
async def test_export_through_a_router_pages_each_tier_by_its_cursor(tmp_path: Path) -> None:
    """Through a router export reads each tier alone (`tier`), which the router passes the tier's
    cursor for: 1,100 records of one millisecond in each of two real tiers all come out, in order."""
    from tests.router.stack import federation

    stamp = "2026-03-01T00:00:00.000Z"
    with federation(tmp_path, [{"name": "working", "kind": "working"}, {"name": "episodic", "kind": "episodic"}],
                    mode="real") as stack:
        want = {}
        for tier in ("working", "episodic"):
            async with HTTPClient(stack.tiers[tier].url) as client:
                want[tier] = [i for start in (0, 550) for i in (await client.call("memory/remember", {
                    "records": [{"content": f"{tier} {i}", "created_at": stamp} for i in range(start, start + 550)]
                }))["ids"]]
        out = tmp_path / "x.jsonl"
        assert await transfer.export(stack.url, str(out), quiet=True) == 0
    lines = _lines(out)
    assert {t: [r["id"] for r in lines if r["tier"] == t] for t in want} == want


def test_bad_lines_are_refused(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"content": "ok"}\nnot json\n')
    with pytest.raises(transfer.TransferError, match="bad.jsonl:2"):
        list(transfer._read_lines(str(bad)))


@pytest.mark.anyio
async def test_a_refused_batch_is_reported_at_its_file_line(two_fixture_servers: tuple[str, str], tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    dump = tmp_path / "dump.jsonl"
    lines = [{"content": f"line {n}"} for n in range(1, 6)]
    # Line 4, the second record of the second batch: over the server's max_content_length, a limit
    # only the server knows (a record no server stores at all is refused before the first write).
    lines[3]["content"] = "x" * 1_000_001
    dump.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in lines))
    assert await transfer.import_(two_fixture_servers[0], str(dump), batch=2, quiet=True) == 1
    message = capsys.readouterr().err
    assert f"{dump}:4: content exceeds max_content_length" in message and "lines 3-4" in message, message
    assert "lines 1-2 (2 records) were written, line 3 and after were not" in message
    async with HTTPClient(two_fixture_servers[0]) as client:
        assert [r["content"] for r in (await client.call("memory/timeline", {}))["records"]] == ["line 1", "line 2"]


@pytest.mark.anyio
async def test_export_through_a_router_waits_for_a_tier_down_then_fails(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    from tests.router.stack import federation

    tiers = [{"name": "working", "kind": "working"}, {"name": "semantic", "kind": "semantic", "timeout": 1.0}]
    with federation(tmp_path, tiers) as stack:
        await _fill(stack.url, [{"content": "kept in working"}, {"content": "a fact", "tier": "semantic"}])
        assert await transfer.export(stack.url, str(tmp_path / "all.jsonl"), quiet=True) == 0
        assert len(_lines(tmp_path / "all.jsonl")) == 2
        stack.tiers["semantic"].pause()  # back 3 s later: the export waits for it
        asyncio.get_running_loop().call_later(3.0, stack.tiers["semantic"].resume)
        assert await transfer.export(stack.url, str(tmp_path / "waited.jsonl"), quiet=True, tier_wait=20) == 0
        assert _lines(tmp_path / "waited.jsonl") == _lines(tmp_path / "all.jsonl")
        assert "semantic did not answer a timeline page; asking again" in caplog.text
        stack.tiers["semantic"].kill()
        assert await transfer.export(stack.url, str(tmp_path / "partial.jsonl"), quiet=True, tier_wait=1) == 1
    assert "tier semantic did not answer a timeline page for 1 s; export again" in capsys.readouterr().err
    assert not (tmp_path / "partial.jsonl").exists()


RESTARTING = [{"name": "working", "kind": "working"}, {"name": "semantic", "kind": "semantic", "timeout": 2.0}]


async def import_across_a_restart(stack: Any, dump: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Import `dump` (batches of 4) while the semantic tier is down, back 3 s later on its data."""
    stack.tiers["semantic"].kill()
    asyncio.get_running_loop().call_later(3.0, stack.tiers["semantic"].start)
    assert await transfer.import_(stack.url, str(dump), batch=4, quiet=True, tier_wait=30) == 0
    assert "tier semantic is unavailable; sending lines 1-4 again in 1 s" in capsys.readouterr().err


@pytest.mark.anyio
async def test_import_through_a_router_waits_for_a_tier_down_then_fails(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A tier restarting stopped an import at its first batch; a rerun read the file from line 1 again."""
    from tests.router.stack import federation

    dump = tmp_path / "dump.jsonl"
    lines = [{"id": f"w{n}", "content": f"turn {n}", "tier": "working"} for n in range(3)] + \
            [{"id": f"s{n}", "content": f"fact {n}", "tier": "semantic"} for n in range(3)]
    dump.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in lines))
    with federation(tmp_path, RESTARTING, mode="real") as stack:
        await import_across_a_restart(stack, dump, capsys)
        async with HTTPClient(stack.url) as client:
            held = (await client.call("memory/timeline", {"limit": 10}))["records"]
        assert sorted((r["id"], r["tier"]) for r in held) == sorted((r["id"], r["tier"]) for r in lines)
        stack.tiers["semantic"].kill()  # for good: the import says so once its wait is spent
        more = tmp_path / "more.jsonl"
        more.write_bytes(orjson.dumps({"id": "s9", "content": "another fact", "tier": "semantic"}) + b"\n")
        assert await transfer.import_(stack.url, str(more), quiet=True, tier_wait=1) == 1
    assert "tier semantic did not come back within 1 s; import again when it is back" in capsys.readouterr().err


@pytest.mark.anyio
async def test_an_import_of_records_without_ids_waits_for_a_tier_down_and_writes_each_once(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A batch holding a record without an id was not sent again after a tier came back (it could
    have been written twice), so a tier restarting stopped the import; each such record is now given
    an id from the file and its line before its first send, and a second import of the same file
    skips what the first wrote."""
    from tests.router.stack import federation

    dump = tmp_path / "notes.jsonl"
    lines = [{"content": f"turn {n}", "tier": "working"} for n in range(3)] + \
            [{"content": f"fact {n}", "tier": "semantic"} for n in range(3)] + \
            [{"content": "turn 0", "tier": "working"}]
    dump.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in lines))
    with federation(tmp_path, RESTARTING, mode="real") as stack:
        await import_across_a_restart(stack, dump, capsys)
        assert await transfer.import_(stack.url, str(dump), batch=4, quiet=True, tier_wait=30) == 0
        async with HTTPClient(stack.url) as client:
            held = (await client.call("memory/timeline", {"limit": 20}))["records"]
    # each line once (the repeated "turn 0" on line 7 is a record of its own, as the file says)
    assert sorted((r["content"], r["tier"]) for r in held) == sorted((r["content"], r["tier"]) for r in lines)


@pytest.mark.anyio
async def test_an_import_stops_at_once_when_a_tier_answers_the_router_malformed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A tier that answers memory/remember with something that is not an A2M reply is up, not down:
    the router's -32603 names it like a down tier, and the import waited out --wait-for-tiers for it
    before saying it 'did not come back'. It stops at once, with the router's words."""
    import time

    from tests.router.stack import Proc, write_config
    from tests.support.procs import PYTHON
    from tests.support.scripted import ScriptedTier, with_result

    tier = await ScriptedTier("semantic", "semantic").start()
    tier.twist = lambda m, params, response: (with_result(response, {"ids": "all of them"})
                                              if m == "memory/remember" else None)
    config = write_config(tmp_path / "router.toml", [{"name": "semantic", "kind": "semantic", "url": tier.url}])
    router = Proc("router", [PYTHON, "-m", "a2mctl.cli", "serve", "router", "--config", str(config),
                             "--port", str(port := free_port())], port, log=tmp_path / "router.log")
    dump = tmp_path / "facts.jsonl"
    dump.write_bytes(b"".join(orjson.dumps({"id": f"f{n}", "content": f"fact {n}"}) + b"\n" for n in range(3)))
    try:
        router.start()
        await asyncio.to_thread(router.wait)  # the tier answers from this loop, so it must keep running
        started = time.monotonic()
        assert await transfer.import_(router.url, str(dump), quiet=True, tier_wait=8) == 1
        assert time.monotonic() - started < 5  # not the 8 s a down tier is waited for
    finally:
        await asyncio.to_thread(router.stop)
        await tier.stop()
    err = capsys.readouterr().err
    assert "facts.jsonl:1-3: tier semantic answered the router's memory/remember with a malformed reply" in err, err
    assert "did not come back" not in err and "again in" not in err, err


@pytest.mark.anyio
async def test_export_and_import_through_a_stdio_server(tmp_path: Path) -> None:
    """A command line is an endpoint too: the server runs as a child speaking A2M on stdio (here the
    Redis-backed working tier, whose data outlives each run of the command)."""
    records = [_record(i) for i in range(60)]
    for r in records:
        r.pop("embedding", None)
        r.pop("uri", None)
    command = " ".join(a2m_command("serve", "working", "--stdio", "--data", str(tmp_path / "data")))
    dump, again = tmp_path / "dump.jsonl", tmp_path / "again.jsonl"
    dump.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    assert await transfer.import_(command, str(dump), batch=16, quiet=True) == 0
    assert await transfer.export(command, str(again), quiet=True) == 0
    got = {r["id"]: r for r in _lines(again)}
    assert len(got) == len(records)
    for want in records:
        assert {k: got[want["id"]][k] for k in want} == want


def test_unusable_endpoints_and_files_are_named_not_raised(tmp_path: Path) -> None:
    good = tmp_path / "good.jsonl"
    good.write_bytes(b'{"content": "x"}\n')
    cases = [
        (["import", "http://127.0.0.1:1/", str(tmp_path / "missing.jsonl")], "missing.jsonl: No such file"),
        (["import", "http://127.0.0.1:1/", str(tmp_path)], "Is a directory"),
        (["export", "ftp://example", str(tmp_path / "x.jsonl")], "is served over http:// or https://"),
        (["export", "http://127.0.0.1:99999/", str(tmp_path / "x.jsonl")], "Port out of range"),
        (["import", "http://[::1", str(good)], "Invalid IPv6 URL"),
        (["export", "no-such-a2m-command --stdio", str(tmp_path / "x.jsonl")], "no-such-a2m-command"),
        # http:// left out: run as a command, it said "127.0.0.1:8700: No such file or directory"
        (["export", "127.0.0.1:8700", str(tmp_path / "x.jsonl")],
         "127.0.0.1:8700 is a host and port, not a URL: write http://127.0.0.1:8700/"),
        (["import", "localhost:8700/", str(good)], "write http://localhost:8700/"),
        (["export", "memory.internal.example:8700", str(tmp_path / "x.jsonl")],
         "write http://memory.internal.example:8700/"),
        # compose's service name for the router (deploy/README.md): a host with no dot
        (["export", "router:8700", str(tmp_path / "x.jsonl")], "write http://router:8700/"),
        (["import", " ".join(fixture_server_command("--stdio")), str(good), "--token", "t"], "--token: a bearer token is for an http(s):// server"),
    ]
    for argv, message in cases:
        done = subprocess.run(a2m_command(*argv), cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert done.returncode == 1 and message in done.stderr and "Traceback" not in done.stderr, (argv, done.stderr)
    assert not (tmp_path / "x.jsonl").exists()


@pytest.mark.anyio
async def test_an_export_to_a_missing_directory_says_so(two_fixture_servers: tuple[str, str], tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    assert await transfer.export(two_fixture_servers[0], str(tmp_path / "no" / "x.jsonl"), quiet=True) == 1
    assert f"cannot write {tmp_path / 'no' / 'x.jsonl'}: No such file or directory" in capsys.readouterr().err


@pytest.mark.anyio
async def test_a_principals_token_exports_its_records_once(tmp_path: Path) -> None:
    """With a principal's bearer token the router answers every call for that principal, so the
    unowned pass of `--unowned --owner alice` and the `alice` pass read the same records: each is
    written once, and the file says nothing of an unowned partition it could not read."""
    from tests.router.stack import federation

    tiers = [{"name": "working", "kind": "working"}, {"name": "procedural", "kind": "procedural"}]
    with federation(tmp_path, tiers, mode="real", top={"auth": {"tokens": {"tok-alice": "alice"}}}) as stack:
        async with HTTPClient(stack.url, token="tok-alice") as client:
            await client.call("memory/remember", {"records": [
                {"content": "alice's note"}, {"content": "alice's skill", "key": "skills/x", "tier": "procedural"}]})
        dump = tmp_path / "alice.jsonl"
        done = subprocess.run(a2m_command("export", stack.url, str(dump), "--token", "tok-alice", "--unowned",
                                          "--owner", "alice", "--owner", "alice"),
                              cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        records = _lines(dump)
        assert sorted(r["content"] for r in records) == ["alice's note", "alice's skill"]
        assert {r["owner"] for r in records} == {"alice"}
        assert "exported 2 records" in done.stderr
        assert "unowned partition cannot be read with this token" in done.stderr
        again = tmp_path / "again.jsonl"
        assert await transfer.export(stack.url, str(again), token="tok-alice", owners=["alice", None], quiet=True) == 0
        assert sorted(r["id"] for r in _lines(again)) == sorted(r["id"] for r in records)
