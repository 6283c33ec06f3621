"""Bench: projection lag, memory-log record produced -> searchable.

The real projector (`MemoryLogProjector`, all partitions from the start) with the worker's
sinks (Markdown, MiniLM embedding off the loop, LanceDB) folds a memory-log topic on the real
broker while this process produces to it. For every record it notes when the lexical store
has it (lexical-searchable) and when the LanceDB index has its vector (vector-searchable).
Two loads: a steady stream (--rate records/s for --seconds) and a burst of --burst records
produced at once (the time until the last one is searchable). The baseline is a raw
produce -> consume round trip on the same broker in the same run.

Run: .venv/bin/python bench/bench_projection.py [--rate 50 --seconds 20 --burst 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from aiokafka import AIOKafkaProducer
from bench_topology import raw_round_trip, run_bench
from common import bench_settings, broker, fmt, pct, write_results

from mnemoflow.agents.ids import stable_id
from mnemoflow.projections.embedding import AsyncEmbedder, CachedEmbedder, MiniLMEmbedder
from mnemoflow.projections.markdown import MarkdownSink
from mnemoflow.projections.memory_store import MemoryStore
from mnemoflow.projections.vector_index import open_index
from mnemoflow.projections.vector_tier import VectorSink, index_meta
from mnemoflow.schemas.codec import default_registry
from mnemoflow.streams.admin import create_topics
from mnemoflow.streams.projector import MemoryLogProjector

T0 = 1_700_000_000_000
TOPICS = ["atlas rollout", "billing retries", "gym locker", "tax forms", "garden watering"]


def memory(i: int, tag: str) -> dict:
    text = f"Note {i} about the {TOPICS[i % len(TOPICS)]}: remember detail {tag}-{i} for later."
    return {"eventId": stable_id("bench", tag, i), "op": "segment_recorded",
            "memoryId": stable_id("mem", tag, i), "kind": "segment", "scope": "User",
            "owner": f"user-{i % 20}", "sessionId": f"s-{i % 40}", "eventSeq": i,
            "eventTime": T0 + i * 1000, "text": text, "entities": [], "provenance": [f"s#{i}.0"],
            "source": "user", "confidence": 0.6, "ttlMs": None, "subject": None,
            "predicate": None, "object": None, "riskLevel": None, "attributes": {}}


async def watch(store: MemoryStore, index, sent: dict[str, float], lex: dict[str, float],
                vec: dict[str, float], done: asyncio.Event) -> None:
    """Poll the projections every millisecond: when each sent record became searchable."""
    while not done.is_set():
        now = time.perf_counter()
        for mid in list(sent):
            if mid not in lex and mid in store.records:
                lex[mid] = now
            if mid not in vec and mid in index.ids:
                vec[mid] = now
        if len(vec) == len(sent) and sent:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.001)


async def main(args: argparse.Namespace) -> dict:
    s = bench_settings("proj")
    bootstrap, _ = broker(s)
    await create_topics(s, bootstrap)
    out: dict = {"raw_round_trip_ms": pct(await raw_round_trip(bootstrap, s.topic("dead-letter"),
                                                               100))}
    print("raw produce->consume round trip:", fmt(out["raw_round_trip_ms"]))
    reg = default_registry()
    embedder = AsyncEmbedder(CachedEmbedder(MiniLMEmbedder()))
    await embedder.warm_up()
    with tempfile.TemporaryDirectory() as tmp:
        store = MemoryStore()
        index = await open_index(Path(tmp) / "lancedb", index_meta(embedder, store.index_tuning))
        sinks = [MarkdownSink(Path(tmp) / "md", store), VectorSink(index, embedder, store=store)]
        proj = MemoryLogProjector(bootstrap, s.topic("memory-log"), store, reg,
                                  s.client_kwargs(), sinks=sinks)
        task = asyncio.create_task(proj.run())
        prod = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=0)
        await prod.start()
        try:
            for name, n, gap in (("steady", args.rate * args.seconds, 1.0 / args.rate),
                                 ("burst", args.burst, 0.0)):
                sent: dict[str, float] = {}
                lex: dict[str, float] = {}
                vec: dict[str, float] = {}
                done = asyncio.Event()
                watcher = asyncio.create_task(watch(store, index, sent, lex, vec, done))
                t0 = time.perf_counter()
                for i in range(n):
                    m = memory(i, name)
                    sent[m["memoryId"]] = time.perf_counter()
                    await prod.send(s.topic("memory-log"),
                                    reg.encode("io.mnemoflow.MemoryEvent", m),
                                    key=m["owner"].encode())
                    if gap:
                        await asyncio.sleep(gap)
                await prod.flush()
                deadline = time.perf_counter() + 600
                while len(vec) < n and time.perf_counter() < deadline:
                    await asyncio.sleep(0.05)
                done.set()
                await watcher
                lag_l = [1000 * (lex[m] - sent[m]) for m in sent if m in lex]
                lag_v = [1000 * (vec[m] - sent[m]) for m in sent if m in vec]
                res = {"records": n, "lexical_lag_ms": pct(lag_l), "vector_lag_ms": pct(lag_v),
                       "all_searchable_s": max(vec.values(), default=t0) - t0}
                out[name] = res
                print(f"{name}: {n} records; lexical-searchable {fmt(res['lexical_lag_ms'])}")
                print(f"  vector-searchable {fmt(res['vector_lag_ms'])}; "
                      f"all searchable {res['all_searchable_s']:.1f}s after the first produce")
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await prod.stop()
            embedder.close()
    write_results("bench_projection", out)
    return out


if __name__ == "__main__":
    run_bench(main, rate=50, seconds=20, burst=2000)
