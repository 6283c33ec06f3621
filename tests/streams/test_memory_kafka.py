"""Long-term memory through the real broker and worker: evidence (G-01) and consolidation (M-04)."""

from __future__ import annotations

import asyncio

import pytest

from mnemoflow.streams.host import CapabilityManifest, HostClient
from mnemoflow.streams.inbox import InboxClient
from mnemoflow.streams.step import StepAssembler

from factories import T0
from support import WorkerProcess, collect, isolated_settings, prepare_topics

pytestmark = pytest.mark.kafka
MANIFEST = CapabilityManifest(provider="test", model="m", supportsPreStep=True)
HOUR = 3_600_000
DOCS = [("build", "ok"), ("test", "ok"), ("render_docs", "ok")]


async def _worker(tmp_path, bootstrap, name: str) -> WorkerProcess:
    s = isolated_settings(tmp_path, name, vector=False, consolidate_interval_s=1.0,
                          consolidate_idle_s=1.0)
    await prepare_topics(s, bootstrap)
    w = WorkerProcess(s, bootstrap).start()
    await w.wait_ready()
    return w


async def _run(host: HostClient, sid: str, user: str, t0: int, turn_tools: list) -> None:
    """One turn: the user's request, then its tool calls a second apart."""
    s = host.session(sid, user)
    await s.lifecycle("start", t0, MANIFEST)
    await s.user_message("please rebuild and publish the atlas docs", t0 + 1)
    for i, (tool, status) in enumerate(turn_tools, start=1):
        await s.tool_result(f"{sid}-c{i}", tool, status, t0 + 1 + i * 1000,
                            output="done" if status == "ok" else None,
                            error=None if status == "ok" else "timed out")


def _procedure_ops(mem: list[dict], owner: str) -> list[tuple[str, str | None]]:
    return [(m["op"], m["attributes"].get("stage")) for m in mem
            if m["owner"] == owner and m["op"].startswith("procedure_")]


async def test_promotion_needs_evidence_from_independent_sessions(kafka_bootstrap, tmp_path):
    w = await _worker(tmp_path, kafka_bootstrap, "consolidate")
    s = w.settings
    try:
        async with HostClient(s, kafka_bootstrap) as host:
            for i in range(3):  # alice: the same successful run in three sessions
                await _run(host, f"alice-s{i}", "alice", T0 + i * HOUR, DOCS)
            bob = host.session("bob-s0", "bob")  # bob: three runs, but all in one session
            await bob.lifecycle("start", T0, MANIFEST)
            for turn in range(3):
                t = T0 + turn * HOUR
                await bob.user_message("please rebuild and publish the atlas docs", t + 1)
                for i, (tool, status) in enumerate(DOCS, start=1):
                    await bob.tool_result(f"bob-{turn}-{i}", tool, status, t + 1 + i * 1000,
                                          output="done")
            # event time is per memory-log partition (stream time): each user's partition is
            # moved past the quiet period by that user's own later message
            for user in ("alice", "bob"):
                late = host.session(f"later-{user}", user)
                await late.user_message("good morning", T0 + 5 * HOUR)

        def settled(r: dict[str, list[dict]]) -> bool:
            a = _procedure_ops(r["memory-log"], "alice")
            b = _procedure_ops(r["memory-log"], "bob")
            return ("procedure_promoted", "validated") in a and len(b) >= 3

        recs = await collect(s, kafka_bootstrap, ["memory-log"], settled, 90)
        await asyncio.sleep(3.0)  # a few more idle consolidation passes
        recs = await collect(s, kafka_bootstrap, ["memory-log"], lambda _: True, 30)
    finally:
        w.stop()
    alice = _procedure_ops(recs["memory-log"], "alice")
    bob = _procedure_ops(recs["memory-log"], "bob")
    assert alice.count(("procedure_observed", None)) == 3
    assert ("procedure_promoted", "candidate") in alice
    promo = next(m for m in recs["memory-log"] if m["owner"] == "alice"
                 and m["op"] == "procedure_promoted" and m["attributes"]["stage"] == "validated")
    assert len({p.split("#")[0] for p in promo["provenance"]}) == 3  # three sessions' evidence
    assert bob.count(("procedure_observed", None)) == 3
    assert not [op for op in bob if op[0] == "procedure_promoted"]  # one session is not enough
    # idempotent: repeated passes over the same log wrote each event once
    ids = [m["eventId"] for m in recs["memory-log"]]
    assert len(ids) == len(set(ids))


async def test_tool_success_after_a_delivery_reinforces_the_delivered_memory(
        kafka_bootstrap, tmp_path):
    w = await _worker(tmp_path, kafka_bootstrap, "evidence")
    s = w.settings
    try:
        async with HostClient(s, kafka_bootstrap) as host:
            mem = host.session("mem", "dana")
            await mem.lifecycle("start", T0, MANIFEST)
            await mem.user_message("My deploy key for the staging box is kx-91-delta.", T0 + 1)
            inbox = InboxClient(s, kafka_bootstrap, host.producer)
            await inbox.start()
            try:
                ask = host.session("ask", "dana")
                step = StepAssembler(ask, inbox, MANIFEST)
                await ask.lifecycle("start", T0 + HOUR, MANIFEST)
                await ask.user_message("What is my deploy key for the staging box?",
                                       T0 + HOUR + 1)
                delivered: tuple[str, ...] = ()
                for _ in range(60):
                    res = await step.step_boundary(T0 + HOUR + 2)
                    if res.delivered:
                        delivered = res.delivered
                        break
                    await asyncio.sleep(0.5)
                assert delivered, "no packet was delivered"
                packet = next(m for m in res.request.messages if m.get("kind") == "memory-packet")
                await ask.tool_result("ask-c1", "ssh_login", "ok", T0 + HOUR + 3000,
                                      output="logged in")
            finally:
                await inbox.stop()

        def reinforced(r: dict[str, list[dict]]) -> bool:
            return any(m["op"] == "evidence_reinforce" for m in r["memory-log"])

        recs = await collect(s, kafka_bootstrap, ["memory-log", "inbox"], reinforced, 60)
    finally:
        w.stop()
    items = {it["memoryId"] for op in recs["inbox"] if op["op"] == "inject"
             and op["packet"]["packetId"] == packet["packetId"] for it in op["packet"]["items"]}
    ev = [m for m in recs["memory-log"] if m["op"] == "evidence_reinforce"]
    assert items and {m["memoryId"] for m in ev} <= items
    assert all(m["owner"] == "dana" and m["sessionId"] == "ask" for m in ev)
    assert not [m for m in recs["memory-log"] if m["op"] == "evidence_weaken"]
