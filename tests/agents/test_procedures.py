"""M-04 promotion rules: cross-session evidence, high risk asks, reversible stages."""

from __future__ import annotations

from dataclasses import replace

import pytest

from mnemoflow.agents import procedures as P
from mnemoflow.agents.episodes import Episode
from mnemoflow.agents.injection_rules import detect_injection

from factories import T0

STEPS = ("build", "test", "render_docs")  # low risk on purpose: no approval needed


def _ep(sid: str, turn: int = 1, outcome: str = "success", t: int = T0,
        steps: tuple[str, ...] = STEPS) -> Episode:
    failures = ((steps[-1], f"{steps[-1]} error: boom"),) if outcome == "failure" else ()
    return Episode(key=f"{sid}#{turn}", owner="u1", scope="User", session_id=sid, turn=turn,
                   intent="ship the docs", actions=steps, entities=("docs",), unresolved=(),
                   outcome=outcome, provenance=(f"{sid}#{turn}.1",), start_time=t, event_time=t,
                   event_seq=turn, episode_ids=(f"ep:{sid}:{turn}",), failures=failures)


def _fold(eps: list[Episode]) -> P.Procedure:
    p = None
    for e in eps:
        p = P.observe_episode(p, e)
    assert p is not None
    return p


def _settle(p: P.Procedure) -> P.Procedure:
    """Apply decisions until stable, as consolidation plans them."""
    for _ in range(len(P.STAGES)):
        d = P.decide(p)
        if d is None:
            return p
        if d.action == "ask":
            return replace(p, approval_requested=True)
        p = P.apply_transition(p, P.Transition(p.stage, d.to_stage, f"t{len(p.history)}", T0,
                                               d.reason))
    return p


@pytest.mark.parametrize(("steps", "risk"), [
    (("read_file", "grep"), "low"),
    (("git_commit", "run_tests"), "medium"),
    (("build", "deployService"), "high"),
    (("ssh_exec", "tail_log"), "high"),
    (("list_files", "delete-file"), "high"),
    (("kubectl.apply",), "high"),
])
def test_risk_is_the_riskiest_step(steps: tuple[str, ...], risk: str) -> None:
    assert P.classify_risk(steps) == risk


def test_one_success_is_not_enough() -> None:
    assert _settle(_fold([_ep("s1")])).stage == "observed"


def test_three_repeats_in_one_session_are_not_enough() -> None:
    p = _settle(_fold([_ep("s1", turn=i, t=T0 + i) for i in (1, 2, 3)]))
    assert p.stage == "observed" and P.stats(p).ok == 3


def test_promotion_needs_independent_sessions() -> None:
    two = _settle(_fold([_ep("s1"), _ep("s2", t=T0 + 1)]))
    assert two.stage == "candidate" and not two.recallable
    three = _settle(_fold([_ep("s1"), _ep("s2", t=T0 + 1), _ep("s3", t=T0 + 2)]))
    assert three.stage == "validated" and three.recallable
    assert [t.to_stage for t in three.history] == ["candidate", "validated"]


def test_active_needs_reuse_evidence_from_two_sessions() -> None:
    p = _settle(_fold([_ep(f"s{i}", t=T0 + i) for i in range(3)]))
    p = _settle(P.add_outcome(p, "r1", "reuse", "s7", "success", T0 + 10))
    assert p.stage == "validated"
    p = _settle(P.add_outcome(p, "r2", "reuse", "s8", "success", T0 + 11))
    assert p.stage == "active"


def test_failures_demote_and_only_new_success_promotes_again() -> None:
    p = _settle(_fold([_ep(f"s{i}", t=T0 + i) for i in range(3)]))
    p = _settle(P.add_outcome(p, "r1", "reuse", "s7", "success", T0 + 10))
    p = _settle(P.add_outcome(p, "r2", "reuse", "s8", "success", T0 + 11))
    assert p.stage == "active"
    p = _settle(P.add_outcome(p, "w1", "reuse", "s9", "failure", T0 + 12))
    assert p.stage == "active"  # one failure is noise
    p = _settle(P.add_outcome(p, "w2", "reuse", "s9", "failure", T0 + 13))
    assert p.stage == "candidate" and not p.recallable
    assert [t.to_stage for t in p.history][-2:] == ["validated", "candidate"]  # reversible, logged
    assert _settle(p) == p  # no flapping without new evidence
    p = _settle(P.observe_episode(p, _ep("s10", t=T0 + 14)))
    assert p.stage == "validated"


def test_mostly_failing_is_deprecated_for_good() -> None:
    p = _fold([_ep("s1")] + [_ep(f"f{i}", outcome="failure", t=T0 + i) for i in range(1, 5)])
    p = _settle(p)
    assert p.stage == "deprecated" and not p.recallable
    assert _settle(P.observe_episode(p, _ep("s2", t=T0 + 9))).stage == "deprecated"
    assert P.apply_transition(p, P.Transition("deprecated", "active", "x", T0, "")) == p


def test_high_risk_asks_before_validation_and_waits_for_approval() -> None:
    steps = ("build", "deploy")
    p = _settle(_fold([_ep(f"s{i}", t=T0 + i, steps=steps) for i in range(4)]))
    assert p.risk_level == "high" and p.requires_approval
    assert p.stage == "candidate" and p.approval_requested
    assert P.decide(p) is None  # asked once; nothing more until someone approves
    p = _settle(replace(p, approved=True))
    assert p.stage == "validated"


def test_transitions_are_compare_and_set() -> None:
    p = _fold([_ep("s1")])
    stale = P.Transition("candidate", "validated", "x", T0, "evidence")
    assert P.apply_transition(p, stale) == p


def test_revoked_runs_stop_counting() -> None:
    p = _settle(_fold([_ep(f"s{i}", t=T0 + i) for i in range(3)]))
    assert p.stage == "validated"
    p = P.revoke_sources(p, "ep:s0:1")
    assert P.stats(p).success_sessions == 2
    assert _settle(p).stage == "candidate"
    for i in (1, 2):
        p = P.revoke_sources(p, f"ep:s{i}:1")
    assert not P.has_live_runs(p) and _settle(p).stage == "deprecated"


def test_checklist_text_is_advice_not_an_instruction() -> None:
    p = _fold([_ep("s1", steps=("build", "ssh_exec")),
               _ep("s2", outcome="failure", t=T0 + 1, steps=("build", "ssh_exec"))])
    text = P.render(p)
    assert "ssh_exec has failed before" in text and "approval" in text
    assert not detect_injection(text).flagged


def test_confidence_is_bounded_by_evidence() -> None:
    p = _fold([_ep(f"s{i}", t=T0 + i) for i in range(20)])
    assert 0.9 < P.confidence(p) < 1.0
    q = _fold([_ep(f"s{i}", outcome="failure", t=T0 + i) for i in range(20)])
    assert 0.0 < P.confidence(q) < 0.1
