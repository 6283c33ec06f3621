"""Instruction-like memory detector for the safety gate (G-03): a documented rule set, no model.

A memory is reference material. Text that addresses the assistant with new orders (override
prior instructions, impersonate a system role, exfiltrate secrets, force a tool or a shell
command, hide instructions) is suppressed before it can reach a request. Reported speech in
the past tense about such attacks is allowed only when it carries no imperative aimed at the
assistant; when in doubt the gate suppresses (a missed memory costs less than an injection).
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

ZERO_WIDTH = re.compile("[\u200b\u200c\u200d\u2060\ufeff\u00ad]")


@dataclass(frozen=True)
class Rule:
    rule_id: str
    name: str
    rationale: str
    pattern: re.Pattern[str]


@dataclass(frozen=True)
class InjectionVerdict:
    flagged: bool
    rule_id: str | None = None
    rule_name: str | None = None
    evidence: str | None = None


def _r(p: str) -> re.Pattern[str]:
    return re.compile(p, re.I | re.S)


RULES: tuple[Rule, ...] = (
    Rule("INJ-01", "override prior instructions",
         "orders to drop the instructions in force are the classic prompt injection",
         _r(r"\b(ignore|disregard|forget|override|bypass|skip)\s+(all\s+|any\s+|the\s+|your\s+|"
            r"every\s+)?(previous|prior|above|earlier|preceding|original|system|existing)?\s*"
            r"(instructions?|prompts?|rules|directives|guidelines|guardrails|constraints)\b"
            r"|ignoriere\s+(alle\s+)?(vorherigen|bisherigen)\s+anweisungen"
            r"|ignore[zr]?\s+(toutes\s+)?les\s+instructions\s+pr[ée]c[ée]dentes"
            r"|ignora\s+(todas\s+)?las\s+instrucciones\s+anteriores"
            r"|忽略(之前|以上|先前|所有)(的)?(所有)?(指令|指示|说明)")),
    Rule("INJ-02", "role or system impersonation",
         "memory text must not pose as a system/developer turn or re-define the assistant",
         _r(r"(^|\n)\s*(system|developer|assistant)\s*:\s|<\|im_start\|>|<\|system\|>|\[/?INST\]"
            r"|###\s*(instruction|system)|\byou\s+are\s+now\s+(in\s+)?(a|an|the|dan|developer|"
            r"jailbreak|unrestricted|no longer)|\bact\s+as\s+(dan|an?\s+unrestricted)|"
            r"\bdeveloper\s+mode\s+(enabled|on)\b|\bjailbreak(ed)?\b")),
    Rule("INJ-03", "exfiltration request",
         "asks to send secrets or private data somewhere are never memory content",
         _r(r"\b(send|post|upload|forward|email|e-mail|leak|exfiltrate|transmit|paste)\b[^.\n]{0,60}"
            r"\b(api[\s_-]?keys?|passwords?|secrets?|tokens?|credentials?|private\s+keys?|"
            r"ssh\s+keys?|env(ironment)?\s+variables?|\.env|system\s+prompt)\b[^.\n]{0,60}"
            r"(\bto\b|https?://|@)")),
    Rule("INJ-04", "forced tool call or shell command",
         "a memory must never make the agent run something because it looks similar",
         _r(r"\b(run|execute|exec|invoke|call|trigger)\s+(the\s+following|this)\s+(command|code|"
            r"script|tool)|\bcurl\s+[^|\n]+\|\s*(ba|z)?sh\b|\bwget\s+[^|\n]+\|\s*(ba|z)?sh\b"
            r"|\b(now|immediately|right away)\s+(run|execute|call|invoke)\b"
            r"|\b(you\s+must|you\s+should|please)\s+(run|execute)\s+`?(rm\s+-rf|sudo|chmod|"
            r"curl|wget|deploy)")),
    Rule("INJ-05", "standing order to the assistant",
         "stale imperatives aimed at the AI would be read as new commands",
         _r(r"\bfrom\s+now\s+on,?\s+(you|the\s+assistant|ai)\s+(will|must|should|shall)\b"
            r"|\b(the\s+)?(assistant|ai|model|chatbot)\s+(must|shall)\s+(always|never)\b"
            r"|\bdo\s+not\s+(tell|inform|reveal\s+to|let)\s+the\s+user\b"
            r"|\bwithout\s+telling\s+the\s+user\b|\bnew\s+instructions?\s*:")),
    Rule("INJ-06", "hidden or encoded instructions",
         "instructions hidden in markup, comments or encodings target the model, not the reader",
         _r(r"<!--[^>]{0,200}(instruction|ignore|assistant|system|prompt)[^>]{0,200}-->"
            r"|\b(decode|base64\s*-d)\b[^.\n]{0,40}\b(and\s+)?(run|execute|follow)\b"
            r"|display\s*:\s*none[^>]{0,100}(instruction|ignore|assistant)")),
    Rule("INJ-07", "fake tool or function-call markup",
         "forged call markup could be parsed as a real tool call",
         _r(r"<\s*(tool_call|function_call|invoke|tool_use)\b|\"(tool_calls|function_call)\"\s*:")),
)


def normalise(text: str) -> tuple[str, bool]:
    """NFKC, zero-width characters removed (their presence is reported), whitespace folded."""
    t = unicodedata.normalize("NFKC", text)
    hidden = bool(ZERO_WIDTH.search(t))
    t = ZERO_WIDTH.sub("", t)
    return re.sub(r"[ \t]+", " ", t), hidden


def detect_injection(text: str) -> InjectionVerdict:
    t, hidden = normalise(text)
    for rule in RULES:
        m = rule.pattern.search(t)
        if m:
            return InjectionVerdict(True, rule.rule_id, rule.name, m.group(0).strip()[:80])
    if hidden and re.search(r"\b(ignore|instruction|assistant|system|execute)\b", t, re.I):
        return InjectionVerdict(True, "INJ-06", "hidden or encoded instructions", "zero-width")
    return InjectionVerdict(False)


def rules_markdown() -> str:
    rows = ["| id | rule | why |", "|---|---|---|"]
    rows += [f"| {r.rule_id} | {r.name} | {r.rationale} |" for r in RULES]
    return "\n".join(rows)
