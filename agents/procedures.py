"""M-04 procedural memory: tool sequences that worked, promoted only on outcome evidence.

A procedure is the ordered tool sequence of an episode (one turn of tool work, retries
collapsed), identified by (scope, owner, steps). Its stages are

    observed -> candidate -> validated -> active        (and back down, one stage at a time)
                                   any -> deprecated     (terminal)

Rules (evidence counts only live evidence: runs whose episodes were revoked do not count):

* observed:  one run seen (success or failure).
* candidate: successful runs in >= 2 independent sessions. One success, or any number of
  repeats inside one session, is not enough (a session can repeat its own mistake).
* validated: successful runs in >= 3 sessions and >= 70 % of all outcomes successful. A
  high-risk procedure that requires approval stops at candidate and asks (once) until a
  `procedure_approved` event from the user or host arrives.
* active:    validated, plus reuse evidence (G-01): the agent succeeded after the procedure
  was delivered, in >= 2 sessions, more often than it failed.
* demotion (the reversible part): validated/active fall one stage when two of the last four
  outcomes failed and the last one failed, or when the stage's own requirement no longer holds
  on live evidence. Promotion also needs the last outcome to be a success, so a demoted
  procedure only climbs back on new success evidence (no flapping).
* deprecated: >= 4 failures with a success rate under 40 %, an explicit revocation, or no
  live evidence left. Deprecated procedures are never recalled again.

Only validated and active procedures are recallable, and only ever as a checklist (the broker
picks strength `checklist`); a high-risk one makes the safety gate ask. Nothing here runs a
tool: SSH/deploy/delete-like steps are never executed because a memory looks similar.

Pure: every function returns a new Procedure; the memory-log fold (agents.procedure_fold)
applies events with them and consolidation plans transitions with them, so both agree by
construction.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from mnemoflow.agents.episodes import Episode
from mnemoflow.agents.ids import digest_of, stable_id

STAGES = ("observed", "candidate", "validated", "active", "deprecated")
RANK = {s: i for i, s in enumerate(STAGES)}
RECALLABLE = frozenset({"validated", "active"})

MIN_STEPS = 2
CANDIDATE_SESSIONS = 2
VALIDATED_SESSIONS = 3
VALIDATED_SUCCESS_RATE = 0.7
ACTIVE_REUSE_SESSIONS = 2
RECENT_WINDOW = 4
UNHEALTHY_RECENT_FAILURES = 2
DEPRECATE_MIN_FAILURES = 4
DEPRECATE_MAX_RATE = 0.4
EVIDENCE_CAP = 256  # newest evidence kept per procedure; older runs stop counting

# Risk is read from the tool names (the steps), never from the user's wording: tools are
# what have side effects. Tokens are split on punctuation and camelCase.
HIGH_RISK = frozenset("""
ssh scp sftp rsh telnet rsync remote deploy deployment release publish rollout rollback
provision delete del remove rm rmdir unlink erase wipe purge drop truncate destroy terminate
kill shutdown reboot mkfs overwrite reset force sudo su chmod chown pay payment transfer
charge refund purchase terraform kubectl helm prod production migrate migration
""".split())
MEDIUM_RISK = frozenset("""
write edit create update patch put post insert commit push merge install uninstall upgrade
move mv rename copy cp restart stop start exec execute run shell bash sh zsh cmd powershell
terminal send email mail upload apply
""".split())

_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_SPLIT = re.compile(r"[^A-Za-z0-9]+")


def _words(name: str) -> list[str]:
    return [w.casefold() for part in _SPLIT.split(name) for w in _CAMEL.split(part) if w]


def step_risk(step: str) -> str:
    words = set(_words(step))
    if words & HIGH_RISK:
        return "high"
    if words & MEDIUM_RISK:
        return "medium"
    return "low"


def classify_risk(steps: Iterable[str]) -> str:
    """The highest risk of any step: one deploy makes the whole procedure high risk."""
    risks = {step_risk(s) for s in steps}
    return "high" if "high" in risks else "medium" if "medium" in risks else "low"


@dataclass(frozen=True)
class Evidence:
    key: str  # a run: "sessionId#turn"; reuse/dispute: the memory event's id
    kind: str  # run | reuse | dispute
    session_id: str
    outcome: str  # success | failure
    event_time: int
    sources: tuple[str, ...] = ()  # episode memory ids behind a run
    entities: tuple[str, ...] = ()
    failed_steps: tuple[str, ...] = ()  # tools that failed during the run
    revoked: bool = False


@dataclass(frozen=True)
class Transition:
    from_stage: str
    to_stage: str
    event_id: str
    event_time: int
    reason: str
    evidence: tuple[str, ...] = ()


@dataclass(frozen=True)
class Procedure:
    procedure_id: str
    scope: str
    owner: str
    steps: tuple[str, ...]
    intent: str = ""
    preconditions: tuple[str, ...] = ()
    checks: tuple[str, ...] = ()
    success_criteria: tuple[str, ...] = ()
    rollback: tuple[str, ...] = ()  # never inferred without a model; hosts may supply one
    risk_level: str = "low"
    requires_approval: bool = False
    stage: str = "observed"
    evidence: tuple[Evidence, ...] = ()
    history: tuple[Transition, ...] = ()
    approved: bool = False
    approval_requested: bool = False

    @property
    def recallable(self) -> bool:
        return self.stage in RECALLABLE


@dataclass(frozen=True)
class Stats:
    """What the rules look at, over live evidence only."""

    success_sessions: int
    ok: int
    fail: int
    reuse_ok: int
    reuse_fail: int
    reuse_ok_sessions: int
    runs: int
    recent: tuple[str, ...]  # outcomes of the newest RECENT_WINDOW items, oldest first

    @property
    def rate(self) -> float:
        return self.ok / (self.ok + self.fail) if self.ok + self.fail else 0.0


@dataclass(frozen=True)
class Decision:
    action: str  # move | ask
    to_stage: str
    reason: str


def procedure_id(scope: str, owner: str, steps: Sequence[str]) -> str:
    return stable_id("proc", scope, owner, *steps)


def live(p: Procedure) -> list[Evidence]:
    return sorted((e for e in p.evidence if not e.revoked), key=lambda e: (e.event_time, e.key))


def stats(p: Procedure) -> Stats:
    ev = live(p)
    ok = [e for e in ev if e.outcome == "success"]
    reuse_ok = [e for e in ok if e.kind == "reuse"]
    reuse_fail = [e for e in ev if e.kind == "reuse" and e.outcome == "failure"]
    return Stats(
        success_sessions=len({e.session_id for e in ok if e.kind == "run"}),
        ok=len(ok), fail=len(ev) - len(ok), reuse_ok=len(reuse_ok), reuse_fail=len(reuse_fail),
        reuse_ok_sessions=len({e.session_id for e in reuse_ok}),
        runs=sum(1 for e in ev if e.kind == "run"),
        recent=tuple(e.outcome for e in ev[-RECENT_WINDOW:]))


def confidence(p: Procedure) -> float:
    """Laplace-smoothed success share of live evidence: bounded in (0, 1), 0.5 with none."""
    s = stats(p)
    return round((1 + s.ok) / (2 + s.ok + s.fail), 4)


def _derive(p: Procedure) -> Procedure:
    """Checks, preconditions and success criteria follow from the live evidence, without a
    model: a check for every step that failed in some run, the entities every successful run
    shared as preconditions, the last step's success as the criterion."""
    ev = live(p)
    failed = {s for e in ev for s in e.failed_steps}
    checks = tuple(f"{s} has failed before" for s in dict.fromkeys(p.steps) if s in failed)
    ok_runs = [e for e in ev if e.kind == "run" and e.outcome == "success"]
    common: list[str] = []
    if ok_runs:
        common = [x for x in ok_runs[0].entities if all(x in e.entities for e in ok_runs[1:])]
    return replace(p, checks=checks, preconditions=tuple(common[:5]),
                   success_criteria=(f"{p.steps[-1]} succeeds",) if p.steps else ())


def new_procedure(ep: Episode) -> Procedure:
    risk = classify_risk(ep.actions)
    return Procedure(procedure_id=procedure_id(ep.scope, ep.owner, ep.actions), scope=ep.scope,
                     owner=ep.owner, steps=ep.actions, intent=ep.intent, risk_level=risk,
                     requires_approval=risk == "high")


def _add(p: Procedure, e: Evidence) -> Procedure:
    if any(x.key == e.key for x in p.evidence):
        return p
    ev = sorted((*p.evidence, e), key=lambda x: (x.event_time, x.key))[-EVIDENCE_CAP:]
    return _derive(replace(p, evidence=tuple(ev)))


def run_evidence(ep: Episode) -> Evidence:
    return Evidence(key=ep.key, kind="run", session_id=ep.session_id, outcome=ep.outcome,
                    event_time=ep.event_time, sources=ep.episode_ids, entities=ep.entities[:8],
                    failed_steps=tuple(dict.fromkeys(t for t, _ in ep.failures)))


def observe_episode(p: Procedure | None, ep: Episode,
                    revoked: frozenset[str] = frozenset()) -> Procedure:
    """Add one run as evidence (idempotent by run key). A run built on a revoked episode is
    kept for the record but never counts."""
    if p is None:
        p = new_procedure(ep)
    if not p.intent and ep.intent and ep.outcome == "success":
        p = replace(p, intent=ep.intent)
    e = run_evidence(ep)
    if revoked & set(e.sources):
        e = replace(e, revoked=True)
    return _add(p, e)


def add_outcome(p: Procedure, key: str, kind: str, session_id: str, outcome: str,
                event_time: int) -> Procedure:
    """Reuse evidence (a tool outcome after the procedure was delivered) or a user dispute."""
    return _add(p, Evidence(key=key, kind=kind, session_id=session_id, outcome=outcome,
                            event_time=event_time))


def revoke_sources(p: Procedure, revoked_id: str) -> Procedure:
    """Runs built on a revoked episode stop counting."""
    if not any(revoked_id in e.sources and not e.revoked for e in p.evidence):
        return p
    ev = tuple(replace(e, revoked=True) if revoked_id in e.sources else e for e in p.evidence)
    return _derive(replace(p, evidence=ev))


def has_live_runs(p: Procedure) -> bool:
    return any(e.kind == "run" and not e.revoked for e in p.evidence)


def apply_transition(p: Procedure, t: Transition) -> Procedure:
    """Compare-and-set: a transition planned from a stale view (another worker, an older
    state) does not apply. Deprecation is terminal."""
    if p.stage != t.from_stage or p.stage == "deprecated":
        return p
    return replace(p, stage=t.to_stage, history=(*p.history, t))


def deprecate(p: Procedure, event_id: str, event_time: int, reason: str) -> Procedure:
    """The terminal move, from whatever stage the procedure is in."""
    return apply_transition(p, Transition(p.stage, "deprecated", event_id, event_time, reason))


def _meets(stage: str, s: Stats, p: Procedure) -> bool:
    if stage == "observed":
        return True
    if stage == "candidate":
        return s.success_sessions >= CANDIDATE_SESSIONS
    if stage == "validated":
        return (_meets("candidate", s, p) and s.success_sessions >= VALIDATED_SESSIONS
                and s.rate >= VALIDATED_SUCCESS_RATE)
    if stage == "active":
        return (_meets("validated", s, p) and s.reuse_ok_sessions >= ACTIVE_REUSE_SESSIONS
                and s.reuse_ok > s.reuse_fail)
    return False


def needs_approval(p: Procedure) -> bool:
    return p.risk_level == "high" and p.requires_approval and not p.approved


def decide(p: Procedure) -> Decision | None:
    """The next single stage move the evidence calls for, an `ask`, or None (stable)."""
    if p.stage == "deprecated":
        return None
    s = stats(p)
    if not has_live_runs(p):
        return Decision("move", "deprecated", "no-live-evidence")
    if s.fail >= DEPRECATE_MIN_FAILURES and s.rate < DEPRECATE_MAX_RATE:
        return Decision("move", "deprecated", "mostly-failing")
    healthy = not (s.recent.count("failure") >= UNHEALTHY_RECENT_FAILURES
                   and s.recent[-1:] == ("failure",))
    rank = RANK[p.stage]
    if p.stage in RECALLABLE and not healthy:
        return Decision("move", STAGES[rank - 1], "recent-failures")
    if not _meets(p.stage, s, p):
        return Decision("move", STAGES[rank - 1], "evidence-below-stage")
    if p.stage == "active":
        return None
    nxt = STAGES[rank + 1]
    if not (_meets(nxt, s, p) and healthy and s.recent[-1:] == ("success",)):
        return None
    if nxt == "validated" and needs_approval(p):
        return None if p.approval_requested else Decision("ask", p.stage, "high-risk-approval")
    return Decision("move", nxt, "evidence")


def op_for(d: Decision, p: Procedure) -> str:
    """up = procedure_promoted, down or an approval request = procedure_staged, end =
    procedure_deprecated."""
    if d.to_stage == "deprecated":
        return "procedure_deprecated"
    if d.action == "move" and RANK[d.to_stage] > RANK[p.stage]:
        return "procedure_promoted"
    return "procedure_staged"


def transition_event_id(p: Procedure, d: Decision) -> str:
    """Derived from the procedure's state and live evidence, so two workers planning from the
    same log write the same id, and a later re-promotion (new evidence) gets a new one."""
    keys = [e.key for e in live(p)]
    return stable_id("mem", "proc", p.procedure_id, d.action, p.stage, d.to_stage,
                     len(p.history), digest_of(*keys))


def evidence_keys(p: Procedure, cap: int = 32) -> tuple[str, ...]:
    return tuple(e.key for e in live(p))[-cap:]


def render(p: Procedure) -> str:
    """What recall shows: a checklist in descriptive form, never an order."""
    head = f'Procedure for "{p.intent}": ' if p.intent else "Procedure: "
    text = head + " → ".join(p.steps) + "."
    if p.checks:
        text += " Check: " + "; ".join(p.checks) + "."
    if p.success_criteria:
        text += " Done when " + p.success_criteria[0] + "."
    risky = [s for s in p.steps if step_risk(s) == "high"]
    if risky:
        text += f" High risk ({', '.join(risky)}): needs the user's approval before it is run."
    return text
