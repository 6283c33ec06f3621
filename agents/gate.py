"""C-03 retrieval gate: is recalling worth it *now*? Works without any model reasoning.

Signals are computed from the session's working memory and the segment; a weighted score
against HOT/WARM thresholds (with hysteresis) chooses retrieve / prefetch / suppress.
Cooldown (per topic key, in event time) and user-ignored suppression stop repeated nagging.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any

from mnemoflow.agents.ids import stable_id
from mnemoflow.agents.temporal import time_window
from mnemoflow.agents.text import content_tokens, semantic_key
from mnemoflow.agents.tuning import GateTuning
from mnemoflow.agents.working_memory import RingEntry, WorkingMemory, ring_entity

KIND_FACTOR = {"user": 1.0, "tool": 1.0, "assistant": 0.5, "step": 0.5}
HISTORY_CAP = 128
IGNORED_CAP = 256
DONE_CAP = 4
# Topic keys under cooldown. They expire in event time, but a burst of distinct topics within
# one cooldown (or event times that stop advancing) would otherwise grow the state without
# bound; past the cap the cooldowns that end first are dropped.
COOLDOWN_CAP = 256
# What `done` keeps of a request: the fields that come from the segment's text are taken from
# the redelivered segment instead (the observer re-emits it identically), so the state stays
# small however long the text (the gate-state changelog record must stay under 1 MB).
_FROM_SEGMENT = ("text", "entities")
# `ignored` is only ever compared with digests (the segment's here, the candidates' in rank):
# feedback that names something else (a packet id) is not kept in the state or the requests.
_DIGEST = re.compile(r"[0-9a-f]{64}")

_QUESTION = re.compile(
    r"\?\s*$|^(what|when|where|who|whom|whose|why|how|which|did|do|does|is|are|was|were|can|"
    r"could|would|will|have|has|had|should|tell me|remind me)\b", re.I)
_CUE = re.compile(
    r"\b(remember|recall|remind|last time|previously|before|earlier|again|mentioned|told you|"
    r"you said|i said|we discussed|we talked|as usual|my usual|like last)\b", re.I)


@dataclass(frozen=True)
class GateDecision:
    action: str  # retrieve | prefetch | suppress
    reason: str
    score: float = 0.0
    signals: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class GateState:
    window: WorkingMemory = field(default_factory=WorkingMemory)
    hot: bool = False
    cooldown: tuple[tuple[str, int], ...] = ()  # (topic key, until event time)
    ignored: tuple[str, ...] = ()
    history: tuple[tuple[str, int], ...] = ()  # (entity, last event time), for `historical`
    conflicts: int = 0
    capability: dict[str, Any] | None = None
    last_cv: int = 0
    done: tuple[tuple[str, dict[str, Any] | None, dict[str, Any]], ...] = ()  # recent outputs

    def to_json(self) -> dict[str, Any]:
        return {"window": self.window.to_json(), "hot": self.hot,
                "cooldown": [list(c) for c in self.cooldown], "ignored": list(self.ignored),
                "history": [list(h) for h in self.history], "conflicts": self.conflicts,
                "capability": self.capability, "last_cv": self.last_cv,
                "done": [list(d) for d in self.done]}

    @classmethod
    def from_json(cls, data: dict[str, Any] | None, tuning: GateTuning) -> GateState:
        if not data:
            return cls(window=WorkingMemory(cap=tuning.window_cap, ttl_ms=tuning.window_ms))
        return cls(
            WorkingMemory.from_json(data["window"], tuning.window_cap, tuning.window_ms),
            data["hot"], tuple((k, int(v)) for k, v in data["cooldown"]),
            tuple(data["ignored"]), tuple((k, int(v)) for k, v in data["history"]),
            data["conflicts"], data["capability"], data.get("last_cv", 0),
            tuple((d[0], d[1], d[2]) for d in data.get("done", ())))


@dataclass(frozen=True)
class GateOutput:
    decision: GateDecision | None  # None: an old redelivery, already decided and emitted
    request: dict[str, Any] | None = None
    audit: dict[str, Any] | None = None
    replayed: bool = False


def _phase(entries: tuple[RingEntry, ...]) -> str:
    """Coarse task phase from the last few kinds: conversing, executing or recovering."""
    last = entries[-3:]
    if any(e.kind == "tool" and e.ok is False for e in last):
        return "recovering"
    if any(e.kind == "tool" for e in last):
        return "executing"
    return "conversing" if last else "idle"


def signals(state: GateState, seg: dict[str, Any]) -> dict[str, float]:
    """The six design signals plus two cheap cues (question form, memory cue)."""
    win = state.window.window(seg["eventTime"])
    digests = {e.digest for e in win} | {e.semantic_key for e in win}
    win_entities = {x for e in win for x in e.entities}
    ents = [ring_entity(e) for e in seg["entities"]]  # as the window and history keep them
    new_ents = [e for e in ents if e not in win_entities]
    after = (*win, RingEntry(seg["segmentId"], seg["digest"], seg["semanticKey"],
                             seg["eventTime"], seg["kind"], tuple(ents), seg.get("ok")))
    tokens = set(content_tokens(seg["text"]))
    recent_tokens = {t for e in win[-3:] for t in e.entities}
    topical_shift = bool(win) and bool(tokens) and not (tokens & recent_tokens) and bool(new_ents)
    history = dict(state.history)
    text = seg["text"]
    return {
        "novelty": 0.0 if (seg["digest"] in digests or seg["semanticKey"] in digests) else 1.0,
        "unresolved": min(1.0, len(new_ents) / 2.0),
        "phase_shift": 1.0 if _phase(win) != _phase(after) else (0.5 if topical_shift else 0.0),
        "tool_failure": 1.0 if seg["kind"] == "tool" and seg.get("ok") is False else 0.0,
        "conflict": 1.0 if state.conflicts > 0 else 0.0,
        "historical": 1.0 if any(e in history and e not in win_entities for e in ents) else 0.0,
        "question": 1.0 if _QUESTION.search(text.strip()) else 0.0,
        "recall_cue": 1.0 if (_CUE.search(text) or time_window(text, seg["eventTime"])) else 0.0,
    }


def _topic_key(seg: dict[str, Any]) -> str:
    ents = sorted(seg["entities"])[:4]
    return semantic_key(" ".join(ents)) if ents else seg["semanticKey"]


def _audit(seg: dict[str, Any], d: GateDecision, request_id: str | None) -> dict[str, Any]:
    env = seg["envelope"]
    return {
        "auditId": stable_id("audit", "gate", seg["segmentId"]), "sessionId": env["sessionId"],
        "userId": seg["userId"], "stage": "gate", "action": d.action, "reason": d.reason,
        "eventTime": seg["eventTime"], "eventSeq": env["eventSeq"],
        "contextVersion": seg["contextVersion"], "segmentId": seg["segmentId"],
        "segmentDigest": seg["digest"], "requestId": request_id, "packetId": None,
        "score": d.score, "signals": d.signals, "candidates": [], "sourceSeqs": [env["eventSeq"]],
        "bytes": 0, "expiry": 0, "tiers": {}, "indexVersion": None,
        "ingestTime": seg.get("ingestTime", 0),
    }


def _housekeeping(state: GateState, seg: dict[str, Any]) -> GateState:
    """Lifecycle and feedback segments change state but are never recall triggers."""
    if seg["kind"] == "lifecycle" and seg.get("capability") is not None:
        state = replace(state, capability=seg["capability"])
    if seg["kind"] == "feedback":
        ref = seg.get("feedbackRef") or ""
        if seg.get("feedbackKind") == "packet_ignored" and _DIGEST.fullmatch(ref):
            state = replace(state, ignored=(*state.ignored, ref)[-IGNORED_CAP:])
        elif seg.get("feedbackKind") == "correction":
            state = replace(state, conflicts=state.conflicts + 1)
    return state


def decide(state: GateState, seg: dict[str, Any], tuning: GateTuning) -> tuple[GateState, GateOutput]:
    """One segment in, one decision out (and a recall request unless suppressed)."""
    if seg["contextVersion"] <= state.last_cv:
        # a redelivery: re-emit what was emitted (its outputs may have been lost in a crash)
        for sid, req, audit in state.done:
            if sid == seg["segmentId"]:
                d = GateDecision(audit["action"], audit["reason"], audit["score"], audit["signals"])
                if req is not None:
                    req = {**req, **{k: seg[k] for k in _FROM_SEGMENT}}
                return state, GateOutput(d, req, audit, replayed=True)
        return state, GateOutput(None)
    state = replace(state, last_cv=seg["contextVersion"])
    state, out = _decide(state, seg, tuning)
    kept = None if out.request is None else {
        k: v for k, v in out.request.items() if k not in _FROM_SEGMENT}
    done = (*state.done, (seg["segmentId"], kept, out.audit))[-DONE_CAP:]
    return replace(state, done=done), out


def _decide(state: GateState, seg: dict[str, Any], tuning: GateTuning) -> tuple[GateState, GateOutput]:
    now = seg["eventTime"]
    if seg["kind"] in ("lifecycle", "feedback"):
        state = _housekeeping(state, seg)
        d = GateDecision("suppress", seg["kind"])
        return state, GateOutput(d, None, _audit(seg, d, None))

    sig = signals(state, seg)
    score = KIND_FACTOR.get(seg["kind"], 1.0) * sum(
        tuning.weights.get(k, 0.0) * v for k, v in sig.items())
    score = round(score, 6)
    key = _topic_key(seg)
    cooldown = {k: t for k, t in state.cooldown if t > now}
    hot = tuning.hot - (tuning.hysteresis if state.hot else 0.0)
    warm = tuning.warm - (tuning.hysteresis if state.hot else 0.0)
    if cooldown.get(key, 0) > now:
        d = GateDecision("suppress", "cooldown", score, sig)
    elif seg["digest"] in state.ignored:
        d = GateDecision("suppress", "user-ignored", score, sig)
    elif score >= hot:
        d = GateDecision("retrieve", "above-threshold" if not state.hot else "hysteresis-hot",
                         score, sig)
    elif score >= warm:
        d = GateDecision("prefetch", "warm", score, sig)
    else:
        d = GateDecision("suppress", "below-threshold", score, sig)

    window, _ = state.window.push(RingEntry(
        seg["segmentId"], seg["digest"], seg["semanticKey"], now, seg["kind"],
        tuple(seg["entities"]), seg.get("ok")))
    history = dict(state.history)
    for e in seg["entities"]:
        history[ring_entity(e)] = now
    hist = tuple(sorted(history.items(), key=lambda kv: (kv[1], kv[0]))[-HISTORY_CAP:])
    fired = d.action != "suppress"
    if fired:
        cooldown[key] = now + tuning.cooldown_ms
        if len(cooldown) > COOLDOWN_CAP:
            cooldown = dict(sorted(cooldown.items(), key=lambda kv: (kv[1], kv[0]))[-COOLDOWN_CAP:])
    new_state = replace(
        state, window=window, history=hist, hot=fired if d.reason != "cooldown" else state.hot,
        cooldown=tuple(sorted(cooldown.items())),
        conflicts=0 if fired else state.conflicts)
    request = None
    if fired:
        env = seg["envelope"]
        request = {
            "requestId": stable_id("req", seg["segmentId"]), "sessionId": env["sessionId"],
            "userId": seg["userId"], "workspaceId": seg.get("workspaceId"),
            "segmentId": seg["segmentId"], "eventSeq": env["eventSeq"], "eventTime": now,
            "contextVersion": seg["contextVersion"], "kind": seg["kind"], "text": seg["text"],
            "entities": seg["entities"], "digest": seg["digest"], "action": d.action,
            "reason": d.reason, "score": score, "signals": sig, "capability": state.capability,
            "ignoredDigests": list(state.ignored),
            "visibleDigests": [e.digest for e in state.window.window(now)],
            "timeWindow": list(time_window(seg["text"], now) or ()) or None,
            "ingestTime": seg.get("ingestTime", 0),
        }
    return new_state, GateOutput(d, request, _audit(seg, d, request and request["requestId"]))
