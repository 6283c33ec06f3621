"""Text analysis: tokens, stemming, stopwords, entities, digests."""

from __future__ import annotations

import hashlib
import unicodedata

import pytest

from mnemoflow.agents.text import content_tokens, digest, entities, semantic_key, stem, tokens

PORTER_STEP1 = {
    "caresses": "caress", "ponies": "poni", "ties": "ti", "caress": "caress", "cats": "cat",
    "feed": "feed", "agreed": "agree", "plastered": "plaster", "bled": "bled",
    "motoring": "motor", "sing": "sing", "conflated": "conflate", "troubled": "trouble",
    "sized": "size", "hopping": "hop", "tanned": "tan", "falling": "fall", "hissing": "hiss",
    "fizzed": "fizz", "failing": "fail", "filing": "file", "happy": "happi", "sky": "sky",
}


@pytest.mark.parametrize(("word", "want"), sorted(PORTER_STEP1.items()))
def test_stem_follows_porter_step_1(word: str, want: str) -> None:
    assert stem(word) == want


def test_stem_joins_inflections_and_leaves_odd_words_alone() -> None:
    assert stem("hiking") == stem("hikes") == stem("hiked") == stem("hike")
    assert stem("running") == stem("runs") == "run"
    assert [stem(w) for w in ("bus", "status", "tennis", "is", "ox")] == [
        "bus", "status", "tennis", "is", "ox"]
    assert stem("naïve") == "naïve" and stem("x2s") == "x2s"


def test_tokens_casefold_split_punctuation_keep_digits() -> None:
    assert tokens("Hello, WORLD! 42 cats;dogs") == ["hello", "world", "42", "cat", "dog"]
    assert tokens("Straße") == ["strasse"]  # casefold, not lower
    assert tokens("ＡＢＣ") == ["abc"]  # NFKC folds full-width forms


def test_tokens_apostrophes_and_hyphens() -> None:
    assert tokens("Don’t touch John's car") == ["don't", "touch", "john", "car"]
    assert tokens("O'Brien's rock'n'roll") == ["o'brien", "rock'n'roll"]
    assert tokens("state-of-the-art") == ["state", "of", "the", "art"]
    assert tokens("COVID-19 e-mails t-shirts") == ["covid-19", "e-mail", "t-shirt"]
    assert tokens("it's") == ["it's"]  # a contraction, not a possessive


def test_tokens_numbers_identifiers_unicode() -> None:
    assert tokens("Python 3.11 costs 1,000 dollars") == ["python", "3.11", "cost", "1000",
                                                         "dollar"]
    assert tokens("call lexical_index now") == ["call", "lexical_index", "now"]
    assert tokens("_private__ __init__") == ["private", "init"]
    assert tokens("東京 café") == ["東京", "café"]
    assert tokens("") == [] and tokens("... !!!") == []


def test_content_tokens_drop_stopwords_and_fillers() -> None:
    text = "Yeah okay lol, hey, I really like hiking in the mountains with my dogs!"
    assert content_tokens(text) == ["hike", "mountain", "dog"]
    assert content_tokens("it's what I'm doing") == []
    assert content_tokens("The Eiffel Tower") == ["eiffel", "tower"]


def test_tokens_deterministic() -> None:
    text = "Caroline's 3 dogs went hiking near lake_tahoe in 2023."
    assert tokens(text) == tokens(text) == [t for t in tokens(text)]


@pytest.mark.parametrize(("text", "want"), [
    ("I met Melanie Smith at Bank of America.", ["melanie smith", "bank of america"]),
    ("Caroline: I went to the LGBTQ support group yesterday.", ["caroline", "lgbtq"]),
    ("Yesterday I went to Paris. The Eiffel Tower was great!", ["paris", "eiffel tower"]),
    ("Thanks Caroline! Went hiking. Honestly it was fun.", ["caroline"]),
    ("Jean-Luc Picard visited the Leonardo da Vinci museum.",
     ["jean-luc picard", "leonardo da vinci"]),
    ("I love Caroline's cat.", ["caroline"]),
    ("THIS IS GREAT lol OK", []),
])
def test_entities_names(text: str, want: list[str]) -> None:
    assert entities(text) == want


def test_entities_sentence_start_rules() -> None:
    assert entities("Paris is lovely.") == ["paris"]  # not a common word
    assert entities("Running is fun.") == []  # looks like a common word, appears once
    assert entities("Running is fun. Running helps.") == []  # starts are no evidence
    assert entities("Running is fun. I joined Running Club.") == ["running", "running club"]
    # a lone common-looking word at a start counts once it appears capitalised mid-sentence
    assert entities("Sterling called me.") == []
    assert entities("Sterling called me. Later I texted Sterling.") == ["sterling"]
    assert entities("Monday was busy, on Monday I rested.") == []  # weekdays are not names


def test_entities_structural() -> None:
    text = ("See https://example.com/a/b?x=1. Edit /etc/hosts, src/main.py and config.yaml; "
            "ping @bob_smith about #python or mail bob@example.com. "
            "The path is C:\\Users\\bob\\x.txt")
    assert entities(text) == [
        "https://example.com/a/b?x=1", "/etc/hosts", "src/main.py", "config.yaml", "@bob_smith",
        "#python", "bob@example.com", "c:\\users\\bob\\x.txt"]


def test_entities_identifiers_versions_errors() -> None:
    text = ("Renamed lexical_index and camelCase to LexicalIndex, call foo.bar() and MAX_RETRIES. "
            "Upgraded to Python 3.11 and v2.0.1; got E1234, HTTP 404, error 500, ORA-00942, "
            "CVE-2023-12345")
    assert entities(text) == [
        "lexical_index", "camelcase", "lexicalindex", "foo.bar", "max_retries", "python 3.11",
        "2.0.1", "e1234", "http 404", "error 500", "ora-00942", "cve-2023-12345"]


def test_entities_quantities_and_quotes() -> None:
    assert entities("I ran 5 km in 30 min, paid $50, got 10% off, 3x faster, lost 2.5kg") == [
        "5 km", "30 min", "$50", "10%", "3x", "2.5 kg"]
    assert entities("He said \"hello world\" and 'good night' then ran `pip install`") == [
        "hello world", "good night", "pip install"]


def test_entities_dates_normalise_to_iso() -> None:
    text = "On May 7, 2023 and 7 May 2023 and 2023-05-07 and 2023/05/20 and June 2023, May 9th"
    assert entities(text) == ["2023-05-07", "2023-05-20", "2023-06", "may 9"]
    assert entities("due 2023-02-30") == ["2023-02-30"]  # impossible dates stay literal


def test_entities_not_from_prose() -> None:
    assert entities("and/or 1/2 of it, he said hello, then went home.") == []
    assert entities("") == []


def test_entities_deduped_ordered_limited() -> None:
    text = " ".join(f"@user{i} met Caroline" for i in range(30))
    got = entities(text)
    assert len(got) == 16 and len(set(got)) == 16
    assert got[:3] == ["@user0", "caroline", "@user1"]
    assert entities(text, limit=4) == got[:4]
    assert entities(text) == got  # deterministic


def test_digest_is_exact_and_nfc_normalised() -> None:
    composed, decomposed = "caf\u00e9", "cafe\u0301"
    assert digest(composed) == digest(decomposed)
    assert digest(composed) == hashlib.sha256(
        unicodedata.normalize("NFC", composed).encode()).hexdigest()
    assert digest("Hello") != digest("hello") and digest("a b") != digest("a  b")


def test_semantic_key_collides_for_trivial_paraphrases() -> None:
    a = semantic_key("I went hiking with my dogs yesterday.")
    assert a == semantic_key("yesterday, I went hiking with the DOGS!")
    assert a == semantic_key("Yeah so my dogs and I went hiking... yesterday lol")
    assert a == semantic_key("dog hike went yesterday")  # order and inflection ignored
    assert a != semantic_key("I went hiking with my cats yesterday.")


def test_semantic_key_keeps_negation_and_stopword_only_texts_apart() -> None:
    assert semantic_key("I like sushi") != semantic_key("I don't like sushi")
    assert semantic_key("I do not like sushi") == semantic_key("I don't like sushi!")
    assert semantic_key("yes") != semantic_key("no")
    assert semantic_key("ok") == semantic_key("OK!")


@pytest.mark.parametrize("text", ["a." * 20_000, "-/" * 20_000, "a@" * 20_000, "1." * 20_000,
                                  "Abc " * 10_000, "a.b/c-d_e@f " * 4_000])
def test_pathological_inputs_stay_linear(text: str) -> None:
    """Unbounded backtracking once made 40 kB of "a.a.a." take 80 s. No timed assertion here
    (speed lives in bench/): a regression shows as this test hitting pytest's timeout."""
    ents, toks, key = entities(text), tokens(text), semantic_key(text)
    assert len(ents) <= 16 and isinstance(toks, list) and len(key) == 64


MEMO_TEXTS = ["I don't like sushi, but my sister's cat loves it.",
              "Blue-green deploys: the e-mail says covid-19 rules from 1,000 users on 3.11.",
              "yes", "no", "Ports and Ports, porting, ported", ""]


def test_memoized_tokenizer_gives_what_the_unwrapped_functions_give() -> None:
    """The memos (agents/text.py) only save work: each call, first or repeated, equals the
    unwrapped function's, and a returned list is the caller's own to change."""
    from mnemoflow.agents import text as T

    for t in MEMO_TEXTS * 2:
        raw = T._raw_tokens.__wrapped__(t)
        content = [T._stem_token.__wrapped__(x) for x in raw if x not in T.STOPWORDS]
        assert content_tokens(t) == content
        assert tokens(t) == [T._stem_token.__wrapped__(x) for x in raw]
        terms = set(content) or {T._stem_token.__wrapped__(x) for x in raw}
        if content and any(x in T._NEGATIONS for x in raw):
            terms.add("\u00acneg")
        assert semantic_key(t) == hashlib.sha256(" ".join(sorted(terms)).encode()).hexdigest()
    mine = content_tokens(MEMO_TEXTS[0])
    mine.append("changed")
    assert "changed" not in content_tokens(MEMO_TEXTS[0])
