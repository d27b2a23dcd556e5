"""Extractive summaries: no model, so nothing is invented.

Keeps the sentences that carry the facts a later question is likely to need —
dates, numbers, named entities — in the order they were said, up to a length.
"""

from __future__ import annotations

import re
from typing import Sequence

from .records import Record

_SENTENCE = re.compile(r"(?<=[.!?])\s+")
_SIGNAL = re.compile(r"\d|\b[A-Z][a-z]+\b")


def _weight(sentence: str, first: bool) -> int:
    signals = len(_SIGNAL.findall(sentence[1:] if first else sentence))
    return signals + (1 if first else 0)


def summarize(records: Sequence[Record], max_chars: int = 1200) -> str:
    """One text summarising `records` (oldest first)."""
    candidates: list[tuple[int, int, str]] = []
    order = 0
    for record in sorted(records, key=lambda r: r.created_at):
        for i, sentence in enumerate(s.strip() for s in _SENTENCE.split(record.content)):
            if sentence:
                candidates.append((_weight(sentence, i == 0), order, sentence))
                order += 1
    chosen: list[tuple[int, str]] = []
    used = 0
    for weight, position, sentence in sorted(candidates, key=lambda c: (-c[0], c[1])):
        if used + len(sentence) + 1 > max_chars:
            continue
        chosen.append((position, sentence))
        used += len(sentence) + 1
    return " ".join(s for _, s in sorted(chosen))
