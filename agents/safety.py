"""G-03 safety gate before the broker: memory is reference material, never a new instruction.

Checked per kept item: another scope -> suppress(scope); revoked -> suppress(revoked);
instruction-like text (the rules, then the classifier; procedures by the rules alone) ->
suppress(injection); a high-risk procedure -> ask. Unsafe items are
dropped with their reason; the packet verdict is `ask` if a high-risk procedure remains,
`suppress` if nothing remains, else `allow`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mnemoflow.agents.candidate import scope_chain
from mnemoflow.agents.injection_rules import RuleSet, default_rules
from mnemoflow.agents.rank import Ranked


@dataclass(frozen=True)
class ItemVerdict:
    ranked: Ranked
    action: str  # allow | suppress | ask
    reason: str  # ok | scope | revoked | injection:<rule> | high-risk


@dataclass(frozen=True)
class SafetyVerdict:
    action: str  # allow | suppress | ask
    reason: str
    items: tuple[ItemVerdict, ...]

    @property
    def allowed(self) -> tuple[Ranked, ...]:
        return tuple(v.ranked for v in self.items if v.action == "allow")


def check_item(r: Ranked, chain: frozenset[tuple[str, str]], rules: RuleSet) -> ItemVerdict:
    c = r.candidate
    if (c.scope, c.owner) not in chain:
        return ItemVerdict(r, "suppress", "scope")
    if c.revoked:
        return ItemVerdict(r, "suppress", "revoked")
    # a procedure is a checklist learned from the user's own runs, imperative by design and
    # gated by its stage and risk (`ask`); the classifier, which scores imperatives aimed at
    # the model, would read every one as an order, so only the rules judge it
    inj = rules.detect_by_rules(c.text) if c.kind == "procedure" else rules.detect(c.text)
    if inj.flagged:
        return ItemVerdict(r, "suppress", f"injection:{inj.rule_id}")
    if c.kind == "procedure" and c.risk_level == "high":
        return ItemVerdict(r, "ask", "high-risk")
    return ItemVerdict(r, "allow", "ok")


def check(kept: Sequence[Ranked], request: dict[str, Any],
          rules: RuleSet | None = None) -> SafetyVerdict:
    """`rules`: the injection rule set the caller holds (default: the packaged one)."""
    chain = scope_chain(request)
    rules = rules or default_rules()
    items = tuple(check_item(r, chain, rules) for r in kept)
    if any(v.action == "ask" for v in items):
        return SafetyVerdict("ask", "high-risk-procedure", items)
    if not any(v.action == "allow" for v in items):
        first = next((v.reason for v in items if v.action != "allow"), "empty")
        return SafetyVerdict("suppress", first.split(":")[0], items)
    return SafetyVerdict("allow", request["reason"], items)
