"""Bench: pending-state rebuild from an inbox log (10k, 100k ops) vs a raw consume of the
same topic, and claim latency. Run: .venv/bin/python bench/bench_inbox.py [--sizes 10000 100000]

Two rebuilds are timed on the same log:
- cold: a host with checkpoints off folds every op from offset 0;
- restart: a host restarts after the previous one wrote its newest checkpoint, in the worst
  case for the checkpoint policy: CHECKPOINT_EVERY - 1 ops were appended after it, so the
  restart reads the checkpoint and folds that tail.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from common import bench_settings, broker, fmt, now_ms, pct, write_results

from mnemoflow.agents.ids import stable_id
from mnemoflow.agents.inbox import op_record
from mnemoflow.schemas.codec import default_registry
from mnemoflow.streams.admin import create_topics
from mnemoflow.streams.inbox import CHECKPOINT_EVERY, InboxClient
from mnemoflow.streams.producer import AvroProducer
from mnemoflow.streams.reader import topic_partitions
from mnemoflow.streams.topics import INBOX

T0 = 1_700_000_000_000


def packet(sid: str, n: int) -> dict:
    pid = stable_id("pkt", sid, n)
    return {"packetSchemaVersion": 1, "packetId": pid, "sessionId": sid, "requestId": f"r{n}",
            "contextCursor": n, "retrievalVersion": "v", "triggerReason": "bench",
            "strength": "soft_hint", "items": [{
                "memoryId": f"m{n}", "kind": "segment", "text": "x" * 120, "scope": "User",
                "owner": "u", "score": 1.0, "sourceSeq": n, "sourceSessionId": "s",
                "provenance": "s#1.0", "eventTime": T0, "digest": f"d{n}", "tiers": []}],
            "exactDigest": f"e{n}", "semanticDigest": "s", "sourceSeqs": [n], "budgetBytes": 120,
            "createdAt": T0, "expiry": T0 + 10**9}


def inbox_ops(sid: str, n: int) -> list[dict]:
    """n ops for one session: injects, each claimed right after but one in a hundred."""
    ops: list[dict] = []
    injects = 0
    while len(ops) < n:
        pk = packet(sid, len(ops))
        op = {"opId": stable_id("op", "inject", pk["packetId"]), "op": "inject", "sessionId": sid,
              "eventTime": T0, "packet": pk, "packetIds": [pk["packetId"]], "claimer": None,
              "reason": None, "authorisedBy": None}
        ops.append(op)
        injects += 1
        if injects % 100 != 0 and len(ops) < n:
            ops.append({**op, "opId": f"claim-{len(ops)}", "op": "claim", "packet": None,
                        "claimer": "b"})
    return ops


async def fill(bootstrap: str, topic: str, ops: list[dict]) -> None:
    reg = default_registry()
    p = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, max_batch_size=1 << 20)
    await p.start()
    for op in ops:
        value, headers = op_record(op, reg)
        await p.send(topic, value, key=op["sessionId"].encode(), headers=headers)
    await p.flush()
    await p.stop()


async def timed_rebuild(s, bootstrap: str, prod: AvroProducer, checkpoints: bool
                        ) -> tuple[float, int, int]:
    """(best of two rebuild seconds, pending packets decoded, ops folded) for fresh hosts."""
    times, pending, folded = [], 0, 0
    for _ in range(2):
        inbox = InboxClient(s, bootstrap, prod, checkpoints=checkpoints)
        inbox.checkpoint_every = 10**12  # the timed host must not write one itself
        await inbox.start()
        t = time.perf_counter()
        st = await inbox.sync("bench-session")
        pending = len(st.pending)  # the packets the host would be handed, decoded
        times.append(time.perf_counter() - t)
        folded = inbox.ops_folded("bench-session")
        await inbox.stop()
    return min(times), pending, folded


async def raw_consume(bootstrap: str, topic: str, n: int) -> float:
    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, auto_offset_reset="earliest",
                         enable_auto_commit=False)
    await c.start()
    c.assign(await topic_partitions(c, topic))
    t = time.perf_counter()
    got = 0
    while got < n:
        for msgs in (await c.getmany(timeout_ms=500, max_records=10000)).values():
            got += len(msgs)
    dt = time.perf_counter() - t
    await c.stop()
    return dt


async def main(args: argparse.Namespace) -> None:
    out = {}
    for n in args.sizes:
        s = bench_settings(f"inbox{n}", partitions=1)
        bootstrap, _ = broker(s)
        await create_topics(s, bootstrap)
        topic = INBOX.name(s)
        ops = inbox_ops("bench-session", n)
        tail = min(CHECKPOINT_EVERY - 1, n // 2)
        await fill(bootstrap, topic, ops[:n - tail])
        async with AvroProducer(s, bootstrap) as prod:
            running = InboxClient(s, bootstrap, prod)  # the host before the restart
            running.checkpoint_every = n - tail
            await running.start()
            await running.sync("bench-session")  # folds the head and writes a checkpoint
            ck_bytes = running._folds[0].checkpoint_bytes
            await running.stop()
            await fill(bootstrap, topic, ops[n - tail:])
            raw = min([await raw_consume(bootstrap, topic, n) for _ in range(2)])
            cold, pending, cold_folded = await timed_rebuild(s, bootstrap, prod, False)
            warm, warm_pending, warm_folded = await timed_rebuild(s, bootstrap, prod, True)
            assert warm_pending == pending, (warm_pending, pending)
            inbox = InboxClient(s, bootstrap, prod)
            await inbox.start()
            await inbox.sync("bench-session")
            lat = []
            for k in range(args.claims):
                await _inject_one(prod, topic, k)
                t = now_ms()
                await inbox.claim_all("bench-session", T0)
                lat.append(now_ms() - t)
            await inbox.stop()
        out[n] = {"raw_consume_s": raw, "cold_rebuild_s": cold, "cold_ratio": cold / raw,
                  "cold_ops_folded": cold_folded, "rebuild_s": warm, "ratio": warm / raw,
                  "ops_folded_after_checkpoint": warm_folded, "checkpoint_bytes": ck_bytes,
                  "checkpoint_every": CHECKPOINT_EVERY, "pending": pending,
                  "claim_ms": pct(lat)}
        print(f"{n} ops: raw consume {raw:.3f}s; {pending} pending")
        print(f"  cold rebuild (whole log, {cold_folded} ops folded): {cold:.3f}s "
              f"-> {cold / raw:.2f}x raw")
        print(f"  restart rebuild (checkpoint of {ck_bytes / 1024:.0f} KiB + {warm_folded} ops "
              f"folded): {warm:.3f}s "
              f"-> {warm / raw:.2f}x raw (target <= 1.5x)")
        print(f"  claim latency (inject one, claim all): {fmt(out[n]['claim_ms'])}")
    write_results("bench_inbox", out)


async def _inject_one(prod: AvroProducer, topic: str, k: int) -> None:
    pk = packet("bench-session", 10**8 + k)
    op = {"opId": stable_id("op", "inject", pk["packetId"]), "op": "inject",
          "sessionId": "bench-session", "eventTime": T0, "packet": pk,
          "packetIds": [pk["packetId"]], "claimer": None, "reason": None, "authorisedBy": None}
    value, headers = op_record(op, prod.registry)
    await prod.send_raw(topic, b"bench-session", value, headers)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="*", default=[10_000, 100_000])
    ap.add_argument("--claims", type=int, default=200)
    asyncio.run(main(ap.parse_args()))
