"""The `prompt` capability: render recalled records as text for a model's context.

Only the `template` method is offered (and `none`): a client never triggers
inference it did not ask for. Rendering never changes which records a call
returns. `budget` is in approximate tokens — four ASCII characters each, and one
for every other character (a CJK character is about a token on its own) — and
trimming drops whole records — in `transcript` style whole groups, so a tool call
is never shown without its result. A record with no text is shown by its `uri`
(never fetched) when it has one, and otherwise not at all.
"""

from __future__ import annotations

from typing import Any, Sequence

from .errors import invalid
from .records import Record

STYLES = ("facts", "transcript", "auto")
METHODS = ("template", "none")


def describe() -> dict[str, Any]:
    return {"styles": list(STYLES), "methods": list(METHODS), "model": None}


def parse(value: Any) -> dict[str, Any] | None:
    """Validate the `prompt` param; None when no prompt was asked for."""
    if value is None or value is False:
        return None
    if value is True:
        return {"method": "template", "style": "auto", "budget": None, "cite": False}
    if not isinstance(value, dict):
        raise invalid("prompt must be true or an object", field="prompt")
    method = value.get("method")
    if method is None:  # a null option is an option not given, as `budget` and `cite` read it
        method = "template"
    if method not in METHODS:
        raise invalid(f"prompt method {method!r} is not offered here; offered: {list(METHODS)}", field="prompt.method")
    if value.get("model") is not None:
        raise invalid("no prompt model is offered by this server", field="prompt.model")
    style = value.get("style")
    if style is None:
        style = "auto"
    if style not in STYLES:
        raise invalid(f"prompt style must be one of {list(STYLES)}", field="prompt.style")
    budget = value.get("budget")
    if budget is not None and (not isinstance(budget, int) or isinstance(budget, bool) or budget < 0):
        raise invalid("prompt.budget must be a non-negative integer (approximate tokens)", field="prompt.budget")
    cite = value.get("cite")
    if cite is not None and not isinstance(cite, bool):  # "false" would otherwise read as true
        raise invalid("prompt.cite must be true or false", field="prompt.cite")
    return {"method": method, "style": style, "budget": budget, "cite": bool(cite)}


def _units(records: Sequence[Record], style: str) -> list[list[Record]]:
    if style != "transcript":
        return [[r] for r in records]
    units: list[list[Record]] = []
    by_group: dict[str, list[Record]] = {}
    for record in records:
        if record.group is None:
            units.append([record])
        elif record.group in by_group:
            by_group[record.group].append(record)
        else:
            by_group[record.group] = [record]
            units.append(by_group[record.group])
    return units


def _flat(text: str) -> str:
    """One line: every run of whitespace, CR, vertical tab, form feed and the Unicode line and
    paragraph separators included, becomes one space, so no stored text (content, role or a
    caller-chosen id) can start a line of its own and pass for another record or a speaker."""
    return " ".join(text.split())


def _text(record: Record) -> str:
    """What a record says: its content, or for a reference (empty content, a `uri`) the reference."""
    text = _flat(record.content)
    if not text and record.uri:
        text = _flat(record.uri) + (f" ({_flat(record.media_type)})" if record.media_type else "")
    return text


def _tokens(lines: Sequence[str]) -> int:
    """Approximate tokens: ASCII text about four characters a token, any other character one."""
    ascii_chars = wide = 0
    for line in lines:
        n = len(line.encode("ascii", "ignore"))
        ascii_chars += n + 1  # and its line break
        wide += len(line) - n
    return ascii_chars // 4 + wide + 1


def _line(record: Record, style: str, cite: bool) -> str:
    text = _text(record)
    tag = f" [{_flat(record.id)}]" if cite else ""
    if style == "transcript":
        return f"{_flat(record.role or '') or 'memory'}: {text}{tag}"
    return f"- {text}{tag}"


def render(records: Sequence[Record], options: dict[str, Any], *, ordered_by_time: bool,
           written: Sequence[str] | None = None) -> dict[str, Any]:
    """`{prompt, prompt_ids}` for `records`. `ordered_by_time` says whether they come from timeline;
    `written`, for a recall, their ids in the order they were written (as timeline would show them:
    records written in one call share their `created_at`), which a transcript follows."""
    if options["method"] == "none":
        return {"prompt": "", "prompt_ids": []}
    style = options["style"]
    if style == "auto":
        style = "transcript" if ordered_by_time else "facts"
    records = [r for r in records if _text(r)]  # a record with nothing to show is not in the prompt
    rank = {id(r): i for i, r in enumerate(records)}  # a recall's relevance order
    if style == "transcript" and not ordered_by_time:
        place = {record_id: i for i, record_id in enumerate(written or ())}
        records = sorted(records, key=lambda r: (r.created_at, place.get(r.id, 0)))
    units = [(unit, [_line(r, style, options["cite"]) for r in unit]) for unit in _units(records, style)]
    budget = options["budget"]
    if budget is not None:
        # What a budget keeps: a recall's most relevant records; a timeline's newest, as its `limit`
        # does, and in a transcript without a gap (stopping at the first turn that does not fit).
        if ordered_by_time:
            priority = list(reversed(range(len(units))))
        else:
            priority = sorted(range(len(units)), key=lambda u: min(rank[id(r)] for r in units[u][0]))
        kept: set[int] = set()
        used = 0
        for u in priority:
            cost = _tokens(units[u][1])
            if used + cost > budget:
                if ordered_by_time and style == "transcript":
                    break
                continue  # a shorter record further down may still fit
            kept.add(u)
            used += cost
        units = [unit for u, unit in enumerate(units) if u in kept]
    lines = [line for _, unit_lines in units for line in unit_lines]
    ids = [r.id for unit, _ in units for r in unit]
    return {"prompt": "\n".join(lines), "prompt_ids": ids}
