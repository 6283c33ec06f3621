"""Rule-based memory extraction from user text (no LLM): preferences, "my X is Y", notes,
corrections, terminology. An `Extractor` is any callable with this signature, so an LLM-based
one can be plugged in later; hosts can also write memories directly through the SDK.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mnemoflow.agents.ids import stable_id

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
                               "correction": "1" if rule.name == "correction" else "0"},
            })
    return out
