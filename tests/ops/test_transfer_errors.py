"""`a2m export` / `a2m import` as an operator meets them when something is wrong: a bad line in a
backup, an import cut short, an endpoint that wants a token or takes no writes. Each failure says
what happened and what was written, and never leaves a half-imported file the operator cannot
finish."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import orjson
import pytest

from a2m.client import HTTPClient
from a2mctl import transfer
from tests.support.procs import ROOT, a2m_command, free_port

pytestmark = pytest.mark.timeout(180)


def _write(path: Path, records: list[Any]) -> Path:
    path.write_bytes(b"".join((r if isinstance(r, bytes) else orjson.dumps(r)) + b"\n" for r in records))
    return path


def _cli(*args: str, stdin: bytes | None = None, timeout: float = 120,
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    done = subprocess.run(a2m_command(*args), cwd=ROOT, capture_output=True, timeout=timeout, input=stdin,
                          env={**os.environ, **(env or {})})
    return subprocess.CompletedProcess(done.args, done.returncode, done.stdout.decode(), done.stderr.decode())


async def _contents(url: str, **params: Any) -> list[str]:
    async with HTTPClient(url) as client:
        return [r["content"] for r in (await client.call("memory/timeline", {"limit": 0, **params}))["records"]]


@pytest.mark.anyio
async def test_a_malformed_line_in_a_file_stops_the_import_before_anything_is_written(
        working: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A backup cut short (a disk that filled, an export piped through a command that died) ends in a
    broken line: the import reads the whole file before its first write, so it refuses it whole, at
    that line, and the target is as it was."""
    good = [{"id": f"r{i}", "content": f"record {i}", "created_at": f"2026-01-01T00:00:00.00{i}Z"} for i in range(7)]
    dump = _write(tmp_path / "dump.jsonl", [*good, b'{"id": "r7", "content": "record'])
    assert await transfer.import_(working, str(dump), batch=3, quiet=True) == 1
    err = capsys.readouterr().err
    assert f"{dump}:8: not JSON" in err and "nothing was written" in err, err
    assert await _contents(working) == []
    not_a_record = _write(tmp_path / "other.jsonl", [*good, {"text": "no content"}])
    assert await transfer.import_(working, str(not_a_record), batch=3, quiet=True) == 1
    err = capsys.readouterr().err
    assert f"{not_a_record}:8: not an A2M record" in err and "nothing was written" in err, err
    assert await _contents(working) == []


@pytest.mark.anyio
async def test_a_malformed_line_on_stdin_says_which_lines_were_written(working: str, tmp_path: Path) -> None:
    """Standard input cannot be read twice: what was written before the bad line is said by line, so
    the rest can be imported from the line after it."""
    good = [{"id": f"r{i}", "content": f"record {i}", "created_at": f"2026-01-01T00:00:00.00{i}Z"} for i in range(7)]
    dump = _write(tmp_path / "dump.jsonl", [*good, b"{oops", {"id": "r8", "content": "record 8"}])
    done = _cli("import", working, "-", "--batch", "3", stdin=dump.read_bytes())
    assert done.returncode == 1
    assert "-:8: not JSON" in done.stderr, done.stderr
    # Two batches (lines 1-6) went in; line 7 was waiting for its batch and was not written.
    assert "lines 1-6 (6 records) were written, line 7 and after were not" in done.stderr, done.stderr
    assert await _contents(working) == [f"record {i}" for i in range(6)]


@pytest.mark.anyio
async def test_a_record_no_server_stores_stops_the_import_before_its_batch(working: str, tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """A record the router and every tier refuse (a created_at that is no timestamp, a salience past 1,
    NUL in a key: the protocol's own checks) is found while the file is read: from a file nothing is
    written, from standard input not the batch that holds it. It was found only when its batch was
    refused, after every earlier batch had been written."""
    good = [{"id": f"r{i}", "content": f"record {i}", "created_at": f"2026-01-01T00:00:00.00{i}Z"} for i in range(5)]
    for field, value, said in [("created_at", "yesterday", "created_at must be an RFC 3339 timestamp"),
                               ("salience", 7, "salience must be a number in [0, 1]"),
                               ("key", "a\x00b", "key must not contain NUL")]:
        records = [dict(r) for r in good]
        records[3][field] = value
        dump = _write(tmp_path / f"{field}.jsonl", records)
        assert await transfer.import_(working, str(dump), batch=2, quiet=True) == 1
        err = capsys.readouterr().err
        assert f"{dump}:4: {said}" in err and err.rstrip().endswith("nothing was written"), err
        assert await _contents(working) == []
    # Standard input is read once: the batch of lines 3-4 is not sent, the one before it was.
    done = _cli("import", working, "-", "--batch", "2", stdin=dump.read_bytes())
    assert done.returncode == 1
    assert "-:4: key must not contain NUL" in done.stderr, done.stderr
    assert "lines 1-2 (2 records) were written, line 3 and after were not" in done.stderr, done.stderr
    assert await _contents(working) == ["record 0", "record 1"]


@pytest.mark.anyio
async def test_vectors_of_another_width_stop_the_import_before_anything_is_written(
        working: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A store holds one vector width (-32008 for any other): a backup taken with --embeddings from
    a federation with another embedder was refused at its first batch with vectors, after the
    batches before it were written, and named no line. The widths are known before the first write:
    the target's from describe, the file's as it is read."""
    records: list[Any] = [{"id": f"r{i}", "content": f"record {i}"} for i in range(6)]
    # Two widths in one file, into an empty target: the first one the file has is the one it takes.
    records[1]["embedding"], records[4]["embedding"] = [1.0, 0.0], [1.0, 0.0, 0.0]
    mixed = _write(tmp_path / "mixed.jsonl", records)
    assert await transfer.import_(working, str(mixed), batch=2, quiet=True) == 1
    err = capsys.readouterr().err
    assert f"{mixed}:5: its embedding has 3 dimensions, line 2's, the first in the file, has 2" in err, err
    assert await _contents(working) == []
    # A target holding vectors of another width than the file's.
    async with HTTPClient(working) as client:
        await client.call("memory/remember", {"records": [{"id": "v0", "content": "held", "embedding": [1.0, 0.5, 0.25]}]})
    del records[1]["embedding"]
    records[4]["embedding"] = [0.5, 0.5]
    dump = _write(tmp_path / "other.jsonl", records)
    assert await transfer.import_(working, str(dump), batch=2, quiet=True) == 1
    err = capsys.readouterr().err
    assert f"{dump}:5: its embedding has 2 dimensions, {working} holds vectors of 3" in err, err
    assert "del(.embedding)" in err and err.rstrip().endswith("nothing was written"), err
    assert await _contents(working) == ["held"]


@pytest.mark.anyio
async def test_a_refused_width_is_said_at_the_line_of_the_vector(working: str) -> None:
    """-32008 names widths, not a record: the refusal is pointed at the first record of the batch
    whose vector has another width (when the target learnt its width only after describe)."""
    from a2m.errors import A2MError

    batch = [{"content": "a", "embedding": [1.0, 0.0, 0.0]}, {"content": "b"}, {"content": "c", "embedding": [1.0, 0.0]}]
    async with HTTPClient(working) as client:
        await client.call("memory/remember", {"records": [{"content": "held", "embedding": [1.0, 0.5, 0.25]}]})
        with pytest.raises(A2MError) as refused:
            await client.call("memory/remember", {"records": batch})
    said = transfer._refused("dump.jsonl", [7, 8, 9], batch, refused.value)
    assert said.startswith("dump.jsonl:9: its embedding has 2 dimensions, embeddings here have 3 dimensions"), said
    assert said.endswith("its batch (lines 7-9) was not written"), said


@pytest.mark.anyio
async def test_an_import_refused_midway_says_how_to_finish_it(working: str, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """Records with ids are skipped by a second import (an existing id is an idempotent write); so are
    a file's records without one (given ids from the file and line); records without one read from a
    stream would be written twice, so the message says where to resume instead of promising that."""
    with_ids = [{"id": f"r{i}", "content": f"record {i}"} for i in range(5)]
    with_ids[3]["content"] = "x" * 1_000_001  # over max_content_length: only the server knows its limit
    dump = _write(tmp_path / "ids.jsonl", with_ids)
    assert await transfer.import_(working, str(dump), batch=2, quiet=True) == 1
    err = capsys.readouterr().err
    assert f"{dump}:4: content exceeds" in err and "lines 1-2 (2 records) were written" in err, err
    assert "importing the file again skips them" in err, err

    no_ids = [{"content": f"plain {i}"} for i in range(5)]
    no_ids[3]["content"] = "x" * 1_000_001
    plain = _write(tmp_path / "plain.jsonl", no_ids)
    assert await transfer.import_(working, str(plain), batch=2, quiet=True) == 1
    err = capsys.readouterr().err
    assert "lines 1-2 (2 records) were written" in err and "importing the file again skips them" in err, err
    assert await transfer.import_(working, str(plain), batch=2, quiet=True) == 1  # the same file again
    assert await _contents(working) == ["record 0", "record 1", "plain 0", "plain 1"]  # nothing twice

    cut = _cli("import", working, "-", "--batch", "2", stdin=plain.read_bytes())
    assert cut.returncode == 1 and "lines 1-2 (2 records) were written" in cut.stderr, cut.stderr
    assert "skips them" not in cut.stderr and "have no id" in cut.stderr and "from line 3" in cut.stderr, cut.stderr


@pytest.mark.anyio
async def test_ctrl_c_stops_an_import_with_a_statement_and_a_second_run_finishes_it(working: str,
                                                                                  tmp_path: Path) -> None:
    """Ctrl-C mid-import: no traceback, exit status 130, what was written said by line; the same
    command again writes the rest and nothing twice."""
    import signal
    import time

    n = 20_000
    dump = _write(tmp_path / "big.jsonl", [{"id": f"r{i:05d}", "content": f"record {i}",
                                            "created_at": f"2026-01-01T00:{i // 60000:02d}:{i // 1000 % 60:02d}.{i % 1000:03d}Z"}
                                           for i in range(n)])
    # SIGINT as a terminal gives it: a suite started in the background (`make test &`, a CI runner's
    # shell) runs with SIGINT ignored, which the import would inherit and finish unstopped.
    proc = subprocess.Popen(a2m_command("import", working, str(dump), "--batch", "50"), cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        async with HTTPClient(working) as client:
            deadline = time.monotonic() + 60
            while (await client.call("memory/describe", {}))["tiers"][0]["count"] < 500:
                assert proc.poll() is None and time.monotonic() < deadline, "the import ended before it was stopped"
                time.sleep(0.05)
        assert proc.poll() is None, "the import ended before it was stopped"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = err.decode()
    assert proc.returncode == 130, text
    assert "Traceback" not in text and "a2m import: interrupted" in text, text
    assert "were written" in text and "importing the file again skips them" in text, text
    async with HTTPClient(working) as client:
        assert 0 < (await client.call("memory/describe", {}))["tiers"][0]["count"] < n
    again = _cli("import", working, str(dump), "--batch", "500")
    assert again.returncode == 0, again.stderr
    async with HTTPClient(working) as client:
        assert (await client.call("memory/describe", {}))["tiers"][0]["count"] == n


@pytest.mark.anyio
async def test_token_and_endpoint_problems_are_said_with_their_fix(tmp_path: Path) -> None:
    """A missing or wrong bearer token (HTTP 401), a token of another principal (-32005), an endpoint
    that is not there: one line each, naming the endpoint once and what to change."""
    from tests.router.stack import federation

    tiers = [{"name": "working", "kind": "working"}, {"name": "procedural", "kind": "procedural"}]
    top = {"auth": {"tokens": {"tok-alice": "alice", "tok-bob": "bob"}}}
    with federation(tmp_path, tiers, mode="real", top=top) as stack:
        async with HTTPClient(stack.url, token="tok-alice") as client:
            await client.call("memory/remember", {"records": [{"content": "alice's note"}]})
        dump = tmp_path / "alice.jsonl"
        assert _cli("export", stack.url, str(dump), "--token", "tok-alice").returncode == 0
        out = str(tmp_path / "x.jsonl")
        for argv, said in [
            (["export", stack.url, out], "needs a bearer token: give --token"),
            (["import", stack.url, str(dump)], "needs a bearer token: give --token"),
            (["export", stack.url, out, "--token", "nope"], "does not accept this bearer token"),
            (["import", stack.url, str(dump), "--token", "nope"], "does not accept this bearer token"),
            (["export", stack.url, out, "--token", "tok-alice", "--owner", "bob"],
             "--owner 'bob': this bearer token's principal is another owner"),
            (["import", stack.url, str(dump), "--token", "tok-bob"],
             "the records belong to 'alice': this bearer token's principal is another owner"),
            (["doctor", stack.url], "needs a bearer token: give --token"),
            (["doctor", stack.url, "--token", "nope"], "does not accept this bearer token"),
        ]:
            done = _cli(*argv)
            text = done.stdout + done.stderr
            assert done.returncode in (1, 2) and said in text and "Traceback" not in text, (argv, text)
            assert text.count(stack.url) <= 1, (argv, text)  # the endpoint named once
        assert not Path(out).exists()
        # $A2M_TOKEN stands for --token (which `ps` shows every user); --token still wins
        done = _cli("export", stack.url, "-", env={"A2M_TOKEN": "tok-alice"})
        assert done.returncode == 0 and "alice's note" in done.stdout, done.stderr
        assert _cli("doctor", stack.url, env={"A2M_TOKEN": "tok-alice"}).returncode == 0
        done = _cli("export", stack.url, "-", "--token", "nope", env={"A2M_TOKEN": "tok-alice"})
        assert done.returncode == 1 and "does not accept this bearer token" in done.stderr, done.stderr
        async with HTTPClient(stack.url, token="tok-bob") as client:
            assert (await client.call("memory/timeline", {}))["records"] == []

        # A tier gone mid-export: what already went to standard output is said to be incomplete.
        stack.tiers["procedural"].kill()
        done = _cli("export", stack.url, "-", "--token", "tok-alice", "--wait-for-tiers", "0")
        assert done.returncode == 1 and len(done.stdout.splitlines()) == 1, done
        assert "procedural did not answer" in done.stderr and "standard output (1 records) is incomplete" in done.stderr
        import os
        import threading

        pipe = tmp_path / "out.fifo"
        os.mkfifo(pipe)
        reader = threading.Thread(target=pipe.read_bytes, daemon=True)
        reader.start()
        done = _cli("export", stack.url, str(pipe), "--token", "tok-alice", "--wait-for-tiers", "0", timeout=30)
        reader.join(10)
        assert done.returncode == 1 and f"what went to {pipe} (1 records) is incomplete" in done.stderr, done.stderr

    port = free_port()
    for verb, target in (("export", out), ("import", str(dump))):
        done = _cli(verb, f"http://127.0.0.1:{port}/", target)
        assert done.returncode == 1 and "connection refused" in done.stderr.lower(), done.stderr
        assert done.stderr.count(f"127.0.0.1:{port}") == 1, done.stderr


@pytest.mark.anyio
async def test_records_of_a_read_only_tier_import_and_a_read_only_endpoint_is_refused_up_front(tmp_path: Path) -> None:
    """A record that names a tier the target mounts read-only (a file exported from the corpus's
    server itself, or a backup made before export left such tiers out) is placed by the target: the
    corpus it mounts already holds its own records (an existing id, nothing written), and a record
    it does not hold lands in writable memory, as decision 53 says a corpus's records are copied.
    An endpoint whose every tier is read-only is refused before the first write, saying so."""
    from tests.router.stack import federation, tier_call

    tiers = [{"name": "working", "kind": "working"}, {"name": "kb", "kind": "semantic", "read_only": True}]
    handbook = {"id": "hb-1", "content": "the handbook", "created_at": "2025-01-01T00:00:00.000Z"}
    dump = _write(tmp_path / "kb.jsonl", [
        {**handbook, "tier": "kb"}, {"id": "hb-2", "content": "a page the target's corpus lacks", "tier": "kb"},
        {"id": "n-1", "content": "my note", "tier": "working"}])
    with federation(tmp_path, tiers, mode="real") as stack:
        await tier_call(stack, "kb", "memory/remember", {"records": [handbook]})
        assert await transfer.import_(stack.url, str(dump), quiet=True) == 0
        assert sorted(await _contents(stack.url, tier="working")) == ["a page the target's corpus lacks", "my note"]
        assert await _contents(stack.url, tier="kb") == ["the handbook"]

    only = tmp_path / "only"
    only.mkdir()
    with federation(only, [{"name": "kb", "kind": "semantic", "read_only": True}], mode="real") as stack:
        done = _cli("import", stack.url, str(dump))
        assert done.returncode == 1 and "takes no writes: tier kb is read-only" in done.stderr, done.stderr
        assert "nothing was written" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.anyio
async def test_an_owner_with_no_records_is_named_and_stdout_is_called_so(working: str, tmp_path: Path) -> None:
    """A2M cannot list owners, so a misspelt --owner backs up nothing for the owner meant: the export
    says which named owner it found nothing for. The count line names standard output as such."""
    async with HTTPClient(working) as client:
        await client.call("memory/remember", {"records": [{"content": "alice's note"}], "owner": "alice"})
    done = _cli("export", working, "-", "--owner", "alice", "--owner", "alcie")
    assert done.returncode == 0 and len(done.stdout.splitlines()) == 1, done.stderr
    assert "--owner 'alcie': no records" in done.stderr and "'alice': no records" not in done.stderr, done.stderr
    assert "exported 1 record to standard output" in done.stderr, done.stderr


@pytest.mark.anyio
async def test_a_pipe_is_a_file_too(working: str, tmp_path: Path) -> None:
    """`a2m import URL <(zcat dump.jsonl.gz)` and `a2m export URL >(gzip > dump.jsonl.gz)` hand the
    command a named pipe: it can be read once and cannot be replaced by a finished file. The import
    used to read it through to count its lines and then import nothing (exit 0); the export wrote a
    regular file beside it and renamed that over the pipe, so the reader never saw a byte."""
    import os
    import threading

    records = [{"id": f"r{i}", "content": f"record {i}", "created_at": f"2026-01-01T00:00:00.00{i}Z"} for i in range(5)]
    pipe = tmp_path / "in.fifo"
    os.mkfifo(pipe)

    def feed() -> None:
        with open(pipe, "wb") as handle:
            handle.write(b"".join(orjson.dumps(r) + b"\n" for r in records))

    writer = threading.Thread(target=feed, daemon=True)
    writer.start()
    done = _cli("import", working, str(pipe), timeout=30)
    writer.join(10)
    assert done.returncode == 0 and "imported 5 records" in done.stderr, done.stderr
    assert await _contents(working) == [r["content"] for r in records]

    out = tmp_path / "out.fifo"
    os.mkfifo(out)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(out.read_bytes()), daemon=True)
    reader.start()
    done = _cli("export", working, str(out), timeout=30)
    reader.join(10)
    assert done.returncode == 0, done.stderr
    assert [orjson.loads(line)["id"] for line in got[0].splitlines()] == [r["id"] for r in records]
    assert out.is_fifo() and not (tmp_path / "out.fifo.partial").exists()


@pytest.mark.anyio
async def test_an_export_whose_reader_goes_away_stops_quietly(working: str) -> None:
    """`a2m export URL - | head`: the reader closes the pipe after the lines it wanted (here before
    the first). The export stops as `cat` would, with no message and 141 (128 + SIGPIPE, what a shell
    shows for a command a closed pipe stopped); it used to print "[Errno 32] Broken pipe" and exit 1."""
    async with HTTPClient(working) as client:
        await client.call("memory/remember", {"records": [{"content": "x" * 2000} for _ in range(200)]})
    export = subprocess.Popen(a2m_command("export", working, "-"), cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE)
    assert export.stdout is not None and export.stderr is not None
    export.stdout.close()
    said = export.stderr.read().decode()
    assert export.wait(60) == 141, said
    assert "rror" not in said and "exported" not in said and "Traceback" not in said, said


def test_an_import_from_a_terminal_says_what_it_expects() -> None:
    """`a2m import URL -` typed without a pipe waited for records to be typed in, with a progress bar
    at 0 and no word: it now says to pipe the export in, before it connects."""
    import os
    import pty

    leader, follower = pty.openpty()
    try:
        done = subprocess.run(a2m_command("import", f"http://127.0.0.1:{free_port()}/", "-"), cwd=ROOT,
                              stdin=follower, capture_output=True, text=True, timeout=30)
    finally:
        os.close(follower)
        os.close(leader)
    assert done.returncode == 1 and "standard input is a terminal" in done.stderr, done.stderr


@pytest.mark.anyio
async def test_batches_are_cut_by_size_as_well_as_by_count(tmp_path: Path) -> None:
    """A backup of large records (documents, long transcripts) filled a 500-record batch past the
    router's 16 MiB request limit: the import stopped at its first batch with a 413 and left the
    operator to guess a --batch. Batches are now cut at a byte budget too."""
    from tests.router.stack import federation

    big = "x" * 600_000
    records = [{"id": f"doc-{i}", "content": f"{i} {big}"} for i in range(40)]  # 24 MB in all
    dump = _write(tmp_path / "docs.jsonl", records)
    with federation(tmp_path, [{"name": "working", "kind": "working", "timeout": 30.0}], mode="real") as stack:
        assert await transfer.import_(stack.url, str(dump), quiet=True) == 0
        async with HTTPClient(stack.url) as client:
            assert (await client.call("memory/describe", {}))["tiers"][0]["count"] == 40


@pytest.mark.anyio
async def test_sigterm_stops_a_transfer_as_ctrl_c_does(tmp_path: Path) -> None:
    """SIGTERM is how systemd, `timeout`, `docker stop` and Kubernetes stop a job: an export so
    stopped leaves no `FILE.partial`, an import says which lines were written; both without a
    traceback, exit status 143 (128 + SIGTERM)."""
    import os
    import signal
    import time

    from tests.router.stack import federation, tier_call

    tiers = [{"name": "working", "kind": "working"}, {"name": "episodic", "kind": "episodic", "timeout": 1.0}]
    (tmp_path / "fed").mkdir()
    with federation(tmp_path / "fed", tiers) as stack:
        async with HTTPClient(stack.url) as client:
            await client.call("memory/remember", {"records": [{"content": f"e{i}", "tier": "episodic"}
                                                              for i in range(5)]})

        def start(*args: str) -> subprocess.Popen[bytes]:
            return subprocess.Popen(a2m_command(*args), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

        def terminated(proc: subprocess.Popen[bytes]) -> str:
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=60)
            text = err.decode()
            assert proc.returncode == 128 + signal.SIGTERM, text
            assert "Traceback" not in text, text
            return text

        # An export waiting for a tier that does not answer: its output is open, as `.partial`.
        stack.tiers["episodic"].pause()
        try:
            dump = tmp_path / "backup.jsonl"
            proc = start("export", stack.url, str(dump))
            try:
                assert proc.stderr is not None
                os.set_blocking(proc.stderr.fileno(), True)
                seen = b""
                while b"asking again" not in seen:
                    line = proc.stderr.readline()
                    assert line, seen.decode()
                    seen += line
                assert (tmp_path / "backup.jsonl.partial").exists()
                text = terminated(proc)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        finally:
            stack.tiers["episodic"].resume()
        assert "a2m export: interrupted" in text and "was not written" in text, text
        assert not list(tmp_path.glob("backup.jsonl*"))

        # An import midway: what was written is said, by line.
        n = 20_000
        big = _write(tmp_path / "big.jsonl", [{"id": f"r{i:05d}", "content": f"record {i}", "tier": "working"}
                                              for i in range(n)])
        proc = start("import", stack.url, str(big), "--batch", "50")
        try:
            deadline = time.monotonic() + 60
            while (await tier_call(stack, "working", "memory/describe", {}))["tiers"][0]["count"] < 500:
                assert proc.poll() is None and time.monotonic() < deadline, "the import ended before it was stopped"
                time.sleep(0.05)
            text = terminated(proc)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert "a2m import: interrupted" in text and "were written" in text, text
        assert "importing the file again skips them" in text, text


@pytest.mark.anyio
async def test_a_file_without_ids_imported_for_a_second_principal_says_how(tmp_path: Path) -> None:
    """Records without ids are given ids from the file and its lines, and an id is one owner's: the
    same file imported under a second principal's token is refused, naming the way that writes it."""
    from tests.router.stack import federation

    tiers = [{"name": "working", "kind": "working"}]
    top = {"auth": {"tokens": {"tok-alice": "alice", "tok-bob": "bob"}}}
    with federation(tmp_path, tiers, mode="real", top=top) as stack:
        seed = _write(tmp_path / "seed.jsonl", [{"content": "house rule 1"}, {"content": "house rule 2"}])
        assert _cli("import", stack.url, str(seed), "--token", "tok-alice").returncode == 0
        done = _cli("import", stack.url, str(seed), "--token", "tok-bob")
        assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
        assert f"{seed}:1: " in done.stderr and "import it from standard input" in done.stderr, done.stderr
        piped = _cli("import", stack.url, "-", "--token", "tok-bob", stdin=seed.read_bytes())
        assert piped.returncode == 0, piped.stderr
        for token in ("tok-alice", "tok-bob"):
            async with HTTPClient(stack.url, token=token) as client:
                held = (await client.call("memory/timeline", {}))["records"]
            assert sorted(r["content"] for r in held) == ["house rule 1", "house rule 2"], token
