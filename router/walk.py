"""One page of a timeline walk over several tiers: where each tier's own cursor stands, merged.

A tier's cursor is a position in that tier alone (decision 120), so the router's cursor over
several tiers is the set of them: for each tier, `True` (none of it read yet), its cursor (read
down to there) or `None` (read through). A page asks every tier not read through for its newest
`limit` records before its position, merges them in the router's timeline order
(`reads.merge_by_time`: created_at, deeper tier first, then each tier's own order) and keeps the
newest `limit`. A tier all of whose page was kept moves to the cursor it answered; one none of
whose page was kept stays where it was; one whose page was cut is asked again for as many records
as were kept of it, which answers the cursor standing exactly there (a tier's cursor is opaque, so
the router cannot make one itself), and the records it answers are that tier's on the page. Each
position is a position, so records written, forgotten or moved between pages leave the rest of
the walk as a one-tier walk leaves it (decision 137).

A tier capped below `limit` (its max_recall_limit) may hold more records newer than what the
others answered: nothing older than the earliest record of its page is kept on this page, which
may then hold fewer than `limit` records, its cursor saying more.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence, Union

from .federation import FanOut, Federation, Tier

Position = Union[bool, str, None]  # True: not read yet; a tier's cursor; None: read through
Positions = dict[str, Position]
PerTier = Callable[[Tier], "dict[str, Any] | None"]


def _pages(result: dict[str, Any]) -> bool:
    """Whether a tier's answer can be walked on from: it holds a cursor (a string, or null at the end).
    A tier without the cursor extension (a mounted corpus) answers none."""
    return "cursor" in result and (result["cursor"] is None or isinstance(result["cursor"], str))


async def walk_page(fed: Federation, tiers: Sequence[Tier], per_tier: PerTier, positions: Positions,
                    limit: int) -> tuple[dict[str, list[dict[str, Any]]], Positions | None, FanOut]:
    """Each tier's records on this page (ascending, for `merge_by_time`), the positions after it
    (None: the walk cannot go on from this page: a tier did not answer, or answered no cursor)
    and the fan-out, for `degraded`."""
    def asked(tier: Tier) -> dict[str, Any] | None:
        params = per_tier(tier)
        if params is None or positions[tier.name] is None:
            return None  # nothing of it can match, or it is read through
        return {**params, "cursor": positions[tier.name]}

    fan = await fed.fan_out("memory/timeline", {}, tiers, per_tier=asked)
    answered = [t.name for t in tiers if t.name in fan.results]
    pages = {name: fan.results[name].get("records", []) for name in answered}
    if fan.degraded or not all(_pages(fan.results[name]) for name in answered):
        return pages, None, fan  # the caller keeps the newest `limit` of them, as without a cursor

    places = {name: fed.timeline_place(name) for name in answered}  # each key as `merge_by_time` sorts
    # A tier with more to give bounds the page at its earliest record: what it holds before that may
    # be newer than the other tiers' records below it.
    floor = max(((pages[name][0]["created_at"], *places[name], 0) for name in answered
                 if pages[name] and fan.results[name]["cursor"] is not None), default=None)
    newest = sorted((((r["created_at"], *places[name], i), name) for name in answered
                     for i, r in enumerate(pages[name])), reverse=True)
    kept = dict.fromkeys(answered, 0)
    for key, name in newest[:limit or None]:  # limit 0: a tier answered all it holds
        if floor is not None and key < floor:
            break
        kept[name] += 1

    after: Positions = {t.name: None if asked(t) is None else positions[t.name] for t in tiers}
    cut: dict[str, int] = {}
    walked_on = True
    for name in answered:
        if kept[name] == len(pages[name]):
            after[name] = fan.results[name]["cursor"]
        elif kept[name]:
            cut[name] = kept[name]
    if cut:  # a cut page's cursor at its last record kept: asked for exactly the records kept
        again = await fed.fan_out("memory/timeline", {}, [fed[name] for name in cut],
                                  per_tier=lambda tier: {**(asked(tier) or {}), "limit": cut[tier.name]})
        fan.errors.update(again.errors)
        fan.degraded = sorted({*fan.degraded, *again.degraded}, key=fed.order.index)
        walked_on = not again.degraded and all(_pages(result) for result in again.results.values())
        if walked_on:
            after.update((name, again.results[name]["cursor"]) for name in cut)
    pages = {name: pages[name][len(pages[name]) - kept[name]:] for name in answered}
    if cut and walked_on:
        # The records the cursor stands after, as the second ask answered them: the kept ones, unless
        # a write or a forget came between the two asks. Shown as answered, the record the cursor
        # passed over for one forgotten is not lost, nor a record written in between read twice; the
        # page may then be out of order with the next by that one record.
        pages.update((name, again.results[name].get("records", [])) for name in cut)
    return pages, after if walked_on else None, fan
