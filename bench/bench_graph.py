"""Graph tier (C-04 tier 3) cost per request for one user's graph of N memories.

Entities follow a Zipf law over a vocabulary, like names and topics in a conversation log,
so a few hub entities are mentioned by many memories. Prints p50/p95 of `GraphTier.search`,
the longest stretch one search held the event loop between two yields (measured by a
monitor task, which is what other sessions on the same worker would feel), and how many
nodes the local push pushed.
Run: .venv/bin/python bench/bench_graph.py [--memories 1000 10000 50000] [--queries 100]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import time

from common import pct, write_results

from mnemoflow.agents.candidate import scope_chain
from mnemoflow.agents.graph import GraphState, View, entity_node
from mnemoflow.agents.ppr import LocalPush
from mnemoflow.projections.graph_tier import GraphConfig, GraphSink, GraphTier
from mnemoflow.projections.memory_store import MemoryStore

VOCAB = 5000
PER_MEMORY = 5


def build(n: int, rng: random.Random) -> tuple[MemoryStore, GraphSink]:
    weights = [1 / (r + 1) for r in range(VOCAB)]
    store, sink = MemoryStore(), GraphSink(GraphState())
    for i in range(n):
        ents = sorted({f"e{x}" for x in rng.choices(range(VOCAB), weights, k=PER_MEMORY)})
        ev = {"eventId": f"e{i}", "op": "segment_recorded", "memoryId": f"m{i}",
              "kind": "segment", "scope": "User", "owner": "u", "sessionId": "s",
              "eventSeq": i, "eventTime": i, "text": " ".join(ents), "entities": ents,
              "provenance": [f"s#{i}.0"], "source": "user", "confidence": 0.5}
        store.apply(ev)
        sink.on_event(ev)
    return store, sink


async def run(n: int, queries: int) -> dict:
    rng = random.Random(3)
    store, sink = build(n, rng)
    tier = GraphTier(store, sink.graph)
    cfg = tier.config
    total, held, pushes = [], [], []
    for q in range(queries):
        ents = [f"e{rng.randrange(VOCAB // 10)}" for _ in range(2)]
        req = {"sessionId": "q", "userId": "u", "workspaceId": None, "eventTime": n + 1,
               "entities": ents, "text": " ".join(ents), "requestId": f"r{q}"}
        view = View(scope_chain(req), n + 1)
        personal = tier.personalization(req, (), view)
        push = LocalPush(lambda x, v=view: sink.graph.neighbours(x, v),
                         lambda x, v=view: sink.graph.degree(x, v), personal, cfg.alpha,
                         cfg.eps, cfg.max_pushes)
        push.run()
        pushes.append(push.pushes)
        gaps: list[float] = []
        stop = asyncio.Event()

        async def monitor(gaps: list[float] = gaps, stop: asyncio.Event = stop) -> None:
            while not stop.is_set():
                t = time.perf_counter()
                await asyncio.sleep(0)
                gaps.append((time.perf_counter() - t) * 1000)

        mon = asyncio.create_task(monitor())
        await asyncio.sleep(0)
        t0 = time.perf_counter()
        await tier.search(req, 10, ())
        total.append((time.perf_counter() - t0) * 1000)
        stop.set()
        await mon
        held.append(max(gaps))
    return {"tier_search_ms": pct(total), "loop_held_max_ms": pct(held), "pushes": pct(pushes),
            "hub_mentions": len(sink.graph.partitions[("User", "u")].mentions[entity_node("e0")]),
            "load_avg_1m": os.getloadavg()[0], "config": GraphConfig().__dict__}


def main(args: argparse.Namespace) -> None:
    out = {}
    for n in args.memories:
        r = asyncio.run(run(n, args.queries))
        out[n] = r
        print(f"{n:>7} memories of one user (top hub in {r['hub_mentions']}): tier.search "
              f"p50 {r['tier_search_ms']['p50']:.1f} / p95 {r['tier_search_ms']['p95']:.1f} ms; "
              f"longest hold of the loop p50 {r['loop_held_max_ms']['p50']:.2f} / p95 "
              f"{r['loop_held_max_ms']['p95']:.2f} ms; pushes p95 {r['pushes']['p95']:.0f}; "
              f"load {r['load_avg_1m']:.1f}", flush=True)
    write_results("bench_graph", out)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--memories", type=int, nargs="*", default=[1000, 10_000, 50_000])
    ap.add_argument("--queries", type=int, default=100)
    main(ap.parse_args())
