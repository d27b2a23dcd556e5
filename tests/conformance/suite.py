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


CAPABILITIES = ("core", "tiers", "salience", "scopes", "sessions", "keys", "embeddings", "external", "events",
                "summarize", "prompt")


def is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def is_stamp(value: Any) -> bool:
    return isinstance(value, str) and TIMESTAMP.match(value) is not None


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


async def expect_invalid(s: Session, method: str, params: Any, field: str, what: str) -> None:
    """-32602 whose `data.field` names the offending param (this project's convention for `data`)."""
    try:
        await s.t.call(method, params)
    except RPCError as exc:
        data = exc.error.get("data")
        expect(exc.code == -32602 and isinstance(data, dict) and data.get("field") == field,
               f"{what}: expected -32602 with data.field {field!r}, got {exc.code} {data}")
        return
    raise CheckFailed(f"{what}: expected -32602, got a result")


# ---------------------------------------------------------------- envelope

@check("envelope", "a batch (JSON array) is refused with -32600")
async def _batch(s: Session) -> None:
    reply = await s.t.send([{"jsonrpc": "2.0", "id": 1, "method": "memory/describe"}])
    expect(isinstance(reply, dict) and reply.get("error", {}).get("code") == -32600, f"got {reply}")


@check("envelope", "malformed JSON answers -32700")
async def _parse(s: Session) -> None:
    reply = await s.t.send_raw(b'{"jsonrpc": "2.0", "id": 1, "method": ')
    expect(reply.get("error", {}).get("code") == -32700 and "id" in reply and reply["id"] is None, f"got {reply}")


@check("envelope", "a string id is echoed as the same string")
async def _id_string(s: Session) -> None:
    reply = await s.t.request("memory/describe", {}, id_="req-7")
    expect(reply.get("id") == "req-7" and isinstance(reply.get("id"), str), f"got id {reply.get('id')!r}")


@check("envelope", "a number id is echoed as the same number")
async def _id_number(s: Session) -> None:
    reply = await s.t.request("memory/describe", {}, id_=4711)
    expect(reply.get("id") == 4711 and isinstance(reply.get("id"), int), f"got id {reply.get('id')!r}")
    for id_ in (0, -3, 2.5, None):
        reply = await s.t.request("memory/describe", {}, id_=id_)
        expect("id" in reply and reply["id"] == id_ and type(reply["id"]) is type(id_) and "result" in reply,
               f"id {id_!r} came back as {reply.get('id', '<missing>')!r}: {reply}")


@check("envelope", "an error response echoes the request's id")
async def _id_on_error(s: Session) -> None:
    for method, params, id_ in (("memory/no_such_method", {}, "err-1"), ("memory/recall", {"limit": "x"}, 77)):
        reply = await s.t.request(method, params, id_=id_)
        expect(reply.get("id") == id_ and "error" in reply, f"{method}: id {id_!r} came back as {reply}")
        error = reply["error"]
        expect(isinstance(error.get("code"), int) and isinstance(error.get("message"), str) and error["message"],
               f"an error object needs an integer code and a message: {error}")


@check("envelope", "params may be omitted (by-name params default to none)")
async def _no_params(s: Session) -> None:
    reply = await s.t.send({"jsonrpc": "2.0", "id": "bare", "method": "memory/describe"})
    expect(reply.get("id") == "bare" and reply.get("result", {}).get("protocol") == "a2m/0.1", f"got {reply}")


@check("envelope", "a name that is not an A2M method answers -32601")
async def _unknown_method(s: Session) -> None:
    await expect_error(s, "memory/no_such_method", {}, (-32601,), "unknown memory/ name")
    await expect_error(s, "tools/list", {}, (-32601,), "non-memory name")


@check("envelope", "a request without jsonrpc 2.0 answers -32600")
async def _invalid_request(s: Session) -> None:
    reply = await s.t.send({"id": 5, "method": "memory/describe"})
    expect(reply.get("error", {}).get("code") == -32600, f"got {reply}")


@check("envelope", "unknown params are ignored, never rejected, by every method")
async def _unknown_params(s: Session) -> None:
    result = await s.t.call("memory/describe", {"x_future_param": {"nested": True}})
    expect(result.get("protocol") == "a2m/0.1", "describe with an unknown param failed")
    await s.recall(query="anything", x_future_param=1)
    extra = {"x_future_param": [1, {"a": None}]}
    calls: list[tuple[str, dict[str, Any]]] = [("memory/timeline", {"limit": 1}), ("memory/recall", {"limit": 1})]
    if not s.read_only:
        m = s.marker()
        ids = await s.remember({"content": f"{m} unknown params", "metadata": {"m": m}}, **extra)
        calls.append(("memory/forget", {"ids": ids}))
    if "keys" in s.caps:
        calls.append(("memory/fetch", {"key": "x/unused"}))
    if "sessions" in s.caps:
        calls.append(("memory/session/list", {}))
    if "events" in s.caps:
        calls += [("memory/events", {}), ("memory/events/unsubscribe", {})]
    if "tiers" in s.caps:
        calls.append(("memory/consolidate", {}))
    if "salience" in s.caps:
        calls.append(("memory/reinforce", {"ids": ["x-unknown"]}))
    for method, params in calls:
        try:
            await s.t.call(method, {**params, **extra})
        except RPCError as exc:
            raise CheckFailed(f"{method} refused an unknown param: {exc}") from None


@check("envelope", "a notification gets no response")
async def _notification(s: Session) -> None:
    if isinstance(s.t, HTTPTransport):
        reply = await s.t.notify("memory/describe", {})
        expect(reply.status == 202 and reply.body == b"", f"HTTP notification: {reply.status} {reply.body[:80]!r}")
    else:
        await s.t.notify("memory/describe", {})
        reply = await s.t.request("memory/describe", {}, id_="after-notification")
        expect(reply.get("id") == "after-notification", f"a response was sent for a notification: {reply}")


@check("envelope", "a notification that fails (unknown method, bad params) gets no response either")
async def _notification_error(s: Session) -> None:
    for method, params in (("memory/no_such_method", {}), ("memory/recall", {"query": 5}), ("memory/remember", {})):
        if isinstance(s.t, HTTPTransport):
            reply = await s.t.notify(method, params)
            expect(reply.status == 202 and reply.body == b"", f"{method}: HTTP {reply.status} {reply.body[:80]!r}")
        else:
            await s.t.notify(method, params)
    if not isinstance(s.t, HTTPTransport):
        reply = await s.t.request("memory/describe", {}, id_="after-failed-notifications")
        expect(reply.get("id") == "after-failed-notifications", f"a failed notification was answered: {reply}")


# ---------------------------------------------------------------- describe

@check("core", "describe names the protocol, the server, its capabilities and methods")
async def _describe(s: Session) -> None:
    d = s.describe
    expect(d.get("protocol") == "a2m/0.1", f"protocol is {d.get('protocol')!r}")
    expect(isinstance(d.get("name"), str) and d["name"], "name missing")
    expect("core" in d.get("capabilities", []), "core not declared")
    expect(isinstance(d.get("capabilities"), list) and set(d["capabilities"]) <= set(CAPABILITIES),
           f"capabilities must be a list of the protocol's names: {d.get('capabilities')}")
    expect(isinstance(d.get("methods"), list) and all(isinstance(m, str) for m in d["methods"]),
           f"methods must be a list of names: {d.get('methods')}")
    methods = set(d.get("methods", []))
    expect(set(CORE_METHODS) <= methods, f"core methods missing from methods: {set(CORE_METHODS) - methods}")
    for cap, names in CAPABILITY_METHODS.items():
        if cap in s.caps:
            expect(set(names) <= methods, f"{cap} declared but methods lack {set(names) - methods}")


@check("core", "describe with an incompatible protocol answers -32007, a protocol not a string -32602")
async def _negotiate(s: Session) -> None:
    await expect_error(s, "memory/describe", {"protocol": "a2m/0.9"}, (-32007,), "a2m/0.9")
    await expect_error(s, "memory/describe", {"protocol": "a2m/1.0"}, (-32007,), "a2m/1.0")
    await expect_error(s, "memory/describe", {"protocol": 1}, (-32602,), "protocol 1, not a string")
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
        names = [tier.get("name") for tier in tiers if isinstance(tier, dict)]
        expect(len(names) == len(tiers) and len(set(names)) == len(names), f"tier names must be unique: {names}")
        for tier in tiers:
            expect(isinstance(tier.get("name"), str) and is_count(tier.get("count")), f"bad tier entry {tier}")
            if tier.get("kind") is not None:
                expect(tier["kind"] in ("working", "episodic", "semantic", "procedural"), f"bad kind {tier['kind']}")
            expect(tier.get("capacity") is None or is_count(tier["capacity"]), f"capacity of {tier['name']}: {tier}")
            for link in ("spill_to", "promote_to"):
                expect(tier.get(link) is None or tier[link] in names, f"{link} of {tier['name']} names no tier: {tier}")
            for flag in ("shared", "per_session"):
                expect(tier.get(flag) is None or isinstance(tier[flag], bool), f"{flag} of {tier['name']}: {tier}")
    if "embeddings" in s.caps:
        emb = d.get("embeddings")
        expect(isinstance(emb, dict) and "dimensions" in emb and isinstance(emb.get("metric"), str),
               f"embeddings object malformed: {emb}")
        dims = emb["dimensions"]
        expect(dims is None or (is_count(dims) and dims > 0), f"embeddings.dimensions: {dims!r}")
        expect(emb.get("metrics") is None or (isinstance(emb["metrics"], list)
                                              and all(isinstance(x, str) for x in emb["metrics"])),
               f"embeddings.metrics: {emb.get('metrics')!r}")
        expect(emb.get("model") is None or isinstance(emb["model"], str), f"embeddings.model: {emb.get('model')!r}")
    if "events" in s.caps:
        expect(isinstance((d.get("events") or {}).get("push"), bool), "events.push missing")
    if "summarize" in s.caps:
        expect(isinstance(d.get("summarize"), dict) and "model" in d["summarize"], "summarize object missing")
        expect(d["summarize"]["model"] is None or isinstance(d["summarize"]["model"], str), "summarize.model")
    if "prompt" in s.caps:
        p = d.get("prompt") or {}
        expect(isinstance(p.get("styles"), list) and isinstance(p.get("methods"), list), f"prompt object malformed: {p}")
    limits = d.get("limits")
    expect(limits is None or (isinstance(limits, dict) and all(is_count(v) and v > 0 for v in limits.values())),
           f"limits must map names to positive integers: {limits}")


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
    other = await s.remember({"id": rid, "content": f"{m} a retry that differs", "metadata": {"m": m}})
    records = await s.timeline(where={"m": m})
    expect(other == [rid] and [r["content"] for r in records] == [f"{m} once"],
           f"a second write of an existing id changed it: {[r['content'] for r in records]}")


@check("keys", "a client-supplied id is idempotent on a keyed write too: a retry replaces nothing", writes=True)
async def _idempotent_keyed(s: Session) -> None:
    m = s.marker()
    rid, key = f"client-{m}", f"app/{m}/retry"
    for content in (f"{m} first", f"{m} first", f"{m} changed"):
        ids = await s.remember({"id": rid, "key": key, "content": content})
        expect(ids == [rid], f"the write of existing id {rid} answered {ids}")
    record = (await s.t.call("memory/fetch", {"key": key}))["record"]
    expect(record is not None and record["id"] == rid and record["content"] == f"{m} first"
           and record.get("revision") == 1, f"retries of an existing id replaced the key: {record}")


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
    await s.remember(*[{"content": f"{m} more {i}", "metadata": {"m": m}} for i in range(3)])
    found = await s.recall(where={"m": m}, touch=False)
    scores = [r.get("score") for r in found]
    expect(len(found) == 4 and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in scores)
           and scores == sorted(scores, reverse=True), f"recall without a query: scores {scores}")


@check("core", "min_score drops the records scored below it", writes=True)
async def _min_score(s: Session) -> None:
    m = s.marker()
    await s.remember(*[{"content": f"{m} {'also ' * i}item {i}", "metadata": {"m": m}} for i in range(4)])
    plain = await s.recall(query=m, touch=False)
    scores = [r["score"] for r in plain]
    expect(len(plain) == 4, f"recall for {m} found {len(plain)} of 4")
    expect(not await s.recall(query=m, touch=False, min_score=scores[0] + 1), "min_score above every score kept records")
    everything = await s.recall(query=m, touch=False, min_score=scores[-1] - 1)
    expect(len(everything) == 4, f"min_score below every score dropped records: {len(everything)} of 4")
    if scores[0] > scores[-1]:
        threshold = (scores[0] + scores[-1]) / 2
        kept = await s.recall(query=m, touch=False, min_score=threshold)
        expect(kept and all(r["score"] >= threshold for r in kept) and len(kept) < 4,
               f"min_score {threshold}: kept scores {[r['score'] for r in kept]} of {scores}")
    await expect_invalid(s, "memory/recall", {"query": m, "min_score": "0.5"}, "min_score", "string min_score")


@check("core", "limit 0 is no limit (up to max_recall_limit where one is declared)", writes=True)
async def _limit_zero(s: Session) -> None:
    m = s.marker()
    n = 13  # more than any default page (recall's is commonly 10)
    cap = (s.describe.get("limits") or {}).get("max_recall_limit")
    if cap and cap < n:
        raise Skip(f"max_recall_limit {cap} is below {n}")
    await s.remember(*[{"content": f"{m} row {i}", "metadata": {"m": m}} for i in range(n)])
    expect(len(await s.recall(query=m, limit=0, touch=False)) == n, "recall with a query and limit 0")
    expect(len(await s.recall(where={"m": m}, limit=0, touch=False)) == n, "recall without a query and limit 0")
    expect(len(await s.timeline(where={"m": m}, limit=0)) == n, "timeline with limit 0")
    expect(len(await s.timeline(where={"m": m})) == n, "timeline without limit")


@check("core", "records carry RFC 3339 timestamps; only recall results carry a score", writes=True)
async def _record_form(s: Session) -> None:
    m = s.marker()
    await s.remember({"content": f"{m} shaped", "metadata": {"m": m}, "key": f"{m}/shaped"})
    recalled = await s.recall(query=m)
    timeline = await s.timeline(where={"m": m})
    expect(len(recalled) == 1 and len(timeline) == 1, f"recall {len(recalled)}, timeline {len(timeline)}")
    expect(isinstance(recalled[0].get("score"), (int, float)), f"a recall result without a score: {recalled[0]}")
    expect("score" not in timeline[0], f"a timeline record carries a score: {timeline[0]}")
    records = recalled + timeline
    if "keys" in s.caps:
        fetched = (await s.t.call("memory/fetch", {"key": f"{m}/shaped"}))["record"]
        expect(fetched is not None and "score" not in fetched, f"a fetched record carries a score: {fetched}")
        records.append(fetched)
    for r in records:
        for name in ("id", "content", "created_at"):
            expect(isinstance(r.get(name), str), f"record field {name} is not a string: {r}")
        expect(is_stamp(r["created_at"]), f"created_at {r['created_at']!r}")
        expect(isinstance(r.get("metadata"), dict), f"metadata is not an object: {r}")
        if "salience" in s.caps:
            expect(r.get("accessed_at") is None or is_stamp(r["accessed_at"]), f"accessed_at {r.get('accessed_at')!r}")


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
    unknown = await s.t.call("memory/forget", {"ids": [f"never-{m}"]})
    expect(unknown.get("forgotten") == 0, f"forgetting an unknown id: {unknown}")


@check("core", "forget by where or by query removes exactly the matching records", writes=True)
async def _forget_selectors(s: Session) -> None:
    m, other = s.marker(), s.marker()
    await s.remember({"content": f"{m} red", "metadata": {"m": m, "color": "red"}},
                     {"content": f"{m} blue", "metadata": {"m": m, "color": "blue"}},
                     {"content": f"{m} {other} green", "metadata": {"m": m, "color": "green"}},
                     {"content": f"{m} plain", "metadata": {"m": m, "color": "none"}})
    gone = await s.t.call("memory/forget", {"where": {"m": m, "color": ["red", "blue"]}})
    expect(gone.get("forgotten") == 2, f"forget by where: {gone}")
    expect(sorted(r["metadata"]["color"] for r in await s.timeline(where={"m": m})) == ["green", "none"],
           "forget by where removed the wrong records")
    gone = await s.t.call("memory/forget", {"query": other})
    expect(gone.get("forgotten") == 1, f"forget by query: {gone}")
    expect([r["metadata"]["color"] for r in await s.timeline(where={"m": m})] == ["none"],
           "forget by query removed the wrong records")


@check("core", "forget's selectors narrow each other: ids with a where removes only records matching both",
       writes=True)
async def _forget_selectors_together(s: Session) -> None:
    """The router deletes a moved record only at the revision it moved, with `ids` and `where` in one
    forget (decision 152): a server that took them as either-or would delete every record the `where`
    matches."""
    m = s.marker()
    ids = await s.remember({"content": f"{m} one", "metadata": {"m": m, "n": 1}},
                           {"content": f"{m} two", "metadata": {"m": m, "n": 2}},
                           {"content": f"{m} three", "metadata": {"m": m, "n": 1}})
    gone = await s.t.call("memory/forget", {"ids": ids[:2], "where": {"n": 1}})
    expect(gone.get("forgotten") == 1, f"forget by ids and where: {gone}")
    expect(sorted(r["id"] for r in await s.timeline(where={"m": m})) == sorted(ids[1:]),
           "forget by ids and where removed records matching only one of them")


@check("core", "a tier on a record without the tiers capability answers -32003", writes=True)
async def _tier_field(s: Session) -> None:
    if "tiers" in s.caps:
        raise Skip("tiers declared")
    await expect_error(s, "memory/remember", {"records": [{"content": "x", "tier": "episodic"}]}, (-32003,), "tier field")
    name = ((s.describe.get("tiers") or [{}])[0]).get("name") or "memory"
    await expect_error(s, "memory/remember", {"records": [{"content": "x", "tier": name}]}, (-32003,),
                       "tier field naming the server's own tier")


@check("core", "fields of an undeclared capability on a record are ignored, not refused", writes=True)
async def _undeclared_fields(s: Session) -> None:
    fields = {"keys": {"key": "app/x/ignored"}, "sessions": {"session": "ignored-session"},
              "external": {"uri": "http://127.0.0.1:9/ignored", "media_type": "text/plain"},
              "salience": {"salience": 0.9}, "embeddings": {"embedding": [0.5, 0.25]}}
    undeclared = {cap: extra for cap, extra in fields.items() if cap not in s.caps}
    if not undeclared:
        raise Skip("every capability with record fields is declared")
    m = s.marker()
    for cap, extra in undeclared.items():
        try:
            await s.remember({"content": f"{m} {cap}", "metadata": {"m": m}, **extra})
        except RPCError as exc:
            raise CheckFailed(f"a record with {cap} fields ({cap} undeclared) was refused: {exc}") from None
    expect(len(await s.timeline(where={"m": m})) == len(undeclared), "a record with undeclared fields was lost")


@check("tiers", "a record, recall, timeline or forget naming an unknown tier answers -32002", writes=True)
async def _unknown_tier(s: Session) -> None:
    m = s.marker()
    unknown = f"no-such-tier-{m}"
    await expect_error(s, "memory/remember", {"records": [{"content": f"{m} lost", "metadata": {"m": m},
                                                           "tier": unknown}]}, (-32002,), "remember into an unknown tier")
    expect(not await s.timeline(where={"m": m}), "a record for an unknown tier was written")
    # An empty name names no tier: unknown, never read as "no tier" (the router wrote it to its default tier).
    await expect_error(s, "memory/remember", {"records": [{"content": f"{m} lost", "metadata": {"m": m},
                                                           "tier": ""}]}, (-32002,), "remember into tier \"\"")
    expect(not await s.timeline(where={"m": m}), "a record for tier \"\" was written")
    await expect_error(s, "memory/recall", {"query": m, "tier": unknown}, (-32002,), "recall of an unknown tier")
    await expect_error(s, "memory/timeline", {"tier": unknown}, (-32002,), "timeline of an unknown tier")
    await expect_error(s, "memory/forget", {"ids": ["x"], "tier": unknown}, (-32002,), "forget in an unknown tier")
    ids = await s.remember({"content": f"{m} placed", "metadata": {"m": m}})
    tier = (await s.timeline(where={"m": m}))[0]["tier"]
    expect([r["id"] for r in await s.recall(query=m, tier=tier)] == ids, f"recall in its own tier {tier!r}")
    expect([r["id"] for r in await s.timeline(where={"m": m}, tier=tier)] == ids, f"timeline of its tier {tier!r}")


@check("core", "wrong param types answer -32602", writes=False)
async def _param_types(s: Session) -> None:
    await expect_error(s, "memory/recall", {"query": 5}, (-32602,), "numeric query")
    await expect_error(s, "memory/recall", {"limit": "ten"}, (-32602,), "string limit")
    await expect_error(s, "memory/timeline", {"where": "x"}, (-32602,), "string where")
    if not s.read_only:
        await expect_error(s, "memory/forget", {"ids": "x"}, (-32602,), "string ids")


@check("core", "a param of the wrong type answers -32602 naming it, on every method that takes it", writes=False)
async def _param_type_fields(s: Session) -> None:
    cases: list[tuple[str, dict[str, Any], str]] = [
        ("memory/describe", {"owner": 5}, "owner"),
        ("memory/recall", {"query": 5}, "query"), ("memory/recall", {"limit": -1}, "limit"),
        ("memory/recall", {"limit": 2.5}, "limit"), ("memory/recall", {"limit": True}, "limit"),
        ("memory/recall", {"where": [1]}, "where"), ("memory/recall", {"owner": 5}, "owner"),
        ("memory/recall", {"key_prefix": 5}, "key_prefix"), ("memory/recall", {"tier": 5}, "tier"),
        ("memory/recall", {"embeddings": "true"}, "embeddings"), ("memory/recall", {"touch": "no"}, "touch"),
        ("memory/timeline", {"limit": "1"}, "limit"), ("memory/timeline", {"tier": 5}, "tier"),
        ("memory/timeline", {"embeddings": 1}, "embeddings"),
    ]
    if "embeddings" in s.caps:
        cases.append(("memory/recall", {"embedding": "x"}, "embedding"))
    if "prompt" in s.caps:
        cases.append(("memory/recall", {"prompt": "x"}, "prompt"))
    if not s.read_only:
        cases += [("memory/remember", {"records": {"content": "x"}}, "records"),
                  ("memory/remember", {"records": [{"content": "x"}], "owner": 5}, "owner"),
                  ("memory/forget", {"ids": [5]}, "ids"), ("memory/forget", {"ids": ["x"], "tier": 5}, "tier")]
    if "keys" in s.caps:
        cases += [("memory/fetch", {"key": 5}, "key"), ("memory/fetch", {"key": "k", "embeddings": "yes"}, "embeddings")]
    if "tiers" in s.caps:
        tier = s.describe["tiers"][0]["name"]
        cases += [("memory/promote", {"ids": ["x"], "tier": 5}, "tier"), ("memory/promote", {"tier": tier}, "ids"),
                  ("memory/promote", {"ids": ["x"], "tier": tier, "salience": "high"}, "salience")]
    if "salience" in s.caps:
        cases += [("memory/reinforce", {"ids": "x"}, "ids"), ("memory/reinforce", {"ids": ["x"], "amount": "1"}, "amount")]
    if "sessions" in s.caps:
        cases += [("memory/session/close", {"session": 5}, "session"), ("memory/session/list", {"owner": 5}, "owner")]
    if "events" in s.caps:
        cases += [("memory/events", {"cursor": 5}, "cursor"), ("memory/events", {"limit": "5"}, "limit"),
                  ("memory/events", {"kinds": "written"}, "kinds"), ("memory/events", {"kinds": ["nonsense"]}, "kinds"),
                  ("memory/events", {"kinds": [5]}, "kinds"), ("memory/events", {"limit": -1}, "limit"),
                  ("memory/events", {"limit": 1.5}, "limit"), ("memory/events", {"limit": True}, "limit"),
                  ("memory/events", {"cursor": {"seq": 1}}, "cursor"), ("memory/events", {"owner": 5}, "owner")]
    if "summarize" in s.caps and not s.read_only:
        cases += [("memory/summarize", {"query": "x", "into": 5}, "into"), ("memory/summarize", {"tier": 5}, "tier"),
                  ("memory/summarize", {"query": 5}, "query"), ("memory/summarize", {"query": "x", "key": 5}, "key"),
                  ("memory/summarize", {"ids": "x"}, "ids"), ("memory/summarize", {"ids": [5]}, "ids"),
                  ("memory/summarize", {"query": "x", "limit": -1}, "limit"),
                  ("memory/summarize", {"query": "x", "limit": 1.5}, "limit"),
                  ("memory/summarize", {"where": [1]}, "where"), ("memory/summarize", {"key_prefix": 5}, "key_prefix"),
                  ("memory/summarize", {"query": "x", "owner": 5}, "owner")]
    for method, params, name in cases:
        await expect_invalid(s, method, params, name, f"{method} {params}")


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
    for method, params in (("memory/remember", {}), ("memory/remember", {"records": "x"}), ("memory/forget", {})):
        await expect_error(s, method, params, (-32004,), f"{method} {params} on a read-only server (always -32004)")
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


@check("scopes", "records carry the owner that wrote them", writes=True)
async def _scopes_owner_field(s: Session) -> None:
    m = s.marker()
    alice = f"alice-{s.run}"
    await s.remember({"content": f"{m} owned", "metadata": {"m": m}}, owner=alice)
    records = await s.timeline(where={"m": m}, owner=alice) + await s.recall(query=m, owner=alice)
    expect(len(records) == 2 and all(r.get("owner") == alice for r in records),
           f"owner field: {[r.get('owner') for r in records]}")


@check("scopes", "a key is unique per owner: the same key under two owners is two records", writes=True,
       needs=("scopes", "keys"))
async def _scopes_keys(s: Session) -> None:
    m = s.marker()
    key = f"app/{m}/shared-key"
    alice, bob = f"alice-{s.run}", f"bob-{s.run}"
    first = await s.remember({"content": f"{m} alice's value", "key": key}, owner=alice)
    second = await s.remember({"content": f"{m} bob's value", "key": key}, owner=bob)
    expect(first != second, "one owner's key write replaced another owner's record")
    for owner, content in ((alice, f"{m} alice's value"), (bob, f"{m} bob's value")):
        record = (await s.t.call("memory/fetch", {"key": key, "owner": owner}))["record"]
        expect(record is not None and record["content"] == content and record.get("revision") == 1,
               f"{owner}'s key holds {record}")


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
    for name in ("moved", "promoted", "dropped", "summarized"):
        expect(is_count(closed.get(name)), f"session/close lacks the consolidate field {name}: {closed}")
    expect(isinstance(closed.get("counts"), dict) and all(is_count(n) for n in closed["counts"].values()),
           f"session/close counts: {closed.get('counts')}")
    unknown = await s.t.call("memory/session/close", {"session": f"never-{m}"})
    expect(unknown.get("closed") == f"never-{m}", f"unknown session close: {unknown}")
    await expect_error(s, "memory/session/close", {}, (-32602,), "close without session")
    await expect_error(s, "memory/session/close", {"session": ""}, (-32602,), "close with empty session")


@check("sessions", "session/list entries are named sessions; records without a session are in none", writes=True)
async def _session_list_shape(s: Session) -> None:
    m = s.marker()
    await s.remember({"content": f"{m} no session", "metadata": {"m": m}},
                     {"content": f"{m} in one", "metadata": {"m": m}, "session": f"s-{m}"})
    listed = (await s.t.call("memory/session/list", {}))["sessions"]
    expect(isinstance(listed, list) and listed, f"session/list: {listed}")
    for entry in listed:
        expect(isinstance(entry.get("session"), str) and entry["session"], f"an entry that names no session: {entry}")
        expect(is_count(entry.get("records")), f"records of {entry}")
        for stamp in ("opened_at", "touched_at"):
            expect(entry.get(stamp) is None or is_stamp(entry[stamp]), f"{stamp} of {entry}")
    mine = [e for e in listed if e["session"] == f"s-{m}"]
    expect(len(mine) == 1 and mine[0]["records"] == 1, f"the session's entry: {mine}")
    # An empty session is no name: session/close refuses it, so a write naming it would make one nobody can close.
    await expect_error(s, "memory/remember", {"records": [{"content": f"{m} nameless", "metadata": {"m": m},
                                                           "session": ""}]}, (-32602,), "remember into session \"\"")
    expect(len(await s.timeline(where={"m": m})) == 2, "a record of session \"\" was written")


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
    await expect_error(s, "memory/fetch", {"key": 42}, (-32602,), "fetch with a numeric key")


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
    expect(all(isinstance(t, str) and is_count(n) for t, n in result["counts"].items()),
           f"consolidate counts must map tier names to counts: {result['counts']}")
    expect(await s.recall(query=m), "consolidate lost a record")


@check("tiers", "promote of unknown ids, or of ids already in the tier, counts nothing and is no error", writes=True)
async def _promote_noop(s: Session) -> None:
    m = s.marker()
    ids = await s.remember({"content": f"{m} stays", "metadata": {"m": m}})
    tier = (await s.timeline(where={"m": m}))[0]["tier"]
    for asked in ([f"unknown-{m}"], ids, ids + [f"unknown-{m}"]):
        result = await s.t.call("memory/promote", {"ids": asked, "tier": tier})
        expect(result.get("promoted") == 0, f"promote {asked} to {tier!r}, where they are or are not: {result}")
    expect([r["tier"] for r in await s.timeline(where={"m": m})] == [tier], "a no-op promote moved the record")
    await expect_error(s, "memory/promote", {"ids": ids}, (-32602,), "promote without a tier")


@check("tiers", "promote moves records to another tier: counted, shown there, one promoted event", writes=True)
async def _promote_move(s: Session) -> None:
    m = s.marker()
    ids = await s.remember({"content": f"{m} moves", "metadata": {"m": m}})
    source = (await s.timeline(where={"m": m}))[0]["tier"]
    tiers = [t for t in s.describe.get("tiers") or [] if t.get("name") != source and not t.get("read_only")
             and t.get("kind") in ("episodic", "semantic")]
    if not tiers:
        raise Skip("one writable tier: nowhere to promote to")
    dest = tiers[0]["name"]
    head = (await s.t.call("memory/events", {}))["cursor"] if "events" in s.caps else None
    result = await s.t.call("memory/promote", {"ids": ids + [f"unknown-{m}"], "tier": dest})
    expect(result.get("promoted") == 1, f"promote to {dest}: {result}")
    expect([r["tier"] for r in await s.timeline(where={"m": m})] == [dest], f"the record is not in {dest}")
    if head is not None:
        events = (await s.t.call("memory/events", {"cursor": head, "kinds": ["promoted"]}))["events"]
        expect(len(events) == 1 and events[0].get("ids") == ids and events[0].get("tier") == dest,
               f"promoted events: {events}")


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


@check("salience", "a recall counts as an access (access_count, accessed_at); touch: false does not (extension)",
       writes=True)
async def _touch(s: Session) -> None:
    m = s.marker()
    await s.remember({"content": f"{m} looked at", "metadata": {"m": m}})
    await s.recall(query=m, touch=False)
    record = (await s.timeline(where={"m": m}))[0]
    expect(record["access_count"] == 0 and record["accessed_at"] is None, f"touch: false touched {record}")
    await s.recall(query=m)
    deadline = time.monotonic() + 10  # a federation may count recalls in the background
    while True:
        record = (await s.timeline(where={"m": m}))[0]
        if record["access_count"] or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.05)
    expect(record["access_count"] == 1 and is_stamp(record["accessed_at"]), f"a recall did not count: {record}")


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
    dimensions = (await s.t.call("memory/describe", {})).get("embeddings", {}).get("dimensions")
    expect(dimensions == dims, f"describe says dimensions {dimensions!r} after {dims}-wide vectors were written")


@check("embeddings", "embeddings: true returns the vectors from recall and fetch too, and only then", writes=True)
async def _embeddings_everywhere(s: Session) -> None:
    m = s.marker()
    dims = s.dims()
    vector = [round((dims - i) / (dims + 1), 6) for i in range(dims)]
    key = f"{m}/vector"
    await s.remember({"content": f"{m} carries a vector", "embedding": vector, "metadata": {"m": m}, "key": key})

    def same(record: dict[str, Any] | None) -> bool:
        got = (record or {}).get("embedding")
        return isinstance(got, list) and len(got) == dims and all(abs(a - b) < 1e-6 for a, b in zip(got, vector))

    # (Not by `embedding` alone: a federation may leave tiers that never rank by vector out of that.)
    for params in ({"query": m}, {"where": {"m": m}}):
        plain = await s.recall(**params, touch=False)
        expect(len(plain) == 1 and plain[0].get("embedding") is None, f"recall {list(params)} without embeddings: true")
        full = await s.recall(**params, touch=False, embeddings=True)
        expect(len(full) == 1 and same(full[0]), f"recall {list(params)} with embeddings: true: {full}")
    if "keys" in s.caps:
        plain_record = (await s.t.call("memory/fetch", {"key": key}))["record"]
        expect(plain_record is not None and plain_record.get("embedding") is None, "fetch without embeddings: true")
        full_record = (await s.t.call("memory/fetch", {"key": key, "embeddings": True}))["record"]
        expect(same(full_record), f"fetch with embeddings: true: {full_record}")
    await expect_error(s, "memory/recall", {"embedding": vector + [0.5]}, (-32008,), "a query vector of the wrong width")


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


@check("external", "a uri is never dereferenced: not on write, recall or in the background", writes=True)
async def _external_never_fetched(s: Session) -> None:
    hits: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        hits.append(await reader.read(200))
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        m = s.marker()
        uri = f"http://127.0.0.1:{port}/{m}/report.pdf"
        await s.remember({"content": f"{m} a report", "uri": uri, "media_type": "application/pdf",
                          "metadata": {"m": m}}, {"content": "", "uri": uri + "?only=uri", "metadata": {"m": m}})
        found = await s.recall(query=m)
        expect(any(r.get("uri") == uri for r in found), f"the record was not recalled: {found}")
        await s.timeline(where={"m": m})
        await asyncio.sleep(0.1)  # a fetch on write or recall would have connected by now
    finally:
        server.close()
        await server.wait_closed()
    expect(not hits, f"the server fetched the uri: {hits[:1]}")


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


@check("events", "a reset continues from the oldest retained event; the next poll is no reset", writes=True)
async def _events_reset_continues(s: Session) -> None:
    owner = f"events-{s.marker()}" if "scopes" in s.caps else None
    scoped = {"owner": owner} if owner else {}
    m = s.marker()
    ids = await s.remember({"content": f"{m} one"}, {"content": f"{m} two"}, **scoped)
    seen: list[Any] = []
    result = await s.t.call("memory/events", {"cursor": f"foreign-{m}", **scoped})
    expect(result.get("reset") is True, f"a foreign cursor: {result}")
    for _ in range(50):  # page on from the oldest retained event
        seen += [e.get("id") for e in result["events"] if e.get("kind") == "written"]
        if not result.get("more"):
            break
        result = await s.t.call("memory/events", {"cursor": result["cursor"], **scoped})
        expect(not result.get("reset"), f"a poll from a cursor the server gave reset: {result}")
    expect(seen[-2:] == ids, f"a reset poll did not continue from the oldest retained event: {seen[-4:]} vs {ids}")
    after = await s.t.call("memory/events", {"cursor": result["cursor"], **scoped})
    expect(not after.get("reset") and after.get("events") == [], f"the poll after a reset: {after}")


@check("events", "written events carry the record's id, tier, session, key and revision", writes=True)
async def _events_written_fields(s: Session) -> None:
    head = (await s.t.call("memory/events", {}))["cursor"]
    m = s.marker()
    record: dict[str, Any] = {"content": f"{m} described"}
    if "sessions" in s.caps:
        record["session"] = f"s-{m}"
    if "keys" in s.caps:
        record["key"] = f"{m}/described"
    ids = await s.remember(record)
    if "keys" in s.caps:
        await s.remember({**record, "content": f"{m} described again"})
    written = [e for e in (await s.t.call("memory/events", {"cursor": head, "kinds": ["written"]}))["events"]
               if e.get("id") in ids]
    expect(len(written) == (2 if "keys" in s.caps else 1), f"written events {written}")
    tier = (await s.timeline(where={"id": ids[0]}))[0].get("tier")
    for n, event in enumerate(written, 1):
        expect(is_stamp(event.get("at")), f"event at {event.get('at')!r}")
        if "tiers" in s.caps:
            expect(event.get("tier") == tier, f"written event tier {event.get('tier')!r}, the record is in {tier!r}")
        if "sessions" in s.caps:
            expect(event.get("session") == f"s-{m}", f"written event session: {event}")
        if "keys" in s.caps:
            expect(event.get("key") == f"{m}/described" and event.get("revision") == n, f"written event key: {event}")


@check("events", "a key written twice in one batch is a written event per write, in batch order", writes=True,
       needs=("events", "keys"))
async def _events_key_twice(s: Session) -> None:
    """The batch is applied record by record (§3: revision + 1 per write of an occupied key), and each
    record of it that wrote is one event: the key's first write says revision 1, its second 2."""
    head = (await s.t.call("memory/events", {}))["cursor"]
    m = s.marker()
    key = f"{m}/twice"
    ids = await s.remember({"content": f"{m} v1", "key": key}, {"content": f"{m} plain"},
                           {"content": f"{m} v2", "key": key})
    expect(ids[0] == ids[2], f"a key written twice is one record: {ids}")
    polled = (await s.t.call("memory/events", {"cursor": head, "kinds": ["written"], "limit": 0}))["events"]
    got = [(e.get("id"), e.get("key"), e.get("revision")) for e in polled if e.get("id") in ids]
    expect(got == [(ids[0], key, 1), (ids[1], None, None), (ids[0], key, 2)], f"written events {got}")


@check("events", "session/close is one session_closed event; consolidate's event carries its counts", writes=True,
       needs=("events", "sessions", "tiers"))
async def _events_session_closed(s: Session) -> None:
    m = s.marker()
    await s.remember({"content": f"{m} talk", "session": f"s-{m}"})
    head = (await s.t.call("memory/events", {}))["cursor"]
    await s.t.call("memory/session/close", {"session": f"s-{m}"})
    events = (await s.t.call("memory/events", {"cursor": head}))["events"]
    closed = [e for e in events if e.get("kind") == "session_closed"]
    expect(len(closed) == 1 and closed[0].get("session") == f"s-{m}", f"session_closed events: {events}")
    head = (await s.t.call("memory/events", {}))["cursor"]
    await s.t.call("memory/consolidate", {})
    events = (await s.t.call("memory/events", {"cursor": head, "kinds": ["consolidated"]}))["events"]
    expect(len(events) == 1 and all(is_count(events[0].get(n)) for n in ("moved", "promoted", "dropped", "summarized")),
           f"consolidated event: {events}")


@check("events", "closing an unknown session is a no-op: no event, every record stays", writes=True,
       needs=("events", "sessions"))
async def _events_unknown_session_closed(s: Session) -> None:
    m = s.marker()
    ids = await s.remember({"content": f"{m} talk", "session": f"s-{m}"})
    before = (await s.t.call("memory/timeline", {"where": {"id": ids}}))["records"]
    head = (await s.t.call("memory/events", {}))["cursor"]
    answer = await s.t.call("memory/session/close", {"session": f"never-{m}"})
    events = (await s.t.call("memory/events", {"cursor": head}))["events"]
    expect(events == [], f"closing an unknown session told {events}")
    expect(answer.get("closed") == f"never-{m}" and answer.get("moved") == 0 and answer.get("flushed") == 0,
           f"closing an unknown session answered {answer}")
    after = (await s.t.call("memory/timeline", {"where": {"id": ids}}))["records"]
    expect([r.get("tier") for r in after] == [r.get("tier") for r in before], f"{before} became {after}")


@check("events", "with scopes, an owner's events reach only that owner", writes=True, needs=("events", "scopes"))
async def _events_scoped(s: Session) -> None:
    m = s.marker()
    alice, bob = f"alice-{m}", f"bob-{m}"
    heads = {o: (await s.t.call("memory/events", {"owner": o}))["cursor"] for o in (alice, bob)}
    ids = await s.remember({"content": f"{m} alice only"}, owner=alice)
    await s.t.call("memory/forget", {"ids": ids, "owner": alice})
    mine = (await s.t.call("memory/events", {"owner": alice, "cursor": heads[alice]}))["events"]
    theirs = (await s.t.call("memory/events", {"owner": bob, "cursor": heads[bob]}))["events"]
    expect([e["kind"] for e in mine] == ["written", "forgotten"], f"the owner's events: {mine}")
    expect(theirs == [], f"another owner saw {theirs}")
    crossed = await s.t.call("memory/events", {"owner": bob, "cursor": heads[alice]})
    expect(not any(e.get("id") in ids for e in crossed["events"]), "another owner's cursor showed the owner's events")


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
    expect(not rest.get("more"), f"the poll that read the rest says more: {rest}")


EVENT_KINDS = {"written", "forgotten", "promoted", "consolidated", "session_closed"}


@check("events", "every event is one of the protocol's kinds with an at; reads and reinforce add none", writes=True)
async def _events_kinds(s: Session) -> None:
    """§4 lists the events: written, forgotten, promoted, consolidated, session_closed, each with `kind`
    and `at`. A recall, a timeline, a fetch, a reinforce, a session list or a describe is none of them."""
    scoped = {"owner": f"kinds-{s.marker()}"} if "scopes" in s.caps else {}
    head = (await s.t.call("memory/events", dict(scoped)))["cursor"]
    m = s.marker()
    record: dict[str, Any] = {"content": f"{m} kinds"}
    if "keys" in s.caps:
        record["key"] = f"{m}/kinds"
    if "sessions" in s.caps:
        record["session"] = f"s-{m}"
    ids = await s.remember(record, **scoped)
    cursor = (await s.t.call("memory/events", {"cursor": head, **scoped}))["cursor"]
    await s.t.call("memory/recall", {"query": m, **scoped})
    await s.t.call("memory/timeline", {"limit": 5, **scoped})
    await s.t.call("memory/describe", dict(scoped))
    if "keys" in s.caps:
        await s.t.call("memory/fetch", {"key": f"{m}/kinds", **scoped})
    if "salience" in s.caps:
        await s.t.call("memory/reinforce", {"ids": ids, "amount": 0.1, **scoped})
    if "sessions" in s.caps:
        await s.t.call("memory/session/list", dict(scoped))
    await s.t.call("memory/recall", {"query": m, **scoped})
    quiet = await s.t.call("memory/events", {"cursor": cursor, **scoped})
    expect(quiet["events"] == [], f"reads and reinforce made events: {quiet['events']}")
    if "sessions" in s.caps:
        await s.t.call("memory/session/close", {"session": f"s-{m}", **scoped})
    if "tiers" in s.caps:
        await s.t.call("memory/consolidate", dict(scoped))
    await s.t.call("memory/forget", {"ids": ids, **scoped})
    events = (await s.t.call("memory/events", {"cursor": head, "limit": 0, **scoped}))["events"]
    expect(bool(events), "no events for a write, a close, a consolidate and a forget")
    for event in events:
        expect(event.get("kind") in EVENT_KINDS and is_stamp(event.get("at")), f"event {event}")


@check("events", "a forget that matches nothing is still one forgotten event, count 0", writes=True)
async def _events_forget_nothing(s: Session) -> None:
    head = (await s.t.call("memory/events", {}))["cursor"]
    m = s.marker()
    result = await s.t.call("memory/forget", {"ids": [f"{m}-never-written"]})
    expect(result == {"forgotten": 0}, f"forget of an unknown id: {result}")
    events = (await s.t.call("memory/events", {"cursor": head}))["events"]
    forgotten = [e for e in events if e.get("kind") == "forgotten"]
    expect(len(forgotten) == 1 and forgotten[0].get("count") == 0, f"forgotten events {forgotten}")


@check("events", "over HTTP, subscribe answers -32003 and describe says push: false", transport="http")
async def _events_http(s: Session) -> None:
    expect((s.describe.get("events") or {}).get("push") is False, "push must be false over HTTP")
    await expect_error(s, "memory/events/subscribe", {}, (-32003,), "subscribe over HTTP")
    off = await s.t.call("memory/events/unsubscribe", {})
    expect(off == {"subscribed": False}, f"unsubscribe over HTTP (never subscribed) is a no-op: {off}")


@check("events", "over stdio, subscribe pushes memory/event notifications", transport="stdio", writes=True)
async def _events_push(s: Session) -> None:
    assert isinstance(s.t, StdioTransport)
    result = await s.t.call("memory/events/subscribe", {})
    expect(result.get("subscribed") is True, f"subscribe: {result}")
    m = s.marker()
    ids = await s.remember({"content": f"{m} pushed"})

    def pushed_now() -> list[dict[str, Any]]:
        return [n for n in s.t.notifications if n.get("method") == "memory/event"
                and n.get("params", {}).get("id") in ids]

    deadline = time.monotonic() + 10  # a push may trail the answer, the more on a loaded machine
    while not pushed_now() and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.2)  # a duplicate would come right after the first
    pushed = pushed_now()
    expect(len(pushed) == 1, f"expected one pushed written event, got {len(pushed)}")
    expect(pushed[0].get("jsonrpc") == "2.0" and "id" not in pushed[0] and pushed[0]["params"].get("kind") == "written",
           f"a pushed event is a memory/event notification: {pushed[0]}")
    off = await s.t.call("memory/events/unsubscribe", {})
    expect(off.get("subscribed") is False, f"unsubscribe: {off}")
    again = await s.t.call("memory/events/unsubscribe", {})
    expect(again.get("subscribed") is False, "unsubscribe when not subscribed must be a no-op")
    before = len(s.t.notifications)
    await s.remember({"content": f"{m} not pushed"})
    await s.t.call("memory/events/subscribe", {"kinds": ["forgotten"]})
    ids = await s.remember({"content": f"{m} filtered"})
    await s.t.call("memory/forget", {"ids": ids})
    await s.t.call("memory/events/unsubscribe", {})  # one pipe: what was pushed before it has arrived
    kinds = [n.get("params", {}).get("kind") for n in s.t.notifications[before:] if n.get("method") == "memory/event"]
    expect(kinds == ["forgotten"], f"subscribe with kinds [forgotten] pushed {kinds}")


@check("events", "over stdio, a pushed event is the event a poll shows, in the same order", transport="stdio",
       writes=True)
async def _events_push_is_poll(s: Session) -> None:
    """Each event arrives as a notification whose params are the event (§4): the same fields as the
    poll gives, the same order, nothing left out and nothing twice."""
    assert isinstance(s.t, StdioTransport)
    head = (await s.t.call("memory/events", {}))["cursor"]
    before = len(s.t.notifications)
    await s.t.call("memory/events/subscribe", {})
    m = s.marker()
    records: list[dict[str, Any]] = [{"content": f"{m} {i}"} for i in range(3)]
    if "keys" in s.caps:
        records += [{"content": f"{m} v1", "key": f"{m}/k"}, {"content": f"{m} v2", "key": f"{m}/k"}]
    ids = await s.remember(*records)
    await s.t.call("memory/forget", {"ids": ids[:1]})
    await s.t.call("memory/events/unsubscribe", {})  # one pipe: what was pushed before it has arrived
    pushed = [n["params"] for n in s.t.notifications[before:] if n.get("method") == "memory/event"]
    polled = (await s.t.call("memory/events", {"cursor": head, "limit": 0}))["events"]
    expect(pushed == polled, f"pushed {pushed}\npolled {polled}")


@check("events", "over stdio, subscribe with an owner pushes only that owner's events; bad params are -32602",
       transport="stdio", writes=True, needs=("events", "scopes"))
async def _events_push_scoped(s: Session) -> None:
    assert isinstance(s.t, StdioTransport)
    m = s.marker()
    alice, bob = f"alice-{m}", f"bob-{m}"
    for params, field_name in (({"kinds": ["nonsense"]}, "kinds"), ({"kinds": "written"}, "kinds"),
                               ({"owner": 5}, "owner")):
        await expect_invalid(s, "memory/events/subscribe", params, field_name, f"subscribe {params}")
    before = len(s.t.notifications)
    await s.t.call("memory/events/subscribe", {"owner": alice})
    theirs = await s.remember({"content": f"{m} bob's"}, owner=bob)
    mine = await s.remember({"content": f"{m} alice's"}, owner=alice)
    await s.remember({"content": f"{m} nobody's"})
    await s.t.call("memory/events/unsubscribe", {})
    pushed = [n["params"].get("id") for n in s.t.notifications[before:] if n.get("method") == "memory/event"]
    expect(pushed == mine, f"subscribed as {alice}, pushed {pushed} (bob's: {theirs})")


@check("events", "over stdio, describe says push: true", transport="stdio")
async def _events_push_declared(s: Session) -> None:
    expect((s.describe.get("events") or {}).get("push") is True, f"events: {s.describe.get('events')}")


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
    offered = (s.describe.get("prompt") or {}).get("methods") or []
    for method in ("template", "model", "none"):
        if method not in offered:
            await expect_error(s, "memory/recall", {"query": m, "prompt": {"method": method}}, (-32602,),
                               f"unoffered prompt method {method}")
    if "template" in offered:
        default = await s.t.call("memory/recall", {"query": m, "touch": False, "prompt": {}})
        expect(isinstance(default.get("prompt"), str) and m in default["prompt"], "the default prompt method")
    trimmed = await s.t.call("memory/recall", {"query": m, "touch": False, "prompt": {"style": "facts", "budget": 12}})
    expect([r["id"] for r in trimmed["records"]] == [r["id"] for r in plain["records"]], "a budget changed the records")
    contents = {r["id"]: r["content"] for r in trimmed["records"]}
    kept = trimmed.get("prompt_ids", [])
    expect(set(kept) < set(contents) and all(contents[i] in trimmed["prompt"] for i in kept),
           f"a budget must drop whole records: {kept} of {list(contents)}, prompt {trimmed.get('prompt')!r}")


@check("prompt", "a bad prompt option answers -32602 naming it, on recall and timeline; a null option is its default",
       writes=True)
async def _prompt_options(s: Session) -> None:
    m = s.marker()
    await s.remember({"content": f"{m} drinks coffee", "role": "user", "metadata": {"m": m}})
    bad: list[tuple[Any, str]] = [(0, "prompt"), (1, "prompt"), ("true", "prompt"), ([], "prompt"),
                                  ({"style": f"no-such-style-{m}"}, "prompt.style"),
                                  ({"budget": -1}, "prompt.budget"), ({"budget": 1.5}, "prompt.budget"),
                                  ({"budget": True}, "prompt.budget"), ({"budget": "10"}, "prompt.budget"),
                                  ({"cite": "false"}, "prompt.cite")]
    for method in ("memory/recall", "memory/timeline"):
        for value, name in bad:
            await expect_invalid(s, method, {"where": {"m": m}, "prompt": value}, name, f"{method} prompt {value!r}")
        given = await s.t.call(method, {"where": {"m": m}, "touch": False, "prompt": True})
        nulls = await s.t.call(method, {"where": {"m": m}, "touch": False, "prompt": {
            "method": None, "style": None, "model": None, "budget": None, "cite": None}})
        expect(nulls.get("prompt") == given.get("prompt") and m in given.get("prompt", ""),
               f"{method}: null prompt options gave {nulls.get('prompt')!r}, not the defaults' {given.get('prompt')!r}")


@check("prompt", "a timeline prompt never changes the records; its ids are records shown, in their order; "
                 "a budget drops whole records", writes=True)
async def _prompt_timeline(s: Session) -> None:
    m = s.marker()
    for i in range(4):
        await s.remember({"content": f"{m} turn {'abcd'[i]} of a long enough conversation", "role": "user",
                          "metadata": {"m": m}})
    plain = await s.timeline(where={"m": m})
    for prompt in (True, {"style": "facts"}, {"style": "transcript", "cite": True}, {"budget": 20}, {"budget": 0},
                   {"style": "facts", "budget": 25}):
        result = await s.t.call("memory/timeline", {"where": {"m": m}, "prompt": prompt})
        order = [r["id"] for r in plain]
        expect([r["id"] for r in result["records"]] == order, f"timeline with prompt {prompt} changed the records")
        shown = result.get("prompt_ids")
        expect(isinstance(result.get("prompt"), str) and isinstance(shown, list)
               and shown == [i for i in order if i in shown],
               f"prompt {prompt}: prompt_ids {shown} are not records of the result in their order")
        contents = {r["id"]: r["content"] for r in plain}
        expect(all(contents[i] in result["prompt"] for i in shown),
               f"prompt {prompt}: a record shown only in part: {result['prompt']!r}")
        if isinstance(prompt, dict) and prompt.get("budget") is not None:
            expect(len(shown) < len(plain), f"prompt {prompt}: a budget of {prompt['budget']} kept every record")
        else:  # the default method renders every record it is given
            expect(len(shown) == len(plain), f"prompt {prompt} without a budget left records out: {shown}")


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


@check("summarize", "summarize at a key replaces what is there; unknown ids read nothing; unknown into is -32002",
       writes=True)
async def _summarize_key(s: Session) -> None:
    m = s.marker()
    nothing = await s.t.call("memory/summarize", {"ids": [f"unknown-{m}"]})
    expect(nothing.get("read") == 0 and nothing.get("written") == 0 and nothing.get("records") == [],
           f"summarize of unknown ids: {nothing}")
    ids = await s.remember({"content": f"{m} moved to Lisbon in March 2024."},
                           {"content": f"{m} works as a translator for a Dutch firm."})
    await expect_error(s, "memory/summarize", {"ids": ids, "into": f"no-such-tier-{m}"}, (-32002,), "into an unknown tier")
    key = f"summaries/{m}"
    first = await s.t.call("memory/summarize", {"ids": ids, "key": key})
    if first.get("written") == 0:
        raise Skip("the server declined to summarize")
    expect(first.get("written") == 1 and len(first.get("records", [])) == 1, f"summarize at a key: {first}")
    summary = first["records"][0]
    expect(summary.get("key") == key and "score" not in summary, f"the written summary: {summary}")
    second = await s.t.call("memory/summarize", {"ids": ids, "key": key})
    expect([r["id"] for r in second.get("records", [])] == [summary["id"]], f"a second summary at {key}: {second}")
    if "keys" in s.caps:
        fetched = (await s.t.call("memory/fetch", {"key": key}))["record"]
        expect(fetched is not None and fetched["id"] == summary["id"] and fetched.get("revision") == 2,
               f"the key holds {fetched}")


@check("summarize", "summarize never deletes a source, not even one at the key it is asked to write",
       writes=True, needs=("summarize", "keys"))
async def _summarize_source_at_key(s: Session) -> None:
    m = s.marker()
    key = f"app/{m}/city"
    ids = await s.remember({"content": f"{m} lives in Rome since 2020.", "key": key, "metadata": {"m": m}},
                           {"content": f"{m} moved there on 3 May 2021.", "metadata": {"m": m}})
    for params in ({"ids": ids}, {"where": {"m": m}}, {"query": m}):
        try:
            await s.t.call("memory/summarize", {**params, "key": key})
        except RPCError as exc:
            expect(exc.code == -32602, f"summarize {params} at a source's key: error {exc.code}")
        held = {r["id"]: r for r in await s.timeline(where={"m": m})}
        expect(held.get(ids[0], {}).get("content") == f"{m} lives in Rome since 2020.",
               f"summarize {params} at {key} replaced the source there: {held.get(ids[0])}")
        expect(ids[1] in held, f"summarize {params} deleted a source")


@check("summarize", "a summary at a key takes no source's place within limit: repeated, it reads as many records",
       writes=True, needs=("summarize", "keys"))
async def _summarize_key_limit(s: Session) -> None:
    m = s.marker()
    prefix = f"notes/{m}/"
    ids = await s.remember({"content": f"{m} Anna flew to Rome on 3 May.", "key": prefix + "a"},
                           {"content": f"{m} Marco met her there on 4 May.", "key": prefix + "b"})
    texts = []
    for revision in (1, 2, 3):
        result = await s.t.call("memory/summarize", {"key_prefix": prefix, "limit": 2, "key": prefix + "digest"})
        if result.get("written") == 0 and revision == 1:
            raise Skip("the server declined to summarize")
        expect(result.get("read") == 2 and result.get("written") == 1,
               f"summary {revision} at {prefix}digest of the two newest other records: {result}")
        texts.append(result["records"][0]["content"])
    expect(len(set(texts)) == 1, f"the same sources gave different summaries: {texts}")
    still = {r["id"] for r in await s.timeline(key_prefix=prefix)}
    expect(set(ids) <= still, "summarize deleted its sources")


@check("summarize", "a summary is the caller's ordinary record, readable at once; limit bounds what is read; "
                    "a key_prefix alone is a selector", writes=True)
async def _summarize_record(s: Session) -> None:
    m = s.marker()
    ids = await s.remember(*[{"content": f"{m} visited Lisbon on {d} March 2024.", "metadata": {"m": m}}
                             for d in (3, 4, 5)])
    nothing = await s.t.call("memory/summarize", {"key_prefix": f"none/{m}/"})
    expect((nothing.get("read"), nothing.get("written"), nothing.get("records")) == (0, 0, []),
           f"summarize of an empty key_prefix: {nothing}")
    limited = await s.t.call("memory/summarize", {"where": {"m": m}, "limit": 2})
    expect(limited.get("read") == 2, f"summarize with limit 2 read {limited.get('read')}")
    writable = [t["name"] for t in s.describe.get("tiers") or [] if not t.get("read_only")]
    into = {"into": writable[0]} if "tiers" in s.caps and writable else {}
    result = await s.t.call("memory/summarize", {"where": {"m": m}, **into})
    expect(result.get("read") == 3, f"summarize of three records read {result.get('read')}")
    if result.get("written") == 0:
        raise Skip("the server declined to summarize")
    expect(result.get("written") == 1 and len(result.get("records", [])) == 1, f"summarize: {result}")
    summary = result["records"][0]
    expect(isinstance(summary.get("id"), str) and isinstance(summary.get("content"), str)
           and is_stamp(summary.get("created_at")) and "score" not in summary, f"the summary record: {summary}")
    if into:
        expect(summary.get("tier") == into["into"], f"summary into {into['into']} landed in {summary.get('tier')}")
    found = await s.timeline(where={"id": summary["id"]})
    expect([r["id"] for r in found] == [summary["id"]], "the summary is not readable right after summarize returns")
    still = {r["id"] for r in await s.timeline(where={"m": m})}
    expect(set(ids) <= still, "summarize deleted its sources")
    if "scopes" in s.caps:
        stranger = f"stranger-{m}"
        expect(not await s.timeline(where={"id": summary["id"]}, owner=stranger), "another owner sees the summary")


@check("scopes", "a summary never reads another owner's records", writes=True, needs=("scopes", "summarize"))
async def _summarize_owner(s: Session) -> None:
    m = s.marker()
    alice, carol = f"alice-{m}", f"carol-{m}"
    ids = await s.remember({"content": f"{m} alice met Bruno in Oslo on 9 May.", "metadata": {"m": m}},
                           {"content": f"{m} alice paid 300 crowns.", "metadata": {"m": m}}, owner=alice)
    for params in ({"ids": ids}, {"query": m}, {"where": {"m": m}}, {"where": {"m": m, "owner": alice}}):
        result = await s.t.call("memory/summarize", {**params, "owner": carol})
        expect((result.get("read"), result.get("written"), result.get("records")) == (0, 0, []),
               f"{carol} summarising {params} read {alice}'s records: {result}")
    expect(len(await s.timeline(where={"m": m}, owner=alice)) == 2, "another owner's summarize changed the records")
    expect(not await s.timeline(where={"m": m}, owner=carol), "a summary was written for an owner with no records")


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
    for method, params, code in (("memory/recall", {"tier": "no-such-tier"}, -32002 if "tiers" in s.caps else None),
                                  ("memory/no_such_method", {}, -32601), ("memory/recall", {"limit": "x"}, -32602)):
        reply = await s.t.post(json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).encode())
        expect(reply.status == 200, f"{method} {params}: HTTP {reply.status}")
        error = reply.json().get("error") or {}
        expect(code is None or error.get("code") == code, f"{method} {params}: {reply.body[:160]!r}")


@check("http", "GET /.well-known/a2m-server.json serves describe", transport="http")
async def _http_well_known(s: Session) -> None:
    assert isinstance(s.t, HTTPTransport)
    reply = await s.t.get("/.well-known/a2m-server.json")
    expect(reply.status == 200, f"well-known gave {reply.status}")
    doc = reply.json()
    expect(doc.get("protocol") == "a2m/0.1" and "capabilities" in doc, f"well-known body {doc}")
    expect(doc["capabilities"] == s.describe["capabilities"] and doc.get("methods") == s.describe.get("methods"),
           "the well-known document and memory/describe disagree")
    expect("events" not in s.caps or doc.get("events", {}).get("push") is False, f"well-known events {doc.get('events')}")


# ---------------------------------------------------------------- stdio rules

@check("stdio", "stdout carries only JSON-RPC", transport="stdio")
async def _stdio_clean(s: Session) -> None:
    assert isinstance(s.t, StdioTransport)
    await s.t.call("memory/describe", {})
    expect(not s.t.bad_lines, f"non-JSON on stdout: {s.t.bad_lines[:3]}")
    strays = [n for n in s.t.notifications if n.get("jsonrpc") != "2.0" or n.get("method") != "memory/event"]
    expect(not strays, f"a server sends no requests and no notification but memory/event: {strays[:2]}")


@check("stdio", "line breaks inside strings never break the one-message-per-line framing", transport="stdio",
       writes=True)
async def _stdio_newlines(s: Session) -> None:
    assert isinstance(s.t, StdioTransport)
    m = s.marker()
    content = f"{m} line one\nline two\r\nthree\u2028four\u2029five\u0085six"
    await s.remember({"content": content, "metadata": {"m": m, "note": "a\nb"}})
    records = await s.timeline(where={"m": m})
    expect([r["content"] for r in records] == [content] and records[0]["metadata"]["note"] == "a\nb",
           f"content with line breaks came back as {[r['content'] for r in records]!r}")
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
