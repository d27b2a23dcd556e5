"""Validation of the params every A2M method shares: one wording and one error (-32602) everywhere."""

from __future__ import annotations

import re
from typing import Any, Mapping

from .errors import invalid


# What a server declares in describe's `limits` unless configured otherwise (router and tier servers alike).
DEFAULT_LIMITS = {"max_records_per_call": 1000, "max_content_length": 1_000_000, "max_recall_limit": 1000}


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


def required_str(params: Mapping[str, Any], name: str) -> str:
    """A non-empty string the method cannot run without (a fetch's `key`, a close's `session`)."""
    value = params.get(name)
    if not isinstance(value, str) or not value:
        raise invalid(f"{name} is required", field=name)
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


def records_param(params: Mapping[str, Any], limits: Mapping[str, int]) -> list[Any]:
    """`records` of a write: a non-empty array of at most the server's max_records_per_call (each
    record is checked by whoever parses it)."""
    records = params.get("records")
    if not isinstance(records, list) or not records:
        raise invalid("records must be a non-empty array", field="records")
    cap = limits.get("max_records_per_call")
    if cap and len(records) > cap:
        raise invalid(f"at most {cap} records per call", field="records", max=cap)
    return records


def limit_param(params: Mapping[str, Any], limits: Mapping[str, int], default: int) -> int:
    """A read's `limit`, held to the server's max_recall_limit (0 asks for all: the cap then)."""
    limit = int_param(params, "limit", default)
    assert limit is not None
    cap = limits.get("max_recall_limit")
    if cap:
        if limit == 0:
            return cap
        if limit > cap:
            raise invalid(f"limit exceeds max_recall_limit ({cap})", field="limit", max=cap)
    return limit


def min_score_param(params: Mapping[str, Any]) -> float | None:
    min_score = params.get("min_score")
    if min_score is not None and (not isinstance(min_score, (int, float)) or isinstance(min_score, bool)):
        raise invalid("min_score must be a number", field="min_score")
    return min_score


def amount_param(params: Mapping[str, Any]) -> float:
    """A reinforce's `amount`: a number in [-1, 1], 0.1 when absent or null."""
    amount = params.get("amount")
    if amount is None:
        return 0.1
    if not isinstance(amount, (int, float)) or isinstance(amount, bool) or not -1 <= amount <= 1:
        raise invalid("amount must be a number in [-1, 1]", field="amount")
    return float(amount)
