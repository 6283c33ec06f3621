"""Embedding throughput of the numpy MiniLM: short and 256-token texts, batch 1 and 32, cache hits.

Run: .venv/bin/python bench/bench_embedding.py   (about 30-60 s; plain printed figures)

Each case runs for a fixed time budget after one warm-up call and reports texts/s over the
whole run and for the fastest repetition (the machine may be shared, so the best repetition is
the steadier figure).
"""

from __future__ import annotations

import os
import platform
import random
import time
from collections.abc import Callable

import numpy as np

from mnemoflow.projections.embedding import CachedEmbedder, MiniLMEmbedder

WORDS = (
    "kafka partition offset consumer group lag replay memory agent recall session event log "
    "topic broker schema index vector lexical projection revoke scope owner fact procedure "
    "latency queue worker deploy runbook incident database storage cache timeout fallback"
).split()


def short_texts(n: int, seed: int) -> list[str]:
    """About 8 word pieces each: a typical remembered fact or query."""
    rnd = random.Random(seed)
    return [f"{' '.join(rnd.choices(WORDS, k=4))} {i}" for i in range(n)]


def long_texts(n: int, seed: int) -> list[str]:
    """Long enough to be truncated to the 256-token maximum."""
    rnd = random.Random(seed)
    return [f"{i} " + " ".join(rnd.choices(WORDS, k=320)) for i in range(n)]


def run(label: str, fn: Callable[[list[str]], object], texts: list[str], per_call: int,
        budget_s: float) -> None:
    fn(texts[:per_call])  # warm-up: first-call costs are not throughput
    done, reps, t_start = 0, [], time.perf_counter()
    pos = 0
    while time.perf_counter() - t_start < budget_s or not reps:
        chunk = texts[pos:pos + per_call]
        if len(chunk) < per_call:
            pos, chunk = 0, texts[:per_call]
        t0 = time.perf_counter()
        fn(chunk)
        reps.append(time.perf_counter() - t0)
        done += len(chunk)
        pos += per_call
    total = time.perf_counter() - t_start
    best = per_call / min(reps)
    print(f"{label:<44} {done / total:10.1f} texts/s   best {best:10.1f} texts/s   "
          f"({done} texts, {len(reps)} calls, {total:.1f} s)")


def main() -> None:
    print(f"python {platform.python_version()}  numpy {np.__version__}  cpus {os.cpu_count()}  "
          f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', 'unset')}")
    t0 = time.perf_counter()
    emb = MiniLMEmbedder(batch_size=32)
    emb.load()
    print(f"load + sha256 verify: {time.perf_counter() - t0:.2f} s")

    short = short_texts(2048, seed=1)
    long = long_texts(96, seed=2)
    s_tok = emb.token_counts(short[:256])
    l_tok = emb.token_counts(long)
    print(f"short texts: {np.mean(s_tok):.1f} tokens on average (incl. [CLS]/[SEP]); "
          f"long texts: {min(l_tok)}-{max(l_tok)} tokens")
    assert max(l_tok) == min(l_tok) == 256

    run("short (~8 tok), batch 1", emb.embed, short, 1, budget_s=4)
    run("short (~8 tok), batch 32", emb.embed, short, 32, budget_s=4)
    run("256 tok, batch 1", emb.embed, long, 1, budget_s=6)
    run("256 tok, batch 32", emb.embed, long, 32, budget_s=12)

    cached = CachedEmbedder(emb, max_entries=50_000)
    warm = short[:1024]
    cached.embed(warm)
    hits0, misses0 = cached.hits, cached.misses
    run("cache hit (short), batch 1", cached.embed, warm, 1, budget_s=2)
    run("cache hit (short), batch 32", cached.embed, warm, 32, budget_s=2)
    print(f"cache during hit runs: hits {cached.hits - hits0}, misses {cached.misses - misses0}")


if __name__ == "__main__":
    main()
