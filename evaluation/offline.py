"""Kafka-free replay of a benchmark: the same topology, run in memory, measured the same way.

Why: the Kafka evaluation (`mnemoflow eval`) measures the deployed topology, but it needs a
broker, a worker and minutes per run, which is too slow to calibrate weights. This replay
sends the same host traffic (the host SDK's own `HostSession`, same session ids, eventSeq,
turn/step, event times and provenance) into an `InMemoryRunner` over the same memory the
worker builds (`projections.memory`: lexical, vector and graph tiers), claims each question's
packets at its step boundary as the host does, and scores what the runner's topics hold with
the Kafka evaluation's own `metrics.per_question`. The two therefore give the same audits and
the same per-question figures (`tests/contract/`).

    python -m mnemoflow.evaluation.offline locomo ../shared/data/locomo/dev.json --out /tmp/o
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import polars as pl

from mnemoflow.agents.injection_rules import load_rules
from mnemoflow.agents.topology import Ports
from mnemoflow.agents.tuning import Tuning, load_tuning
from mnemoflow.evaluation import baselines
from mnemoflow.evaluation.datasets import (
    Benchmark,
    load_locomo,
    load_longmemeval,
)
from mnemoflow.evaluation.metrics import (
    TopicData,
    per_question,
    pipeline_metrics,
    question_audits,
    summarise,
    write_audits,
)
from mnemoflow.evaluation.replay_log import ReplayLog, send_haystack
from mnemoflow.projections.array_index import ArrayIndex
from mnemoflow.projections.embedders import build_embedder
from mnemoflow.projections.embedding import (
    DEFAULT_EMBED_CACHE_DIR,
    AsyncEmbedder,
    CachedEmbedder,
    Embedder,
)
from mnemoflow.projections.partitioned import build_partitioned, partition_dir
from mnemoflow.projections.vector_tier import index_meta
from mnemoflow.streams.config import Settings
from mnemoflow.streams.host import CapabilityManifest, HostSession
from mnemoflow.streams.memory_runner import InMemoryRunner, MemoryHostClient, wall_ms

# what the Kafka evaluation's worker is given (evaluation.run.REPLAY_WORKER_ENV): an embedding
# backlog must not turn a vector search into a lexical answer
VECTOR_TIMEOUT_S = 120.0


def manifest(mode: str) -> CapabilityManifest:
    """soft: a pre-step packet surface; shadow: none, so the pipeline records and never injects."""
    return CapabilityManifest(provider="eval", model="replay", reasoning="none",
                              supportsPreStep=mode == "soft")


def default_embedder() -> Embedder:
    """The configured model behind the on-disk cache: each text is embedded once per model."""
    settings = Settings()
    return CachedEmbedder(build_embedder(settings.embedding_model, settings.embedder),
                          disk_dir=DEFAULT_EMBED_CACHE_DIR)


def runner_for(tuning: Tuning, *, vector: bool = True, embedder: Embedder | None = None,
               lancedb_dir: Path | None = None, graph: bool = True,
               max_payload_bytes: int = 262144, partitions: int | None = None) -> InMemoryRunner:
    """The topology in memory over the memory the worker builds (the same tiers and timeouts,
    one memory per partition as the worker's, `MNEMOFLOW_PARTITIONS` unless given); the
    vector indexes are in-memory ones, or LanceDB under `lancedb_dir`."""
    aemb = None
    index_for: Any = None
    if vector:
        inner = embedder or default_embedder()
        aemb = AsyncEmbedder(inner)
        meta = index_meta(inner, tuning.index)
        if lancedb_dir is not None:
            from mnemoflow.projections.vector_index import open_index

            root = lancedb_dir

            def index_for(p: int, folder: Path | None) -> Any:
                return partial(open_index, root / partition_dir(p), meta)
        else:
            def index_for(p: int, folder: Path | None) -> Any:
                return ArrayIndex(meta)
    memory = build_partitioned(tuning, partitions or Settings().partitions, index_for=index_for,
                               embedder=aemb, graph=graph, vector_timeout_s=VECTOR_TIMEOUT_S,
                               sink_batch=512)
    return InMemoryRunner.over(memory, Ports(tuning, max_payload_bytes, wall_ms,
                                             rules=load_rules()))


async def replay(bench: Benchmark, runner: InMemoryRunner, mode: str,
                 settings: Settings | None = None) -> ReplayLog:
    """What `evaluation.replay.replay` sends to Kafka, sent to the runner in the same order."""
    log = ReplayLog(mode)
    man = manifest(mode)
    client = MemoryHostClient(runner, settings or Settings())
    t0 = time.monotonic()
    await send_haystack(bench, lambda sid, user: HostSession(client, sid, user),  # type: ignore[arg-type]
                        man, log)
    log.wall_s["haystack"] = time.monotonic() - t0
    t1 = time.monotonic()
    sessions = {}
    for q in bench.questions:
        sid = f"{q.user}/q/{q.qid}"
        log.question_sessions[sid] = q.qid
        qs = HostSession(client, sid, q.user)  # type: ignore[arg-type]
        sessions[sid] = (qs, q)
        await qs.lifecycle("start", q.time_ms - 1000, man)
        await qs.user_message(q.text, q.time_ms, remember=False)
    log.wall_s["questions"] = time.monotonic() - t1
    t2 = time.monotonic()
    for sid, (qs, q) in sessions.items():  # the step boundary after each question
        now = q.time_ms + 1000
        if mode != "soft":
            continue  # no packet surface: the host never claims
        for p in runner.claim(sid, now):
            await qs.feedback("packet_delivered", p["packetId"], now,
                              memory_ids=[i["memoryId"] for i in p["items"]])
    log.wall_s["claims"] = time.monotonic() - t2
    return log


def topic_data(runner: InMemoryRunner) -> TopicData:
    return TopicData(runner.records("audit"), runner.records("inbox"),
                     runner.records("memory-log"))


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
             embedder: Embedder | None = None, graph: bool = True
             ) -> tuple[dict[str, Any], pl.DataFrame, TopicData, ReplayLog]:
    """Replay, then score as the Kafka evaluation does: the result, per-question rows, what
    the topics hold and what the host sent."""
    tmp = tempfile.TemporaryDirectory(prefix="mnemo-offline-") if lancedb else None
    embedder = embedder or (default_embedder() if vector else None)
    try:
        runner = runner_for(tuning, vector=vector, embedder=embedder, graph=graph,
                            lancedb_dir=Path(tmp.name) / "lancedb" if tmp else None)
        log = asyncio.run(replay(bench, runner, mode))
        if runner.memory.embedder is not None:
            runner.memory.embedder.close(wait=False)
    finally:
        if tmp is not None:
            tmp.cleanup()
    data = topic_data(runner)
    lists = baselines.lists(bench, data.memory, embedder) if with_baselines else {}
    df = per_question(bench, log, data, lists)
    result = {"benchmark": bench.name, "mode": mode, "vector": vector, "lancedb": lancedb,
              "graph": graph, "tuning_source": tuning.source, "tuning": tuning.to_dict(),
              "embedder": embedder.version if embedder is not None else None,
              "questions": len(bench.questions),
              "question_trigger_rate": float(df["triggered"].mean()) if df.height else 0.0,
              "questions_moved_after_their_haystack": bench.shifted_questions,
              "memories": len(runner.memory), "wall_s": log.wall_s,
              "summary": summarise(df), "pipeline": pipeline_metrics(bench, log, data, df)}
    return result, df, data, log


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
    p.add_argument("--no-graph", action="store_true", help="without the graph tier")
    p.add_argument("--lancedb", action="store_true",
                   help="LanceDB VectorIndex in a temporary folder instead of the numpy index")
    p.add_argument("--no-baselines", action="store_true")
    p.add_argument("--out", type=Path)
    a = p.parse_args(argv)
    bench = load_bench(a.benchmark, a.file, a.limit, a.ids, tuple(a.roles.split(",")))
    tuning = load_tuning(a.weights, Settings().embedding_model)
    result, df, data, log = evaluate(bench, tuning, a.mode, not a.no_vector, a.lancedb,
                                     not a.no_baselines, graph=not a.no_graph)
    result["command"] = " ".join(["python -m mnemoflow.evaluation.offline", *(argv or sys.argv[1:])])
    print(table(result["summary"]))
    print(f"trigger rate {result['question_trigger_rate']:.3f}, memories {result['memories']}, "
          f"wall {json.dumps({k: round(v, 1) for k, v in result['wall_s'].items()})}")
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "metrics.json").write_text(json.dumps(result, indent=2, default=float))
        df.write_csv(a.out / "per_question.csv")
        write_audits(a.out / "question_audits.jsonl", question_audits(log, data))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
