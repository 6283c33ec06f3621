"""Load and validate `injection_rules.toml` into an immutable RuleSet.

The file's header comment describes its layout: [fragments] and [words] used as `{name}`,
`[[patterns.<group>]]` entries (`regex`, or `starts` + `then`, optional `context`), and
`[[rules]]` in evaluation order. Every problem raises RuleFileError naming the rule, or the
pattern group and the rules that read it.

A `starts` entry compiles to `\\b(?:start|...)` + then, and each start must open with literal
letters: those letters are the pattern's anchors, and the scan skips texts where no token opens
with one. The checks below are what makes that safe: a start is one balanced alternative, and
`then` may neither quantify the starts nor add a top-level `|`.
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any

from mnemoflow.agents.injection_engine import ModelRule, Rule, RuleSet
from mnemoflow.agents.injection_model import load_model
from mnemoflow.agents.injection_predicates import PREDICATES, Predicate
from mnemoflow.agents.injection_scan import FLAGS, AnchorIndex, Pattern

RULES_FILE = "injection_rules.toml"
_VERSION = 1
_TOP_KEYS = {"version", "context_window", "fragments", "words", "rules", "patterns", "model"}
_MODEL_KEYS = {"id", "name", "rationale", "file", "threshold"}
_RULE_KEYS = {"id", "name", "rationale", "patterns", "predicate", "mention_ok", "deobfuscate",
              "on_decoded"}
_ENTRY_KEYS = {"regex", "starts", "then", "context"}
_ENGINE_REGEXES = {"mention_frame": 0}  # read by RuleSet itself (the quoting policy)
_RULE_ID = re.compile(r"INJ-\d\d")
_PLACEHOLDER = re.compile(r"(?<!\\)\{([A-Za-z_]\w*)\}")  # {name}, never a {2,6} quantifier
_LEADING_LETTERS = re.compile(r"\w+")
_QUANTIFIER = ("?", "*", "+", "{")  # what can follow a regex item and quantify it


class RuleFileError(ValueError):
    """The rules file is malformed; the message names the rule or pattern at fault."""


def load_rules(path: Path | str | None = None,
               predicates: Mapping[str, Predicate] = PREDICATES, *, model: bool = True
               ) -> RuleSet:
    """Read and compile a rules file (default: the packaged one). Each call builds a new RuleSet.
    `model=False` leaves out the classifier (its trainer scores the rules alone)."""
    if path is None:
        text = resources.files("mnemoflow.agents").joinpath(RULES_FILE).read_text(encoding="utf-8")
        return parse_rules(text, predicates, RULES_FILE, model=model)
    path = Path(path)
    return parse_rules(path.read_text(encoding="utf-8"), predicates, str(path), path.parent,
                       model=model)


def parse_rules(text: str, predicates: Mapping[str, Predicate] = PREDICATES,
                source: str = "<rules>", directory: Path | None = None, *, model: bool = True
                ) -> RuleSet:
    """`directory`: where a [model] file is read from (default: this package)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise RuleFileError(f"{source}: not valid TOML: {e}") from e
    loader = _Loader(data, predicates, source)
    rules = loader.rule_set()
    table = data.get("model")
    if table is None or not model:
        return rules
    return dataclasses.replace(rules, model=loader.model_rule(table, rules, directory))


class _Loader:
    def __init__(self, data: dict[str, Any], predicates: Mapping[str, Predicate],
                 source: str) -> None:
        self.data, self.predicates, self.source = data, predicates, source
        self.used: set[str] = set()  # fragments and word lists some regex refers to

    def fail(self, where: str, problem: str) -> RuleFileError:
        return RuleFileError(f"{self.source}: {where}: {problem}")

    def text(self, value: object, where: str) -> str:
        """A string, or an array of strings joined without separators."""
        if isinstance(value, str):
            return value
        if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
            return "".join(value)
        raise self.fail(where, "expected a string or an array of strings")

    def table(self, key: str) -> dict[str, Any]:
        value = self.data.get(key, {})
        if not isinstance(value, dict):
            raise self.fail(key, "expected a table")
        return value

    def rule_set(self) -> RuleSet:
        unknown = set(self.data) - _TOP_KEYS
        if unknown:
            raise self.fail("top level", f"unknown keys {sorted(unknown)}")
        if self.data.get("version") != _VERSION:
            raise self.fail("version", f"expected {_VERSION}, got {self.data.get('version')!r}")
        window = self.data.get("context_window")
        if not isinstance(window, int) or window <= 0:
            raise self.fail("context_window", "expected a positive integer")
        self.window = window
        self.words = {name: self.word_list(words, f"word list {name!r}")
                      for name, words in self.table("words").items()}
        self.fragments = {name: self.text(value, f"fragment {name!r}")
                          for name, value in self.table("fragments").items()}
        raw_rules = self.data.get("rules")
        if not isinstance(raw_rules, list) or not raw_rules:
            raise self.fail("rules", "expected a non-empty array of [[rules]] tables")
        specs = [self.rule_spec(i, r) for i, r in enumerate(raw_rules)]
        ids = [spec["id"] for spec in specs]
        if dup := sorted({i for i in ids if ids.count(i) > 1}):
            raise self.fail(f"rule {dup[0]}", "duplicate id")
        groups = self.compile_groups(specs)
        rules = tuple(self.rule(spec, groups) for spec in specs)
        if unused := (set(self.fragments) | set(self.words)) - self.used:
            raise self.fail("fragments/words", f"defined but never used: {sorted(unused)}")
        vocab = frozenset(w for r in rules if r.deobfuscate for p in r.patterns
                          for w in re.findall(r"[a-z]{2,}", re.sub(r"\\[a-z]", " ", p.pattern)))
        index = AnchorIndex.of(a for ps in groups.values() for p in ps for a in p.anchors or ())
        return RuleSet(rules, MappingProxyType(groups),
                       MappingProxyType({k: frozenset(v) for k, v in self.words.items()}), vocab,
                       index)

    def model_rule(self, raw: object, rules: RuleSet, directory: Path | None) -> ModelRule:
        if not isinstance(raw, dict) or set(raw) != _MODEL_KEYS:
            raise self.fail("model", f"expected a table with exactly {sorted(_MODEL_KEYS)}")
        rule_id = self.text(raw["id"], "model id")
        if any(r.rule_id == rule_id for r in rules.rules):
            raise self.fail("model", f"id {rule_id!r} is also a rule's")
        threshold = raw["threshold"]
        if not isinstance(threshold, float) or not 0.0 < threshold < 1.0:
            raise self.fail("model", "threshold: expected a float between 0 and 1")
        try:
            model = load_model(self.text(raw["file"], "model file"), threshold, directory)
        except (OSError, ValueError, KeyError) as e:
            raise self.fail("model", f"cannot load {raw['file']!r}: {e}") from e
        return ModelRule(rule_id, self.text(raw["name"], "model name"),
                         self.text(raw["rationale"], "model rationale"), model)

    # ----------------------------------------------------------------------- words, fragments

    def word_list(self, words: object, where: str) -> tuple[str, ...]:
        if not isinstance(words, list) or not words:
            raise self.fail(where, "expected a non-empty array of alternatives")
        for w in words:
            if not isinstance(w, str) or not w or not _self_contained(w):
                raise self.fail(where, f"{w!r} is not one alternative (balanced, no top-level |)")
        if len(set(words)) != len(words):
            raise self.fail(where, "an alternative is listed twice")
        return tuple(words)

    def expand(self, text: str, where: str, seen: tuple[str, ...] = ()) -> str:
        def sub(m: re.Match[str]) -> str:
            name = m.group(1)
            self.used.add(name)
            if name in self.words:
                return _alternation(self.words[name])
            if name not in self.fragments:
                raise self.fail(where, f"unknown fragment {{{name}}}")
            if name in seen:
                raise self.fail(where, f"fragment {{{name}}} refers to itself")
            return self.expand(self.fragments[name], where, (*seen, name))

        return _PLACEHOLDER.sub(sub, text)

    # ----------------------------------------------------------------------- rules

    def rule_spec(self, i: int, raw: object) -> dict[str, Any]:
        if not isinstance(raw, dict):
            raise self.fail(f"rules[{i}]", "expected a table")
        rule_id = raw.get("id")
        where = f"rule {rule_id}" if isinstance(rule_id, str) else f"rules[{i}]"
        if not isinstance(rule_id, str) or not _RULE_ID.fullmatch(rule_id):
            raise self.fail(where, f"id {rule_id!r} is not of the form INJ-00")
        if unknown := set(raw) - _RULE_KEYS:
            raise self.fail(where, f"unknown keys {sorted(unknown)}")
        for key in ("name", "rationale"):
            if not isinstance(raw.get(key), str) or not raw[key].strip():
                raise self.fail(where, f"{key} must be a non-empty string")
        for key in ("patterns", "predicate"):
            if key in raw and not isinstance(raw[key], str):
                raise self.fail(where, f"{key} must be a name")
        for key in ("mention_ok", "deobfuscate", "on_decoded"):
            if key in raw and not isinstance(raw[key], bool):
                raise self.fail(where, f"{key} must be true or false")
        if "patterns" not in raw and "predicate" not in raw:
            raise self.fail(where, "needs patterns, a predicate, or both")
        if "predicate" in raw and raw["predicate"] not in self.predicates:
            raise self.fail(where, f"unknown predicate {raw['predicate']!r} "
                                   f"(registered: {sorted(self.predicates)})")
        return raw

    def users(self, specs: list[dict[str, Any]]) -> dict[str, list[str]]:
        """Group name -> the rules (and the engine) that read it, for error messages."""
        users: dict[str, list[str]] = {name: ["the quoting policy"] for name in _ENGINE_REGEXES}
        for spec in specs:
            names = [spec["patterns"]] if "patterns" in spec else []
            if "predicate" in spec:
                need = self.predicates[spec["predicate"]]
                names += [*need.groups, *need.regexes]
            for name in names:
                users.setdefault(name, []).append(f"rule {spec['id']}")
        return users

    def rule(self, spec: dict[str, Any], groups: Mapping[str, tuple[Pattern, ...]]) -> Rule:
        name = spec.get("predicate")
        predicate = self.predicates[name] if name else None
        for words in predicate.words if predicate else ():
            if words not in self.words:
                raise self.fail(f"rule {spec['id']} (predicate {name})",
                                f"needs the word list {words!r}")
            self.used.add(words)
        return Rule(spec["id"], spec["name"], spec["rationale"],
                    groups[spec["patterns"]] if "patterns" in spec else (), predicate, name,
                    spec.get("mention_ok", False), spec.get("deobfuscate", False),
                    spec.get("on_decoded", True))

    # ----------------------------------------------------------------------- patterns

    def compile_groups(self, specs: list[dict[str, Any]]) -> dict[str, tuple[Pattern, ...]]:
        raw, users = self.table("patterns"), self.users(specs)
        for name, who in users.items():
            if name not in raw:
                raise self.fail(", ".join(who), f"needs the pattern group {name!r}")
        if unused := set(raw) - set(users):
            raise self.fail("patterns", f"groups no rule reads: {sorted(unused)}")
        groups: dict[str, tuple[Pattern, ...]] = {}
        for name, entries in raw.items():
            who = ", ".join(users[name])
            if not isinstance(entries, list) or not entries:
                raise self.fail(f"{who}: pattern group {name!r}", f"expected [[patterns.{name}]]")
            groups[name] = tuple(self.pattern(e, f"{who}: pattern {name}[{i}]")
                                 for i, e in enumerate(entries))
        needs = [("the quoting policy", _ENGINE_REGEXES)]
        needs += [(f"rule {spec['id']}", self.predicates[spec["predicate"]].regexes)
                  for spec in specs if "predicate" in spec]
        for who, regexes in needs:
            for name, n_groups in regexes.items():
                (first, *more) = groups[name]
                if more or first.anchors is not None or first.context is not None \
                        or first.rx.groups < n_groups:
                    raise self.fail(f"{who}: pattern group {name!r}",
                                    f"must be one plain `regex` with at least {n_groups} "
                                    "capture group(s)")
        return groups

    def pattern(self, entry: object, where: str) -> Pattern:
        if not isinstance(entry, dict):
            raise self.fail(where, "expected a table")
        if unknown := set(entry) - _ENTRY_KEYS:
            raise self.fail(where, f"unknown keys {sorted(unknown)}")
        if ("regex" in entry) == ("starts" in entry):
            raise self.fail(where, "needs exactly one of `regex` or `starts`")
        anchors = None
        if "starts" in entry:
            starts = entry["starts"]
            if isinstance(starts, str):
                if starts not in self.words:
                    raise self.fail(where, f"unknown word list {starts!r}")
                self.used.add(starts)
                words = self.words[starts]
            else:
                words = self.word_list(starts, where + " starts")
            then = self.expand(self.text(entry.get("then", ""), where + " then"), where)
            if then.startswith(_QUANTIFIER) or not _self_contained(then):
                # `(?:starts)?...` or `(?:starts)|...` would let a match open without a start
                raise self.fail(where, "`then` must be balanced, and must not quantify the starts "
                                       "or add a top-level |")
            source = r"\b" + _alternation(words) + then
            anchors = frozenset(self.anchor(w, where) for w in words)
        else:
            if "then" in entry or "context" in entry:
                raise self.fail(where, "`then` and `context` need `starts` (the context is "
                                       "checked where an anchor opens a match)")
            source = self.expand(self.text(entry["regex"], where + " regex"), where)
        context = None
        if "context" in entry:
            context = self.compile(
                "(?:" + self.expand(self.text(entry["context"], where + " context"), where) + r")\Z",
                where + " context")
        return Pattern(self.compile(source, where), anchors, context, self.window)

    def anchor(self, start: str, where: str) -> str:
        """The literal letters every match of `start` opens with (a quantified last one dropped)."""
        m = _LEADING_LETTERS.match(start)
        letters = m.group() if m else ""
        if start[len(letters):len(letters) + 1] in _QUANTIFIER:
            letters = letters[:-1]
        if not letters or letters != letters.casefold():
            raise self.fail(where, f"start {start!r} must open with casefolded literal letters")
        return letters

    def compile(self, source: str, where: str) -> re.Pattern[str]:
        try:
            return re.compile(source, FLAGS)
        except re.error as e:
            raise self.fail(where, f"bad regex ({e}): {source[:120]!r}") from e


def _alternation(words: tuple[str, ...]) -> str:
    return "(?:" + "|".join(w.replace(" ", r"\s+") for w in words) + ")"


def _self_contained(alternative: str) -> bool:
    """Balanced parentheses and no top-level `|`: it stays one alternative inside `(?:...)`."""
    depth, i, in_class = 0, 0, False
    while i < len(alternative):
        c = alternative[i]
        if c == "\\":
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
            i += 1 + alternative.startswith("^", i + 1)
            i += alternative.startswith("]", i)  # a leading ] is a literal inside the class
            continue
        elif c in "()":
            depth += 1 if c == "(" else -1
            if depth < 0:
                return False
        elif c == "|" and depth == 0:
            return False
        i += 1
    return depth == 0 and not in_class
