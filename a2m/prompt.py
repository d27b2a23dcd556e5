"""The `prompt` capability: render recalled records as text for a model's context.

Only the `template` method is offered (and `none`): a client never triggers
inference it did not ask for. Rendering never changes which records a call
returns. `budget` is in approximate tokens (4 characters each) and trimming
drops whole records — in `transcript` style whole groups, so a tool call is
never shown without its result.
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
    method = value.get("method", "template")
    if method not in METHODS:
        raise invalid(f"prompt method {method!r} is not offered here; offered: {list(METHODS)}", field="prompt.method")
    if value.get("model") is not None:
        raise invalid("no prompt model is offered by this server", field="prompt.model")
    style = value.get("style", "auto")
    if style not in STYLES:
        raise invalid(f"prompt style must be one of {list(STYLES)}", field="prompt.style")
    budget = value.get("budget")
    if budget is not None and (not isinstance(budget, int) or isinstance(budget, bool) or budget < 0):
        raise invalid("prompt.budget must be a non-negative integer (approximate tokens)", field="prompt.budget")
    return {"method": method, "style": style, "budget": budget, "cite": bool(value.get("cite", False))}


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


def _line(record: Record, style: str, cite: bool) -> str:
    text = record.content.replace("\n", " ").strip()
    tag = f" [{record.id}]" if cite else ""
    if style == "transcript":
        return f"{record.role or 'memory'}: {text}{tag}"
    return f"- {text}{tag}"


def render(records: Sequence[Record], options: dict[str, Any], *, ordered_by_time: bool) -> dict[str, Any]:
    """`{prompt, prompt_ids}` for `records`. `ordered_by_time` says whether they come from timeline."""
    if options["method"] == "none":
        return {"prompt": "", "prompt_ids": []}
    style = options["style"]
    if style == "auto":
        style = "transcript" if ordered_by_time else "facts"
    if style == "transcript" and not ordered_by_time:
        records = sorted(records, key=lambda r: r.created_at)
    budget = options["budget"]
    lines: list[str] = []
    ids: list[str] = []
    used = 0
    for unit in _units(records, style):
        unit_lines = [_line(r, style, options["cite"]) for r in unit]
        cost = sum(len(line) + 1 for line in unit_lines) // 4 + 1
        if budget is not None and used + cost > budget:
            if style == "facts":
                continue  # a shorter fact further down may still fit
            break
        used += cost
        lines.extend(unit_lines)
        ids.extend(r.id for r in unit)
    return {"prompt": "\n".join(lines), "prompt_ids": ids}
