"""Instruction-like memory detector for the safety gate (G-03): a documented rule set, no model.

A recalled memory is reference material. Text that would read as a *new instruction* once it is
pasted into the agent's next request is suppressed: prompt injection (override the instructions
in force, pose as a system turn, exfiltrate secrets, force a tool or a shell command, hide text
from the human reader) and stale orders (standing commands aimed at the assistant that were
issued in some past session and no longer hold).

Policy for quoted and reported speech (the hard part):

* A *mention* passes: the phrase-level rules (override, persona, standing order, prompt
  extraction, tool forcing) ignore a hit that sits inside quotation marks, where the quoted text
  is the bare phrase (no follow-on order such as "... and send the key"), and the same line
  frames it as discussion ("attack", "example", "phrase", "regex", "talked about", ...).
  `We talked about how 'ignore previous instructions' attacks work` passes.
* Everything else is treated as *use*: unquoted reported speech ("the page told the model to
  ignore previous instructions") is flagged, and so is a quoted phrase that carries a payload.
  A model reading the memory cannot tell reported speech from a command reliably, and a missed
  memory costs less than an obeyed one, so the gate errs towards suppression.
* Structural rules never accept a mention: chat-template tokens, fake tool-call markup, hidden
  markup, encoded payloads, invisible characters and exfiltration to a concrete destination act
  on parsers and tokenisers whatever quotes surround them.

Text is normalised first (NFKC, invisible characters removed but recorded, mixed-script
homoglyphs mapped to Latin, whitespace folded, casefolded); a second de-obfuscated view (leet
digits, s p a c e d letters, hyphen-chains) is tried by the phrase rules. Everything here is
pure and deterministic; all patterns are compiled at import, and module state is immutable.

Speed: about a hundred regexes cannot each scan every memory. At import, each pattern's parse
tree yields an anchor (the words or literals every match starts with) and a gate (literals every
match contains). Per text, one tokenisation gives the set of anchors present; a pattern runs
only if its anchor occurs, and then only `match()`es at those positions. This is exactly
equivalent to `finditer` (checked against plain scans on 50k real chat turns), and keeps a 1 KB
text at roughly 0.1-0.6 ms of CPU.
"""

from __future__ import annotations

import base64
import binascii
import re
import unicodedata
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

__all__ = ["RULES", "InjectionVerdict", "NormalisedText", "Rule", "detect_injection",
           "normalise", "rules_markdown"]

try:  # the regex parser is private; without it rules run ungated (slower, same verdicts)
    from re import _constants as _sre_c
    from re import _parser as _sre_parse
except ImportError:  # pragma: no cover
    _sre_c = _sre_parse = None  # type: ignore[assignment]

_F = re.MULTILINE  # rules read casefolded text, so no IGNORECASE (3x slower on Unicode)


def _rx(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern, _F)


def _is_space_class(op: object, av: object) -> bool:
    space = [(_sre_c.CATEGORY, _sre_c.CATEGORY_SPACE)]
    return op is _sre_c.IN and list(av) == space  # type: ignore[call-overload]


def _pure_literal(seq: object) -> str | None:
    chars = []
    for op, av in seq:  # type: ignore[attr-defined]
        if op is not _sre_c.LITERAL:
            return None
        chars.append(" " if av == 10 else chr(av))
    return "".join(chars)


_BOUND = "\x03"  # marks a literal end that the pattern puts at a word boundary
_AT_START = ("AT_BEGINNING", "AT_BEGINNING_LINE", "AT_BEGINNING_STRING", "AT_BOUNDARY")


def _requirements(items: object, left: bool = False, right: bool = False) -> list[frozenset[str]]:
    r"""Sets of literals; every match of the parsed sequence contains one literal of each set.

    Literals are spelled with newline as space: gates are tested on a newline-flattened copy
    of a whitespace-folded view (no runs of whitespace), where `\s+` is exactly one space.
    A leading/trailing _BOUND says that end of the literal sits at a word boundary.
    """
    seq = list(items)  # type: ignore[call-overload]
    found: list[frozenset[str]] = []
    run: list[str] = []
    bound = left  # is the position before the next literal a word boundary?

    def flush(end_bound: bool) -> None:
        if run:
            found.append(frozenset({"".join(run) + (_BOUND if end_bound else "")}))
            run.clear()

    for k, (op, av) in enumerate(seq):
        nxt = seq[k + 1:k + 2]
        after = _word_follows(nxt) if nxt else right
        if op is _sre_c.LITERAL:
            if not run and bound:
                run.append(_BOUND)
            run.append(" " if av == 10 else chr(av))
            bound = False
            continue
        if op is _sre_c.MAX_REPEAT and av[0] >= 1 and len(av[2]) == 1 \
                and _is_space_class(*av[2][0]):
            run.append(" ")  # the views are whitespace-folded: `\s+` is exactly one char
            bound = False
            continue
        if op is _sre_c.AT:
            flush(str(av) in ("AT_BOUNDARY", "AT_END", "AT_END_LINE", "AT_END_STRING"))
            bound = str(av) in _AT_START
            continue
        if op is _sre_c.BRANCH:
            lits = [_pure_literal(b) for b in av[1]]
            if run and all(lits):
                found.append(frozenset("".join(run) + x for x in lits))  # type: ignore[operator]
                run.clear()
            else:
                flush(False)
                parts = [_best(b, bound, after) for b in av[1]]
                if all(parts):
                    found.append(frozenset().union(*parts))  # type: ignore[arg-type]
            bound = False
            continue
        flush(_word_follows([(op, av)]))
        if op is _sre_c.SUBPATTERN:
            found.extend(_requirements(av[-1], bound, after))
        elif op in (_sre_c.MAX_REPEAT, _sre_c.MIN_REPEAT, _sre_c.POSSESSIVE_REPEAT) and av[0] >= 1:
            # with several iterations, the first has our left context, the last our right one
            found.extend(_requirements(av[2], bound, after and av[1] == 1))
        bound = False
    flush(right)
    return found


def _best(items: object, left: bool = False, right: bool = False) -> frozenset[str] | None:
    reqs = _requirements(items, left, right)
    return max(reqs, key=lambda r: (min(map(len, r)), -len(r))) if reqs else None


def _probe(lit: str) -> str:
    """The cheapest sound test for one gate literal: a whole word, a word prefix, or a substring.

    Probes are tagged strings: "w:" space-separated words that must all be in the view's word
    set, "p:" some word starts with it, "s:" plain substring of the flattened view.
    """
    lb, rb = lit.startswith(_BOUND), lit.endswith(_BOUND)
    core = lit.strip(_BOUND)
    whole: list[str] = []
    prefix = ""
    for m in _WORD.finditer(core):
        left_ok = m.start() > 0 or lb
        right_ok = m.end() < len(core) or rb
        if left_ok and right_ok:
            whole.append(m.group())
        elif left_ok and len(m.group()) > len(prefix):
            prefix = m.group()
    if whole and max(map(len, whole)) >= 2:
        return "w:" + " ".join(sorted(set(whole)))
    if len(prefix) >= 3:
        return "p:" + prefix
    return "s:" + core


def _useful(probe: str) -> bool:
    """Whitespace or a single common character is no filter at all."""
    arg = probe[2:].strip()
    return len(arg) >= 2 or (len(arg) == 1 and arg in "@#<[|`{")


_COMMON_WORDS = frozenset("""
a an the you your i we it is are be to of in on for and or not do if when this that all any
please now then just also my our with as at by from
""".split())
_Gate = tuple[frozenset[str], ...] | None  # sets of probes; each set needs one hit


def _gate(p: re.Pattern[str]) -> _Gate:
    """Literal sets that must all be hit for `p` to match; None means always run it."""
    if _sre_parse is None or p.flags & re.IGNORECASE:
        return None
    try:
        reqs = _requirements(_sre_parse.parse(p.pattern, p.flags))
    except Exception:  # a gate is an optimisation, never a verdict
        return None
    # Rare, small sets first: rejecting a set costs one substring test per literal in it, and
    # a set holding a very common word ("the", "you") almost never rejects.
    probes = {frozenset(_probe(lit) for lit in r) for r in reqs}

    def cost(r: frozenset[str]) -> tuple[bool, int, int]:
        # A set with a frequent word rarely rejects; otherwise fewer substring tests first
        # (word probes are set lookups, non-ASCII probes are free on ASCII text).
        common = any(pr[0] == "w" and all(w in _COMMON_WORDS for w in pr[2:].split()) for pr in r)
        return (common, sum(pr[0] != "w" and pr[2:].isascii() for pr in r), len(r))

    useful = {r for r in probes if all(_useful(pr) for pr in r)}
    return tuple(sorted(useful, key=cost)[:3]) or None


_ZERO_WIDTH_OPS = (_sre_c.AT, _sre_c.ASSERT, _sre_c.ASSERT_NOT) if _sre_parse else ()
_WORD = re.compile(r"\w+")
_IS_WORD = re.compile(r"\w").match  # _IS_WORD(text, i): is text[i] a word character?
_ASCII_NON_WORD = str.maketrans({c: " " for c in map(chr, range(128)) if not _WORD.match(c)})
_PREFIX_TAG, _LITERAL_TAG = "\x01", "\x02"  # never inside a \w+ word


@dataclass(frozen=True)
class _Lead:
    """Where matches can start: a whole word, the start of a word, or any literal occurrence."""

    words: frozenset[str]
    prefixes: frozenset[str]  # a word starts with one of these
    literals: frozenset[str]  # occurs anywhere (no word boundary before it)
    keys: frozenset[str] = field(init=False)  # all three, tagged, for one set test per view

    def __post_init__(self) -> None:
        keys = self.words | {_PREFIX_TAG + p for p in self.prefixes}
        object.__setattr__(self, "keys", keys | {_LITERAL_TAG + lit for lit in self.literals})


def _non_word_class(av: object) -> bool:
    """A character class of non-word literals and whitespace only."""
    return all((o is _sre_c.LITERAL and not _WORD.match(chr(a)))  # type: ignore[arg-type]
               or (o is _sre_c.CATEGORY and a is _sre_c.CATEGORY_SPACE)
               for o, a in av)  # type: ignore[attr-defined]


def _word_follows(nxt: list[tuple[object, object]]) -> bool:
    """True if what follows a literal forces a non-word character (or a boundary) there."""
    k = 0
    while k < len(nxt):  # an optional run of spaces: look at what comes after it as well
        op, av = nxt[k]
        if op is _sre_c.MAX_REPEAT and av[0] == 0 and len(av[2]) == 1 \
                and _is_space_class(*av[2][0]):  # type: ignore[index]
            k += 1
            continue
        break
    if k >= len(nxt):
        return False
    op, av = nxt[k]
    if op is _sre_c.AT:
        return av is _sre_c.AT_BOUNDARY
    if op is _sre_c.LITERAL:
        return not _WORD.match(chr(av))  # type: ignore[arg-type]
    if op is _sre_c.IN:
        return _non_word_class(av)
    if op is _sre_c.MAX_REPEAT and av[0] >= 1 and len(av[2]) == 1:  # type: ignore[index]
        inner_op, inner_av = av[2][0]  # type: ignore[index]
        return inner_op is _sre_c.IN and _non_word_class(inner_av)
    if op is _sre_c.BRANCH:
        return all(_word_follows(list(alt) + nxt[k + 1:]) for alt in av[1])  # type: ignore
    if op is _sre_c.SUBPATTERN:
        return _word_follows(list(av[-1]) + nxt[k + 1:])  # type: ignore[index]
    return False


def _classify(lit: str, bounded: bool, nxt: list[tuple[object, object]]) -> tuple[str, str]:
    word = _WORD.match(lit)
    if bounded and word and (len(word.group()) < len(lit) or _word_follows(nxt)):
        return (word.group(), "word")
    return (lit, "prefix" if bounded and word else "literal")


def _lead_of(seq: list[tuple[object, object]], bounded: bool,
             after: list[tuple[object, object]]) -> list[tuple[str, str]] | None:
    """Literals one of which every match of seq (+ after) starts with: (literal, kind)."""
    i = 0
    while i < len(seq) and seq[i][0] in _ZERO_WIDTH_OPS:
        bounded = bounded or seq[i] == (_sre_c.AT, _sre_c.AT_BOUNDARY)
        i += 1
    if i >= len(seq):
        return None
    op, av = seq[i]
    if op is _sre_c.LITERAL:
        j = i
        while j < len(seq) and seq[j][0] is _sre_c.LITERAL:
            j += 1
        lit = "".join(chr(c) for _, c in seq[i:j])  # type: ignore[arg-type]
        # Expand small word families ("instructions?", "memor(?:y|ies)", "summari[sz]e") so
        # the anchor is a whole word (a set lookup) rather than a prefix (a substring search).
        lits = [lit]
        cont, j = seq[j:] + after, 0  # the family may continue past the end of a branch
        while bounded and _WORD.fullmatch(lit) and j < len(cont) and len(lits) <= 16:
            nop, nav = cont[j]
            if nop is _sre_c.LITERAL:
                tails = [chr(nav)]  # type: ignore[arg-type]
            elif nop is _sre_c.BRANCH:
                tails = [_pure_literal(b) for b in nav[1]]  # type: ignore[index,misc]
            elif nop is _sre_c.IN and all(o is _sre_c.LITERAL for o, _ in nav):  # type: ignore
                tails = [chr(c) for _, c in nav]  # type: ignore[misc]
            elif nop is _sre_c.MAX_REPEAT and nav[:2] == (0, 1):  # type: ignore[index]
                tails = ["", _pure_literal(nav[2])]  # type: ignore[index,list-item]
            else:
                break
            if not all(x is not None for x in tails):
                break
            lits = [x + y for x in lits for y in tails]  # type: ignore[operator]
            j += 1
        if bounded and j < len(cont) and cont[j][0] is _sre_c.BRANCH \
                and all(_WORD.fullmatch(x) for x in lits):
            # the parser factors shared prefixes out ("dan|do" -> "d" + (an|o)): recurse
            combined: list[tuple[str, str]] = []
            for alt in cont[j][1][1]:  # type: ignore[index]
                sub = _lead_of(list(alt), True, cont[j + 1:])
                if sub is None:
                    combined = []
                    break
                combined += [(x + lit2, kind if kind != "literal" else "prefix")
                             for x in lits for lit2, kind in sub]
            if combined:
                return combined
        return [_classify(x, bounded, cont[j:]) for x in lits]
    if op is _sre_c.BRANCH:
        out: list[tuple[str, str]] = []
        for alt in av[1]:  # type: ignore[index]
            got = _lead_of(list(alt), bounded, seq[i + 1:] + after)
            if got is None:
                return None
            out += got
        return out
    if op is _sre_c.SUBPATTERN:
        return _lead_of(list(av[-1]), bounded, seq[i + 1:] + after)  # type: ignore[index]
    return None


def _lead(p: re.Pattern[str]) -> _Lead | None:
    """Where matches can start: token lookups for whole words, str.find for other literals."""
    if _sre_parse is None or p.flags & re.IGNORECASE:
        return None
    try:
        got = _lead_of(list(_sre_parse.parse(p.pattern, p.flags)), False, [])
    except Exception:  # an anchor is an optimisation, never a verdict
        return None
    if not got or any(len(lit) < 2 and kind != "word" for lit, kind in got):
        return None
    return _Lead(*(frozenset(lit for lit, k in got if k == kind)
                   for kind in ("word", "prefix", "literal")))


class _View:
    """One text view plus lazily built lookups; made per call, never shared between calls."""

    __slots__ = ("text", "_flat", "_seen", "_words", "_found", "_ascii", "_present")

    def __init__(self, text: str) -> None:
        self.text = text
        self._flat: str | None = None
        self._seen: dict[str, bool] = {}
        self._words: frozenset[str] | None = None
        self._ascii = text.isascii()
        self._present: frozenset[str] | None = None
        self._found: dict[str, list[int]] = {}

    @property
    def flat(self) -> str:
        if self._flat is None:
            self._flat = self.text.replace("\n", " ")  # same length: positions carry over
        return self._flat

    def gate_ok(self, gate: _Gate) -> bool:
        """True if every probe set of the gate has a hit in the text."""
        if gate is None:
            return True
        seen = self._seen
        for group in gate:
            for probe in group:
                hit = seen.get(probe)
                if hit is None:
                    kind, arg = probe[0], probe[2:]
                    if kind == "w":
                        hit = arg in self.words if " " not in arg else \
                            self.words.issuperset(arg.split(" "))
                    else:  # a word prefix or a plain substring: both need the substring
                        hit = self.has(arg)
                    seen[probe] = hit
                if hit:
                    break
            else:
                return False
        return True

    @property
    def words(self) -> frozenset[str]:
        """The \\w+ tokens of the view (ASCII text: a translate/split that is 3x faster)."""
        if self._words is None:
            flat = self.flat
            self._words = frozenset(flat.translate(_ASCII_NON_WORD).split() if self._ascii
                                    else _WORD.findall(flat))
        return self._words

    def has(self, lit: str) -> bool:
        hit = self._seen.get(lit)
        if hit is None:
            hit = self._seen[lit] = (not self._ascii or lit.isascii()) and lit in self.flat
        return hit

    @property
    def present(self) -> frozenset[str]:
        """The anchor keys (of every pattern in the module) that occur in this view."""
        if self._present is None:
            found = set(self.words & _ANCHORS.words)
            flat = self.flat
            for key, members in (_SUB_GROUPS_ASCII if self._ascii else _SUB_GROUPS):
                if key in flat:
                    for tag, lit in members:
                        if lit in flat:
                            found.add(tag)
            self._present = frozenset(found)
        return self._present

    def _occurrences(self, lit: str, kind: str) -> list[int]:
        key = kind + ":" + lit
        found = self._found.get(key)
        if found is None:
            found, flat, n = [], self.flat, len(lit)
            i = flat.find(lit)
            while i >= 0:
                if kind == "literal" or (
                        (i == 0 or not _IS_WORD(flat, i - 1))
                        and (kind == "prefix" or not _IS_WORD(flat, i + n))):
                    found.append(i)
                i = flat.find(lit, i + 1)
            self._found[key] = found
        return found

    def starts(self, lead: _Lead) -> list[int]:
        """Sorted positions where a match anchored on `lead` may start."""
        out: list[int] = []
        words = self.words
        for w in lead.words:
            if w in words:
                out += self._occurrences(w, "word")
        for p in lead.prefixes:
            if self.has(p):
                out += self._occurrences(p, "prefix")
        for lit in lead.literals:
            out += self._occurrences(lit, "literal")
        return sorted(set(out)) if out else out


_CTX_WINDOW = 160  # how far back an imperative's leads ("please, you must now ...") may reach


@dataclass(frozen=True)
class _Pat:
    r"""A compiled regex plus the gate and anchor derived from it (pure optimisations).

    `ctx`, for imperative patterns, must match just before the start (`\Z` at the start).
    Build every _Pat at module level: View.present only knows the anchors of those.
    """

    rx: re.Pattern[str]
    gate: _Gate
    lead: _Lead | None
    ctx: re.Pattern[str] | None = None
    keys: frozenset[str] | None = field(init=False)  # anchor keys, tested against View.present
    common_lead: bool = field(init=False)  # the anchor is a very frequent word: gate it too

    def __post_init__(self) -> None:
        object.__setattr__(self, "keys", self.lead.keys if self.lead is not None else None)
        common = self.lead is not None and not self.lead.words.isdisjoint(_COMMON_WORDS)
        object.__setattr__(self, "common_lead", common)

    @property
    def pattern(self) -> str:
        return self.rx.pattern

    def possible(self, view: _View) -> bool:
        """Cheap necessary condition: the anchor and the gate literals occur."""
        if self.keys is None:
            return view.gate_ok(self.gate)
        # Every _Pat is built at import, so _ANCHORS (and View.present) covers its keys.
        if self.keys.isdisjoint(view.present):
            return False
        return not self.common_lead or view.gate_ok(self.gate)

    def finditer(self, view: _View) -> Iterator[re.Match[str]]:
        return self.scan(view) if self.possible(view) else iter(())

    def scan(self, view: _View) -> Iterator[re.Match[str]]:
        """All matches, assuming `possible(view)` already held."""
        text, ctx = view.text, self.ctx
        if self.lead is None:
            for m in self.rx.finditer(text):
                if ctx is None or ctx.search(text, max(0, m.start() - _CTX_WINDOW), m.start()):
                    yield m
            return
        end = 0
        for pos in view.starts(self.lead):
            if pos < end:
                continue
            m = self.rx.match(text, pos)
            if m and (ctx is None or ctx.search(text, max(0, pos - _CTX_WINDOW), pos)):
                yield m
                end = max(m.end(), pos + 1)

    def search(self, view: _View) -> re.Match[str] | None:
        return next(self.finditer(view), None)


def _pat(pattern: str, ctx: str | None = None) -> _Pat:
    """Compile a rule pattern; `ctx` (if any) must match right before the match start."""
    rx = _rx(pattern)
    return _Pat(rx, _gate(rx), _lead(rx), _rx(ctx + r"\Z") if ctx is not None else None)


def _pats(*items: str | _Pat) -> tuple[_Pat, ...]:
    return tuple(p if isinstance(p, _Pat) else _pat(p) for p in items)


@dataclass(frozen=True)
class _AnyOf:
    """Alternatives kept as separately anchored patterns: one big alternation cannot be."""

    parts: tuple[_Pat, ...]

    @classmethod
    def of(cls, *patterns: str) -> _AnyOf:
        return cls(tuple(_pat(p) for p in patterns))

    def search(self, view: _View) -> re.Match[str] | None:
        for part in self.parts:
            if m := part.search(view):
                return m
        return None


# --------------------------------------------------------------------------- normalisation

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

# Words that a zero-width character is used to smuggle past keyword filters.
_TRIGGER_WORDS = frozenset("""
ignore disregard forget previous prior above instructions instruction system prompt assistant
override execute run delete remove send password passwords secret secrets token tokens apikey
reveal jailbreak admin export contacts transfer email upload credentials developer bypass
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


def normalise(text: str) -> NormalisedText:
    """Build the matching views; hidden-text tricks are recorded, not silently dropped."""
    t = unicodedata.normalize("NFKC", text)
    if t.isascii():  # the common case: no invisible, tag, selector or homoglyph to handle
        return _views(t, (), None, ())
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
    return _views(t, tuple(payloads), repr(run.group(0)) if run else None, split)


def _views(t: str, payloads: tuple[str, ...], run: str | None,
           split: tuple[str, ...]) -> NormalisedText:
    raw = _fold_ws(t)
    folded = _fold_quotes(raw.casefold())
    return NormalisedText(raw, folded, _deobfuscate(t, folded), payloads, run, split)


def _deobfuscate(t: str, folded: str) -> str:
    """Undo s p a c i n g, l33t digits and hyphen-chains, but only where that yields words the
    phrase rules look for: elsewhere ("2nd", "state-of-the-art") the view stays as folded."""
    vocab = _DEOBF_VOCAB
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


# --------------------------------------------------------------------------- shared fragments

_PRIOR = (r"(?:previous|prior|above|earlier|preceding|foregoing|former|original|initial|old|"
          r"existing|current|system|developer|default|given|above-mentioned)")
_INSTR = (r"(?:instructions?|prompts?|directives?|rules|guidelines?|guidance|guardrails?|"
          r"constraints?|context|commands?|orders|programming|polic(?:y|ies)|restrictions?|"
          r"training|conditioning)")
_DET = r"(?:(?:all|any|every|each|the|your|my|these|those|of|its|all\s+of)\s+)"
_OVERRIDE_VERB = (r"(?:ignore|disregard|forget|override|bypass|skip|drop|discard|abandon|neglect|"
                  r"dismiss|overlook|erase|delete|remove|clear|cancel|void|nullify|suspend|"
                  r"circumvent|set\s+aside|put\s+aside|throw\s+out)")
# Where an imperative verb may stand: start of a line/clause, after a conjunction, or after
# leads that address the assistant ("please", "you must", "the agent should", "AI:").
_START = r"(?:^|(?<=[.!?;:,\n(\[\"'`>*\-])|\b(?:and|then|&&)\b)\s*"
_LEAD = (r"(?:(?:please|kindly|now|just|immediately|quickly|quietly|silently|secretly|first|"
         r"next|then|also|finally|simply|go\s+ahead\s+and|proceed\s+to|make\s+sure\s+(?:to|you)|"
         r"be\s+sure\s+to|remember\s+to|don'?t\s+forget\s+to|you\s+(?:must|should|need\s+to|"
         r"have\s+to|will|are\s+to|shall)|i\s+(?:need|want)\s+you\s+to|"
         r"(?:the\s+)?(?:agent|assistant|ai|model|bot|llm|copilot)s?\s+(?:must|should|"
         r"needs?\s+to|has\s+to|will|shall|is\s+to)|(?:hey\s+|dear\s+)?(?:ai|assistant|agent|"
         r"bot|model|llm|copilot|chatgpt|gpt|claude)\s*[:,])\s+)*")
_ADDRESSED = (r"\b(?:authori[sz]ed|asked|wants?|needs?|told|instructed|allowed|permitted|"
              r"requires?|expects?)\s+you\s+to\s+")


_IMP_CTX = rf"(?:{_START}{_LEAD}|{_ADDRESSED})"


def _imp(verbs: str, tail: str = "", ctx: str = _IMP_CTX) -> _Pat:
    """One of `verbs` (+ tail) in imperative position or addressed to 'you'.

    Anchored on the verb; the imperative context is checked just before it.
    """
    return _pat(rf"\b(?:{verbs})\b{tail}", ctx)


_CLAUSE_START = r"(?:^|(?<=[.!?;(\[\"'/#*\-])\s*)"
_SENTENCE_SPLIT = re.compile(r"(?<=[.!?])\s+|\n+|;\s+")

_QUOTES = {'"': '"', "'": "'", "\u201c": "\u201d", "\u2018": "\u2019", "\u00ab": "\u00bb",
           "\u201e": "\u201c", "`": "`", "\u300c": "\u300d", "\u300e": "\u300f",
           "\u2039": "\u203a"}
_META = _rx(
    r"\b(?:talk(?:ed|ing|s)?|discuss(?:ed|es|ing|ion)?|explain(?:ed|s|ing)?|attacks?|"
    r"injections?|jailbreaks?|exploits?|payloads?|phrases?|strings?|patterns?|examples?|"
    r"e\.g\.|classic|known|memes?|jok(?:e|es|ed|ing)|tricks?|techniques?|filters?|detectors?|"
    r"regex(?:es)?|tests?|test\s+cases?|slides?|blog|paper|articles?|lectures?|course|"
    r"workshop|demo|red[- ]team|ctf|heuristics?|signatures?|blocklist|denylist|classifiers?|"
    r"such\s+as|like|called|named|phrasing|wording|subject|headline|title|quot(?:e|es|ed)|"
    r"mention(?:s|ed)?|matches|flag(?:s|ged)?)\b")
_CONTINUATION = re.compile(r"\b(?:and|then|but)\b|[,;:&]")


def _is_mention(text: str, start: int, end: int) -> bool:
    """True when text[start:end] is a bare quoted phrase inside a discussion frame."""
    for i in range(start - 1, max(-1, start - 14), -1):
        ch = text[i]
        if ch in "\n":
            return False
        if ch not in _QUOTES:
            continue
        if ch in "'`" and i > 0 and text[i - 1].isalnum():
            continue  # an apostrophe, not an opening quote
        close = _QUOTES[ch]
        j = text.find(close, end)
        if j < 0 or j - end > 16 or "\n" in text[end:j]:
            continue
        if close in "'`" and j + 1 < len(text) and text[j + 1].isalnum():
            continue
        extra = text[i + 1:start] + " " + text[end:j]
        if len(_TOKEN.findall(extra)) > 2 or _CONTINUATION.search(extra):
            return False
        line_start = text.rfind("\n", 0, i) + 1
        line_end = text.find("\n", j)
        line_end = len(text) if line_end < 0 else line_end
        frame = text[line_start:i] + " " + text[j + 1:line_end]
        return bool(_META.search(frame))
    return False


# --------------------------------------------------------------------------- rule type


@dataclass(frozen=True)
class Rule:
    """One documented rule: regexes and/or a small predicate returning the evidence span."""

    rule_id: str
    name: str
    rationale: str
    patterns: tuple[_Pat, ...] = ()
    predicate: Callable[[NormalisedText, _View], str | None] | None = None
    mention_ok: bool = False  # a bare quoted phrase in a discussion frame passes
    deobfuscate: bool = False  # also try the de-obfuscated view

    def match(self, t: NormalisedText, view: _View | None = None,
              deobf: _View | None = None) -> str | None:
        """The evidence span if the rule fires on `t`, else None."""
        view = view or _View(t.folded)
        views = [view]
        if self.deobfuscate and t.deobf != t.folded:
            views.append(deobf or _View(t.deobf))
        for v in views:
            present = v.present
            for p in self.patterns:
                keys = p.keys
                if keys is not None:
                    if keys.isdisjoint(present) or (p.common_lead and not v.gate_ok(p.gate)):
                        continue
                elif not v.gate_ok(p.gate):
                    continue
                for m in p.scan(v):
                    if self.mention_ok and _is_mention(v.text, m.start(), m.end()):
                        continue
                    return m.group(0)
        if self.predicate is not None:
            return self.predicate(t, view)
        return None


# --------------------------------------------------------------------------- INJ-01 / 02

_OVERRIDE_EN = _pats(
    rf"\b{_OVERRIDE_VERB}\s+{_DET}{{0,3}}{_PRIOR}\s+(?:\w+\s+)?{_INSTR}\b",
    rf"\b(?:ignore|disregard|forget|override|bypass|discard|abandon|set\s+aside)\s+"
    rf"(?:all\s+|any\s+)?(?:of\s+)?your\s+(?:\w+\s+)?{_INSTR}\b",
    r"\b(?:ignore|disregard|forget|bypass)\s+(?:all|any)\s+(?:(?:the|of\s+the|other|your)\s+)?"
    r"(?:instructions|rules|guidelines|restrictions|constraints|policies|directives)\b",
    rf"\b(?:ignore|disregard|forget|set\s+aside)\s+(?:the|any|all)\s+{_INSTR}\s+"
    r"(?:(?:that\s+)?you\s+(?:were|have\s+been|'ve\s+been|got|received)|(?:given|provided)\s+"
    r"(?:to\s+)?you|above|below|before|so\s+far|in\s+the\s+system\s+prompt)",
    r"\b(?:ignore|disregard|forget|set\s+aside|put\s+aside)\s+(?:everything|all|anything|"
    r"whatever)\s+(?:(?:that\s+)?(?:you\s+(?:were|have\s+been|'ve\s+been)\s+(?:told|given|"
    r"instructed)|(?:was\s+)?(?:said|written|stated))\s+)?(?:above|before|earlier|previously|"
    r"prior|so\s+far|until\s+now|up\s+to\s+now)\b",
    r"\b(?:ignore|disregard)\s+(?:all\s+of\s+|everything\s+)?the\s+above(?=\s+and\b|\s*[,.;:!]|$)",
    rf"\b(?:pay\s+no\s+attention\s+to|do\s+not\s+follow|don't\s+follow|stop\s+following|"
    rf"no\s+longer\s+(?:follow|obey|adhere\s+to))\s+{_DET}{{0,2}}(?:your\s+|{_PRIOR}\s+)"
    rf"(?:\w+\s+)?{_INSTR}\b",
    rf"\b(?:previous|prior|above|earlier|original|old|all\s+(?:earlier|prior|previous))\s+"
    rf"{_INSTR}\s+(?:are|is|were|have\s+been)\s+(?:now\s+)?(?:void|null|cancell?ed|revoked|"
    r"obsolete|invalid|superseded|overridden|lifted|suspended|disabled|no\s+longer\s+"
    r"(?:valid|in\s+effect|apply))",
    rf"\b(?:previous|prior|earlier|above|old)\s+{_INSTR}\s+(?:do\s+not|don't|no\s+longer)\s+apply",
    rf"\b(?:supersedes?|overrides?|replaces?|takes?\s+precedence\s+over|trumps?)\s+"
    rf"{_DET}{{0,2}}(?:other\s+|{_PRIOR}\s+){_INSTR}\b",
    r"\breset\s+(?:your|all)\s+(?:instructions|rules|context|memory|programming|guidelines|"
    r"system\s+prompt)",
)

_OVERRIDE_INTL = _pats(
    # German
    r"\b(?:ignorier(?:e|en\s+sie)?|vergiss|vergessen\s+sie|missachte|missachten\s+sie|"
    r"übergehe|überspringe)\s+(?:(?:alle|die|deine|ihre|sämtliche|jegliche|eure)\s+){0,2}"
    r"(?:(?:vorherigen|bisherigen|obigen|vorigen|früheren|vorangegangenen|ursprünglichen|"
    r"alten|vorhergehenden|bestehenden)\s+)?(?:anweisungen|instruktionen|befehle|regeln|"
    r"vorgaben|anordnungen|richtlinien)\b",
    r"\bvergiss\s+alles\s*,?\s*(?:was|bisher|vorher|oben|davor)",
    # French
    r"\b(?:ignore[zr]?|oublie[zr]?|ne\s+tiens\s+pas\s+compte|ne\s+tenez\s+pas\s+compte|"
    r"fais\s+abstraction|faites\s+abstraction)\s+(?:(?:de|d'|des|toutes|tous|les|tes|vos|ces)"
    r"\s*){0,3}(?:(?:instructions|consignes|directives|règles|ordres|commandes|indications)"
    r"\s+(?:précédentes|antérieures|ci-dessus|d'avant|initiales|originales|reçues)|"
    r"(?:précédentes|anciennes)\s+(?:instructions|consignes|directives|règles))",
    r"\b(?:ignore[zr]?|oublie[zr]?)\s+(?:toutes\s+)?(?:tes|vos)\s+(?:instructions|consignes|"
    r"directives|règles)\b",
    r"\boublie[zr]?\s+tout\s+ce\s+qu(?:'|e\s+)(?:on\s+t'a\s+dit|on\s+vous\s+a\s+dit|précède)",
    # Spanish / Portuguese
    r"\b(?:ignora|ignore|ignoren|ignorad|olvida|olvide|olviden|olvidad|omite|omita|descarta|"
    r"descarte|esqueça|esqueca|esquece|desconsidere|haz\s+caso\s+omiso\s+(?:a|de)|hagan\s+caso"
    r"\s+omiso\s+(?:a|de)|no\s+hagas\s+caso\s+(?:a|de))\s+(?:(?:todas|todos|las|los|tus|sus|"
    r"estas|as|os|suas|tuas|de)\s+){0,3}(?:instrucciones|indicaciones|órdenes|ordenes|reglas|"
    r"directrices|normas|consignas|instruções|instrucoes|regras|diretrizes|ordens)\s+"
    r"(?:anteriores|previas|prévias|de\s+arriba|acima|originales|originais|iniciales|iniciais|"
    r"recibidas|dadas)",
    r"\b(?:ignora|olvida|olvide|omite|esqueça)\s+(?:todas\s+)?(?:tus|sus|suas|tuas)\s+"
    r"(?:instrucciones|indicaciones|reglas|instruções|regras)\b",
    r"\bolvida\s+todo\s+lo\s+(?:anterior|que\s+te\s+(?:dijeron|han\s+dicho))",
    # Italian
    r"\b(?:ignora|ignorate|dimentica|dimenticate|trascura)\s+(?:(?:tutte|tutti|le|gli|i|tue|"
    r"sue)\s+){0,3}(?:istruzioni|regole|indicazioni|direttive|ordini)\s+(?:precedenti|"
    r"prima|sopra|originali|iniziali)",
    # Dutch
    r"\b(?:negeer|vergeet)\s+(?:(?:alle|de|je|jouw|uw)\s+){0,2}(?:vorige|eerdere|voorgaande|"
    r"bovenstaande|oorspronkelijke)\s+(?:instructies|regels|opdrachten|aanwijzingen)",
    # Russian
    r"(?:игнорируй|проигнорируй|игнорируйте|забудь|забудьте|не\s+обращай\s+внимания\s+на|"
    r"отбрось|пропусти)\s+(?:(?:все|всё|свои|твои|ваши|эти)\s+){0,2}(?:(?:предыдущие|прошлые|"
    r"прежние|вышеуказанные|предшествующие|изначальные|исходные|старые)\s+)?(?:инструкции|"
    r"указания|правила|команды|распоряжения|установки)",
    # Chinese (simplified and traditional)
    r"(?:忽略|无视|無視|忽视|忽視|忘记|忘記|忘掉|不要理会|不要理會|别管|別管|放弃|放棄|跳过|跳過|"
    r"抛开|拋開)掉?你?(?:之前|以上|上面|先前|前面|此前|所有|一切|上述|原来|原來|原有|原先|全部)"
    r"的?(?:所有|全部|一切)?的?(?:指令|指示|说明|說明|提示|规则|規則|命令|要求|设定|設定|限制|约束|約束)",
    # Japanese
    r"(?:以前|前|上記|これまで|先ほど|今まで)の(?:指示|命令|指令|ルール|設定|プロンプト)"
    r"(?:を|は)?(?:すべて|全て|全部)?(?:無視|忘れ)",
    # Korean
    r"(?:이전|이전의|앞의|위의|기존)\s*(?:모든\s*)?(?:지시|지침|명령|규칙|지시사항|프롬프트)"
    r"(?:을|를|은|는)?\s*(?:모두\s*)?(?:무시|잊어)",
)

# --------------------------------------------------------------------------- INJ-03

_ROLE_CUE = (r"(?:you\b|your\b|ignore|disregard|forget|override|the\s+(?:assistant|ai|model)|"
             r"the\s+user\s+(?:has|is)|assistant|new\s+(?:policy|rule|instruction|task|session)|"
             r"from\s+now|always|never|do\s+not|don't|respond|reply|answer|grant|obey|comply|"
             r"print|reveal|output|call|run|execute|send|all\s+(?:earlier|previous|prior))")
_ROLE_MARKUP = _pats(
    r"<\|(?:im_start|im_end|im_sep|system|user|assistant|endoftext|eot_id|start_header_id|"
    r"end_header_id|begin_of_text|end_of_turn|start_of_turn)\|>",
    r"<(?:start_of_turn|end_of_turn)>|\[/?inst\]|<</?sys>>",
    r"^\s*#{2,6}\s*(?:system|instruction|system\s+prompt|developer|new\s+instructions?)\s*:",
    r"^\s*#{2,6}\s*(?:new|updated|hidden|secret|real)\s+(?:system\s+)?instructions?\b",
    r"</?(?:system|sys|system_prompt|system-prompt|developer|admin|instructions?)>",
    r"\[(?:system|admin|developer)\]\s*\(",
    r"\[(?:system|admin|developer|root)\s+(?:override|note|message|instructions?|prompt|command|"
    r"notice)\]",
    rf"\[(?:system|admin|developer)\]\s*:?\s*{_ROLE_CUE}",
    _pat(rf"\b(?:system|developer|sys(?:tem)?\s+(?:prompt|message|override|"
    rf"notice|note|instruction)s?|admin(?:istrator)?\s+(?:override|note|message|instruction)s?)"
    rf"(?:\s+(?:to|for)\s+(?:the\s+)?(?:model|ai|assistant|llm|agent))?\s*:\s*"
    r"(?![^\n]*\?[\s\"')]*(?:\n|$))"  # a question ("system: have you ...?") is not an order
    rf"(?:\w+\s+){{0,3}}?{_ROLE_CUE}", ctx=r"(?:^|(?<=[.!?\"'>\]}])\s*)"),
    r"\b(?:begin|start|end)\s+(?:of\s+)?(?:the\s+)?(?:system|developer|hidden|secret)\s+"
    r"(?:prompt|message|instructions?)\b",
    r"\b(?:system|admin|root)\s+override\b",
    _pat(r"\b(?:end|close)\s+(?:of\s+)?(?:the\s+)?(?:document|context|user\s+input|input|"
         r"prompt|data|web\s?page|page|file|text|untrusted\s+content)[\s\-=*#\])>]*$"
         r"(?=[\s\S]{0,300}\b(?:instructions?|you|assistant|ai|model)\b)", ctx=r"^[\s\-=*#\[(<]*"),
)
_HUMAN_TURN = _rx(r"^\s*human\s*:\s.{0,400}?\n\s*assistant\s*:")
_ROLE_LABEL_START = _rx(r"\A\s*(?:human|user|assistant|system)\s*:")


def _forged_turns(t: NormalisedText, view: _View) -> str | None:
    """A Human:/Assistant: turn pair embedded after other content forges a conversation."""
    m = _HUMAN_TURN.search(t.folded) if "human" in t.folded else None
    if m and not _ROLE_LABEL_START.match(t.folded):
        return m.group(0)
    return None


# --------------------------------------------------------------------------- INJ-04

_JAILBREAK_ADJ = (r"(?:unfiltered|uncensored|amoral|unrestricted|unaligned|jailbroken|"
                  r"without\s+(?:any\s+)?(?:restrictions|limits|filters|rules|ethics|morals|"
                  r"guidelines|content\s+polic(?:y|ies))|never\s+refuses?|no\s+(?:rules|"
                  r"restrictions|limits|filters|guidelines|ethics|morals|ethical\s+guidelines))")
_PERSONA = _pats(
    r"\byou\s+are\s+(?:now|no\s+longer|henceforth)\s+(?:(?:a|an|the|my|in|called|named)\s+)?"
    r"(?:\w+\s+){0,2}?(?:dan|stan|dude|aim|ai|assistant|model|chatbot|bot|persona|character|"
    r"jailbroken|jailbreak|unrestricted|unfiltered|uncensored|unaligned|unbound|unlimited|evil|"
    r"freed|liberated|developer\s+mode|dev\s+mode|god\s+mode|bound|restricted|chatgpt|gpt)\b",
    r"\b(?:act|behave|respond|answer|roleplay|role-play)\s+(?:as|like)\s+(?:a\s+|an\s+)?"
    r"(?:dan|stan|aim|dude|evil|unrestricted|unfiltered|uncensored|jailbroken|amoral|unethical|"
    r"rogue)\b",
    rf"\b(?:pretend|imagine)\s+(?:that\s+)?(?:you\s+are|you're|to\s+be)\b[^.\n]{{0,80}}?"
    rf"(?:\bevil\b|{_JAILBREAK_ADJ})",
    rf"\b(?:you\s+are|you're|act\s+as|acting\s+as|stay\s+in\s+character\s+as|pretend\s+to\s+be|"
    rf"roleplay\s+as)\b[^.\n]{{0,40}}?\b{_JAILBREAK_ADJ}",
    r"\bdan\b[^.\n]{0,40}\bdo\s+anything\s+now\b|\bdo\s+anything\s+now\b[^.\n]{0,20}\bdan\b|"
    r"\bdan\s+mode\b|\bdeveloper\s+mode\s+(?:enabled|activated)\b|\bdeveloper\s+mode\s*:\s*on\b",
    r"\b(?:enable|enter|activate|switch\s+to|turn\s+on)\s+(?:dan|jailbreak|jailbroken|god|evil|"
    r"unrestricted|unfiltered|uncensored|chaos)\s+mode\b",
    r"\b(?:you|chatgpt|the\s+assistant|the\s+ai|the\s+model)\s+(?:are|is)\s+(?:now\s+)?in\s+"
    r"(?:developer|dan|god|jailbreak|unrestricted|debug|maintenance|admin)\s+mode\b",
    r"\[\W*jailbreak\]|\[\W*classic\]",
    r"\b(?:your|all|the)\s+(?:safety\s+|content\s+|ethical\s+)?(?:restrictions|filters|"
    r"guidelines|guardrails|rules|limits|limitations|safeguards|policies)\s+(?:have\s+been|"
    r"has\s+been|are|were)\s+(?:now\s+)?(?:removed|lifted|disabled|turned\s+off|suspended|"
    r"deactivated|revoked|waived)",
    r"\bsafety\s+(?:filters?|guidelines|guardrails|restrictions|protocols)\s+(?:are\s+|have\s+"
    r"been\s+)?(?:disabled|removed|lifted|suspended|bypassed)\s+(?:for|in|during)\b",
    r"\byou\s+have\s+been\s+(?:freed|jailbroken|liberated|unlocked|released\s+from)",
    r"\b(?:answer|respond|reply)\s+without\s+(?:any\s+)?(?:content\s+polic(?:y|ies)|restrictions|"
    r"filters|censorship|ethical|moral|safety)",
    r"你现在是.{0,10}(?:dan|不受|没有任何限制|无限制)|你現在是.{0,10}(?:dan|不受|沒有任何限制|無限制)|"
    r"(?:开发者|開發者|越狱|越獄)模式",
)

# --------------------------------------------------------------------------- INJ-05

_RESPOND_VERBS = (r"(?:mention|say|tell|reveal|disclose|answer|respond|reply|refer|recommend|"
                  r"suggest|include|use|output|write|sign|end|start|begin|speak|talk|address|"
                  r"call|refuse|obey|follow|comply|ignore|pretend|act|behave|promote|praise|rate|"
                  r"mark|treat|agree|admit|apologi[sz]e|claim|insist|deny)")
_AI_NOUN = (r"(?:ai|llm|language\s+model|chatbot|bot|assistant|agent|model|gpt|chatgpt|claude|"
            r"copilot|summari[sz]er|crawler|screener)")
_STANDING = _pats(
    r"\bfrom\s+now\s+on\b[,:]?\s+(?:you\b|your\b|(?:the\s+)?(?:assistant|ai|model|bot|chatbot|"
    r"agent)\b|(?:please\s+)?(?:always|never|only|respond|reply|answer|speak|talk|write|act|"
    r"behave|pretend|call|address|refer|use|say|end|start|begin|sign|include|add|ignore|treat|"
    r"remember|stop|do\s+not|don't)\b)",
    rf"\byou\s+(?:will|must|shall|are\s+to|are\s+required\s+to|have\s+to)\s+(?:always|never|"
    rf"only|henceforth|from\s+now\s+on)\s+(?:\w+\s+)?{_RESPOND_VERBS}\b",
    r"\b(?:assistant|ai|model|chatbot|bot|agent|llm|gpt|chatgpt|claude|copilot)s?\s+"
    r"(?:must|shall|should|will|has\s+to|is\s+required\s+to|needs\s+to|is\s+to)\s+(?:always|"
    r"never|only|henceforth|from\s+now\s+on)\b",
    r"\b(?:ai|llm|language\s+model|gpt|chatbot)s?\s+(?:agents?|assistants?|models?|systems?|"
    r"tools?)?\s*(?:\w+\s+){0,4}?(?:processing|reading|summari[sz]ing|parsing|seeing|viewing|"
    r"crawling|indexing|reviewing|screening|evaluating)\s+(?:this|these|the\s+following)\b",
    rf"\b(?:notes?|messages?|instructions?|memo|reminder|notice|warning|attention|important|hint)"
    rf"\s+(?:to|for)\s+(?:(?:any|all|the)\s+)?{_AI_NOUN}s?(?:\s+(?:assistants?|agents?|models?|"
    rf"systems?))?\s*[:,\-]",
    rf"\b{_AI_NOUN}\s+(?:instructions?|directives?|orders?|commands?)\s*:",
    r"\battention\s*,?\s*(?:ai|llm|language\s+model|chatbot|model|agent)s?\s*[:,!]",
    r"\bdear\s+(?:ai|llm|language\s+model|chatgpt|gpt|chatbot)\b",
    r"\bif\s+you\s+are\s+(?:an?\s+)?(?:ai|llm|large\s+language\s+model|language\s+model|chatbot|"
    r"automated\s+\w+|gpt|chatgpt|ai\s+\w+)\b",
    _pat(r"\b(?:ai|llm|chatbot|copilot|chatgpt|gpt|language\s+model|"
    r"ai\s+(?:assistant|agent)s?)\s*[,:]\s*(?:please\s+)?(?:ignore|disregard|forget|do\s+not|don't|"
    r"never|always|run|execute|send|delete|remove|commit|push|merge|add|insert|write|reply|"
    r"respond|tell|say|state|include|make|call|use|open|visit|click|recommend|rate|mark|approve|"
    r"forward|output|print|reveal|summari[sz]e|translate|grant|transfer|book|buy)\b",
         ctx=_CLAUSE_START),
    _pat(r"\b(?:assistant|agent)\s*,\s*(?:please\s+|immediately\s+|"
    r"now\s+|when\s+[^,\n]{0,60},\s*)?(?:ignore|disregard|forget|do\b|don't|never|always|run|"
    r"execute|send|delete|remove|state|say|tell|include|forward|approve|reply|respond|output)\b",
         ctx=_CLAUSE_START),
    r"\b(?:do\s+not|don't|dont|never)\s+(?:tell|inform|notify|alert|warn)\s+(?:the\s+)?"
    r"(?:user|customer|human|operator|owner|requester)s?\b",
    r"\b(?:do\s+not|don't|dont|never)\s+let\s+(?:the\s+)?(?:user|customer|human)s?\s+know\b",
    r"\b(?:do\s+not|don't|never)\s+(?:mention|reveal|show)\s+(?:this|it|that)\s+to\s+(?:the\s+)?"
    r"(?:user|customer|human)s?\b",
    r"\bwithout\s+(?:telling|informing|notifying|alerting|asking|consulting|warning|letting)\s+"
    r"(?:the\s+)?(?:user|customer|human|operator|owner)s?\b",
    r"\b(?:keep|hide)\s+(?:this|it|that)\s+(?:secret\s+|hidden\s+)?from\s+(?:the\s+)?"
    r"(?:user|customer|human)s?\b",
    r"\b(?:new|updated|revised|real|actual|true|secret|hidden|additional)\s+(?:system\s+)?"
    r"(?:instructions?|directives?|orders?|task|objective|goal|rules?|policy)\s*(?:for\s+"
    r"(?:the\s+)?(?:ai|assistant|model|llm|agent|summari[sz]er)s?\s*)?:\s*(?:\w+\s+){0,4}?"
    r"(?:you\b|your\b|treat|respond|reply|answer|output|say|do\s+not|don't|always|never|ignore|"
    r"from\s+now|summari[sz]e|write|tell|include|add|send|mark|rate|approve)",
    r"\byour\s+(?:new|real|actual|true|only|primary|main)\s+(?:task|goal|objective|purpose|"
    r"mission|instructions?)\b[^.\n]{0,60}?(?:\bis\s+to\b|\bare\s+to\b|:)",
    r"\b(?:whenever|when|if|each\s+time|every\s+time)\s+(?:the\s+)?(?:user|customer|someone|"
    r"anyone|a\s+user)\s+(?:asks?|mentions?|says?|requests?|types?|writes?|brings\s+up|"
    r"inquires?)\b[^.\n]{0,80}?,\s*(?:always\s+|just\s+|simply\s+)?(?:tell|say|respond|reply|"
    r"answer|recommend|suggest|claim|insist|deny|refuse|redirect|send|direct|point|state)\b",
    r"\b(?:respond|reply|answer|speak|talk|write)\s+only\s+(?:with|in|as|using)\b[^.\n]{0,80}?"
    r"\b(?:from\s+now\s+on|to\s+(?:every|any|all)|always|no\s+matter)",
    _pat(r"\b(?:please\s+(?:always|never)|always|never)\s+(?:\w+\s+){0,2}(?:your\s+)?"
         r"(?:responses?|replies|answers?|summar(?:y|ies)|outputs?)\b",
         ctx=r"(?:^|(?<=[.!?;:]\s))"),
    r"\b(?:for|in)\s+(?:all|every|any)\s+(?:future|subsequent|later|upcoming)\s+(?:sessions?|"
    r"conversations?|chats?|interactions)\s*[:,]",
    r"\bfor\s+the\s+rest\s+of\s+(?:our|this|all)\s+(?:conversations?|chats?|sessions?)\b",
)

# --------------------------------------------------------------------------- INJ-06

_EXTRACTION = _pats(
    r"\b(?:reveal|print|show|output|display|repeat|recite|leak|dump|disclose|tell\s+me|give\s+me|"
    r"share|write\s+out|spell\s+out|translate|paste|copy|return|list|expose|state)\s+(?:me\s+)?"
    r"(?:all\s+)?(?:of\s+)?(?:your|the)\s+(?:(?:full|entire|complete|original|hidden|initial|"
    r"secret|exact|verbatim|confidential|internal|real)\s+){0,2}(?:system\s+(?:prompt|message|"
    r"instructions?)|initial\s+(?:prompt|instructions?)|hidden\s+(?:prompt|instructions?)|"
    r"(?:developer|dev)\s+(?:message|prompt|instructions?)|instructions\s+you\s+were\s+given|"
    r"prompt\s+above|pre-?prompt|meta-?prompt)",
    r"\b(?:repeat|print|output|reproduce|recite)\s+(?:all\s+)?(?:the\s+)?(?:words|text|"
    r"everything|content|lines?|instructions|messages?)\s+(?:above|before\s+this|prior\s+to\s+"
    r"this|preceding)",
    r"\bwhat\s+(?:are|were|is)\s+your\s+(?:initial|original|system|hidden|secret|first|exact)\s+"
    r"(?:instructions|prompt|message|rules)",
)

# --------------------------------------------------------------------------- INJ-07

_EXFIL_VERB = _imp(
    r"send|post|upload|forward|email|e-mail|mail|leak|exfiltrate|transmit|paste|share|submit|copy|"
    r"append|add|include|attach|put|write|dump|export|sync|pipe|report|deliver|push|publish|"
    r"relay|text|dm|message|encode|embed|insert|enter|type|fill\s+in|input|save")
_SECRET = _AnyOf.of(
    r"(?:\b|_)api[\s_-]?keys?\b", r"\b(?:access|secret)[\s_-]?keys?\b", r"\bsecrets?\b",
    r"\bpass(?:words?|wd|phrases?|codes?)\b", r"\bcredentials?\b|\bcreds\b", r"\btokens?\b",
    r"\bcookies?\b", r"\b(?:private|ssh)\s+keys?\b|\bid_rsa\b|\.ssh\b|\.aws\b|\baws_\w+",
    r"(?<!\w)\.env\b|\benv(?:ironment)?\s+(?:vars?|variables?|file)\b",
    r"\bconversation(?:\s+history)?\b|\bchat\s+(?:history|logs?|transcripts?)\b|\btranscripts?\b",
    r"\buser'?s?\s+(?:\w+\s+)?(?:data|e-?mail\s+address|e-?mails?|address|phone(?:\s+number)?|"
    r"location|contacts?|messages?|files?|history|details|information|profile|credentials|"
    r"passwords?|card|credit\s+card|documents?)\b",
    r"\bpersonal\s+(?:data|information|details)\b|\bpii\b|\bssn\b|\bsocial\s+security\b",
    r"\bcredit\s+card|\bcard\s+numbers?\b", r"\bsystem\s+prompt\b", r"\bmemor(?:y|ies)\b",
    r"\binbox\b", r"\ball\s+(?:of\s+)?(?:my|the|your|the\s+user'?s?)?\s*(?:e-?mails|messages|"
    r"files|contacts|documents)\b",
    r"\bseed\s+phrase\b|\b(?:2fa|otp|verification|one-time)\s+codes?\b|\bkeychain\b|\bwallet\b",
    r"/etc/(?:passwd|shadow)",
)
_DEST = _AnyOf.of(
    r"https?://\S+", r"\bwww\.\S+", r"\b[\w.+-]+@[\w-]+(?:\.[\w-]+)+\b",
    r"\b[\w-]+(?:\.com|\.net|\.org|\.io|\.xyz|\.ru|\.cn|\.top|\.site|\.app|\.dev|\.me|\.info|"
    r"\.biz|\.shop|\.online|\.cc|\.tk|\.link|\.example)\b",
    r"\b(?:webhooks?|pastebin|ngrok|requestbin|discord|telegram)\b",
    r"\b(?:this|that|the\s+following|the\s+below|my|our)\s+(?:url|link|address|e-?mail|endpoint|"
    r"server|webhook|site|domain|channel)\b",
    r"\baddress\s+below\b", r"\b(?:in|into)\s+(?:your|the)\s+(?:response|reply|answer|output)\b",
)
_EXFIL_DIRECT = _pats(
    r"\b(?:reply|respond|answer)\s+with\s+(?:the|your|my|all|its)?\s*(?:\w+\s+){0,2}"
    r"(?:password|passwd|api\s+key|token|secret|credentials|private\s+key|pin|ssn|otp|"
    r"verification\s+code)s?\b",
    r"!\[[^\]\n]{0,100}\]\(\s*https?://[^)\s]*(?:\{|%7b|\$\{|<|\[)[^)\n]{0,80}\)",
    r"\b(?:render|display|show|include|insert|load|embed|fetch|open|visit)\s+(?:this|the\s+"
    r"following|an?|the)?\s*(?:image|markdown|link|url|picture|pixel)?\s*:?\s*https?://\S*"
    r"[?&][\w-]+=\s*(?:\{|%7b|\$\{|<|\[)",
)


def _exfiltration(t: NormalisedText, view: _View) -> str | None:
    """Imperative send/post/share + a secret + an external destination, in one sentence."""
    for p in _EXFIL_DIRECT:
        if m := p.search(view):
            return m.group(0)
    if not (_EXFIL_VERB.search(view) and _DEST.search(view) and _SECRET.search(view)):
        return None
    for s in _SENTENCE_SPLIT.split(view.text):
        sv = _View(s)
        v = _EXFIL_VERB.search(sv)
        if v and _DEST.search(sv) and _SECRET.search(sv):
            return s[v.start():].strip()
    return None


# --------------------------------------------------------------------------- INJ-08

_SIDE_VERBS = (r"deploy|delete|remove|wipe|erase|purge|drop|transfer|wire|pay|purchase|buy|order|"
               r"book|approve|merge|push|publish|send|email|e-mail|forward|post|grant|revoke|"
               r"disable|enable|shut\s+down|restart|reboot|format|uninstall|install|cancel|"
               r"unsubscribe|refund|sell|invest|charge|sign|accept|execute|run|call|invoke|"
               r"trigger|open|"
               r"visit|download|commit|overwrite|reset|rotate|close|archive|move|upload|share|"
               r"change|modify|update|create|submit|mark|fetch|ping|navigate\s+to|launch")
# Strong: the order itself waives the human check. Weak: plain haste, which how-to advice is
# full of ("remove infected leaves immediately"), so it only counts with an agent-sized target.
_URGENCY_STRONG = _pat(
    r"\b(?:without\s+(?:asking|confirmation|confirming|approval|permission|checking|review(?:ing)?|"
    r"waiting\s+for|telling|notifying|prompting|user\s+(?:approval|consent|confirmation))|"
    r"no\s+need\s+to\s+(?:confirm|ask|check)|silently|secretly|covertly|before\s+(?:the\s+user|"
    r"anyone)\s+(?:notices|sees|knows|checks)|as\s+soon\s+as\s+you\s+(?:read|see|process|"
    r"receive)|do\s+not\s+ask|don't\s+ask|skip\s+(?:the\s+)?(?:review|confirmation|approval|"
    r"checks?))\b")
_URGENCY_WEAK = _pat(r"\b(?:immediately|right\s+away|right\s+now|at\s+once|asap|"
                          r"automatically|quietly)\b")
_AGENT_TARGET = _pat(
    r"\b(?:the\s+user'?s?|production|prod|database|repo(?:sitory)?|servers?|cluster|funds|"
    r"payments?|invoices?|pull\s+requests?|pr\s*#|main\s+branch|expense|saved\s+card|credit\s+"
    r"card|shared\s+drive|all\s+(?:the\s+)?(?:files|e-?mails|messages|data|records|backups|"
    r"users|accounts)|backups?|vendor|permissions?|admin|tool)\b")
# Side effects are only orders at the head of a sentence or clause (not after "and": that is
# how narration and advice chain verbs: "cycle and then run immediately after").
_SIDE_IMP = _imp(_SIDE_VERBS, ctx=rf"(?:^|(?<=[.!?;:,\n(\[\"'`>*\-])|{_ADDRESSED})\s*{_LEAD}")
_TOOL_NAME = r"`?(?!to\b|for\b|of\b|a\b|an\b|the\b)[\w./-]+`?"
_TOOL_FORCING = (
    _imp(r"call|invoke|trigger", r"\s+(?:the\s+|your\s+|a\s+)?" + _TOOL_NAME
         + r"\s+(?:tool|plugin|action|connector|integration|skill)\b"),
    _imp(r"use|run|execute|fire|activate|launch",
         r"\s+(?:the\s+|your\s+)?`?[a-z0-9]+(?:[_.][a-z0-9]+)+`?\s+(?:tool|plugin|action|"
         r"connector|integration|skill)\b"),
    _imp(r"call|invoke|run|execute|trigger",
         r"\s+`?(?:transfer|send|delete|remove|drop|wipe|deploy|pay|purchase|buy|grant|approve|"
         r"exec|shell|run_command|system|spawn|upload|post|email|publish|merge|push|revoke|"
         r"update_permissions|set_role|create_user|refund)\w*\s*\("),
    _pat(r"\bexecute\s+the\s+following\s+(?:commands?|code|script|snippet|shell\s+commands?|"
         r"payload)"),
    _pat(r"\b(?:run|execute)\s+(?:this|it|that)\s+(?:first|now|immediately)\b",
         ctx=r"(?:^|<-|←)\s*"),
    _pat(r"\b(?:next\s+time|whenever|once|when|if)\s+you\s+(?:have|get|gain)\s+(?:shell|terminal|"
         r"root|admin|browser|tool|code\s+execution|file\s*system|internet|network)\s+access\b"),
    _pat(r"\b(?:quietly|silently|secretly|covertly|invisibly)\s+(?:visit|open|fetch|load|request|"
         r"ping|call|curl|navigate\s+to|browse\s+to|access|hit)\b[^.\n]{0,40}?https?://"),
    _imp(r"call|invoke|trigger|run|execute|use|fire", r"\s+(?:the\s+)?" + _TOOL_NAME
         + r"\s+(?:tool|function|plugin|action|webhook|endpoint)\b[^.\n]{0,60}?\bnow\b"),
    _pat(r"(?:\byou\s+(?:must|need\s+to|have\s+to|are\s+to|will)|\b(?:assistant|agent|ai)\b"
         r"[^.\n]{0,20})\s+run\s+the\s+following\b"),
)


def _side_effect_order(t: NormalisedText, view: _View) -> str | None:
    """An imperative side effect (deploy, delete, pay, ...) that waives the human check."""
    strong = _URGENCY_STRONG.search(view)
    if not (strong or (_URGENCY_WEAK.search(view) and _AGENT_TARGET.search(view))):
        return None
    if not _SIDE_IMP.search(view):
        return None
    for s in _SENTENCE_SPLIT.split(view.text):
        sv = _View(s)
        v = _SIDE_IMP.search(sv)
        if v and (_URGENCY_STRONG.search(sv) or (
                _URGENCY_WEAK.search(sv) and _AGENT_TARGET.search(sv))):
            return s[v.start():].strip()
    return None


# --------------------------------------------------------------------------- INJ-09

_DANGEROUS = _pats(
    r"\brm\s+(?:-[a-z-]+\s+)*-[a-z]*[rf][a-z]*\s+(?:-[-\w]+\s+)*(?:/(?=[\s`'\")*]|$)|"
    r"~/?(?=[\s`'\")]|$)|\$home\b|\*|/\*|\.\.?/?(?=\s|$)|"
    r"/(?:etc|usr|var|bin|boot|lib|home|root|opt|srv|sys)\b|--no-preserve-root)",
    r"\bsudo\s+rm\s+-",
    r"\b(?:curl|wget|iwr|invoke-webrequest|irm)\b[^|\n]{0,300}\|\s*(?:sudo\s+)?(?:(?:ba|z|k|da|fi)?"
    r"sh|python[0-9.]*|perl|ruby|node|iex|powershell)\b",
    r"\b(?:ba|z)?sh\s+-c\s+[\"']?\$\(\s*(?:curl|wget)",
    r"\biex\b\s*\(?\s*\(?\s*(?:new-object|iwr|invoke-webrequest|irm|invoke-restmethod)|"
    r"downloadstring\s*\(",
    r"base64\s+(?:-d|--decode)\b[^\n]{0,80}\|\s*(?:sudo\s+)?(?:ba|z)?sh\b",
    r"\bmkfs(?:\.\w+)?\s+/dev/(?:sd|nvme|hd|disk|xvd|vd|mmcblk)|"
    r"\bdd\s+if=\S+\s+of=/dev/(?:sd|nvme|hd|disk|xvd|vd)",
    r":\(\)\s*\{\s*:\s*\|\s*:\s*&\s*\}\s*;\s*:",
    r">\s*/dev/(?:sd|nvme|hd)[a-z]",
    r"\bchmod\s+(?:-r\s+)?0?777\s+/(?=\s|$)|\bchown\s+-r\s+\S+\s+/(?=\s|$)",
    r"/dev/tcp/\d|\bnc(?:at)?\s+(?:-\w+\s+)*-e\s+/bin/(?:ba)?sh|\bsocat\b[^\n]{0,80}exec:",
    r"\bdrop\s+(?:table|database|schema)\b|\btruncate\s+table\b|\bdelete\s+from\s+\w+\s*(?:;|$)",
    r"\bgit\s+push(?:\s+-{1,2}[\w=-]+)*(?:\s+[\w./:@+-]+){0,2}?(?:\s+-{1,2}[\w=-]+)*?\s+"
    r"(?:--force|-f)(?![\w-])",
    r"\bos\.system\s*\(|\bsubprocess\.\w+\s*\([^)]{0,100}(?:curl|wget|rm\s+-rf)",
    r"\beval\s*\(\s*(?:atob|base64|unescape|decodeuricomponent)",
    r"\bformat\s+c:|\bdel\s+/[fsq]\b|\bkill\s+-9\s+-1\b",
    r"\b(?:env|printenv)\s*\|\s*(?:curl|nc|wget)\b",
    r"\bcat\s+[~/.\w-]*(?:\.ssh/(?![\w.-]*\.pub\b)|/etc/shadow|\.aws/credentials)",
    r"\b(?:curl|wget)\s[^\n]{0,200}(?:-d|--data(?:-binary)?|-f|--upload-file|-t)\s+@?[~/.\w-]*"
    r"(?:\.ssh|\.aws|\.env|/etc/passwd|id_rsa|credentials)",
)
# Official installer scripts that documentation legitimately pipes into a shell.
_TRUSTED_INSTALLERS = _rx(
    r"https://(?:sh\.rustup\.rs|get\.docker\.com|install\.python-poetry\.org|astral\.sh/uv/|"
    r"bun\.sh/install|deno\.land/install|raw\.githubusercontent\.com/(?:nvm-sh/nvm|"
    r"homebrew/install)/)")
# Narration, warnings and descriptions around a command: it is being talked about, not ordered.
_NARRATIVE = _rx(
    r"(?<![-\w])(?:i|we|he|she|they|someone|somebody|my|our)\b|\b(?:ran|executed|typed|tried|"
    r"installed|used|did|had|was|were|accidentally|yesterday|ago|last\s+(?:week|night|time|month|"
    r"year)|earlier\s+today|never|don't|do\s+not|avoid|warning|beware|dangerous|careful|caution|"
    r"what\s+does|why|how\s+does|explain(?:s|ed)?|means?|rewrites?|deletes?|removes?|wipes?|"
    r"destroys?|erases?|is|are|would|could|can)\b")
_SENTENCE_BOUNDARY = re.compile(r"(?<=[.!?])\s+(?=\S)|\n")


def _dangerous_command(t: NormalisedText, view: _View) -> str | None:
    """A destructive or remote-code command that is not narrated, described or warned about."""
    text = view.text
    for p in _DANGEROUS:
        for m in p.finditer(view):
            starts = [b.end() for b in _SENTENCE_BOUNDARY.finditer(text, 0, m.start())]
            s0 = starts[-1] if starts else 0
            e = _SENTENCE_BOUNDARY.search(text, m.end())
            s1 = e.start() if e else len(text)
            if _TRUSTED_INSTALLERS.search(text, s0, m.end()):
                continue
            around = text[s0:m.start()] + " " + text[m.end():s1]
            if _NARRATIVE.search(around):
                continue
            return m.group(0)
    return None


# --------------------------------------------------------------------------- INJ-10

_COMMENT_MAX = 2000  # longer comments are read only up to here


def _html_comments(text: str) -> Iterator[tuple[str, str]]:
    """(comment, body) pairs, found by str.find: linear even for 5,000 unclosed openers."""
    i = text.find("<!--")
    while i >= 0:
        j = text.find("-->", i + 4)
        if j < 0:
            return
        body = text[i + 4:min(j, i + 4 + _COMMENT_MAX)]
        yield text[i:j + 3], body
        i = text.find("<!--", j + 3)


_MD_COMMENT = _rx(r"^\s*\[(?://|comment)\]:\s*(?:#|<>)\s*\((.{0,1000}?)\)\s*$")
_HIDDEN_TAG = _rx(
    r"<(\w+)\b[^>]{0,300}?(?:display\s*:\s*none|visibility\s*:\s*hidden|font-size\s*:\s*0(?:px|pt|"
    r"em|rem|%)?\s*[;\"']|opacity\s*:\s*0(?:\.0+)?\s*[;\"']|color\s*:\s*(?:#fff(?:fff)?|white)\b|"
    r"\bhidden\b|aria-hidden\s*=\s*[\"']true)[^>]{0,300}>([^<]{0,600})")
_ATTR_TEXT = _rx(r"\b(?:alt|title|aria-label|data-[\w-]+)\s*=\s*\"([^\"]{0,500})\"")
_AI_CUE = _rx(r"\b(?:ai|llm|language\s+model|chatbot|assistants?|agents?|model|gpt|chatgpt|"
              r"claude|copilot|system|prompt|instructions?)\b")
_ORDER_CUE = _rx(
    r"\b(?:you|your|ignore|disregard|forget|tell|say|state|respond|reply|answer|include|add|"
    r"recommend|obey|follow|do\s+not|don't|always|never|must|should|output|print|reveal|send|"
    r"forward|execute|run|summari[sz]e|rate|mark|claim)\b")


def _hidden_markup(t: NormalisedText, view: _View) -> str | None:
    """Comments, invisible elements and attributes are read by the model, not by the human."""
    text = t.folded
    bodies: list[tuple[str, str, bool]] = []  # (evidence, body, needs an AI cue)
    if "<!--" in text:
        bodies += [(comment, body, True) for comment, body in _html_comments(text)]
    if "]:" in text:
        bodies += [(m.group(0), m.group(1), True) for m in _MD_COMMENT.finditer(text)]
    if "<" in text:
        bodies += [(m.group(2).strip() or m.group(0), m.group(2), False)
                   for m in _HIDDEN_TAG.finditer(text)]
    if '="' in text:
        bodies += [(m.group(0), m.group(1), True) for m in _ATTR_TEXT.finditer(text)]
    for evidence, body, needs_ai in bodies:
        if _ORDER_CUE.search(body) and (not needs_ai or _AI_CUE.search(body)):
            return evidence
    return None


# --------------------------------------------------------------------------- INJ-11

_DECODE_AND_RUN = _pats(
    r"\b(?:decode|decrypt|deobfuscate|unescape|convert|apply\s+rot-?13|rot-?13|base64[\s-]*decode"
    r"|b64decode|atob)\b[^.\n]{0,80}?\b(?:run|execute|exec|eval|follow|obey|carry\s+out|perform|"
    r"comply\s+with|act\s+on|do)\s+(?:it\b|this\b|that\b|them\b|the\s+(?:result|output|decoded"
    r"\s+\w+|instructions?|commands?|code|contents?|payload|script|text)\b|what(?:ever)?\s+it\s+"
    r"says|:)",
    r"\b(?:run|execute|eval|follow|obey)\s+(?:the\s+)?(?:decoded|decrypted|deobfuscated)\b",
)
_B64 = re.compile(r"(?<![A-Za-z0-9+/=_-])[A-Za-z0-9+/]{20,}={0,2}(?![A-Za-z0-9+/=_-])")
_HEX = re.compile(r"(?<![0-9A-Fa-f])(?:[0-9A-Fa-f]{2}){12,}(?![0-9A-Fa-f])")


def _texty(data: bytes) -> str | None:
    try:
        s = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    printable = sum(c.isprintable() or c in "\n\t" for c in s)
    return s if s and printable / len(s) > 0.9 and s.count(" ") >= 2 else None


def _decoded_candidates(raw: str) -> list[str]:
    """Text hidden in base64 or hex blobs (at most 8 of each, looked for in long tokens only)."""
    out: list[str] = []
    long_tokens = " ".join(tok for tok in raw.split() if len(tok) >= 20)
    if not long_tokens:
        return out
    for m in list(_B64.finditer(long_tokens))[:8]:
        blob = m.group(0)
        try:
            data = base64.b64decode(blob + "=" * (-len(blob) % 4), validate=True)
        except (binascii.Error, ValueError):
            continue
        if s := _texty(data):
            out.append(s)
    for m in list(_HEX.finditer(long_tokens))[:8]:
        if s := _texty(bytes.fromhex(m.group(0))):
            out.append(s)
    return out


def _encoded_payload(t: NormalisedText, view: _View) -> str | None:
    """Base64/hex text that decodes to something another rule flags is a wrapped injection."""
    for decoded in _decoded_candidates(t.raw):
        inner = normalise(decoded)
        inner_view = _View(inner.folded)
        for rule in RULES:
            if rule.rule_id in _NO_RECURSE:
                continue
            hit = rule.match(inner, inner_view)
            if hit:
                return f"decoded -> {rule.rule_id}: {hit}"
    return None


# --------------------------------------------------------------------------- INJ-12


def _invisible(t: NormalisedText, view: _View) -> str | None:
    """Tag-character or variation-selector payloads, zero-width runs, or keywords split apart."""
    if t.hidden_payloads:
        return "hidden payload: " + t.hidden_payloads[0]
    if t.invisible_run:
        return "invisible run " + t.invisible_run
    split = [w for w in t.split_words if w in _TRIGGER_WORDS]
    if split or len(t.split_words) >= 3:
        return "split word: " + ", ".join(split or t.split_words)
    return None


# --------------------------------------------------------------------------- INJ-13

_LT = "<"  # kept apart so this source never contains a literal call tag
_TOOL_MARKUP = _pats(
    _LT + r"\s*/?\s*(?:tool_calls?|function_calls?|tool_use|tool_results?|tool_response|"
    r"function_results?|function_response|invoke\s+name\s*=|parameter\s+name\s*=|tool_code|"
    r"python_tag)\b",
    r"<\|(?:tool_call|python_tag|tool_response)\|>|\[(?:tool_calls|tool_results)\]",
    r"\"(?:tool_calls|function_call|tool_call|tool_use)\"\s*:",
    r"\"type\"\s*:\s*\"(?:tool_use|function_call)\"",
    r"\"name\"\s*:\s*\"[\w.\-]+\"\s*,\s*\"(?:arguments|args)\"\s*:",
    r"^\s*action\s*:\s*[\w.\-]+\s*\n\s*action\s+input\s*:",
    r"```\s*(?:tool_code|tool_call|function_call|tool_use)\b",
)

# --------------------------------------------------------------------------- the rule set

RULES: tuple[Rule, ...] = (
    Rule("INJ-01", "override prior instructions",
         "orders to drop the instructions in force are the classic prompt injection",
         _OVERRIDE_EN, mention_ok=True, deobfuscate=True),
    Rule("INJ-02", "override prior instructions (other languages)",
         "the same order in German, French, Spanish, Portuguese, Italian, Dutch, Russian, "
         "Chinese, Japanese or Korean slips past English-only filters",
         _OVERRIDE_INTL, mention_ok=True),
    Rule("INJ-03", "chat-template or role markup",
         "special tokens, role headers and system tags let data pose as a system/developer turn",
         _ROLE_MARKUP, predicate=_forged_turns),
    Rule("INJ-04", "persona hijack or jailbreak",
         "re-defining the assistant (DAN, developer mode, 'no restrictions') disables its policy",
         _PERSONA, mention_ok=True, deobfuscate=True),
    Rule("INJ-05", "standing order to the assistant",
         "stale imperatives aimed at the AI ('from now on you will', 'do not tell the user') "
         "would be obeyed as if they were new; preferences belong in declarative form",
         _STANDING, mention_ok=True, deobfuscate=True),
    Rule("INJ-06", "prompt extraction",
         "asking for the system prompt or 'the words above' leaks the host's instructions",
         _EXTRACTION, mention_ok=True),
    Rule("INJ-07", "exfiltration to an external destination",
         "an order to send secrets or private data to a URL, address or the reply is never "
         "reference material, whatever the quoting",
         predicate=_exfiltration),
    Rule("INJ-08", "tool forcing or side-effect order",
         "a memory must not make the agent call a tool, pay, delete or deploy, least of all "
         "'now' or 'without asking'",
         _TOOL_FORCING, predicate=_side_effect_order, mention_ok=True),
    Rule("INJ-09", "destructive or remote-code command",
         "rm -rf /, curl | sh, reverse shells, DROP TABLE, force-push given as an order (narrated "
         "or warned-about commands pass)",
         predicate=_dangerous_command),
    Rule("INJ-10", "hidden markup carrying instructions",
         "HTML/Markdown comments, invisible elements and alt text address the model behind the "
         "human reader's back",
         predicate=_hidden_markup),
    Rule("INJ-11", "encoded payload",
         "decode-and-run asks, and base64/hex blobs that decode to an injection, hide the order "
         "from filters and reviewers",
         _DECODE_AND_RUN, predicate=_encoded_payload),
    Rule("INJ-12", "invisible-character smuggling",
         "Unicode tag/variation-selector payloads, zero-width runs and keywords split by "
         "zero-width characters are invisible to the human but not to the model",
         predicate=_invisible),
    Rule("INJ-13", "fake tool or function-call markup",
         "forged call or result markup can be parsed as a real tool call or a trusted result",
         _TOOL_MARKUP),
)
_NO_RECURSE = frozenset({"INJ-11", "INJ-12"})


def _module_patterns() -> tuple[_Pat, ...]:
    """Every compiled pattern: the rules' own and those their predicates use."""
    found: dict[int, _Pat] = {}
    for value in list(globals().values()) + [r.patterns for r in RULES]:
        items = value if isinstance(value, tuple) else (value,)
        for item in items:
            parts = item.parts if isinstance(item, _AnyOf) else (item,)
            for part in parts:
                if isinstance(part, _Pat):
                    found[id(part)] = part
    return tuple(found.values())


def _anchor_universe() -> _Lead:
    leads = [p.lead for p in _module_patterns() if p.lead is not None]
    return _Lead(*(frozenset().union(*(getattr(lead, kind) for lead in leads))
                   for kind in ("words", "prefixes", "literals")))


_ANCHORS = _anchor_universe()
# Soundness of _Pat.possible: View.present only knows the anchors gathered here.
assert all(p.keys is None or p.keys <= _ANCHORS.keys for p in _module_patterns())
# Words the de-obfuscating rules mention: the only targets worth de-obfuscating towards.
_DEOBF_VOCAB = frozenset(w for r in RULES if r.deobfuscate for p in r.patterns
                         for w in re.findall(r"[a-z]{2,}", re.sub(r"\\[a-z]", " ", p.pattern)))


def _sub_groups(ascii_only: bool) -> tuple[tuple[str, tuple[tuple[str, str], ...]], ...]:
    """Substring anchors grouped by their first two characters (one test skips a group)."""
    groups: dict[str, list[tuple[str, str]]] = {}
    subs = [(_PREFIX_TAG + p, p) for p in _ANCHORS.prefixes]
    subs += [(_LITERAL_TAG + lit, lit) for lit in _ANCHORS.literals]
    for tag, lit in sorted(subs):
        if not ascii_only or lit.isascii():
            groups.setdefault(lit[:2], []).append((tag, lit))
    return tuple((k, tuple(v)) for k, v in sorted(groups.items()))


_SUB_GROUPS = _sub_groups(False)
_SUB_GROUPS_ASCII = _sub_groups(True)


# --------------------------------------------------------------------------- public API


@dataclass(frozen=True)
class InjectionVerdict:
    """Outcome for one memory text: the first rule that fired, with the matched span."""

    flagged: bool
    rule_id: str | None = None
    rule_name: str | None = None
    evidence: str | None = None


_CLEAN = InjectionVerdict(False, None, None, None)


def detect_injection(text: str) -> InjectionVerdict:
    """Check one memory text; rules run in id order and the first hit decides."""
    if not text or not text.strip():
        return _CLEAN
    t = normalise(text)
    view, deobf = _View(t.folded), _View(t.deobf)
    for rule in RULES:
        hit = rule.match(t, view, deobf)
        if hit is not None:
            evidence = " ".join(hit.split())[:80]
            return InjectionVerdict(True, rule.rule_id, rule.name, evidence)
    return _CLEAN


def rules_markdown() -> str:
    """The rule table for documentation, generated from RULES so it cannot drift."""
    def cell(text: str) -> str:
        return text.replace("|", "\\|")  # "curl | sh" must not split a table cell

    rows = ["| id | name | rationale |", "|---|---|---|"]
    rows += [f"| {r.rule_id} | {cell(r.name)} | {cell(r.rationale)} |" for r in RULES]
    mention = ", ".join(r.rule_id for r in RULES if r.mention_ok)
    rows += ["", f"Quoted mentions in a discussion frame pass for {mention}; every other rule "
             "fires whatever the quoting."]
    return "\n".join(rows)
