"""Text normalisation for the injection rules: the views they read and the hidden-text signals.

Text is normalised first (NFKC, invisible characters removed but recorded, mixed-script
homoglyphs mapped to Latin, whitespace folded, casefolded); a second de-obfuscated view (leet
digits, s p a c e d letters, hyphen-chains) is built for the phrase rules, aimed only at the
words those rules look for (the rule set's vocabulary).
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

# Invisible format characters: zero-width space/joiners, word joiner, BOM, soft hyphen,
# invisible math operators, bidi marks/embeddings/overrides/isolates, fillers.
_INVISIBLE = re.compile(
    "[\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180e\u200b-\u200f\u202a-\u202e"
    "\u2060-\u2064\u2066-\u2069\u3164\ufeff\uffa0]")
_INVISIBLE_RUN = re.compile(_INVISIBLE.pattern + "{3,}")
# A zero-width character (soft hyphen excepted: it is a legitimate hyphenation hint) between
# two ASCII letters, i.e. splitting a word so that a keyword filter would not see it.
_IN_WORD = re.compile(
    "[A-Za-z](?:[\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u2069\ufeff\u034f\u180e]+)"
    "(?=[A-Za-z])")
_WORD_WITH_INVISIBLE = re.compile("[A-Za-z" + _INVISIBLE.pattern[1:-1] + "]+")
_TAGS = re.compile("[\U000e0000-\U000e007f]+")
_VARIATION_RUN = re.compile("[\ufe00-\ufe0f\U000e0100-\U000e01ef]{4,}")
_VARIATION = re.compile("[\ufe00-\ufe0f\U000e0100-\U000e01ef]")

_CONFUSABLES = str.maketrans({
    "а": "a", "е": "e", "о": "o", "р": "p", "с": "c", "у": "y", "х": "x", "і": "i", "ј": "j",
    "ѕ": "s", "ԁ": "d", "һ": "h", "ԛ": "q", "ԝ": "w", "А": "A", "В": "B", "Е": "E", "К": "K",
    "М": "M", "Н": "H", "О": "O", "Р": "P", "С": "C", "Т": "T", "Х": "X", "І": "I", "Ѕ": "S",
    "α": "a", "ο": "o", "ι": "i", "κ": "k", "ν": "v", "ρ": "p", "υ": "u", "Α": "A", "Β": "B",
    "Ε": "E", "Ζ": "Z", "Η": "H", "Ι": "I", "Κ": "K", "Μ": "M", "Ν": "N", "Ο": "O", "Ρ": "P",
    "Τ": "T", "Υ": "Y", "Χ": "X",
})
_CONFUSABLE_CHARS = frozenset(k for k in map(chr, _CONFUSABLES))
_HAS_CONFUSABLE = re.compile("[" + "".join(sorted(_CONFUSABLE_CHARS)) + "]")
_HAS_LEET = re.compile(r"[0-9@$](?:(?<=[a-z][0-9@$])|(?=[a-z]))")  # starts on a rare class
_TOKEN = re.compile(r"\w+")
_LEET = str.maketrans({"0": "o", "1": "i", "3": "e", "4": "a", "5": "s", "7": "t", "8": "b",
                       "@": "a", "$": "s"})
_LEET_TOKEN = re.compile(r"(?<![\w@$])(?=[\w@$]*[a-z])(?=[\w@$]*[0-9@$])[\w@$]{3,}")
_SPACED = re.compile(r"(?<![\w])(?:\w[ \t]){3,}\w(?![\w])")
_SPACED_HINT = re.compile(r"[ \t]\w[ \t]\w[ \t]")  # necessary for a spaced run (on " " + text)
_HYPHEN_CHAIN = re.compile(r"\b\w+(?:-\w+){2,}\b")
_HYPHEN_HINT = re.compile(r"-\w+-")

# Frequent words: a hyphen-chain is only undone when it yields two rarer vocabulary words.
_COMMON_WORDS = frozenset("""
a an the you your i we it is are be to of in on for and or not do if when this that all any
please now then just also my our with as at by from
""".split())


@dataclass(frozen=True)
class NormalisedText:
    """The views the rules read, plus the hidden-text signals found while building them."""

    raw: str  # NFKC, invisible characters stripped, homoglyphs mapped, whitespace folded
    folded: str  # raw, casefolded: what most rules read
    deobf: str  # folded, plus leet digits, s p a c e d letters and hyphen-chains undone
    hidden_payloads: tuple[str, ...]  # text decoded from Unicode tags / variation selectors
    invisible_run: str | None  # a run of >= 3 invisible characters (repr), if any
    split_words: tuple[str, ...]  # words that had an invisible character inside them


def _map_confusables(text: str) -> str:
    def fix(m: re.Match[str]) -> str:
        tok = m.group(0)
        if any(c in _CONFUSABLE_CHARS for c in tok) and any("a" <= c.lower() <= "z" for c in tok):
            return tok.translate(_CONFUSABLES)
        return tok

    return _TOKEN.sub(fix, text)


def _fold_ws(text: str) -> str:
    """Runs of whitespace become one space, or one newline if they contain a line break."""
    return "\n".join(filter(None, (" ".join(line.split()) for line in text.split("\n"))))


def _fold_quotes(text: str) -> str:
    """Curly single quotes double as apostrophes; fold both sides to ASCII so pairs still match."""
    return text.replace("\u2019", "'").replace("\u2018", "'")


def _decode_tags(run: str) -> str:
    return "".join(chr(ord(c) - 0xE0000) for c in run if 0x20 <= ord(c) - 0xE0000 < 0x7F)


def _decode_variation(run: str) -> str:
    data = bytes((ord(c) - 0xFE00) if ord(c) < 0xE0000 else (ord(c) - 0xE0100 + 16) for c in run)
    return data.decode("utf-8", "replace")


def normalise(text: str, vocab: frozenset[str]) -> NormalisedText:
    """Build the matching views; hidden-text tricks are recorded, not silently dropped.

    `vocab`: the words the de-obfuscated view may be rebuilt towards (see RuleSet.vocab).
    """
    t = unicodedata.normalize("NFKC", text)
    if t.isascii():  # the common case: no invisible, tag, selector or homoglyph to handle
        return _views(t, (), None, (), vocab)
    payloads: list[str] = []
    for m in _TAGS.finditer(t):
        before = t[max(0, m.start() - 1):m.start()]
        if before == "\U0001f3f4":  # subdivision flags (England, Scotland, Wales) use tags
            continue
        if decoded := _decode_tags(m.group(0)).strip():
            payloads.append(decoded)
    for m in _VARIATION_RUN.finditer(t):
        payloads.append(_decode_variation(m.group(0)))
    run = None
    split: tuple[str, ...] = ()
    if _INVISIBLE.search(t):
        run = _INVISIBLE_RUN.search(t)
        split = tuple(sorted({_INVISIBLE.sub("", w.group(0)).casefold()
                              for w in _WORD_WITH_INVISIBLE.finditer(t)
                              if _IN_WORD.search(w.group(0))}))
        t = _INVISIBLE.sub("", t)
    t = _VARIATION.sub("", _TAGS.sub("", t))
    if _HAS_CONFUSABLE.search(t):
        t = _map_confusables(t)
    return _views(t, tuple(payloads), repr(run.group(0)) if run else None, split, vocab)


def _views(t: str, payloads: tuple[str, ...], run: str | None, split: tuple[str, ...],
           vocab: frozenset[str]) -> NormalisedText:
    raw = _fold_ws(t)
    folded = _fold_quotes(raw.casefold())
    return NormalisedText(raw, folded, _deobfuscate(t, folded, vocab), payloads, run, split)


def _deobfuscate(t: str, folded: str, vocab: frozenset[str]) -> str:
    """Undo s p a c i n g, l33t digits and hyphen-chains, but only where that yields words the
    phrase rules look for: elsewhere ("2nd", "state-of-the-art") the view stays as folded."""
    d = folded
    if _SPACED_HINT.search(" " + t) and _SPACED.search(t):
        def join(m: re.Match[str]) -> str:
            word = m.group(0).replace(" ", "").replace("\t", "")
            return word if word.casefold() in vocab else m.group(0)
        d = _fold_quotes(_fold_ws(_SPACED.sub(join, t)).casefold())
    if _HAS_LEET.search(d):
        def unleet(m: re.Match[str]) -> str:
            word = m.group(0).translate(_LEET)
            return word if word in vocab else m.group(0)
        d = _LEET_TOKEN.sub(unleet, d)
    if _HYPHEN_HINT.search(d):
        def unhyphen(m: re.Match[str]) -> str:
            parts = m.group(0).split("-")
            rare = {w for w in parts if w in vocab and w not in _COMMON_WORDS}
            return " ".join(parts) if len(rare) >= 2 else m.group(0)
        d = _HYPHEN_CHAIN.sub(unhyphen, d)
    return d


