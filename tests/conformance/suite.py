"""The A2M conformance checks, grouped by capability.

A check runs only when the server declared its capability (skipping is not
failing) and fails when a declared behaviour is not honoured. Every MUST of the
protocol brief has a check here; each check creates its own data under a fresh
marker so checks never see each other's records.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from .wire import HTTPTransport, RPCError, StdioTransport, Transport

TIMESTAMP = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$")
CORE_METHODS = ["memory/describe", "memory/remember", "memory/recall", "memory/timeline", "memory/forget"]
CAPABILITY_METHODS = {
    "tiers": ["memory/promote", "memory/consolidate"],
    "salience": ["memory/reinforce"],
    "sessions": ["memory/session/list", "memory/session/close"],
    "keys": ["memory/fetch"],
    "events": ["memory/events", "memory/events/subscribe", "memory/events/unsubscribe"],
    "summarize": ["memory/summarize"],
}


class CheckFailed(AssertionError):
    pass


class Skip(Exception):
    pass


def expect(condition: bool, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


@dataclass
class Check:
    group: str
    name: str
    fn: Callable[["Session"], Awaitable[None]]
    needs: tuple[str, ...] = ()
    transport: str | None = None  # "http" / "stdio" for transport-specific rules
    writes: bool = False  # needs a writable server


CHECKS: list[Check] = []


def check(group: str, name: str, *, needs: tuple[str, ...] = (), transport: str | None = None,
          writes: bool = False) -> Callable[[Callable[["Session"], Awaitable[None]]], Callable[["Session"], Awaitable[None]]]:
    def register(fn: Callable[["Session"], Awaitable[None]]) -> Callable[["Session"], Awaitable[None]]:
        CHECKS.append(Check(group, name, fn, needs or ((group,) if group in CAPABILITY_METHODS or group in
                                                      ("scopes", "embeddings", "external", "prompt") else ()),
                            transport, writes))
        return fn
    return register


@dataclass
class Session:
    t: Transport
    describe: dict[str, Any]
    read_only: bool = False
    run: str = field(default_factory=lambda: uuid.uuid4().hex[:10])

    @property
    def caps(self) -> set[str]:
        return set(self.describe.get("capabilities", []))

    def marker(self) -> str:
        """A unique searchable word (letters only, so every tokenizer keeps it whole)."""
        return "zq" + "".join(chr(ord("a") + int(c, 16) % 26) for c in uuid.uuid4().hex[:10])

    def dims(self) -> int:
        emb = self.describe.get("embeddings") or {}
        return emb.get("dimensions") or 8

    async def remember(self, *records: dict[str, Any], **params: Any) -> list[str]:
        result = await self.t.call("memory/remember", {"records": list(records), **params})
        expect(isinstance(result.get("ids"), list) and len(result["ids"]) == len(records),
               f"remember must return one id per record, got {result}")
        return result["ids"]

    async def timeline(self, **params: Any) -> list[dict[str, Any]]:
        return (await self.t.call("memory/timeline", params))["records"]

    async def recall(self, **params: Any) -> list[dict[str, Any]]:
        result = await self.t.call("memory/recall", params)
        expect(isinstance(result.get("records"), list), "recall must return records")
        return result["records"]

    async def error_code(self, method: str, params: Any) -> Any:
        try:
            await self.t.call(method, params)
        except RPCError as exc:
            return exc.code
        return None


async def expect_error(s: Session, method: str, params: Any, codes: tuple[int, ...], what: str) -> None:
    code = await s.error_code(method, params)
    expect(code in codes, f"{what}: expected error {codes}, got {code if code is not None else 'a result'}")


# ---------------------------------------------------------------- envelope

@check("envelope", "a batch (JSON array) is refused with -32600")
async def _batch(s: Session) -> None:
    reply = await s.t.send([{"jsonrpc": "2.0", "id": 1, "method": "memory/describe"}])
    expect(isinstance(reply, dict) and reply.get("error", {}).get("code") == -32600, f"got {reply}")


@check("envelope", "malformed JSON answers -32700")
async def _parse(s: Session) -> None:
    reply = await s.t.send_raw(b'{"jsonrpc": "2.0", "id": 1, "method": ')
    expect(reply.get("error", {}).get("code") == -32700, f"got {reply}")


@check("envelope", "a string id is echoed as the same string")
async def _id_string(s: Session) -> None:
    reply = await s.t.request("memory/describe", {}, id_="req-7")
    expect(reply.get("id") == "req-7" and isinstance(reply.get("id"), str), f"got id {reply.get('id')!r}")


@check("envelope", "a number id is echoed as the same number")
async def _id_number(s: Session) -> None:
    reply = await s.t.request("memory/describe", {}, id_=4711)
    expect(reply.get("id") == 4711 and isinstance(reply.get("id"), int), f"got id {reply.get('id')!r}")


@check("envelope", "a name that is not an A2M method answers -32601")
async def _unknown_method(s: Session) -> None:
    await expect_error(s, "memory/no_such_method", {}, (-32601,), "unknown memory/ name")
    await expect_error(s, "tools/list", {}, (-32601,), "non-memory name")


@check("envelope", "a request without jsonrpc 2.0 answers -32600")
async def _invalid_request(s: Session) -> None:
    reply = await s.t.send({"id": 5, "method": "memory/describe"})
    expect(reply.get("error", {}).get("code") == -32600, f"got {reply}")


@check("envelope", "unknown params are ignored, never rejected")
async def _unknown_params(s: Session) -> None:
    result = await s.t.call("memory/describe", {"x_future_param": {"nested": True}})
    expect(result.get("protocol") == "a2m/0.1", "describe with an unknown param failed")
    await s.recall(query="anything", x_future_param=1)


@check("envelope", "a notification gets no response")
async def _notification(s: Session) -> None:
    if isinstance(s.t, HTTPTransport):
        reply = await s.t.notify("memory/describe", {})
        expect(reply.status == 202 and reply.body == b"", f"HTTP notification: {reply.status} {reply.body[:80]!r}")
    else:
        await s.t.notify("memory/describe", {})
        reply = await s.t.request("memory/describe", {}, id_="after-notification")
        expect(reply.get("id") == "after-notification", f"a response was sent for a notification: {reply}")


# ---------------------------------------------------------------- describe

@check("core", "describe names the protocol, the server, its capabilities and methods")
async def _describe(s: Session) -> None:
    d = s.describe
    expect(d.get("protocol") == "a2m/0.1", f"protocol is {d.get('protocol')!r}")
    expect(isinstance(d.get("name"), str) and d["name"], "name missing")
    expect("core" in d.get("capabilities", []), "core not declared")
    methods = set(d.get("methods", []))
    expect(set(CORE_METHODS) <= methods, f"core methods missing from methods: {set(CORE_METHODS) - methods}")
    for cap, names in CAPABILITY_METHODS.items():
        if cap in s.caps:
            expect(set(names) <= methods, f"{cap} declared but methods lack {set(names) - methods}")


@check("core", "describe with an incompatible protocol answers -32007")
async def _negotiate(s: Session) -> None:
    await expect_error(s, "memory/describe", {"protocol": "a2m/0.9"}, (-32007,), "a2m/0.9")
    await expect_error(s, "memory/describe", {"protocol": "a2m/1.0"}, (-32007,), "a2m/1.0")
    result = await s.t.call("memory/describe", {"protocol": "a2m/0.1"})
    expect(result.get("protocol") == "a2m/0.1", "describe with a2m/0.1 failed")


@check("core", "every method of an undeclared capability answers -32003, never -32601")
async def _gating(s: Session) -> None:
    undeclared = [cap for cap in CAPABILITY_METHODS if cap not in s.caps]
    if not undeclared:
        raise Skip("every capability is declared")
    for cap in undeclared:
        for method in CAPABILITY_METHODS[cap]:
            code = await s.error_code(method, {"ids": ["x"], "tier": "x", "session": "x", "key": "x"})
            expect(code == -32003, f"{method} ({cap} undeclared) answered {code}")


@check("core", "declared capability objects are present and well formed")
async def _capability_objects(s: Session) -> None:
    d = s.describe
    if "tiers" in s.caps:
        tiers = d.get("tiers")
        expect(isinstance(tiers, list) and tiers, "tiers declared but describe.tiers missing")
        for tier in tiers:
            expect(isinstance(tier.get("name"), str) and isinstance(tier.get("count"), int), f"bad tier entry {tier}")
            if tier.get("kind") is not None:
                expect(tier["kind"] in ("working", "episodic", "semantic", "procedural"), f"bad kind {tier['kind']}")
    if "embeddings" in s.caps:
        emb = d.get("embeddings")
        expect(isinstance(emb, dict) and "dimensions" in emb and isinstance(emb.get("metric"), str),
               f"embeddings object malformed: {emb}")
    if "events" in s.caps:
        expect(isinstance((d.get("events") or {}).get("push"), bool), "events.push missing")
    if "summarize" in s.caps:
        expect(isinstance(d.get("summarize"), dict) and "model" in d["summarize"], "summarize object missing")
    if "prompt" in s.caps:
        p = d.get("prompt") or {}
        expect(isinstance(p.get("styles"), list) and isinstance(p.get("methods"), list), f"prompt object malformed: {p}")


@check("core", "declared limits are enforced", writes=True)
async def _limits(s: Session) -> None:
    limits = s.describe.get("limits") or {}
    if not limits:
        raise Skip("no limits declared")
    m = s.marker()
    if limits.get("max_records_per_call"):
        n = limits["max_records_per_call"] + 1
        await expect_error(s, "memory/remember", {"records": [{"content": f"{m} {i}"} for i in range(n)]},
                           (-32602, -32006), "max_records_per_call + 1")
    if limits.get("max_content_length"):
        await expect_error(s, "memory/remember", {"records": [{"content": "x" * (limits["max_content_length"] + 1)}]},
                           (-32602, -32006), "max_content_length + 1")
    if limits.get("max_recall_limit"):
        await expect_error(s, "memory/recall", {"query": m, "limit": limits["max_recall_limit"] + 1},
                           (-32602, -32006), "max_recall_limit + 1")
    found = await s.recall(query=m)
    expect(not found, "a refused batch wrote records")


# ---------------------------------------------------------------- core records

@check("core", "remember returns one id per record, in order, and records round-trip", writes=True)
async def _roundtrip(s: Session) -> None:
    m = s.marker()
    metadata = {"nested": {"list": [1, 2.5, "three", None, True]}, "unicode": "città 東京 ✓", "run": s.run, "m": m}
    ids = await s.remember({"content": f"{m} first", "role": "user", "metadata": metadata, "group": f"g-{m}"},
                           {"content": f"{m} second", "role": "assistant", "metadata": {"m": m}})
    expect(len(set(ids)) == 2 and all(isinstance(i, str) and i for i in ids), f"bad ids {ids}")
    records = await s.timeline(where={"m": m})
    expect([r["id"] for r in records] == ids, f"timeline ids {[r['id'] for r in records]} != written {ids}")
    first = records[0]
    expect(first["content"] == f"{m} first", "content changed")
    expect(first.get("metadata") == metadata, f"metadata not round-tripped: {first.get('metadata')}")
    expect(first.get("role") == "user" and first.get("group") == f"g-{m}", "role or group lost")
    for r in records:
        expect(isinstance(r.get("created_at"), str) and TIMESTAMP.match(r["created_at"]) is not None,
               f"created_at {r.get('created_at')!r} is not RFC 3339 UTC with milliseconds and Z")


@check("core", "a record without content is refused with -32602", writes=True)
async def _content_required(s: Session) -> None:
    await expect_error(s, "memory/remember", {"records": [{"role": "user"}]}, (-32602,), "missing content")
    await expect_error(s, "memory/remember", {"records": [{"content": 42}]}, (-32602,), "numeric content")
    await expect_error(s, "memory/remember", {"records": []}, (-32602,), "empty batch")
    await expect_error(s, "memory/remember", {}, (-32602,), "no records")
    await expect_error(s, "memory/remember", {"records": ["just a string"]}, (-32602,), "record not an object")


@check("core", "a batch with one bad record writes nothing", writes=True)
async def _atomic(s: Session) -> None:
    m = s.marker()
    code = await s.error_code("memory/remember", {"records": [
        {"content": f"{m} good one", "metadata": {"m": m}}, {"content": None, "metadata": {"m": m}},
        {"content": f"{m} good two", "metadata": {"m": m}}]})
    expect(code == -32602, f"expected -32602, got {code}")
    expect(not await s.timeline(where={"m": m}), "part of a refused batch was written")
    expect(not await s.recall(query=m), "part of a refused batch is recallable")


@check("core", "metadata that is not an object is refused, never dropped", writes=True)
async def _metadata_type(s: Session) -> None:
    m = s.marker()
    await expect_error(s, "memory/remember", {"records": [{"content": m, "metadata": "oops"}]}, (-32602,), "string metadata")
    await expect_error(s, "memory/remember", {"records": [{"content": m, "metadata": [1, 2]}]}, (-32602,), "array metadata")


@check("core", "a client-supplied id is idempotent", writes=True)
async def _idempotent(s: Session) -> None:
    m = s.marker()
    rid = f"client-{m}"
    first = await s.remember({"id": rid, "content": f"{m} once", "metadata": {"m": m}})
    again = await s.remember({"id": rid, "content": f"{m} once", "metadata": {"m": m}})
    expect(first == [rid] and again == [rid], f"ids {first} {again}")
    records = await s.timeline(where={"m": m})
    expect(len(records) == 1, f"{len(records)} records for one client id")


@check("core", "recall finds what was written, ordered by descending score", writes=True)
async def _recall(s: Session) -> None:
    m = s.marker()
    other = s.marker()
    await s.remember({"content": f"the {m} sat on the mat", "metadata": {"m": m}},
                     {"content": f"an unrelated {other} sentence", "metadata": {"m": m}},
                     {"content": f"{m} {m} again and {m}", "metadata": {"m": m}})
    found = await s.recall(query=m, limit=10)
    contents = [r["content"] for r in found]
    expect(any(m in c for c in contents), f"recall for {m} did not find it: {contents}")
    expect(not any(other in c and m not in c for c in contents[:2]) or len(contents) > 2,
           "an unrelated record outranked the matches")
    scores = [r.get("score") for r in found]
    expect(all(isinstance(x, (int, float)) for x in scores), f"scores must be numbers: {scores}")
    expect(scores == sorted(scores, reverse=True), f"scores not descending: {scores}")


@check("core", "recall without a query is not an error", writes=True)
async def _recall_no_query(s: Session) -> None:
    m = s.marker()
    await s.remember({"content": f"{m} recent", "metadata": {"m": m}})
    found = await s.recall(where={"m": m}, limit=5)
    expect(len(found) == 1, f"recall with where and no query found {len(found)}")


@check("core", "timeline is ascending by created_at; with limit, the most recent, still ascending", writes=True)
async def _timeline(s: Session) -> None:
    m = s.marker()
    ids = []
    for i in range(5):
        ids += await s.remember({"content": f"{m} turn {i}", "metadata": {"m": m, "i": i}})
        await asyncio.sleep(0.003)
    records = await s.timeline(where={"m": m})
    expect([r["id"] for r in records] == ids, f"timeline order {[r['metadata'].get('i') for r in records]}")
    stamps = [r["created_at"] for r in records]
    expect(stamps == sorted(stamps), "created_at not ascending")
    last = await s.timeline(where={"m": m}, limit=2)
    expect([r["id"] for r in last] == ids[-2:], f"limit 2 gave {[r['metadata'].get('i') for r in last]}, want [3, 4]")


@check("core", "where: equality on fields and metadata, arrays mean any of", writes=True)
async def _where(s: Session) -> None:
    m = s.marker()
    await s.remember({"content": f"{m} a", "role": "user", "metadata": {"m": m, "color": "red"}},
                     {"content": f"{m} b", "role": "assistant", "metadata": {"m": m, "color": "blue"}},
                     {"content": f"{m} c", "role": "tool", "metadata": {"m": m, "color": "green"}})
    red = await s.timeline(where={"m": m, "color": "red"})
    expect([r["content"] for r in red] == [f"{m} a"], f"metadata equality gave {[r['content'] for r in red]}")
    some = await s.timeline(where={"m": m, "role": ["user", "tool"]})
    expect(sorted(r["content"] for r in some) == [f"{m} a", f"{m} c"], "any-of on a field failed")
    hits = await s.recall(query=m, where={"m": m, "color": ["blue"]})
    expect([r["content"] for r in hits] == [f"{m} b"], f"where on recall gave {[r['content'] for r in hits]}")


@check("core", "forget by ids removes exactly those; no selector is -32602", writes=True)
async def _forget(s: Session) -> None:
    m = s.marker()
    ids = await s.remember(*[{"content": f"{m} {i}", "metadata": {"m": m}} for i in range(3)])
    result = await s.t.call("memory/forget", {"ids": ids[:2]})
    expect(result.get("forgotten") == 2, f"forgotten = {result.get('forgotten')}")
    left = await s.timeline(where={"m": m})
    expect([r["id"] for r in left] == ids[2:], "wrong records forgotten")
    await expect_error(s, "memory/forget", {}, (-32602,), "forget with no selector")
    expect(len(await s.timeline(where={"m": m})) == 1, "forget with no selector deleted something")


@check("core", "a tier on a record without the tiers capability answers -32003", writes=True)
async def _tier_field(s: Session) -> None:
    if "tiers" in s.caps:
        raise Skip("tiers declared")
    await expect_error(s, "memory/remember", {"records": [{"content": "x", "tier": "episodic"}]}, (-32003,), "tier field")


@check("core", "wrong param types answer -32602", writes=False)
async def _param_types(s: Session) -> None:
    await expect_error(s, "memory/recall", {"query": 5}, (-32602,), "numeric query")
    await expect_error(s, "memory/recall", {"limit": "ten"}, (-32602,), "string limit")
    await expect_error(s, "memory/timeline", {"where": "x"}, (-32602,), "string where")
    if not s.read_only:
        await expect_error(s, "memory/forget", {"ids": "x"}, (-32602,), "string ids")


def nested(levels: int, leaf: Any = 0) -> Any:
    """A JSON value `levels` containers deep (objects and arrays in turn) around `leaf`."""
    value = leaf
    for i in range(levels):
        value = [value] if i % 2 else {"x": value}
    return value


async def expect_nothing_written(s: Session, m: str, what: str) -> None:
    expect(not await s.timeline(where={"m": m}), f"{what}: a refused write stored a record")
    expect(not await s.recall(query=m), f"{what}: a refused write is recallable")


@check("core", "text holding NUL (\\u0000) is refused with -32602 and nothing is written", writes=True)
async def _nul_text(s: Session) -> None:
    m = s.marker()
    bad = {"content": f"{m} nul\u0000here", "role": "us\u0000er", "group": "g\u0000",
           "id": f"id-{m}\u0000"}
    for name, value in bad.items():
        record = {"content": f"{m} fine", "metadata": {"m": m}, name: value}
        await expect_error(s, "memory/remember", {"records": [record]}, (-32602,), f"NUL in {name}")
    for metadata in ({"m": m, "k\u0000": 1}, {"m": m, "v": "a\u0000b"}, {"m": m, "v": [{"deep": ["x\u0000"]}]},
                     {"m": m, "v": {"in\u0000side": True}}):
        await expect_error(s, "memory/remember", {"records": [{"content": f"{m} fine", "metadata": metadata}]},
                           (-32602,), f"NUL in metadata {metadata}")
    await expect_nothing_written(s, m, "NUL")


@check("core", "metadata nested deeper than 32 levels is refused; 32 levels round-trip", writes=True)
async def _metadata_depth(s: Session) -> None:
    m = s.marker()
    too_deep = {"m": m, "d": nested(32)}  # the metadata object is the first level
    await expect_error(s, "memory/remember", {"records": [{"content": f"{m} deep", "metadata": too_deep}]},
                       (-32602,), "metadata 33 levels deep")
    await expect_nothing_written(s, m, "deep metadata")
    deepest = {"m": m, "d": nested(31, "leaf")}
    await s.remember({"content": f"{m} deepest allowed", "metadata": deepest})
    records = await s.timeline(where={"m": m})
    expect([r["metadata"] for r in records] == [deepest], "32-level metadata did not round-trip")


@check("core", "a timestamp outside years 0001-9999 in UTC is -32602 (created_at, after, before)", writes=True)
async def _timestamp_range(s: Session) -> None:
    m = s.marker()
    for stamp in ("9999-12-31T23:30:00-01:00", "0001-01-01T00:30:00+01:00"):
        await expect_error(s, "memory/remember", {"records": [{"content": m, "metadata": {"m": m},
                                                               "created_at": stamp}]}, (-32602,), f"created_at {stamp}")
        await expect_error(s, "memory/timeline", {"after": stamp}, (-32602,), f"after {stamp}")
        await expect_error(s, "memory/recall", {"query": m, "before": stamp}, (-32602,), f"before {stamp}")
    await expect_nothing_written(s, m, "out-of-range created_at")


@check("core", "where tests the record fields content and owner before metadata keys", writes=True)
async def _where_fields(s: Session) -> None:
    m = s.marker()
    await s.remember({"content": f"{m} a", "metadata": {"m": m, "owner": "meta", "content": f"{m} b"}},
                     {"content": f"{m} b", "metadata": {"m": m}})
    hits = await s.timeline(where={"m": m, "content": f"{m} b"})
    expect([r["content"] for r in hits] == [f"{m} b"], f"where content gave {[r['content'] for r in hits]}")
    found = await s.recall(query=m, where={"m": m, "content": [f"{m} a", "other"]})
    expect([r["content"] for r in found] == [f"{m} a"], f"where content on recall gave {[r['content'] for r in found]}")
    expect(not await s.timeline(where={"m": m, "owner": "meta"}), "where owner compared a metadata key")
    own = hits[0].get("owner")  # null, or the authenticated principal
    same = await s.timeline(where={"m": m, "owner": own})
    expect(len(same) == 2, f"where owner: {own!r} (the records' own) matched {len(same)} of 2")


@check("core", "a read selector holding NUL matches nothing (never an error)", writes=True)
async def _nul_selectors(s: Session) -> None:
    m = s.marker()
    await s.remember({"content": f"{m} present", "metadata": {"m": m}})
    forgot = await s.t.call("memory/forget", {"ids": [f"{m}\u0000"]})
    expect(forgot.get("forgotten") == 0, f"forget of a NUL id: {forgot}")
    expect(not await s.timeline(where={"m": f"{m}\u0000"}), "a NUL where value matched")
    expect(not await s.recall(query=m, where={"m\u0000": m}), "a NUL where key matched")
    expect(len(await s.timeline(where={"m": m, "k\u0000": None})) == 1, "an absent (NUL) key is not null")
    expect(len(await s.timeline(where={"m": m})) == 1, "a NUL selector deleted something")


# ---------------------------------------------------------------- read-only

@check("read-only", "a read-only server refuses both write methods with -32004 and still serves reads")
async def _read_only(s: Session) -> None:
    if not s.read_only:
        raise Skip("server accepts writes")
    await expect_error(s, "memory/forget", {"ids": ["x"]}, (-32004,), "forget on a read-only server")
    await expect_error(s, "memory/remember", {"records": [{"content": "x"}]}, (-32004,), "remember again")
    if "summarize" in s.caps:
        await expect_error(s, "memory/summarize", {"query": "x"}, (-32004,), "summarize on a read-only server")
    await s.recall(query="anything")
    await s.timeline(limit=1)


# ---------------------------------------------------------------- scopes

@check("scopes", "owner partitions data: another owner sees nothing", writes=True)
async def _scopes(s: Session) -> None:
    m = s.marker()
    await s.remember({"content": f"{m} private", "metadata": {"m": m}}, owner=f"alice-{s.run}")
    expect(await s.recall(query=m, owner=f"alice-{s.run}"), "the owner cannot recall its own record")
    expect(not await s.recall(query=m, owner=f"bob-{s.run}"), "another owner recalled the record")
    expect(not await s.timeline(where={"m": m}, owner=f"bob-{s.run}"), "another owner saw it in timeline")


@check("scopes", "a client id used by one owner never overwrites another owner's record", writes=True)
async def _scopes_ids(s: Session) -> None:
    m = s.marker()
    rid = f"shared-id-{m}"
    await s.remember({"id": rid, "content": f"{m} alice original"}, owner=f"alice-{s.run}")
    try:
        await s.remember({"id": rid, "content": f"{m} bob intruder"}, owner=f"bob-{s.run}")
    except RPCError:
        pass  # refusing is fine; silently replacing alice's record is not
    mine = await s.recall(query=m, owner=f"alice-{s.run}")
    expect([r["content"] for r in mine] == [f"{m} alice original"], f"alice's record became {mine}")


@check("scopes", "where owner is tested inside the call's partition, never widening it; a NUL owner sees nothing",
       writes=True)
async def _scopes_where_owner(s: Session) -> None:
    m = s.marker()
    alice, bob = f"alice-{s.run}", f"bob-{s.run}"
    await s.remember({"content": f"{m} alice's", "metadata": {"m": m}}, owner=alice)
    expect(len(await s.timeline(where={"m": m, "owner": alice}, owner=alice)) == 1, "where owner: self found nothing")
    expect(len(await s.timeline(where={"m": m, "owner": [bob, alice]}, owner=alice)) == 1, "where owner any-of failed")
    expect(not await s.timeline(where={"m": m, "owner": bob}, owner=alice), "where owner: another owner matched")
    expect(not await s.timeline(where={"m": m, "owner": None}, owner=alice), "where owner: null matched an owner")
    expect(not await s.timeline(where={"m": m, "owner": alice}, owner=bob), "where owner widened the partition")
    expect(not await s.recall(query=m, owner=f"{alice}\u0000"), "an owner with NUL recalled a record")
    expect(not await s.timeline(where={"m": m}, owner=f"{alice}\u0000"), "an owner with NUL saw a record")
    await expect_error(s, "memory/remember", {"records": [{"content": f"{m} nul owner"}], "owner": f"{bob}\u0000"},
                       (-32602,), "remember with an owner holding NUL")


# ---------------------------------------------------------------- sessions

@check("sessions", "a session replays alone; list counts it; close never destroys; unknown close is a no-op", writes=True)
async def _sessions(s: Session) -> None:
    m = s.marker()
    session, other = f"s-{m}", f"o-{m}"
    for i in range(3):
        await s.remember({"content": f"{m} turn {i}", "session": session, "role": "user"},
                         {"content": f"{m} noise {i}", "session": other})
    replay = await s.timeline(where={"session": session})
    expect([r["content"] for r in replay] == [f"{m} turn {i}" for i in range(3)], "session replay wrong")
    expect(all(r.get("session") == session for r in replay), "session field lost")
    listed = (await s.t.call("memory/session/list", {}))["sessions"]
    entry = next((e for e in listed if e.get("session") == session), None)
    expect(entry is not None and entry.get("records") == 3, f"session/list entry {entry}")
    closed = await s.t.call("memory/session/close", {"session": session})
    expect(closed.get("closed") == session and isinstance(closed.get("flushed"), int), f"close result {closed}")
    after = await s.recall(query=m, limit=20)
    expect(sum(1 for r in after if r.get("session") == session) == 3, "closing a session destroyed records")
    unknown = await s.t.call("memory/session/close", {"session": f"never-{m}"})
    expect(unknown.get("closed") == f"never-{m}", f"unknown session close: {unknown}")
    await expect_error(s, "memory/session/close", {}, (-32602,), "close without session")
    await expect_error(s, "memory/session/close", {"session": ""}, (-32602,), "close with empty session")


# ---------------------------------------------------------------- keys

@check("keys", "writing an occupied key replaces it: same id, revision + 1; fetch finds it", writes=True)
async def _keys(s: Session) -> None:
    m = s.marker()
    key = f"app/{m}/user/city"
    first = await s.remember({"content": f"{m} lives in Bologna", "key": key})
    second = await s.remember({"content": f"{m} lives in Milan", "key": key})
    expect(first == second, f"replacement changed the id: {first} -> {second}")
    record = (await s.t.call("memory/fetch", {"key": key}))["record"]
    expect(record is not None and record["content"] == f"{m} lives in Milan", f"fetch gave {record}")
    expect(record.get("revision") == 2 and record.get("key") == key, f"revision {record.get('revision')}")
    hits = await s.recall(query=f"{m} Bologna Milan", limit=10)
    expect([h["content"] for h in hits if m in h["content"]] == [f"{m} lives in Milan"], "old version still recalled")
    missing = await s.t.call("memory/fetch", {"key": f"app/{m}/unused"})
    expect(missing.get("record") is None, "an unused key must give null")
    await expect_error(s, "memory/fetch", {}, (-32602,), "fetch without key")
    await expect_error(s, "memory/fetch", {"key": ""}, (-32602,), "fetch with empty key")


@check("keys", "key_prefix scopes recall, timeline and forget", writes=True)
async def _key_prefix(s: Session) -> None:
    m = s.marker()
    await s.remember({"content": f"{m} one", "key": f"{m}/a/1"}, {"content": f"{m} two", "key": f"{m}/a/2"},
                     {"content": f"{m} three", "key": f"{m}/b/1"})
    tl = await s.timeline(key_prefix=f"{m}/a/")
    expect(sorted(r["key"] for r in tl) == [f"{m}/a/1", f"{m}/a/2"], f"timeline key_prefix gave {[r['key'] for r in tl]}")
    hits = await s.recall(query=m, key_prefix=f"{m}/b/")
    expect([r["key"] for r in hits] == [f"{m}/b/1"], "recall key_prefix wrong")
    gone = await s.t.call("memory/forget", {"key_prefix": f"{m}/a/"})
    expect(gone.get("forgotten") == 2, f"forget key_prefix forgot {gone}")
    expect([r["key"] for r in await s.timeline(key_prefix=f"{m}/")] == [f"{m}/b/1"], "forget key_prefix over-deleted")


@check("keys", "a key holding NUL: remember is -32602, fetch is null, key_prefix matches nothing", writes=True)
async def _keys_nul(s: Session) -> None:
    m = s.marker()
    await expect_error(s, "memory/remember", {"records": [{"content": f"{m} k", "key": f"{m}/\u0000"}]},
                       (-32602,), "a key with NUL")
    expect(not await s.recall(query=m), "the refused keyed record was written")
    missing = await s.t.call("memory/fetch", {"key": f"{m}/\u0000"})
    expect(missing.get("record") is None, f"fetch of a NUL key: {missing}")
    expect(not await s.timeline(key_prefix=f"{m}\u0000"), "a NUL key_prefix matched")


@check("keys", "revision beyond 2**53 - 1 is refused with -32602 (move/import extension)", writes=True)
async def _revision_range(s: Session) -> None:
    m = s.marker()
    for revision in (2**53, 2**63, 2**64 - 1):
        await expect_error(s, "memory/remember", {"records": [{"content": f"{m} r", "metadata": {"m": m},
                                                               "key": f"{m}/k", "revision": revision}]},
                           (-32602,), f"revision {revision}")
    await expect_nothing_written(s, m, "revision past 2**53 - 1")


# ---------------------------------------------------------------- tiers & salience

@check("tiers", "promote to an unknown tier is -32002; consolidate reports its counts", writes=True)
async def _tiers(s: Session) -> None:
    m = s.marker()
    ids = await s.remember({"content": f"{m} promote me"})
    await expect_error(s, "memory/promote", {"ids": ids, "tier": f"no-such-tier-{m}"}, (-32002,), "unknown tier")
    result = await s.t.call("memory/consolidate", {})
    for name in ("moved", "promoted", "dropped", "summarized"):
        expect(isinstance(result.get(name), int), f"consolidate lacks {name}: {result}")
    expect(isinstance(result.get("counts"), dict), "consolidate lacks counts")
    expect(await s.recall(query=m), "consolidate lost a record")


@check("tiers", "where tier: the tier a record is read from matches it; any other tier name matches nothing",
       writes=True)
async def _where_tier(s: Session) -> None:
    m = s.marker()
    await s.remember({"content": f"{m} somewhere", "metadata": {"m": m}})
    records = await s.timeline(where={"m": m})
    expect(len(records) == 1 and isinstance(records[0].get("tier"), str), f"a record without its tier: {records}")
    tier = records[0]["tier"]
    same = await s.timeline(where={"m": m, "tier": tier})
    expect([r["id"] for r in same] == [records[0]["id"]], f"where tier {tier!r} did not match its own record")
    hits = await s.recall(query=m, where={"m": m, "tier": [f"no-such-tier-{m}", tier]})
    expect([r["id"] for r in hits] == [records[0]["id"]], "where tier any-of did not match")
    expect(not await s.timeline(where={"m": m, "tier": f"no-such-tier-{m}"}), "another tier name matched")
    expect(not await s.timeline(where={"m": m, "tier": None}), "where tier: null matched a record with a tier")


@check("salience", "reinforce counts the records it reinforced; records carry salience fields", writes=True)
async def _salience(s: Session) -> None:
    m = s.marker()
    ids = await s.remember({"content": f"{m} worth keeping"})
    result = await s.t.call("memory/reinforce", {"ids": ids + [f"unknown-{m}"], "amount": 0.2})
    expect(result.get("reinforced") == 1, f"reinforced = {result.get('reinforced')}")
    record = (await s.recall(query=m))[0]
    expect(isinstance(record.get("salience"), (int, float)) and isinstance(record.get("access_count"), int),
           f"salience fields missing: {record}")


@check("salience", "access_count beyond 2**53 - 1 is refused with -32602 (move/import extension)", writes=True)
async def _access_count_range(s: Session) -> None:
    m = s.marker()
    for count in (2**53, 2**63, 2**64 - 1):
        await expect_error(s, "memory/remember", {"records": [{"content": f"{m} counted", "metadata": {"m": m},
                                                               "access_count": count}]},
                           (-32602,), f"access_count {count}")
    await expect_nothing_written(s, m, "access_count past 2**53 - 1")
    ids = await s.remember({"content": f"{m} counted", "metadata": {"m": m}, "access_count": 2**53 - 1})
    expect([r["access_count"] for r in await s.timeline(where={"m": m})] == [2**53 - 1],
           f"access_count 2**53 - 1 did not round-trip ({ids})")


# ---------------------------------------------------------------- embeddings

@check("embeddings", "caller vectors are stored verbatim and returned only when asked", writes=True)
async def _embeddings(s: Session) -> None:
    m = s.marker()
    dims = s.dims()
    vector = [round((i + 1) / (dims + 1), 6) for i in range(dims)]
    await s.remember({"content": f"{m} with a vector", "embedding": vector, "metadata": {"m": m}})
    plain = await s.timeline(where={"m": m})
    expect(plain and plain[0].get("embedding") is None, "embedding returned without embeddings: true")
    full = await s.timeline(where={"m": m}, embeddings=True)
    got = full[0].get("embedding") if full else None
    expect(isinstance(got, list) and len(got) == dims and all(abs(a - b) < 1e-6 for a, b in zip(got, vector)),
           "vector not returned verbatim")


@check("embeddings", "a vector of the wrong width answers -32008 and writes nothing", writes=True)
async def _embedding_width(s: Session) -> None:
    m = s.marker()
    dims = s.dims()
    await s.remember({"content": f"{m} fixes the width", "embedding": [0.5] * dims})
    await expect_error(s, "memory/remember", {"records": [{"content": f"{m} wrong", "embedding": [0.5] * (dims + 3)}]},
                       (-32008,), "wrong width")
    expect(not any("wrong" in r["content"] for r in await s.recall(query=m)), "the mismatched record was written")


@check("embeddings", "a vector value beyond float32's range is refused with -32602 and writes nothing", writes=True)
async def _embedding_range(s: Session) -> None:
    m = s.marker()
    dims = s.dims()
    for value in (1e300, -3.5e38, 3.5e38):
        vector = [0.5] * (dims - 1) + [value]
        await expect_error(s, "memory/remember", {"records": [{"content": f"{m} huge", "metadata": {"m": m},
                                                               "embedding": vector}]}, (-32602,), f"element {value}")
        await expect_error(s, "memory/recall", {"embedding": vector}, (-32602,), f"query element {value}")
    await expect_nothing_written(s, m, "vector past float32")


# ---------------------------------------------------------------- external

@check("external", "uri and media_type are stored and returned unchanged; content may be empty", writes=True)
async def _external(s: Session) -> None:
    m = s.marker()
    uri = f"http://127.0.0.1:9/never-fetched/{m}.pdf"
    await s.remember({"content": "", "uri": uri, "media_type": "application/pdf", "metadata": {"m": m}})
    records = await s.timeline(where={"m": m})
    expect(len(records) == 1 and records[0].get("uri") == uri and records[0].get("media_type") == "application/pdf",
           f"external fields lost: {records}")


# ---------------------------------------------------------------- events

@check("events", "no cursor means from now; polls deliver each event once, in order", writes=True)
async def _events(s: Session) -> None:
    head = await s.t.call("memory/events", {})
    expect(head.get("events") == [] and isinstance(head.get("cursor"), str), f"poll without cursor: {head}")
    m = s.marker()
    ids = await s.remember({"content": f"{m} one"}, {"content": f"{m} two"})
    first = await s.t.call("memory/events", {"cursor": head["cursor"]})
    written = [e for e in first["events"] if e.get("kind") == "written"]
    expect([e.get("id") for e in written][-2:] == ids, f"written events {written}")
    expect(all(isinstance(e.get("at"), str) for e in first["events"]), "event without at")
    again = await s.t.call("memory/events", {"cursor": first["cursor"]})
    expect(not any(e.get("id") in ids for e in again["events"]), "an event was delivered twice")


@check("events", "a foreign cursor gives reset: true", writes=False)
async def _events_reset(s: Session) -> None:
    result = await s.t.call("memory/events", {"cursor": "not-a-cursor-of-this-server"})
    expect(result.get("reset") is True and isinstance(result.get("cursor"), str), f"foreign cursor: {result}")


@check("events", "a cursor with non-ASCII digits gives reset: true", writes=False)
async def _events_odd_digits(s: Session) -> None:
    head = (await s.t.call("memory/events", {}))["cursor"]
    for cursor in (f"{head}\u00b2", f"{head}\u0663", f"{head}{'9' * 5000}"):
        result = await s.t.call("memory/events", {"cursor": cursor})
        expect(result.get("reset") is True and isinstance(result.get("cursor"), str), f"cursor {cursor[:40]!r}: {result}")


@check("events", "forget is one coalesced event carrying the count", writes=True)
async def _events_coalesced(s: Session) -> None:
    m = s.marker()
    ids = await s.remember(*[{"content": f"{m} {i}"} for i in range(3)])
    head = (await s.t.call("memory/events", {}))["cursor"]
    await s.t.call("memory/forget", {"ids": ids})
    events = (await s.t.call("memory/events", {"cursor": head}))["events"]
    forgotten = [e for e in events if e.get("kind") == "forgotten"]
    expect(len(forgotten) == 1 and forgotten[0].get("count") == 3, f"forgotten events {forgotten}")
    if "tiers" in s.caps:
        head = (await s.t.call("memory/events", {}))["cursor"]
        await s.t.call("memory/consolidate", {})
        events = (await s.t.call("memory/events", {"cursor": head}))["events"]
        expect(sum(1 for e in events if e.get("kind") == "consolidated") == 1, "consolidate must be one event")


@check("events", "limit cuts a poll with more: true and the next poll continues", writes=True)
async def _events_more(s: Session) -> None:
    head = (await s.t.call("memory/events", {}))["cursor"]
    m = s.marker()
    ids = await s.remember(*[{"content": f"{m} {i}"} for i in range(4)])
    first = await s.t.call("memory/events", {"cursor": head, "limit": 2, "kinds": ["written"]})
    expect(first.get("more") is True and len(first["events"]) == 2, f"limited poll {first}")
    rest = await s.t.call("memory/events", {"cursor": first["cursor"], "kinds": ["written"]})
    got = [e.get("id") for e in first["events"] + rest["events"]]
    expect(got == ids, f"events across polls {got} != {ids}")


@check("events", "over HTTP, subscribe answers -32003 and describe says push: false", transport="http")
async def _events_http(s: Session) -> None:
    expect((s.describe.get("events") or {}).get("push") is False, "push must be false over HTTP")
    await expect_error(s, "memory/events/subscribe", {}, (-32003,), "subscribe over HTTP")


@check("events", "over stdio, subscribe pushes memory/event notifications", transport="stdio", writes=True)
async def _events_push(s: Session) -> None:
    assert isinstance(s.t, StdioTransport)
    result = await s.t.call("memory/events/subscribe", {})
    expect(result.get("subscribed") is True, f"subscribe: {result}")
    m = s.marker()
    ids = await s.remember({"content": f"{m} pushed"})
    await asyncio.sleep(0.2)
    pushed = [n for n in s.t.notifications if n.get("method") == "memory/event"
              and n.get("params", {}).get("id") in ids]
    expect(len(pushed) == 1, f"expected one pushed written event, got {len(pushed)}")
    off = await s.t.call("memory/events/unsubscribe", {})
    expect(off.get("subscribed") is False, f"unsubscribe: {off}")
    again = await s.t.call("memory/events/unsubscribe", {})
    expect(again.get("subscribed") is False, "unsubscribe when not subscribed must be a no-op")


# ---------------------------------------------------------------- prompt

@check("prompt", "prompt adds text and ids without changing the records; unoffered method is -32602", writes=True)
async def _prompt(s: Session) -> None:
    m = s.marker()
    await s.remember({"content": f"{m} likes green tea", "role": "user"}, {"content": f"{m} works at night"})
    plain = await s.t.call("memory/recall", {"query": m, "touch": False})
    with_prompt = await s.t.call("memory/recall", {"query": m, "prompt": True, "touch": False})
    expect([r["id"] for r in plain["records"]] == [r["id"] for r in with_prompt["records"]],
           "asking for a prompt changed the records")
    expect(isinstance(with_prompt.get("prompt"), str) and m in with_prompt["prompt"], "prompt text missing")
    expect(set(with_prompt.get("prompt_ids", [])) <= {r["id"] for r in with_prompt["records"]}, "prompt_ids not a subset")
    tl = await s.t.call("memory/timeline", {"limit": 5, "prompt": {"style": "transcript"}})
    expect(isinstance(tl.get("prompt"), str), "timeline prompt missing")
    await expect_error(s, "memory/recall", {"query": m, "prompt": {"method": "model", "model": "no-such-model"}},
                       (-32602,), "unoffered prompt model")


# ---------------------------------------------------------------- summarize

@check("summarize", "summarize needs a selector, writes a summary and never deletes sources", writes=True)
async def _summarize(s: Session) -> None:
    await expect_error(s, "memory/summarize", {}, (-32602,), "summarize without a selector")
    m = s.marker()
    ids = await s.remember({"content": f"{m} met Anna in Rome on 3 May 2023."},
                           {"content": f"{m} booked a flight for 14 June."})
    await expect_error(s, "memory/summarize", {"ids": ids, "key": ""}, (-32602,), "summarize into an empty key")
    result = await s.t.call("memory/summarize", {"ids": ids})
    expect(isinstance(result.get("records"), list) and isinstance(result.get("read"), int)
           and isinstance(result.get("written"), int), f"summarize result {result}")
    still = await s.recall(query=m, limit=10)
    expect(set(ids) <= {r["id"] for r in still}, "summarize deleted its sources")


# ---------------------------------------------------------------- HTTP rules

@check("http", "GET on the endpoint is 405", transport="http")
async def _http_get(s: Session) -> None:
    assert isinstance(s.t, HTTPTransport)
    reply = await s.t.get("/")
    expect(reply.status == 405, f"GET / gave {reply.status}")


@check("http", "a disallowed Origin is 403; no Origin is unaffected", transport="http")
async def _http_origin(s: Session) -> None:
    assert isinstance(s.t, HTTPTransport)
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "memory/describe"}).encode()
    reply = await s.t.post(body, {"origin": "http://evil.example"})
    expect(reply.status == 403, f"evil origin gave {reply.status}")
    plain = await s.t.post(body)
    expect(plain.status == 200, f"no origin gave {plain.status}")


@check("http", "an unsupported A2M-Protocol-Version is 400 with a -32007 body", transport="http")
async def _http_version(s: Session) -> None:
    assert isinstance(s.t, HTTPTransport)
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "memory/describe"}).encode()
    reply = await s.t.post(body, {"a2m-protocol-version": "a2m/9.9"})
    expect(reply.status == 400, f"unsupported version gave {reply.status}")
    expect(reply.json().get("error", {}).get("code") == -32007, f"body {reply.body[:120]!r}")
    ok = await s.t.post(body, {"a2m-protocol-version": "a2m/0.1"})
    expect(ok.status == 200, f"a2m/0.1 header gave {ok.status}")


@check("http", "protocol errors are 200 with an error object", transport="http")
async def _http_errors_200(s: Session) -> None:
    assert isinstance(s.t, HTTPTransport)
    reply = await s.t.post(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "memory/recall",
                                       "params": {"tier": "no-such-tier"}}).encode())
    expect(reply.status == 200 and "error" in reply.json() or "result" in reply.json(), f"status {reply.status}")


@check("http", "GET /.well-known/a2m-server.json serves describe", transport="http")
async def _http_well_known(s: Session) -> None:
    assert isinstance(s.t, HTTPTransport)
    reply = await s.t.get("/.well-known/a2m-server.json")
    expect(reply.status == 200, f"well-known gave {reply.status}")
    doc = reply.json()
    expect(doc.get("protocol") == "a2m/0.1" and "capabilities" in doc, f"well-known body {doc}")


# ---------------------------------------------------------------- stdio rules

@check("stdio", "stdout carries only JSON-RPC", transport="stdio")
async def _stdio_clean(s: Session) -> None:
    assert isinstance(s.t, StdioTransport)
    await s.t.call("memory/describe", {})
    expect(not s.t.bad_lines, f"non-JSON on stdout: {s.t.bad_lines[:3]}")


@dataclass
class Result:
    group: str
    name: str
    outcome: str  # pass / fail / skip
    detail: str = ""


async def detect_read_only(t: Transport) -> bool:
    try:
        await t.call("memory/remember", {"records": [{"content": "a2m conformance read-only probe",
                                                      "metadata": {"a2m_probe": True}}]})
    except RPCError as exc:
        return exc.code == -32004
    return False


async def run(t: Transport, *, only: str | None = None, echo: Callable[[str], None] | None = print) -> list[Result]:
    """Run every applicable check against a connected transport; one line each."""
    describe = await t.call("memory/describe", {})
    session = Session(t, describe)
    session.read_only = await detect_read_only(t)
    results: list[Result] = []
    for c in CHECKS:
        if only and only not in f"{c.group}: {c.name}":
            continue
        if c.transport and c.transport != t.kind:
            result = Result(c.group, c.name, "skip", f"{c.transport} only")
        elif any(n not in session.caps for n in c.needs):
            result = Result(c.group, c.name, "skip", f"{'/'.join(c.needs)} not declared")
        elif c.writes and session.read_only:
            result = Result(c.group, c.name, "skip", "read-only server")
        else:
            started = time.perf_counter()
            try:
                await c.fn(session)
                result = Result(c.group, c.name, "pass", f"{(time.perf_counter() - started) * 1000:.0f} ms")
            except Skip as exc:
                result = Result(c.group, c.name, "skip", str(exc))
            except (CheckFailed, RPCError) as exc:
                result = Result(c.group, c.name, "fail", str(exc))
            except Exception as exc:  # the wire itself broke
                result = Result(c.group, c.name, "fail", f"{type(exc).__name__}: {exc}")
        results.append(result)
        if echo:
            echo(f"{result.outcome.upper():4} {result.group}: {result.name}" + (f" ({result.detail})" if result.detail else ""))
    passed = sum(r.outcome == "pass" for r in results)
    failed = sum(r.outcome == "fail" for r in results)
    skipped = sum(r.outcome == "skip" for r in results)
    if echo:
        echo(f"conformance: {passed} passed, {failed} failed, {skipped} skipped")
    return results
