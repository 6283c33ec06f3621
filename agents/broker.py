"""C-06/C-07 injection broker: ranked, safe candidates -> a MemoryPacket for the next step, or nothing.

No packet when: the request is stale (older contextVersion, or the index changed under it),
every recall tier failed, safety did not allow, nothing survived, or the host declared no
packet surface (packetPatch = none: shadow mode, audit only). A redelivered request re-emits
the op it produced the first time, byte for byte, so the inbox fold dedupes it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from typing import Any

from mnemoflow.agents.ids import stable_id
from mnemoflow.agents.rank import RankResult
from mnemoflow.agents.recall import RecallResult
from mnemoflow.agents.safety import SafetyVerdict
from mnemoflow.agents.tuning import RankTuning

PACKET_SCHEMA_VERSION = 1
RECENT_CAP = 64
DONE_CAP = 4


def capability_snapshot(manifest: dict[str, Any] | None) -> dict[str, Any]:
    """C-07 snapshot from what the adapter declared; nothing is inferred from a model name."""
    m = manifest or {}
    return {
        "reasoning": m.get("reasoning", "unknown"),
        "runtimeContext": "native" if m.get("includeRuntimeContext", True) else "none",
        "packetPatch": ("pre-step" if m.get("supportsPreStep")
                        else "user-message" if m.get("supportsUserMessage") else "none"),
        "abortAndResume": bool(m.get("abortAndResume")),
        "declared": manifest is not None,
    }


@dataclass(frozen=True)
class BrokerState:
    latest_cv: int = 0
    recent: tuple[tuple[str, int], ...] = ()  # (item digest, packet expiry): cross-packet dedupe
    done: tuple[tuple[str, dict[str, Any] | None, dict[str, Any]], ...] = ()  # (req, op, audit)

    def to_json(self) -> dict[str, Any]:
        return {"latest_cv": self.latest_cv, "recent": [list(r) for r in self.recent],
                "done": [list(d) for d in self.done]}

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> BrokerState:
        if not data:
            return cls()
        return cls(data["latest_cv"], tuple((d, int(u)) for d, u in data["recent"]),
                   tuple((d[0], d[1], d[2]) for d in data["done"]))

    def recent_digests(self, now_ms: int) -> tuple[str, ...]:
        """Digests of items injected in packets that have not expired by event time `now_ms`.

        Once a packet expires undelivered, its items may be retrieved again.
        """
        return tuple(d for d, until in self.recent if until > now_ms)

    def replayed(self, request_id: str) -> tuple[dict[str, Any] | None, dict[str, Any]] | None:
        for rid, op, audit in self.done:
            if rid == request_id:
                return op, audit
        return None


@dataclass(frozen=True)
class BrokerOutput:
    inbox_op: dict[str, Any] | None
    audit: dict[str, Any]
    replayed: bool = False


def _digest(parts: list[str]) -> str:
    return hashlib.sha256("\n".join(sorted(parts)).encode()).hexdigest()


def _strength(verdict: SafetyVerdict, request: dict[str, Any]) -> str:
    kinds = {r.candidate.kind for r in verdict.allowed}
    if "procedure" in kinds:
        return "checklist"  # procedures are only ever advice / a checklist (M-04)
    return "direct_context" if request["action"] == "retrieve" else "soft_hint"


def _item(r: Any) -> dict[str, Any]:
    c = r.candidate
    return {"memoryId": c.memory_id, "kind": c.kind, "text": c.text, "scope": c.scope,
            "owner": c.owner, "score": r.activation, "sourceSeq": c.event_seq,
            "sourceSessionId": c.session_id, "provenance": c.provenance,
            "eventTime": c.event_time, "digest": c.digest, "tiers": list(c.tiers),
            "sealed": None}


def audit_candidates(ranked: RankResult, safety_reason: dict[str, str],
                     t: RankTuning) -> list[dict[str, Any]]:
    """The first `audit_candidates` of rank's order, each with its outcome (G-02)."""
    out = []
    for r in ranked.ordered[: t.audit_candidates]:
        c = r.candidate
        outcome = r.outcome
        if outcome == "kept" and safety_reason.get(c.memory_id, "ok") != "ok":
            outcome = safety_reason[c.memory_id].split(":")[0]
            outcome = "ask" if outcome == "high-risk" else outcome
        out.append({"memoryId": c.memory_id, "score": r.activation, "outcome": outcome,
                    "digest": c.digest, "provenance": c.provenance, "scope": c.scope,
                    "owner": c.owner, "tiers": list(c.tiers)})
    return out


def build(state: BrokerState, request: dict[str, Any], result: RecallResult, ranked: RankResult,
          verdict: SafetyVerdict, retrieval_version: str, current_version: str,
          t: RankTuning, memory_off: bool = False) -> tuple[BrokerState, BrokerOutput]:
    """Decide the packet for one recall request and the audit record that explains it.
    (A redelivered request never gets here: `respond` re-emits its first answer.)"""
    now = request["eventTime"]
    replay = bool(request.get("replayOf"))  # an operator's what-if (see `respond`)
    cap = capability_snapshot(request.get("capability"))
    safety_reason = {v.ranked.candidate.memory_id: v.reason for v in verdict.items}
    audit_cands = audit_candidates(ranked, safety_reason, t)
    allowed = verdict.allowed
    if memory_off:
        action, reason = "suppress", "disabled"  # an operator switched the memory off
    elif request["contextVersion"] < state.latest_cv and not replay:
        action, reason = "drop", "stale-context"
    elif retrieval_version != current_version:
        action, reason = "drop", "stale-retrieval"
    elif result.failed:
        action, reason = "drop", "recall-failed"
    elif not ranked.kept and any(r.outcome == "weak" for r in ranked.ordered):
        action, reason = "suppress", "weak"  # rank's packet floor: nothing good enough
    elif verdict.action != "allow":
        action, reason = verdict.action, verdict.reason
    elif not allowed:
        action, reason = "suppress", "empty"
    elif replay:
        action, reason = "shadow", "replay"
    elif cap["packetPatch"] == "none":
        action, reason = "shadow", "packet-patch-none"
    else:
        action, reason = "inject", request["reason"]

    items = [_item(r) for r in allowed] if action in ("inject", "shadow") else []
    exact = _digest([i["digest"] for i in items])
    semantic = _digest([r.candidate.semantic_key for r in allowed]) if items else _digest([])
    size = sum(len(i["text"].encode("utf-8")) for i in items)
    packet_id = stable_id("pkt", request["requestId"], exact, retrieval_version) if items else None
    expiry = now + t.packet_ttl_ms
    op = None
    if action == "inject":
        packet = {
            "packetSchemaVersion": PACKET_SCHEMA_VERSION, "packetId": packet_id,
            "sessionId": request["sessionId"], "requestId": request["requestId"],
            "contextCursor": request["contextVersion"], "retrievalVersion": retrieval_version,
            "triggerReason": f"{request['action']}:{request['reason']}",
            "strength": _strength(verdict, request), "items": items, "exactDigest": exact,
            "semanticDigest": semantic, "sourceSeqs": [i["sourceSeq"] for i in items],
            "budgetBytes": size, "createdAt": now, "expiry": expiry,
        }
        op = {"opId": stable_id("op", "inject", packet_id), "op": "inject",
              "sessionId": request["sessionId"], "eventTime": now, "packet": packet,
              "packetIds": [packet_id], "claimer": None, "reason": packet["triggerReason"],
              "authorisedBy": None}
    audit = {
        "auditId": stable_id("audit", "broker", request["requestId"]),
        "sessionId": request["sessionId"], "userId": request["userId"], "stage": "broker",
        "action": action, "reason": reason, "eventTime": now, "eventSeq": request["eventSeq"],
        "contextVersion": request["contextVersion"], "segmentId": request["segmentId"],
        "segmentDigest": request["digest"], "requestId": request["requestId"],
        "packetId": packet_id, "score": request["score"], "signals": request["signals"],
        "candidates": audit_cands, "sourceSeqs": [i["sourceSeq"] for i in items],
        "bytes": size, "expiry": expiry if items else 0, "tiers": dict(result.tiers),
        "indexVersion": retrieval_version, "ingestTime": request.get("ingestTime", 0),
    }
    if replay:  # answered once (a redelivery re-emits it); nothing the session sees changes
        return (replace(state, done=(*state.done, (request["requestId"], op, audit))[-DONE_CAP:]),
                BrokerOutput(op, audit))
    recent = state.recent
    if action == "inject":
        recent = (*[r for r in recent if r[1] > now],
                  *[(i["digest"], expiry) for i in items])[-RECENT_CAP:]
    new_state = replace(
        state, latest_cv=max(state.latest_cv, request["contextVersion"]), recent=recent,
        done=(*state.done, (request["requestId"], op, audit))[-DONE_CAP:])
    return new_state, BrokerOutput(op, audit)
