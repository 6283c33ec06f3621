"""C-01/N-01/N-08/M-01 observer: host events -> EventEnvelope + Segment, per session.

Pure: `observe(state, source, record)` returns the new state and what to emit. The envelope
keeps only a digest of the payload. contextVersion rises strictly per session, and a
redelivered event (same deterministic segment id) re-emits the identical segment so that
downstream dedupe drops it instead of seeing a new version.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from typing import Any

from mnemoflow.agents.extract import extract_memories
from mnemoflow.agents.ids import stable_id
from mnemoflow.agents.text import digest, entities, semantic_key
from mnemoflow.agents.working_memory import RingEntry, WorkingMemory

SCHEMA_VERSION = 1
RECENT_CAP = 128
TEXT_CAP = 4000

SOURCE_KIND = {"session-events": "user", "tool-results": "tool", "agent-steps": "agent"}


@dataclass(frozen=True)
class ObserverState:
    context_version: int = 0
    ring: WorkingMemory = field(default_factory=WorkingMemory)
    recent: tuple[tuple[str, int], ...] = ()  # (segmentId, contextVersion), newest last

    def to_json(self) -> dict[str, Any]:
        return {"cv": self.context_version, "ring": self.ring.to_json(),
                "recent": [list(r) for r in self.recent]}

    @classmethod
    def from_json(cls, data: dict[str, Any] | None, cap: int = 32,
                  ttl_ms: int = 15 * 60_000) -> ObserverState:
        if not data:
            return cls(ring=WorkingMemory(cap=cap, ttl_ms=ttl_ms))
        return cls(data["cv"], WorkingMemory.from_json(data["ring"], cap, ttl_ms),
                   tuple((str(a), int(b)) for a, b in data["recent"]))


@dataclass(frozen=True)
class Observation:
    """What one input event yields: a segment, memory-log events, or a dead-letter reason."""

    segment: dict[str, Any] | None = None
    memory_events: tuple[dict[str, Any], ...] = ()
    dead_letter: tuple[str, str] | None = None
    redelivered: bool = False


def _is_question(text: str) -> bool:
    return text.rstrip().endswith("?")


def payload_digest(record: dict[str, Any]) -> str:
    """Digest of the whole input record; the envelope stores this, never the payload."""
    body = json.dumps(record, sort_keys=True, default=str, ensure_ascii=False)
    return hashlib.sha256(body.encode()).hexdigest()


def _slice(source: str, rec: dict[str, Any]) -> tuple[str, str, bool | None]:
    """(kind, text, ok) by event type: each kind keeps the part that carries meaning."""
    if source == "tool-results":
        status = rec["status"]
        body = rec.get("error") if status != "ok" else rec.get("output")
        head = f"{rec['toolName']} {status}"
        if rec.get("attempt", 1) > 1:
            head += f" (attempt {rec['attempt']})"
        ok = {"ok": True, "error": False, "retry": False}.get(status)  # cancel: no verdict
        return "tool", f"{head}: {(body or '').strip()}"[:TEXT_CAP], ok
    if source == "agent-steps":
        return "step", (rec.get("text") or "").strip()[:TEXT_CAP], None
    etype = rec["type"]
    if etype == "lifecycle":
        return "lifecycle", f"lifecycle {rec.get('lifecycle') or ''}".strip(), None
    if etype == "feedback":
        return "feedback", f"feedback {rec.get('feedbackKind') or ''}".strip(), None
    kind = "user" if etype == "user_message" else "assistant"
    return kind, (rec.get("text") or "").strip()[:TEXT_CAP], None


def _envelope(source: str, rec: dict[str, Any]) -> dict[str, Any]:
    kind = SOURCE_KIND[source]
    if source == "session-events" and rec["type"] in ("lifecycle", "feedback"):
        kind = "lifecycle"
    return {
        "schemaVersion": rec["schemaVersion"], "sessionId": rec["sessionId"],
        "agentId": rec["agentId"], "eventSeq": rec["eventSeq"], "turn": rec["turn"],
        "step": rec["step"], "sourceKind": kind, "callId": rec.get("callId"),
        "rootCallId": rec.get("rootCallId"), "payloadDigest": payload_digest(rec),
    }


def _memory_events(seg: dict[str, Any], rec: dict[str, Any]) -> tuple[dict[str, Any], ...]:
    """User and assistant text become segment memories; tool results become episodes (M-02)."""
    env = seg["envelope"]
    prov = [seg["provenance"]] + ([rec["provenance"]] if rec.get("provenance") else [])
    base = {
        "scope": "User", "owner": seg["userId"], "sessionId": env["sessionId"],
        "eventSeq": env["eventSeq"], "eventTime": seg["eventTime"], "text": seg["text"],
        "entities": seg["entities"], "provenance": prov, "ttlMs": None, "subject": None,
        "predicate": None, "object": None, "riskLevel": None,
    }
    if (rec.get("attributes") or {}).get("memory") == "off":
        return ()  # the host marked this message ephemeral (a probe, a benchmark question)
    if seg["kind"] in ("user", "assistant") and seg["text"]:
        return ({**base, "eventId": stable_id("mem", seg["segmentId"], "segment"),
                 "op": "segment_recorded", "memoryId": seg["segmentId"], "kind": "segment",
                 "source": "user" if seg["kind"] == "user" else "inference",
                 "confidence": 0.6 if seg["kind"] == "user" else 0.4,
                 # a question asks for information rather than stating it: a weak memory
                 "attributes": {"role": seg["kind"],
                                "salience": "-3" if _is_question(seg["text"]) else "0"}},
                *extract_memories(seg))
    if seg["kind"] == "tool" and seg["ok"] is not None:
        outcome = "success" if seg["ok"] else "failure"
        return ({**base, "eventId": stable_id("mem", seg["segmentId"], "episode"),
                 "op": "episode_recorded", "memoryId": stable_id("ep", seg["segmentId"]),
                 "kind": "episode", "source": "tool", "confidence": 0.5,
                 # failures are candidates, never facts (M-02)
                 "attributes": {"outcome": outcome, "tool": seg["toolName"] or "",
                                "status": "candidate" if not seg["ok"] else "recorded",
                                "callId": env.get("callId") or ""}},)
    return ()


def _attributes(source: str, rec: dict[str, Any]) -> dict[str, str]:
    """Copied through for the evidence updater (G-01): the host's attributes (packet_delivered
    carries `memoryIds`), and for a tool result its status and the memories it says it reused."""
    if source == "tool-results":
        refs = rec.get("memoryRefs") or []
        return {"status": rec["status"], **({"memoryRefs": ",".join(refs)} if refs else {})}
    return dict(rec.get("attributes") or {})


def observe(
    state: ObserverState, source: str, rec: dict[str, Any], max_payload_bytes: int = 262144,
    ingest_time: int = 0,
) -> tuple[ObserverState, Observation]:
    """Turn one decoded input record into a Segment (or a dead-letter reason)."""
    if rec.get("schemaVersion") != SCHEMA_VERSION:
        return state, Observation(dead_letter=(
            "schema-version", f"schemaVersion {rec.get('schemaVersion')} != {SCHEMA_VERSION}"))
    kind, text, ok = _slice(source, rec)
    if len(text.encode()) > max_payload_bytes:
        return state, Observation(dead_letter=("oversized", f"{len(text.encode())} bytes"))
    if kind == "step" and not text:
        return state, Observation()  # a bare step boundary carries nothing to observe
    seg_id = stable_id("seg", rec["sessionId"], source, rec["eventSeq"])
    recent = dict(state.recent)
    redelivered = seg_id in recent
    cv = recent[seg_id] if redelivered else state.context_version + 1
    env = _envelope(source, rec)
    seg: dict[str, Any] = {
        "segmentId": seg_id, "envelope": env, "userId": rec["userId"],
        "workspaceId": rec.get("workspaceId"), "eventTime": rec["eventTime"],
        "contextVersion": cv, "kind": kind, "text": text,
        "entities": entities(text) if kind not in ("lifecycle", "feedback") else [],
        "digest": digest(text), "semanticKey": semantic_key(text), "ok": ok,
        "toolName": rec.get("toolName"),
        "provenance": f"{rec['sessionId']}#{rec['turn']}.{rec['step']}",
        "lifecycle": rec.get("lifecycle"), "capability": rec.get("capability"),
        "feedbackKind": rec.get("feedbackKind"), "feedbackRef": rec.get("feedbackRef"),
        "evicted": [], "ingestTime": ingest_time, "attributes": _attributes(source, rec),
    }
    if redelivered:
        return state, Observation(seg, _memory_events(seg, rec), redelivered=True)
    ring, evicted = state.ring, []
    if kind not in ("lifecycle", "feedback"):
        ring, evicted = state.ring.push(RingEntry(
            seg_id, seg["digest"], seg["semanticKey"], rec["eventTime"], kind,
            tuple(seg["entities"]), ok))
    seg["evicted"] = [f"{sid}:{why}" for sid, why in evicted]
    new_recent = (*state.recent, (seg_id, cv))[-RECENT_CAP:]
    new_state = replace(state, context_version=cv, ring=ring, recent=new_recent)
    return new_state, Observation(seg, _memory_events(seg, rec))
