import random

from a2m.text import BM25, HeldTerms, bm25_scores, detect_language, fold, query_terms, rank, sparse_vector, tokenize


def test_accents_fold_both_ways() -> None:
    assert tokenize("città") == tokenize("citta") == ["citta"]
    assert fold("Ärger Straße") == "arger strasse"


def test_cjk_becomes_bigrams() -> None:
    assert tokenize("東京タワー") == ["東京", "京タ", "タワ", "ワー"]
    assert tokenize("山") == ["山"]
    assert "東京" in tokenize("I visited 東京 yesterday")


def test_cyrillic_is_tokenized_and_russian_stopwords_removed() -> None:
    tokens = tokenize("Москва и Санкт-Петербург это большие города")
    assert "москва" in tokens and "города" in tokens
    assert "и" not in tokens


def test_stopwords_per_detected_language() -> None:
    assert tokenize("the cat is on the mat") == ["cat", "mat"]
    assert tokenize("il gatto è sul tavolo") == ["gatto", "tavolo"]
    assert tokenize("der Hund ist nicht im Haus") == ["hund", "haus"]
    assert tokenize("le chat est dans la maison") == ["chat", "maison"]
    assert tokenize("el perro está en la casa") == ["perro", "casa"]
    # "die" is German for "the" but an English verb: kept when the text is English
    assert "die" in tokenize("plants die without the water")


def test_language_detection() -> None:
    assert detect_language(tokenize.__globals__["_split"]("where is the station")) == "en"
    assert detect_language(tokenize.__globals__["_split"]("dove sono le chiavi della macchina")) == "it"
    assert detect_language(["xyzzy"]) is None


def test_only_stopwords_yields_nothing() -> None:
    assert tokenize("the of and to") == []
    assert rank({"a": "the cat", "b": "a dog"}, "the of") == []


def test_english_plurals_fold() -> None:
    assert tokenize("adoption agencies") == tokenize("adoption agency")
    assert tokenize("cats") == tokenize("cat")
    assert tokenize("moved") == tokenize("move") == tokenize("moving")
    assert tokenize("running") == tokenize("run") and tokenize("stopped") == tokenize("stop")


def test_bm25_prefers_rarer_and_more_frequent_terms() -> None:
    index = BM25()
    index.add("a", "redis stores the working transcript")
    index.add("b", "postgres stores episodes and postgres indexes them")
    index.add("c", "git stores procedures")
    scores = index.scores("postgres episodes")
    assert max(scores, key=scores.get) == "b"
    assert "c" not in scores


def test_bm25_remove_and_replace() -> None:
    index = BM25()
    index.add("a", "bologna")
    index.add("a", "milan")  # re-adding replaces
    assert index.scores("bologna") == {}
    assert set(index.scores("milan")) == {"a"}
    index.remove("a")
    assert len(index) == 0 and index.scores("milan") == {}


def test_rank_scores_in_unit_interval_and_sorted() -> None:
    ranked = rank({"a": "alpha beta", "b": "alpha alpha alpha", "c": "gamma"}, "alpha")
    assert [d for d, _ in ranked][0] == "b"
    assert all(0 < s < 1 for _, s in ranked)


def test_sparse_vector_is_stable_and_sorted() -> None:
    indices, values = sparse_vector("cats and cats and dogs")
    assert indices == sorted(indices) and len(indices) == 2
    assert sparse_vector("cats and cats and dogs") == (indices, values)
    assert values[indices.index(sparse_vector("cat")[0][0])] > values[indices.index(sparse_vector("dog")[0][0])]


def test_held_terms_rank_any_subset_as_a_pass_over_it_would() -> None:
    """Postings over everything held, statistics of the scope asked: the same scores and order as
    `rank` over exactly the scope's texts, whatever else is held."""
    rnd = random.Random(7)
    words = [f"word{i}" for i in range(60)]
    texts = {f"m{i}": " ".join(rnd.choices(words[: 5 + i % 50], k=rnd.randint(1, 15))) for i in range(400)}
    held: HeldTerms[str] = HeldTerms(capacity=10_000)
    for key, text in texts.items():
        held.add(key, f"id-{key}", text)
    matched = 0
    for _ in range(30):
        scope = set(rnd.sample(sorted(texts), rnd.randint(1, 300)))
        query = " ".join(rnd.sample(words, 3))
        expected = rank({f"id-{k}": texts[k] for k in scope}, query)
        assert held.rank(scope, query) == expected
        matched += bool(expected)
    assert matched >= 20  # the comparisons are of scores, not of empty lists
    assert held.rank(set(), "word1") == [] and held.rank({"m1"}, "the") == []


def test_held_terms_lets_go_of_everything_past_its_capacity() -> None:
    held: HeldTerms[str] = HeldTerms(capacity=3)
    for key in ("a", "b"):
        held.add(key, key, "alpha beta")
    assert held.missing({"a", "b", "c"}) == {"c"}
    assert held.missing({"c", "d"}) == {"c", "d"} and len(held) == 0  # 2 + 2 > 3: all let go
    for key in ("c", "d"):
        held.add(key, key, "alpha")
    assert [doc for doc, _ in held.rank({"c", "d"}, "alpha")] == ["c", "d"]


def test_the_tokenizer_cache_is_bounded_by_characters_not_only_by_texts() -> None:
    """The cache of tokenized texts held 32,768 texts whatever their length: a server recalling
    20 KB tool outputs grew to ~5.6 GB of RSS over time. It holds TERMS_CHARS characters at most,
    the most recently used kept, and answers as tokenizing afresh would."""
    from a2m import text

    assert text._terms.chars == text.TERMS_CHARS <= 64 * 1024 * 1024 and text._terms.texts == text.TERMS_TEXTS
    cache = text._TermsCache(texts=100, chars=10_000)
    texts = [f"record {i} " + " ".join(f"harbour{i}x{j}" for j in range(100)) for i in range(50)]  # ~1,400 chars
    for t in texts:
        assert cache(t, None) == tuple(tokenize(t))
    assert cache.held <= 10_000 and len(cache) == cache.held // len(texts[-1]) < 10
    assert cache(texts[-1], None) is cache(texts[-1], None)  # a hit: the tuple held
    assert cache(texts[-1], "it") == text._tokenize(texts[-1], "it")  # another language is another entry
    huge = "harbour " * 2_000  # over the whole budget: tokenized, not kept, nothing let go for it
    held = len(cache)
    assert cache(huge, None) == tuple(tokenize(huge)) and len(cache) == held
    cache.clear()
    assert len(cache) == 0 and cache.held == 0


def test_a_long_word_is_stemmed_the_same_and_not_cached() -> None:
    # `\w+` has no bound: 65,536 cached stems of 100 KB hex dumps could hold 6.4 GB.
    from a2m import text

    blob = "deadbeefs" * 2000
    text.tokenize_once("the tool printed it twice")  # its short words' stems are cached now
    before = text._stem_en.cache_info().currsize
    assert text.tokenize_once(f"the tool printed {blob} twice") == ["tool", "print", blob[:-1], "twic"]
    assert text._stem_en.cache_info().currsize == before
    assert text.tokenize_once("a" * 70 + "s here") == ["a" * 70]


def test_a_query_of_no_known_language_meets_records_that_kept_their_words() -> None:
    """The unfolded words are added only where no stopword told the query's language: one whose
    stopwords say English or Spanish is tokenized as that language alone."""
    docs = {"es": "Compré dos casas en Madrid", "en": "we moved two houses"}
    assert query_terms("casas") == {"casa", "casas"} and set(bm25_scores(docs, "casas")) == {"es"}
    assert set(bm25_scores(docs, "houses moving")) == {"en"}
    assert query_terms("las casas") == {"casas"} and query_terms("the houses") == {"hous"}
    assert query_terms("the") == set()
