"""`a2m import` of a file whose owners alternate: a batch holds one owner, so such a file went one
record per call (75-83 records/s through a router, decision 161). The import now groups a bounded
window by owner (`_Window`); these tests hold what it must keep: each owner's records land in file
order, every record once, and what a stopped import says was written is what was written."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from a2m.client import HTTPClient
from a2mctl import transfer
from tests.ops.test_transfer_errors import _cli, _write

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The size of each memory/remember batch an in-process import sends (the real call is made)."""
    sizes: list[int] = []
    real = transfer._remember

    async def counted(client: Any, params: dict[str, Any], *args: Any) -> list[str]:
        sizes.append(len(params["records"]))
        return await real(client, params, *args)

    monkeypatch.setattr(transfer, "_remember", counted)
    return sizes


async def _contents(url: str, owner: str) -> list[str]:
    async with HTTPClient(url) as client:
        found = await client.call("memory/timeline", {"limit": 0, "owner": owner})
    return [r["content"] for r in found["records"]]


def _alternating(n: int, ids: bool = True, owners: tuple[str, str] = ("alice", "bob")) -> list[dict[str, Any]]:
    """Line i+1 is the first owner's for even i, the second's for odd; each owner's first 20 records
    write keys k0-k4 four times over (a key's last write is that owner's record 15-19), the rest have
    no key."""
    records = []
    for i in range(n):
        owner, j = owners[i % 2], i // 2
        record: dict[str, Any] = {"content": f"{owner} {j}", "owner": owner}
        if ids:
            record["id"] = f"{owner}-{j}"
        if j < 20:
            record["key"] = f"k{j % 5}"
        records.append(record)
    return records


@pytest.mark.anyio
async def test_alternating_owners_go_in_full_batches_each_owner_in_file_order(
        working: str, tmp_path: Path, calls: list[int]) -> None:
    """60 alternating lines with --batch 10 went in 60 calls; grouped, about 6. A key an owner writes
    four times keeps the file's last write; every record lands once."""
    for ids, owners in ((True, ("alice", "bob")), (False, ("carol", "dave"))):
        dump = _write(tmp_path / f"alternating-{ids}.jsonl", _alternating(60, ids=ids, owners=owners))
        calls.clear()
        assert await transfer.import_(working, str(dump), batch=10, quiet=True) == 0
        assert sum(calls) == 60 and len(calls) <= 8, calls
        for owner in owners:
            got = await _contents(working, owner)
            # keys k0-k4 were last written by records 15-19; 20-29 have none
            assert Counter(got) == Counter(f"{owner} {j}" for j in range(15, 30)), (ids, owner, got)
            async with HTTPClient(working) as client:
                for k in range(5):
                    fetched = await client.call("memory/fetch", {"key": f"k{k}", "owner": owner})
                    assert fetched["record"]["content"] == f"{owner} {15 + k}", fetched


@pytest.mark.anyio
async def test_a_refusal_midway_names_its_line_and_what_was_written_is_true(
        working: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], calls: list[int]) -> None:
    """Bob's line 14 is over the server's max_content_length. With --batch 3, alice's batches run
    ahead of bob's: the message names line 14, bob's batch by its owner, the written prefix and
    alice's records written past it; the target holds exactly those, and the fixed file finishes it."""
    records = _alternating(30)
    for record in records:
        record.pop("key")
    records[13]["content"] = "x" * 1_000_001  # line 14, bob 6
    dump = _write(tmp_path / "dump.jsonl", records)
    assert await transfer.import_(working, str(dump), batch=3, quiet=True) == 1
    err = capsys.readouterr().err
    assert f"{dump}:14: content exceeds" in err, err
    assert "its batch (the 3 records of 'bob' among lines 14-18) was not written" in err, err
    # alice's batch of lines 13-17 was answered before bob's of 14-18 was refused
    assert ("lines 1-13 (13 records) were written; so were the 2 records of 'alice' among lines 15-17; "
            "no other record from line 14 on was; importing the file again skips them (by id)") in err, err
    assert Counter(await _contents(working, "alice")) == Counter(f"alice {j}" for j in range(9))
    assert Counter(await _contents(working, "bob")) == Counter(f"bob {j}" for j in range(6))

    records[13]["content"] = "bob 6"
    fixed = _write(tmp_path / "fixed.jsonl", records)
    calls.clear()
    assert await transfer.import_(working, str(fixed), batch=3, quiet=True) == 0
    assert sum(calls) == 30 and len(calls) <= 12, calls  # ~10 batches, not 30
    for owner in ("alice", "bob"):
        assert Counter(await _contents(working, owner)) == Counter(f"{owner} {j}" for j in range(15)), owner


@pytest.mark.anyio
async def test_a_stream_without_ids_resumes_from_the_line_it_names(working: str, tmp_path: Path) -> None:
    """From standard input a record without an id gets a fresh one, so a rerun from a line writes
    everything from that line again: such a record is sent only once every line before it is, and
    the line the message says to resume from leaves nothing written twice or missing. Alice's
    records carry ids (grouped ahead of bob's), bob's do not."""
    records = _alternating(30)
    for record in records[1::2]:
        del record["id"], record["key"]
    for record in records[0::2]:
        record.pop("key")
    records[13]["content"] = "x" * 1_000_001  # line 14, bob 6
    cut = _cli("import", working, "-", "--batch", "3", stdin=b"".join(orjson.dumps(r) + b"\n" for r in records))
    assert cut.returncode == 1 and "-:14: content exceeds" in cut.stderr, cut.stderr
    resume = int(re.search(r"import from line (\d+) on", cut.stderr).group(1))  # type: ignore[union-attr]
    records[13]["content"] = "bob 6"
    rest = _cli("import", working, "-", "--batch", "3",
                stdin=b"".join(orjson.dumps(r) + b"\n" for r in records[resume - 1:]))
    assert rest.returncode == 0, rest.stderr
    for owner in ("alice", "bob"):
        assert Counter(await _contents(working, owner)) == Counter(f"{owner} {j}" for j in range(15)), cut.stderr


@pytest.mark.anyio
async def test_a_batch_lost_in_flight_ahead_of_a_pending_line_is_said_so_and_resumes_before_that_line(
        working: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Bob's full batch of lines 4-5 is sent while alice's line 3 waits in the window; its answer is
    lost (the endpoint gone after writing it). The stop said "the batch of lines 4-5 ... may have
    been, line 6 and after were not" and, from a stream, "import from line 4 on": line 3 was never
    written, and the advice left it out for good."""
    import io
    import sys

    from a2m.client import Unavailable

    records: list[dict[str, Any]] = [
        {"content": "bob 0", "owner": "bob"}, {"content": "bob 1", "owner": "bob"},  # fresh ids
        {"id": "alice-0", "content": "alice 0", "owner": "alice"},
        *({"id": f"bob-{j}", "content": f"bob {j}", "owner": "bob"} for j in (2, 3, 4)),
    ]
    stream = b"".join(orjson.dumps(r) + b"\n" for r in records)
    real, sent = transfer._remember, []

    async def lost_second_answer(client: Any, params: dict[str, Any], *args: Any) -> list[str]:
        ids = await real(client, params, *args)  # written...
        sent.append(len(params["records"]))
        if len(sent) == 2:
            raise Unavailable("connection reset")  # ... and its answer lost
        return ids

    monkeypatch.setattr(transfer, "_remember", lost_second_answer)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stream)))
    assert await transfer.import_(working, "-", batch=2, quiet=True) == 1
    err = capsys.readouterr().err
    assert sent == [2, 2], sent
    assert "line 6 and after were not" not in err, err
    resume = int(re.search(r"import from line (\d+) on", err).group(1))  # type: ignore[union-attr]
    assert resume == 3, err

    monkeypatch.setattr(transfer, "_remember", real)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"".join(stream.splitlines(True)[resume - 1:]))))
    assert await transfer.import_(working, "-", batch=2, quiet=True) == 0
    assert Counter(await _contents(working, "alice")) == Counter(["alice 0"])
    assert Counter(await _contents(working, "bob")) == Counter(f"bob {j}" for j in range(5))
