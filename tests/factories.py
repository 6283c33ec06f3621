"""Plain-record factories for the pure stages (no Kafka)."""

from __future__ import annotations

import hashlib
import time
from typing import Any

import numpy as np

from mnemoflow.agents.candidate import Candidate
from mnemoflow.agents.text import digest, semantic_key

T0 = 1_700_000_000_000


def user_event(sid: str, seq: int, text: str, t: int = T0, user: str = "u1",
               **kw: Any) -> dict[str, Any]:
    return {"schemaVersion": 1, "sessionId": sid, "agentId": "a", "userId": user,
            "workspaceId": None, "eventSeq": seq, "turn": seq, "step": 0, "eventTime": t,
            "type": "user_message", "text": text, "provenance": None, "lifecycle": None,
            "capability": None, "feedbackKind": None, "feedbackRef": None, "attributes": {},
            **kw}


def tool_event(sid: str, seq: int, status: str, t: int = T0, **kw: Any) -> dict[str, Any]:
    return {"schemaVersion": 1, "sessionId": sid, "agentId": "a", "userId": "u1",
            "workspaceId": None, "eventSeq": seq, "turn": 1, "step": seq, "eventTime": t,
            "callId": f"c{seq}", "rootCallId": kw.pop("root", None),
            "parentCallId": kw.pop("parent", None), "toolName": "deploy", "status": status,
            "attempt": kw.pop("attempt", 1), "output": kw.pop("output", "done"),
            "error": kw.pop("error", None), "memoryRefs": [], **kw}


def candidate(mid: str, text: str, rel: float = 1.0, owner: str = "u1", scope: str = "User",
              t: int = T0 - 1000, **kw: Any) -> Candidate:
    return Candidate(memory_id=mid, kind=kw.pop("kind", "segment"), text=text, scope=scope,
                     owner=owner, session_id=kw.pop("session_id", "old"),
                     event_seq=kw.pop("event_seq", 1), event_time=t,
                     provenance=kw.pop("provenance", "old#1.0"), digest=digest(text),
                     semantic_key=semantic_key(text), relevance=rel, **kw)


def request(text: str = "where did I park?", sid: str = "s1", user: str = "u1", cv: int = 5,
            t: int = T0, **kw: Any) -> dict[str, Any]:
    return {"requestId": f"req:{sid}:{cv}", "sessionId": sid, "userId": user,
            "workspaceId": None, "segmentId": f"seg:{sid}:{cv}", "eventSeq": cv, "eventTime": t,
            "contextVersion": cv, "kind": "user", "text": text, "entities": [],
            "digest": digest(text), "action": kw.pop("action", "retrieve"),
            "reason": "above-threshold", "score": 0.9, "signals": {},
            "capability": kw.pop("capability", {"supportsPreStep": True}),
            "ignoredDigests": [], "visibleDigests": [], "timeWindow": None, "ingestTime": 0,
            **kw}


def feedback_event(sid: str, seq: int, kind: str, ref: str, t: int = T0, user: str = "u1",
                   memory_ids: tuple[str, ...] = (), turn: int = 1) -> dict[str, Any]:
    """A host feedback event as HostSession.feedback writes it (memoryIds comma-joined)."""
    return user_event(sid, seq, None, t, user=user, type="feedback", turn=turn,  # type: ignore[arg-type]
                      feedbackKind=kind, feedbackRef=ref,
                      attributes={"memoryIds": ",".join(memory_ids)} if memory_ids else {})


def tool_run(sid: str, t0: int, tools: list[tuple[str, str]], user: str = "u1",
             intent: str = "deploy atlas to staging", turn: int = 1,
             seq0: int = 1) -> list[tuple[str, dict[str, Any]]]:
    """One turn of a session: the user's message, then one tool result per (tool, status),
    a second apart. Returns (source topic, input record) pairs for the observer."""
    out = [("session-events", user_event(sid, seq0, intent, t0, user=user, turn=turn))]
    for i, (tool, status) in enumerate(tools, start=1):
        out.append(("tool-results", tool_event(
            sid, seq0 + i, status, t0 + i * 1000, toolName=tool, userId=user, turn=turn,
            step=i, error=None if status == "ok" else f"{tool} timed out after 30s",
            output="done" if status == "ok" else None)))
    return out


def observe_log(events: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """The memory-log the observer writes for these (source, record) inputs, one observer
    state per session, in input order."""
    from mnemoflow.agents.observer import ObserverState, observe

    states: dict[str, ObserverState] = {}
    out: list[dict[str, Any]] = []
    for source, rec in events:
        sid = rec["sessionId"]
        states[sid], obs = observe(states.get(sid, ObserverState()), source, rec)
        out += obs.memory_events
    return out


def memory_event(mid: str, entities: list[str], t: int = T0, owner: str = "u1",
                 scope: str = "User", **kw: Any) -> dict[str, Any]:
    """A memory-log `segment_recorded` record with every schema field filled."""
    return {"eventId": f"e:{mid}", "op": "segment_recorded", "memoryId": mid, "kind": "segment",
            "scope": scope, "owner": owner, "sessionId": "s", "eventSeq": 1, "eventTime": t,
            "text": " ".join(entities), "entities": entities, "provenance": [f"s#{t}.0"],
            "source": "user", "confidence": 0.5, "ttlMs": None, "subject": None,
            "predicate": None, "object": None, "riskLevel": None, "attributes": {}, **kw}


def revoke_event(mid: str, owner: str = "u1") -> dict[str, Any]:
    return {**memory_event(mid, [], owner=owner), "eventId": f"rv:{mid}", "op": "memory_revoked"}


class HashEmbedder:
    """A deterministic stand-in for MiniLM: unit vectors from the text's SHA-256."""

    name, dim, version = "hash", 16, "1"

    def embed(self, texts: list[str]) -> np.ndarray:
        out = np.array([[b - 128 for b in hashlib.sha256(t.encode()).digest()[:16]]
                        for t in texts], dtype=np.float32).reshape(len(texts), 16)
        return out / np.linalg.norm(out, axis=1, keepdims=True)


def tiny_bench() -> Any:
    """Two users' chats and two questions, in the shape evaluation.datasets produces."""
    from mnemoflow.evaluation.datasets import Benchmark, Question, Session, Turn

    day, t0 = 86_400_000, 1_680_000_000_000
    s1 = Session("u", "D1", t0, (
        Turn("user", "Ana: I adopted a grey cat named Miso last spring.", "D1:1"),
        Turn("user", "Ben: How lovely, does Miso like the garden?", "D1:2"),
        Turn("user", "Ana: She mostly sleeps on the piano.", "D1:3")))
    s2 = Session("u", "D2", t0 + 3 * day, (
        Turn("user", "Ben: I started a pottery class at the community centre.", "D2:1"),
        Turn("user", "Ana: Pottery sounds relaxing, what did you make?", "D2:2")))
    other = Session("v", "D1", t0, (Turn("user", "Cal: My cat is named Miso too.", "D1:1"),))
    qs = [Question("u/q0", "u", "What is the name of Ana's cat?", t0 + 10 * day, "1",
                   frozenset({"D1:1"}), frozenset({"D1"})),
          Question("u/q1", "u", "What class did Ben start?", t0 + 10 * day + 60_000, "1",
                   frozenset({"D2:1"}), frozenset({"D2"}))]
    return Benchmark("locomo", [s1, s2, other], qs)


def locker_code(owner: str, value: str, t: int) -> dict[str, Any]:
    """A user's statement of their locker code: the same slot each time, so a second value
    opens a conflict set with the first (not a host correction, which would replace it)."""
    from mnemoflow.agents import memory_events as M

    ev = M.host_fact(owner, f"locker code is {value}", t, subject="locker code", predicate="is",
                     obj=value)
    return {**ev, "source": "user", "attributes": {**ev["attributes"], "correction": "0"}}


class SlowToPickle:
    """Pickles in a minute: a checkpoint writer that is still at work when a test acts."""

    def __reduce__(self) -> tuple[type, tuple[()]]:
        time.sleep(60)
        return (SlowToPickle, ())
