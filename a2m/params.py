"""Validation of the params every A2M method shares: one wording and one error (-32602) everywhere."""

from __future__ import annotations

import re
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


# The words of a `query` a server ranks by. Past a few hundred, more words change no ranking worth
# having, and each costs every engine: a 1 MB query held an episodic connection for 13 s and failed
# (PostgreSQL's tsquery and BM25 statement grow with it), and an embedder bills every token.
MAX_QUERY_WORDS = 256
_WORD = re.compile(r"\w+", re.UNICODE)  # as a2m.text splits words


def query_param(params: Mapping[str, Any]) -> str | None:
    """`query`, a string, cut after its MAX_QUERY_WORDS-th word (what follows is not searched for)."""
    query = str_param(params, "query")
    if query is None or len(query) < 2 * MAX_QUERY_WORDS:  # cannot hold that many words
        return query
    for count, word in enumerate(_WORD.finditer(query), 1):
        if count == MAX_QUERY_WORDS:
            return query[:word.end()]
    return query


def ids_param(params: Mapping[str, Any]) -> list[str]:
    ids = params.get("ids")
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise invalid("ids must be an array of strings", field="ids")
    return ids
