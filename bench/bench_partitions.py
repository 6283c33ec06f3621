"""Bench: what owner partitioning buys a worker, as ratios to baselines of the same run.

1. Memory per worker: peak RSS of a process holding every memory-log partition (one worker)
   against one holding half of them (one of two workers), over N memories of N/20 users,
   built as the worker builds them: `build_partitioned` with the lexical store, the graph
   and a LanceDB vector index per partition (an array index for the shared memory), folded
   through `Memory.apply` and the sinks' flushes. Vectors are random unit vectors from a
   stand-in embedder (embedding 1M texts does not fit this machine's time), as in
   bench_recall. Each case runs in its own process, so its peak RSS is its own.
2. Restart to ready, against the broker: N memory-log records (Avro, keyed by owner) on
   fresh topics; a lexical `MemoryProjector` (the worker with MNEMOFLOW_VECTOR=0), each in a
   fresh process, timed from its start until `barrier` holds for every partition: (a) with
   no checkpoint, against a raw aiokafka consume + Avro decode of the same log; (b) after
   the first projector checkpointed every partition and a tail was written, against a raw
   consume + decode of that tail. The unpickling of the checkpoints is timed apart, to say
   how much of (b) grows with history.
3. Recall on the request's partition: lexical + vector through the routed tiers, then
   rank, timed as `agents.respond` runs them; p95 at N against p95 at 10k memories (a
   partition holds about N/partitions), and the LanceDB vector search's recall@10 against
   an exact scan of the user's stored vectors.

Run: .venv/bin/python bench/bench_partitions.py [--sizes 100000 1000000] [--partitions 4]
     [--quick] [--only memory|restart] [--no-graph]
Against KAFKA_BOOTSTRAP or the running local broker; with neither, it starts the local broker
and stops it again on the way out. Topics are created under a unique prefix
`bench.parts<N>-<hex>.` and deleted at the end; folders are temporary directories.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from bench_recall import BATCH, DIM, WORDS, kind_of
from common import (
    bench_settings,
    kafka_broker,
    pct,
    peak_rss_mib,
    private_dirty_mib,
    rss_mib,
    write_results,
)

from mnemoflow.agents.candidate import scope_chain
from mnemoflow.agents.partitioning import SHARED, partition_of
from mnemoflow.agents.rank import rank
from mnemoflow.agents.recall import recall
from mnemoflow.agents.tuning import load_tuning
from mnemoflow.projections import snapshot
from mnemoflow.projections.array_index import ArrayIndex
from mnemoflow.projections.heap import Freezer
from mnemoflow.projections.partitioned import PartitionedMemory, build_partitioned, partition_dir
from mnemoflow.projections.vector_index import RECALL_FAMILIES, owner_filter
from mnemoflow.projections.vector_tier import index_meta
from mnemoflow.schemas.codec import default_registry
from mnemoflow.streams import topics as T
from mnemoflow.streams.admin import admin_client, create_topics
from mnemoflow.streams.config import Settings
from mnemoflow.streams.projector import CHECKPOINT_EVERY, MemoryProjector
from mnemoflow.streams.worker import checkpoint_build, open_or_replace

BASE_SIZE = 10_000  # the recall baseline: p95 at every size is divided by the p95 here
K_ANN = 10  # of about 20 memories a user has: recall@10 against an exact scan
ENTITIES = 2_000  # two entities per memory from this many, so the graph has edges to hold
WARM_UP = 10  # first queries of a process (LanceDB opens its files lazily) are not timed
READY_TIMEOUT_S = 3_600.0
MEMORY_TOPICS = (T.MEMORY_LOG, T.MEMORY_SHARED, T.MEMORY_VECTORS)


# ------------------------------------------------------------------------------- the corpus

def owner_of(i: int, users: int) -> str:
    return f"user-{i % users}"


def events(lo: int, hi: int, users: int,
           keep: Callable[[str], bool] | None = None) -> list[dict[str, Any]]:
    """Memory-log records lo..hi (every Avro field filled), mixed like bench_recall's, one
    session per user. Words come from a generator seeded by `lo`, so a record is the same
    whichever partitions a process keeps (`keep`: by owner)."""
    rng = np.random.default_rng([11, lo])
    words = rng.integers(0, len(WORDS), (hi - lo, 12))
    ents = rng.integers(0, ENTITIES, (hi - lo, 2))
    out = []
    for j, i in enumerate(range(lo, hi)):
        owner = owner_of(i, users)
        if keep is not None and not keep(owner):
            continue
        kind, op = kind_of(i)
        text = " ".join(WORDS[w] for w in words[j])
        out.append({"eventId": f"e{i}", "op": op, "memoryId": f"m{i}", "kind": kind,
                    "scope": "User", "owner": owner, "sessionId": f"s-{owner}",
                    "eventSeq": i // users, "eventTime": i, "text": text,
                    "entities": [f"ent{e}" for e in ents[j]], "provenance": [f"s#{i}.0"],
                    "source": "user", "confidence": 0.5, "ttlMs": None, "subject": f"s{i}",
                    "predicate": "is", "object": "o", "riskLevel": None,
                    # a procedure is its steps: without them the store records nothing
                    "attributes": {"steps": json.dumps(text.split()[:4]), "intent": text,
                                   "runKey": f"run{i}"}})
    return out


def request(user: str, text: str, now: int, rid: str = "r") -> dict[str, Any]:
    return {"requestId": rid, "sessionId": f"q-{user}", "userId": user, "workspaceId": None,
            "segmentId": "x", "digest": "x", "text": text, "entities": [], "eventTime": now,
            "visibleDigests": [], "ignoredDigests": []}


class RandomEmbedder:
    """Stands in for MiniLM behind AsyncEmbedder's interface: random unit vectors, at once."""

    name, dim, version = "random", DIM, "bench"

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    async def embed(self, texts: list[str], timeout: float) -> np.ndarray:
        v = self.rng.standard_normal((len(texts), DIM)).astype(np.float32)
        return v / np.linalg.norm(v, axis=1, keepdims=True)


async def watch_loop(stalls: list[tuple[float, float]], every_s: float = 0.01) -> None:
    """Append (when, how late) each short sleep woke up: the longest is the loop's worst
    stall."""
    while True:
        t = time.perf_counter()
        await asyncio.sleep(every_s)
        stalls.append((time.perf_counter(), time.perf_counter() - t - every_s))


# ----------------------------------------------------- 1 and 3: memory held, recall on it

async def hold(n: int, parts: int, held: list[int], queries: int, per_user: int,
               graph: bool) -> dict[str, Any]:
    """Build the memory of the `held` partitions of n memories, recall on it, measure."""
    rss_start = rss_mib(os.getpid())  # the process before any memory: interpreter, imports
    tuning = load_tuning()
    emb = RandomEmbedder(3)
    meta = index_meta(emb, tuning.index)
    users = max(1, n // per_user)
    owners_held = {owner_of(u, users) for u in range(users)
                   if partition_of(owner_of(u, users), parts) in held}
    with tempfile.TemporaryDirectory(prefix="bench-partitions-") as tmp:
        root = Path(tmp)

        def index_for(p: int, at: Path | None) -> Any:
            # as streams.worker does: the shared memory in memory, a partition on disk
            if p == SHARED:
                return ArrayIndex(meta)
            return partial(open_or_replace, (at or root / partition_dir(p)) / "vectors", meta)

        # sinks write BATCH-row batches (the worker's are 64 rows): 1M memories in 64-row
        # LanceDB writes do not fit the time this bench has
        memory = build_partitioned(tuning, parts, index_for=index_for, embedder=emb,
                                   graph=graph, sink_batch=BATCH)
        await memory.start()
        for p in held:
            await memory.assign(p)
        t = time.perf_counter()
        for lo in range(0, n, BATCH):
            for ev in events(lo, min(n, lo + BATCH), users, owners_held.__contains__):
                memory.apply(ev)
            await memory.flush()
        build_s = time.perf_counter() - t
        t = time.perf_counter()
        for p in held:  # steady state: the sink compacts and folds new rows into the indices
            await memory.parts[p].index.optimize()
        optimize_s = time.perf_counter() - t
        recall_res = await recall_on(memory, sorted(owners_held), n, queries, tuning)
        out = {"held_partitions": held, "memories_held": len(memory),
               "per_partition": {p: len(memory.parts[p].store) for p in held},
               "users_held": len(owners_held), "build_s": build_s, "optimize_s": optimize_s,
               "rss_start_mib": rss_start, "rss_mib": rss_mib(os.getpid()),
               "peak_rss_mib": peak_rss_mib(os.getpid()),
               "ann": {p: {f: t.has_ann for f, t in memory.parts[p].index.tables.items()}
                       for p in held}}
        out.update(recall_res)
        out.update(await ann_vs_exact(memory, sorted(owners_held), n, queries))
    return out


async def recall_on(memory: PartitionedMemory, owners: list[str], n: int, queries: int,
                    tuning: Any) -> dict[str, Any]:
    """Recall as agents.respond runs it, lexical + vector (the routed tiers: the request's
    partition and the shared memory) then rank; and with every tier (graph too)."""
    rng = random.Random(2)
    k, rt = tuning.rank.recall_k, tuning.rank
    both = [s for s in memory.tiers if s.tier.name in ("lexical", "vector")]
    lat, full, hits, failed = [], [], [], 0
    for q in range(WARM_UP + queries):
        req = request(rng.choice(owners), " ".join(rng.choice(WORDS) for _ in range(6)), n + 1,
                      f"r{q}")
        t = time.perf_counter()
        res = await recall(req, both, k)
        rank(res.candidates, req, [], memory.version, rt)
        t1 = time.perf_counter()
        res_all = await recall(req, memory.tiers, k)
        rank(res_all.candidates, req, [], memory.version, rt)
        t2 = time.perf_counter()
        if q < WARM_UP:
            continue
        lat.append((t1 - t) * 1000)
        full.append((t2 - t1) * 1000)
        hits.append(len(res.candidates))
        failed += any(s != "ok" for s in res.tiers.values())
    return {"recall_ms": pct(lat), "recall_all_tiers_ms": pct(full),
            "mean_candidates": float(np.mean(hits)), "recalls_with_a_failed_tier": failed}


async def ann_vs_exact(memory: PartitionedMemory, owners: list[str], n: int,
                       queries: int) -> dict[str, Any]:
    """The partition index's vector search against an exact scan of the user's stored
    vectors (read back from LanceDB, so the turn-context blend is what is compared)."""
    rng, nrng = random.Random(4), np.random.default_rng(4)
    overlap, search_ms, rows_per_user = [], [], []
    for q in range(WARM_UP + queries):
        user = rng.choice(owners)
        req = request(user, "", n + 1)
        chain = scope_chain(req)
        index = memory.parts[memory.partition_for(req)].index
        qv = nrng.standard_normal(DIM).astype(np.float32)
        qv /= np.linalg.norm(qv)
        t = time.perf_counter()
        got = await index.search(qv, chain, n + 1, K_ANN)
        if q >= WARM_UP:
            search_ms.append((time.perf_counter() - t) * 1000)
        ids: list[str] = []
        vecs: list[np.ndarray] = []
        for fam in RECALL_FAMILIES:
            tab = await (index.tables[fam].table.query().where(owner_filter(chain))
                         .select(["memory_id", "vector"]).to_arrow())
            ids += tab.column("memory_id").to_pylist()
            if tab.num_rows:
                vecs.append(np.asarray(tab.column("vector").combine_chunks().flatten(),
                                       np.float32).reshape(-1, DIM))
        rows_per_user.append(len(ids))
        if not ids:
            continue
        sims = np.concatenate(vecs) @ qv
        exact = {ids[i] for i in np.argsort(-sims)[:K_ANN]}
        overlap.append(len(exact & {m for m, _ in got}) / len(exact))
    return {"vector_search_ms": pct(search_ms), "vector_recall_vs_exact": float(np.mean(overlap)),
            "rows_per_user": float(np.mean(rows_per_user))}


# ------------------------------------------------------------------ 2: restart to ready

async def project(bootstrap: str, prefix: str, folder: Path, parts: int, users: int,
                  graph: bool, checkpoint: bool, time_load: bool) -> dict[str, Any]:
    """A lexical projector over every partition, from its start until barrier holds for
    each; with `checkpoint`, then until each partition is checkpointed; with `time_load`,
    the unpickling of each partition's checkpoint, timed apart afterwards."""
    s = Settings().with_overrides(topic_prefix=prefix, partitions=parts)
    tuning = load_tuning()
    memory = build_partitioned(tuning, parts, graph=graph)
    build = checkpoint_build(memory, tuning)
    first: dict[int, str] = {}
    for u in range(users):
        first.setdefault(partition_of(owner_of(u, users), parts), owner_of(u, users))
    topics = {spec.base: spec.name(s) for spec in MEMORY_TOPICS}
    # every 1: the first projector checkpoints each partition once it is restored (the
    # worker's 20,000 does the same on partitions past that size)
    proj = MemoryProjector(bootstrap, topics, memory, default_registry(), s.client_kwargs(),
                           folder=folder, build=build,
                           checkpoint_every=1 if checkpoint else CHECKPOINT_EVERY,
                           freezer=Freezer())  # as the worker's process does
    t = time.perf_counter()
    proj.assign(range(parts))
    await memory.start()
    run = asyncio.create_task(proj.run())
    stalls: list[tuple[float, float]] = []
    watching = asyncio.create_task(watch_loop(stalls))
    try:
        ok = await asyncio.gather(*(proj.barrier(READY_TIMEOUT_S, request=request(u, "", 0))
                                    for u in first.values()))
        ready_at = time.perf_counter()
        ready_s = ready_at - t
        if not all(o == (True, "") for o in ok):
            raise RuntimeError(f"barrier: {ok}")
        cp_s = None
        if checkpoint:
            while any(proj.since_checkpoint.get(p, 1) for p in range(parts)) or not all(
                    (folder / partition_dir(p) / snapshot.FILE).exists() for p in range(parts)):
                if run.done():
                    run.result()
                await asyncio.sleep(0.05)
            cp_s = time.perf_counter() - t
    finally:
        run.cancel()
        watching.cancel()
        await asyncio.gather(run, watching, return_exceptions=True)
    out: dict[str, Any] = {"ready_s": ready_s, "checkpointed_s": cp_s,
                           "loop_stall_max_ms": 1000 * max((d for _, d in stalls), default=0.0),
                           # after ready: the checkpoints (and the flushes before them)
                           "loop_stall_max_ms_after_ready": 1000 * max(
                               (d for at, d in stalls if at > ready_at), default=0.0),
                           "memories": len(memory), "applied": sum(
                               m.store.applied_count for m in memory.parts.values()),
                           "skipped": proj.skipped}
    del memory, proj
    if time_load:
        load_s, size, pickle_s, fork_ms, write_s, copied = 0.0, 0, 0.0, 0.0, 0.0, 0.0
        parent = 0.0
        for p in range(parts):
            t = time.perf_counter()
            cp = snapshot.load(folder / partition_dir(p), build)
            load_s += time.perf_counter() - t
            assert cp is not None
            size += (folder / partition_dir(p) / snapshot.FILE).stat().st_size
            # what a checkpoint held the loop for before it was forked (pickling on it), and
            # what it holds it for now (the fork), on the same checkpoint
            t = time.perf_counter()
            data = snapshot.dumps(cp)
            pickle_s += time.perf_counter() - t
            del data
            parent = max(parent, rss_mib(os.getpid()))
            t = time.perf_counter()
            writer = snapshot.fork_write(folder / "forked", cp)
            fork_ms += 1000 * (time.perf_counter() - t)
            while writer.poll() is None:
                copied = max(copied, private_dirty_mib(writer.pid))
                await asyncio.sleep(0.05)
            assert writer.done
            write_s += time.perf_counter() - t
            del cp
        out.update(checkpoint_load_s=load_s, checkpoint_mib=size / 2**20,
                   checkpoint_pickle_on_loop_s=pickle_s, checkpoint_fork_ms=fork_ms,
                   checkpoint_forked_write_s=write_s, checkpoint_writer_copied_mib_max=copied,
                   checkpoint_forking_rss_mib_max=parent)
    return out


async def produce(bootstrap: str, topic: str, lo: int, hi: int, users: int,
                  kw: dict[str, object]) -> float:
    """Records lo..hi, keyed by owner (Kafka's partitioner: agents.partitioning), batched:
    sends are awaited a chunk at a time, so the producer is not what is measured."""
    reg = default_registry()
    p = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, max_batch_size=1 << 20,
                         **kw)
    await p.start()
    t = time.perf_counter()
    try:
        for a in range(lo, hi, BATCH):
            futs = [await p.send(topic, reg.encode("io.mnemoflow.MemoryEvent", ev),
                                 key=ev["owner"].encode())
                    for ev in events(a, min(hi, a + BATCH), users)]
            await asyncio.gather(*futs)
    finally:
        await p.stop()
    return time.perf_counter() - t


async def end_offsets(bootstrap: str, topic: str, parts: int,
                      kw: dict[str, object]) -> dict[int, int]:
    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, **kw)
    await c.start()
    try:
        ends = await c.end_offsets([TopicPartition(topic, p) for p in range(parts)])
    finally:
        await c.stop()
    return {tp.partition: off for tp, off in ends.items()}


async def raw_consume(bootstrap: str, topic: str, starts: dict[int, int], ends: dict[int, int],
                      kw: dict[str, object]) -> tuple[float, int]:
    """The baseline: seconds for a bare consumer, from its start, to read and Avro-decode the
    records from `starts` to `ends`; and how many it read."""
    reg = default_registry()
    t = time.perf_counter()
    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                         **kw)
    await c.start()
    try:
        left = {TopicPartition(topic, p): ends[p] for p in starts if ends[p] > starts[p]}
        c.assign(list(left))
        for tp in left:
            c.seek(tp, starts[tp.partition])
        n = 0
        while left:
            for tp, msgs in (await c.getmany(timeout_ms=200, max_records=5000)).items():
                for m in msgs:
                    reg.decode(m.value, "io.mnemoflow.MemoryEvent")
                n += len(msgs)
                if msgs and msgs[-1].offset + 1 >= left.get(tp, 0):
                    left.pop(tp, None)
        return time.perf_counter() - t, n
    finally:
        await c.stop()


async def restart(n: int, args: argparse.Namespace, bootstrap: str) -> dict[str, Any]:
    s = bench_settings(f"parts{n}", partitions=args.partitions)
    kw = s.client_kwargs()
    topic = s.topic("memory-log")
    users = max(1, n // args.per_user)
    tail = min(args.tail, n // 10)
    await create_topics(s, bootstrap, MEMORY_TOPICS)
    try:
        with tempfile.TemporaryDirectory(prefix="bench-partitions-") as tmp:
            folder = Path(tmp) / "memory"
            produce_s = await produce(bootstrap, topic, 0, n - tail, users, kw)
            zero = dict.fromkeys(range(args.partitions), 0)
            head = await end_offsets(bootstrap, topic, args.partitions, kw)
            raw_a, got_a = await raw_consume(bootstrap, topic, zero, head, kw)
            common = ["--bootstrap", bootstrap, "--prefix", s.topic_prefix, "--folder",
                      str(folder), "--partitions", str(args.partitions), "--users", str(users)]
            common += ["--no-graph"] if args.no_graph else []
            a = await child(["--one-project", *common, "--checkpoint"])
            await produce(bootstrap, topic, n - tail, n, users, kw)
            ends = await end_offsets(bootstrap, topic, args.partitions, kw)
            raw_b, got_b = await raw_consume(bootstrap, topic, head, ends, kw)
            b = await child(["--one-project", *common, "--time-load"])
    finally:
        admin = admin_client(s, bootstrap)
        await admin.start()
        try:
            await admin.delete_topics([spec.name(s) for spec in MEMORY_TOPICS])
        finally:
            await admin.close()
    return {"records": n, "tail": tail, "topic_prefix": s.topic_prefix, "produce_s": produce_s,
            "raw_consume_all_s": raw_a, "raw_records_all": got_a, "no_checkpoint": a,
            "ratio_no_checkpoint": a["ready_s"] / raw_a, "raw_consume_tail_s": raw_b,
            "raw_records_tail": got_b, "from_checkpoint": b,
            "ratio_from_checkpoint": b["ready_s"] / raw_b,
            "ratio_from_checkpoint_without_unpickling": (b["ready_s"] - b["checkpoint_load_s"])
            / raw_b}


# ------------------------------------------------------------------------------ driver

async def child(argv: list[str]) -> dict[str, Any]:
    """Run this script with `argv` in its own process; its last stdout line (JSON)."""
    proc = await asyncio.create_subprocess_exec(sys.executable, __file__, *argv,
                                                stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await proc.communicate()
    except BaseException:  # cancelled (Ctrl-C, SIGTERM): the child must not outlive us
        if proc.returncode is None:
            proc.terminate()
            await proc.wait()
        raise
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:2])} exited {proc.returncode}:\n"
                           f"{err.decode()[-3000:]}")
    return json.loads(out.decode().strip().splitlines()[-1])


def show_memory(n: int, one: dict[str, Any], half: dict[str, Any]) -> None:
    base = one["rss_start_mib"]
    print(f"{n:>8} memories ({one['users_held']} users; per partition "
          f"{list(one['per_partition'].values())}; ANN on "
          f"{sorted({f for a in one['ann'].values() for f, on in a.items() if on}) or 'none'})",
          flush=True)
    print(f"    1 worker, all {len(one['held_partitions'])} partitions: peak RSS "
          f"{one['peak_rss_mib']:.0f} MiB (now {one['rss_mib']:.0f}); one of 2 workers, "
          f"partitions {half['held_partitions']} ({half['memories_held']} memories): "
          f"{half['peak_rss_mib']:.0f} MiB (now {half['rss_mib']:.0f}) = "
          f"{half['peak_rss_mib'] / one['peak_rss_mib']:.2f}x (target about 0.5x); above the "
          f"{base:.0f} MiB a process has before any memory: "
          f"{(half['peak_rss_mib'] - base) / (one['peak_rss_mib'] - base):.2f}x", flush=True)
    print(f"    build {one['build_s']:.0f}s + optimize {one['optimize_s']:.0f}s (1 worker), "
          f"{half['build_s']:.0f}s + {half['optimize_s']:.0f}s (half)", flush=True)


def show_recall(n: int, r: dict[str, Any], base: dict[str, Any] | None) -> None:
    def p(d: dict[str, float]) -> str:
        return f"p50 {d['p50']:.2f} / p95 {d['p95']:.2f} ms"
    ratio = f" = {r['recall_ms']['p95'] / base['recall_ms']['p95']:.2f}x the p95 at " \
            f"{BASE_SIZE} (target <= 2x)" if base is not None else ""
    print(f"{n:>8} memories, {n // len(r['held_partitions'])} a partition: lexical + vector + "
          f"rank {p(r['recall_ms'])}{ratio}", flush=True)
    print(f"    with every tier (graph when hits are few) {p(r['recall_all_tiers_ms'])}; vector "
          f"search alone {p(r['vector_search_ms'])}; vector recall@{K_ANN} vs exact "
          f"{r['vector_recall_vs_exact']:.2f} ({r['rows_per_user']:.0f} rows a user); "
          f"{r['mean_candidates']:.0f} candidates a recall, {r['recalls_with_a_failed_tier']} "
          "with a tier failed", flush=True)


def show_restart(r: dict[str, Any]) -> None:
    a, b = r["no_checkpoint"], r["from_checkpoint"]
    print(f"{r['records']:>8} records (produced in {r['produce_s']:.0f}s):", flush=True)
    print(f"    (a) no checkpoint: ready in {a['ready_s']:.2f}s; raw consume + decode of the "
          f"{r['raw_records_all']} records {r['raw_consume_all_s']:.2f}s = "
          f"{r['ratio_no_checkpoint']:.2f}x (every partition checkpointed "
          f"{a['checkpointed_s']:.1f}s after start)", flush=True)
    print(f"    (b) checkpoint + {r['tail']}-record tail: ready in {b['ready_s']:.2f}s; raw "
          f"consume + decode of the tail {r['raw_consume_tail_s']:.2f}s = "
          f"{r['ratio_from_checkpoint']:.2f}x (target <= 1.5x); unpickling the "
          f"checkpoints ({b['checkpoint_mib']:.0f} MiB) alone takes "
          f"{b['checkpoint_load_s']:.2f}s, the rest (start, fold of the tail) "
          f"{b['ready_s'] - b['checkpoint_load_s']:.2f}s = "
          f"{(b['ready_s'] - b['checkpoint_load_s']) / r['raw_consume_tail_s']:.1f}x", flush=True)
    print(f"    (c) writing the {b['checkpoint_mib']:.0f} MiB of checkpoints: "
          f"pickling on the loop (as before) {b['checkpoint_pickle_on_loop_s']:.2f}s, forking "
          f"the writers (the loop's share now) {b['checkpoint_fork_ms']:.0f} ms, the writers "
          f"done in {b['checkpoint_forked_write_s']:.2f}s, copying up to "
          f"{b['checkpoint_writer_copied_mib_max']:.0f} MiB each (the process forked at up to "
          f"{b['checkpoint_forking_rss_mib_max']:.0f} MiB); the loop's worst stall in "
          f"(a): {a['loop_stall_max_ms']:.0f} ms while folding, "
          f"{a['loop_stall_max_ms_after_ready']:.0f} ms once ready (while it checkpointed)",
          flush=True)


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"partitions": args.partitions, "graph": not args.no_graph,
                           "per_user": args.per_user, "cpus": os.cpu_count(),
                           "load_avg_1m": [os.getloadavg()[0]]}
    t0 = time.perf_counter()
    parts = args.partitions
    if args.only in (None, "memory"):
        print(f"== memory per worker and recall on the request's partition ({parts} "
              f"partitions, graph {'off' if args.no_graph else 'on'}; random unit vectors)",
              flush=True)
        common = ["--partitions", str(parts), "--queries", str(args.queries), "--per-user",
                  str(args.per_user)] + (["--no-graph"] if args.no_graph else [])
        mem: dict[int, dict[str, Any]] = {}
        for n in sorted({BASE_SIZE, *args.sizes}):
            one = await child(["--one-memory", str(n), "--hold", _ints(range(parts)), *common])
            half = await child(["--one-memory", str(n), "--hold", _ints(range(parts // 2)),
                                *common])
            mem[n] = {"one_worker": one, "one_of_two": half,
                      "rss_ratio": half["peak_rss_mib"] / one["peak_rss_mib"]}
            show_memory(n, one, half)
        print("-- recall", flush=True)
        for n, r in mem.items():
            show_recall(n, r["one_worker"], mem[BASE_SIZE]["one_worker"] if n != BASE_SIZE else None)
            if n != BASE_SIZE:
                r["recall_p95_ratio_to_10k"] = (r["one_worker"]["recall_ms"]["p95"]
                                                / mem[BASE_SIZE]["one_worker"]["recall_ms"]["p95"])
        out["memory"] = mem
    if args.only in (None, "restart"):
        print("== restart to ready (lexical projector, every partition)", flush=True)
        out["restart"] = {}
        with kafka_broker(bench_settings("parts")) as bootstrap:
            for n in args.sizes:
                out["restart"][n] = await restart(n, args, bootstrap)
                show_restart(out["restart"][n])
    out["load_avg_1m"].append(os.getloadavg()[0])
    out["wall_s"] = time.perf_counter() - t0
    print(f"took {out['wall_s'] / 60:.1f} min", flush=True)
    return out


def _ints(xs: Iterable[int]) -> str:
    return ",".join(str(x) for x in xs)


async def main(args: argparse.Namespace) -> None:
    if args.one_memory:
        held = [int(p) for p in args.hold.split(",")]
        print(json.dumps(await hold(args.one_memory, args.partitions, held, args.queries,
                                    args.per_user, not args.no_graph)))
        return
    if args.one_project:
        print(json.dumps(await project(args.bootstrap, args.prefix, Path(args.folder),
                                       args.partitions, args.users, not args.no_graph,
                                       args.checkpoint, args.time_load)))
        return
    # SIGTERM cancels the run as Ctrl-C does, so children, topics and a broker started here
    # are cleaned up on the way out
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    write_results("bench_partitions", await measure(args))


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="*", default=[100_000, 1_000_000])
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--quick", action="store_true", help="sizes 10000 100000")
    ap.add_argument("--only", choices=("memory", "restart"))
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--per-user", type=int, default=20, help="memories a user has")
    ap.add_argument("--tail", type=int, default=10_000, help="records after the checkpoint "
                    "(at most a tenth of the log)")
    ap.add_argument("--no-graph", action="store_true")
    for flag in ("--one-memory", "--users"):
        ap.add_argument(flag, type=int, default=0, help=argparse.SUPPRESS)
    for flag in ("--hold", "--bootstrap", "--prefix", "--folder"):
        ap.add_argument(flag, default="", help=argparse.SUPPRESS)
    for flag in ("--one-project", "--checkpoint", "--time-load"):
        ap.add_argument(flag, action="store_true", help=argparse.SUPPRESS)
    parsed = ap.parse_args()
    if parsed.quick:
        parsed.sizes = [10_000, 100_000]
    try:
        asyncio.run(main(parsed))
    except asyncio.CancelledError:
        sys.exit(128 + signal.SIGTERM)
