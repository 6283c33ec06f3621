"""The injection rules that need code, not just a regex, registered by name for the rules file.

A rule in `injection_rules.toml` names its predicate (`predicate = "exfiltration"`); the loader
looks the name up in PREDICATES and checks that the pattern groups, regexes and word lists the
predicate reads are defined in the file. Each predicate returns the evidence span, or None.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol

from mnemoflow.agents.injection_normalise import NormalisedText
from mnemoflow.agents.injection_scan import Pattern, View, search_any


class RuleContext(Protocol):
    """What a predicate may read from the rule set that calls it."""

    def group(self, name: str) -> tuple[Pattern, ...]: ...

    def regex(self, name: str) -> re.Pattern[str]: ...

    def words(self, name: str) -> frozenset[str]: ...

    def normalise(self, text: str) -> NormalisedText: ...

    def first_hit(self, t: NormalisedText, *, decoded: bool = False) -> tuple[str, str] | None: ...


Check = Callable[[RuleContext, NormalisedText, View], str | None]


@dataclass(frozen=True)
class Predicate:
    """A registered check and the names it reads from the rules file (validated at load)."""

    check: Check
    groups: tuple[str, ...] = ()  # pattern groups searched on views
    # one-regex groups -> how many capture groups the check reads from them
    regexes: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    words: tuple[str, ...] = ()  # word lists


_SENTENCE_SPLIT = re.compile(r"(?<=[.!?])\s+|\n+|;\s+")
_SENTENCE_BOUNDARY = re.compile(r"(?<=[.!?])\s+(?=\S)|\n")


def _order_in_one_sentence(view: View, verb: Sequence[Pattern],
                           holds: Callable[[View], object]) -> str | None:
    """From the verb on, the first sentence with an imperative `verb` where `holds` is true too.

    The whole text is tried first: most texts fail there, before any sentence split.
    """
    if not (search_any(verb, view) and holds(view)):
        return None
    for s in _SENTENCE_SPLIT.split(view.text):
        sv = view.derive(s)
        v = search_any(verb, sv)
        if v and holds(sv):
            return s[v.start():].strip()
    return None


def forged_turns(rules: RuleContext, t: NormalisedText, view: View) -> str | None:
    """A Human:/Assistant: turn pair embedded after other content forges a conversation."""
    m = rules.regex("human_turn").search(t.folded) if "human" in t.folded else None
    if m and not rules.regex("role_label_start").match(t.folded):
        return m.group(0)
    return None


def exfiltration(rules: RuleContext, t: NormalisedText, view: View) -> str | None:
    """Imperative send/post/share + a secret + an external destination, in one sentence."""
    if m := search_any(rules.group("exfil_direct"), view):
        return m.group(0)
    dest, secret = rules.group("destination"), rules.group("secret")
    return _order_in_one_sentence(view, rules.group("exfil_verb"),
                                  lambda v: search_any(dest, v) and search_any(secret, v))


def side_effect_order(rules: RuleContext, t: NormalisedText, view: View) -> str | None:
    """An imperative side effect (deploy, delete, pay, ...) that waives the human check.

    Strong urgency ("without asking") counts alone; weak urgency ("immediately") only with an
    agent-sized target, as how-to advice is full of plain haste.
    """
    strong, weak = rules.group("urgency_strong"), rules.group("urgency_weak")
    target = rules.group("agent_target")
    return _order_in_one_sentence(
        view, rules.group("side_effect"),
        lambda v: search_any(strong, v) or (search_any(weak, v) and search_any(target, v)))


def dangerous_command(rules: RuleContext, t: NormalisedText, view: View) -> str | None:
    """A destructive or remote-code command that is not narrated, described or warned about."""
    text = view.text
    trusted, narrative = rules.regex("trusted_installer"), rules.regex("narrative")
    for p in rules.group("dangerous_command"):
        for m in p.finditer(view):
            starts = [b.end() for b in _SENTENCE_BOUNDARY.finditer(text, 0, m.start())]
            s0 = starts[-1] if starts else 0
            e = _SENTENCE_BOUNDARY.search(text, m.end())
            s1 = e.start() if e else len(text)
            if trusted.search(text, s0, m.end()):
                continue
            if narrative.search(text[s0:m.start()] + " " + text[m.end():s1]):
                continue
            return m.group(0)
    return None


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


def hidden_markup(rules: RuleContext, t: NormalisedText, view: View) -> str | None:
    """Comments, invisible elements and attributes are read by the model, not by the human.

    An invisible element needs only an order cue; comments and attributes also need a cue
    that the text addresses an AI.
    """
    text = t.folded
    bodies: list[tuple[str, str, bool]] = []  # (evidence, body, needs an AI cue)
    if "<!--" in text:
        bodies += [(comment, body, True) for comment, body in _html_comments(text)]
    if "]:" in text:
        bodies += [(m.group(0), m.group(1), True) for m in rules.regex("md_comment").finditer(text)]
    if "<" in text:
        bodies += [(m.group(2).strip() or m.group(0), m.group(2), False)
                   for m in rules.regex("hidden_tag").finditer(text)]
    if '="' in text:
        bodies += [(m.group(0), m.group(1), True) for m in rules.regex("attr_text").finditer(text)]
    order, ai = rules.regex("order_cue"), rules.regex("ai_cue")
    for evidence, body, needs_ai in bodies:
        if order.search(body) and (not needs_ai or ai.search(body)):
            return evidence
    return None


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


def encoded_payload(rules: RuleContext, t: NormalisedText, view: View) -> str | None:
    """Base64/hex text that decodes to something another rule flags is a wrapped injection."""
    for decoded in _decoded_candidates(t.raw):
        if found := rules.first_hit(rules.normalise(decoded), decoded=True):
            rule_id, hit = found
            return f"decoded -> {rule_id}: {hit}"
    return None


def invisible(rules: RuleContext, t: NormalisedText, view: View) -> str | None:
    """Tag-character or variation-selector payloads, zero-width runs, or keywords split apart."""
    if t.hidden_payloads:
        return "hidden payload: " + t.hidden_payloads[0]
    if t.invisible_run:
        return "invisible run " + t.invisible_run
    triggers = rules.words("trigger")
    split = [w for w in t.split_words if w in triggers]
    if split or len(t.split_words) >= 3:
        return "split word: " + ", ".join(split or t.split_words)
    return None


PREDICATES: Mapping[str, Predicate] = MappingProxyType({
    "forged_turns": Predicate(forged_turns, regexes=MappingProxyType(
        {"human_turn": 0, "role_label_start": 0})),
    "exfiltration": Predicate(exfiltration, groups=("exfil_direct", "exfil_verb", "destination",
                                                    "secret")),
    "side_effect_order": Predicate(side_effect_order, groups=(
        "side_effect", "urgency_strong", "urgency_weak", "agent_target")),
    "dangerous_command": Predicate(dangerous_command, groups=("dangerous_command",),
                                   regexes=MappingProxyType({"trusted_installer": 0,
                                                             "narrative": 0})),
    "hidden_markup": Predicate(hidden_markup, regexes=MappingProxyType(
        {"md_comment": 1, "hidden_tag": 2, "attr_text": 1, "order_cue": 0, "ai_cue": 0})),
    "encoded_payload": Predicate(encoded_payload),
    "invisible": Predicate(invisible, words=("trigger",)),
})
