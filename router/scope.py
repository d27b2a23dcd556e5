"""What every handler of the router shares: which tiers a call covers, what each tier is asked,
and the federation's vector width.

The handlers live in `writes.py`, `reads.py`, `moves.py` and `summarize.py`; `server.py` composes
them. Everything here reads the call's params and the federation, never the tiers' records.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from a2m import errors
from a2m.embedder import Embedder, try_embed
from a2m.errors import A2MError, invalid
from a2m.filters import parse_scope, test_matches

from .federation import Federation, Tier

SCOPE_PARAMS = ("where", "key_prefix", "after", "before")


def with_owner(params: dict[str, Any], owner: str | None) -> dict[str, Any]:
    """`params` naming `owner` to a tier (the tiers trust the router's service token to name owners)."""
    if owner is not None:
        params["owner"] = owner
    return params


def settle_tier(params: dict[str, Any], tier: Tier, *, keep: bool = False) -> dict[str, Any] | None:
    """`params` for `tier` with `where.tier` answered here, by the router's name for the tier (the name
    its records show): a tier server tests it against its own name, which router.toml need not share.
    None when the tier holds nothing that could match: it is not asked. A read drops the test (an
    index answers the rest); with `keep` (forget) it goes down as the server's own name, which alone
    in `where` still selects the whole tier there."""
    where = params.get("where")
    if not isinstance(where, dict) or "tier" not in where:
        return params
    if not test_matches(True, tier.name, where["tier"]):
        return None
    if keep:
        own = (((tier.info or {}).get("tiers") or [{}])[0]).get("name", tier.name)
        return {**params, "where": {**where, "tier": own}}
    rest = {k: v for k, v in where.items() if k != "tier"}
    return {**{k: v for k, v in params.items() if k != "where"}, **({"where": rest} if rest else {})}


def tier_named(fed: Federation, name: Any, field: str = "tier") -> Tier:
    """The tier a param names (-32602 if not a string, -32002 if no such tier)."""
    if not isinstance(name, str):
        raise invalid(f"{field} must be a string (a tier's name)", field=field)
    if name not in fed.tiers:
        raise A2MError(errors.UNKNOWN_TIER, f"unknown {field} {name!r}", {"tier": name, "tiers": fed.order})
    return fed[name]


def scope_tiers(fed: Federation, params: Mapping[str, Any]) -> list[Tier]:
    """The tiers a call covers: the one its `tier` names, else all of them."""
    if params.get("tier") is None:
        return list(fed)
    return [tier_named(fed, params["tier"])]


def scope_params(params: Mapping[str, Any], owner: str | None) -> dict[str, Any]:
    """Validate the scope selectors once, here, and pass them down verbatim."""
    parse_scope(params, owner)
    out = {name: params[name] for name in SCOPE_PARAMS if params.get(name) is not None}
    return with_owner(out, owner)


def read_only(tier: Tier, **data: Any) -> A2MError:
    """The refusal of a write into a read-only tier (-32004)."""
    return A2MError(errors.READ_ONLY, f"tier {tier.name} is read-only", {"tier": tier.name, **data})


class VectorWidth:
    """The federation's vector width: the embedder's when one is configured (its vectors are the
    ones the tiers hold), else the first tier that reports one, else the first vector written."""

    def __init__(self, embedder: Embedder | None, fed: Federation) -> None:
        self.embedder = embedder
        self.fed = fed
        self._dims: int | None = getattr(embedder, "dimensions", None)

    def known(self) -> int | None:
        width = getattr(self.embedder, "dimensions", None)
        if width:
            return width
        if self._dims is None:
            for tier in self.fed:
                if tier.dimensions:
                    self._dims = tier.dimensions
                    break
        return self._dims

    def learn(self, vectors: Sequence[list[float] | None]) -> None:
        """Take the width of the first vector written, when nothing told it before."""
        if self._dims is None:
            widths = [len(v) for v in vectors if v]
            if widths:
                self._dims = widths[0]

    async def check(self, vectors: Sequence[list[float]]) -> None:
        """-32008 unless every one of `vectors` has the federation's width."""
        if not vectors:
            return
        if self.embedder is not None and not getattr(self.embedder, "dimensions", None):
            await try_embed(self.embedder, ["dimensions"])  # an HTTP embedder learns its width on first use
        widths = {len(v) for v in vectors}
        expected = self.known() or next(iter(widths))
        if widths != {expected}:
            raise A2MError(errors.EMBEDDING_MISMATCH, f"embeddings in this federation have {expected} dimensions",
                           {"expected": expected, "got": sorted(widths)})
