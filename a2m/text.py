"""Tokenizer and BM25, shared by every tier that ranks text itself.

- Unicode aware: NFKC, case folding, accent folding (`città` matches `citta`).
- CJK (Han, Kana, Hangul) has no spaces: each run becomes character bigrams
  (a lone character stays a unigram), the usual choice without a dictionary.
- Stopwords are removed for the language the text looks like (most stopword
  hits among en/it/de/fr/es/pt/nl/ru), not from one English list; a text of
  only stopwords keeps nothing, so it matches nothing.
- A light English suffix folding (plurals, -ing, -ed) when English is detected, or
  when no language is (a short query).
"""

from __future__ import annotations

import math
import re
import unicodedata
import zlib
from collections import Counter
from typing import Iterable, Sequence

from .stopwords import STOPWORDS

_WORD = re.compile(r"\w+", re.UNICODE)
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]+")


def fold(text: str) -> str:
    """Case- and accent-fold: NFKC, casefold, strip combining marks."""
    text = unicodedata.normalize("NFKC", text).casefold()
    decomposed = unicodedata.normalize("NFD", text)
    return unicodedata.normalize("NFC", "".join(c for c in decomposed if not unicodedata.combining(c)))


_FOLDED_STOPWORDS = {lang: frozenset(fold(w) for w in words) for lang, words in STOPWORDS.items()}


def _cjk_grams(run: str) -> list[str]:
    if len(run) == 1:
        return [run]
    return [run[i : i + 2] for i in range(len(run) - 1)]


def _split(text: str) -> list[str]:
    words: list[str] = []
    for word in _WORD.findall(fold(text)):
        if word.isdigit() or not _CJK.search(word):
            words.append(word)
            continue
        last = 0
        for match in _CJK.finditer(word):
            if match.start() > last:
                words.append(word[last : match.start()])
            words.extend(_cjk_grams(match.group()))
            last = match.end()
        if last < len(word):
            words.append(word[last:])
    return words


def detect_language(words: Sequence[str]) -> str | None:
    """The language whose stopwords occur most among `words`; None when none occur."""
    best, best_hits = None, 0
    for lang, stop in _FOLDED_STOPWORDS.items():
        hits = sum(1 for w in words if w in stop)
        if hits > best_hits:
            best, best_hits = lang, hits
    return best


def _stem_en(word: str) -> str:
    if len(word) <= 3 or word.isdigit():
        return word
    if word.endswith("ies") and len(word) > 4:
        return word[:-3] + "y"
    if word.endswith("ing") and len(word) > 5:
        return word[:-3]
    if word.endswith("ed") and len(word) > 4:
        return word[:-2]
    if word.endswith("es") and word[-3] in "sxz" and len(word) > 4:
        return word[:-2]
    if word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-1]
    return word


def tokenize(text: str, language: str | None = None) -> list[str]:
    """Searchable terms of `text`, in order (duplicates kept, for term frequency)."""
    words = _split(text)
    # Short texts (queries) often hold no stopword at all: they fold like English, the
    # most common case, so that "agencies" in a query meets "agency" in a record.
    lang = language or detect_language(words) or "en"
    stop = _FOLDED_STOPWORDS[lang]
    kept = [w for w in words if w not in stop]
    if lang == "en":
        kept = [_stem_en(w) for w in kept]
    return kept


def term_id(term: str) -> int:
    """A stable 32-bit id for a term, for sparse vectors (same on every machine and run)."""
    return zlib.crc32(term.encode("utf-8"))


def sparse_vector(text: str) -> tuple[list[int], list[float]]:
    """Term-frequency sparse vector (BM25-saturated tf); engines apply IDF themselves."""
    counts = Counter(term_id(t) for t in tokenize(text))
    length = sum(counts.values()) or 1
    k1, b, avg = 1.2, 0.75, 16.0
    indices = sorted(counts)
    values = [counts[i] * (k1 + 1) / (counts[i] + k1 * (1 - b + b * length / avg)) for i in indices]
    return indices, values


class BM25:
    """Okapi BM25 over an in-memory corpus that can change (add / remove by id).

    Postings are kept per term, so scoring touches only documents that share a
    term with the query: thousands of procedures score in well under a millisecond.
    """

    def __init__(self, k1: float = 1.2, b: float = 0.75) -> None:
        self.k1, self.b = k1, b
        self._docs: dict[str, Counter[str]] = {}
        self._lengths: dict[str, int] = {}
        self._postings: dict[str, set[str]] = {}
        self._total = 0

    def __len__(self) -> int:
        return len(self._docs)

    def add(self, doc_id: str, text: str) -> None:
        self.remove(doc_id)
        terms = Counter(tokenize(text))
        self._docs[doc_id] = terms
        length = sum(terms.values())
        self._lengths[doc_id] = length
        self._total += length
        for term in terms:
            self._postings.setdefault(term, set()).add(doc_id)

    def remove(self, doc_id: str) -> None:
        terms = self._docs.pop(doc_id, None)
        if terms is None:
            return
        self._total -= self._lengths.pop(doc_id)
        for term in terms:
            posting = self._postings.get(term)
            if posting is not None:
                posting.discard(doc_id)
                if not posting:
                    del self._postings[term]

    def scores(self, query: str, allowed: Iterable[str] | None = None) -> dict[str, float]:
        """doc id -> raw BM25 score for documents matching at least one query term."""
        terms = tokenize(query)
        if not terms or not self._docs:
            return {}
        allow = None if allowed is None else set(allowed)
        n = len(self._docs)
        avg = self._total / n if n else 1.0
        out: dict[str, float] = {}
        for term in set(terms):
            posting = self._postings.get(term)
            if not posting:
                continue
            idf = math.log(1 + (n - len(posting) + 0.5) / (len(posting) + 0.5))
            for doc_id in posting:
                if allow is not None and doc_id not in allow:
                    continue
                tf = self._docs[doc_id][term]
                norm = tf * (self.k1 + 1) / (tf + self.k1 * (1 - self.b + self.b * self._lengths[doc_id] / avg))
                out[doc_id] = out.get(doc_id, 0.0) + idf * norm
        return out


def squash(score: float) -> float:
    """Map a raw non-negative score into [0, 1) monotonically, for the wire's `score`."""
    return score / (score + 1.0) if score > 0 else 0.0


def rank(texts: dict[str, str], query: str) -> list[tuple[str, float]]:
    """One-shot BM25 over a small corpus (id -> text): [(id, score in [0,1))], best first."""
    index = BM25()
    for doc_id, text in texts.items():
        index.add(doc_id, text)
    scored = index.scores(query)
    return sorted(((d, squash(s)) for d, s in scored.items()), key=lambda p: -p[1])
