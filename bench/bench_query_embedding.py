"""Bench: what each embedding model costs a recall request and a memory, in the same run.

The vector tier embeds one request text per recall (the query) and every memory once (the
projector's batches). This bench times both for each model of `projections/embedders.py`:
- one LoCoMo dev question at a time, as recall does (p50 / p95 ms);
- the dev turns in batches of 64, as the vector sink does (texts per second);
and prints each as a ratio to MiniLM measured in the same run. Calls alternate between the
models, so a change of load on this shared machine falls on both.

Run: .venv/bin/python bench/bench_query_embedding.py [--queries 300] [--turns 2000]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from common import pct, write_results

from mnemoflow.evaluation.datasets import load_locomo
from mnemoflow.projections.embedders import MODELS, build_embedder
from mnemoflow.projections.embedding import Embedder, as_passages, as_queries

SHARED = Path(os.environ.get("MNEMOFLOW_SHARED", Path(__file__).resolve().parents[2] / "shared"))
SINK_BATCH = 64  # VectorSink.batch


def locomo_questions(n: int) -> list[str]:
    """The first n LoCoMo dev questions: the recall requests both benches embed."""
    bench = load_locomo(SHARED / "data" / "locomo" / "dev.json")
    return [q.text for q in bench.questions][:n]


def query_latencies(models: dict[str, Embedder], questions: list[str]) -> dict[str, list[float]]:
    """ms to embed each question alone, as the vector tier does per request, for each model;
    calls alternate between the models, so a change of load falls on all of them."""
    for e in models.values():
        e.embed(as_queries(e, ["warm-up"]))
    query_ms: dict[str, list[float]] = {m: [] for m in models}
    for q in questions:
        for m, e in models.items():
            t = time.perf_counter()
            e.embed(as_queries(e, [q]))
            query_ms[m].append(1000 * (time.perf_counter() - t))
    return query_ms


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--turns", type=int, default=2000)
    a = ap.parse_args()
    questions = locomo_questions(a.queries)
    turns = [t.text for s in load_locomo(SHARED / "data" / "locomo" / "dev.json").sessions
             for t in s.turns][: a.turns]
    models = {m: build_embedder(m) for m in MODELS}
    query_ms = query_latencies(models, questions)
    spent: dict[str, float] = dict.fromkeys(models, 0.0)
    for i in range(0, len(turns), SINK_BATCH):
        for m, e in models.items():
            t = time.perf_counter()
            e.embed(as_passages(e, turns[i:i + SINK_BATCH]))
            spent[m] += time.perf_counter() - t
    out: dict[str, dict[str, float]] = {}
    for m in models:
        q = pct(query_ms[m])
        out[m] = {"query_ms_p50": q["p50"], "query_ms_p95": q["p95"],
                  "memories_per_s": len(turns) / spent[m]}
    base = out["minilm"]
    for m, r in out.items():
        r["query_p50_ratio"] = r["query_ms_p50"] / base["query_ms_p50"]
        r["memories_per_s_ratio"] = r["memories_per_s"] / base["memories_per_s"]
        print(f"{m:12s} query p50 {r['query_ms_p50']:.1f} ms p95 {r['query_ms_p95']:.1f} ms "
              f"({r['query_p50_ratio']:.2f}x MiniLM); memories {r['memories_per_s']:.0f}/s "
              f"({r['memories_per_s_ratio']:.2f}x MiniLM)")
    write_results("query_embedding", {"queries": len(questions), "turns": len(turns), **out})


if __name__ == "__main__":
    main()
