"""Bench: recall latency (vector + lexical + rank) at 10k / 100k (/ 1M) memories,
timed as the worker runs them (the vector search awaited beside the lexical tier, then rank),
as a ratio to a flat numpy scan of the same vectors in the same run; worker-like RSS.

Vectors are random unit vectors (embedding 1M real texts does not fit this machine's time);
the query path is the real one: the per-kind LanceDB tables searched with the scope/time
prefilter and merged, the lexical index, rank. Memories are mixed like a real log (mostly
segments, some episodes, facts, procedures), so a query searches three tables.

Each size runs in its own process, so its peak RSS is its own. The RSS is taken after the
recall queries and before the flat-scan baseline allocates its copy of the vectors: it is
what a worker holding that many memories (store, lexical index, LanceDB) needs. Random
vectors are the worst case for the ANN index (nothing clusters), so the recall of the
vector search against an exact prefiltered scan is printed too.

Each size runs twice: with the vectors of tables below the ANN threshold held in memory (the
worker's default) and with every vector search a LanceDB query (the baseline), and the ratios
of the two are printed.

Run: .venv/bin/python bench/bench_recall.py [--sizes 10000 100000 1000000] [--queries 200]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from bench_query_embedding import locomo_questions, query_latencies
from common import pct, peak_rss_mib, write_results

from mnemoflow.agents.candidate import scope_chain
from mnemoflow.agents.rank import rank
from mnemoflow.agents.tuning import DEFAULT_MODEL, load_tuning
from mnemoflow.projections.embedders import MODELS, build_embedder
from mnemoflow.projections.memory_store import MemoryStore
from mnemoflow.projections.vector_index import IndexMeta, VectorIndex, open_index

DIM = 384
USERS = 100
K = 25
BATCH = 20_000
WORDS = [f"w{i}" for i in range(5000)]
# share of each kind in the log: segments dominate, as they do in a real conversation log
KINDS = (("segment", "segment_recorded", 0.75), ("episode", "episode_recorded", 0.10),
         ("fact", "fact_upserted", 0.12), ("procedure", "procedure_observed", 0.03))


def vectors(lo: int, hi: int) -> np.ndarray:
    """Rows lo..hi of the corpus, regenerated on demand so the build never holds them all."""
    v = np.random.default_rng([7, lo]).standard_normal((hi - lo, DIM)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def kind_of(i: int) -> tuple[str, str]:
    x = random.Random(i).random()
    for kind, op, share in KINDS:
        if x < share:
            return kind, op
        x -= share
    return KINDS[0][0], KINDS[0][1]


async def build(n: int, root: Path, held: bool) -> tuple[MemoryStore, VectorIndex, float, float]:
    rng = random.Random(1)
    store = MemoryStore()
    index = await open_index(root / f"idx{n}", IndexMeta("random", DIM, "bench"),
                             held_vectors=held)
    t = time.perf_counter()
    for lo in range(0, n, BATCH):
        hi = min(n, lo + BATCH)
        rows = []
        for i in range(lo, hi):
            kind, op = kind_of(i)
            text = " ".join(rng.choice(WORDS) for _ in range(12))
            owner = f"user-{i % USERS}"
            store.apply({"eventId": f"e{i}", "op": op, "memoryId": f"m{i}", "kind": kind,
                         "scope": "User", "owner": owner, "sessionId": "s", "eventSeq": i,
                         "eventTime": i, "text": text, "entities": [],
                         "provenance": [f"s#{i}.0"], "source": "user", "confidence": 0.5,
                         "subject": f"s{i}", "predicate": "is", "object": "o",
                         # a procedure is its steps: without them the store records nothing
                         "attributes": {"steps": json.dumps(text.split()[:4]),
                                        "intent": text, "runKey": f"run{i}"}})
            rows.append({"memory_id": f"m{i}", "kind": kind, "text": text, "scope": "User",
                         "owner": owner, "event_time": i})
        await index.add(rows, vectors(lo, hi))
    build_s = time.perf_counter() - t
    t = time.perf_counter()
    await index.optimize()  # steady state: the sink compacts and folds new rows into the indices
    return store, index, build_s, time.perf_counter() - t


async def run_one(n: int, queries: int, held: bool) -> dict:
    tuning = load_tuning().rank
    rng, nrng = random.Random(2), np.random.default_rng(2)
    with tempfile.TemporaryDirectory() as tmp:
        store, index, build_s, optimize_s = await build(n, Path(tmp), held)
        reqs = []
        for q in range(queries):
            user = f"user-{q % USERS}"
            qv = nrng.standard_normal(DIM).astype(np.float32)
            reqs.append(({"requestId": f"r{q}", "sessionId": "q", "userId": user,
                          "workspaceId": None, "segmentId": "x", "digest": "x",
                          "text": " ".join(rng.choice(WORDS) for _ in range(6)), "entities": [],
                          "eventTime": n + 1, "visibleDigests": [], "ignoredDigests": []},
                         qv / np.linalg.norm(qv)))
        lat, vec_ms, lex_ms, rank_ms, fts_ms, found = [], [], [], [], [], []
        load = [os.getloadavg()[0]]

        async def timed_search(qv: np.ndarray, chain: frozenset) -> tuple[list, float]:
            t = time.perf_counter()
            return await index.search(qv, chain, n + 1, K), (time.perf_counter() - t) * 1000

        async def timed_lexical(req: dict) -> tuple[list, float]:
            t = time.perf_counter()
            return store.search_lexical(req, K), (time.perf_counter() - t) * 1000

        for req, qv in reqs:
            # as agents.recall runs them: the vector search started first, the lexical tier
            # scoring on the loop while LanceDB queries on its own threads, then rank over both
            t0 = time.perf_counter()
            vector = asyncio.ensure_future(timed_search(qv, scope_chain(req)))
            lexical = asyncio.ensure_future(timed_lexical(req))
            cands, l_ms = await lexical
            hits, v_ms = await vector
            t3 = time.perf_counter()
            cands += [store.records[m].candidate(s) for m, s in hits]
            rank(cands, req, [], "v", tuning)
            t4 = time.perf_counter()
            lat.append((t4 - t0) * 1000)
            vec_ms.append(v_ms)
            lex_ms.append(l_ms)
            rank_ms.append((t4 - t3) * 1000)
            found.append([m for m, _ in hits])
            t5 = time.perf_counter()
            await index.text_search(req["text"], scope_chain(req), n + 1, K)
            fts_ms.append((time.perf_counter() - t5) * 1000)
        load.append(os.getloadavg()[0])
        rss = peak_rss_mib(os.getpid())
        ann = {name: t.has_ann for name, t in index.tables.items()}
        sizes = {name: await t.table.count_rows() for name, t in index.tables.items()}
        # flat numpy baseline (and the exact answer the vector search is compared with)
        allv = np.concatenate([vectors(lo, min(n, lo + BATCH)) for lo in range(0, n, BATCH)])
        owners = np.array([i % USERS for i in range(n)])
        flat, overlap = [], []
        for (req, qv), got in zip(reqs, found, strict=True):
            t = time.perf_counter()
            rows = np.flatnonzero(owners == int(req["userId"].split("-")[1]))
            sims = allv[rows] @ qv
            top = rows[np.argpartition(-sims, K)[:K]]
            flat.append((time.perf_counter() - t) * 1000)
            overlap.append(len({f"m{i}" for i in top} & set(got)) / K)
    return {"recall_ms": pct(lat), "vector_ms": pct(vec_ms), "lexical_ms": pct(lex_ms),
            "rank_ms": pct(rank_ms), "lance_fts_ms": pct(fts_ms), "flat_numpy_ms": pct(flat),
            "ratio_p95_to_flat": pct(lat)["p95"] / pct(flat)["p95"],
            "vector_recall_at_k_vs_exact": float(np.mean(overlap)), "ann": ann,
            "tables": sizes, "build_s": build_s, "optimize_s": optimize_s,
            "peak_rss_mib": rss, "load_avg_1m": load, "cpus": os.cpu_count()}


def show(n: int, mode: str, r: dict) -> None:
    def p(d: dict) -> str:
        return f"p50 {d['p50']:.2f} / p95 {d['p95']:.2f} ms"
    print(f"{n:>8} memories, {mode}: {r['tables']} ANN {r['ann']}")
    print(f"    recall (vector+lexical+rank) {p(r['recall_ms'])}; flat numpy scan "
          f"{p(r['flat_numpy_ms'])}; p95 ratio {r['ratio_p95_to_flat']:.1f}x")
    print(f"    vector {p(r['vector_ms'])}, lexical {p(r['lexical_ms'])}, rank {p(r['rank_ms'])};"
          f" LanceDB full-text (not in recall) {p(r['lance_fts_ms'])}")
    print(f"    vector recall@{K} vs exact {r['vector_recall_at_k_vs_exact']:.2f}; build "
          f"{r['build_s']:.0f}s + optimize {r['optimize_s']:.0f}s; peak RSS "
          f"{r['peak_rss_mib']:.0f} MiB; 1-min load average {r['load_avg_1m'][0]:.1f} -> "
          f"{r['load_avg_1m'][1]:.1f} on {r['cpus']} CPUs", flush=True)


# how the vector search is answered: from the vectors the index holds in memory (the worker's
# default) or by LanceDB queries of its tables (`held_vectors=False`, the baseline)
MODES = {"held": True, "lance": False}


def main(args: argparse.Namespace) -> None:
    if args.one:
        print(json.dumps(asyncio.run(run_one(args.one, args.queries, MODES[args.mode]))))
        return
    out: dict[str, dict[int, dict]] = {mode: {} for mode in MODES}
    for n in args.sizes:
        for mode in MODES:
            res = subprocess.run([sys.executable, __file__, "--one", str(n), "--queries",
                                  str(args.queries), "--mode", mode],
                                 capture_output=True, text=True, check=True)
            out[mode][n] = json.loads(res.stdout.strip().splitlines()[-1])
            show(n, mode, out[mode][n])
        held, lance = out["held"][n], out["lance"][n]
        print(f"    held / lance at {n}: vector search p50 "
              f"{held['vector_ms']['p50'] / lance['vector_ms']['p50']:.2f}x, p95 "
              f"{held['vector_ms']['p95'] / lance['vector_ms']['p95']:.2f}x; recall p95 "
              f"{held['recall_ms']['p95'] / lance['recall_ms']['p95']:.2f}x; peak RSS "
              f"{held['peak_rss_mib'] / lance['peak_rss_mib']:.2f}x")
    base = args.sizes[0]
    for n in args.sizes[1:]:
        r = out["held"]
        print(f"held: p95 at {n} / p95 at {base}: "
              f"{r[n]['recall_ms']['p95'] / r[base]['recall_ms']['p95']:.2f}x")
    write_results("bench_recall", out)
    if args.levers:  # after the figures above are written: it needs every model's package
        write_results("bench_recall", {**out, "levers": levers(
            out["held"][min(args.sizes)]["recall_ms"], args.queries)})


def levers(recall_ms: dict[str, float], queries: int) -> dict[str, dict[str, float]]:
    """What each embedding model adds to a recall request: the query is embedded before the
    vector search, so a request costs its embedding plus the recall timed above (random
    vectors, the smallest size). Real LoCoMo dev questions, one at a time, the models
    alternating; figures as ratios to MiniLM in this run. The request p95 is the sum of the
    two p95s: a bound, not a measured percentile. (No reranker is measured: none ships
    in a package this machine can install, README "Stronger embedders and rerankers".)"""
    questions = locomo_questions(queries)
    per_model = query_latencies({m: build_embedder(m) for m in MODELS}, questions)
    out = {}
    for m, ms in per_model.items():
        q = pct(ms)
        out[m] = {"query_ms_p50": q["p50"], "query_ms_p95": q["p95"],
                  "request_ms_p50": q["p50"] + recall_ms["p50"],
                  "request_ms_p95": q["p95"] + recall_ms["p95"]}
    base = out[DEFAULT_MODEL]
    print(f"levers, per request (query embedding + recall p50 {recall_ms['p50']:.2f} ms, "
          f"{len(questions)} LoCoMo dev questions):")
    for m, r in out.items():
        r["request_p50_ratio"] = r["request_ms_p50"] / base["request_ms_p50"]
        r["request_p95_ratio"] = r["request_ms_p95"] / base["request_ms_p95"]
        print(f"    {m:12s} embed p50 {r['query_ms_p50']:.2f} / p95 {r['query_ms_p95']:.2f} ms;"
              f" request p50 {r['request_ms_p50']:.2f} ms ({r['request_p50_ratio']:.2f}x "
              f"{DEFAULT_MODEL}), p95 {r['request_ms_p95']:.2f} ms "
              f"({r['request_p95_ratio']:.2f}x)", flush=True)
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="*", default=[10_000, 100_000])
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--no-levers", dest="levers", action="store_false",
                    help="leave out the per-model query embedding cost")
    ap.add_argument("--one", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--mode", choices=tuple(MODES), default="held", help=argparse.SUPPRESS)
    main(ap.parse_args())
