"""Tokenizer and BM25, shared by every tier that ranks text itself.

- Unicode aware: NFKC, case folding, accent folding (`città` matches `citta`).
- CJK (Han, Kana, Hangul) has no spaces: each run becomes character bigrams
  (a lone character stays a unigram), the usual choice without a dictionary.
- Stopwords are removed for the language the text looks like (most stopword
  hits among en/it/de/fr/es/pt/nl/ru), not from one English list; a text of
  only stopwords keeps nothing, so it matches nothing.
- A light English suffix folding (plurals, -ing, -ed) when English is detected, or
  when no language is (a short query, which is then matched by its words unfolded
  too: `query_terms`).
"""

from __future__ import annotations

import math
import re
from functools import lru_cache
import threading
import unicodedata
import zlib
from collections import Counter, OrderedDict
from typing import Generic, Hashable, Iterable, Mapping, Sequence, TypeVar

from .stopwords import STOPWORDS

K = TypeVar("K", bound=Hashable)
# BM25's settings for short passages (`BM25` says why); the episodic tier ranks in SQL with the same.
BM25_K1, BM25_B = 0.9, 0.4

_WORD = re.compile(r"\w+", re.UNICODE)
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]+")


def fold(text: str) -> str:
    """Case- and accent-fold: NFKC, casefold, strip combining marks."""
    if text.isascii():  # the common case, and NFKC/NFD cannot change ASCII
        return text.lower()
    text = unicodedata.normalize("NFKC", text).casefold()
    decomposed = unicodedata.normalize("NFD", text)
    return unicodedata.normalize("NFC", "".join(c for c in decomposed if not unicodedata.combining(c)))


_FOLDED_STOPWORDS = {lang: frozenset(fold(w) for w in words) for lang, words in STOPWORDS.items()}
_LANGUAGES_OF: dict[str, tuple[str, ...]] = {}
for _lang, _words in _FOLDED_STOPWORDS.items():
    for _word in _words:
        _LANGUAGES_OF[_word] = _LANGUAGES_OF.get(_word, ()) + (_lang,)
_ORDER = {lang: i for i, lang in enumerate(_FOLDED_STOPWORDS)}


def _cjk_grams(run: str) -> list[str]:
    if len(run) == 1:
        return [run]
    return [run[i : i + 2] for i in range(len(run) - 1)]


def _split(text: str) -> list[str]:
    if text.isascii():  # the common case: no folding beyond case, and no CJK to cut into grams
        return _WORD.findall(text.lower())
    folded = fold(text)
    if not _CJK.search(folded):
        return _WORD.findall(folded)
    words: list[str] = []
    for word in _WORD.findall(folded):
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
    """The language whose stopwords occur most among `words`; None when none occur (ties: list order)."""
    # Runs once per text tokenized (a rerank pool is ~100 texts the tokenizer's cache has not
    # seen): most words are no stopword, and most texts have stopwords of one language only.
    hits: dict[str, int] = {}
    languages_of = _LANGUAGES_OF.get
    for word in words:
        languages = languages_of(word)
        if languages:
            for lang in languages:
                hits[lang] = hits.get(lang, 0) + 1
    if len(hits) < 2:
        return next(iter(hits), None)
    return max(hits, key=lambda lang: (hits[lang], -_ORDER[lang]))


# The longest word whose stem is cached. `\w+` has no bound: a hex dump in a tool's output is
# one word, and 65,536 cached words of 100 KB could hold 6.4 GB. Longer words are stemmed uncached.
STEM_CACHED = 64


@lru_cache(maxsize=65536)
def _stem_en(word: str) -> str:
    """Fold inflections so a query's form meets the record's: moved/moving/move -> mov."""
    if len(word) <= 3 or not word.isascii() or not word.isalpha():
        return word
    if word.endswith("ies") and len(word) > 4:
        word = word[:-3] + "y"
    elif word.endswith("ing") and len(word) > 5:
        word = word[:-3]
    elif word.endswith("ed") and len(word) > 4:
        word = word[:-2]
    elif word.endswith("es") and word[-3] in "sxz" and len(word) > 4:
        word = word[:-2]
    elif word.endswith("s") and not word.endswith(("ss", "us", "is")):
        word = word[:-1]
    if len(word) > 3 and word[-1] == word[-2] and word[-1] not in "aeiouls":
        word = word[:-1]  # running -> runn -> run, stopped -> stopp -> stop
    if len(word) > 3 and word.endswith("e"):
        word = word[:-1]  # move / moved / moving all meet at mov
    return word


def tokenize(text: str, language: str | None = None) -> list[str]:
    """Searchable terms of `text`, in order (duplicates kept, for term frequency)."""
    return list(_terms(text, language))


def cache_terms(texts: Iterable[str]) -> None:
    """Tokenize `texts` into the cache ahead of a ranking that will ask for them."""
    for text in texts:
        _terms(text, None)


def tokenize_once(text: str) -> list[str]:
    """`tokenize` for a text seen once (a record being stored): it bypasses the cache, which is for
    texts ranked again and again and would otherwise hold every record written."""
    return list(_tokenize(text, None))


TERMS_TEXTS = 32_768  # texts the tokenizer cache holds at most...
TERMS_CHARS = 32 * 1024 * 1024  # ...and characters of them in all


class _TermsCache:
    """An LRU of tokenized texts, bounded by count and by characters.

    Cached: tiers that rank by scanning (working, the router's rerank pool) see the same record
    texts on every recall, and tokenizing is most of a ranking's cost. A count alone held texts of
    any length: a server recalling 20 KB tool outputs held 32,768 of them, ~5.6 GB, reached slowly
    and kept for good (2 KB texts: ~260 MB). Bounded by characters too it holds at most ~300 MB
    whatever the texts; a text over the whole budget is tokenized and not kept. Changes are
    locked: a store may tokenize in a worker thread (procedural builds its index at open there)."""

    def __init__(self, texts: int = TERMS_TEXTS, chars: int = TERMS_CHARS) -> None:
        self.texts, self.chars = texts, chars
        self._entries: OrderedDict[Hashable, tuple[str, ...]] = OrderedDict()  # text, or (text, language)
        self._held = 0  # characters of the texts held
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def held(self) -> int:
        return self._held

    def __call__(self, text: str, language: str | None) -> tuple[str, ...]:
        key: Hashable = text if language is None else (text, language)  # a str never equals a tuple
        found = self._entries.get(key)  # a hit takes no lock: each step is one atomic C call
        if found is not None:
            try:
                self._entries.move_to_end(key)
            except KeyError:  # let go by another thread meanwhile
                pass
            return found
        terms = _tokenize(text, language)
        if len(text) > self.chars:
            return terms
        with self._lock:
            if key not in self._entries:
                self._entries[key] = terms
                self._held += len(text)
                while len(self._entries) > self.texts or self._held > self.chars:
                    gone, _ = self._entries.popitem(last=False)
                    self._held -= len(gone if isinstance(gone, str) else gone[0])
        return terms

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._held = 0


def _tokenize(text: str, language: str | None) -> tuple[str, ...]:
    """`text`'s terms, uncached (`_terms` caches them)."""
    words = _split(text)
    # Short texts (queries) often hold no stopword at all: they fold like English, the
    # most common case, so that "agencies" in a query meets "agency" in a record.
    lang = language or detect_language(words) or "en"
    stop = _FOLDED_STOPWORDS[lang]
    kept = [w for w in words if w not in stop]
    if lang != "en":
        return tuple(kept)
    if len(text) <= STEM_CACHED or max(map(len, kept), default=0) <= STEM_CACHED:
        return tuple(map(_stem_en, kept))
    return tuple(_stem_en(w) if len(w) <= STEM_CACHED else _stem_en.__wrapped__(w) for w in kept)


_terms = _TermsCache()


def term_id(term: str) -> int:
    """A stable 32-bit id for a term, for sparse vectors (same on every machine and run)."""
    return zlib.crc32(term.encode("utf-8"))


def sparse_vector(text: str) -> tuple[list[int], list[float]]:
    """Term-frequency sparse vector (BM25-saturated tf); engines apply IDF themselves."""
    counts = Counter(term_id(t) for t in tokenize(text))
    length = sum(counts.values()) or 1
    k1, b, avg = BM25_K1, BM25_B, 16.0  # as BM25 below: short records
    indices = sorted(counts)
    values = [counts[i] * (k1 + 1) / (counts[i] + k1 * (1 - b + b * length / avg)) for i in indices]
    return indices, values


class BM25:
    """Okapi BM25 over an in-memory corpus that can change (add / remove by id).

    Postings map each term to {doc: tf}, and each document's length norm is
    cached until the corpus changes, so a query costs one dict step per posting
    of its terms: a few milliseconds over thousands of procedures.

    k1 = 0.9, b = 0.4 (the usual settings for short passages) rather than the
    web-document 1.2 / 0.75: memory records are short and of similar length, and
    strong length normalisation over-rewards one-line replies. LoCoMo dev,
    BM25 over turns: recall@10 0.607 -> 0.626 (bench/locomo.py).
    """

    def __init__(self, k1: float = BM25_K1, b: float = BM25_B) -> None:
        self.k1, self.b = k1, b
        self._terms: dict[str, tuple[str, ...]] = {}  # doc -> its distinct terms
        self._lengths: dict[str, int] = {}
        self._postings: dict[str, dict[str, int]] = {}
        self._total = 0
        self._norms: dict[str, float] | None = None

    def __len__(self) -> int:
        return len(self._lengths)

    def add(self, doc_id: str, text: str) -> None:
        self.remove(doc_id)
        terms = Counter(_terms(text, None))
        self._terms[doc_id] = tuple(terms)
        length = sum(terms.values())
        self._lengths[doc_id] = length
        self._total += length
        for term, tf in terms.items():
            self._postings.setdefault(term, {})[doc_id] = tf
        self._norms = None

    def remove(self, doc_id: str) -> None:
        terms = self._terms.pop(doc_id, None)
        if terms is None:
            return
        self._total -= self._lengths.pop(doc_id)
        for term in terms:
            posting = self._postings.get(term)
            if posting is not None:
                posting.pop(doc_id, None)
                if not posting:
                    del self._postings[term]
        self._norms = None

    def _doc_norms(self) -> dict[str, float]:
        if self._norms is None:
            n = len(self._lengths)
            avg = self._total / n if n and self._total else 1.0
            k1, b = self.k1, self.b
            self._norms = {d: k1 * (1 - b + b * length / avg) for d, length in self._lengths.items()}
        return self._norms

    def scores(self, query: str, allowed: Iterable[str] | None = None) -> dict[str, float]:
        """doc id -> raw BM25 score for documents matching at least one query term."""
        terms = query_terms(query)
        if not terms or not self._lengths:
            return {}
        n = len(self._lengths)
        norms = self._doc_norms()
        k1p1 = self.k1 + 1
        allow = None if allowed is None else set(allowed)
        out: dict[str, float] = {}
        get = out.get
        for term in terms:
            posting = self._postings.get(term)
            if not posting:
                continue
            idf = math.log(1 + (n - len(posting) + 0.5) / (len(posting) + 0.5)) * k1p1
            if allow is None:
                for doc_id, tf in posting.items():
                    out[doc_id] = get(doc_id, 0.0) + idf * tf / (tf + norms[doc_id])
            else:
                for doc_id, tf in posting.items():
                    if doc_id in allow:
                        out[doc_id] = get(doc_id, 0.0) + idf * tf / (tf + norms[doc_id])
        return out


def squash(score: float) -> float:
    """Map a raw non-negative score into [0, 1) monotonically, for the wire's `score`."""
    return score / (score + 1.0) if score > 0 else 0.0


def query_terms(query: str) -> set[str]:
    """The distinct terms a query is ranked by: `tokenize`'s, and where no stopword told the query's
    language, each word unfolded too.

    A record is folded only when its stopwords say English; a query without stopwords ("casas",
    "apple") is folded as English by guess, and its folded words met only English records: "casas"
    (-> casa) found no Spanish record holding "casas", and "apple" (-> appl) missed "ten o'clock
    apple", read as Italian for its one stopword, "o". A query whose stopwords say English keeps
    only its folded words: unfolded ones met the folding's odd ends ("meetings" keeps "meeting",
    which "meeting" folds past, to "meet"), and LoCoMo's recall@5 fell 0.009 with them."""
    terms = set(_terms(query, None))
    words = _split(query)
    if terms and detect_language(words) is None:
        terms.update(words)  # no stopword of any language among them, so none to remove
    return terms


def bm25_scores(texts: Mapping[K, str], query: str, *, documents: int | None = None,
                k1: float = BM25_K1, b: float = BM25_B) -> dict[K, float]:
    """One-shot raw BM25 over a small corpus (id -> text), for the documents matching a term.

    No index is built: one pass counts the query's terms in each (cached)
    tokenization. `documents` is the size of the collection `texts` was drawn
    from, when `texts` is every document there that holds a query term (a
    database's full-text matches): document frequencies are then exact, and
    only the collection's size is missing for the IDF.
    """
    return bm25_counts(_tokenized(texts), query_terms(query), documents=documents, k1=k1, b=b)


def _tokenized(texts: Mapping[K, str]) -> dict[K, tuple[int, Sequence[str]]]:
    """id -> (length, terms), the form `bm25_counts` ranks, through the tokenizer's cache."""
    out = {}
    for doc_id, text in texts.items():
        terms = _terms(text, None)
        out[doc_id] = (len(terms), terms)
    return out


def bm25_counts(docs: Mapping[K, tuple[int, Sequence[str]]], wanted: set[str], *,
                documents: int | None = None, k1: float = BM25_K1, b: float = BM25_B) -> dict[K, float]:
    """BM25 from each document's length in terms and the terms it holds (at least the query's, with
    repeats): for a store that keeps each record's `tokenize` output and hands back only the
    query's terms, so ranking never re-tokenizes text."""
    if not wanted or not docs:
        return {}
    total = 0
    terms = tuple(wanted)
    hits: list[tuple[K, int, list[tuple[str, int]]]] = []
    df = dict.fromkeys(terms, 0)
    isdisjoint = wanted.isdisjoint
    for doc_id, (length, held) in docs.items():
        total += length
        if isdisjoint(held):  # most documents hold no query term: one C-level pass says so
            continue
        tf = [(t, f) for t in terms if (f := held.count(t))]  # a C-level count per query term
        for t, _ in tf:
            df[t] += 1
        hits.append((doc_id, length, tf))
    n = max(len(docs), documents or 0)
    return _bm25(hits, df, n, total / len(docs) if total else 1.0, k1, b)


def _bm25(hits: Iterable[tuple[K, int, Sequence[tuple[str, int]]]], df: Mapping[str, int], n: int,
          avg: float, k1: float, b: float) -> dict[K, float]:
    """Raw BM25 of each (doc id, length, [(term, tf)]) hit, given the corpus statistics."""
    idf = {t: math.log(1 + (n - d + 0.5) / (d + 0.5)) * (k1 + 1) for t, d in df.items()}
    fixed, per_term = k1 * (1 - b), k1 * b / avg  # the length norm, k1 * (1 - b + b * length / avg)
    out = {}
    for doc_id, length, tf in hits:
        norm = fixed + per_term * length
        out[doc_id] = sum(idf[t] * f / (f + norm) for t, f in tf)
    return out


def rank(texts: dict[str, str], query: str, k1: float = BM25_K1, b: float = BM25_B) -> list[tuple[str, float]]:
    """BM25 over a small corpus (a working session, a rerank pool): [(id, score in [0,1))], best first."""
    return rank_counts(_tokenized(texts), query, k1=k1, b=b)


def rank_counts(docs: Mapping[str, tuple[int, Sequence[str]]], query: str, *, k1: float = BM25_K1,
                b: float = BM25_B) -> list[tuple[str, float]]:
    """`rank` over documents tokenized already ((length, terms) per id, as `bm25_counts` takes them)."""
    return _ranked(bm25_counts(docs, query_terms(query), k1=k1, b=b))


def _ranked(raw: Mapping[str, float]) -> list[tuple[str, float]]:
    scored = [(doc_id, squash(s)) for doc_id, s in raw.items()]
    scored.sort(key=lambda p: (-p[1], p[0]))  # ties by id: the same order on every run
    return scored


class HeldTerms(Generic[K]):
    """Term counts of documents kept in memory, for BM25 over whichever of them a scope holds now.

    For a store that reads a scope's members from its engine on every recall
    (so another writer is always seen) but keeps each member's tokenization,
    since a member names one version of one text and never changes. Postings
    make a recall one C-level set intersection per query term, plus a step per
    hit; a pass over every member in scope was most of a working recall's CPU
    at 1,000 records (decision 29). The statistics (document count, average
    length, document frequencies) are the scope's, as `rank_counts` would
    compute them over the same documents.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.generation = 0  # counts `clear`: a set of keys known held under one generation is held under it
        self._ids: dict[K, str] = {}  # key -> doc id
        self._lengths: dict[K, int] = {}
        self._postings: dict[str, dict[K, int]] = {}

    def __len__(self) -> int:
        return len(self._lengths)

    def __contains__(self, key: object) -> bool:
        return key in self._lengths

    def clear(self) -> None:
        self._ids, self._lengths, self._postings = {}, {}, {}
        self.generation += 1

    def total(self, scope: set[K]) -> int:
        """The summed length of the held documents in `scope` (every key of which must be held)."""
        return sum(map(self._lengths.__getitem__, scope))

    def missing(self, scope: set[K]) -> set[K]:
        """The keys of `scope` not held, to `add` before `rank`. When holding them would pass the
        capacity, everything held is let go first (old versions are never removed one by one)."""
        missing = scope.difference(self._lengths)
        if missing and len(self._lengths) + len(missing) > self.capacity:
            self.clear()
            return set(scope)
        return missing

    def add(self, key: K, doc_id: str, text: str) -> None:
        terms = tokenize_once(text)  # not through the cache: each text is tokenized once here
        self._ids[key] = doc_id
        self._lengths[key] = len(terms)
        postings = self._postings
        for term, tf in Counter(terms).items():
            postings.setdefault(term, {})[key] = tf

    def rank(self, scope: set[K], query: str, *, k1: float = BM25_K1, b: float = BM25_B,
             total: int | None = None) -> list[tuple[str, float]]:
        """`rank_counts` over the held documents in `scope` (every key of which must be held);
        `total` is `self.total(scope)` where the caller knows it already."""
        wanted = query_terms(query)
        if not wanted or not scope:
            return []
        df: dict[str, int] = {}
        tf: dict[K, list[tuple[str, int]]] = {}
        for term in wanted:
            posting = self._postings.get(term)
            if not posting:
                continue
            keys = posting.keys() & scope
            df[term] = len(keys)
            for key in keys:
                tf.setdefault(key, []).append((term, posting[key]))
        if not tf:
            return []
        lengths, ids = self._lengths, self._ids
        if total is None:
            total = self.total(scope)
        hits = [(ids[key], lengths[key], counts) for key, counts in tf.items()]
        return _ranked(_bm25(hits, df, len(scope), total / len(scope) if total else 1.0, k1, b))
