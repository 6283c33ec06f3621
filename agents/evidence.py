"""G-01 evidence updater: tool outcomes after a delivered memory reinforce or weaken it; a
user's correction puts it into the conflict set.

Runs per session on the `segments` topic, after the observer: `update(state, segment)`
returns the new state and the memory events to append to the memory-log (keyed by owner).

Which memories a tool result reused (the reuse rule):
  a terminal tool result (status ok or error; retry and cancel conclude nothing) of root call
  R at event time t in turn T reused every memory delivered in this session during turn T (a
  `packet_delivered` feedback carrying `memoryIds`) after R's previous terminal result and no
  more than REUSE_WINDOW_MS before t, plus the memories the host named in the result's
  `memoryRefs`. Equivalently: each delivery is credited to the first terminal result of each
  root call that follows it in the same turn, within the window. A packet enters one request;
  what the agent does in reaction is that turn's tool work, and each root call is one plan
  that may have used it, but a plan's later calls and later turns are no evidence about it.

The rule is applied in both arrival orders: feedback comes on session-events and tool results
on tool-results, and faust does not order two topics, so a delivery may arrive after the tool
results that followed it. Either way the same (tool result, memory) pair gives the same eventId,
so the store counts it once.

Corrections: a `correction` feedback names the memories (`memoryIds`, or the packet in
`feedbackRef`); a user message that plainly says the previous answer was wrong ("that's
wrong", "that's not right", "that's outdated", ...) disputes what was delivered since the
previous user message. Each becomes `fact_conflicted`; the store keeps it in the conflict set
and stops recalling it until `fact_confirmed`.

Pure and per session: no clock (event time only), no process-global state.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, replace
from typing import Any

from mnemoflow.agents.ids import stable_id
from mnemoflow.agents.memory_events import memory_event

REUSE_WINDOW_MS = 10 * 60_000
DELIVERY_CAP = 64
OUTCOME_CAP = 64
DONE_CAP = 8

_CORRECTION = re.compile(
    r"^\W*(?:no\W+|nope\W+)?(?:(?:that|this|it)(?:['’]s|\s+is|\s+was)\s+"
    r"(?:wrong|incorrect|not (?:right|true|correct|accurate)|outdated|out of date|"
    r"no longer (?:true|right|correct|the case))"
    r"|(?:wrong|incorrect|not true)\b)", re.I)


@dataclass(frozen=True)
class Delivery:
    memory_id: str
    packet_id: str
    event_time: int
    turn: int


@dataclass(frozen=True)
class Outcome:
    """A terminal tool result, kept so a delivery that arrives late can still be credited."""

    segment_id: str
    root: str
    event_time: int
    ok: bool
    event_seq: int
    provenance: str
    tool: str
    call_id: str
    session_id: str
    user_id: str
    turn: int


@dataclass(frozen=True)
class EvidenceState:
    deliveries: tuple[Delivery, ...] = ()  # newest last
    outcomes: tuple[Outcome, ...] = ()  # newest last
    last_user_time: int | None = None
    done: tuple[tuple[str, tuple[dict[str, Any], ...]], ...] = ()  # redelivery: what was emitted

    def to_json(self) -> dict[str, Any]:
        return {"d": [asdict(d) for d in self.deliveries], "o": [asdict(o) for o in self.outcomes],
                "u": self.last_user_time, "done": [[s, list(evs)] for s, evs in self.done]}

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> EvidenceState:
        if not data:
            return cls()
        return cls(tuple(Delivery(**d) for d in data["d"]), tuple(Outcome(**o) for o in data["o"]),
                   data.get("u"), tuple((s, tuple(evs)) for s, evs in data.get("done", ())))


def _ids(value: str | None) -> list[str]:
    return [x for x in (value or "").split(",") if x]


def _status(seg: dict[str, Any]) -> str:
    status = (seg.get("attributes") or {}).get("status")
    if status:
        return status
    return {True: "ok", False: "error"}.get(seg.get("ok"), "cancel")  # type: ignore[arg-type]


def _outcome(seg: dict[str, Any]) -> Outcome:
    env = seg["envelope"]
    return Outcome(segment_id=seg["segmentId"],
                   root=env.get("rootCallId") or env.get("callId") or seg["segmentId"],
                   event_time=seg["eventTime"], ok=_status(seg) == "ok",
                   event_seq=env["eventSeq"], provenance=seg["provenance"],
                   tool=seg.get("toolName") or "", call_id=env.get("callId") or "",
                   session_id=env["sessionId"], user_id=seg["userId"], turn=env["turn"])


def _evidence_event(o: Outcome, memory_id: str, via: str, packet_id: str) -> dict[str, Any]:
    op = "evidence_reinforce" if o.ok else "evidence_weaken"
    return memory_event(
        event_id=stable_id("mem", "evidence", o.segment_id, op, memory_id), op=op,
        memory_id=memory_id, kind="evidence", scope="User", owner=o.user_id,
        session_id=o.session_id, event_seq=o.event_seq, event_time=o.event_time,
        provenance=[o.provenance], source="tool", confidence=1.0 if o.ok else 0.0,
        attributes={"segmentId": o.segment_id, "tool": o.tool, "callId": o.call_id,
                    "rootCallId": o.root, "via": via, "packetId": packet_id})


def _dispute_event(seg: dict[str, Any], memory_id: str, why: str) -> dict[str, Any]:
    env = seg["envelope"]
    return memory_event(
        event_id=stable_id("mem", "dispute", seg["segmentId"], memory_id), op="fact_conflicted",
        memory_id=memory_id, kind="evidence", scope="User", owner=seg["userId"],
        session_id=env["sessionId"], event_seq=env["eventSeq"], event_time=seg["eventTime"],
        text=seg["text"] if seg["kind"] == "user" else "", provenance=[seg["provenance"]],
        source="user", confidence=0.0,
        attributes={"segmentId": seg["segmentId"], "via": why,
                    "feedbackRef": seg.get("feedbackRef") or ""})


def _with_text(event: dict[str, Any], seg: dict[str, Any]) -> dict[str, Any]:
    """A remembered event with its text back. The state keeps events without their text: a
    dispute copies the user's whole message once per disputed memory, and the redelivered
    segment, identical to the first, has it again."""
    if event["op"] != "fact_conflicted":
        return event
    return {**event, "text": seg["text"] if seg["kind"] == "user" else ""}


def _credited(o: Outcome, deliveries: tuple[Delivery, ...],
              outcomes: tuple[Outcome, ...]) -> list[Delivery]:
    """The deliveries outcome `o` reused: after its root call's previous terminal result,
    before it, within the window."""
    prev = max((x.event_time for x in outcomes
                if x.root == o.root and x.event_time < o.event_time), default=None)
    since = o.event_time - REUSE_WINDOW_MS
    return [d for d in deliveries
            if d.turn == o.turn and since <= d.event_time < o.event_time
            and (prev is None or d.event_time > prev)]


def _first_after(d: Delivery, outcomes: tuple[Outcome, ...]) -> list[Outcome]:
    """For a delivery: the first terminal result of each root call that followed it."""
    first: dict[str, Outcome] = {}
    for o in sorted(outcomes, key=lambda x: (x.event_time, x.segment_id)):
        if (o.turn == d.turn and d.event_time < o.event_time <= d.event_time + REUSE_WINDOW_MS
                and o.root not in first):
            first[o.root] = o
    return list(first.values())


def _prune(state: EvidenceState, now: int) -> EvidenceState:
    horizon = now - REUSE_WINDOW_MS
    return replace(
        state,
        deliveries=tuple(d for d in state.deliveries if d.event_time >= horizon)[-DELIVERY_CAP:],
        outcomes=tuple(o for o in state.outcomes if o.event_time >= horizon)[-OUTCOME_CAP:])


def update(state: EvidenceState, seg: dict[str, Any]) -> tuple[EvidenceState, list[dict[str, Any]]]:
    """Fold one segment of this session; returns the memory events to append."""
    for sid, evs in state.done:
        if sid == seg["segmentId"]:  # redelivered: the same events again, nothing new
            return state, [_with_text(e, seg) for e in evs]
    kind, now = seg["kind"], seg["eventTime"]
    attrs = seg.get("attributes") or {}
    events: list[dict[str, Any]] = []
    if kind == "feedback" and seg.get("feedbackKind") == "packet_delivered":
        packet = seg.get("feedbackRef") or ""
        known = {(d.memory_id, d.packet_id) for d in state.deliveries}
        turn = seg["envelope"]["turn"]
        new = [Delivery(m, packet, now, turn) for m in dict.fromkeys(_ids(attrs.get("memoryIds")))
               if (m, packet) not in known]
        for d in new:  # tool results that arrived before their delivery (cross-topic order)
            for o in _first_after(d, state.outcomes):
                if d not in _credited(o, (d,), state.outcomes):
                    continue
                events.append(_evidence_event(o, d.memory_id, "window", d.packet_id))
        state = replace(state, deliveries=(*state.deliveries, *new))
    elif kind == "feedback" and seg.get("feedbackKind") == "correction":
        ref = seg.get("feedbackRef") or ""
        ids = _ids(attrs.get("memoryIds")) or [d.memory_id for d in state.deliveries
                                               if d.packet_id == ref]
        if not ids and ref and not ref.startswith("pkt:"):
            ids = [ref]
        ids = list(dict.fromkeys(ids))
        events += [_dispute_event(seg, m, "feedback") for m in ids]
        state = replace(state, deliveries=tuple(d for d in state.deliveries
                                                if d.memory_id not in ids))
    elif kind == "user":
        if _CORRECTION.match(seg.get("text") or ""):
            since = state.last_user_time
            hit = [d for d in state.deliveries if since is None or d.event_time > since]
            ids = list(dict.fromkeys(d.memory_id for d in hit))
            events += [_dispute_event(seg, m, "user-text") for m in ids]
            state = replace(state, deliveries=tuple(d for d in state.deliveries
                                                    if d.memory_id not in ids))
        state = replace(state, last_user_time=now)
    elif kind == "tool" and _status(seg) in ("ok", "error"):
        o = _outcome(seg)
        seen: set[str] = set()
        for d in _credited(o, state.deliveries, state.outcomes):
            if d.memory_id not in seen:
                seen.add(d.memory_id)
                events.append(_evidence_event(o, d.memory_id, "window", d.packet_id))
        for m in dict.fromkeys(_ids(attrs.get("memoryRefs"))):
            if m not in seen:
                seen.add(m)
                events.append(_evidence_event(o, m, "memoryRefs", ""))
        state = replace(state, outcomes=(*state.outcomes, o))
    state = _prune(state, now)
    if events:
        kept = tuple({**e, "text": ""} for e in events)
        state = replace(state, done=(*state.done, (seg["segmentId"], kept))[-DONE_CAP:])
    return state, events
