"""`make demo`: a conversation through the real broker and worker, printed stage by stage.

The conversation ships with the package (`demo_conversation.json`, written for this demo in
LoCoMo's layout); `--locomo [FILE]` replays the first LoCoMo dev conversation instead. The
questions are asked the way a host asks them: a step boundary that waits for the pipeline's
decision and claims the packet. Nothing here is canned: every other line printed is decoded
from the segments, audit and inbox topics that the worker wrote during this run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
import uuid
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from mnemoflow.agents.temporal import parse_event_time
from mnemoflow.streams import topics as T
from mnemoflow.streams.admin import create_topics
from mnemoflow.streams.config import REPO_ROOT, Settings
from mnemoflow.streams.decisions import DecisionWatcher
from mnemoflow.streams.host import CapabilityManifest, HostClient
from mnemoflow.streams.inbox import InboxClient
from mnemoflow.streams.kafka_local import LocalKafka
from mnemoflow.streams.process import WorkerProcess
from mnemoflow.streams.reader import TopicReader
from mnemoflow.streams.step import StepAssembler

BUNDLED = Path(__file__).with_name("demo_conversation.json")
SHARED = Path(os.environ.get("MNEMOFLOW_SHARED", REPO_ROOT.parent / "shared"))
LOCOMO = SHARED / "data" / "locomo" / "dev.json"
WAIT_S = 30.0  # the host's bound on waiting for the pipeline's decision about a question
QUESTIONS = 4
con = Console(width=140)


def _turn_text(turn: dict) -> str:
    text = f"{turn['speaker']}: {turn['text']}"
    if turn.get("blip_caption"):
        text += f" [shares an image: {turn['blip_caption']}]"
    return text


async def run(settings: Settings, bootstrap: str, worker: WorkerProcess, conv: dict) -> None:
    c = conv["conversation"]
    user = conv["sample_id"]
    sessions = [1, 2]
    qs = [q for q in conv["qa"] if q["category"] != 5 and q["evidence"]
          and all(e.split(":")[0] in {f"D{n}" for n in sessions} for e in q["evidence"])][:QUESTIONS]
    manifest = CapabilityManifest(provider="demo", model="any", reasoning="none",
                                  supportsPreStep=True)
    try:
        await worker.wait_ready(120)
    except (RuntimeError, TimeoutError) as exc:
        raise SystemExit(f"worker not ready: {exc}") from None
    con.rule(f"[bold]{user}: sessions {sessions} as memory, then {len(qs)} questions")
    sent = 0
    async with HostClient(settings, bootstrap) as host:
        last_t = 0
        for n in sessions:
            t0 = parse_event_time(c[f"session_{n}_date_time"]) or 0
            hs = host.session(f"{user}/session_{n}", user)
            await hs.lifecycle("start", t0, manifest)
            for i, turn in enumerate(c[f"session_{n}"]):
                last_t = t0 + i * 30_000
                await hs.user_message(_turn_text(turn), last_t, provenance=turn["dia_id"])
                sent += 1
            await hs.lifecycle("end", last_t + 1)
        qt = last_t + 7 * 86400_000
        await asyncio.sleep(1.5)  # let the memory-log projection catch up first
        inbox = InboxClient(settings, bootstrap, host.producer)
        await inbox.start()
        try:
            async with DecisionWatcher(settings, bootstrap) as decisions:
                for i, q in enumerate(qs):  # each question in a new session of the same user
                    t = qt + i * 60_000
                    q_session = host.session(f"{user}/question-{i + 1}", user)
                    await q_session.lifecycle("start", t, manifest)
                    step = StepAssembler(q_session, inbox, manifest, decisions=decisions)
                    await q_session.user_message(q["question"], t + 1000)
                    result = await step.step_boundary(t + 1001, user_message=q["question"],
                                                      wait=WAIT_S)
                    d = result.decision
                    assert d is not None
                    con.print(f"host step boundary: {escape(q['question'])} -> [bold]{d.outcome}[/] "
                              f"after {d.waited_ms:.0f} ms, {len(result.delivered)} packet(s) "
                              "claimed into the next request")
        finally:
            await inbox.stop()
    con.print(f"host produced {sent} turns + {len(qs)} questions to {T.SESSION_EVENTS.name(settings)}")

    names = [T.SEGMENTS.name(settings), T.AUDIT.name(settings), T.INBOX.name(settings),
             T.MEMORY_LOG.name(settings)]
    async with TopicReader(settings, bootstrap, names) as reader:
        def done(rs: list) -> bool:
            brokers = [r for r in rs if r.value and r.value.get("stage") == "broker"
                       and "/question-" in r.value["sessionId"]]
            return len(brokers) >= len(qs)
        try:
            recs = await reader.wait_for(done, 60)
        except TimeoutError:
            recs = reader.records
        await asyncio.sleep(1.0)
        recs = await reader.drain()
    by_topic: dict[str, list[dict]] = {n: [] for n in names}
    for r in recs:
        if r.value is not None:
            by_topic[r.topic].append(r.value)
    segs, audits, inbox, mem = (by_topic[n] for n in names)
    con.print(f"observer: {len(segs)} segments, {len(mem)} memory-log records")
    gates = [a for a in audits if a["stage"] == "gate"]
    counts: dict[str, int] = {}
    for a in gates:
        counts[f"{a['action']}/{a['reason']}"] = counts.get(f"{a['action']}/{a['reason']}", 0) + 1
    con.print("gate decisions: " + ", ".join(f"{k}={v}" for k, v in sorted(counts.items())))

    seg_text = {s["segmentId"]: s["text"] for s in segs}
    tab = Table(title="gate decisions on the question sessions", show_lines=False)
    for col in ("question", "action", "reason", "score", "signals > 0"):
        tab.add_column(col)
    for a in gates:
        if "/question-" in a["sessionId"] and a["segmentId"] in seg_text \
                and not seg_text[a["segmentId"]].startswith("lifecycle"):
            sig = ", ".join(k for k, v in sorted(a["signals"].items()) if v > 0)
            tab.add_row(seg_text[a["segmentId"]][:60], a["action"], a["reason"],
                        f"{a['score']:.2f}", sig)
    con.print(tab)

    brokers = {a["requestId"]: a for a in audits if a["stage"] == "broker"}
    ops = {o["packet"]["requestId"]: o for o in inbox if o["op"] == "inject"}
    for q in qs:
        gate = next((a for a in gates if seg_text.get(a["segmentId"]) == q["question"]), None)
        con.rule(f"[bold]Q: {q['question']}  (evidence {', '.join(q['evidence'])})")
        if gate is None or gate["requestId"] is None:
            con.print(f"  gate: {gate and gate['action']} ({gate and gate['reason']}) - no recall")
            continue
        b = brokers.get(gate["requestId"])
        if b is None:
            con.print("  no broker decision yet")
            continue
        con.print(f"  broker: [bold]{b['action']}[/] ({b['reason']}), tiers {b['tiers']}, "
                  f"{b['bytes']} bytes, index {b['indexVersion']}")
        op = ops.get(gate["requestId"])
        if op:
            p = op["packet"]
            con.print(f"  packet {p['packetId']} strength={p['strength']} "
                      f"trigger={p['triggerReason']} cursor={p['contextCursor']}")
            for it in p["items"]:
                hit = "[green]evidence[/]" if any(e in it["provenance"].split(",")
                                                  for e in q["evidence"]) else ""
                con.print(f"   - {escape('[' + it['provenance'] + ']')} "
                          f"{escape(it['text'][:90])} (score {it['score']:.2f}) {hit}")
        dropped = [c for c in b["candidates"] if c["outcome"] != "kept"][:3]
        for d in dropped:
            con.print(f"     dropped {d['memoryId'][:16]} {escape('(' + d['provenance'] + ')')}: "
                      f"{d['outcome']}")


def load_conversation(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--locomo", nargs="?", const=str(LOCOMO), metavar="FILE",
                    help=f"replay the first LoCoMo conversation of FILE (default {LOCOMO})")
    args = ap.parse_args(argv)
    if args.locomo is None:
        return json.loads(BUNDLED.read_text())
    path = Path(args.locomo)
    if not path.is_file():
        raise SystemExit(f"no LoCoMo file at {path}; set MNEMOFLOW_SHARED or give the file")
    return json.loads(path.read_text())[0]


def main(argv: list[str] | None = None) -> None:
    conv = load_conversation(argv)
    base = Settings()
    tag = time.strftime("%Y%m%d%H%M%S") + "-" + uuid.uuid4().hex[:4]
    settings = base.with_overrides(topic_prefix=f"demo.{tag}.", app_id=f"demo-{tag}",
                                   home=base.home)
    started = False
    if settings.bootstrap:
        bootstrap = settings.bootstrap
    else:
        broker = LocalKafka(settings)
        started = broker.status() is None
        bootstrap = broker.up().bootstrap
    try:
        created = asyncio.run(create_topics(settings, bootstrap))
        con.print(f"topics: {len(created)} created under prefix {settings.topic_prefix}")
        worker = WorkerProcess(settings, bootstrap,
                               log_path=settings.home / f"demo-worker-{tag}.log")
        with worker:  # stopped on every way out, a failure or Ctrl-C included
            assert worker.proc is not None
            con.print(f"worker started (pid {worker.proc.pid}), log {worker.log_path}")
            asyncio.run(run(settings, bootstrap, worker, conv))
        con.print(f"worker stopped (exit code {worker.proc.returncode})")
    finally:
        if started:
            LocalKafka(settings).down()


if __name__ == "__main__":
    main()
