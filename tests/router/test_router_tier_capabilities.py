"""A router declares every capability, and a tier behind it may declare fewer (a tier server of
another implementation): what the router accepts must still be what it can honour there."""

from __future__ import annotations

from pathlib import Path

import pytest

from a2m.client import HTTPClient
from a2m.errors import A2MError

from .stack import federation, new_owner, tier_call

pytestmark = pytest.mark.anyio

TIERS = [
    {"name": "plain", "kind": "episodic", "serve": "fixture", "args": ["--capabilities", "tiers"]},
    {"name": "keyed", "kind": "semantic", "serve": "fixture"},
]


async def test_a_key_bound_for_a_tier_without_keys_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    """The router declares `keys`, so a keyed write must be fetchable and replaced when written
    again (§3). Sent to a tier that does not declare keys, the key was accepted, then `memory/fetch`
    (which asks only tiers with keys) answered null and a second write made a second record. It is
    refused with -32602 naming the tier, before any tier is written; the same key aimed at a tier
    with keys is written and fetched."""
    me = new_owner()
    with federation(tmp_path, TIERS, top={"default_tier": "plain"}) as stack:
        async with HTTPClient(stack.url) as router:
            for params in ({"records": [{"content": "ok"}, {"content": "city is Rome", "key": "user/city"}]},
                           {"records": [{"content": "city is Rome", "key": "user/city", "tier": "plain"}]}):
                with pytest.raises(A2MError) as refused:
                    await router.call("memory/remember", {"owner": me, **params})
                assert refused.value.code == -32602 and "plain" in refused.value.message, refused.value
            for tier in ("plain", "keyed"):
                assert (await tier_call(stack, tier, "memory/timeline", {"owner": me, "limit": 0}))["records"] == []
            ids = (await router.call("memory/remember", {"owner": me, "records": [
                {"content": "city is Rome", "key": "user/city", "tier": "keyed"}]}))["ids"]
            fetched = (await router.call("memory/fetch", {"owner": me, "key": "user/city"}))["record"]
            assert fetched is not None and fetched["id"] == ids[0]
            # Its key lives in `keyed` now: written again without a tier, it is replaced there.
            again = (await router.call("memory/remember", {"owner": me, "records": [
                {"content": "city is Milan", "key": "user/city"}]}))["ids"]
            assert again == ids
