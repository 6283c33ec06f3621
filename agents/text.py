"""Text analysis shared by every stage: tokens, content tokens, entities, digests. Pure, no models."""

from __future__ import annotations

import hashlib
import re
import unicodedata

STOPWORDS = frozenset("""
a about above after again against all am an and any are aren't as at be because been before
being below between both but by can can't cannot could couldn't did didn't do does doesn't doing
don't down during each few for from further had hadn't has hasn't have haven't having he he'd
he'll he's her here here's hers herself him himself his how how's i i'd i'll i'm i've if in into
is isn't it it's its itself let's me more most mustn't my myself no nor not of off on once only
or other ought our ours ourselves out over own same shan't she she'd she'll she's should
shouldn't so some such than that that's the their theirs them themselves then there there's
these they they'd they'll they're they've this those through to too under until up very was
wasn't we we'd we'll we're we've were weren't what what's when when's where where's which while
who who's whom why why's with won't would wouldn't you you'd you'll you're you've your yours
yourself yourselves yeah yes yep ok okay hey hi hello lol haha oh wow um uh hmm thanks thank
really just also like got get gonna wanna so well sure cool great awesome
""".split())

_TOKEN = re.compile(r"[\w]+(?:['’\-][\w]+)*", re.UNICODE)
_SUFFIXES = (("ational", "ate"), ("ization", "ize"), ("fulness", "ful"), ("ousness", "ous"),
             ("iveness", "ive"), ("ies", "y"), ("sses", "ss"), ("ness", ""), ("ment", ""),
             ("ing", ""), ("edly", ""), ("ed", ""), ("ly", ""), ("es", ""), ("s", ""))


def stem(word: str) -> str:
    """A small suffix stripper: enough to join plurals and tenses, stable and predictable."""
    if len(word) <= 3 or not word.isalpha():
        return word
    for suf, rep in _SUFFIXES:
        if word.endswith(suf) and len(word) - len(suf) + len(rep) >= 3:
            if suf == "s" and word.endswith(("ss", "us", "is")):
                return word
            out = word[: len(word) - len(suf)] + rep
            if suf in ("ing", "ed", "edly") and len(out) > 3 and out[-1] == out[-2] \
                    and out[-1] not in "lsz":
                out = out[:-1]
            return out
    return word


def _norm(text: str) -> str:
    return unicodedata.normalize("NFKC", text).casefold().replace("’", "'")


def tokens(text: str) -> list[str]:
    """Casefolded, stemmed word tokens, in order."""
    return [stem(t) for t in _TOKEN.findall(_norm(text))]


def content_tokens(text: str) -> list[str]:
    """Tokens without stopwords: what a lexical match should be about."""
    return [stem(t) for t in _TOKEN.findall(_norm(text)) if t not in STOPWORDS]


_NAME = re.compile(r"\b([A-Z][\w'’\-]+(?:\s+(?:[A-Z][\w'’\-]+|of|de|van|von))*)")
_QUOTED = re.compile(r"[\"“]([^\"”]{2,60})[\"”]")
_SPECIAL = re.compile(
    r"(@\w+|#\w+|https?://\S+|(?:[\w.\-]+/)+[\w.\-]+|\b[A-Za-z]:\\[\w\\.\-]+|"
    r"\b[a-z]+(?:_[a-z0-9]+)+\b|\b[a-z]+(?:[A-Z][a-z0-9]+)+\b|\bv?\d+\.\d+(?:\.\d+)*\b|"
    r"\b[A-Z]{1,4}-?\d{2,5}\b|\bHTTP \d{3}\b)")
_SENT_START = re.compile(r"(?:^|[.!?]\s+|\n)\s*$")
_COMMON_CAPS = frozenset("""
i i'm i've i'll i'd hey hi hello yes no oh ok okay thanks thank wow yeah so and but the a an it
that this what when where who why how which well sure great good nice congrats congratulations
sounds really that's it's you you're we we're they my our your me he she his her
""".split())


def entities(text: str, limit: int = 16) -> list[str]:
    """Cheap rule-based entities (names, quoted terms, handles, paths, identifiers, versions)."""
    found: list[str] = []
    for m in _SPECIAL.finditer(text):
        found.append(m.group(0))
    for m in _QUOTED.finditer(text):
        found.append(m.group(1))
    for m in _NAME.finditer(text):
        name = m.group(1).strip(" '’-")
        words = name.split()
        at_start = bool(_SENT_START.search(text[: m.start()]))
        if at_start:
            if words[0].casefold() in _COMMON_CAPS or (len(words) == 1 and words[0].casefold()
                                                       in STOPWORDS):
                words = words[1:]
            if not words:
                continue
            name = " ".join(words)
        if name.casefold() in _COMMON_CAPS or name.casefold() in STOPWORDS:
            continue
        found.append(name)
    out: list[str] = []
    seen: set[str] = set()
    for f in found:
        key = _norm(f).strip()
        if key and key not in seen and len(key) > 1:
            seen.add(key)
            out.append(key)
    return out[:limit]


def digest(text: str) -> str:
    """Exact digest: sha256 of the NFC-normalised text."""
    return hashlib.sha256(unicodedata.normalize("NFC", text).encode()).hexdigest()


def semantic_key(text: str) -> str:
    """Cheap semantic digest: paraphrases differing only in stopwords, order or punctuation collide."""
    return hashlib.sha256(" ".join(sorted(set(content_tokens(text)))).encode()).hexdigest()
