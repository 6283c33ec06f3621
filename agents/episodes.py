"""M-02 episodes: what one turn of tool work was for, what it did and how it ended.

The observer records each tool result as an `episode_recorded` memory (one call). An Episode
groups the calls of one turn of one session (provenance `sessionId#turn.step`) with the user
message that opened the turn as its intent. Deriving them from the log instead of keeping them
in the observer keeps the observer stateless about runs and lets consolidation rebuild them
from any replay. A failed episode is evidence and a candidate, never a fact.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from mnemoflow.agents.memory_record import MemoryRecord

_TURN = re.compile(r"#(\d+)\.(\d+)$")
INTENT_CHARS = 160


def turn_of(provenance: Iterable[str]) -> tuple[int, int] | None:
    """(turn, step) from the first `sessionId#turn.step` provenance entry."""
    for p in provenance:
        m = _TURN.search(p)
        if m:
            return int(m.group(1)), int(m.group(2))
    return None


@dataclass(frozen=True)
class Episode:
    key: str  # run key: sessionId#turn
    owner: str
    scope: str
    session_id: str
    turn: int
    intent: str
    actions: tuple[str, ...]  # tool names in order, consecutive repeats (retries) collapsed
    entities: tuple[str, ...]
    unresolved: tuple[str, ...]  # entities of failed calls the turn never got past
    outcome: str  # success | failure: how the turn's last call ended
    provenance: tuple[str, ...]  # sessionId#turn.step of every call
    start_time: int
    event_time: int  # the last call's event time
    event_seq: int  # the last call's eventSeq
    episode_ids: tuple[str, ...]  # the episode memories (calls) it was built from
    failures: tuple[tuple[str, str], ...]  # (tool, text) of every failed call


def _collapse(names: Iterable[str]) -> tuple[str, ...]:
    out: list[str] = []
    for n in names:
        if not out or out[-1] != n:
            out.append(n)
    return tuple(out)


def build_episodes(calls: Iterable[MemoryRecord],
                   intents: Mapping[tuple[str, int], str]) -> list[Episode]:
    """Group live episode records by (owner, session, turn); `intents` maps (session, turn) to
    the user's text of that turn. Deterministic order: by start time, then key."""
    groups: dict[tuple[str, str, str, int], list[MemoryRecord]] = {}
    for r in calls:
        if r.revoked or r.kind != "episode":
            continue
        tt = turn_of(r.provenance)
        if tt is None:
            continue
        groups.setdefault((r.scope, r.owner, r.session_id, tt[0]), []).append(r)
    out = []
    for (scope, owner, sid, turn), recs in groups.items():
        recs.sort(key=lambda r: (r.event_seq, r.memory_id))
        tools = [r.attributes.get("tool", "") or "tool" for r in recs]
        outcomes = [r.attributes.get("outcome", "success") for r in recs]
        failures = tuple((t, r.text) for t, o, r in zip(tools, outcomes, recs, strict=True)
                         if o == "failure")
        unresolved: list[str] = []
        for i, (t, o) in enumerate(zip(tools, outcomes, strict=True)):
            recovered = any(t2 == t and o2 == "success"
                            for t2, o2 in zip(tools[i + 1:], outcomes[i + 1:], strict=True))
            if o == "failure" and not recovered:
                unresolved += [e for e in recs[i].entities if e not in unresolved]
        ents = list(dict.fromkeys(e for r in recs for e in r.entities))
        intent = " ".join(intents.get((sid, turn), "").split())[:INTENT_CHARS]
        out.append(Episode(
            key=f"{sid}#{turn}", owner=owner, scope=scope, session_id=sid, turn=turn,
            intent=intent, actions=_collapse(tools), entities=tuple(ents),
            unresolved=tuple(unresolved), outcome=outcomes[-1],
            provenance=tuple(r.provenance[0] for r in recs if r.provenance),
            start_time=recs[0].event_time, event_time=recs[-1].event_time,
            event_seq=recs[-1].event_seq, episode_ids=tuple(r.memory_id for r in recs), failures=failures))
    out.sort(key=lambda e: (e.start_time, e.key))
    return out
