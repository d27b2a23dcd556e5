"""Extractive summaries: no model, so nothing is invented.

Keeps the sentences that carry the facts a later question is likely to need —
dates, numbers, named entities — in the order they were said, up to a length.
Sentences end at `.!?` (and Hindi's `।`, Arabic's `؟`, Urdu's `۔`, Armenian's `։`,
Ethiopic's `።` `፧`) before a space, at `。！？` (no space follows in Chinese or
Japanese) and at line breaks; a sentence said
twice (in two records, or in a record and an earlier summary of it) is kept once; a sentence longer than the whole summary
is cut into pieces that fit, so one long unpunctuated record still yields a summary.

A summary splits back into exactly the sentences it was made of: a sentence that
ends without one of those (a line of a list, a cut piece) is followed by a line break,
any other by a space. So a summary read again as a source (a later summary of the
same records) adds nothing, and a summary of a summary is itself. A line that only
frames or rules (a code fence, `---`, a table's `|---|`) holds no letter, digit or
symbol and is no sentence.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Iterator, Sequence

from .records import Record

# `।` `॥` (Devanagari, Bengali), `؟` (Arabic), `۔` (Urdu), `։` (Armenian), `።` `፧` (Ethiopic) end
# sentences before a space, as `.!?` do
_SENTENCE = re.compile(r"(?<=[.!?।॥؟۔։።፧])\s+|(?<=[。！？])\s*|\s*\n\s*")
_ENDS = (".", "!", "?", "।", "॥", "؟", "۔", "։", "።", "፧", "。", "！", "？")  # a sentence ending so is split from the next by a space alone
_WORD = re.compile(r"[^\W\d_]+")  # a run of letters, in any script
SUMMARY_CHARS = 1200  # a summary's length, unless the server that keeps it takes less

_FENCE = re.compile(r"`{3,}[^`]*|~{3,}.*")  # a Markdown code fence line, with its info string


def _says_something(sentence: str) -> bool:
    """A letter or digit of any script, or a symbol (an emoji, ©): not only punctuation and markup."""
    if _FENCE.fullmatch(sentence):
        return False
    return any(ch.isalnum() or unicodedata.category(ch) == "So" for ch in sentence)


def _weight(sentence: str, first: bool) -> int:
    """Digits, plus words that start with a capital letter (any alphabet: Łódź, Zoë, NASA); the
    first word of a record is capitalised anyway, so the first sentence gets one point instead."""
    words = _WORD.findall(sentence)
    if first:
        words = words[1:]
    signals = sum(ch.isdigit() for ch in sentence) + sum(1 for w in words if len(w) > 1 and w[0].isupper())
    return signals + (1 if first else 0)


def _joins(ch: str) -> bool:
    """Whether `ch` belongs to the character before it: a combining mark, a joiner, a variation
    selector, an emoji skin tone or a tag character (the parts of é, 👩‍💻, ❤️, 👍🏽, 🏴󠁧󠁢󠁳󠁣󠁴󠁿)."""
    return (unicodedata.combining(ch) != 0 or unicodedata.category(ch) in ("Mn", "Mc", "Me")
            or ch in "\u200c\u200d" or "\ufe00" <= ch <= "\ufe0f" or "\U0001f3fb" <= ch <= "\U0001f3ff"
            or "\U000e0020" <= ch <= "\U000e007f" or "\U000e0100" <= ch <= "\U000e01ef")


def _regional(ch: str) -> bool:
    return "\U0001f1e6" <= ch <= "\U0001f1ff"  # two of them make one flag


def _boundary(text: str, cut: int) -> int:
    """`cut`, moved back to where it splits no character as a reader sees one; `cut` itself when the
    text before it is one such character (a cut is then unavoidable)."""
    at = cut
    while at > 0 and (_joins(text[at]) or text[at - 1] == "\u200d"):
        at -= 1
    if at > 0 and _regional(text[at]):
        run = 0
        while at - run > 0 and _regional(text[at - run - 1]):
            run += 1
        at -= run % 2  # an odd number of flag letters before: this one is the second of a pair
    return at if at > 0 else cut


def _pieces(sentence: str, max_chars: int) -> Iterator[str]:
    """`sentence`, or, when it alone is longer than the summary may be, pieces of it that fit,
    cut at a space where there is one (CJK text has none), never inside a character."""
    while len(sentence) > max_chars:
        cut = sentence.rfind(" ", max_chars // 2, max_chars + 1)
        if cut <= 0:
            cut = _boundary(sentence, max_chars)
        yield sentence[:cut].rstrip()
        sentence = sentence[cut:].lstrip()
    if sentence:
        yield sentence


def summarize(records: Sequence[Record], max_chars: int = SUMMARY_CHARS) -> str:
    """One text summarising `records`, at most `max_chars` long. They are told oldest first; records
    of equal `created_at` in the order given (pass them as timeline orders them)."""
    if max_chars < 1:
        return ""
    candidates: list[tuple[int, int, str]] = []
    seen: set[str] = set()
    order = 0
    for record in sorted(records, key=lambda r: r.created_at):
        first = True
        for raw in _SENTENCE.split(record.content):
            sentence = " ".join(raw.split())
            if not sentence or not _says_something(sentence):
                continue
            for piece in _pieces(sentence, max_chars):
                if not _says_something(piece):  # a cut's last piece may be a lone `?` or `...`
                    continue
                if piece not in seen:
                    seen.add(piece)
                    candidates.append((_weight(piece, first), order, piece))
                    order += 1
                first = False
    chosen: list[tuple[int, str]] = []
    used = 0
    for weight, position, sentence in sorted(candidates, key=lambda c: (-c[0], c[1])):
        if used + len(sentence) + 1 > max_chars + 1:  # n sentences take n - 1 separators
            continue
        chosen.append((position, sentence))
        used += len(sentence) + 1
    parts: list[str] = []
    for _, sentence in sorted(chosen):
        if parts:
            parts.append(" " if parts[-1].endswith(_ENDS) else "\n")
        parts.append(sentence)
    return "".join(parts)
