"""Issue 5 bench: recall latency (vector + lexical + rank) at 10k / 100k (/ 1M) memories,
as a ratio to a flat numpy scan of the same vectors in the same run; worker-like RSS.

Vectors are random unit vectors (embedding 1M real texts does not fit this machine's time);
the query path is the real one: LanceDB prefiltered search, the lexical index, rank.
Run: .venv/bin/python bench/bench_recall.py [--sizes 10000 100000 1000000]
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import tempfile
import time
from pathlib import Path

import numpy as np
from common import RESULTS, pct

from mnemoflow.agents.candidate import scope_chain
from mnemoflow.agents.rank import rank
from mnemoflow.agents.tuning import load_tuning
from mnemoflow.projections.memory_store import MemoryStore
from mnemoflow.projections.vector_index import IndexMeta, open_index

DIM = 384
USERS = 100
WORDS = [f"w{i}" for i in range(5000)]


def build(n: int, root: Path, rng: random.Random, nrng: np.random.Generator):
    store = MemoryStore()
    index = open_index(root / f"idx{n}", IndexMeta("random", DIM, "bench"))
    vecs = nrng.standard_normal((n, DIM)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    owners = [f"user-{i % USERS}" for i in range(n)]
    t = time.perf_counter()
    batch = 20_000
    for lo in range(0, n, batch):
        rows = []
        for i in range(lo, min(n, lo + batch)):
            text = " ".join(rng.choice(WORDS) for _ in range(12))
            ev = {"eventId": f"e{i}", "op": "segment_recorded", "memoryId": f"m{i}",
                  "kind": "segment", "scope": "User", "owner": owners[i], "sessionId": "s",
                  "eventSeq": i, "eventTime": i, "text": text, "entities": [],
                  "provenance": [f"s#{i}.0"], "source": "user", "confidence": 0.5}
            store.apply(ev)
            rows.append({"memory_id": f"m{i}", "kind": "segment", "text": text, "scope": "User",
                         "owner": owners[i], "event_time": i})
        index.add(rows, vecs[lo:lo + len(rows)])
    return store, index, vecs, np.array(owners), time.perf_counter() - t


def main(args: argparse.Namespace) -> None:
    rng, nrng = random.Random(1), np.random.default_rng(1)
    tuning = load_tuning().rank
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.sizes:
            store, index, vecs, owners, build_s = build(n, Path(tmp), rng, nrng)
            lat, flat = [], []
            for q in range(args.queries):
                user = f"user-{q % USERS}"
                req = {"requestId": f"r{q}", "sessionId": "q", "userId": user,
                       "workspaceId": None, "segmentId": "x", "digest": "x",
                       "text": " ".join(rng.choice(WORDS) for _ in range(6)), "entities": [],
                       "eventTime": n + 1, "visibleDigests": [], "ignoredDigests": []}
                qv = nrng.standard_normal(DIM).astype(np.float32)
                qv /= np.linalg.norm(qv)
                t = time.perf_counter()
                hits = index.search(qv, scope_chain(req), n + 1, 25)
                cands = store.search_lexical(req, 25)
                cands += [store.records[m].candidate(s) for m, s in hits]
                rank(cands, req, [], "v", tuning)
                lat.append((time.perf_counter() - t) * 1000)
                t = time.perf_counter()
                mask = owners == user
                sims = vecs[mask] @ qv
                np.argpartition(-sims, 25)[:25]
                flat.append((time.perf_counter() - t) * 1000)
            out[n] = {"recall_ms": pct(lat), "flat_numpy_ms": pct(flat), "build_s": build_s,
                      "ratio_p95_to_flat": pct(lat)["p95"] / pct(flat)["p95"],
                      "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
            r = out[n]
            print(f"{n:>8} memories: recall p50 {r['recall_ms']['p50']:.2f} ms, p95 "
                  f"{r['recall_ms']['p95']:.2f} ms; flat numpy scan p95 "
                  f"{r['flat_numpy_ms']['p95']:.2f} ms ({r['ratio_p95_to_flat']:.1f}x); "
                  f"build {build_s:.0f}s; peak RSS {r['rss_mib']:.0f} MiB")
    base = args.sizes[0]
    for n in args.sizes[1:]:
        print(f"p95 at {n} / p95 at {base}: "
              f"{out[n]['recall_ms']['p95'] / out[base]['recall_ms']['p95']:.2f}x")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "bench_recall.json").write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="*", default=[10_000, 100_000])
    ap.add_argument("--queries", type=int, default=200)
    main(ap.parse_args())
