"""memory/summarize across the federation: read the records a selector names, extract a summary
(`a2m.summarize`), and write it as one record (decisions 46, 71, 103).

The read is the router's own recall or timeline, so a summary covers what a caller would see; the
write is the router's own write path, so a summary's key is located, routed and replaced as any is.
"""

from __future__ import annotations

from typing import Any, Mapping

from a2m.dispatch import Context
from a2m.errors import invalid
from a2m.filters import parse_scope
from a2m.params import limit_param, query_param, str_param
from a2m.records import Record
from a2m.summarize import SUMMARY_CHARS, summarize as extract_summary

from .federation import Federation, Tier
from .policy import Policy
from .reads import Reads, written_order
from .scope import read_only, scope_tiers, tier_named
from .writes import Writes, locate


class Summaries:
    """memory/summarize, over the router's own reads and writes."""

    def __init__(self, fed: Federation, policy: Policy, reads: Reads, writes: Writes, limits: Mapping[str, int],
                 default_tier: str) -> None:
        self.fed = fed
        self.policy = policy
        self.reads = reads
        self.writes = writes
        self.limits = limits
        self.default_tier = default_tier

    def _summary_tier(self, params: Mapping[str, Any]) -> Tier:
        if params.get("into") is not None:
            into = tier_named(self.fed, params["into"], "into")
        else:
            semantic = [t for t in self.fed if t.config.kind == "semantic" and t.writable]
            into = semantic[0] if semantic else self.fed[self.default_tier]
        if not into.writable:
            raise read_only(into)
        return into

    def _keeping(self, into: Tier, asked: bool, owner: str | None, key: str | None) -> Tier:
        """`into`, or where no `into` was asked and it would drop the summary's owner or key (a tier of
        another implementation without `scopes` or `keys`, decision 170), the first semantic tier,
        else the default tier, that keeps them. Checked before any source is read: the summary's own
        write was refused after the whole read, about `records[0]`, a record the caller never sent."""
        fields = {"owner": owner, "key": key}
        if not asked and into.drops(fields) is not None:
            candidates = [*(t for t in self.fed if t.config.kind == "semantic"), self.fed[self.default_tier]]
            into = next((t for t in candidates if t.writable and t.drops(fields) is None), into)
        lost = into.drops(fields)
        if lost is not None:
            name, capability = lost
            raise invalid(f"{'into: tier' if asked else 'no tier to hold the summary: tier'} {into.name} does not "
                          f"declare {capability}, so it would not keep the summary's {name}"
                          f"{'; summarize into a tier that does' if asked else ''}",
                          field="into" if asked else name, tier=into.name, capability=capability)
        return into

    async def summarize(self, params: dict[str, Any], ctx: Context) -> dict[str, Any]:
        scope_tiers(self.fed, params)  # an unknown `tier` is -32002 before anything is read, or the owner checked,
        into = self._summary_tier(params)  # as on a tier server
        owner = ctx.owner(params)
        scope = parse_scope(params, owner, ids_field=True)
        query = query_param(params)
        key = str_param(params, "key")
        if key == "":  # as remember and fetch answer it: an empty key is no address, not "no key"
            raise invalid("key must not be empty", field="key")
        if scope.is_empty_selector() and not query and params.get("tier") is None:
            raise invalid("summarize needs a selector (ids, query, tier, where or key_prefix)")
        into = self._keeping(into, params.get("into") is not None, owner, key)
        limit = limit_param(params, self.limits, 50)
        # no `cursor` either: a tier's summarize takes none, and the router's timeline would walk by it
        asked = {k: v for k, v in params.items() if k not in ("prompt", "into", "key", "ids", "cursor")}
        if scope.ids is not None:  # `ids` narrows the other selectors and `limit`, as on a tier server
            where = dict(scope.where)
            named = where.get("id", scope.ids)
            named = {named} if isinstance(named, str) else set(named) if isinstance(named, list) else set()
            asked["where"] = {**where, "id": [i for i in scope.ids if i in named]}  # a set: 200,000 ids in a
            # list took 185 s of the event loop, every other caller's call waiting behind it
        cap = self.limits.get("max_recall_limit")
        wanted = limit + 1 if key and limit and (not cap or limit < cap) else limit  # room for the summary at key
        if query:
            read = await self.reads.recall(asked | {"limit": wanted, "touch": False}, ctx)
        else:
            read = await self.reads.timeline(asked | {"limit": wanted}, ctx)
        sources = read["records"]
        partial = {"degraded": read["degraded"]} if read.get("degraded") else {}  # a tier left out, as a read says
        if key:  # the summary this call replaces is no source of its own next revision, nor takes one's place
            sources = [r for r in sources if not (r.get("key") == key and "summary_of" in (r.get("metadata") or {}))]
            if limit and len(sources) > limit:
                sources = sources[:limit] if query else sources[-limit:]  # the best hits; the newest records
            held = next((r["id"] for r in sources if r.get("key") == key), None)
            if held is not None:  # writing there would replace, so delete, one of the sources
                raise invalid(f"key {key!r} holds {held}, one of the records summarised; a summary never "
                              "replaces its sources: choose another key", field="key", id=held)
        records = [Record.from_wire(r) for r in sources]
        if query:  # told, and listed in summary_of, as timeline replays them: not in rank order
            order = await written_order(self.fed, self.policy, owner, records)
            place = {record_id: i for i, record_id in enumerate(order or ())}
            records.sort(key=lambda r: (r.created_at, place.get(r.id, 0)))
        # As long as the router and the tier written to take (a summary refused by its own write
        # answered -32602 about `records[0].content`, a param the caller never sent).
        room = [self.limits.get("max_content_length"), into.limit("max_content_length")]
        text = extract_summary(records, max_chars=min([SUMMARY_CHARS, *(n for n in room if n)]))
        if not text:
            return {"records": [], "read": len(records), "written": 0, **partial}
        summary: dict[str, Any] = {"content": text, "role": "memory", "metadata": {"summary_of": [r.id for r in records]}}
        if key:
            summary["key"] = key
        if params.get("into") is not None:
            summary["tier"] = into.name  # asked for: a key living elsewhere is then refused, as on remember
        ids = await self.writes.write([summary], owner, tier=into.name)
        stored = await self.policy.by_ids(self.fed[into.name], owner, ids)
        if not stored:  # a key write may have landed where the key already lived
            located, _ = await locate(self.fed, "id", ids, owner, list(self.fed))
            stored = [record for _, record in located.values()]
        return {"records": stored, "read": len(records), "written": 1, **partial}

