"""Text analysis shared by every stage: tokens, content tokens, entities, digests.

Pure and model-free so that every stage (observer, gate, lexical index) derives the same
terms from the same text, on every replay, on every machine.
"""

from __future__ import annotations

import bisect
import hashlib
import re
import unicodedata
from collections.abc import Callable
from datetime import date
from functools import lru_cache

# --------------------------------------------------------------------------------------------
# Normalisation and tokens
# --------------------------------------------------------------------------------------------

_FUNCTION_WORDS = frozenset("""
a about above after again against all am an and any are aren't as at be because been before
being below between both but by can can't cannot could couldn't did didn't do does doesn't doing
don't down during each few for from further had hadn't has hasn't have haven't having he he'd
he'll he's her here here's hers herself him himself his how how's i i'd i'll i'm i've if in into
is isn't it it's its itself let's me more most mustn't my myself no nor not of off on once only
or other ought our ours ourselves out over own same shan't she she'd she'll she's should
shouldn't so some such than that that's the their theirs them themselves then there there's
these they they'd they'll they're they've this those through to too under until up very was
wasn't we we'd we'll we're we've were weren't what what's when when's where where's which while
who who's whom why why's with won't would wouldn't you you'd you'll you're you've your
yours yourself yourselves
""".split())

# Conversational fillers: frequent in chat, never what a memory is about.
_FILLERS = frozenset("""
yeah yea yes yep yup nope nah ok okay k hey hi hello lol lmao omg haha hahaha oh ah uh um umm
hmm huh wow thanks thank thx pls please really just also like got get gonna wanna gotta so
well sure cool great awesome alright anyway anyways btw actually basically literally kinda
sorta maybe totally
""".split())

STOPWORDS = _FUNCTION_WORDS | _FILLERS

_NEGATIONS = frozenset("no not nor never cannot can't don't doesn't didn't isn't aren't wasn't "
                       "weren't won't wouldn't couldn't shouldn't hasn't haven't hadn't mustn't "
                       "shan't nope nah".split())

_CHARMAP = str.maketrans({"\u2019": "'", "\u2018": "'", "\u02bc": "'", "\u2010": "-",
                          "\u2011": "-"})

# Numbers first (decimals/versions "3.11", grouped thousands "1,000"), then words whose parts
# may be joined by underscores, apostrophes or hyphens.
_WORD = r"[^\W_]+(?:_+[^\W_]+)*"
_TOKEN = re.compile(r"\d{1,3}(?:,\d{3})+(?![\d,])|\d+(?:\.\d+)+|"
                    + _WORD + r"(?:['\-]" + _WORD + r")*")


def normalize(text: str) -> str:
    """NFKC, casefold and one apostrophe/hyphen form: the shape every comparison uses."""
    return unicodedata.normalize("NFKC", text).translate(_CHARMAP).casefold()


def _is_cons(w: str, i: int) -> bool:
    c = w[i]
    if c in "aeiou":
        return False
    if c == "y":
        return i == 0 or not _is_cons(w, i - 1)
    return True


def _measure(w: str) -> int:
    """Porter's m: the number of vowel-consonant sequences in `w`."""
    seq = "".join("c" if _is_cons(w, i) else "v" for i in range(len(w)))
    return seq.count("vc")


def _has_vowel(w: str) -> bool:
    return any(not _is_cons(w, i) for i in range(len(w)))


def _cvc(w: str) -> bool:
    return (len(w) >= 3 and _is_cons(w, len(w) - 3) and not _is_cons(w, len(w) - 2)
            and _is_cons(w, len(w) - 1) and w[-1] not in "wxy")


def stem(word: str) -> str:
    """Porter step 1 (plurals, -ed, -ing, -y): joins inflections without Porter's over-stemming.

    Only plain ASCII-letter words longer than two characters are touched; "-us" and "-is"
    words (bus, status, this, tennis) keep their final s.
    """
    if len(word) <= 2 or not (word.isascii() and word.isalpha()):
        return word
    w = word
    # step 1a
    if w.endswith("sses") or w.endswith("ies"):
        w = w[:-2]
    elif w.endswith("s") and not w.endswith(("ss", "us", "is")):
        w = w[:-1]
    # step 1b
    if w.endswith("eed"):
        if _measure(w[:-3]) > 0:
            w = w[:-1]
    else:
        for suf in ("ed", "ing"):
            base = w[: -len(suf)]
            if w.endswith(suf) and _has_vowel(base):
                w = base
                if w.endswith(("at", "bl", "iz")):
                    w += "e"
                elif len(w) >= 2 and w[-1] == w[-2] and _is_cons(w, len(w) - 1) \
                        and w[-1] not in "lsz":
                    w = w[:-1]
                elif _measure(w) == 1 and _cvc(w):
                    w += "e"
                break
    # step 1c
    if w.endswith("y") and len(w) > 2 and _has_vowel(w[:-1]):
        w = w[:-1] + "i"
    return w


# The memos below are of pure functions, so they change no result, only its cost: a memory's
# fold tokenizes its text up to three times (record, semantic key, postings), and stemming was
# half of a fold's time (bench_fold.py).
@lru_cache(maxsize=1024)
def _raw_tokens(text: str) -> tuple[str, ...]:
    """Unstemmed tokens. Hyphenated words split into parts unless a part has a digit or is a
    single letter (covid-19, e-mail, x-ray stay whole); possessive 's is dropped."""
    out: list[str] = []
    for tok in _TOKEN.findall(normalize(text)):
        if tok[0].isdigit() and "," in tok:
            tok = tok.replace(",", "")
        if "-" in tok:
            parts = tok.split("-")
            if not any(len(p) == 1 or any(c.isdigit() for c in p) for p in parts):
                out.extend(parts)
                continue
        if tok.endswith("'s") and len(tok) > 2 and tok not in STOPWORDS:
            tok = tok[:-2]
        out.append(tok)
    return tuple(out)


@lru_cache(maxsize=1 << 16)
def _stem_token(tok: str) -> str:
    if "-" in tok:
        head, _, last = tok.rpartition("-")
        return f"{head}-{stem(last)}"
    return stem(tok)


def tokens(text: str) -> list[str]:
    """Casefolded, stemmed word tokens in text order (stopwords included)."""
    return [_stem_token(t) for t in _raw_tokens(text)]


def content_tokens(text: str) -> list[str]:
    """Tokens without stopwords and fillers: what a lexical match should be about."""
    return list(_content_tokens(text))


@lru_cache(maxsize=1024)
def _content_tokens(text: str) -> tuple[str, ...]:
    return tuple([_stem_token(t) for t in _raw_tokens(text) if t not in STOPWORDS])


# --------------------------------------------------------------------------------------------
# Entities
# --------------------------------------------------------------------------------------------

_MONTHS = ["january", "february", "march", "april", "may", "june", "july", "august",
           "september", "october", "november", "december"]
_MONTH_NO = {m[:3]: i + 1 for i, m in enumerate(_MONTHS)}
_MON = (r"(?:jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?|"
        r"sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)")
_ORD = r"(?:st|nd|rd|th)?"
_WEEKDAYS = frozenset("monday tuesday wednesday thursday friday saturday sunday".split())

# Capitalised words that name nothing when they stand alone or open a sentence (a compact
# list, not a dictionary).
_COMMON = STOPWORDS | _WEEKDAYS | frozenset(_MONTHS) | frozenset("""
i i'm i've i'll i'd good nice congrats congratulations sounds thank glad sorry love loved
yesterday today tonight tomorrow now then there here sometimes often usually always never
definitely honestly seriously absolutely exactly right true wait look looks let also same
maybe perhaps probably anyway however although though still even yet mr mrs ms dr
went go goes going gone been did done made make makes took take takes saw see seen said say
says think thought know knew want wanted need needed feel felt try tried hope wish agree
one two three four five first second next last new old happy fun interesting amazing
wonderful lovely beautiful hmm mhm check please note add remove use using run fix update
set show tell ask call give find keep put read write open close start stop send help
can could would should will shall must might may ever every many much another each
since after before during once later soon earlier recently lately finally meanwhile
besides instead otherwise overall sadly luckily unfortunately fortunately hopefully
hey hi hello dear yo welcome cheers bye goodbye speaking talking anyone someone everyone
something anything everything nothing nobody somebody everybody thing things stuff
see edit win lose buy pay move turn pick bring leave meet join watch listen play eat drink
cook sleep walk drive visit guess imagine remember forget learn teach hear believe wonder talk
""".split())

_URL = re.compile(r"\b(?:https?://|www\.)[^\s<>\"'`]+")
_EMAIL = re.compile(r"(?<![\w.+\-])[\w.+\-]{1,64}@[\w\-]++(?:\.[\w\-]++)++")
_HANDLE = re.compile(r"(?<![\w@])@\w(?:[\w.\-]*\w)?")
_TAG = re.compile(r"(?<![\w#&])#[^\W\d]\w*")
_DATE_ISO = re.compile(r"\b(\d{4})[-/](\d{1,2})[-/](\d{1,2})(?!\d)")
_DATE_MDY = re.compile(r"\b(" + _MON + r")\.?\s+(\d{1,2})" + _ORD + r"\b(?:,?\s+(\d{4})\b)?",
                       re.I)
_DATE_DMY = re.compile(r"\b(\d{1,2})" + _ORD + r"\s+(?:of\s+)?(" + _MON + r")\b\.?(?:,?\s+"
                       r"(\d{4})\b)?", re.I)
_DATE_MY = re.compile(r"\b(" + _MON + r")\.?,?\s+(\d{4})\b", re.I)
_WINPATH = re.compile(r"\b[A-Za-z]:\\[^\s\"'<>|]+")
_ABSPATH = re.compile(r"(?<![\w/.~\-])(?:~|\.{1,2})?/[\w.\-]++(?:/[\w.\-]++)*+/?")
_RELPATH = re.compile(r"(?<![\w/.\-])[\w.\-]++(?:/[\w.\-]++)++/?")
_FILE = re.compile(r"(?<![\w.\-/\\])[\w\-]++(?:\.[\w\-]++)++")
_FILE_EXT = re.compile(r"py|pyi|ipynb|js|mjs|ts|tsx|jsx|json|jsonl|yaml|yml|toml|ini|cfg|conf|"
                       r"env|md|rst|txt|csv|tsv|parquet|avsc|avro|proto|html|css|scss|java|kt|"
                       r"go|rs|rb|php|c|h|cc|cpp|hpp|cs|swift|sh|bash|zsh|ps1|sql|xml|lock|log|"
                       r"pdf|docx?|xlsx?|pptx?|png|jpe?g|gif|svg|zip|gz|tar", re.I)
_CVE = re.compile(r"\bCVE-\d{4}-\d{4,}\b", re.I)
_HTTP = re.compile(r"\b(?:HTTP|error|status|exit code|code)\s+(\d{3,5})\b", re.I)
_ERRCODE = re.compile(r"\b[A-Z]{1,5}-?\d{2,6}\b")
_VERSION = re.compile(r"\bv\d+(?:\.\d+)+(?:-[\w.]+)?\b|\b\d+\.\d+\.\d+(?:-[\w.]+)?\b|"
                      r"\b(?:version|ver\.?|release)\s+\d+(?:\.\d+)*\b", re.I)
_PRODUCT_VERSION = re.compile(r"\b([A-Z][A-Za-z+#]*)\s+v?(\d+(?:\.\d+)+)\b")
_UNITS_LONG = (r"%|km/h|kms?|kilomet(?:er|re)s?|mi|miles?|meters?|metres?|cm|mm|kg|kgs|grams?|"
               r"lbs?|pounds?|oz|ounces?|liters?|litres?|ml|kb|mb|gb|tb|ms|secs?|seconds?|mins?|"
               r"minutes?|hrs?|hours?|days?|weeks?|months?|years?|yrs?|°[cf]|degrees?|px|fps|"
               r"mph|kph|ghz|mhz|hz|kw|kwh|mah|dollars?|euros?|usd|eur|gbp|bucks")
_UNIT = re.compile(r"\b(\d+(?:[.,]\d+)?)(?:\s?(" + _UNITS_LONG + r")(?![\w/])|"
                   r"([mhkxgwlv])\b)", re.I)
_MONEY = re.compile(r"[$€£¥]\s?\d+(?:[.,]\d+)*(?:\s?[kmb]n?\b)?", re.I)
_IDENT = re.compile(r"\b_*+[A-Za-z][A-Za-z0-9]*+(?:_++[A-Za-z0-9]++)++_*+\b|"  # snake_case, SNAKE
                    r"\b[a-z][a-z0-9]*(?:[A-Z][a-z0-9]*)+\b|"  # camelCase, iPhone
                    r"\b[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*)+\b|"  # CamelCase, GitHub
                    r"(?<![\w.])[A-Za-z_]\w*+(?:\.[A-Za-z_]\w*+)*+\(\)")  # call()
_QUOTES = (re.compile(r"\"([^\"\n]{2,60})\""), re.compile(r"\u201c([^\u201d\n]{2,60})\u201d"),
           re.compile(r"(?<!\w)'([^'\n]{2,60})'(?!\w)"), re.compile(r"`([^`\n]{1,60})`"))
_CAPWORD = re.compile(r"[^\W\d_][\w'\-]*")
_CONNECTORS = frozenset("of de da di du del la le van von der den the".split())
_EDGE = _FUNCTION_WORDS | _CONNECTORS
_LEAD_AT_START = _COMMON | _CONNECTORS
_OPENERS = frozenset(" \t\r\"'([\u201c*_-")


def _at_sentence_start(text: str, i: int) -> bool:
    """True if only openers (spaces, quotes, brackets, bullets) separate i from a sentence end."""
    while i > 0 and text[i - 1] in _OPENERS:
        i -= 1
    return i == 0 or text[i - 1] in ".!?:;\n"


def _iso(y: int, m: int, d: int) -> str | None:
    try:
        return date(y, m, d).isoformat()
    except ValueError:
        return None


def _date_value(kind: str, m: re.Match[str]) -> str:
    if kind == "iso":
        return _iso(int(m[1]), int(m[2]), int(m[3])) or m[0]
    if kind == "my":
        return f"{int(m[2]):04d}-{_MONTH_NO[m[1][:3].casefold()]:02d}"
    mon, day, year = (m[1], m[2], m[3]) if kind == "mdy" else (m[2], m[1], m[3])
    month = _MONTH_NO[mon[:3].casefold()]
    if year:
        return _iso(int(year), month, int(day)) or m[0]
    if not 1 <= int(day) <= 31:
        return m[0]
    return f"{_MONTHS[month - 1]} {int(day)}"


def _unit_value(m: re.Match[str]) -> str:
    if m[3]:
        return m[1] + m[3].casefold()  # attached one-letter units: 3x, 5k, 10m
    unit = m[2].casefold()
    return m[1] + unit if unit == "%" else f"{m[1]} {unit}"


def _path_ok(p: str) -> bool:
    """Relative paths need a file extension, a trailing slash or two slashes, and a letter."""
    last = p.rstrip("/").rsplit("/", 1)[-1]
    return any(c.isalpha() for c in p) and ("." in last.strip(".") or p.endswith("/")
                                            or p.count("/") >= 2)


def _structural(text: str) -> list[tuple[int, int, str]]:
    """(start, end, value) of pattern entities, in priority order (earlier claims a span)."""
    out: list[tuple[int, int, str]] = []

    def add(rx: re.Pattern[str], value: Callable[[re.Match[str]], str] = lambda m: m[0],
            keep: Callable[[re.Match[str]], bool] = lambda m: True) -> None:
        for m in rx.finditer(text):
            if keep(m):
                out.append((m.start(), m.end(), value(m)))

    strip_tail = ".,;:!?)]}'\""
    for m in _URL.finditer(text):
        url = m[0].rstrip(strip_tail)
        out.append((m.start(), m.start() + len(url), url))
    add(_EMAIL)
    add(_HANDLE)
    add(_TAG)
    add(_DATE_ISO, lambda m: _date_value("iso", m))
    add(_DATE_MDY, lambda m: _date_value("mdy", m),
        lambda m: bool(m[3]) or m[1][0].isupper())
    add(_DATE_DMY, lambda m: _date_value("dmy", m),
        lambda m: bool(m[3]) or m[2][0].isupper())
    add(_DATE_MY, lambda m: _date_value("my", m))
    add(_WINPATH, lambda m: m[0].rstrip(strip_tail))
    add(_ABSPATH, lambda m: m[0].rstrip(".,;:!?"), lambda m: any(c.isalpha() for c in m[0]))
    add(_RELPATH, lambda m: m[0].rstrip(".,;:!?"), lambda m: _path_ok(m[0].rstrip(".,;:!?")))
    add(_FILE, keep=lambda m: bool(_FILE_EXT.fullmatch(m[0].rsplit(".", 1)[1])))
    add(_CVE)
    add(_HTTP)
    add(_ERRCODE)
    add(_PRODUCT_VERSION, lambda m: f"{m[1]} {m[2]}",
        lambda m: m[1].casefold() not in _COMMON)
    add(_VERSION, lambda m: re.sub(r"^(?:v|version\s+|ver\.?\s+|release\s+)", "", m[0], flags=re.I))
    add(_MONEY, lambda m: m[0].replace(" ", ""))
    add(_UNIT, _unit_value)
    add(_IDENT, lambda m: m[0].removesuffix("()"))
    return out


def _names(text: str, taken: list[tuple[int, int]]) -> list[tuple[int, int, str]]:
    """Runs of capitalised words. At a sentence start a lone common-looking word is no name
    unless it also appears capitalised away from a sentence start."""
    starts = [s for s, _ in taken]  # taken: sorted, non-overlapping

    def claimed(i: int) -> bool:
        j = bisect.bisect_right(starts, i) - 1
        return j >= 0 and i < taken[j][1]

    words = [m for m in _CAPWORD.finditer(text) if not claimed(m.start())]
    # capitalised words away from sentence starts: evidence that a word is a name
    mid_caps: set[str] = set()
    for w in words:
        if w[0][0].isupper() and not _at_sentence_start(text, w.start()):
            mid_caps.add(w[0].rstrip("'-").removesuffix("'s").casefold())
    lowered = {w[0].casefold() for w in words if not w[0][0].isupper()}

    def is_cap(m: re.Match[str]) -> bool:
        return m[0][0].isupper() and len(m[0].rstrip("'-")) > 1

    out: list[tuple[int, int, str]] = []
    i = 0
    while i < len(words):
        if not is_cap(words[i]):
            i += 1
            continue
        run = [words[i]]
        j = i + 1
        while j < len(words):
            gap = text[run[-1].end():words[j].start()]
            if gap != " ":
                break
            if is_cap(words[j]):
                run.append(words[j])
                j += 1
                continue
            # connectors ("Bank of America") only when a capitalised word follows
            k = j
            while (k < len(words) and words[k][0] in _CONNECTORS and k - j < 2
                   and text[words[k - 1].end():words[k].start()] == " "):
                k += 1
            if k < len(words) and k > j and is_cap(words[k]) \
                    and text[words[k - 1].end():words[k].start()] == " ":
                run.extend(words[j:k + 1])
                j = k + 1
                continue
            break
        i = j
        at_start = _at_sentence_start(text, run[0].start())
        parts = [w[0].rstrip("'-") for w in run]
        parts[-1] = parts[-1].removesuffix("'s")
        # Edge words that are not part of the name: any common word at a sentence start
        # ("Thanks Caroline"), only stopwords/connectors elsewhere ("the Beatles").
        lead = _LEAD_AT_START if at_start else _EDGE
        start_idx, end_idx = 0, len(parts)
        while start_idx < end_idx and parts[start_idx].casefold() in lead:
            start_idx += 1
        while end_idx > start_idx and parts[end_idx - 1].casefold() in _EDGE:
            end_idx -= 1
        kept = parts[start_idx:end_idx]
        if not kept or (len(kept) == 1 and kept[0].casefold() in _COMMON):
            continue
        if at_start and start_idx == 0 and len(kept) == 1:
            word = kept[0].casefold()
            looks_common = (word in lowered or word.endswith(("ly", "ing", "ed"))
                            or kept[0].isupper() and len(word) <= 3)
            if looks_common and word not in mid_caps:
                continue
        first, last = run[start_idx], run[end_idx - 1]
        out.append((first.start(), last.end(), " ".join(kept)))
    return out


def _canon(value: str) -> str:
    return " ".join(normalize(value).split()).strip(" '\"").rstrip("-.,;:")


def entities(text: str, limit: int = 16) -> list[str]:
    """Cheap rule-based entities, casefolded, deduplicated, in order of first appearance.

    Pattern entities (URLs, e-mails, @handles, #tags, dates as ISO, paths, files, error codes,
    versions, money and numbers with units, code identifiers) claim their span first; quoted
    strings are added on top; capitalised names fill the rest. At most `limit` are returned.
    """
    text = unicodedata.normalize("NFKC", text).translate(_CHARMAP)
    found: list[tuple[int, int, str]] = []
    spans: list[tuple[int, int]] = []
    for s, e, v in _structural(text):
        j = bisect.bisect_left(spans, (s, e))
        if (j > 0 and spans[j - 1][1] > s) or (j < len(spans) and spans[j][0] < e):
            continue  # overlaps a span an earlier (more specific) pattern claimed
        spans.insert(j, (s, e))
        found.append((s, len(found), v))
    for rx in _QUOTES:
        for m in rx.finditer(text):
            found.append((m.start(), len(found), m[1]))
    for s, _e, v in _names(text, spans):
        found.append((s, len(found), v))
    out: list[str] = []
    seen: set[str] = set()
    for _s, _n, v in sorted(found):
        key = _canon(v)
        if len(key) > 1 and key not in seen:
            seen.add(key)
            out.append(key)
    return out[:limit]


# --------------------------------------------------------------------------------------------
# Digests
# --------------------------------------------------------------------------------------------


def digest(text: str) -> str:
    """Exact digest: sha256 of the NFC-normalised text (byte-identical replays collide)."""
    return hashlib.sha256(unicodedata.normalize("NFC", text).encode("utf-8")).hexdigest()


def semantic_key(text: str) -> str:
    """Cheap semantic digest: texts differing only in stopwords, case, order or punctuation
    collide.

    A negation marker is part of the key, so "I like sushi" and "I don't like sushi" differ;
    a text made only of stopwords falls back to its full token set ("yes" != "no").
    """
    raw = _raw_tokens(text)
    terms = set(_content_tokens(text))
    if not terms:
        terms = {_stem_token(t) for t in raw}
    elif not _NEGATIONS.isdisjoint(raw):
        terms.add("\u00acneg")
    return hashlib.sha256(" ".join(sorted(terms)).encode("utf-8")).hexdigest()
