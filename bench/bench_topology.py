"""Bench: event->packet latency and topology throughput, as ratios to raw Kafka.

Run: .venv/bin/python bench/bench_topology.py [--questions 100 --events 3000 --backlog-rounds 2]
Against KAFKA_BOOTSTRAP or the running local broker; with neither, it starts the local broker
and stops it again on the way out.
Figures are printed, never asserted. Baselines are measured on the same broker in the
same run: a raw produce->consume round trip, and a raw consume->produce passthrough.
For the suppress and retrieve bursts it also prints the CPU they cost per event: the
worker's by thread name (LanceDB's own threads apart from the Python ones) and the local
broker's, read from /proc at the start and the end of each burst.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from common import (
    bench_settings,
    fmt,
    kafka_broker,
    local_broker_pid,
    now_ms,
    pct,
    peak_rss_mib,
    process_cpu_s,
    start_worker,
    thread_cpu_s,
    write_results,
)

from mnemoflow.schemas.codec import default_registry
from mnemoflow.streams.admin import create_topics, group_stable
from mnemoflow.streams.host import CapabilityManifest, HostClient
from mnemoflow.streams.reader import topic_partitions

T0 = 1_700_000_000_000
MANIFEST = CapabilityManifest(provider="bench", model="m", supportsPreStep=True)


async def _consumer(bootstrap: str, topics: list[str]) -> AIOKafkaConsumer:
    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, auto_offset_reset="latest",
                         enable_auto_commit=False, fetch_max_wait_ms=5)
    await c.start()
    tps = []
    for t in topics:
        tps += await topic_partitions(c, t)
    c.assign(tps)
    await c.seek_to_end(*tps)
    for tp in tps:
        await c.position(tp)
    return c


async def raw_round_trip(bootstrap: str, topic: str, n: int) -> list[float]:
    """Produce one record, wait until a consumer reads it; repeat."""
    c = await _consumer(bootstrap, [topic])
    p = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=0)
    await p.start()
    lat = []
    try:
        for i in range(n):
            t = now_ms()
            await p.send_and_wait(topic, b"x" * 200, key=f"s{i}".encode())
            got = False
            while not got:
                batch = await c.getmany(timeout_ms=1000)
                got = any(batch.values())
            lat.append(now_ms() - t)
    finally:
        await p.stop()
        await c.stop()
    return lat


async def raw_passthrough(bootstrap: str, src: str, dst: str, n: int) -> float:
    """Records/s of a bare consume->produce loop over n records already in `src`."""
    p = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await p.start()
    for i in range(n):
        await p.send(src, b"y" * 300, key=f"s{i % 50}".encode())
    await p.flush()
    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, auto_offset_reset="earliest",
                         enable_auto_commit=False)
    await c.start()
    c.assign(await topic_partitions(c, src))
    done = 0
    t = time.perf_counter()
    while done < n:
        batch = await c.getmany(timeout_ms=500, max_records=1000)
        for msgs in batch.values():
            for m in msgs:
                await p.send(dst, m.value, key=m.key)
                done += 1
    await p.flush()
    dt = time.perf_counter() - t
    await c.stop()
    await p.stop()
    return n / dt


def _faust_floor(bootstrap: str, app_id: str, **env: str) -> subprocess.Popen:
    script = Path(__file__).resolve().parent / "faust_passthrough.py"
    return subprocess.Popen([sys.executable, str(script)],
                            env=dict(os.environ, BS=bootstrap, APP=app_id, **env),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def faust_chain_round_trip(bootstrap: str, prefix: str, hops: int, n: int,
                                 app_id: str) -> list[float]:
    """Round trips through `hops` bare faust agents in a chain: the latency floor of a faust
    topology with that many hops, measured like raw_round_trip (one record at a time)."""
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    names = [f"{prefix}floor-chain-{i}" for i in range(hops + 1)]
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(t, 1, 1) for t in names])
    finally:
        await admin.close()
    c = await _consumer(bootstrap, [names[-1]])
    p = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=0)
    await p.start()
    proc = _faust_floor(bootstrap, app_id, CHAIN=",".join(names))
    lat: list[float] = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # until the chain forwards (startup excluded)
            await p.send_and_wait(names[0], b"warm", key=b"k")
            if any((await c.getmany(timeout_ms=2000)).values()):
                break
        await asyncio.sleep(1.0)
        await c.getmany(timeout_ms=500)  # drain the rest of the warm-up
        for _ in range(n):
            t = now_ms()
            await p.send_and_wait(names[0], b"x" * 200, key=b"k")
            while not any((await c.getmany(timeout_ms=1000)).values()):
                pass
            lat.append(now_ms() - t)
            await asyncio.sleep(0.01)
    finally:
        proc.terminate()
        proc.wait(30)
        await p.stop()
        await c.stop()
    return lat


async def faust_passthrough(bootstrap: str, chain: list[str], n: int, app_id: str) -> float:
    """Records/s through bare faust agents forwarding n records already in chain[0] to
    chain[-1], one agent per hop (the faust floor: one hop, or the suppress path's two)."""
    p = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await p.start()
    for i in range(n):
        await p.send(chain[0], b"y" * 300, key=f"s{i % 50}".encode())
    await p.flush()
    await p.stop()
    c = await _consumer(bootstrap, [chain[-1]])
    proc = _faust_floor(bootstrap, app_id, CHAIN=",".join(chain))
    try:
        got, t = 0, None
        deadline = time.monotonic() + 300
        while got < n and time.monotonic() < deadline:
            k = sum(len(v) for v in (await c.getmany(timeout_ms=1000)).values())
            if k and t is None:  # count from the first forwarded record: startup is excluded
                t, first = time.perf_counter(), k
            got += k
        return (got - first) / (time.perf_counter() - t) if t else 0.0
    finally:
        proc.terminate()
        proc.wait(30)
        await c.stop()


async def fresh_topics(bootstrap: str, names: list[str], partitions: int) -> list[str]:
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(t, partitions, 1) for t in names])
    finally:
        await admin.close()
    return names


async def count_until(bootstrap: str, topic: str, pred, timeout: float = 300.0) -> float:
    """Seconds until pred(decoded records) holds, reading `topic` from the start."""
    reg = default_registry()
    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, auto_offset_reset="earliest",
                         enable_auto_commit=False)
    await c.start()
    c.assign(await topic_partitions(c, topic))
    recs: list[dict] = []
    deadline = time.monotonic() + timeout
    try:
        while not pred(recs):
            if time.monotonic() > deadline:
                raise TimeoutError(topic)
            for msgs in (await c.getmany(timeout_ms=200, max_records=5000)).values():
                recs += [reg.decode(m.value)[1] for m in msgs]
    finally:
        await c.stop()
    return time.monotonic()


async def hop_breakdown(s, bootstrap: str, prefix: str) -> dict[str, dict[str, float]]:
    """Per-hop latency of the question packets, from the records' own timestamps.

    Each stage's output record is stamped when that stage sent it, so the differences say
    where the event -> packet time goes: observer, gate, recall (+ rank, safety, broker).
    """
    from mnemoflow.streams.reader import TopicReader

    names = [s.topic(b) for b in ("session-events", "segments", "recall-requests", "inbox")]
    async with TopicReader(s, bootstrap, names) as r:
        await r.drain()
        by = {n: [x for x in r.records if x.topic == n and x.value] for n in names}
    ev = {(x.value["sessionId"], x.value["eventSeq"]): x.timestamp for x in by[names[0]]
          if x.value["sessionId"].startswith(prefix) and x.value["type"] == "user_message"}
    seg = {x.value["segmentId"]: (x.timestamp, ev.get((x.value["envelope"]["sessionId"],
                                                     x.value["envelope"]["eventSeq"])))
           for x in by[names[1]]}
    req = {x.value["requestId"]: (x.timestamp, seg.get(x.value["segmentId"]))
           for x in by[names[2]]}
    hops: dict[str, list[float]] = {"observer": [], "gate": [], "recall": []}
    for x in by[names[3]]:
        if x.value["op"] != "inject":
            continue
        r_ts, sg = req.get(x.value["packet"]["requestId"], (None, None))
        if r_ts is None or sg is None or sg[1] is None:
            continue
        hops["observer"].append(sg[0] - sg[1])
        hops["gate"].append(r_ts - sg[0])
        hops["recall"].append(x.timestamp - r_ts)
    return {k: pct(v) for k, v in hops.items() if v}


def chat_event(sid: str, seq: int, text: str, t: int, user: str = "user-chat") -> dict:
    return {"schemaVersion": 1, "sessionId": sid, "agentId": "bench", "userId": user,
            "workspaceId": None, "eventSeq": seq, "turn": seq, "step": 0, "eventTime": t,
            "type": "user_message", "text": text, "provenance": None, "lifecycle": None,
            "capability": None, "feedbackKind": None, "feedbackRef": None, "attributes": {}}


async def burst(bootstrap: str, topic: str, records: list[dict]) -> None:
    """Produce batched (no wait per record), so the producer is not what is measured."""
    reg = default_registry()
    p = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, enable_idempotence=True)
    await p.start()
    try:
        for r in records:
            await p.send(topic, reg.encode("io.mnemoflow.SessionEvent", r),
                         key=r["sessionId"].encode())
        await p.flush()
    finally:
        await p.stop()


class PhaseCpu:
    """CPU used over a phase, in ms per event: the worker's by thread name, and the local
    broker's (when the bench runs on it)."""

    def __init__(self, worker: int) -> None:
        self.worker, self.broker = worker, local_broker_pid()
        self.threads, self.broker_s = thread_cpu_s(worker), self._broker_s()
        self.t = time.monotonic()

    def _broker_s(self) -> float:
        return process_cpu_s(self.broker) if self.broker else 0.0

    def per_event_ms(self, events: int) -> dict[str, float]:
        threads = thread_cpu_s(self.worker)
        out = {f"worker:{name}": 1000 * (cpu - self.threads[name]) / events
               for name, cpu in sorted(threads.items()) if cpu - self.threads[name] > 0}
        out["worker"] = sum(out.values())
        if self.broker:
            out["broker"] = 1000 * (self._broker_s() - self.broker_s) / events
        out["wall"] = 1000 * (time.monotonic() - self.t) / events
        return out


def show_cpu(what: str, cpu: dict[str, float]) -> None:
    print(f"  CPU per {what}: " + ", ".join(f"{k} {v:.2f} ms" for k, v in cpu.items()))


async def main(args: argparse.Namespace) -> dict:
    # Ctrl-C already cancels this task (asyncio.run does); SIGTERM (a `timeout`, a stopped CI
    # job) does the same here instead of killing the process, so the finally blocks below
    # still stop the worker, the faust floor and a broker this run started
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    with kafka_broker(bench_settings("topo")) as bootstrap:
        out = await measure(args, bootstrap)
    write_results("bench_topology", out)
    return out


async def measure(args: argparse.Namespace, bootstrap: str) -> dict:
    s = bench_settings("topo")
    await create_topics(s, bootstrap)
    raw_topic = s.topic("dead-letter")  # an idle topic of ours for the raw baselines
    out: dict = {}

    raw = await raw_round_trip(bootstrap, raw_topic, args.raw)
    out["raw_round_trip_ms"] = pct(raw)
    print("raw produce->consume round trip:", fmt(out["raw_round_trip_ms"]))
    out["raw_passthrough_rps"] = await raw_passthrough(bootstrap, s.topic("agent-steps"),
                                                      s.topic("audit"), args.events)
    print(f"raw consume->produce passthrough: {out['raw_passthrough_rps']:.0f} records/s")
    out["faust_passthrough_rps"] = await faust_passthrough(
        bootstrap, [s.topic("tool-results"), s.topic("agent-steps")], args.events,
        f"{s.app_id}-floor")
    print(f"bare faust agent passthrough (the faust floor): {out['faust_passthrough_rps']:.0f} "
          f"records/s = {100 * out['faust_passthrough_rps'] / out['raw_passthrough_rps']:.0f}% "
          "of raw")
    # the suppress path's hops (observer -> gate) as two bare agents, on topics partitioned
    # like the worker's
    chain = await fresh_topics(bootstrap, [f"{s.topic_prefix}floor-two-{i}" for i in range(3)],
                               s.partitions)
    out["faust_two_hop_rps"] = await faust_passthrough(bootstrap, chain, args.events,
                                                       f"{s.app_id}-two-hop")
    print(f"bare faust two-hop chain (observer -> gate, no work): "
          f"{out['faust_two_hop_rps']:.0f} records/s")
    floor = await faust_chain_round_trip(bootstrap, s.topic_prefix, 3, args.raw,
                                         f"{s.app_id}-chain")
    out["faust_chain_round_trip_ms"] = pct(floor)
    out["faust_chain_p99_ratio"] = (out["faust_chain_round_trip_ms"]["p99"]
                                    / out["raw_round_trip_ms"]["p99"])
    print("bare faust 3-hop chain round trip (the latency floor):",
          fmt(out["faust_chain_round_trip_ms"]),
          f"= {out['faust_chain_p99_ratio']:.1f}x raw p99")

    # fresh topics for the worker (the baselines wrote into some of ours)
    s = bench_settings("topo")
    proc = await ready_worker(s, bootstrap)
    try:
        async with HostClient(s, bootstrap) as host:
            await seed_memories(s, bootstrap, host, args.questions)
            inbox = await _consumer(bootstrap, [s.topic("inbox")])
            lat = []
            for u in range(args.questions):
                hs = host.session(f"ask-{u}", f"user-{u}")
                await hs.lifecycle("start", T0 + 86_400_000, MANIFEST)
                t = now_ms()
                await hs.user_message("What is my locker code at the gym?", T0 + 86_401_000)
                got = False
                while not got:
                    batch = await inbox.getmany(timeout_ms=3000)
                    got = any(batch.values())
                    if not batch:
                        break
                if got:
                    lat.append(now_ms() - t)
            await inbox.stop()
            out["event_to_packet_ms"] = pct(lat)
            print("event -> packet readable on inbox:", fmt(out["event_to_packet_ms"]))
            r = out["event_to_packet_ms"]["p99"] / out["raw_round_trip_ms"]["p99"]
            out["latency_p99_ratio"] = r
            print(f"  p99 ratio to raw round trip: {r:.1f}x (target <= 5x); "
                  f"{out['event_to_packet_ms']['p99'] / out['faust_chain_round_trip_ms']['p99']:.1f}x "
                  "the bare faust 3-hop chain")
            out["event_to_packet_hops_ms"] = await hop_breakdown(s, bootstrap, "ask-")
            for hop, d in out["event_to_packet_hops_ms"].items():
                print(f"  hop {hop:8s}: {fmt(d)}")

            # suppress path: a burst of small talk over 50 sessions, produced batched
            gates_before = 4 * args.questions
            cpu = PhaseCpu(proc.pid)
            t = time.monotonic()
            await burst(bootstrap, s.topic("session-events"), [
                chat_event(f"chat-{i % 50}", i // 50 + 1, "ok", T0 + 2 * 86_400_000 + i * 1000)
                for i in range(args.events)])
            end = await count_until(
                bootstrap, s.topic("audit"),
                lambda rr: sum(a["stage"] == "gate" for a in rr) >= gates_before + args.events)
            out["suppress_path_eps"] = args.events / (end - t)
            out["suppress_ratio"] = out["suppress_path_eps"] / out["raw_passthrough_rps"]
            out["suppress_vs_faust_floor"] = out["suppress_path_eps"] / out["faust_passthrough_rps"]
            out["suppress_vs_two_hop"] = out["suppress_path_eps"] / out["faust_two_hop_rps"]
            print(f"suppress path: {out['suppress_path_eps']:.0f} events/s = "
                  f"{100 * out['suppress_ratio']:.1f}% of raw passthrough, "
                  f"{100 * out['suppress_vs_two_hop']:.0f}% of the bare faust two-hop chain "
                  f"(target >= 50%), {100 * out['suppress_vs_faust_floor']:.0f}% of one bare "
                  "faust agent")
            out["suppress_cpu_ms_per_event"] = cpu.per_event_ms(args.events)
            show_cpu("event", out["suppress_cpu_ms_per_event"])

            n = args.questions
            await start_question_sessions(s, bootstrap, n)
            cpu = PhaseCpu(proc.pid)
            out["retrieve_path_eps"] = await retrieve_burst(s, bootstrap, n)
            out["retrieve_path_packets"] = await inbox_packets(s, bootstrap, "ask2-")
            out["retrieve_ratio"] = out["retrieve_path_eps"] / out["raw_passthrough_rps"]
            print(f"retrieve path: {out['retrieve_path_eps']:.0f} events/s = "
                  f"{100 * out['retrieve_ratio']:.0f}% of raw passthrough; "
                  f"{out['retrieve_path_packets']} of {n} questions got a packet")
            out["retrieve_cpu_ms_per_event"] = cpu.per_event_ms(n)
            show_cpu("request", out["retrieve_cpu_ms_per_event"])
        out["worker_peak_rss_mib"] = peak_rss_mib(proc.pid)
        print(f"worker peak RSS: {out['worker_peak_rss_mib']:.0f} MiB")
    finally:
        proc.terminate()
        proc.wait(30)

    # the retrieve burst alone, on a fresh worker each, same procedure: requests taken
    # together (the default), one at a time (the baseline of that), and with every vector
    # search a LanceDB query (the baseline of the vectors held in memory)
    modes = {"together": {}, "one_at_a_time": {"MNEMOFLOW_RECALL_BATCH": "1"},
             "lance": {"MNEMOFLOW_HELD_VECTORS": "0"}}
    for mode, env in modes.items():
        s = bench_settings("retr")
        proc = await ready_worker(s, bootstrap, **env)
        try:
            async with HostClient(s, bootstrap) as host:
                await seed_memories(s, bootstrap, host, args.questions)
            await start_question_sessions(s, bootstrap, args.questions)
            cpu = PhaseCpu(proc.pid)
            eps = await retrieve_burst(s, bootstrap, args.questions)
            out[f"retrieve_alone_{mode}_packets"] = await inbox_packets(s, bootstrap, "ask2-")
            out[f"retrieve_alone_{mode}_eps"] = eps
            out[f"retrieve_alone_{mode}_cpu_ms_per_event"] = cpu.per_event_ms(args.questions)
            out[f"retrieve_alone_{mode}_peak_rss_mib"] = peak_rss_mib(proc.pid)
        finally:
            proc.terminate()
            proc.wait(30)
    eps = {mode: out[f"retrieve_alone_{mode}_eps"] for mode in modes}
    out["retrieve_together_vs_one_at_a_time"] = eps["together"] / eps["one_at_a_time"]
    out["retrieve_held_vs_lance"] = eps["together"] / eps["lance"]
    print(f"retrieve burst alone, fresh workers: requests taken together {eps['together']:.0f} "
          f"events/s, one at a time {eps['one_at_a_time']:.0f} events/s = "
          f"{out['retrieve_together_vs_one_at_a_time']:.2f}x; every vector search a LanceDB "
          f"query (taken together) {eps['lance']:.0f} events/s (held = "
          f"{out['retrieve_held_vs_lance']:.2f}x)")
    for mode in modes:
        print(f"  {mode}: {out[f'retrieve_alone_{mode}_packets']} of {args.questions} "
              "questions got a packet")
        show_cpu(f"request, {mode}", out[f"retrieve_alone_{mode}_cpu_ms_per_event"])

    # a worker restarted behind a backlog of questions, requests taken together and one at a
    # time, alternating over `--backlog-rounds` rounds
    backlog: dict[str, list[float]] = {"together": [], "one_at_a_time": []}
    for r in range(args.backlog_rounds):
        for mode in (list(backlog) if r % 2 == 0 else list(backlog)[::-1]):
            eps, lists, cpu = await backlog_run(bootstrap, args.questions, **modes[mode])
            backlog[mode].append(eps)
            print(f"retrieve backlog, restarted worker, {mode}: {eps:.0f} events/s (first to "
                  f"last decision), {args.questions / lists:.1f} requests per list")
            show_cpu(f"request, backlog, {mode}", cpu)
    out["retrieve_backlog_eps"] = backlog
    if all(backlog.values()):
        mid = {mode: statistics.median(v) for mode, v in backlog.items()}
        out["retrieve_backlog_together_vs_one_at_a_time"] = mid["together"] / mid["one_at_a_time"]
        print(f"retrieve backlog medians: taken together {mid['together']:.0f} events/s, one at "
              f"a time {mid['one_at_a_time']:.0f} events/s = "
              f"{out['retrieve_backlog_together_vs_one_at_a_time']:.2f}x")
    return out


async def backlog_run(bootstrap: str, n: int, **env: str) -> tuple[float, float, dict]:
    """A worker is stopped once n users' memories and n question sessions are in; n questions
    are written while no worker runs; a worker started behind them answers them all. Returns
    the questions per second from its first decision to its last (their audits' emit times),
    the lists its recall stage took them in (its /metrics), and its CPU per question (which
    includes the worker's start)."""
    s = bench_settings("backlog")
    proc = await ready_worker(s, bootstrap, **env)
    try:
        async with HostClient(s, bootstrap) as host:
            await asyncio.gather(*(seed_one(host, u) for u in range(n)))
        await count_until(bootstrap, s.topic("audit"),
                          lambda r: sum(a["stage"] == "gate" and a["sessionId"].startswith("mem-")
                                        for a in r) >= 2 * n)
        await start_question_sessions(s, bootstrap, n)
    finally:
        proc.terminate()
        proc.wait(30)
    await burst(bootstrap, s.topic("session-events"), questions(n))
    proc = start_worker(s, bootstrap, **env)
    try:
        cpu = PhaseCpu(proc.pid)
        await count_until(bootstrap, s.topic("audit"), lambda rr: len(
            broker_emits(rr, "ask2-")) >= n)
        used = cpu.per_event_ms(n)
        lists = await scraped(s, proc.pid, "mnemoflow_recall_requests_taken_together_count")
    finally:
        proc.terminate()
        proc.wait(30)
    from mnemoflow.streams.reader import TopicReader

    async with TopicReader(s, bootstrap, [s.topic("audit")]) as r:
        await r.drain()
        t = broker_emits([x.value for x in r.records if x.value], "ask2-")
    return (len(t) - 1) / ((t[-1] - t[0]) / 1000), lists, used


def broker_emits(audits: list[dict], prefix: str) -> list[int]:
    """The emit times of the broker's decisions for sessions starting with `prefix`, sorted."""
    return sorted(a["emitTime"] for a in audits
                  if a["stage"] == "broker" and a["sessionId"].startswith(prefix))


async def scraped(s, pid: int, sample: str) -> float:
    """One sample of a worker's /metrics (its port is in its health file)."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    from mnemoflow.streams.lifecycle import read_health

    [h] = [h for h in read_health(s.home, s.app_id) if h["pid"] == pid]
    url = f"http://127.0.0.1:{h['metrics_port']}/metrics"
    text = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=10).read().decode())
    return next(x.value for f in text_string_to_metric_families(text) for x in f.samples
                if x.name == sample)


async def ready_worker(s, bootstrap: str, **env: str) -> subprocess.Popen:
    """A worker on fresh topics, started and in a stable group."""
    await create_topics(s, bootstrap)
    proc = start_worker(s, bootstrap, **env)
    while not await group_stable(s, bootstrap, s.app_id):
        if proc.poll() is not None:  # else a worker that died at start is waited for forever
            raise RuntimeError(f"worker exited {proc.returncode}; see {s.home / 'worker.log'}")
        await asyncio.sleep(0.5)
    await asyncio.sleep(1.0)
    return proc


async def seed_one(host: HostClient, u: int) -> None:
    hs = host.session(f"mem-{u}", f"user-{u}")
    await hs.lifecycle("start", T0, MANIFEST)
    await hs.user_message(f"My locker code is zq{u:03d}x at the Riverside gym.", T0 + 1)


async def seed_memories(s, bootstrap: str, host: HostClient, users: int) -> None:
    """One memory per user for the retrieve path, waited for until the gate saw them."""
    for u in range(users):
        await seed_one(host, u)
    await count_until(bootstrap, s.topic("audit"),
                      lambda r: sum(a["stage"] == "gate" and a["sessionId"].startswith("mem-")
                                    for a in r) >= 2 * users)


ASKED_AT = T0 + 3 * 86_400_000


async def start_question_sessions(s, bootstrap: str, n: int) -> None:
    """Start the retrieve burst's n sessions with the manifest a host sends, so the broker
    may deliver their packets to the inbox (a session without one gets a shadow decision and
    no packet); waited for until the gate saw them."""
    async with HostClient(s, bootstrap) as host:
        await asyncio.gather(*(host.session(f"ask2-{i}", f"user-{i}", agent_id="bench")
                               .lifecycle("start", ASKED_AT, MANIFEST) for i in range(n)))
    await count_until(
        bootstrap, s.topic("audit"),
        lambda rr: sum(a["stage"] == "gate" and a["sessionId"].startswith("ask2-")
                       for a in rr) >= n)


async def retrieve_burst(s, bootstrap: str, n: int) -> float:
    """Events/s of n questions, one per seeded user, produced at once into the sessions
    `start_question_sessions` started, until every one is decided by the broker."""
    t = time.monotonic()
    await burst(bootstrap, s.topic("session-events"), questions(n))
    end = await count_until(
        bootstrap, s.topic("audit"),
        lambda rr: sum(a["stage"] == "broker" and a["sessionId"].startswith("ask2-")
                       for a in rr) >= n)
    return n / (end - t)


def questions(n: int) -> list[dict]:
    """One question per seeded user, each in its question session."""
    return [chat_event(f"ask2-{i}", 2, f"Where is the gym with locker zq{i:03d}x?",
                       ASKED_AT + 1000 + i, user=f"user-{i}") for i in range(n)]


async def inbox_packets(s, bootstrap: str, prefix: str) -> int:
    """Packets injected into the inbox for the sessions whose id starts with `prefix`."""
    from mnemoflow.streams.reader import TopicReader

    async with TopicReader(s, bootstrap, [s.topic("inbox")]) as r:
        await r.drain()
        return sum(x.value is not None and x.value["op"] == "inject"
                   and x.value["sessionId"].startswith(prefix) for x in r.records)


def run_bench(bench: Callable[[argparse.Namespace], Coroutine[Any, Any, object]],
              **options: int) -> None:
    """Run an async bench with its integer options (`--name N`, these defaults). A bench that
    turns SIGTERM into its own cancellation, as `main` here does, has cleaned up by the time
    that reaches this point, and exits as a killed process would."""
    ap = argparse.ArgumentParser()
    for name, default in options.items():
        ap.add_argument(f"--{name.replace('_', '-')}", type=int, default=default)
    try:
        asyncio.run(bench(ap.parse_args()))
    except asyncio.CancelledError:
        sys.exit(128 + signal.SIGTERM)


if __name__ == "__main__":
    run_bench(main, questions=100, events=2000, raw=300, backlog_rounds=2)
