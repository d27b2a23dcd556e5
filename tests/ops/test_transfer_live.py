"""`a2m export` of a federation taking writes while it runs: the router over real tier servers, with
writes made between the export's own timeline pages (a hook on its client, a tiny page size), so the
interleaving is exact. A record that existed throughout is in the file once, in a version at least
as new as when the export began."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Awaitable, Callable

import orjson
import pytest

from a2m.client import HTTPClient
from a2mctl import transfer
from tests.router.stack import federation

pytestmark = pytest.mark.timeout(180)

Hook = Callable[[dict[str, Any], dict[str, Any]], Awaitable[None]]


class _Hooked:
    """The export's client, with `hook(params, result)` awaited after each timeline page it is answered."""

    def __init__(self, inner: Any, hook: Hook) -> None:
        self.inner, self.hook = inner, hook

    async def __aenter__(self) -> "_Hooked":
        await self.inner.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.inner.__aexit__(*exc)

    async def call(self, method: str, params: dict[str, Any] | None = None, **kwargs: Any) -> dict[str, Any]:
        result = await self.inner.call(method, params, **kwargs)
        if method == "memory/timeline":
            await self.hook(params or {}, result)
        return result


def _hook_export(monkeypatch: pytest.MonkeyPatch, hook: Hook) -> None:
    real = transfer._client
    monkeypatch.setattr(transfer, "_client", lambda *a, **k: _Hooked(real(*a, **k), hook))


def _rewrite_city_once(monkeypatch: pytest.MonkeyPatch, url: str, when: Callable[[list[dict[str, Any]]], bool]
                       ) -> list[str]:
    """Hook the export so that `user/city` is rewritten ("city is Rome") once, after the first page of
    working whose records `when` accepts; the list it returns holds the id the rewrite was told."""
    rewritten: list[str] = []

    async def rewrite(params: dict[str, Any], result: dict[str, Any]) -> None:
        if not rewritten and params.get("tier") == "working" and when(result["records"]):
            rewritten.extend(await _remember(url, [{"content": "city is Rome", "key": "user/city"}]))

    _hook_export(monkeypatch, rewrite)
    return rewritten


def _lines(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


async def _remember(url: str, records: list[dict[str, Any]]) -> list[str]:
    async with HTTPClient(url) as client:
        return list((await client.call("memory/remember", {"records": records}))["ids"])


@pytest.mark.anyio
@pytest.mark.parametrize("when", ["before the walk reaches it", "after the walk read it"])
async def test_a_key_rewritten_during_the_export_is_in_the_file_once_in_its_new_version(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, when: str) -> None:
    """A key replacement keeps the id and gives it a new created_at: it moves to the newest end of its
    tier, behind a walk that goes from the newest record back. Before the walk reached it, the file
    lacked it in both versions; after, it held the old one (and an import keeps the first line of an
    id, so appending the new one after it would restore the old)."""
    with federation(tmp_path, [{"name": "working", "kind": "working"}, {"name": "episodic", "kind": "episodic"}],
                    mode="real") as stack:
        (city,) = await _remember(stack.url, [{"content": "city is Paris", "key": "user/city"}])
        notes = await _remember(stack.url, [{"content": f"note {i}"} for i in range(9)])
        rewritten = _rewrite_city_once(monkeypatch, stack.url, lambda records: any(
            r["id"] == city for r in records) == (when == "after the walk read it"))
        out = tmp_path / "live.jsonl"
        assert await transfer.export(stack.url, str(out), quiet=True, page=2) == 0
    assert rewritten == [city]
    lines = _lines(out)
    assert sorted(r["id"] for r in lines) == sorted([city, *notes])  # every record, each once
    (keyed,) = [r for r in lines if r["id"] == city]
    assert (keyed["content"], keyed["revision"]) == ("city is Rome", 2)
    assert [r["created_at"] for r in lines] == sorted(r["created_at"] for r in lines)  # still oldest first


@pytest.mark.anyio
async def test_a_record_moved_into_a_tier_listed_before_its_source_is_in_the_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A move keeps created_at, so a catch-up by time cannot see it: the tier a record leaves must be
    read before the tier it lands in. Here describe lists episodic first, and working spills into it:
    read in describe order, a record promoted out of working once the export had read episodic was
    in neither tier's part of the file."""
    tiers = [{"name": "episodic", "kind": "episodic"}, {"name": "working", "kind": "working", "spill_to": "episodic"}]
    with federation(tmp_path, tiers, mode="real") as stack:
        deep = await _remember(stack.url, [{"content": f"episode {i}", "tier": "episodic"} for i in range(3)])
        working = await _remember(stack.url, [{"content": f"turn {i}"} for i in range(5)])
        moved: list[str] = []

        async def promote(params: dict[str, Any], result: dict[str, Any]) -> None:
            if moved or params.get("tier") != "working":
                return
            assert working[0] not in {r["id"] for r in result["records"]}  # not on working's first page
            async with HTTPClient(stack.url) as client:
                await client.call("memory/promote", {"ids": [working[0]], "tier": "episodic"})
            moved.append(working[0])

        _hook_export(monkeypatch, promote)
        out = tmp_path / "moved.jsonl"
        assert await transfer.export(stack.url, str(out), quiet=True, page=2) == 0
        async with HTTPClient(stack.url) as client:
            there = (await client.call("memory/timeline", {"tier": "episodic", "limit": 0}))["records"]
    assert moved and working[0] in {r["id"] for r in there}  # the move happened mid-export
    lines = _lines(out)
    assert sorted(r["id"] for r in lines) == sorted(deep + working)
    assert [r["tier"] for r in lines if r["id"] == working[0]] == ["episodic"]


@pytest.mark.anyio
async def test_a_stream_that_keeps_changing_is_said_and_each_id_is_written_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Keys rewritten after every page the export reads: each catch-up pass finds more than a page
    of new records, so the passes stop at their bound and say so on stderr (a key rewritten during
    the last pass before it was read may be missing: that is what is said); the records that sat
    still are all there, and no id is written twice."""
    with federation(tmp_path, [{"name": "working", "kind": "working"}, {"name": "episodic", "kind": "episodic"}],
                    mode="real") as stack:
        keyed = await _remember(stack.url, [{"content": f"k{i} v0", "key": f"k/{i}"} for i in range(3)])
        plain = await _remember(stack.url, [{"content": f"note {i}"} for i in range(4)])
        rounds = [0]

        async def churn(params: dict[str, Any], result: dict[str, Any]) -> None:
            if params.get("tier") == "working":
                rounds[0] += 1
                await _remember(stack.url, [{"content": f"k{i} v{rounds[0]}", "key": f"k/{i}"} for i in range(3)])

        _hook_export(monkeypatch, churn)
        out = tmp_path / "churn.jsonl"
        assert await transfer.export(stack.url, str(out), quiet=True, page=2) == 0
    assert "still being written after 5 catch-up passes" in capsys.readouterr().err
    ids = [r["id"] for r in _lines(out)]
    assert len(ids) == len(set(ids)) and set(plain) <= set(ids) <= set(keyed + plain)


@pytest.mark.anyio
async def test_a_quiet_tier_whose_newest_millisecond_fills_a_page_settles_at_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """One remember call stamps all its records with one created_at, so a tier's last batch of a page
    or more (max_records_per_call is max_recall_limit, 1,000, here) fills the newest millisecond:
    every catch-up pass from it was two pages (a full page has a cursor, the next is empty), so with
    nothing written the export read it five more times and said records were still being written."""
    with federation(tmp_path, [{"name": "working", "kind": "working"}, {"name": "episodic", "kind": "episodic"}],
                    mode="real") as stack:
        notes = await _remember(stack.url, [{"content": f"note {i}"} for i in range(3)])
        batch = await _remember(stack.url, [{"content": f"bulk {i}"} for i in range(2)])  # one stamp
        pages: list[dict[str, Any]] = []

        async def count(params: dict[str, Any], result: dict[str, Any]) -> None:
            if params.get("tier") == "working":
                pages.append(params)

        _hook_export(monkeypatch, count)
        out = tmp_path / "quiet.jsonl"
        assert await transfer.export(stack.url, str(out), quiet=True, page=2) == 0
    assert "still being written" not in capsys.readouterr().err
    assert sorted(r["id"] for r in _lines(out)) == sorted(notes + batch)
    assert len([p for p in pages if "after" in p]) == 1  # one catch-up page: the front as the walk left it


@pytest.mark.anyio
async def test_a_key_rewritten_behind_a_full_newest_millisecond_is_caught_up(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The front seen again ends a pass only when nothing came in front of it: a key rewritten before
    the walk reached it, behind a newest millisecond that fills a page, is still read by a later pass."""
    with federation(tmp_path, [{"name": "working", "kind": "working"}, {"name": "episodic", "kind": "episodic"}],
                    mode="real") as stack:
        (city,) = await _remember(stack.url, [{"content": "city is Paris", "key": "user/city"}])
        notes = await _remember(stack.url, [{"content": f"note {i}"} for i in range(3)])
        batch = await _remember(stack.url, [{"content": f"bulk {i}"} for i in range(2)])  # one stamp
        rewritten = _rewrite_city_once(monkeypatch, stack.url, lambda records: True)
        out = tmp_path / "behind.jsonl"
        assert await transfer.export(stack.url, str(out), quiet=True, page=2) == 0
    assert rewritten == [city]
    lines = _lines(out)
    assert sorted(r["id"] for r in lines) == sorted([city, *notes, *batch])
    assert [r["content"] for r in lines if r["id"] == city] == ["city is Rome"]


@pytest.mark.anyio
async def test_a_record_stamped_in_the_future_does_not_blind_the_catch_up(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A caller may set `created_at` in the future. Taken as the next pass's bound, 2099 put every write
    made during the export before it: the key rewritten before the walk reached it was in neither version."""
    with federation(tmp_path, [{"name": "working", "kind": "working"}, {"name": "episodic", "kind": "episodic"}],
                    mode="real") as stack:
        (city,) = await _remember(stack.url, [{"content": "city is Paris", "key": "user/city"}])
        notes = await _remember(stack.url, [{"content": f"note {i}"} for i in range(5)])
        (later,) = await _remember(stack.url, [{"content": "reminder", "created_at": "2099-01-01T00:00:00.000Z"}])
        rewritten = _rewrite_city_once(monkeypatch, stack.url, lambda records: city not in {r["id"] for r in records})
        out = tmp_path / "future.jsonl"
        assert await transfer.export(stack.url, str(out), quiet=True, page=2) == 0
    assert rewritten == [city]
    assert sorted(r["id"] for r in _lines(out)) == sorted([city, *notes, later])
    assert [r["content"] for r in _lines(out) if r["id"] == city] == ["city is Rome"]
