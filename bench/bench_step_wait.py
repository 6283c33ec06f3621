"""Bench: what `step_boundary(wait=...)` adds to a step boundary.

Against a real worker, for N users: an earlier session states a fact; a later session asks
about it and runs a boundary that waits for the pipeline's decision (a packet), then asks
the same again (the gate's cooldown suppresses it) and waits again. The baseline, measured
in the same run, is a boundary without a wait right after a message (claim only: it
returns before the pipeline has decided, and so usually claims nothing).

Run: .venv/bin/python bench/bench_step_wait.py [--users 30]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

from common import bench_settings, fmt, kafka_broker, pct, write_results

from mnemoflow.agents.decisions import PACKET, SUPPRESS
from mnemoflow.streams.admin import create_topics
from mnemoflow.streams.decisions import DecisionWatcher, describe
from mnemoflow.streams.host import CapabilityManifest, HostClient
from mnemoflow.streams.inbox import InboxClient
from mnemoflow.streams.process import WorkerProcess
from mnemoflow.streams.step import StepAssembler

T0 = 1_700_000_000_000
DAY = 86_400_000
WAIT_S = 60.0
MANIFEST = CapabilityManifest(provider="bench", model="m", supportsPreStep=True)


async def run(bootstrap: str, users: int) -> dict:
    s = bench_settings("stepwait")
    await create_topics(s, bootstrap)
    worker = WorkerProcess(s, bootstrap, loglevel=os.environ.get("BENCH_WORKER_LOGLEVEL", "warn")).start()
    try:
        await worker.wait_ready()
        async with HostClient(s, bootstrap) as host, DecisionWatcher(s, bootstrap) as watcher:
            inbox = InboxClient(s, bootstrap, host.producer)
            await inbox.start()
            try:
                return await _measure(host, inbox, watcher, users)
            finally:
                await inbox.stop()
    finally:
        worker.stop()


async def _measure(host: HostClient, inbox: InboxClient, watcher: DecisionWatcher,
                   users: int) -> dict:
    claim_only: list[float] = []
    packet: list[float] = []
    suppress: list[float] = []
    outcomes: dict[str, int] = {}
    for u in range(users):
        mem = host.session(f"mem-{u}", f"user-{u}")
        await mem.lifecycle("start", T0 + u, MANIFEST)
        await mem.user_message(f"My locker code is zq{u:03d}x.", T0 + u)
        await StepAssembler(mem, inbox, MANIFEST, decisions=watcher).wait_decision(60)

        base = host.session(f"base-{u}", f"other-{u}")  # no packet to dedupe against
        step = StepAssembler(base, inbox, MANIFEST)
        await base.lifecycle("start", T0 + DAY + u, MANIFEST)
        await base.user_message("What is my locker code?", T0 + DAY + u)
        t = time.perf_counter()
        await step.step_boundary(T0 + DAY + u + 1)
        claim_only.append((time.perf_counter() - t) * 1000)

        ask = host.session(f"ask-{u}", f"user-{u}")
        step = StepAssembler(ask, inbox, MANIFEST, decisions=watcher)
        await ask.lifecycle("start", T0 + DAY + u, MANIFEST)
        for n, bucket in ((1, packet), (2, suppress)):
            await ask.user_message("What is my locker code?", T0 + DAY + 10 * n + u)
            t = time.perf_counter()
            r = await step.step_boundary(T0 + DAY + 10 * n + u + 1, wait=WAIT_S)
            ms = (time.perf_counter() - t) * 1000
            outcome = r.decision.outcome if r.decision else "none"
            if outcome not in (PACKET, SUPPRESS):
                print(f"user {u} ask {n}: {describe(r.decision)}", flush=True)
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
            if (n, outcome) in ((1, PACKET), (2, SUPPRESS)):
                bucket.append(ms)
    print(f"outcomes: {outcomes}", flush=True)
    return {"users": users, "outcomes": outcomes, "claim_only_ms": pct(claim_only),
            "wait_packet_ms": pct(packet), "wait_suppress_ms": pct(suppress),
            "packet_over_claim_only_p50": pct(packet)["p50"] / pct(claim_only)["p50"],
            "suppress_over_claim_only_p50": pct(suppress)["p50"] / pct(claim_only)["p50"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--users", type=int, default=30)
    args = ap.parse_args()
    from mnemoflow.streams.config import Settings

    with kafka_broker(Settings()) as bootstrap:
        out = asyncio.run(run(bootstrap, args.users))
    print(f"outcomes: {out['outcomes']}")
    print(f"boundary, claim only (baseline): {fmt(out['claim_only_ms'])}")
    print(f"boundary, wait -> packet:        {fmt(out['wait_packet_ms'])}  "
          f"p50 {out['packet_over_claim_only_p50']:.1f}x the baseline")
    print(f"boundary, wait -> suppress:      {fmt(out['wait_suppress_ms'])}  "
          f"p50 {out['suppress_over_claim_only_p50']:.1f}x the baseline")
    write_results("step_wait", out)


if __name__ == "__main__":
    main()
