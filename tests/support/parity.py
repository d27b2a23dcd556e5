"""What the seeded differential tests (`tests/*/test_*_parity.py`) share: awkward values, and the
comparisons each of them makes.

Each test keeps its own ids, keys, prefixes and `where` generator, because each
probes its own engine's hazards (LIKE metacharacters and jsonb numerics for
episodic, glob characters for Redis, file names for git, ulp-sensitive floats
for Qdrant); the values every store must keep exactly, and what "the same
record" means, are here.
"""

from __future__ import annotations

import math
import random
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Iterator, Sequence

import pytest

from a2m.dispatch import Context, Dispatcher
from a2m.filters import Scope
from a2m.text import query_terms, tokenize
from backends.serve import build
from backends.settings import TierSettings
from backends.surface import TierServer

# Numbers a careless store changes: past 2**53, floats that look like integers, the ends of the range.
NUMBERS: list[Any] = [1, 2, 2.0, 1.5, 0, -3, 2**53 + 1, 2**53, float(2**53), 0.1 + 0.2, 0.3, 1e16, 10**16, 2.0**60,
                      2**60, 1e20, 5e-324, -0.0, 1e-7]
STRINGS: list[Any] = ["food", "work", "1", "", "it's \"quoted\"", "back\\slash", "50%", "a_b", "città 寿司", "null",
                      "true"]
WORDS = ["cat", "sofa", "revenue", "grew", "city", "bologna", "milan", "tea", "green", "rocket", "città", "寿司", "the",
         "of"]
NESTED: list[Any] = [{}, {"a": 1}, {"a": {"b": [1, "x", None, 2.0**60]}}, [["a"], {"b": True}]]


def meta_value(rng: random.Random, numbers: Sequence[Any] = NUMBERS, strings: Sequence[Any] = STRINGS,
               nested: Sequence[Any] = NESTED) -> Any:
    roll = rng.random()
    if roll < 0.35:
        return rng.choice(numbers)
    if roll < 0.6:
        return rng.choice(strings)
    if roll < 0.7:
        return rng.choice([True, False, None])
    if roll < 0.9:
        return [rng.choice([*numbers, *strings, True, False, None]) for _ in range(rng.randint(0, 3))]
    return rng.choice(nested)


def scalar(rng: random.Random, numbers: Sequence[Any] = NUMBERS, strings: Sequence[Any] = STRINGS) -> Any:
    return rng.choice([*numbers, *strings, True, False, None, None])


def text(rng: random.Random, n: int, words: Sequence[str] = WORDS) -> str:
    return " ".join(rng.choice(words) for _ in range(n))


def selectors(rng: random.Random, params: dict[str, Any], held: list[dict[str, Any]],
              where: Callable[[random.Random, Any, list[dict[str, Any]]], dict[str, Any]],
              prefixes: Sequence[str], stamps: Sequence[str]) -> None:
    """Add a random `where`, `key_prefix` (often a prefix of a key held, metacharacters and all),
    `after` and `before` to `params`."""
    if rng.random() < 0.5:
        params["where"] = where(rng, params.get("owner"), held)
    if rng.random() < 0.3:
        keys = [r["key"] for r in held if r["key"]]
        if keys and rng.random() < 0.6:
            key = rng.choice(keys)
            params["key_prefix"] = key[:rng.randint(0, len(key))]
        else:
            params["key_prefix"] = rng.choice(prefixes)
    if rng.random() < 0.2:
        params["after"] = rng.choice(stamps)
    if rng.random() < 0.2:
        params["before"] = rng.choice(stamps)


def same(a: Any, b: Any, *, signed_zero: bool = False, ordered_keys: bool = False) -> bool:
    """JSON equality with types: 1 is not 1.0 nor True. -0.0 is 0.0 (both are JSON's 0) unless
    `signed_zero`; an object's key order counts only with `ordered_keys`."""
    if isinstance(a, dict) and isinstance(b, dict):
        keys_match = list(a) == list(b) if ordered_keys else a.keys() == b.keys()
        return keys_match and all(same(a[k], b[k], signed_zero=signed_zero, ordered_keys=ordered_keys) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y, signed_zero=signed_zero, ordered_keys=ordered_keys)
                                        for x, y in zip(a, b))
    if signed_zero and isinstance(a, float) and isinstance(b, float):
        return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
    return type(a) is type(b) and a == b


def holds_term(record: dict[str, Any], query: str) -> bool:
    """Whether the record's content holds a term of the query (the shared tokenizer's)."""
    return not query_terms(query).isdisjoint(tokenize(record["content"]))


def without_embedding(record: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in record.items() if k != "embedding"}


class Served:
    """A tier server built as `a2m serve` builds it, on its engine in `data_dir`, called through the
    dispatcher, with a clock the test moves (`tick`) so every write's stamp is known."""

    def __init__(self, name: str, data_dir: Path, clock: Iterator[str]) -> None:
        self.name, self.data_dir, self._clock = name, data_dir, clock
        self.stamp = {"now": next(clock)}
        self.server: TierServer | None = None
        self.d: Dispatcher | None = None

    def tick(self) -> None:
        self.stamp["now"] = next(self._clock)

    async def start(self) -> None:
        self.server = build(self.name, TierSettings(self.name, self.data_dir))
        await self.server.startup()
        self.d = Dispatcher(self.server)

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.shutdown()
            self.server = self.d = None

    async def restart(self) -> None:
        await self.stop()
        await self.start()

    async def call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """The result, or {"error": code}; an internal error's message is printed (shown with a failure)."""
        assert self.d is not None
        reply = await self.d.handle({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}, Context())
        assert reply is not None
        if "error" in reply and reply["error"]["code"] == -32603:
            print("internal error:", method, reply["error"]["message"][:1500])
        return {"error": reply["error"]["code"]} if "error" in reply else reply["result"]

    async def state(self, owner: str | None) -> list[dict[str, Any]]:
        """Every record of `owner` in creation order, complete."""
        params: dict[str, Any] = {"embeddings": True, "limit": 0} | ({} if owner is None else {"owner": owner})
        answer = await self.call("memory/timeline", params)
        assert "records" in answer, answer
        assert len(answer["records"]) < 1000, "the test needs every record in one timeline"
        return answer["records"]

    def scope(self, params: dict[str, Any], *, ids_field: bool = False) -> Scope:
        assert self.server is not None
        return self.server._scope(params, Context(), ids_field=ids_field)


@asynccontextmanager
async def served(name: str, data_dir: Path, monkeypatch: pytest.MonkeyPatch, *,
                 first_minute: int = 1) -> AsyncIterator[Served]:
    """`Served`, started; the surface's and the records' clock is its clock (one second a tick from
    10:<first_minute>:00 on 2026-03-01)."""
    tier = Served(name, data_dir, iter(f"2026-03-01T10:{m:02d}:{s:02d}.000Z"
                                       for m in range(first_minute, 60) for s in range(60)))
    monkeypatch.setattr("backends.surface.now", lambda: tier.stamp["now"])
    monkeypatch.setattr("a2m.records.now", lambda: tier.stamp["now"])
    await tier.start()
    try:
        yield tier
    finally:
        await tier.stop()
