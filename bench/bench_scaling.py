"""Bench: suppress-path throughput with 1 and 2 workers in one group, on this machine, with
the CPU each process used while it ran (the broker's included, since it shares the cores).

Run: .venv/bin/python bench/bench_scaling.py [--events 4000 --sessions 200 --users 50]
Against KAFKA_BOOTSTRAP or the running local broker (else one is started and stopped).
Figures are printed, never asserted; 2 workers are read against 1 worker in the same run.
From the CPU per event it also prints what N workers on N machines would give, if the
broker were not the limit: N / (worker CPU seconds per event).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from pathlib import Path

from bench_topology import T0, burst, chat_event, count_until, run_bench
from common import bench_settings, kafka_broker, start_worker, write_results

from mnemoflow.streams.admin import create_topics, group_stable

HZ = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process, all its threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / HZ


def broker_pid() -> int | None:
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if b"kafka.Kafka" in (d / "cmdline").read_bytes():
                    return int(d.name)
            except OSError:
                continue
    return None


async def run(workers: int, args: argparse.Namespace, bootstrap: str) -> dict:
    s = bench_settings(f"scale{workers}")
    await create_topics(s, bootstrap)
    procs = [start_worker(s, bootstrap) for _ in range(workers)]
    try:
        while not await group_stable(s, bootstrap, s.app_id):
            await asyncio.sleep(0.5)
        await asyncio.sleep(3.0)  # the tables restored, the projectors caught up
        events = [chat_event(f"chat-{i % args.sessions}", i // args.sessions + 1, "ok",
                             T0 + i * 1000, user=f"user-{i % args.users}")
                  for i in range(args.events)]
        bpid = broker_pid()
        cpu0 = {p.pid: cpu_seconds(p.pid) for p in procs}
        b0 = cpu_seconds(bpid) if bpid else 0.0
        t = time.monotonic()
        await burst(bootstrap, s.topic("session-events"), events)
        end = await count_until(bootstrap, s.topic("audit"),
                                lambda rr: sum(a["stage"] == "gate" for a in rr) >= args.events)
        wall = end - t
        worker_cpu = sum(cpu_seconds(p.pid) - cpu0[p.pid] for p in procs)
        broker_cpu = (cpu_seconds(bpid) - b0) if bpid else float("nan")
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(30)
    return {"workers": workers, "events_per_s": args.events / wall, "wall_s": wall,
            "worker_cpu_s": worker_cpu, "broker_cpu_s": broker_cpu,
            "worker_cpu_ms_per_event": 1000 * worker_cpu / args.events,
            "broker_cpu_ms_per_event": 1000 * broker_cpu / args.events}


async def main(args: argparse.Namespace) -> dict:
    with kafka_broker(bench_settings("scale")) as bootstrap:
        out: dict = {"cores": os.cpu_count(), "runs": []}
        for n in (1, 2):
            r = await run(n, args, bootstrap)
            out["runs"].append(r)
            print(f"{n} worker(s): {r['events_per_s']:.0f} events/s; CPU while running: "
                  f"workers {r['worker_cpu_s']:.1f} s ({r['worker_cpu_ms_per_event']:.2f} ms/event),"
                  f" broker {r['broker_cpu_s']:.1f} s ({r['broker_cpu_ms_per_event']:.2f} ms/event)"
                  f" of {r['wall_s']:.1f} s wall on {out['cores']} cores")
        one, two = out["runs"]
        out["two_vs_one"] = two["events_per_s"] / one["events_per_s"]
        print(f"2 workers / 1 worker: {out['two_vs_one']:.2f}x on this {out['cores']}-core "
              "machine (the broker and both workers share its cores)")
        per_event = one["worker_cpu_ms_per_event"] / 1000
        for n in (2, 4, 8):
            print(f"on paper, {n} workers on {n} machines: {n / per_event:.0f} events/s from the "
                  f"worker CPU per event; the broker needs {one['broker_cpu_ms_per_event']:.2f} "
                  f"ms/event, {n / per_event * one['broker_cpu_ms_per_event'] / 1000:.1f} cores")
        write_results("bench_scaling", out)
        return out


if __name__ == "__main__":
    run_bench(main, events=4000, sessions=200, users=50)
