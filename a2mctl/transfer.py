"""`a2m export` / `a2m import`: records as JSON Lines in the protocol's wire form.

Both speak only A2M, so they work through the router, a single tier server, or
any other A2M server. Export pages through `memory/timeline` per tier and per
owner; import writes `memory/remember` batches using the move/import extension
(docs/extensions.md), so ids, keys, revisions, `created_at` and access history
survive, and a record lands in the tier it was exported from when the target
has one of that name.

Paging walks backwards through `timeline` (`a2m.paging` says how). Pages are
spooled to a temporary file and written out oldest first, so the file is in
creation order (and, within one millisecond, in the order the source returns
them): importing it reproduces the timeline exactly. A record rewritten while
the walk runs moves behind it, so catch-up passes read what was written since
(`_export_stream`); tiers are read each before those it spills or promotes into
(`_sources_first`), so a record moved along those links is read on one side.

Import reads a regular file through once before its first write (one line at a
time: memory stays flat however long the file), so a line that is not JSON, a
record any server here would refuse (`a2m.records.parse_write`, what the router
and every tier check), or a vector of another width than the target's changes
nothing; standard input and pipes are read once, as they come, and checked the
same way before the batch that holds a line is sent.
A record without an id is given one before its first send (`_given_id`), so
every batch may be sent twice without writing anything twice: a batch a router
refuses because one of its tiers is down is sent again once the tier is back,
within `--wait-for-tiers`, as export waits for a page. A batch holds one owner
(a call's scope), so up to `WINDOW` batches' worth of lines is gathered by owner
before the oldest must go (`_Window`): a file whose owners alternate goes in full
batches, each owner's records in file order. A tier that answers the
router something that is not an A2M reply is not down: it stops the import at
once. Whatever stops an import (a refused batch, an endpoint gone, Ctrl-C) is
said with the file lines that were written (a prefix, and any owner's records
written past it): a second run of the same file skips them (an existing id is an
idempotent write); from a stream, records that had no id are written again, so
the message says where to resume.

A router's rate limit (`-32006` with `data.retry_after`, router/rate.py) is
waited out, not an error: a refused call did nothing, so it is sent again.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import re
import shlex
import signal
import stat
import sys
import tempfile
import uuid
from collections import deque
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import IO, AbstractSet, Any, AsyncIterator, Iterator, Sequence

import orjson

from a2m import paging

PAGE = 1000  # the protocol's usual max_recall_limit
TIER_WAIT = 30.0  # seconds a tier a router answers without may take to come back (`--wait-for-tiers`)
# The longest wait for a rate limit that the transfer takes; past it (or after as many refusals in a
# row) the refusal is the error: a limit that slow is not one an export can get through.
MAX_RATE_WAIT = 60.0
MAX_RATE_REFUSALS = 100
# Passes after an export's walk of a stream that read what was written while it ran (`_export_stream`);
# a stream still changing after them is said on stderr.
CATCH_UP_PASSES = 5
# How far the endpoint's clock may be behind this machine's: a catch-up pass's bound is never later than
# this before the pass began (`_newest`), so it re-reads at most these seconds of writes unchanged.
CLOCK_SKEW = 10.0
BATCH_BYTES = 8 * 1024 * 1024  # JSON per import call: half the 16 MiB any server here takes at its front door
# An import holds up to this many batches' worth of records (by count and by JSON) past the last line
# written, each owner's in a batch of its own (`_Window`): a file whose owners alternate line by line is
# sent in full batches, not one record per call.
WINDOW = 4
WIRE_FIELDS = ("id", "content", "created_at", "role", "metadata", "group", "tier", "salience", "access_count",
               "accessed_at", "owner", "session", "key", "revision", "uri", "media_type")


class TransferError(Exception):
    """Export or import cannot continue; the message says why and what to do."""


def _client(target: str, token: str | None, timeout: float) -> Any:
    """`a2m.client.connect` (an http(s) URL, or the command line of a stdio server run as a child), with
    the endpoint's problems said as an export or import error rather than a traceback."""
    from a2m.client import connect

    from .cli import http_url_problem

    http = target.startswith(("http://", "https://"))
    problem = http_url_problem(target) if http else None
    if problem:
        raise TransferError(problem)
    if not http and re.match(r"[A-Za-z][A-Za-z0-9+.-]*://", target):
        raise TransferError(f"{target}: A2M is served over http:// or https://, or as a stdio command line")
    if not http and re.fullmatch(r"([0-9.]+|\[[0-9A-Fa-f:]+\]|[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)*):\d+/?", target):
        # `127.0.0.1:8700` was run as a command and answered "No such file or directory"; a host without a
        # dot too (`router:8700`, compose's service name): no command is named host:digits
        raise TransferError(f"{target} is a host and port, not a URL: write http://{target.rstrip('/')}/ (a "
                            "stdio server is given as its command line)")
    if not http and not shlex.split(target):
        raise TransferError("no endpoint: give an http(s) URL or the command line of a stdio A2M server")
    try:
        return _Paced(connect(target, token=token, timeout=timeout))
    except ValueError as exc:  # a token for a command line
        raise TransferError(f"--token: {exc}") from None


class _Paced:
    """A client that waits out a rate limit: a call answered `-32006` with a `retry_after` it can
    wait is sent again after it. Anything else, as the client has it."""

    def __init__(self, client: Any) -> None:
        self._client = client

    async def call(self, method: str, params: dict[str, Any] | None = None, **kwargs: Any) -> dict[str, Any]:
        from a2m.client import waiting_out_rate_limits

        return await waiting_out_rate_limits(lambda: self._client.call(method, params, **kwargs),
                                             most=MAX_RATE_WAIT, refusals=MAX_RATE_REFUSALS)

    async def __aenter__(self) -> "_Paced":
        await self._client.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._client.__aexit__(*exc)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def _scope_problem(exc: Any, named: str) -> str | None:
    """-32005 for an owner the caller's bearer token does not grant (`named` says where it came from)."""
    from a2m import errors

    data = exc.data if isinstance(exc.data, dict) else {}
    if exc.code != errors.SCOPE_DENIED or "index" in data or not isinstance(data.get("owner"), str):
        return None  # (an id another owner holds names the record's index)
    return (f"{named.format(data['owner'])}: this bearer token's principal is another owner, and a token reads "
            f"and writes only its own principal's records (protocol §7): use a token of {data['owner']!r}")


def endpoint_problem(url: str, exc: Any, token: str | None) -> str:
    """An endpoint's refusal or absence as one line naming it once and what to change: a missing or
    wrong bearer token (HTTP 401), a token of another principal (-32005), nothing listening."""
    from a2m.client import Unavailable

    data = exc.data if isinstance(exc.data, dict) else {}
    if isinstance(exc, Unavailable) and data.get("status") == 401:
        return (f"{url} does not accept this bearer token (HTTP 401): give --token (or $A2M_TOKEN) one of its "
                "tokens" if token else f"{url} needs a bearer token: give --token or $A2M_TOKEN (HTTP 401)")
    scope = _scope_problem(exc, "--owner {!r}")
    if scope:
        return f"{url}: {scope}"
    if isinstance(exc, Unavailable):
        return f"{url}: unreachable: {unreachable_reason(exc, url)}"
    return f"{url}: {exc.message}"


def unreachable_reason(exc: Any, url: str) -> str:
    """Why a client's `Unavailable` has no answer, without the URL its message repeats."""
    cause = exc.__cause__
    while cause is not None and not isinstance(cause, OSError):
        cause = cause.__cause__
    if isinstance(cause, ConnectionRefusedError):
        return "connection refused: nothing listens there (is the server running?)"
    if isinstance(cause, OSError) and cause.strerror:
        return cause.strerror
    message = str(exc.message)
    for prefix in (f"{url} unreachable: ", f"{url.rstrip('/') + '/'} unreachable: ", f"{url} "):
        if message.startswith(prefix):
            return message[len(prefix):]
    return message


def _progress() -> Any:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                    console=Console(stderr=True), transient=False)


async def _describe(client: Any, owner: str | None = None) -> dict[str, Any]:
    return await client.call("memory/describe", {} if owner is None else {"owner": owner})


def _tier_names(described: dict[str, Any]) -> tuple[list[str | None], list[str]]:
    """Per-tier paging where the endpoint has several tiers (a router), one stream otherwise; and the
    read-only tiers left out. A read-only tier is mounted, not stored (a corpus): its records are
    restored by mounting it again, it may be large and someone else's, and no import can write them
    back into it (decision 53)."""
    tiers = [t for t in described.get("tiers") or [] if t.get("name")]
    if len(tiers) <= 1:
        return [None], []  # one server, read-only or not: its records are what was asked for
    mounted = [t["name"] for t in tiers if t.get("read_only")]
    return _sources_first([t for t in tiers if not t.get("read_only")]), mounted


def _sources_first(tiers: list[dict[str, Any]]) -> list[str]:
    """The tiers' names, each after every tier that spills or promotes into it, otherwise in describe
    order. A move keeps a record's `created_at`, so one moved into a tier the export has read, from
    one it has not, would be in neither; read in this order, it is read where it leaves or where it
    lands. (A router refuses links that form a cycle; another endpoint's cycle is read in describe
    order from where it closes.)"""
    names = [t["name"] for t in tiers]
    into: dict[str, set[str]] = {name: set() for name in names}
    for tier in tiers:
        for link in ("spill_to", "promote_to"):
            if tier.get(link) in into and tier[link] != tier["name"]:
                into[tier[link]].add(tier["name"])
    ordered: list[str] = []
    while len(ordered) < len(names):
        left = [n for n in names if n not in ordered]
        ordered.append(next((n for n in left if into[n] <= set(ordered)), left[0]))
    return ordered


def _recall_cap(described: dict[str, Any]) -> int | None:
    cap = (described.get("limits") or {}).get("max_recall_limit")
    return int(cap) if cap else None


async def pages_backwards(client: Any, *, tier: str | None, owner: str | None, embeddings: bool,
                          page: int = PAGE, cap: int | None = PAGE, tier_wait: float = TIER_WAIT,
                          after: str | None = None) -> AsyncIterator[list[dict[str, Any]]]:
    """Every record of one (tier, owner) stream (created after `after`, where given), newest page
    first, each page ascending, no duplicates (`a2m.paging`). A page a router answers without a tier
    is asked again for up to `tier_wait` seconds, then stops the export: a backup that silently lacks
    a tier is worse than none."""
    params: dict[str, Any] = {"embeddings": embeddings}
    if tier is not None:
        params["tier"] = tier
    if owner is not None:
        params["owner"] = owner
    if after is not None:
        params["after"] = after
    try:
        async for records in paging.pages_backwards(client.call, params, page=page, cap=cap,
                                                    waits=paging.waits_within(tier_wait)):
            yield records
    except paging.TiersDown as exc:
        raise TransferError(f"{tier or 'the endpoint'}: {exc}; export again when they are back") from None
    except paging.CrowdedMillisecond as exc:
        raise TransferError(f"{tier or 'this endpoint'}: {exc}: export cannot page past them") from None


def _clean(record: dict[str, Any], embeddings: bool) -> dict[str, Any]:
    out = {k: record.get(k) for k in WIRE_FIELDS}
    if embeddings:
        out["embedding"] = record.get("embedding")
    return out


@contextlib.contextmanager
def _output(file: str) -> Iterator[IO[bytes]]:
    if file == "-":
        yield sys.stdout.buffer
        sys.stdout.buffer.flush()
        return
    path = Path(file)
    if _stream(file):  # a pipe (`>(gzip > dump.jsonl.gz)`) or a device: written as it comes
        try:
            handle = open(path, "wb")
        except OSError as exc:
            raise TransferError(f"cannot write {file}: {exc.strerror}") from None
        with handle:
            yield handle
        return
    partial = path.with_name(path.name + ".partial")
    try:
        handle = open(partial, "wb")
    except OSError as exc:
        raise TransferError(f"cannot write {file}: {exc.strerror}") from None
    try:
        with handle:
            yield handle
    except BaseException:
        partial.unlink(missing_ok=True)  # a failed export leaves no half file behind
        raise
    os.replace(partial, path)


def _reader_gone(file: str) -> int:
    """The reader of a pipe closed it (`a2m export URL - | head`): stop quietly, as `cat` does, with
    the status a shell shows for a command a closed pipe stopped (128 + SIGPIPE). Standard output
    is pointed at /dev/null first, or the interpreter's last flush reports the pipe again."""
    if file == "-":
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 128 + signal.SIGPIPE


def _export_left(file: str, written: int) -> str:
    """What a stopped export leaves: a file is not written at all; a stream may hold a part."""
    if not _stream(file):
        return f"{file} was not written"
    where = "standard output" if file == "-" else file
    return f"what went to {where} ({written} records) is incomplete" if written else "nothing was written"


async def export(url: str, file: str, token: str | None = None, embeddings: bool = False,
                 owners: Sequence[str | None] = (None,), quiet: bool = False, page: int = PAGE,
                 tier_wait: float = TIER_WAIT) -> int:
    """Write every record reachable at `url` (for each owner in `owners`) to `file` as JSON Lines;
    `tier_wait`, how long a tier a router answers without may take to come back."""
    from a2m.errors import A2MError

    written = 0
    opened = False  # the output was opened: a stop after this says what became of it
    try:
        async with _client(url, token, 60.0) as client:
            described = await _describe(client)
            tiers, mounted = _tier_names(described)
            if mounted:
                print(f"a2m export: tier{'s' if len(mounted) > 1 else ''} {', '.join(mounted)} "
                      f"{'are' if len(mounted) > 1 else 'is'} read-only (mounted, not stored here) and "
                      "left out; mount it again where you import", file=sys.stderr)
            cap = _recall_cap(described)
            page = min(page, cap) if cap else page
            progress = _progress()
            # The owner each record carries, once its partition is in the file. An endpoint may answer
            # one partition for two passes: under a principal's bearer token every call is that
            # principal's (protocol §7), so the unowned pass reads what `--owner <principal>` reads;
            # a server without scopes, or a shared corpus, gives every owner the same records.
            done: set[str | None] = set()
            empty: list[str] = []  # named owners the endpoint holds no record of
            with _output(file) as out, progress if not quiet else contextlib.nullcontext():
                opened = True
                for owner in dict.fromkeys(owners):
                    if owner is not None and owner in done:
                        continue  # an earlier pass was answered with this owner's records
                    counts = {t.get("name"): int(t.get("count") or 0)
                              for t in (await _describe(client, owner)).get("tiers") or []}
                    answered: set[str | None] = set()
                    for tier in tiers:
                        total = counts.get(tier) if tier is not None else sum(counts.values()) or None
                        label = f"export {tier or described.get('name') or url}" + (f" ({owner})" if owner else "")
                        task = None if quiet else progress.add_task(label, total=total)
                        written += await _export_stream(client, out, tier=tier, owner=owner, embeddings=embeddings,
                                                        page=page, cap=cap, progress=None if quiet else progress,
                                                        task=task, skip=done, answered=answered,
                                                        tier_wait=tier_wait)
                    if owner is None and answered - {None}:
                        others = ", ".join(repr(o) for o in sorted(answered - {None}))
                        print(f"a2m export: the endpoint answers the unowned pass with the records of {others} "
                              "(a token's principal is the owner scope of every call); they are in the file "
                              "once, and the unowned partition cannot be read with this token", file=sys.stderr)
                    done |= answered | ({owner} if owner is not None else set())
                    if owner is not None and not answered:
                        empty.append(owner)
            if empty:  # A2M cannot list owners: a misspelt one would otherwise pass for an empty partition
                print(f"a2m export: {', '.join(f'--owner {o!r}' for o in empty)}: no records here "
                      "(is the name right?)", file=sys.stderr)
    except asyncio.CancelledError:  # Ctrl-C: asyncio.run cancels this task, then raises KeyboardInterrupt
        print(f"a2m export: interrupted; {_export_left(file, written)}", file=sys.stderr)
        raise
    except TransferError as exc:
        left = f"; {_export_left(file, written)}" if opened else ""
        print(f"a2m export: {exc}{left}", file=sys.stderr)
        return 1
    except A2MError as exc:
        left = f"; {_export_left(file, written)}" if opened else ""
        print(f"a2m export: {endpoint_problem(url, exc, token)}{left}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        return _reader_gone(file)
    except OSError as exc:  # the output cannot be written, or a stdio server's command cannot be run
        print(f"a2m export: {_os_error(exc)}", file=sys.stderr)
        return 1
    if not quiet:
        print(f"exported {written} record{'' if written == 1 else 's'} to "
              f"{'standard output' if file == '-' else file}", file=sys.stderr)
    return 0


class _Answers:
    """A client that counts the timeline pages answered whole (a page answered without a tier is
    asked again, and only its last answer counts): a catch-up pass answered in one page read all
    it covers at one moment."""

    def __init__(self, client: Any) -> None:
        self._client, self.pages = client, 0

    async def call(self, method: str, params: dict[str, Any] | None = None, **kwargs: Any) -> dict[str, Any]:
        result = await self._client.call(method, params, **kwargs)
        if method == "memory/timeline" and not result.get("degraded"):
            self.pages += 1
        return result


_LINE_ID = re.compile(rb'\{"id":("(?:[^"\\]|\\.)*")')


def _line_id(line: bytes) -> str | None:
    """The id a spooled line opens with (`_clean` puts `id` first)."""
    match = _LINE_ID.match(line)
    return orjson.loads(match.group(1)) if match else None


def _newest(records: list[dict[str, Any]], began: datetime) -> str | None:
    """The bound of the next catch-up pass: the latest `created_at` of a page, but no later than
    CLOCK_SKEW before `began`, this machine's time when the pass began (None: no timestamp, nothing to
    catch up from). A caller may stamp a record in the future: taken as the bound, it put every write
    made during the export before it, and a key rewritten then was in the file in neither version."""
    from a2m.errors import A2MError
    from a2m.timefmt import format_ts, parse_ts

    try:
        newest = max(parse_ts(r["created_at"]) for r in records)
    except (A2MError, KeyError, TypeError, ValueError):
        return None
    return format_ts(min(newest, began - timedelta(seconds=CLOCK_SKEW)))


def _reaches(records: list[dict[str, Any]], after: str) -> bool:
    """Whether a page asked for records after `after` holds one at or before it."""
    from a2m.errors import A2MError
    from a2m.timefmt import parse_ts

    try:
        return any(parse_ts(r["created_at"]) <= parse_ts(after) for r in records)
    except (A2MError, KeyError):
        return False


async def _export_stream(client: Any, out: IO[bytes], *, tier: str | None, owner: str | None, embeddings: bool,
                         page: int, cap: int | None, progress: Any, task: Any, skip: AbstractSet[str | None] = frozenset(),
                         answered: set[str | None] | None = None, tier_wait: float = TIER_WAIT) -> int:
    """One (tier, owner) stream into `out`, oldest first; records of an owner in `skip` (already in
    the file) are left out. The owners the endpoint answered with are added to `answered`.

    The walk goes from the newest record back, so a record rewritten while it runs (a key replaced:
    same id, a new `created_at`) moves behind it. After the walk, catch-up passes read what was
    created after the newest record each pass began with (from its millisecond on: a record written
    later in that millisecond is read too), until one pass is answered in a single page: that page
    is everything after its bound at one moment, and whatever lay before the bound then sat still
    since an earlier pass covered it. A pass whose first page is the previous pass's first page again
    ends there too: nothing came in front since, so nothing was rewritten behind that pass (a tier's
    newest millisecond holding a page or more, one remember call of that many records, made every
    pass two pages, and a quiet tier was read five more times and said to be still changing). A
    record a later pass read is written in that version only."""
    from a2m.timefmt import shift_ms

    # Pages (newest first) are spooled to a temporary file, then copied out oldest first: the walk's
    # pages, then each catch-up pass's.
    passes: list[list[tuple[int, int]]] = []  # per pass, (spool offset, size) of each page
    latest: dict[str, int] = {}  # id -> the last pass that read it, for ids a catch-up pass read
    newest: str | None = None  # the bound of the next pass
    front: list[tuple[Any, ...]] | None = None  # the previous pass's first page, as (id, created_at, revision)
    settled = False
    with tempfile.TemporaryFile() as spool:
        for number in range(CATCH_UP_PASSES + 1):
            after = None if number == 0 else shift_ms(newest, -1) if newest else None
            if number and after is None:
                settled = True
                break  # an empty stream, or stamps that are not times: nothing to catch up from
            counted = _Answers(client)
            offsets: list[tuple[int, int]] = []
            began: str | None = None
            clock = datetime.now(timezone.utc)
            ignored = again = False
            walk = pages_backwards(counted, tier=tier, owner=owner, embeddings=embeddings, page=page, cap=cap,
                                   tier_wait=tier_wait, after=after)
            async with contextlib.aclosing(walk):  # a pass cut short closes its walk
                async for page_records in walk:
                    if after is not None and _reaches(page_records, after):
                        ignored = True  # the endpoint ignores `after`: a pass would read the whole stream again
                        break
                    if not offsets:
                        began = _newest(page_records, clock)
                        shown = [(r.get("id"), r.get("created_at"), r.get("revision")) for r in page_records]
                        again, front = number > 0 and shown == front, shown
                    if answered is not None:
                        answered.update(r.get("owner") for r in page_records)
                    records = [r for r in page_records if r.get("owner") not in skip]
                    if number:
                        latest.update((r["id"], number) for r in records)
                    blob = b"".join(orjson.dumps(_clean(r, embeddings)) + b"\n" for r in records)
                    offsets.append((spool.tell(), len(blob)))
                    spool.write(blob)
                    if progress is not None:
                        progress.advance(task, len(page_records))
                    if again:
                        break  # the front has not moved since the last pass read it: nothing went behind it
            passes.append(offsets)  # (a pass cut short read what it read after its bound)
            if ignored:
                print(f"a2m export: {tier or 'the endpoint'}: its timeline ignores `after`, so records rewritten "
                      "while the export read it may be missing", file=sys.stderr)
                settled = True
                break
            if number and (counted.pages <= 1 or again):
                settled = True
                break
            newest = began
        if not settled:
            print(f"a2m export: {tier or 'the endpoint'}{f' ({owner})' if owner else ''}: records were still being "
                  f"written after {CATCH_UP_PASSES} catch-up passes; records rewritten during the last one may be "
                  "missing (export again when writes are quieter)", file=sys.stderr)
        count = 0
        for number, offsets in enumerate(passes):
            for start, size in reversed(offsets):
                spool.seek(start)
                blob = spool.read(size)
                if latest:  # a line a later pass read again is written in that version only
                    blob = b"".join(line for line in blob.splitlines(keepends=True)
                                    if latest.get(_line_id(line) or "", 0) == number)
                out.write(blob)
                count += blob.count(b"\n")
    if progress is not None:
        progress.update(task, total=count, completed=count)
    return count


def _record_problem(record: dict[str, Any]) -> str | None:
    """What the router and every tier server would refuse in `record` (the protocol's shared
    validation, `a2m.records.parse_write`), said without a batch index; None for a storable record.
    Checked while the file is read, so a bad record stops the import before the batch holding it,
    where the server's refusal would come after every earlier batch was written."""
    from a2m.errors import A2MError
    from a2m.records import parse_write

    try:
        parse_write(record, 0, owner=None, stamp="1970-01-01T00:00:00.000Z")  # a stamp: no clock read per line
    except A2MError as exc:
        return re.sub(r"^records\[0\](\.|:\s*)?", "", exc.message)
    return None


_OTHER_EMBEDDER = ("vectors of another embedder cannot be imported; without them (jq -c 'del(.embedding)') "
                   "the target's embedder, if it has one, makes its own")


class _Widths:
    """The vector widths a file holds, each with the first line that has it. A target stores one
    width (protocol §4: any other is -32008), so vectors of another width than the target's, or than
    the file's first, would be refused batch by batch after the earlier ones were written."""

    def __init__(self, file: str) -> None:
        self.file = file
        self.first: dict[int, int] = {}

    def see(self, number: int, record: dict[str, Any]) -> None:
        vector = record.get("embedding")
        if isinstance(vector, list):
            self.first.setdefault(len(vector), number)

    def problem(self, dimensions: Any, target: str) -> str | None:
        """The first line whose vector the target would refuse, and what to do (None: none)."""
        if not self.first:
            return None
        known = isinstance(dimensions, int) and not isinstance(dimensions, bool)
        expected = dimensions if known else min(self.first, key=self.first.__getitem__)
        others = sorted((number, width) for width, number in self.first.items() if width != expected)
        if not others:
            return None
        number, width = others[0]
        held = (f"{target} holds vectors of {expected}" if known
                else f"line {self.first[expected]}'s, the first in the file, has {expected}")
        return (f"{self.file}:{number}: its embedding has {width} dimensions, {held} (a store takes one width): "
                f"{_OTHER_EMBEDDER}")


def _read_lines(file: str, check: bool = True,
                digest: Any = None) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, record) for each non-blank line; with `check`, each record is checked as a server
    would (off for the second read of a file the first read checked: a few seconds per million); every
    line read, blank or not, is fed to `digest` (a hashlib object) where given."""
    handle: IO[bytes] = sys.stdin.buffer if file == "-" else open(file, "rb")
    try:
        for number, line in enumerate(handle, 1):
            if digest is not None:
                digest.update(line)
            if not line.strip():
                continue
            try:
                record = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                raise TransferError(f"{file}:{number}: not JSON ({exc})") from None
            if not isinstance(record, dict) or not isinstance(record.get("content"), str):
                raise TransferError(f"{file}:{number}: not an A2M record (an object with content)")
            problem = _record_problem(record) if check else None
            if problem:
                raise TransferError(f"{file}:{number}: {problem}")
            yield number, record
    finally:
        if handle is not sys.stdin.buffer:
            handle.close()


def _os_error(exc: OSError) -> str:
    return f"{exc.filename}: {exc.strerror}" if exc.filename and exc.strerror else str(exc)


def _span(first: int, last: int) -> str:
    return f"line {first}" if first == last else f"lines {first}-{last}"


def _at(file: str, lines: list[int]) -> str:
    """Where a batch lies in its file, as an editor takes it: `FILE:3` or `FILE:3-7`."""
    return f"{file}:{lines[0]}" if lines[0] == lines[-1] else f"{file}:{lines[0]}-{lines[-1]}"


def _this_batch(batch: str, lines: list[int]) -> str:
    """"this batch", naming its owner's records where other owners' lie among its lines."""
    return "this batch" if batch == _span(lines[0], lines[-1]) else f"this batch ({batch})"


def _owner_said(owner: str | None) -> str:
    return "no owner" if owner is None else repr(owner)


class _Written:
    """How far an import got, said by file line: what a second run skips, or where it should start.
    Every line up to `through` is written; past it, only the records in `ahead` (`_Window`)."""

    def __init__(self, file: str, url: str) -> None:
        self.file, self.url = file, url
        self.records = 0  # records in batches the endpoint answered
        self.through = 0  # the last file line of the written prefix: every record up to it was answered
        self.ahead: list[tuple[int, str | None]] = []  # (line, owner) of each answered record past `through`
        self.without_id = 0  # of them, those given a fresh id (read from a stream): a second import writes them again
        self.in_flight: tuple[int, int] | None = None  # a batch sent and not answered: written or not
        self.in_flight_said: str | None = None  # that batch, where other owners' records lie among its lines

    def __str__(self) -> str:
        if not self.records and self.in_flight is None:
            return "nothing was written"
        said = []
        prefix = self.records - len(self.ahead)
        if prefix:
            said.append(f"{_span(1, self.through)} ({prefix} record{'' if prefix == 1 else 's'}) were written")
        if self.ahead:
            others = _ahead_said(self.ahead)
            said.append(f"so were {others}" if prefix else f"{others} were written")
        after = self.through + 1
        if self.in_flight is not None:
            said.append(f"the batch of {self.in_flight_said or _span(*self.in_flight)} was being written and may "
                        "have been")
        if self.ahead or self.in_flight_said:  # other owners' records among them were not written
            said.append(f"no other record from line {after} on was")
        else:
            if self.in_flight is not None:
                after = self.in_flight[1] + 1
            said[-1] += f", line {after} and after were not"
        if not self.without_id:
            said.append("importing the file again skips them (by id)")
        else:
            scattered = self.ahead or self.in_flight_said or self.in_flight is None
            resume = self.through + 1 if scattered else self.in_flight[0]  # type: ignore[index]
            how = f" (tail -n +{resume} {shlex.quote(self.file)} | a2m import {self.url} -)" if self.file != "-" else ""
            said.append(f"{self.without_id} of the records written have no id, so importing the file again "
                        f"would write those twice: import from line {resume} on{how}")
        return "; ".join(said)


def _ahead_said(ahead: list[tuple[int, str | None]]) -> str:
    """The records written past the prefix, by owner: "the 3 records of 'bob' among lines 4-8"."""
    owners: dict[str | None, list[int]] = {}
    for line, owner in ahead:
        owners.setdefault(owner, []).append(line)
    parts = [f"the {len(lines)} record{'' if len(lines) == 1 else 's'} of {_owner_said(owner)} among "
             f"{_span(lines[0], lines[-1])}" for owner, lines in list(owners.items())[:3]]
    if len(owners) > 3:
        rest = [line for lines in list(owners.values())[3:] for line in lines]
        parts.append(f"{len(rest)} records of {len(owners) - 3} other owners among {_span(min(rest), max(rest))}")
    return ", ".join(parts[:-1]) + (" and " if len(parts) > 1 else "") + parts[-1]


class _Bucket:
    """One owner's records read and not sent, in file order: that owner's next batch."""

    def __init__(self, owner: str | None) -> None:
        self.owner = owner
        self.records: list[dict[str, Any]] = []
        self.lines: list[int] = []  # the file line of each
        self.given: list[bool] = []  # whether each record's id is one `_given_id` made
        self.ids: set[str] = set()  # the ids the file gave them
        self.bytes = 0  # their JSON (a request over the endpoint's body limit is refused, 413)


class _Window:
    """The records an import has read past its written prefix: pending, one bucket per owner, or
    written ahead of a line still pending. A batch holds one owner (`owner` is a call's scope), so a
    file whose owners alternate was sent a record per call; grouped here, each owner's records go in
    full batches, in file order, and the oldest pending bucket is sent whenever the window holds
    WINDOW batches' worth (memory stays bounded, and so does how far past the prefix anything lies).

    What may not be reordered is not: one owner's records (a key written twice lands in file order);
    the unowned records against named ones (under a bearer token both are the principal's); an id
    repeated under two owners; and, from a stream, a record given a fresh id, sent only once every
    line before it is, so a rerun from the first unwritten line writes nothing twice (`_Written`)."""

    def __init__(self, size: int, done: _Written) -> None:
        self.size, self.done = size, done
        self.buckets: dict[str | None, _Bucket] = {}
        self.front: deque[tuple[int, str | None]] = deque()  # (line, owner) of each record past the prefix
        self.answered: set[int] = set()  # of those, the lines written
        self.bytes = 0  # the JSON of the pending records
        self.ids: dict[str, str | None] = {}  # the ids the file gave the pending records, each with its owner

    def add(self, number: int, record: dict[str, Any], prepared: dict[str, Any], made: bool, weight: int) -> None:
        owner = record.get("owner")
        bucket = self.buckets.setdefault(owner, _Bucket(owner))
        bucket.records.append(prepared)
        bucket.lines.append(number)
        bucket.given.append(made)
        bucket.bytes += weight
        if isinstance(record.get("id"), str):
            bucket.ids.add(record["id"])
            self.ids.setdefault(record["id"], owner)
        self.bytes += weight
        self.front.append((number, owner))

    def before(self, record: dict[str, Any], fresh: bool) -> list[_Bucket]:
        """The other owners' buckets to send, oldest first, before `record` joins its own: all of them
        where it may not pass them (a fresh id, unowned against named, an id one of them holds)."""
        owner, rid = record.get("owner"), record.get("id")
        unowned = None in self.buckets
        crossed = unowned if owner is not None else len(self.buckets) > unowned  # unowned against named
        held = isinstance(rid, str) and rid in self.ids and self.ids[rid] != owner
        if fresh or crossed or held:
            return sorted((b for o, b in self.buckets.items() if o != owner), key=lambda b: b.lines[0])
        return []

    def crowded(self, weight: int) -> _Bucket | None:
        """The bucket holding the oldest pending line while the window is full (None: room for one more)."""
        full = len(self.front) >= self.size * WINDOW or self.bytes + weight > WINDOW * BATCH_BYTES
        return self.oldest() if full else None

    def oldest(self) -> _Bucket | None:
        """The bucket holding the oldest pending line (the prefix's next), None when none is pending."""
        return self.buckets[self.front[0][1]] if self.front else None

    def said(self, bucket: _Bucket) -> str:
        """A batch as messages name it: its span of lines, or, where other owners' records lie among
        them or a line before them is still pending, its owner's records among them. Named by its span
        when a line before it is pending, a batch lost in flight read as if every line before it were
        written, and a stream's advice resumed past that line, which no run then wrote."""
        first, last = bucket.lines[0], bucket.lines[-1]
        held = sum(1 for line, _ in self.front if first <= line <= last)
        if self.front[0][0] == first and held == len(bucket.lines):
            return _span(first, last)
        count = len(bucket.lines)
        records = f"{count} record{'' if count == 1 else 's'}"
        return f"the {records} of {_owner_said(bucket.owner)} among {_span(first, last)}"

    def take(self, bucket: _Bucket) -> None:
        """`bucket` is being sent: it is no longer pending."""
        del self.buckets[bucket.owner]
        self.bytes -= bucket.bytes
        for rid in bucket.ids:
            if self.ids.get(rid) == bucket.owner:
                del self.ids[rid]

    def written(self, bucket: _Bucket) -> None:
        """`bucket` was answered: the prefix grows over every line now written, the rest is ahead."""
        self.answered.update(bucket.lines)
        while self.front and self.front[0][0] in self.answered:
            line, _ = self.front.popleft()
            self.answered.discard(line)
            self.done.through = line
        self.done.ahead = [(line, owner) for line, owner in self.front if line in self.answered]


def _refused(file: str, lines: list[int], records: list[dict[str, Any]], exc: Any, batch: str | None = None) -> str:
    """The server's refusal of a batch, pointed at the file line of the record it names (for a vector
    of the wrong width, which -32008 names by width only, the first record of another width); `batch`,
    the batch as `_Window.said` names it (its span of lines, where it holds every record of them)."""
    from a2m import errors

    batch = batch or _span(lines[0], lines[-1])

    index = exc.data.get("index") if isinstance(exc.data, dict) else None
    named = re.match(r"records\[(\d+)\]\.?", exc.message)  # what any server's message says, failing data
    if not isinstance(index, int) and named:
        index = int(named.group(1))
    expected = exc.data.get("expected") if isinstance(exc.data, dict) else None
    if exc.code == errors.EMBEDDING_MISMATCH and not isinstance(index, int) and isinstance(expected, int):
        for i, record in enumerate(records):
            vector = record.get("embedding")
            if isinstance(vector, list) and len(vector) != expected:
                return (f"{file}:{lines[i]}: its embedding has {len(vector)} dimensions, {exc.message}: "
                        f"{_OTHER_EMBEDDER}; its batch ({batch}) was not written")
    if isinstance(index, int) and 0 <= index < len(lines):
        message = re.sub(rf"^records\[{index}\](\.|:\s*)?", "", exc.message)  # the line says which record
        return f"{file}:{lines[index]}: {message}; its batch ({batch}) was not written"
    said = _scope_problem(exc, "the records belong to {!r}") or exc.message
    return f"{_at(file, lines)}: {said}; {_this_batch(batch, lines)} was not written"


def _given_id_held(exc: Any, given: list[bool]) -> int | None:
    """The index of a record whose given id (`_given_id`) the server says another owner holds (-32005
    naming a record), or None: the same file imported before under another principal's token, whose
    records naming no owner were that principal's."""
    from a2m import errors

    index = exc.data.get("index") if isinstance(exc.data, dict) else None
    if exc.code != errors.SCOPE_DENIED or not isinstance(index, int) or not 0 <= index < len(given):
        return None
    return index if given[index] else None


def _check_file(file: str, widths: _Widths) -> tuple[int, str] | None:
    """The number of records in `file` and the SHA-256 of its bytes, every line read and checked
    first (one at a time: nothing is held), its vector widths noted in `widths`: a broken line (a
    backup cut short) or a record no server here stores then stops the import before its first
    write. Standard input is read once, as it is imported (None)."""
    if _stream(file):
        return None  # a pipe (`<(zcat dump.jsonl.gz)`) or a device is read once too
    count = 0
    digest = hashlib.sha256()
    for number, record in _read_lines(file, digest=digest):
        widths.see(number, record)
        count += 1
    return count, digest.hexdigest()


# The namespace of the ids `_given_id` derives (uuid5: a name-based UUID, written as 32 hex digits as
# the servers here write theirs). Fixed for good: a new one would make a rerun duplicate.
_GIVEN_IDS = uuid.UUID("5d7b1c6e-2f43-4a8e-9c61-a2a2e0f1b7d3")


def _given_id(digest: str | None, number: int, owner: Any) -> str:
    """The id a record the file gives none is written with, chosen before its batch is first sent, so
    that sending the batch again (a router refused it while a tier was down) cannot write it twice.

    From a regular file, derived from the file's bytes (`digest`), the line and the record's `owner`:
    importing the same file again after a crash or a refusal skips what was written, as it skips
    records that carry their own ids. Another file, or this one edited, gives other ids, so a record
    is never taken for one it is not; a record repeated on two lines is two records, as the file says;
    the owner keeps one file importable into two named partitions (an id is one owner's). From a
    stream, read once (`digest` None), a fresh id: a second import writes those records again."""
    if digest is None:
        return uuid.uuid4().hex
    return uuid.uuid5(_GIVEN_IDS, f"{digest}:{number}:{orjson.dumps(owner).decode()}").hex


def _stream(file: str) -> bool:
    """Whether `file` is standard input/output or a path to a pipe, socket or terminal: read once,
    written as it comes, never renamed over."""
    if file == "-":
        return True
    try:
        mode = os.stat(file).st_mode
    except OSError:
        return False  # not there yet (an export's new file), or said when it is opened
    return stat.S_ISFIFO(mode) or stat.S_ISCHR(mode) or stat.S_ISSOCK(mode)


def _prepare(record: dict[str, Any], tiers: set[str], keep_tier: bool) -> dict[str, Any]:
    out = {k: v for k, v in record.items() if k != "score" and v is not None}
    if not keep_tier or out.get("tier") not in tiers:
        out.pop("tier", None)  # the target has no writable tier of that name: let it place the record
    return out


def _tier_named(exc: Any) -> tuple[str, bool] | None:
    """The tier a router's -32603 names (router/federation.py), and whether it answered the router
    something that is not an A2M reply (router/replies.py `Malformed`: its data names the `method`
    too; the router words both alike, "tier X unavailable"), or None."""
    from a2m import errors

    data = exc.data if isinstance(exc.data, dict) else {}
    if exc.code != errors.INTERNAL_ERROR or not isinstance(data.get("tier"), str):
        return None
    return data["tier"], "method" in data


def _tier_down(exc: Any) -> str | None:
    """The tier a router's answer says is down, or None. One that answered malformed is up, and
    waiting does not mend it: None too (`_malformed_tier`)."""
    named = _tier_named(exc)
    return named[0] if named is not None and not named[1] else None


def _malformed_tier(exc: Any) -> str | None:
    """The tier a router's answer says answered it something that is not an A2M reply, or None."""
    named = _tier_named(exc)
    return named[0] if named is not None and named[1] else None


async def _remember(client: Any, params: dict[str, Any], waits: Sequence[float], lines: str) -> list[str]:
    """memory/remember of one batch, sent again after each of `waits` while a router answers that one of
    its tiers is down: a tier restarting should not stop a long import, and a rerun would read the
    file from its first line again. Every record carries an id by then (`_given_id`): a second send
    of an id is idempotent, so nothing is written twice."""
    from a2m.errors import A2MError

    for wait in waits:
        try:
            return (await client.call("memory/remember", params))["ids"]
        except A2MError as exc:
            tier = _tier_down(exc)
            if tier is None:
                raise
            print(f"a2m import: tier {tier} is unavailable; sending {lines} again in {wait:g} s", file=sys.stderr)
            await asyncio.sleep(wait)
    return (await client.call("memory/remember", params))["ids"]


async def import_(url: str, file: str, token: str | None = None, batch: int = 500, quiet: bool = False,
                  tier_wait: float = TIER_WAIT) -> int:
    """Write the records of a JSON Lines export to `url` in `memory/remember` batches; `tier_wait`, how
    long a tier a router answers without may take to come back."""
    from a2m.client import Unavailable
    from a2m.errors import A2MError

    kept = 0
    done = _Written(file, url)
    try:
        if file == "-" and sys.stdin.isatty():
            raise TransferError("standard input is a terminal: pipe the export in "
                                f"(a2m import {url} - < dump.jsonl), or name the file")
        widths = _Widths(file)
        checked = _check_file(file, widths)
        total, digest = checked if checked is not None else (None, None)
        async with _client(url, token, 120.0) as client:
            described = await _describe(client)
            dimensions = (described.get("embeddings") or {}).get("dimensions")
            problem = widths.problem(dimensions, url)
            if problem:  # a regular file: every line was read, nothing is written yet
                raise TransferError(problem)
            listed = [t for t in described.get("tiers") or [] if t.get("name")]
            # A record keeps its tier where the target has a writable one of that name; one the target
            # mounts read-only (a corpus) cannot take it, so the target places it: where the corpus
            # already holds it, as an existing id (nothing written), else in writable memory.
            tiers = {t["name"] for t in listed if not t.get("read_only")}
            if listed and not tiers:
                mounted = ", ".join(t["name"] for t in listed)
                raise TransferError(f"{url} takes no writes: tier{'s' if len(listed) > 1 else ''} {mounted} "
                                    f"{'are' if len(listed) > 1 else 'is'} read-only (mounted, not stored "
                                    "there); import into a writable endpoint")
            keep_tier = "tiers" in (described.get("capabilities") or [])
            cap = (described.get("limits") or {}).get("max_records_per_call")
            size = max(1, min(batch, int(cap)) if cap else batch)
            progress = _progress()
            with progress if not quiet else contextlib.nullcontext():
                task = None if quiet else progress.add_task(f"import into {described.get('name') or url}",
                                                            total=total)
                window = _Window(size, done)

                async def send(bucket: _Bucket) -> None:
                    nonlocal kept
                    params: dict[str, Any] = {"records": bucket.records}
                    if bucket.owner is not None:
                        params["owner"] = bucket.owner
                    lines, given = bucket.lines, bucket.given
                    said = window.said(bucket)
                    window.take(bucket)
                    done.in_flight = (lines[0], lines[-1])
                    done.in_flight_said = None if said == _span(lines[0], lines[-1]) else said
                    waits = paging.waits_within(tier_wait)  # every record has an id: a resend is idempotent
                    try:
                        ids = await _remember(client, params, waits, said)
                    except Unavailable:
                        raise  # no answer: the batch may have been written (done.in_flight says which)
                    except A2MError as exc:
                        done.in_flight = done.in_flight_said = None  # refused: a batch is written whole or not
                        down = _tier_down(exc)
                        if down:
                            raise TransferError(f"tier {down} did not come back within {tier_wait:g} s; "
                                                "import again when it is back") from None
                        held = _given_id_held(exc, given)
                        if held is not None:
                            raise TransferError(
                                f"{file}:{lines[held]}: the id it was given (it has none, so its id comes from "
                                "the file and the line: importing the file again skips it) is another owner's: "
                                "the file was imported under another principal's token; to write its records "
                                f"for this one too, import it from standard input (a2m import {url} - < "
                                f"{shlex.quote(file)}), which gives fresh ids; its batch ({said}) was not "
                                "written") from None
                        wrong = _malformed_tier(exc)
                        if wrong:  # up, and answering what waiting does not mend: said now, not in 30 s
                            raise TransferError(
                                f"{_at(file, lines)}: tier {wrong} answered the router's memory/remember with a "
                                "malformed reply (the router's log has it): fix that tier's server, then import "
                                f"again; {_this_batch(said, lines)} was not written") from None
                        raise TransferError(_refused(file, lines, bucket.records, exc, said)) from None
                    done.in_flight = done.in_flight_said = None
                    done.records += len(bucket.records)
                    window.written(bucket)
                    if digest is None:  # from a stream: those ids were fresh, a rerun writes them again
                        done.without_id += sum(given)
                    # A given id answered with another is a key replaced in place (its id kept), not kept
                    kept += sum(1 for r, i, g in zip(bucket.records, ids, given) if not g and r["id"] != i)
                    if not quiet:
                        progress.advance(task, len(bucket.records))

                for number, record in _read_lines(file, check=total is None):
                    if total is None:  # read once: its widths are checked as they come, before their batch
                        widths.see(number, record)
                        problem = widths.problem(dimensions, url)
                        if problem:
                            raise TransferError(problem)
                    prepared = _prepare(record, tiers, keep_tier)
                    made = "id" not in prepared  # none, or null
                    if made:
                        prepared["id"] = _given_id(digest, number, record.get("owner"))
                    weight = len(orjson.dumps(prepared)) + 1
                    # A fresh id (from a stream) is sent only once every line before it is: a rerun from
                    # the first unwritten line then writes no record twice (`_Window`).
                    for bucket in window.before(record, fresh=made and digest is None):
                        await send(bucket)
                    bucket = window.buckets.get(record.get("owner"))
                    # An id seen again (a record the export caught in two tiers, mid-move) starts a
                    # new batch: one batch may not put an id in two tiers, while a later batch finds
                    # it written and keeps it (an existing id is an idempotent write).
                    if bucket is not None and (len(bucket.records) >= size or record.get("id") in bucket.ids
                                               or bucket.bytes + weight > BATCH_BYTES):
                        await send(bucket)
                    while (oldest := window.crowded(weight)) is not None:
                        await send(oldest)
                    window.add(number, record, prepared, made, weight)
                while (oldest := window.oldest()) is not None:
                    await send(oldest)
    except asyncio.CancelledError:  # Ctrl-C: asyncio.run cancels this task, then raises KeyboardInterrupt
        print(f"a2m import: interrupted; {done}", file=sys.stderr)
        raise
    except TransferError as exc:
        print(f"a2m import: {exc}; {done}", file=sys.stderr)
        return 1
    except A2MError as exc:
        print(f"a2m import: {endpoint_problem(url, exc, token)}; {done}", file=sys.stderr)
        return 1
    except OSError as exc:  # the file cannot be read, or a stdio server's command cannot be run
        print(f"a2m import: {_os_error(exc)}; {done}", file=sys.stderr)
        return 1
    if not quiet:
        note = f"; {kept} kept a newer record already at their key" if kept else ""
        # Not "N written": a remember answers an id it held already as written, without telling them apart.
        print(f"imported {done.records} records into {url}: each is there now (one whose id was there already "
              f"was left as it was){note}", file=sys.stderr)
    return 0
