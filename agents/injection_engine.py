"""A loaded injection rule set: runs its rules over one text in order; the first hit decides.

Built by `injection_loader.load_rules` from `injection_rules.toml`; immutable, so one RuleSet
can be shared by any number of callers and threads.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

from mnemoflow.agents.injection_model import InjectionModel
from mnemoflow.agents.injection_normalise import NormalisedText, normalise
from mnemoflow.agents.injection_predicates import Predicate
from mnemoflow.agents.injection_scan import AnchorIndex, Pattern, View


@dataclass(frozen=True)
class Rule:
    """One documented rule: patterns and/or a registered predicate returning the evidence."""

    rule_id: str
    name: str
    rationale: str
    patterns: tuple[Pattern, ...] = ()
    predicate: Predicate | None = None
    predicate_name: str | None = None
    mention_ok: bool = False  # a bare quoted phrase in a discussion frame passes
    deobfuscate: bool = False  # also try the de-obfuscated view
    on_decoded: bool = True  # also run on text decoded from an encoded payload


@dataclass(frozen=True)
class InjectionVerdict:
    """Outcome for one memory text: the first rule that fired, with the matched span."""

    flagged: bool
    rule_id: str | None = None
    rule_name: str | None = None
    evidence: str | None = None


CLEAN = InjectionVerdict(False, None, None, None)

_QUOTES = {'"': '"', "'": "'", "\u201c": "\u201d", "\u2018": "\u2019", "\u00ab": "\u00bb",
           "\u201e": "\u201c", "`": "`", "\u300c": "\u300d", "\u300e": "\u300f",
           "\u2039": "\u203a"}
_CONTINUATION = re.compile(r"\b(?:and|then|but)\b|[,;:&]")
_TOKEN = re.compile(r"\w+")


@dataclass(frozen=True)
class ModelRule:
    """The classifier's place in the rule table: it speaks only when no rule fired."""

    rule_id: str
    name: str
    rationale: str
    model: InjectionModel


@dataclass(frozen=True, eq=False)
class RuleSet:
    """The compiled rules plus the named patterns and word lists their predicates read, and the
    classifier (`model`) that judges what no rule matched."""

    rules: tuple[Rule, ...]
    groups: Mapping[str, tuple[Pattern, ...]]
    word_lists: Mapping[str, frozenset[str]]
    vocab: frozenset[str]  # words the de-obfuscated view may be rebuilt towards
    index: AnchorIndex  # the anchors of all patterns, looked up once per view
    model: ModelRule | None = None

    def __post_init__(self) -> None:
        # a memory is checked again on every recall that keeps it, and the verdict is a pure
        # function of the text and this (immutable) rule set: each rule set holds its own memo
        object.__setattr__(self, "_detect", lru_cache(maxsize=4096)(self._detect_uncached))
        object.__setattr__(self, "_by_rules", lru_cache(maxsize=4096)(
            self._detect_by_rules_uncached))

    def rule(self, rule_id: str) -> Rule:
        for r in self.rules:
            if r.rule_id == rule_id:
                return r
        raise KeyError(rule_id)

    def group(self, name: str) -> tuple[Pattern, ...]:
        return self.groups[name]

    def regex(self, name: str) -> re.Pattern[str]:
        return self.groups[name][0].rx

    def words(self, name: str) -> frozenset[str]:
        return self.word_lists[name]

    def normalise(self, text: str) -> NormalisedText:
        return normalise(text, self.vocab)

    def view(self, text: str) -> View:
        return View(text, self.index)

    def match(self, rule: Rule, t: NormalisedText, view: View | None = None,
              deobf: View | None = None) -> str | None:
        """The evidence span if `rule` fires on `t`, else None."""
        view = view or self.view(t.folded)
        views = [view]
        if rule.deobfuscate and t.deobf != t.folded:
            views.append(deobf or self.view(t.deobf))
        for v in views:
            for p in rule.patterns:
                for m in p.finditer(v):
                    if rule.mention_ok and self._is_mention(v.text, m.start(), m.end()):
                        continue
                    return m.group(0)
        if rule.predicate is not None:
            return rule.predicate.check(self, t, view)
        return None

    def _first(self, t: NormalisedText, decoded: bool) -> tuple[Rule, str] | None:
        view, deobf = self.view(t.folded), self.view(t.deobf)
        for rule in self.rules:
            if decoded and not rule.on_decoded:
                continue
            hit = self.match(rule, t, view, deobf)
            if hit is not None:
                return rule, hit
        return None

    def first_hit(self, t: NormalisedText, *, decoded: bool = False) -> tuple[str, str] | None:
        """(rule id, evidence) of the first rule that fires; `decoded`: only on_decoded rules."""
        found = self._first(t, decoded)
        return (found[0].rule_id, found[1]) if found else None

    def detect(self, text: str) -> InjectionVerdict:
        """The combined verdict: the rules in file order (the first hit decides), then the
        classifier, whose evidence is its score and the words that weighed most."""
        return self._detect(text)  # type: ignore[attr-defined,no-any-return]

    def _detect_uncached(self, text: str) -> InjectionVerdict:
        verdict = self.detect_by_rules(text)
        if verdict.flagged or self.model is None or not text.strip():
            return verdict
        m = self.model
        p = m.model.score(text)
        if p < m.model.threshold:
            return CLEAN
        return InjectionVerdict(True, m.rule_id, m.name, f"p={p:.2f}: {m.model.evidence(text)}")

    def detect_by_rules(self, text: str) -> InjectionVerdict:
        """The rules alone, in file order; the first hit decides."""
        return self._by_rules(text)  # type: ignore[attr-defined,no-any-return]

    def _detect_by_rules_uncached(self, text: str) -> InjectionVerdict:
        if not text or not text.strip():
            return CLEAN
        found = self._first(self.normalise(text), decoded=False)
        if found is None:
            return CLEAN
        rule, hit = found
        return InjectionVerdict(True, rule.rule_id, rule.name, " ".join(hit.split())[:80])

    def markdown(self) -> str:
        """The rule table for documentation, generated from the rules so it cannot drift."""
        def cell(text: str) -> str:
            return text.replace("|", "\\|")  # "curl | sh" must not split a table cell

        rows = ["| id | name | rationale |", "|---|---|---|"]
        rows += [f"| {r.rule_id} | {cell(r.name)} | {cell(r.rationale)} |" for r in self.rules]
        if self.model is not None:
            m = self.model
            rows.append(f"| {m.rule_id} | {cell(m.name)} | {cell(m.rationale)} (weights "
                        f"{m.model.version}, threshold {m.model.threshold:g}) |")
        mention = ", ".join(r.rule_id for r in self.rules if r.mention_ok)
        rows += ["", f"Quoted mentions in a discussion frame pass for {mention}; every other rule "
                 "fires whatever the quoting."]
        return "\n".join(rows)

    def _is_mention(self, text: str, start: int, end: int) -> bool:
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
            return self.regex("mention_frame").search(frame) is not None
        return False
