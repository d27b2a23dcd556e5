"""Extractive summaries: no model, so nothing is invented.

Keeps the sentences that carry the facts a later question is likely to need —
dates, numbers, named entities — in the order they were said, up to a length.
Sentences end at `.!?` before a space, at `。！？` (no space follows in Chinese or
Japanese) and at line breaks; a sentence said twice (in two records, or in a record
and an earlier summary of it) is kept once; a sentence longer than the whole summary
is cut into pieces that fit, so one long unpunctuated record still yields a summary.
"""

from __future__ import annotations

import re
from typing import Iterator, Sequence

from .records import Record

_SENTENCE = re.compile(r"(?<=[.!?])\s+|(?<=[。！？])\s*|\s*\n\s*")
_WORD = re.compile(r"[^\W\d_]+")  # a run of letters, in any script


def _weight(sentence: str, first: bool) -> int:
    """Digits, plus words that start with a capital letter (any alphabet: Łódź, Zoë, NASA); the
    first word of a record is capitalised anyway, so the first sentence gets one point instead."""
    words = _WORD.findall(sentence)
    if first:
        words = words[1:]
    signals = sum(ch.isdigit() for ch in sentence) + sum(1 for w in words if len(w) > 1 and w[0].isupper())
    return signals + (1 if first else 0)


def _pieces(sentence: str, max_chars: int) -> Iterator[str]:
    """`sentence`, or, when it alone is longer than the summary may be, pieces of it that fit,
    cut at a space where there is one (CJK text has none)."""
    while len(sentence) > max_chars:
        cut = sentence.rfind(" ", max_chars // 2, max_chars + 1)
        if cut <= 0:
            cut = max_chars
        yield sentence[:cut].rstrip()
        sentence = sentence[cut:].lstrip()
    if sentence:
        yield sentence


def summarize(records: Sequence[Record], max_chars: int = 1200) -> str:
    """One text summarising `records` (oldest first)."""
    candidates: list[tuple[int, int, str]] = []
    seen: set[str] = set()
    order = 0
    for record in sorted(records, key=lambda r: r.created_at):
        first = True
        for raw in _SENTENCE.split(record.content):
            sentence = " ".join(raw.split())
            if not sentence:
                continue
            for piece in _pieces(sentence, max_chars):
                if piece not in seen:
                    seen.add(piece)
                    candidates.append((_weight(piece, first), order, piece))
                    order += 1
                first = False
    chosen: list[tuple[int, str]] = []
    used = 0
    for weight, position, sentence in sorted(candidates, key=lambda c: (-c[0], c[1])):
        if used + len(sentence) + 1 > max_chars + 1:  # n sentences take n - 1 separating spaces
            continue
        chosen.append((position, sentence))
        used += len(sentence) + 1
    return " ".join(s for _, s in sorted(chosen))
