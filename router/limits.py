"""The limits the router declares and holds a write to: its own `[limits]`, capped by its tiers'.

A write is checked here, then sent whole to one tier or another, each of which holds it to the
limits it declared. A `[limits]` raised past a tier's (a tier server keeps the protocol's
defaults) was declared in describe but refused by the tier: describe promised a write that could
never land (decision 164). So a write's limits are the least of the router's and every writable
tier's last described; `max_recall_limit` stays the router's, which pages past a tier's cap
(decision 92).
"""

from __future__ import annotations

from typing import Iterable, Iterator, Mapping

from .federation import Tier

WRITE_LIMITS = ("max_records_per_call", "max_content_length")


class Limits(Mapping[str, int]):
    """`[limits]` as they hold now: read at each call, so a tier described later counts from then."""

    def __init__(self, configured: Mapping[str, int], tiers: Iterable[Tier]) -> None:
        self._configured = dict(configured)
        self._tiers = tiers

    def __getitem__(self, name: str) -> int:
        own = self._configured[name]
        if name not in WRITE_LIMITS:
            return own
        declared = (t.limit(name) for t in self._tiers if t.writable)
        return min([own, *(v for v in declared if v)])

    def __iter__(self) -> Iterator[str]:
        return iter(self._configured)

    def __len__(self) -> int:
        return len(self._configured)

    def capped(self) -> list[str]:
        """A line for each write limit raised past what a described tier accepts (logged at start)."""
        return [f"limits.{name} = {self._configured[name]} is above what a tier accepts: writes are held to "
                f"{self[name]} (tier servers keep the protocol's defaults)"
                for name in WRITE_LIMITS if self[name] < self._configured[name]]
