"""`mnemoflow eval locomo|longmemeval FILE`: replay, then measure from the topics, then report."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import Progress

from mnemoflow.agents.tuning import load_tuning
from mnemoflow.evaluation import baselines, metrics, report
from mnemoflow.evaluation.datasets import Benchmark, load_locomo, load_longmemeval
from mnemoflow.evaluation.replay import replay
from mnemoflow.streams import topics as T
from mnemoflow.streams.admin import create_topics
from mnemoflow.streams.config import Settings
from mnemoflow.streams.process import WorkerProcess
from mnemoflow.streams.reader import TopicReader

con = Console(stderr=True)


# A replay floods the worker (a whole haystack is produced at once), so recall would otherwise
# see however much had been embedded by then, and the vector tier could time out behind the
# embedding backlog: both make packets depend on timing. The replay's worker waits instead.
REPLAY_WORKER_ENV = {"MNEMOFLOW_RECALL_BARRIER": "projected", "MNEMOFLOW_BARRIER_TIMEOUT_S": "600",
                     "MNEMOFLOW_VECTOR_TIMEOUT_S": "120"}


def eval_settings(name: str) -> Settings:
    base = Settings()
    tag = time.strftime("%Y%m%d%H%M%S") + "-" + uuid.uuid4().hex[:4]
    return base.with_overrides(topic_prefix=f"eval.{name}.{tag}.", app_id=f"eval-{name}-{tag}")


async def _read(settings: Settings, bootstrap: str) -> metrics.TopicData:
    names = {T.AUDIT.name(settings): "audit", T.INBOX.name(settings): "inbox",
             T.MEMORY_LOG.name(settings): "memory"}
    async with TopicReader(settings, bootstrap, list(names)) as r:
        recs = await r.drain()
    got: dict[str, list[dict]] = {v: [] for v in names.values()}
    for rec in recs:
        if rec.value is not None:
            got[names[rec.topic]].append(rec.value)
    return metrics.TopicData(got["audit"], got["inbox"], got["memory"])


def _cosine_inputs(bench: Benchmark, data: metrics.TopicData
                   ) -> tuple[dict[tuple[str, str], np.ndarray], dict[str, np.ndarray]]:
    """Plain vectors (the configured model) of the recorded turn texts and of the questions.

    Embedded here rather than read from LanceDB: the index stores context-blended
    vectors (IndexTuning.vector_context_weight), and the baseline must stay plain cosine.
    The on-disk cache makes a repeated run cheap.
    """
    from mnemoflow.projections.embedders import build_embedder
    from mnemoflow.projections.embedding import (
        DEFAULT_EMBED_CACHE_DIR,
        CachedEmbedder,
        as_passages,
        as_queries,
    )

    settings = Settings()
    emb = CachedEmbedder(build_embedder(settings.embedding_model, settings.embedder),
                         disk_dir=DEFAULT_EMBED_CACHE_DIR)
    # turn ids repeat across users (every LoCoMo conversation has a D1:3): key by owner too
    segs = [m for m in data.memory if m["op"] == "segment_recorded" and m.get("text")]
    vecs = emb.embed(as_passages(emb, [m["text"] for m in segs]))
    turn_vectors = {(m["owner"], metrics.host_provenance(",".join(m["provenance"]))): v
                    for m, v in zip(segs, vecs, strict=True)}
    qv = emb.embed(as_queries(emb, [q.text for q in bench.questions]))
    return turn_vectors, {q.qid: v for q, v in zip(bench.questions, qv, strict=True)}


def run_eval(name: str, bench: Benchmark, out: Path, mode: str, command: str,
             bootstrap: str | None = None) -> dict[str, Any]:
    settings = eval_settings(name)
    if settings.bootstrap:
        bootstrap = settings.bootstrap
    if bootstrap is None:
        from mnemoflow.streams.kafka_local import LocalKafka

        bootstrap = LocalKafka(settings).up().bootstrap
    asyncio.run(create_topics(settings, bootstrap))
    settings.home.mkdir(parents=True, exist_ok=True)
    log_path = settings.home / f"{settings.app_id}.log"
    worker = WorkerProcess(settings, bootstrap, loglevel="info", extra_env=REPLAY_WORKER_ENV,
                           log_path=log_path)
    con.print(f"{name}: {len(bench.sessions)} sessions, {len(bench.questions)} questions, "
              f"mode {mode}, worker log {log_path}")
    with worker:  # stopped on every way out, failures included
        async def go() -> Any:
            try:
                await worker.wait_ready(180)
            except (RuntimeError, TimeoutError) as exc:
                raise SystemExit(f"worker not ready: {exc}; see {log_path}") from None
            with Progress(console=con, transient=True) as progress:
                log = await replay(bench, settings, bootstrap, mode, progress,
                                   alive=lambda: worker.proc is not None
                                   and worker.proc.poll() is None)
            return log, await _read(settings, bootstrap)

        log, data = asyncio.run(go())
    lists = {"bm25": baselines.bm25(bench)}
    tv, qv = _cosine_inputs(bench, data)
    lists["cosine"] = baselines.cosine(bench, tv, qv)
    df = metrics.per_question(bench, log, data, lists)
    result = {
        "benchmark": name, "mode": mode, "command": command,
        "tuning_source": load_tuning(settings.weights_file, settings.embedding_model).source,
        "tuning": load_tuning(settings.weights_file, settings.embedding_model).to_dict(),
        "embedding_model": settings.embedding_model,
        "worker_env": REPLAY_WORKER_ENV,
        "haystack_events": log.haystack_events, "wall_s": log.wall_s,
        "questions_moved_after_their_haystack": bench.shifted_questions,
        "summary": metrics.summarise(df), "pipeline": metrics.pipeline_metrics(bench, log, data, df),
    }
    report.write(out, name, result)
    df.write_csv(out / "per_question.csv")
    metrics.write_audits(out / "question_audits.jsonl", metrics.question_audits(log, data))
    con.print(f"report written to {out}")
    return result


def load(name: str, path: Path, limit: int | None, ids: list[str] | None,
         roles: tuple[str, ...]) -> Benchmark:
    if name == "locomo":
        return load_locomo(path, ids, limit)
    return load_longmemeval(path, ids, limit, roles)
