"""The extractive summarizer on its own (the tiers' and the router's `memory/summarize` write what it
makes; tests/backends/test_summarize_prompt.py runs it through each engine)."""

from __future__ import annotations

import random
import unicodedata

from a2m.records import Record
from a2m.summarize import summarize


def record(content: str, n: int = 0) -> Record:
    return Record(id=f"r{n}", content=content, created_at=f"2026-01-01T00:00:{n:02d}.000Z")


def test_a_summary_of_no_room_is_empty_and_returns() -> None:
    """A length below one character fits no sentence (it looped for ever on a long one)."""
    long = record("x" * 50 + " and more")
    assert summarize([long], max_chars=0) == summarize([long], max_chars=-5) == ""
    assert summarize([long], max_chars=1) == "x"


FAMILY = "\U0001F468\u200d\U0001F469\u200d\U0001F467\u200d\U0001F466"  # 7 code points, one emoji
FLAG = "\U0001F1EE\U0001F1F9"  # IT: two regional indicators, one flag
ACCENT = "e\u0301"  # é as e + combining acute


def test_a_long_sentence_is_cut_between_characters_as_a_reader_sees_them() -> None:
    """Text without spaces is cut at the summary's length, but never inside an emoji, a flag or an
    accented letter: a cut there left a piece starting with a joiner, half a flag or a bare accent."""
    for text, unit in ((FAMILY * 300, FAMILY), ("x" + FLAG * 700, FLAG), ("x" + ACCENT * 800, ACCENT),
                       ("\U0001F44D\U0001F3FD" * 701, "\U0001F44D\U0001F3FD")):
        summary = summarize([record(text)], max_chars=1199)
        assert 0 < len(summary) <= 1199
        assert summary.lstrip("x").replace(unit, "") == "", repr(summary[-12:])
        pieces = summary.split("\n")
        assert all(not unicodedata.combining(p[0]) and p[0] != "\u200d" for p in pieces)


def test_one_character_longer_than_the_summary_is_still_cut() -> None:
    zalgo = "a" + "\u0301" * 2000  # one character as a reader sees it, far longer than the summary
    assert len(summarize([record(zalgo)], max_chars=100)) == 100


SENTENCES = ["Anna met Marco in Rome on 3 May 2023.", "- a list item without an end", "東京で会議がありました。",
             "Is it done?", "then " + "a long clause " * 120, "🎉", "| Marco | 40 |", "Zoë paid 12 €!",
             "一" * 1500, "trailing words"]


def test_a_summary_is_its_own_summary_and_adds_nothing_to_its_sources() -> None:
    """Whatever the sentences (ended or not, CJK, cut pieces of long ones), a summary splits back into
    the sentences it was made of: summarised again it is unchanged, and read beside its sources it
    adds nothing."""
    rng = random.Random(7)
    for trial in range(200):
        records = [record("\n".join(rng.sample(SENTENCES, rng.randint(1, 4))), n) for n in range(rng.randint(1, 4))]
        size = rng.choice([60, 300, 1200])
        summary = summarize(records, max_chars=size)
        assert summary and len(summary) <= size, trial  # an empty summary holds both properties trivially
        assert summarize([record(summary)], max_chars=size) == summary, trial
        assert summarize(records + [record(summary, 59)], max_chars=size) == summary, trial


def test_lines_that_only_frame_or_rule_are_no_sentences() -> None:
    text = "```js\nlet x = 1\n```\n~~~\n***\n---\n|:--|--:|\n...\n🙂\n©"
    assert summarize([record(text)]).split("\n") == ["let x = 1", "🙂", "©"]
    assert summarize([record("```\n---\n")]) == ""



def test_a_cut_leaves_no_piece_of_punctuation_alone() -> None:
    """A sentence longer than the summary is cut at spaces, and its last piece may be only a `?`
    (French puts a space before it) or a `...`: that piece says nothing, and it was kept as a line of
    its own ("Est-ce que tu\n?"), so the summary did not split back into its own sentences either
    (summarised again, the line went)."""
    for text, size in (("Est-ce que tu viens demain matin ?", 18), ("Est-ce que tu viens demain matin ?", 12),
                       ("and then we waited and waited and waited ...", 7)):
        summary = summarize([record(text)], max_chars=size)
        assert summary and all(line.strip("?.") for line in summary.split("\n")), repr(summary)
        assert summarize([record(summary)], max_chars=size) == summary


def test_hindi_arabic_urdu_armenian_and_ethiopic_sentences_are_sentences() -> None:
    """Hindi ends a sentence with `।`, Arabic asks with `؟`, Urdu ends with `۔`, Armenian with `։`,
    Amharic with `።` (asks with `፧`), each before a space.
    Those were no sentence ends: a long text was one sentence, cut into pieces at any space (the
    summary began mid-sentence) and a sentence said again was kept again."""
    for said, fact in (("आज मौसम बहुत अच्छा था और हम बगीचे में टहलने गए।", "राम 3 मई 2023 को दिल्ली गया।"),
                       ("هل كان الطقس جميلا في الحديقة اليوم؟", "سافر أحمد إلى القاهرة في 3 مايو 2023."),
                       ("آج موسم بہت اچھا تھا اور ہم باغ میں گئے۔", "رام 3 مئی 2023 کو دہلی گیا۔"),
                       ("Այսօր եղանակը շատ լավ էր, և մենք գնացինք այգի։", "Արամը մայիսի 3-ին 2023 գնաց Երևան։"),
                       ("ዛሬ የአየር ሁኔታው በጣም ጥሩ ነበር እና ወደ አትክልቱ ሄድን።", "አበበ ግንቦት 3 2023 ወደ አዲስ አበባ ሄደ፧")):
        summary = summarize([record(" ".join([said] * 40 + [fact]))], max_chars=200)
        assert summary == f"{said} {fact}", repr(summary)
        assert summarize([record(summary)], max_chars=200) == summary
