"""Moves between tiers that a caller asks for: promote, consolidate and session close, with
session list beside close.

The moves themselves are the policy's (`policy.py`: write, verify, delete); here they are asked
for, and their outcome is told: one event per call, the tiers' counts after it, and a tier that
could not be reached named (decision 97), as a destination's refusal is (decision 100).
"""

from __future__ import annotations

from typing import Any, Callable

from a2m import errors
from a2m.dispatch import Context
from a2m.errors import A2MError, invalid
from a2m.events import EventLog
from a2m.params import ids_param, required_str

from .federation import FanOut, Federation
from .intents import Intents
from .policy import Policy, Refusals
from .reads import settled
from .scope import read_only, tier_named, with_owner


class Moves:
    """promote, consolidate, session/list and session/close; `degraded(out, fan)` names (and counts)
    the tiers `fan` left out."""

    def __init__(self, fed: Federation, policy: Policy, events: EventLog, intents: Intents, *,
                 degraded: Callable[[dict[str, Any], FanOut], dict[str, Any]]) -> None:
        self.fed = fed
        self.intents = intents
        self.policy = policy
        self.events = events
        self.degraded = degraded

    async def promote(self, params: dict[str, Any], ctx: Context) -> dict[str, Any]:
        ids = ids_param(params)
        if params.get("tier") is None:
            raise invalid("tier is required", field="tier")
        dest = tier_named(self.fed, params["tier"])
        owner = ctx.owner(params)
        salience = params.get("salience")
        if salience is not None and (not isinstance(salience, (int, float)) or isinstance(salience, bool)
                                     or not 0 <= salience <= 1):
            raise invalid("salience must be a number in [0, 1]", field="salience")
        if not dest.writable:
            raise read_only(dest)
        if dest.gated:
            raise invalid(f"tier {dest.name} holds writes for review until memory/approve, so a move there cannot be "
                          "verified; write the record there with memory/remember instead", field="tier")
        wanted = set(ids)
        moved: list[str] = []
        refused: Refusals = []
        try:
            for source in self.fed:
                if source is dest or not source.writable or not wanted:
                    continue
                here = await self.policy.move(source, dest, owner, sorted(wanted), reason="promote",
                                              salience=None if salience is None else float(salience),
                                              refused=refused)
                moved += here
                wanted -= set(here)
            promoted = len(set(ids) & set(moved))
            if wanted and not dest.healthy:  # a move into a down tier is skipped: not "unknown ids" (decision 14)
                raise A2MError(errors.INTERNAL_ERROR, f"promote incomplete: tier {dest.name} did not answer "
                               f"({promoted} promoted); the rest stay where they are",
                               {"promoted": promoted, "degraded": [dest.name]})
            if refused:  # the destination's own answer, not "unknown ids" (decision 100)
                kept = sorted({i for unit, _ in refused for i in unit})
                first = refused[0][1]
                raise A2MError(first.code, f"promote incomplete: tier {dest.name} refused {len(kept)} record(s) "
                               f"({first.message}); {promoted} promoted, the refused stay where they are",
                               {"promoted": promoted, "refused": kept, "tier": dest.name})
        finally:  # one event per call, also when a later source failed: what moved before it did move
            if moved:
                await self.events.emit("promoted", owner, ids=moved, tier=dest.name)
        return {"promoted": promoted}

    async def _counts(self, owner: str | None) -> dict[str, Any]:
        """`counts` per tier after a policy pass, and `degraded` naming the tiers that did not answer:
        a move into one of them was skipped (its records stay where they were), so say so."""
        fan = await self.fed.fan_out("memory/describe", with_owner({}, owner), list(self.fed))
        out: dict[str, Any] = {"counts": {name: sum(int(t.get("count", 0)) for t in result.get("tiers", []))
                                          for name, result in fan.results.items()}}
        self.degraded(out, fan)
        return out

    async def consolidate(self, params: dict[str, Any], ctx: Context) -> dict[str, Any]:
        owner = ctx.owner(params)
        await self.policy.counted()  # its promotions see every recall answered before it (decision 9)
        # Half batches a router that stopped mid-write left (any owner's: they were never acknowledged),
        # before the repair, which would move their records on; what it forgets counts as repaired.
        resolved = await self.intents.resolve()
        repaired = resolved["owners"].get(owner, 0) + await self.policy.repair(owner)
        promoted = await self.policy.promote_pending(owner)  # earned by recall: before capacity pressure
        spilled = await self.policy.enforce_all(owner)
        result = {"moved": spilled["moved"] + promoted, "promoted": promoted, "dropped": spilled["dropped"],
                  "summarized": 0, "repaired": repaired, **await self._counts(owner)}
        await self.events.emit("consolidated", owner, moved=result["moved"], promoted=promoted,
                               dropped=spilled["dropped"], summarized=0, repaired=repaired)
        return result


    # ---- sessions -----------------------------------------------------------------------

    async def session_list(self, params: dict[str, Any], ctx: Context) -> dict[str, Any]:
        owner = ctx.owner(params)
        tiers = [t for t in self.fed if t.has("sessions")]
        fan = await settled(self.policy, owner, tiers,
                            lambda: self.fed.fan_out("memory/session/list", with_owner({}, owner), tiers))
        merged: dict[str, dict[str, Any]] = {}
        for name in self.fed.order:
            for entry in (fan.results.get(name) or {}).get("sessions", []):
                session = entry.get("session")
                if session is None:
                    continue
                into = merged.setdefault(session, {"session": session, "records": 0, "tiers": {},
                                                   "opened_at": None, "touched_at": None})
                into["records"] += int(entry.get("records", 0))
                into["tiers"][name] = into["tiers"].get(name, 0) + int(entry.get("records", 0))
                for stamp, pick in (("opened_at", min), ("touched_at", max)):
                    if entry.get(stamp):
                        into[stamp] = entry[stamp] if into[stamp] is None else pick(into[stamp], entry[stamp])
        out: dict[str, Any] = {"sessions": sorted(merged.values(), key=lambda e: e["opened_at"] or "")}
        self.degraded(out, fan)
        return out

    async def session_close(self, params: dict[str, Any], ctx: Context) -> dict[str, Any]:
        session = required_str(params, "session")
        owner = ctx.owner(params)
        await self.policy.counted()
        flushed = await self.policy.flush(owner, session)
        if not flushed and not await self._session_known(owner, session):  # the protocol: a no-op
            return {"moved": 0, "promoted": 0, "dropped": 0, "summarized": 0, **await self._counts(owner),
                    "closed": session, "flushed": 0}
        promoted = await self.policy.promote_pending(owner)
        spilled = await self.policy.enforce_all(owner, [t for t in self.fed if not t.per_session])
        moved = flushed + promoted + spilled["moved"]
        await self.events.emit("session_closed", owner, session=session)
        if moved or spilled["dropped"]:
            await self.events.emit("consolidated", owner, moved=moved, promoted=promoted,
                                   dropped=spilled["dropped"], summarized=0, session=session)
        return {"moved": moved, "promoted": promoted, "dropped": spilled["dropped"], "summarized": 0,
                **await self._counts(owner), "closed": session, "flushed": flushed}

    async def _session_known(self, owner: str | None, session: str) -> bool:
        """Whether any tier holds a record of `session`; True when a tier that could did not answer,
        so a close is never skipped for a session the router could not see."""
        tiers = [t for t in self.fed if t.has("sessions")]
        fan = await self.fed.fan_out("memory/timeline", with_owner({"where": {"session": session}, "limit": 1},
                                                                    owner), tiers)
        return bool(fan.degraded) or any(result.get("records") for result in fan.results.values())

