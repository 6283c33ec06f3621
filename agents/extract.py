"""Rule-based memory extraction from user text (no LLM): preferences, "my X is Y", notes,
corrections, terminology, and aliases (M-05). An `Extractor` is any callable with this
signature, so an LLM-based one can be plugged in later (`extract_memories(seg, extractors)`);
hosts can also write memories directly through the SDK (`HostClient.remember` and friends).

Every extracted memory names the segment it came from in `attributes["sources"]`, so that
revoking the segment revokes what was extracted from it unless something else still backs it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mnemoflow.agents.ids import stable_id
from mnemoflow.agents.memory_events import alias_id, json_list, memory_event
from mnemoflow.agents.text import STOPWORDS

Extractor = Callable[[dict[str, Any]], list[dict[str, Any]]]

_END = r"(?=[.!?;\n]|$)"
_SPEAKER = re.compile(r"^[A-Z][\w'’\- ]{0,30}:\s+")  # "Caroline: ..." in shared chats


@dataclass(frozen=True)
class Rule:
    name: str
    category: str  # profile | project | terminology | note
    pattern: re.Pattern[str]
    predicate: str


RULES: tuple[Rule, ...] = (
    Rule("correction", "profile", re.compile(
        r"\b(?:actually|correction:?|no,)\s*,?\s*my\s+(?P<subject>[\w' ]{2,40}?)\s+(?:is|are|was)\s+"
        r"(?P<object>[^.!?;\n]{1,80})" + _END, re.I), "is"),
    Rule("my-x-is", "profile", re.compile(
        r"\bmy\s+(?P<subject>[\w' ]{2,40}?)\s+(?:is|are)\s+(?!a bit|kind of|so\b|very\b|really\b)"
        r"(?P<object>[^.!?;\n]{1,80})" + _END, re.I), "is"),
    Rule("prefer", "profile", re.compile(
        r"\bI\s+(?:really\s+)?(?P<predicate>prefer|love|like|enjoy|hate|dislike|can't stand)\s+"
        r"(?P<object>[^.!?;\n]{2,80})" + _END, re.I), ""),
    Rule("remember", "note", re.compile(
        r"\b(?:please\s+)?remember\s+(?:that\s+)?(?P<object>[^.!?;\n]{3,160})" + _END, re.I),
        "remember"),
    Rule("we-use", "project", re.compile(
        r"\b(?:we|the project|our team)\s+(?:use|uses|deploy with|build with)\s+"
        r"(?P<object>[^.!?;\n]{2,80})" + _END, re.I), "uses"),
    Rule("means", "terminology", re.compile(
        r"\b(?P<subject>[A-Z][\w\-]{1,20})\s+(?:means|stands for)\s+(?P<object>[^.!?;\n]{2,80})"
        + _END), "means"),
)


def extract_facts(seg: dict[str, Any]) -> list[dict[str, Any]]:
    """Facts proposed by the user's own words (source user); never from assistant text."""
    if seg["kind"] != "user" or not seg["text"]:
        return []
    text = _SPEAKER.sub("", seg["text"])
    env = seg["envelope"]
    out: list[dict[str, Any]] = []
    seen: set[tuple[str, str]] = set()
    for rule in RULES:
        for m in rule.pattern.finditer(text):
            d = m.groupdict()
            subject = (d.get("subject") or "user").strip().casefold()
            predicate = (d.get("predicate") or rule.predicate).strip().casefold()
            obj = d["object"].strip()
            key = (subject, predicate)
            if key in seen:  # one value per subject and message; a correction comes first
                continue
            seen.add(key)
            out.append({
                "eventId": stable_id("mem", seg["segmentId"], "fact", subject, predicate),
                "op": "fact_proposed",
                "memoryId": stable_id("fact", seg["userId"], subject, predicate, obj.casefold()),
                "kind": "fact", "scope": "User", "owner": seg["userId"],
                "sessionId": env["sessionId"], "eventSeq": env["eventSeq"],
                "eventTime": seg["eventTime"], "text": f"{subject} {predicate} {obj}",
                "entities": seg["entities"], "provenance": [seg["provenance"]], "source": "user",
                "confidence": 0.8, "ttlMs": None, "subject": subject, "predicate": predicate,
                "object": obj, "riskLevel": None,
                "attributes": {"category": rule.category, "rule": rule.name,
                               "correction": "1" if rule.name == "correction" else "0",
                               "sources": json_list([seg["segmentId"]])},
                "sealed": None,
            })
    return out


# ---------------------------------------------------------------------------- aliases (M-05)

ALIAS_PRIOR = 0.3  # the lexical index weighs alias hits the same way (ALIAS_PRIOR there)
SELF = "user"  # the word extracted facts use for the speaker ("user prefer ...")
# possessive runs and a start that is not inside a word: each match attempt is then linear,
# where backtracking over a long run of word characters was quadratic (20 kB of digits: 59 s)
_PHRASE = r"(?<![\w'\-])[A-Z0-9][\w'\-]*+(?:\s+[A-Z0-9][\w'\-]*+){0,3}"
_ALIAS_RULES: tuple[tuple[str, re.Pattern[str], bool], ...] = (
    # (rule, pattern with groups a/b, revoke?)
    ("not-mean", re.compile(r"\b(?P<a>[A-Z][\w\-]{1,20})\s+(?:doesn't|does not|no longer)\s+"
                            r"(?:mean|means|stand for|stands for)\s+(?P<b>[^.!?;,\n]{2,60})" + _END),
     True),
    ("stands-for", re.compile(r"\b(?P<a>[A-Z][\w\-]{1,20})\s+(?:stands for|is short for|"
                              r"is an abbreviation for)\s+(?P<b>[^.!?;,\n]{2,60})" + _END), False),
    ("means", re.compile(r"\b(?P<a>[A-Z][\w\-]{1,20})\s+means\s+(?P<b>[^.!?;,\n]{2,60})" + _END),
     False),
    ("aka", re.compile(r"(?P<a>" + _PHRASE + r")\s*,?\s+(?i:aka|a\.k\.a\.?|also known as)\s+"
                       r"(?P<b>" + _PHRASE + r"|[a-z][\w\-]*)"), False),
    ("not-call-me", re.compile(r"\b(?i:don't|do not|stop|never)\s+(?i:call(?:ing)?\s+me)\s+"
                               r"(?P<a>[A-Z][\w'\-]*(?:\s+[A-Z][\w'\-]*){0,2})"), True),
    ("call-me", re.compile(r"\b(?i:call me|I go by|my name is)\s+"
                           r"(?P<a>[A-Z][\w'\-]*(?:\s+[A-Z][\w'\-]*){0,2})"), False),
)
_PAREN = re.compile(r"(?<![\w'\-])((?:[\w'\-]++\s+){0,7}[\w'\-]++)\s*\(([^()\n]{2,60})\)")
_ACRONYM = re.compile(r"^[A-Z][A-Za-z0-9]{1,7}$")
_INITIAL_SKIP = frozenset("of and for the a an to in on".split())


def _is_acronym(word: str) -> bool:
    return bool(_ACRONYM.match(word)) and sum(c.isupper() for c in word) >= 2


def _initials_match(acronym: str, words: list[str]) -> bool:
    letters = "".join(w[0] for w in words if w.casefold() not in _INITIAL_SKIP)
    return len(words) >= 2 and letters.casefold() == acronym.casefold()


def _paren_pairs(text: str) -> list[tuple[str, str]]:
    """"Site Reliability Engineering (SRE)" and "SRE (site reliability engineering)": only
    when the acronym's letters are the other side's initials, so "(again)" is never an alias."""
    out = []
    for m in _PAREN.finditer(text):
        before, inner = m.group(1).split(), m.group(2).strip()
        if _is_acronym(inner):
            for n in range(2, len(before) + 1):
                words = before[-n:]
                while words and words[0].casefold() in _INITIAL_SKIP:
                    words = words[1:]
                if _initials_match(inner, words):
                    out.append((inner, " ".join(words)))
                    break
        elif before and _is_acronym(before[-1]) and _initials_match(before[-1], inner.split()):
            out.append((before[-1], inner))
    return out


def _clean(phrase: str) -> str:
    return " ".join(phrase.strip(" \"'“”‘’").split())


def _usable(alias: str, target: str) -> bool:
    a, t = alias.casefold(), target.casefold()
    return (bool(a) and bool(t) and a != t and a not in STOPWORDS and t not in STOPWORDS
            and len(t.split()) <= 6 and len(a.split()) <= 6)


def extract_aliases(seg: dict[str, Any]) -> list[dict[str, Any]]:
    """M-05 from the user's own words: "X means/stands for Y", "X aka Y", "Long Name (LN)",
    "call me X" (X -> the speaker, "user"), and their revocations ("X doesn't mean Y",
    "don't call me X"). An alias is a scoped, low-prior query expansion: it never edits a
    memory's text and never touches any confidence. Synonyms go both ways."""
    if seg["kind"] != "user" or not seg["text"]:
        return []
    text = _SPEAKER.sub("", seg["text"])
    found: dict[tuple[str, str], tuple[str, str, str, bool]] = {}  # key -> alias, target, rule, revoke

    def keep(x: str, y: str, rule: str, revoke: bool) -> None:
        key = (x.casefold(), y.casefold())
        if _usable(x, y) and key not in found:
            found[key] = (x, y, rule, revoke)

    for rule, pattern, revoke in _ALIAS_RULES:
        for m in pattern.finditer(text):
            a = _clean(m.group("a"))
            if rule in ("call-me", "not-call-me"):
                keep(a, SELF, rule, revoke)
                continue
            b = _clean(m.group("b"))
            keep(a, b, rule, revoke)
            keep(b, a, rule, revoke)
    for a, b in _paren_pairs(text):
        keep(a, b, "acronym", False)
        keep(b, a, "acronym", False)
    env = seg["envelope"]
    out = []
    for (ka, kb), (alias, target, rule, revoke) in found.items():
        op = "alias_revoked" if revoke else "alias_added"
        out.append(memory_event(
            event_id=stable_id("mem", seg["segmentId"], op, ka, kb), op=op,
            memory_id=alias_id("User", seg["userId"], alias, target), kind="alias",
            scope="User", owner=seg["userId"], session_id=env["sessionId"],
            event_seq=env["eventSeq"], event_time=seg["eventTime"], text=f"{alias} = {target}",
            provenance=[seg["provenance"]], source="user", confidence=ALIAS_PRIOR,
            subject=alias, object_=target,
            attributes={"rule": rule, "sources": json_list([seg["segmentId"]])}))
    return out


DEFAULT_EXTRACTORS: tuple[Extractor, ...] = (extract_facts, extract_aliases)


def extract_memories(seg: dict[str, Any],
                     extractors: tuple[Extractor, ...] = DEFAULT_EXTRACTORS) -> list[dict[str, Any]]:
    """Everything the extractors propose for one segment, in extractor order."""
    return [ev for ex in extractors for ev in ex(seg)]
