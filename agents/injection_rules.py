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

The rules are data: `injection_rules.toml` beside this module holds the patterns and the rule
metadata; the checks that need code are predicates registered by name
(injection_predicates.py). `load_rules()` compiles the file into an immutable RuleSet: hold one
and pass it (`rules.detect(text)`). Normalisation is in injection_normalise.py, the anchored
scan in injection_scan.py. Everything is pure and deterministic.
"""

from __future__ import annotations

from functools import cache

from mnemoflow.agents.injection_engine import InjectionVerdict, Rule, RuleSet
from mnemoflow.agents.injection_loader import RuleFileError, load_rules, parse_rules
from mnemoflow.agents.injection_normalise import NormalisedText

__all__ = ["InjectionVerdict", "NormalisedText", "Rule", "RuleFileError", "RuleSet",
           "default_rules", "detect_injection", "load_rules", "normalise", "parse_rules",
           "rules_markdown"]


@cache
def default_rules() -> RuleSet:
    """The packaged rule set, loaded on first use: only for callers that hold no RuleSet."""
    return load_rules()


def detect_injection(text: str, rules: RuleSet | None = None) -> InjectionVerdict:
    """Check one memory text; rules run in file order and the first hit decides."""
    return (rules or default_rules()).detect(text)


def normalise(text: str, rules: RuleSet | None = None) -> NormalisedText:
    """The views the rules read (the de-obfuscated one aims at `rules`' vocabulary)."""
    return (rules or default_rules()).normalise(text)


def rules_markdown(rules: RuleSet | None = None) -> str:
    """The rule table for documentation, generated from the rules so it cannot drift."""
    return (rules or default_rules()).markdown()


def __getattr__(name: str) -> object:
    """`RULES`, the rule tuple of the default set, for callers written before RuleSet."""
    if name == "RULES":
        return default_rules().rules
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
