"""Kafka-free replay of a benchmark through the same pure stages the worker runs.

Why: the Kafka evaluation (`mnemoflow eval`) measures the deployed topology, but it needs a
broker, a worker and minutes per run, which is too slow to calibrate weights. This replay builds
the records the host SDK would send (same session ids, eventSeq, turn/step, event times and
provenance), runs them through `observe` (segments and memory-log events), folds the
memory-log into a `MemoryStore`, feeds the same events to a `VectorSink` over an in-memory
`ArrayIndex` (or a LanceDB `VectorIndex` in a temporary folder with `--lancedb`), then asks
each question as the host does (a new session: lifecycle start, then the ephemeral user
message), runs the gate's `decide` for the RecallRequest and `recall` → `rank` → `check` →
`build` exactly as the recall agent does. The ranked list is read from the broker's audit
record and scored with `metrics.ranked_scores`, like the Kafka evaluation.

    python -m mnemoflow.evaluation.offline locomo ../shared/data/locomo/dev.json --out /tmp/o
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from mnemoflow.agents.broker import BrokerState, build
from mnemoflow.agents.gate import GateState, decide
from mnemoflow.agents.observer import ObserverState, observe
from mnemoflow.agents.rank import RankResult, rank
from mnemoflow.agents.recall import RecallResult, TierSpec, recall
from mnemoflow.agents.safety import check
from mnemoflow.agents.tuning import Tuning, load_tuning
from mnemoflow.evaluation import baselines
from mnemoflow.evaluation.array_index import ArrayIndex
from mnemoflow.evaluation.datasets import (
    TURN_GAP_MS,
    Benchmark,
    Question,
    load_locomo,
    load_longmemeval,
)
from mnemoflow.evaluation.embed_cache import DiskCachedEmbedder
from mnemoflow.evaluation.metrics import host_provenance, ranked_scores, summarise
from mnemoflow.projections.embedding import AsyncEmbedder, Embedder, MiniLMEmbedder
from mnemoflow.projections.memory_store import LexicalTier, MemoryStore
from mnemoflow.projections.vector_tier import VectorSink, VectorTier

SCHEMA_VERSION = 1


def capability(mode: str) -> dict[str, Any]:
    """The manifest `evaluation.replay.manifest(mode)` declares, as its record."""
    return {"provider": "eval", "model": "replay", "reasoning": "none",
            "includeRuntimeContext": True, "complete": False,
            "supportsPreStep": mode == "soft", "supportsUserMessage": False,
            "abortAndResume": False}


@dataclass
class HostSessionRecords:
    """The SessionEvent records `streams.host.HostSession` produces, without a producer."""

    session_id: str
    user_id: str
    agent_id: str = "agent"
    turn: int = 0
    step: int = 0
    seq: int = 0

    def _rec(self, t: int, etype: str, **fields: Any) -> dict[str, Any]:
        self.seq += 1
        return {"schemaVersion": SCHEMA_VERSION, "sessionId": self.session_id,
                "agentId": self.agent_id, "userId": self.user_id, "workspaceId": None,
                "eventSeq": self.seq, "turn": self.turn, "step": self.step, "eventTime": int(t),
                "type": etype, "text": None, "provenance": None, "lifecycle": None,
                "capability": None, "feedbackKind": None, "feedbackRef": None, "attributes": {},
                **fields}

    def lifecycle(self, action: str, t: int, mode: str) -> dict[str, Any]:
        return self._rec(t, "lifecycle", lifecycle=action, capability=capability(mode))

    def user_message(self, text: str, t: int, provenance: str | None = None,
                     remember: bool = True) -> dict[str, Any]:
        self.turn += 1
        self.step = 0
        return self._rec(t, "user_message", text=text, provenance=provenance,
                         attributes={} if remember else {"memory": "off"})

    def assistant_message(self, text: str, t: int, provenance: str | None = None) -> dict[str, Any]:
        return self._rec(t, "assistant_message", text=text, provenance=provenance)


def haystack_records(bench: Benchmark, mode: str) -> Iterator[list[dict[str, Any]]]:
    """Per haystack session, its records in the order `evaluation.replay` sends them."""
    for sess in sorted(bench.sessions, key=lambda s: (s.user, s.time_ms, s.key)):
        hs = HostSessionRecords(f"{sess.user}/{sess.key}", sess.user)
        recs = [hs.lifecycle("start", sess.time_ms, mode)]
        for i, turn in enumerate(sess.turns):
            t = sess.time_ms + (i + 1) * TURN_GAP_MS
            if turn.role == "user":
                recs.append(hs.user_message(turn.text, t, provenance=turn.provenance))
            else:
                recs.append(hs.assistant_message(turn.text, t, provenance=turn.provenance))
        yield recs


def question_records(q: Question, mode: str) -> list[dict[str, Any]]:
    qs = HostSessionRecords(f"{q.user}/q/{q.qid}", q.user)
    return [qs.lifecycle("start", q.time_ms - 1000, mode),
            qs.user_message(q.text, q.time_ms, remember=False)]


def default_embedder() -> Embedder:
    return DiskCachedEmbedder(MiniLMEmbedder())


@dataclass
class World:
    """Everything the worker would hold after projecting the haystack."""

    bench: Benchmark
    tuning: Tuning
    mode: str
    store: MemoryStore
    memory_events: list[dict[str, Any]]
    index: Any = None  # ArrayIndex | VectorIndex | None
    embedder: AsyncEmbedder | None = None
    tiers: list[TierSpec] = field(default_factory=list)
    wall_s: dict[str, float] = field(default_factory=dict)

    def close(self) -> None:
        if self.embedder is not None:
            self.embedder.close(wait=False)


def observe_haystack(bench: Benchmark, tuning: Tuning, mode: str = "soft") -> list[dict[str, Any]]:
    """The memory-log the observer writes for the haystack, in log order per session."""
    events: list[dict[str, Any]] = []
    for recs in haystack_records(bench, mode):
        state = ObserverState.from_json(None, tuning.gate.window_cap, tuning.gate.window_ms)
        for rec in recs:
            state, obs = observe(state, "session-events", rec)
            events.extend(obs.memory_events)
    return events


def fold_store(events: Sequence[dict[str, Any]], tuning: Tuning) -> MemoryStore:
    store = MemoryStore(index=tuning.index)
    for ev in events:
        store.apply(ev)
    return store


def build_vectors(events: Sequence[dict[str, Any]], tuning: Tuning, embedder: AsyncEmbedder,
                  index: Any = None) -> Any:
    """Feed the memory-log to a VectorSink over `index` (an ArrayIndex by default)."""
    index = index if index is not None else ArrayIndex()
    sink = VectorSink(index, embedder, batch=512, timeout_s=3600.0,
                      context_weight=tuning.index.vector_context_weight,
                      embed_max_chars=tuning.index.embed_max_chars)
    for ev in events:
        sink.on_event(ev)
    asyncio.run(sink.flush())
    return index


def build_world(bench: Benchmark, tuning: Tuning, mode: str = "soft", vector: bool = True,
                embedder: Embedder | None = None, lancedb_dir: Path | None = None,
                events: list[dict[str, Any]] | None = None) -> World:
    """Observe the haystack, fold the memory-log, embed and index it (as the worker would)."""
    t0 = time.monotonic()
    events = events if events is not None else observe_haystack(bench, tuning, mode)
    store = fold_store(events, tuning)
    world = World(bench, tuning, mode, store, events)
    world.tiers = [TierSpec(LexicalTier(store), timeout_s=2.0)]
    world.wall_s["observe_fold"] = time.monotonic() - t0
    if vector:
        t1 = time.monotonic()
        inner = embedder or default_embedder()
        world.embedder = AsyncEmbedder(inner)
        index = None
        if lancedb_dir is not None:
            from mnemoflow.projections.vector_index import open_index
            from mnemoflow.projections.vector_tier import index_meta

            index = open_index(lancedb_dir, index_meta(inner, tuning.index))
        world.index = build_vectors(events, tuning, world.embedder, index)
        # the questions in one batch: the tier's per-query embeds are then cache hits
        inner.embed(sorted({q.text for q in bench.questions}))
        store.name = f"lexical+vector:{inner.version}"  # as the worker names a vector build
        world.tiers.append(TierSpec(VectorTier(store, world.index, world.embedder),
                                    timeout_s=3.0))
        world.wall_s["embed_index"] = time.monotonic() - t1
    return world


@dataclass(frozen=True)
class Asked:
    """One question's path through gate, recall, rank and broker."""

    qid: str
    gate_action: str
    request: dict[str, Any] | None
    result: RecallResult | None = None
    ranked: RankResult | None = None
    audit: dict[str, Any] | None = None
    packet_items: tuple[dict[str, Any], ...] = ()

    @property
    def ranked_turns(self) -> list[str]:
        """Dataset turn ids of the audited candidates, as `metrics.per_question` reads them."""
        cands = self.audit["candidates"] if self.audit else []
        return [host_provenance(c["provenance"]) for c in cands if c["outcome"] != "visible"]


def gate_request(q: Question, tuning: Tuning, mode: str) -> tuple[str, dict[str, Any] | None]:
    """Observe and gate the question's session as the worker would; the request if it fired."""
    obs_state = ObserverState.from_json(None, tuning.gate.window_cap, tuning.gate.window_ms)
    gate_state = GateState.from_json(None, tuning.gate)
    action, request = "missing", None
    for rec in question_records(q, mode):
        obs_state, obs = observe(obs_state, "session-events", rec)
        if obs.segment is None:
            continue
        gate_state, out = decide(gate_state, obs.segment, tuning.gate)
        if out.decision is not None and obs.segment["kind"] not in ("lifecycle", "feedback"):
            action, request = out.decision.action, out.request
    return action, request


async def recall_for(world: World, request: dict[str, Any]) -> RecallResult:
    return await recall(request, world.tiers, world.tuning.rank.recall_k)


def rank_and_audit(world: World, qid: str, action: str, request: dict[str, Any],
                   result: RecallResult, tuning: Tuning | None = None) -> Asked:
    """The recall agent's steps after recall: rank, safety check, broker (a fresh session)."""
    t = (tuning or world.tuning).rank
    version = world.store.version
    state = BrokerState()
    ranked = rank(result.candidates, request, state.recent_digests(request["eventTime"]),
                  version, t)
    verdict = check(ranked.kept, request)
    _, out = build(state, request, result, ranked, verdict, version, version, t)
    items = tuple(out.inbox_op["packet"]["items"]) if out.inbox_op else ()
    return Asked(qid, action, request, result, ranked, out.audit, items)


async def _ask_all(world: World, questions: Sequence[Question]) -> dict[str, Asked]:
    out: dict[str, Asked] = {}
    for q in questions:
        action, req = gate_request(q, world.tuning, world.mode)
        if req is None:
            out[q.qid] = Asked(q.qid, action, None)
            continue
        res = await recall_for(world, req)
        out[q.qid] = rank_and_audit(world, q.qid, action, req, res)
    return out


def ask_all(world: World, questions: Sequence[Question] | None = None) -> dict[str, Asked]:
    t0 = time.monotonic()
    got = asyncio.run(_ask_all(world, questions if questions is not None else
                               world.bench.questions))
    world.wall_s["questions"] = time.monotonic() - t0
    return got


# ------------------------------------------------------------------------------- metrics


def baseline_lists(world: World) -> dict[str, dict[str, list[str]]]:
    """BM25 (rank_bm25) over the same turns; flat cosine over the plain turn texts' vectors
    (the index holds context-blended ones, which would not be a plain-cosine baseline)."""
    lists = {"bm25": baselines.bm25(world.bench)}
    if world.index is not None and world.embedder is not None:
        tv: dict[tuple[str, str], np.ndarray] = {}
        inner = world.embedder.inner
        seg = [e for e in world.memory_events if e["op"] == "segment_recorded"]
        vecs = inner.embed([e["text"] for e in seg])
        for e, v in zip(seg, vecs, strict=True):
            tv[(e["owner"], host_provenance(",".join(e["provenance"])))] = v
        qv = inner.embed([q.text for q in world.bench.questions])
        lists["cosine"] = baselines.cosine(
            world.bench, tv, {q.qid: v for q, v in zip(world.bench.questions, qv, strict=True)})
    return lists


def score_rows(bench: Benchmark, asked: dict[str, Asked],
               lists: dict[str, dict[str, list[str]]] | None = None) -> pl.DataFrame:
    rows = []
    for q in bench.questions:
        a = asked.get(q.qid)
        if a is None:
            continue
        delivered = {host_provenance(it["provenance"]) for it in a.packet_items}
        row: dict[str, Any] = {
            "qid": q.qid, "category": q.category, "abstention": q.abstention,
            "gate_action": a.gate_action,
            "triggered": a.gate_action in ("retrieve", "prefetch"),
            "packet_items": len(a.packet_items),
            "has_turn_evidence": bool(q.evidence_turns),
        }
        if q.evidence_turns:
            row["packet_turn_recall"] = len(q.evidence_turns & delivered) / len(q.evidence_turns)
        row.update(ranked_scores(q, a.ranked_turns, ""))
        for name, ls in (lists or {}).items():
            row.update(ranked_scores(q, ls.get(q.qid, []), f"{name}:"))
        rows.append(row)
    return pl.DataFrame(rows, infer_schema_length=None)


TABLE_COLS = [f"turn_recall@{k}" for k in (1, 3, 5, 10, 25)] + [
    "session_recall_any@5", "session_recall_any@10"]


def table(summary: dict[str, Any], prefixes: Sequence[str] = ("", "bm25:", "cosine:")) -> str:
    """A plain-text table of the headline figures, overall and per category."""
    short = [c.replace("turn_recall", "tr").replace("session_recall_any", "sa") for c in TABLE_COLS]
    lines = [f"{'system':<26}" + " ".join(f"{c:>7}" for c in short)]
    ov = summary["overall"]
    for p in prefixes:
        if f"{p}turn_recall@1" not in ov:
            continue
        vals = " ".join(f"{ov.get(p + c, float('nan')):7.3f}" for c in TABLE_COLS)
        lines.append(f"{(p.rstrip(':') or 'mnemoflow'):<25} {vals}")
    for cat in summary["per_category"]:
        vals = " ".join(f"{(cat.get(c) if cat.get(c) is not None else float('nan')):7.3f}"
                        for c in TABLE_COLS)
        lines.append(f"  {str(cat['category'])[:23]:<23} {vals}  (n={cat['n']})")
    return "\n".join(lines)


def load_bench(name: str, path: Path, limit: int | None = None, ids: list[str] | None = None,
               roles: tuple[str, ...] = ("user", "assistant")) -> Benchmark:
    if name == "locomo":
        return load_locomo(path, ids, limit)
    return load_longmemeval(path, ids, limit, roles)


def evaluate(bench: Benchmark, tuning: Tuning, mode: str = "soft", vector: bool = True,
             lancedb: bool = False, with_baselines: bool = True,
             embedder: Embedder | None = None) -> tuple[dict[str, Any], pl.DataFrame]:
    tmp = tempfile.TemporaryDirectory(prefix="mnemo-offline-") if lancedb else None
    try:
        world = build_world(bench, tuning, mode, vector, embedder,
                            Path(tmp.name) / "lancedb" if tmp else None)
        asked = ask_all(world)
        lists = baseline_lists(world) if with_baselines else {}
        df = score_rows(bench, asked, lists)
        world.close()
    finally:
        if tmp is not None:
            tmp.cleanup()
    result = {"benchmark": bench.name, "mode": mode, "vector": vector, "lancedb": lancedb,
              "tuning_source": tuning.source, "tuning": tuning.to_dict(),
              "questions": len(bench.questions),
              "question_trigger_rate": float(df["triggered"].mean()) if df.height else 0.0,
              "questions_moved_after_their_haystack": bench.shifted_questions,
              "memories": len(world.store), "wall_s": world.wall_s,
              "summary": summarise(df)}
    return result, df


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mnemoflow.evaluation.offline",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("benchmark", choices=["locomo", "longmemeval"])
    p.add_argument("file", type=Path)
    p.add_argument("--limit", type=int)
    p.add_argument("--conversations", "--questions", nargs="*", dest="ids")
    p.add_argument("--roles", default="user,assistant")
    p.add_argument("--mode", choices=["soft", "shadow"], default="soft")
    p.add_argument("--weights", type=Path, help="tuning JSON overriding agents/tuning.json")
    p.add_argument("--no-vector", action="store_true", help="lexical tier only")
    p.add_argument("--lancedb", action="store_true",
                   help="LanceDB VectorIndex in a temporary folder instead of the numpy index")
    p.add_argument("--no-baselines", action="store_true")
    p.add_argument("--out", type=Path)
    a = p.parse_args(argv)
    bench = load_bench(a.benchmark, a.file, a.limit, a.ids, tuple(a.roles.split(",")))
    tuning = load_tuning(a.weights)
    result, df = evaluate(bench, tuning, a.mode, not a.no_vector, a.lancedb,
                          not a.no_baselines)
    result["command"] = " ".join(["python -m mnemoflow.evaluation.offline", *(argv or sys.argv[1:])])
    print(table(result["summary"]))
    print(f"trigger rate {result['question_trigger_rate']:.3f}, memories {result['memories']}, "
          f"wall {json.dumps({k: round(v, 1) for k, v in result['wall_s'].items()})}")
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "metrics.json").write_text(json.dumps(result, indent=2, default=float))
        df.write_csv(a.out / "per_question.csv")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
