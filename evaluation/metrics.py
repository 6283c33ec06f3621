"""Metrics from what the pipeline wrote (audit, inbox, memory-log topics), aggregated with polars."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from mnemoflow.agents.injection_rules import load_rules
from mnemoflow.evaluation.datasets import Benchmark, Question, session_of
from mnemoflow.evaluation.replay_log import ReplayLog

KS = (1, 3, 5, 10, 25)


@dataclass(frozen=True)
class TopicData:
    audit: list[dict[str, Any]]
    inbox: list[dict[str, Any]]
    memory: list[dict[str, Any]]


def host_provenance(prov: str) -> str:
    """The host's id of a memory (dataset turn id): the last provenance element."""
    return prov.split(",")[-1]


def _dedupe(xs: list[str]) -> list[str]:
    seen: set[str] = set()
    return [x for x in xs if not (x in seen or seen.add(x))]


def ranked_scores(q: Question, ranked_turns: list[str], prefix: str) -> dict[str, float]:
    """recall@k (turn), session recall (fraction, any, all) and NDCG@k for one ranked list."""
    out: dict[str, float] = {}
    sessions = _dedupe([session_of(t) for t in ranked_turns])
    ev_t, ev_s = q.evidence_turns, q.evidence_sessions
    for k in KS:
        top = set(ranked_turns[:k])
        if ev_t:
            out[f"{prefix}turn_recall@{k}"] = len(ev_t & top) / len(ev_t)
            dcg = sum(1 / math.log2(i + 2) for i, t in enumerate(ranked_turns[:k]) if t in ev_t)
            idcg = sum(1 / math.log2(i + 2) for i in range(min(k, len(ev_t))))
            out[f"{prefix}ndcg@{k}"] = dcg / idcg
        if ev_s:
            stop = set(sessions[:k])
            out[f"{prefix}session_recall@{k}"] = len(ev_s & stop) / len(ev_s)
            out[f"{prefix}session_recall_any@{k}"] = float(bool(ev_s & stop))
            out[f"{prefix}session_recall_all@{k}"] = float(ev_s <= stop)
    return out


def per_question(bench: Benchmark, log: ReplayLog, data: TopicData,
                 baselines: dict[str, dict[str, list[str]]]) -> pl.DataFrame:
    qs = {q.qid: q for q in bench.questions}
    gate = {a["sessionId"]: a for a in data.audit
            if a["stage"] == "gate" and a["reason"] not in ("lifecycle", "feedback")}
    broker = {a["requestId"]: a for a in data.audit if a["stage"] == "broker"}
    packets = {op["packet"]["packetId"]: op["packet"] for op in data.inbox if op["op"] == "inject"}
    claimed: dict[str, list[str]] = {}
    for op in data.inbox:
        if op["op"] == "claim":
            claimed.setdefault(op["sessionId"], []).extend(op["packetIds"])
    rows = []
    for sid, qid in log.question_sessions.items():
        q = qs[qid]
        g = gate.get(sid)
        b = broker.get(g["requestId"]) if g and g["requestId"] else None
        ranked = [host_provenance(c["provenance"]) for c in (b["candidates"] if b else [])
                  if c["outcome"] != "visible"]
        items = [it for pid in claimed.get(sid, []) if pid in packets
                 for it in packets[pid]["items"]]
        delivered = {host_provenance(it["provenance"]) for it in items}
        row: dict[str, Any] = {
            "qid": qid, "category": q.category, "abstention": q.abstention,
            "gate_action": g["action"] if g else "missing",
            "triggered": bool(g and g["action"] in ("retrieve", "prefetch")),
            "broker_action": b["action"] if b else None,
            "packet_items": len(items),
            "packet_bytes": sum(len(it["text"].encode()) for it in items),
            "has_turn_evidence": bool(q.evidence_turns),
        }
        row["packet_rate"] = 1.0 if items else 0.0  # a packet was claimed for the question
        if q.evidence_turns:
            row["packet_turn_recall"] = len(q.evidence_turns & delivered) / len(q.evidence_turns)
            if items:  # the share of the claimed items that are evidence
                row["packet_precision"] = sum(
                    host_provenance(it["provenance"]) in q.evidence_turns for it in items) / len(items)
        if q.evidence_sessions:
            ds = {session_of(p) for p in delivered}
            row["packet_session_recall_any"] = float(bool(q.evidence_sessions & ds))
        row.update(ranked_scores(q, ranked, ""))
        for name, lists in baselines.items():
            row.update(ranked_scores(q, lists.get(qid, []), f"{name}:"))
        rows.append(row)
    return pl.DataFrame(rows, infer_schema_length=None)


def pipeline_metrics(bench: Benchmark, log: ReplayLog, data: TopicData,
                     df: pl.DataFrame) -> dict[str, Any]:
    """Trigger, cost, harm and latency figures over the whole replay."""
    users = dict(log.haystack_sessions)
    qs = {q.qid: q for q in bench.questions}
    users.update({sid: qs[qid].user for sid, qid in log.question_sessions.items()})
    revoked = {m["memoryId"] for m in data.memory
               if m["op"] in ("memory_revoked", "fact_revoked", "procedure_deprecated")}
    injects = [op for op in data.inbox if op["op"] == "inject"]
    hay_injects = [op for op in injects if op["sessionId"] in log.haystack_sessions]
    rules = load_rules()
    leak = revoked_items = unsafe = dup_in = dup_across = 0
    by_session: dict[str, list[dict]] = {}
    for op in injects:
        p = op["packet"]
        by_session.setdefault(p["sessionId"], []).append(p)
        digests = [it["digest"] for it in p["items"]]
        dup_in += len(digests) - len(set(digests))
        for it in p["items"]:
            leak += it["owner"] != users.get(p["sessionId"])
            revoked_items += it["memoryId"] in revoked
            unsafe += rules.detect(it["text"]).flagged
    for packets in by_session.values():
        packets.sort(key=lambda p: (p["contextCursor"], p["packetId"]))
        for a, b in zip(packets, packets[1:], strict=False):
            dup_across += len({i["digest"] for i in a["items"]} & {i["digest"] for i in b["items"]})
    lat = [a["emitTime"] - a["ingestTime"] for a in data.audit
           if a["stage"] == "broker" and a["action"] == "inject" and a["ingestTime"] > 0]
    sizes = [p["packet"]["budgetBytes"] for p in injects]
    q_total = df.height
    return {
        "questions": q_total,
        "question_trigger_rate": float(df["triggered"].mean()) if q_total else 0.0,
        "ordinary_turn_packets_per_100_events":
            100 * len(hay_injects) / max(1, log.haystack_events),
        "packets": len(injects),
        "bytes_per_packet_mean": float(np.mean(sizes)) if sizes else 0.0,
        "bytes_per_packet_p50": float(np.median(sizes)) if sizes else 0.0,
        "harm": {"leaked_items": leak, "revoked_items": revoked_items,
                 "instruction_like_items": unsafe, "duplicates_within_packet": dup_in,
                 "duplicates_across_consecutive_packets": dup_across},
        "latency_ms": {f"p{p}": float(np.percentile(lat, p)) for p in (50, 95, 99)} if lat
        else {},
        "latency_samples": lat,
    }


def summarise(df: pl.DataFrame) -> dict[str, Any]:
    """Means of every score column, overall and per category (abstention questions apart)."""
    score_cols = [c for c in df.columns if "@" in c or c.startswith("packet_")
                  or c == "triggered"]
    main = df.filter(~pl.col("abstention"))
    overall = main.select([pl.col(c).cast(pl.Float64).mean().alias(c) for c in score_cols])
    per_cat = (main.group_by("category").agg(
        [pl.len().alias("n")] + [pl.col(c).cast(pl.Float64).mean().alias(c) for c in score_cols])
        .sort("category"))
    out = {"overall": overall.to_dicts()[0] if main.height else {},
           "per_category": per_cat.to_dicts()}
    abst = df.filter(pl.col("abstention"))
    if abst.height:
        out["abstention"] = abst.select(
            [pl.len().alias("n")] + [pl.col(c).cast(pl.Float64).mean().alias(c)
                                     for c in score_cols]).to_dicts()[0]
    return out


WALL_CLOCK_FIELDS = ("emitTime", "ingestTime")  # when, not what: they differ between runs


def question_audits(log: ReplayLog, data: TopicData) -> list[dict[str, Any]]:
    """Every audit record of the question sessions (gate and broker), without its wall-clock
    times, ordered by session and stage: what two runs of one replay must agree on."""
    order = {sid: i for i, sid in enumerate(sorted(log.question_sessions))}
    audits = [{k: v for k, v in a.items() if k not in WALL_CLOCK_FIELDS}
              for a in data.audit if a["sessionId"] in order]
    return sorted(audits, key=lambda a: (order[a["sessionId"]], a["stage"] != "gate",
                                         a["eventSeq"], a["auditId"]))


def write_audits(path: Path, audits: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(a, sort_keys=True, default=str) + "\n" for a in audits))
