"""M-04 procedures as the memory-log records them: one event folded onto a Procedure, and the
record recall reads for it.

Consolidation writes the events (agents.consolidate) and the stage rules are those of
agents.procedures, so the fold and the planner agree by construction. A procedure's record is
derived: the rendered checklist, its confidence from the evidence, recallable only in the
validated and active stages (agents.memory_record.recallable), revoked once deprecated.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from mnemoflow.agents import procedures as P
from mnemoflow.agents.consolidate import episode_of
from mnemoflow.agents.memory_events import REVOKE_OPS, json_list, parse_list
from mnemoflow.agents.memory_record import PEOPLE, MemoryRecord
from mnemoflow.agents.text import digest, semantic_key

PROCEDURE_OPS = frozenset({"procedure_observed", "procedure_staged", "procedure_promoted",
                           "procedure_deprecated", "procedure_approved"})


def step(p: P.Procedure | None, ev: Mapping[str, Any],
         revoked: Callable[[str], bool]) -> P.Procedure | None:
    """The procedure after one of its events (a PROCEDURE_OPS one, or a revocation of it), or
    None when the event changes nothing. `revoked` tells which episodes are revoked."""
    op = ev["op"]
    if op == "procedure_observed":
        if p is not None and p.stage == "deprecated":
            return None  # terminal: a deprecated procedure is never revived
        run = episode_of(ev)
        if not run.actions:
            return None  # malformed: a procedure is its steps
        gone = frozenset(s for s in run.episode_ids if revoked(s))
        p = P.observe_episode(p or replace(P.new_procedure(run), procedure_id=ev["memoryId"]),
                              run, gone)
        if P.has_live_runs(p):
            return p
        return P.deprecate(p, ev["eventId"], ev["eventTime"], "no-live-evidence")
    if p is None:
        return None  # a stage event for a procedure never observed: nothing to move
    if op == "procedure_approved":
        # only a person (through the host) can approve
        return replace(p, approved=True) if ev.get("source") in PEOPLE else None
    if op in REVOKE_OPS and op != "procedure_deprecated":
        return P.deprecate(p, ev["eventId"], ev["eventTime"], "revoked")
    a = ev.get("attributes") or {}
    if a.get("decision") == "ask":
        return replace(p, approval_requested=True)
    to = "deprecated" if op == "procedure_deprecated" else a.get("stage", "")
    if to not in P.RANK:
        return None
    frm = p.stage if to == "deprecated" else a.get("fromStage", "")
    return P.apply_transition(p, P.Transition(frm, to, ev["eventId"], ev["eventTime"],
                                              a.get("reason", ""), parse_list(a.get("evidence"))))


def outcome(p: P.Procedure, ev: Mapping[str, Any]) -> P.Procedure:
    """G-01 on a procedure: a tool outcome after its delivery is reuse evidence, which the
    promotion rules read; a user's dispute counts as a failure."""
    if ev["op"] == "fact_conflicted":
        kind, result = "dispute", "failure"
    else:
        kind, result = "reuse", "success" if ev["op"] == "evidence_reinforce" else "failure"
    return P.add_outcome(p, ev["eventId"], kind, ev["sessionId"], result, ev["eventTime"])


def procedure_record(p: P.Procedure, old: MemoryRecord | None,
                     ev: Mapping[str, Any] | None = None) -> MemoryRecord:
    """The procedure's record after `old`: rendered checklist text, confidence from its
    evidence, and the time it entered its current stage (recall's event-time cut applies to
    that). `ev` is the event that moved it, if one did."""
    runs = [e for e in P.live(p) if e.kind == "run"]
    entered = p.history[-1].event_time if p.history else (
        old.event_time if old is not None else (ev or {}).get("eventTime", 0))
    attrs = {"stage": p.stage, "steps": json_list(p.steps),
             "requiresApproval": "1" if p.requires_approval else "0",
             "approved": "1" if p.approved else "0",
             "approvalRequested": "1" if p.approval_requested else "0"}
    if old is not None and "conflict" in old.attributes:
        attrs["conflict"] = old.attributes["conflict"]
    revoked = p.stage == "deprecated"
    if revoked and (old is None or not old.revoked):
        attrs["revokedBy"] = p.history[-1].reason if p.history else "deprecated"
    text = P.render(p)
    return MemoryRecord(
        memory_id=p.procedure_id, kind="procedure", text=text, scope=p.scope, owner=p.owner,
        session_id=runs[0].session_id if runs else (old.session_id if old else ""),
        event_seq=old.event_seq if old is not None else int((ev or {}).get("eventSeq", 0)),
        event_time=int(entered),
        provenance=tuple(dict.fromkeys(f"{e.key}" for e in runs))[-16:],
        entities=tuple(dict.fromkeys(x for e in runs for x in e.entities))[:16],
        digest=digest(text), semantic_key=semantic_key(text), confidence=P.confidence(p),
        source="inference", revoked=revoked, risk_level=p.risk_level, frequency=len(runs),
        attributes=attrs, disputed=old.disputed if old is not None else False,
        evidence=old.evidence if old is not None else ())
