"""Idle-time consolidation: repeated episodes become procedure and fact candidates, and
procedures move between stages on their evidence (M-02 -> M-03/M-04, G-01).

`consolidate(view, now_event_time)` reads a MemoryStore (or anything with its read API) and
returns memory events. It is deterministic and idempotent: every eventId is derived from the
inputs (the episodes behind an observation, the procedure state and evidence behind a
transition), and events the view has already folded are not returned, so a second run, or a
second worker on the same log, adds nothing new. Time is event time (the newest the store has
folded is a good `now_event_time`), never the wall clock.

Episode extractors are plain callables, so an LLM extractor can be added later; whatever they
propose, stage changes are only ever made by the rules in agents.procedures.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol

from mnemoflow.agents import procedures as P
from mnemoflow.agents.episodes import Episode, build_episodes, turn_of
from mnemoflow.agents.ids import digest_of, stable_id
from mnemoflow.agents.memory_events import json_list, memory_event, parse_list
from mnemoflow.agents.memory_record import MemoryRecord
from mnemoflow.agents.text import semantic_key

QUIET_MS = 5 * 60_000  # a turn is closed when it saw no tool call for this long, or a later turn began
FAILURE_FACT_SESSIONS = 2  # the same failure in this many sessions is worth a fact candidate
MAX_CHAIN = len(P.STAGES)

EpisodeExtractor = Callable[[Sequence[Episode], int], list[dict[str, Any]]]


class ConsolidationView(Protocol):
    """What consolidation reads; MemoryStore implements it."""

    def records_of(self, kind: str) -> Sequence[MemoryRecord]: ...

    def session_records(self, session_id: str) -> Sequence[MemoryRecord]: ...

    def procedure(self, mid: str) -> P.Procedure | None: ...

    def all_procedures(self) -> Sequence[P.Procedure]: ...

    def has_event(self, event_id: str) -> bool: ...


def closed_episodes(view: ConsolidationView, now: int) -> list[Episode]:
    """Episodes of turns that are over, with the user's message of the turn as intent."""
    calls = [r for r in view.records_of("episode") if not r.revoked]
    intents: dict[tuple[str, int], str] = {}
    last_turn: dict[str, int] = {}
    for sid in sorted({r.session_id for r in calls}):
        for r in view.session_records(sid):
            tt = turn_of(r.provenance)
            if tt is None:
                continue
            last_turn[sid] = max(last_turn.get(sid, 0), tt[0])
            if (r.kind == "segment" and r.attributes.get("role") == "user" and not r.revoked
                    and (sid, tt[0]) not in intents):
                intents[(sid, tt[0])] = r.text
    return [e for e in build_episodes(calls, intents)
            if e.event_time <= now - QUIET_MS or last_turn.get(e.session_id, 0) > e.turn]


def observation_event(ep: Episode, after: P.Procedure) -> dict[str, Any]:
    """`procedure_observed`: one run of a procedure, with everything the fold needs."""
    return memory_event(
        event_id=stable_id("mem", "proc-observed", after.procedure_id, ep.key,
                           digest_of(*ep.episode_ids)),
        op="procedure_observed", memory_id=after.procedure_id, kind="procedure",
        scope=ep.scope, owner=ep.owner, session_id=ep.session_id, event_seq=ep.event_seq,
        event_time=ep.event_time, text=P.render(after), entities=ep.entities,
        provenance=ep.provenance, source="inference", confidence=P.confidence(after),
        risk_level=after.risk_level,
        attributes={"runKey": ep.key, "turn": str(ep.turn), "outcome": ep.outcome,
                    "intent": ep.intent, "steps": json_list(ep.actions),
                    "sources": json_list(ep.episode_ids),
                    "failedSteps": json_list(dict.fromkeys(t for t, _ in ep.failures)),
                    "unresolved": json_list(ep.unresolved)})


def episode_of(ev: Mapping[str, Any]) -> Episode:
    """The run a `procedure_observed` event carries: what the fold gets back of the episode
    `observation_event` wrote."""
    a = ev.get("attributes") or {}
    return Episode(
        key=a.get("runKey") or ev["eventId"], owner=ev["owner"], scope=ev["scope"],
        session_id=ev["sessionId"], turn=int(a.get("turn") or 0), intent=a.get("intent", ""),
        actions=parse_list(a.get("steps")), entities=tuple(ev.get("entities") or ()),
        unresolved=(), outcome=a.get("outcome", "success"),
        provenance=tuple(ev.get("provenance") or ()), start_time=ev["eventTime"],
        event_time=ev["eventTime"], event_seq=ev["eventSeq"],
        episode_ids=parse_list(a.get("sources")),
        failures=tuple((t, "") for t in parse_list(a.get("failedSteps"))))


def procedure_runs(episodes: Sequence[Episode]) -> list[Episode]:
    """Episodes that describe a procedure: at least MIN_STEPS distinct tool steps."""
    return [e for e in episodes if len(e.actions) >= P.MIN_STEPS]


def failure_fact_candidates(episodes: Sequence[Episode], now: int) -> list[dict[str, Any]]:
    """The same tool failing the same way in independent sessions becomes a fact *candidate*
    (source inference, status candidate): recorded, shown, never recalled until confirmed."""
    groups: dict[tuple[str, str, str, str], list[tuple[Episode, str]]] = {}
    for ep in episodes:
        for tool, text in ep.failures:
            body = text.split(": ", 1)[1] if ": " in text else text
            groups.setdefault((ep.scope, ep.owner, tool, semantic_key(body)), []).append((ep, body))
    out = []
    for (scope, owner, tool, key), hits in sorted(groups.items()):
        sessions = sorted({ep.session_id for ep, _ in hits})
        if len(sessions) < FAILURE_FACT_SESSIONS:
            continue
        first_ep, body = min(hits, key=lambda h: (h[0].event_time, h[0].key))
        obj = " ".join(body.split())[:120]
        sources = sorted({m for ep, _ in hits for m in ep.episode_ids})
        mid = stable_id("fact", owner, "candidate", tool, "fails with", key)
        last = max(ep.event_time for ep, _ in hits)
        out.append(memory_event(
            event_id=stable_id("mem", "fact-candidate", mid, digest_of(*sources)),
            op="fact_proposed", memory_id=mid, kind="fact", scope=scope, owner=owner,
            session_id=first_ep.session_id, event_seq=first_ep.event_seq, event_time=last,
            text=f"{tool} fails with: {obj}", entities=first_ep.entities,
            provenance=sorted({p for ep, _ in hits for p in ep.provenance}), source="inference",
            confidence=0.3, subject=tool.casefold(), predicate="fails with", object_=obj,
            attributes={"status": "candidate", "category": "environment",
                        "sources": json_list(sources), "sessions": str(len(sessions))}))
    return out


def transition_event(p: P.Procedure, d: P.Decision, now: int) -> dict[str, Any]:
    """A stage move (or an approval request) with its evidence list; reversible because the
    record keeps every transition and the rules can move it back on new evidence."""
    keys = P.evidence_keys(p)
    return memory_event(
        event_id=P.transition_event_id(p, d), op=P.op_for(d, p), memory_id=p.procedure_id,
        kind="procedure", scope=p.scope, owner=p.owner, event_time=now, provenance=keys,
        source="inference", confidence=P.confidence(p), risk_level=p.risk_level,
        attributes={"fromStage": p.stage, "stage": d.to_stage, "reason": d.reason,
                    "decision": d.action, "evidence": json_list(keys)})


def plan_transitions(p: P.Procedure, now: int) -> tuple[P.Procedure, list[dict[str, Any]]]:
    """Apply the rules until they are stable (each step one stage)."""
    out = []
    for _ in range(MAX_CHAIN):
        d = P.decide(p)
        if d is None:
            break
        out.append(transition_event(p, d, now))
        if d.action == "ask":
            p = replace(p, approval_requested=True)
            break
        p = P.apply_transition(p, P.Transition(p.stage, d.to_stage, out[-1]["eventId"], now,
                                               d.reason, P.evidence_keys(p)))
    return p, out


DEFAULT_EXTRACTORS: tuple[EpisodeExtractor, ...] = (failure_fact_candidates,)


def consolidate(view: ConsolidationView, now_event_time: int,
                extractors: Sequence[EpisodeExtractor] = DEFAULT_EXTRACTORS) -> list[dict[str, Any]]:
    """Memory events for everything the closed episodes and the evidence call for, minus what
    the view has already folded. Order: observations, extractor proposals, stage changes."""
    now = now_event_time
    episodes = closed_episodes(view, now)
    events: list[dict[str, Any]] = []
    local: dict[str, P.Procedure] = {}
    for ep in procedure_runs(episodes):
        pid = P.procedure_id(ep.scope, ep.owner, ep.actions)
        cur = local.get(pid) or view.procedure(pid)
        if cur is not None and cur.stage == "deprecated":
            continue
        if cur is not None and any(e.key == ep.key for e in cur.evidence):
            continue  # this run is already evidence
        after = P.observe_episode(cur, ep)
        local[pid] = after
        events.append(observation_event(ep, after))
    for ex in extractors:
        events += ex(episodes, now)
    for p in view.all_procedures():
        local.setdefault(p.procedure_id, p)
    for pid in sorted(local):
        _, moves = plan_transitions(local[pid], now)
        events += moves
    seen: set[str] = set()
    out = []
    for ev in events:
        if ev["eventId"] not in seen and not view.has_event(ev["eventId"]):
            seen.add(ev["eventId"])
            out.append(ev)
    return out
