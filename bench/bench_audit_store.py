"""Bench: the audit store (`projections/audit_store.py`) over 100k synthetic audit records,
without Kafka. Run: .venv/bin python bench/bench_audit_store.py [--audits 100000]

The records have the pipeline's shapes (every field of their Avro schemas; a sample of each
kind is encoded and decoded with the codec first): per session 20 user events, each with its
segment, its memory-log record and its gate audit; one event in four fires, which adds a
broker audit with 10 candidates; half of those inject a packet (2 items) that the host claims
and reports delivered. They are folded in batches of 5,000 (as `mnemoflow audit` syncs) into
a file, then the two queries are timed on random packets and sessions, each as a ratio to
baselines measured in the same run on the same data:
- count: `SELECT count(*) FROM audit`, the cheapest statement over the table;
- lookup: `SELECT * FROM audit WHERE packet_id = ?`, one indexed lookup, the floor of each of
  the statements a query makes;
- python scan: the same chain (or session) picked out of the decoded records in Python, the
  way one would answer without the store (read the topics, filter the records).
The queries are timed again without the secondary indexes, to show what they buy.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from common import fmt, pct, write_results

from mnemoflow.agents.ids import stable_id
from mnemoflow.agents.partitioning import partition_of
from mnemoflow.projections import audit_queries as Q
from mnemoflow.projections.audit_store import INDEXES, AuditStore, LogRecord
from mnemoflow.schemas.codec import default_registry
from mnemoflow.streams.topics import VALUE_SCHEMA

T0 = 1_700_000_000_000
PARTS = 4
EVENTS_PER_SESSION = 20
SIGNALS = ("novelty", "unresolved", "phase_shift", "tool_failure", "conflict", "historical",
           "question", "recall_cue")


def _event(sid: str, user: str, seq: int, t: int, **kw: Any) -> dict[str, Any]:
    return {"schemaVersion": 1, "sessionId": sid, "agentId": "a", "userId": user,
            "workspaceId": None, "eventSeq": seq, "turn": seq, "step": 0, "eventTime": t,
            "type": "user_message", "text": f"turn {seq} of {sid}: the deploy of atlas {seq}",
            "provenance": None, "lifecycle": None, "capability": None, "feedbackKind": None,
            "feedbackRef": None, "attributes": {}, **kw}


def _segment(ev: dict[str, Any], seg_id: str) -> dict[str, Any]:
    return {"segmentId": seg_id, "envelope": {
        "schemaVersion": 1, "sessionId": ev["sessionId"], "agentId": "a",
        "eventSeq": ev["eventSeq"], "turn": ev["turn"], "step": 0, "sourceKind": "user",
        "callId": None, "rootCallId": None, "payloadDigest": "d" * 64},
        "userId": ev["userId"], "workspaceId": None, "eventTime": ev["eventTime"],
        "contextVersion": ev["eventSeq"], "kind": "user", "text": ev["text"],
        "entities": ["atlas"], "digest": stable_id("dg", seg_id, length=64)[3:],
        "semanticKey": "k", "ok": None, "toolName": None,
        "provenance": f"{ev['sessionId']}#{ev['turn']}.0", "lifecycle": None,
        "capability": None, "feedbackKind": None, "feedbackRef": None, "evicted": [],
        "ingestTime": ev["eventTime"] + 5, "attributes": {}}


def _memory(seg: dict[str, Any]) -> dict[str, Any]:
    env = seg["envelope"]
    return {"eventId": stable_id("mem", seg["segmentId"]), "op": "segment_recorded",
            "memoryId": seg["segmentId"], "kind": "segment", "scope": "User",
            "owner": seg["userId"], "sessionId": env["sessionId"], "eventSeq": env["eventSeq"],
            "eventTime": seg["eventTime"], "text": seg["text"], "entities": ["atlas"],
            "provenance": [seg["provenance"]], "source": "user", "confidence": 0.6,
            "ttlMs": None, "subject": None, "predicate": None, "object": None,
            "riskLevel": None, "attributes": {}}


def _audit(seg: dict[str, Any], stage: str, action: str, reason: str, rid: str | None,
           **kw: Any) -> dict[str, Any]:
    env = seg["envelope"]
    return {"auditId": stable_id("audit", stage, rid or seg["segmentId"]),
            "sessionId": env["sessionId"], "userId": seg["userId"], "stage": stage,
            "action": action, "reason": reason, "eventTime": seg["eventTime"],
            "eventSeq": env["eventSeq"], "contextVersion": seg["contextVersion"],
            "segmentId": seg["segmentId"], "segmentDigest": seg["digest"], "requestId": rid,
            "packetId": None, "score": 0.5, "signals": dict.fromkeys(SIGNALS, 0.5),
            "candidates": [], "sourceSeqs": [env["eventSeq"]], "bytes": 0, "expiry": 0,
            "tiers": {}, "indexVersion": None, "ingestTime": seg["ingestTime"],
            "emitTime": seg["ingestTime"] + 20, **kw}


def synthesize(audits: int, seed: int = 5) -> dict[str, list[tuple[str, dict[str, Any]]]]:
    """(key, value) logs per topic with `audits` audit records (gate and broker)."""
    rng = random.Random(seed)
    # per session: 20 gate records, and a broker record for one event in four
    sessions = max(1, round(audits / (EVENTS_PER_SESSION * 1.25)))
    logs: dict[str, list[tuple[str, dict[str, Any]]]] = {
        t: [] for t in ("session-events", "segments", "audit", "inbox", "memory-log")}
    n_audit = 0
    for s in range(sessions):
        sid, user = f"sess-{s:06d}", f"user-{s // 4:05d}"  # 4 sessions per user
        pool: list[dict[str, Any]] = []  # the user's memories so far, as candidates
        seq = 0
        for i in range(EVENTS_PER_SESSION):
            if n_audit >= audits:
                break
            seq += 1
            t = T0 + s * 3_600_000 + i * 60_000
            ev = _event(sid, user, seq, t)
            seg = _segment(ev, stable_id("seg", sid, "session-events", seq))
            logs["session-events"].append((sid, ev))
            logs["segments"].append((sid, seg))
            logs["memory-log"].append((user, _memory(seg)))
            fires = i % 4 == 3 and pool
            rid = stable_id("req", seg["segmentId"]) if fires else None
            logs["audit"].append((sid, _audit(seg, "gate", "retrieve" if fires else "suppress",
                                              "above-threshold" if fires else "below-threshold",
                                              rid)))
            n_audit += 1
            if fires and n_audit < audits:
                cands = rng.sample(pool, min(10, len(pool)))
                outcomes = ["kept", "kept", *rng.choices(
                    ["duplicate", "budget", "low-relevance", "injection"], k=len(cands) - 2)]
                inject = rng.random() < 0.5
                items = [c for c, o in zip(cands, outcomes, strict=False) if o == "kept"]
                pid = stable_id("pkt", rid, s, i) if inject else None
                logs["audit"].append((sid, _audit(
                    seg, "broker", "inject" if inject else "suppress",
                    "above-threshold" if inject else "empty", rid, packetId=pid,
                    candidates=[{"memoryId": c["memoryId"], "score": 1.0 - k / 10,
                                 "outcome": o, "digest": "d" * 64, "provenance": "p",
                                 "scope": "User", "owner": user, "tiers": ["lexical"]}
                                for k, (c, o) in enumerate(zip(cands, outcomes, strict=False))],
                    tiers={"lexical": "ok", "vector": "ok", "graph": "skipped"},
                    indexVersion="v1", bytes=120 if inject else 0)))
                n_audit += 1
                if inject:
                    _inject(logs, sid, user, seq, t, rid, pid, items)  # type: ignore[arg-type]
                    seq += 1
            pool.append(_memory(seg))
    return logs


def _inject(logs: dict[str, list[tuple[str, dict[str, Any]]]], sid: str, user: str, seq: int,
            t: int, rid: str, pid: str, items: list[dict[str, Any]]) -> None:
    packet = {"packetSchemaVersion": 1, "packetId": pid, "sessionId": sid, "requestId": rid,
              "contextCursor": seq, "retrievalVersion": "v1", "triggerReason": "retrieve:x",
              "strength": "direct_context", "items": [{
                  "memoryId": m["memoryId"], "kind": "segment", "text": m["text"],
                  "scope": "User", "owner": user, "score": 1.0, "sourceSeq": m["eventSeq"],
                  "sourceSessionId": m["sessionId"], "provenance": m["provenance"][0],
                  "eventTime": m["eventTime"], "digest": "d" * 64, "tiers": ["lexical"]}
                  for m in items],
              "exactDigest": stable_id("x", pid, length=64)[2:], "semanticDigest": "s",
              "sourceSeqs": [m["eventSeq"] for m in items], "budgetBytes": 120,
              "createdAt": t, "expiry": t + 600_000}
    base = {"sessionId": sid, "claimer": None, "reason": None, "authorisedBy": None}
    logs["inbox"].append((sid, {**base, "opId": stable_id("op", "inject", pid), "op": "inject",
                                "eventTime": t, "packet": packet, "packetIds": [pid],
                                "reason": "retrieve:x"}))
    logs["inbox"].append((sid, {**base, "opId": stable_id("op", "claim", pid), "op": "claim",
                                "eventTime": t + 1, "packet": None, "packetIds": [pid],
                                "claimer": "host-bench"}))
    logs["session-events"].append((sid, _event(
        sid, user, seq + 1, t + 1, type="feedback", text=None, feedbackKind="packet_delivered",
        feedbackRef=pid, attributes={"memoryIds": ",".join(m["memoryId"] for m in items)})))


def as_records(logs: dict[str, list[tuple[str, dict[str, Any]]]]) -> list[LogRecord]:
    out = []
    for topic, kvs in logs.items():
        offsets = [0] * PARTS
        for key, value in kvs:
            p = partition_of(key, PARTS)
            out.append(LogRecord(topic, p, offsets[p], value))
            offsets[p] += 1
    return out


def check_shapes(logs: dict[str, list[tuple[str, dict[str, Any]]]]) -> None:
    """Each kind of synthetic record encodes and decodes with the topic's schema."""
    reg = default_registry()
    for topic, kvs in logs.items():
        seen: set[tuple[str, ...]] = set()
        for _, v in kvs:
            kind = (v.get("stage") or v.get("op") or v.get("type") or "", str(bool(v.get("packet"))))
            if kind not in seen:
                seen.add(kind)
                reg.decode(reg.encode(VALUE_SCHEMA[topic], v), VALUE_SCHEMA[topic])


def python_chain(logs: dict[str, list[tuple[str, dict[str, Any]]]], pid: str) -> dict[str, Any]:
    """The baseline: the same chain picked out of the decoded records by scanning them."""
    broker = next(a for _, a in logs["audit"] if a["stage"] == "broker" and a["packetId"] == pid)
    gate = next(a for _, a in logs["audit"]
                if a["stage"] == "gate" and a["requestId"] == broker["requestId"])
    seg = next(s for _, s in logs["segments"] if s["segmentId"] == gate["segmentId"])
    ops = [o for _, o in logs["inbox"] if pid in o["packetIds"]]
    fb = [e for _, e in logs["session-events"] if e["feedbackRef"] == pid]
    ids = {c["memoryId"] for c in broker["candidates"]}
    texts = {m["memoryId"]: m["text"] for _, m in logs["memory-log"] if m["memoryId"] in ids}
    return {"gate": gate, "segment": seg, "ops": ops, "feedback": fb, "texts": texts}


def python_timeline(logs: dict[str, list[tuple[str, dict[str, Any]]]], sid: str) -> list[Any]:
    """The baseline for a session: every record of it, from every topic, by scanning."""
    return sorted((v.get("eventTime", 0), t) for t in ("session-events", "audit", "inbox")
                  for _, v in logs[t] if v["sessionId"] == sid) + [
        s for _, s in logs["segments"] if s["envelope"]["sessionId"] == sid]


def timed(fn: Any, args: list[Any]) -> list[float]:
    out = []
    for a in args:
        t = time.perf_counter()
        fn(a)
        out.append((time.perf_counter() - t) * 1000)
    return out


def measure(store: AuditStore, logs: dict[str, Any], pids: list[str], sids: list[str],
            py_n: int) -> dict[str, dict[str, float]]:
    for pid in pids[:5]:  # warm the caches once
        Q.packet_chain(store, pid)
    return {
        "chain": pct(timed(lambda p: Q.packet_chain(store, p), pids)),
        "timeline": pct(timed(lambda s: Q.session_timeline(store, s), sids)),
        "count": pct(timed(lambda _: store.rows("SELECT count(*) FROM audit"), pids)),
        "lookup": pct(timed(lambda p: store.rows(
            "SELECT * FROM audit WHERE packet_id = ?", [p]), pids)),
        "python_chain": pct(timed(lambda p: python_chain(logs, p), pids[:py_n])),
        "python_timeline": pct(timed(lambda s: python_timeline(logs, s), sids[:py_n])),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--audits", type=int, default=100_000)
    ap.add_argument("--queries", type=int, default=300)
    args = ap.parse_args()
    logs = synthesize(args.audits)
    check_shapes(logs)
    records = as_records(logs)
    counts = {t: len(v) for t, v in logs.items()}
    print(f"synthetic records: {counts} ({len(records)} in all)")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.duckdb"
        store = AuditStore(path, source="bench.")
        t = time.perf_counter()
        for i in range(0, len(records), 5000):
            store.fold(records[i:i + 5000])
        fold_s = time.perf_counter() - t
        store.close()
        size_mib = path.stat().st_size / 2**20
        store = AuditStore(path, source="bench.")
        rng = random.Random(11)
        pids = rng.sample([r["packet_id"] for r in store.rows("SELECT packet_id FROM packets")],
                          args.queries)
        sids = rng.sample(sorted({k for k, _ in logs["audit"]}), args.queries)
        with_idx = measure(store, logs, pids, sids, py_n=min(30, args.queries))
        for table, col in INDEXES:
            store.con.execute(f"DROP INDEX {table}_{col}")
        without = measure(store, logs, pids, sids, py_n=5)
        store.close()
    out = {
        "audit_records": counts["audit"], "records": len(records), "fold_s": fold_s,
        "fold_records_per_s": len(records) / fold_s, "file_mib": size_mib,
        "with_indexes": with_idx, "without_indexes": {k: v for k, v in without.items()
                                                      if k in ("chain", "timeline")},
        "ratios_p50": {
            **{f"{q}_vs_{b}": with_idx[q]["p50"] / with_idx[b]["p50"]
               for q in ("chain", "timeline") for b in ("count", "lookup")},
            "chain_vs_python_chain": with_idx["chain"]["p50"] / with_idx["python_chain"]["p50"],
            "timeline_vs_python_timeline": (with_idx["timeline"]["p50"]
                                            / with_idx["python_timeline"]["p50"]),
            "chain_without_vs_with_indexes": without["chain"]["p50"] / with_idx["chain"]["p50"],
            "timeline_without_vs_with_indexes": (without["timeline"]["p50"]
                                                 / with_idx["timeline"]["p50"]),
        },
    }
    print(f"fold: {len(records)} records in {fold_s:.1f}s ({out['fold_records_per_s']:.0f}/s), "
          f"file {size_mib:.1f} MiB")
    for name, d in with_idx.items():
        print(f"{name:18} {fmt(d)}")
    for name in ("chain", "timeline"):
        print(f"{name + ' (no index)':18} {fmt(without[name])}")
    print("p50 ratios: " + ", ".join(f"{k} {v:.2f}" for k, v in out["ratios_p50"].items()))
    write_results("audit_store", out)


if __name__ == "__main__":
    main()
