"""Validation of the params every A2M method shares: one wording and one error (-32602) everywhere."""

from __future__ import annotations

from typing import Any, Mapping

from .errors import invalid


def int_param(params: Mapping[str, Any], name: str, default: int | None) -> int | None:
    """A non-negative integer (booleans are not integers here), or `default` when absent/null."""
    value = params.get(name)
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise invalid(f"{name} must be a non-negative integer", field=name)
    return value


def bool_param(params: Mapping[str, Any], name: str, default: bool) -> bool:
    """true or false, or `default` when absent/null: a flag sent as "false" or 0 is refused, never read as set."""
    value = params.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise invalid(f"{name} must be true or false", field=name)
    return value


def str_param(params: Mapping[str, Any], name: str) -> str | None:
    value = params.get(name)
    if value is not None and not isinstance(value, str):
        raise invalid(f"{name} must be a string", field=name)
    return value


def ids_param(params: Mapping[str, Any]) -> list[str]:
    ids = params.get("ids")
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise invalid("ids must be an array of strings", field="ids")
    return ids
