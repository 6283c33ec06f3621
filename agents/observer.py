"""C-01/N-01/N-08/M-01 observer: host events -> EventEnvelope + Segment, per session.

Pure: `observe(state, source, record)` returns the new state and what to emit. The envelope
keeps only a digest of the payload. contextVersion rises strictly per session, and a
redelivered event (same deterministic segment id) re-emits the identical segment so that
downstream dedupe drops it instead of seeing a new version.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field, replace
from typing import Any

from mnemoflow.agents.extract import extract_memories
from mnemoflow.agents.ids import stable_id
from mnemoflow.agents.text import digest, entities, semantic_key
from mnemoflow.agents.working_memory import RingEntry, WorkingMemory

SCHEMA_VERSION = 1
RECENT_CAP = 128

# What is checked before a record is observed. A record that fails a check is dead-lettered
# with the reason and a detail naming the field; nothing is cut to fit.
#
# Free text (text, tool output and error, attributes, memoryRefs) counts against
# max_payload_bytes as a whole, before anything else looks at it: a text within it is
# carried whole in the segment and its memory. Those also carry the text's entities (held to
# the same bound below), so with the default 256 KiB a segment stays near 0.5 MB at most,
# under Kafka's 1 MB record limit.
TEXT_FIELDS = ("text", "output", "error")
# Event times must lie in [1970-01-01, 9999-12-31] UTC (epoch ms). Every stage turns event
# times into UTC calendar days with datetime, which ends at year 9999; a time before 1970 is
# a broken host clock, not history (the benchmarks' oldest sessions are from this century).
EVENT_TIME_MIN = 0
EVENT_TIME_MAX = 253_402_300_799_999
# Identifiers and names are copied into every record and state derived from the event (the
# gate keeps its last requests and audits, the evidence updater its last outcomes), so each
# is bounded; 255 bytes (a file name's limit) is more than any host's ids need. A control
# character in one is never meant and breaks the lines and file names ids end up in.
ID_MAX_BYTES = 255
ID_FIELDS = ("sessionId", "agentId", "userId", "workspaceId", "callId", "rootCallId",
             "parentCallId", "toolName", "provenance", "lifecycle", "feedbackKind", "feedbackRef")
REQUIRED_IDS = ("sessionId", "userId")  # they key the session's state and the memories' owner
# A packet holds a handful of memories (rank.max_items) and a tool call reuses a few; the
# evidence updater emits one memory event per id and keeps the last ones for redelivery.
MEMORY_IDS_MAX = 64
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
# The extractors (agents/extract.py) propose facts and aliases from at most this much of a
# text, cut after its last sentence end within the bound (never inside a sentence, which
# would turn "my city is New York" into a fact about "New"). Some of their patterns backtrack
# quadratically on long runs of word characters, and a whole 256 kB text would hold the
# observer for hours. The segment and its memory keep the whole text.
EXTRACT_CHARS = 4000
SENTENCE_ENDS = ".!?;\n"  # where extract.py's patterns end a fact

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


def _nbytes(s: str) -> int:
    return len(s.encode("utf-8", "surrogatepass"))


def oversized(rec: dict[str, Any], max_bytes: int) -> str | None:
    """Why the record's free text is over `max_bytes` as a whole (UTF-8), else None."""
    sizes = {f: _nbytes(rec[f]) for f in TEXT_FIELDS if rec.get(f)}
    attrs = rec.get("attributes") or {}
    if attrs:
        sizes["attributes"] = sum(_nbytes(k) + _nbytes(v) for k, v in attrs.items())
    if rec.get("memoryRefs"):
        sizes["memoryRefs"] = sum(_nbytes(r) for r in rec["memoryRefs"])
    total = sum(sizes.values())
    if total <= max_bytes:
        return None
    return f"{total} bytes ({', '.join(f'{f} {n}' for f, n in sizes.items())}) > {max_bytes}"


def _id_problem(name: str, value: str) -> str | None:
    n = _nbytes(value)
    if n > ID_MAX_BYTES:
        return f"{name} is {n} bytes > {ID_MAX_BYTES}"
    bad = _CONTROL.search(value)
    if bad:
        return f"{name} holds control character U+{ord(bad[0]):04X} at {bad.start()}"
    return None


def invalid(rec: dict[str, Any]) -> str | None:
    """Why a field of the record is out of range (the detail names the field), else None."""
    t = rec["eventTime"]
    if not EVENT_TIME_MIN <= t <= EVENT_TIME_MAX:
        return (f"eventTime {t} is outside [{EVENT_TIME_MIN}, {EVENT_TIME_MAX}] "
                "(1970-01-01 to 9999-12-31 UTC, epoch ms)")
    for f in REQUIRED_IDS:
        if not rec.get(f):
            return f"{f} is empty"
    named = [(f, rec.get(f)) for f in ID_FIELDS]
    cap = rec.get("capability") or {}
    named += [(f"capability.{k}", cap.get(k)) for k in ("provider", "model")]
    lists = {"memoryRefs": list(rec.get("memoryRefs") or ()),
             "attributes.memoryIds": [x for x in ((rec.get("attributes") or {})
                                                  .get("memoryIds") or "").split(",") if x]}
    for name, ids in lists.items():
        if len(ids) > MEMORY_IDS_MAX:
            return f"{name} has {len(ids)} ids > {MEMORY_IDS_MAX}"
        named += [(f"{name}[{i}]", x) for i, x in enumerate(ids)]
    for name, value in named:
        problem = None if value is None else _id_problem(name, value)
        if problem:
            return problem
    return None


def _slice(source: str, rec: dict[str, Any]) -> tuple[str, str, bool | None]:
    """(kind, text, ok) by event type: each kind keeps the part that carries meaning."""
    if source == "tool-results":
        status = rec["status"]
        body = rec.get("error") if status != "ok" else rec.get("output")
        head = f"{rec['toolName']} {status}"
        if rec.get("attempt", 1) > 1:
            head += f" (attempt {rec['attempt']})"
        ok = {"ok": True, "error": False, "retry": False}.get(status)  # cancel: no verdict
        return "tool", f"{head}: {(body or '').strip()}", ok
    if source == "agent-steps":
        return "step", (rec.get("text") or "").strip(), None
    etype = rec["type"]
    if etype == "lifecycle":
        return "lifecycle", f"lifecycle {rec.get('lifecycle') or ''}".strip(), None
    if etype == "feedback":
        return "feedback", f"feedback {rec.get('feedbackKind') or ''}".strip(), None
    kind = "user" if etype == "user_message" else "assistant"
    return kind, (rec.get("text") or "").strip(), None


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


def _for_extraction(seg: dict[str, Any]) -> dict[str, Any]:
    """The segment as the extractors see it: its text up to the last sentence end within
    EXTRACT_CHARS (nothing if there is none), everything else as it is."""
    text = seg["text"]
    if len(text) <= EXTRACT_CHARS:
        return seg
    head = text[:EXTRACT_CHARS + 1]  # a sentence may end right at the bound
    cut = max(head.rfind(c) for c in SENTENCE_ENDS)
    return {**seg, "text": head[:cut + 1] if cut >= 0 else ""}


def _memory_events(seg: dict[str, Any], rec: dict[str, Any]) -> tuple[dict[str, Any], ...]:
    """User and assistant text become segment memories; tool results become episodes (M-02)."""
    env = seg["envelope"]
    prov = [seg["provenance"]] + ([rec["provenance"]] if rec.get("provenance") else [])
    base = {
        "scope": "User", "owner": seg["userId"], "sessionId": env["sessionId"],
        "eventSeq": env["eventSeq"], "eventTime": seg["eventTime"], "text": seg["text"],
        "entities": seg["entities"], "provenance": prov, "ttlMs": None, "subject": None,
        "predicate": None, "object": None, "riskLevel": None, "sealed": None,
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
                *extract_memories(_for_extraction(seg)))
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
    too_big = oversized(rec, max_payload_bytes)
    if too_big:
        return state, Observation(dead_letter=("oversized", too_big))
    bad = invalid(rec)
    if bad:
        return state, Observation(dead_letter=("invalid", bad))
    kind, text, ok = _slice(source, rec)
    if kind == "step" and not text:
        return state, Observation()  # a bare step boundary carries nothing to observe
    seg_id = stable_id("seg", rec["sessionId"], source, rec["eventSeq"])
    recent = dict(state.recent)
    redelivered = seg_id in recent
    cv = recent[seg_id] if redelivered else state.context_version + 1
    ents = entities(text) if kind not in ("lifecycle", "feedback") else []
    # Entities are NFKC-normalised spans of the text, and NFKC can make a span six times
    # longer (U+3316 is six katakana): a text within the limit could still give a segment
    # over Kafka's 1 MB. The same bound applies to them, so a segment stays under twice it.
    ent_bytes = sum(_nbytes(e) for e in ents)
    if ent_bytes > max_payload_bytes:
        return state, Observation(dead_letter=(
            "oversized", f"the text's entities take {ent_bytes} bytes > {max_payload_bytes}"))
    env = _envelope(source, rec)
    seg: dict[str, Any] = {
        "segmentId": seg_id, "envelope": env, "userId": rec["userId"],
        "workspaceId": rec.get("workspaceId"), "eventTime": rec["eventTime"],
        "contextVersion": cv, "kind": kind, "text": text,
        "entities": ents,
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
