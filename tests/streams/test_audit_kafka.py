"""`mnemoflow audit` against the real broker and a real worker: one session of a user states a
fact, another asks; a Python host claims the packet and reports it delivered; the audit
store, synced from the topics, shows the whole chain."""

from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import dataclass

import pytest
from test_memories_cli_kafka import tell
from test_topology_kafka import MANIFEST

from mnemoflow.agents.decisions import PACKET, TIMEOUT
from mnemoflow.projections import audit_queries as Q
from mnemoflow.streams import audit_cli
from mnemoflow.streams.audit_sync import open_store, store_path, sync
from mnemoflow.streams.config import Settings
from mnemoflow.streams.decisions import DecisionWatcher, describe
from mnemoflow.streams.host import HostClient
from mnemoflow.streams.inbox import InboxClient
from mnemoflow.streams.process import worker_env
from mnemoflow.streams.step import StepAssembler

from factories import T0
from support import WorkerProcess, isolated_settings, ready_worker, run_cli

pytestmark = pytest.mark.kafka
DAY = 86_400_000
FACT = "My locker code is zq417x."
QUESTION = "What is my locker code? I forgot it."


@dataclass(frozen=True)
class Scenario:
    settings: Settings  # the worker's, with the bootstrap set, as the CLI reads it
    packet_id: str
    claimer: str


@pytest.fixture(scope="module")
async def worker(kafka_bootstrap, tmp_path_factory):
    s = isolated_settings(tmp_path_factory.mktemp("audit"), "audit")
    async with ready_worker(s, kafka_bootstrap) as w:
        yield w


@pytest.fixture(scope="module")
async def scenario(worker: WorkerProcess) -> Scenario:
    s, bs = worker.settings, worker.bootstrap
    async with HostClient(s, bs) as host, DecisionWatcher(s, bs) as watcher:
        inbox = InboxClient(s, bs, host.producer)
        await inbox.start()
        try:
            await tell(host, inbox, watcher, "mem-a", "user-a", FACT, T0)

            ask = host.session("ask-a", "user-a")
            step = StepAssembler(ask, inbox, MANIFEST, decisions=watcher)
            await ask.lifecycle("start", T0 + DAY, MANIFEST)
            await ask.user_message(QUESTION, T0 + DAY + 1000)
            # waits for the packet, claims it and writes packet_delivered, all acknowledged
            result = await step.step_boundary(T0 + DAY + 1001, user_message=QUESTION, wait=60)
            assert result.decision is not None and result.decision.outcome == PACKET, \
                describe(result.decision)
            assert len(result.delivered) == 1
            return Scenario(s.with_overrides(bootstrap=bs), result.delivered[0],
                            inbox.claimer_id)
        finally:
            await inbox.stop()


async def _cli(settings: Settings, capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    return await run_cli(audit_cli, settings, capsys, "audit", *argv)


async def test_the_cli_shows_the_whole_chain_of_a_packet(
        scenario: Scenario, capsys: pytest.CaptureFixture[str]) -> None:
    s, pid = scenario.settings, scenario.packet_id
    chain = json.loads(await _cli(s, capsys, "--packet", pid, "--json"))
    assert chain["packetId"] == pid and chain["sessionId"] == "ask-a"
    assert chain["userId"] == "user-a"
    trigger = chain["trigger"]
    assert trigger["text"] == QUESTION and trigger["type"] == "user_message"
    assert trigger["eventTime"] == T0 + DAY + 1000 and trigger["eventSeq"] == 2
    gate = chain["gate"]
    assert gate["action"] in Q.FIRED and gate["score"] > 0 and gate["signals"]["question"] == 1.0
    assert chain["broker"]["action"] == "inject" and chain["tiers"].get("lexical") == "ok"
    kept = [c for c in chain["candidates"] if c["outcome"] == "kept"]
    assert any("zq417x" in (c["text"] or "") for c in kept), chain["candidates"]
    assert all(c["owner"] == "user-a" for c in chain["candidates"])
    assert chain["safety"]["verdict"] in ("allow", "allow-some")
    items = chain["packet"]["items"]
    assert any("zq417x" in i["text"] and i["sourceSessionId"] == "mem-a" for i in items)
    assert chain["packet"]["budgetBytes"] == sum(len(i["text"].encode()) for i in items)
    assert chain["claim"]["claimer"] == scenario.claimer and chain["lostClaims"] == []
    assert [(f["kind"], f["ref"]) for f in chain["feedback"]] == [("packet_delivered", pid)]
    # the same, found by the start of its id, as tables
    table = await _cli(s, capsys, "--packet", pid[:14])
    assert pid in table and scenario.claimer in table and "packet_delivered" in table
    session = json.loads(await _cli(s, capsys, "--session", "ask-a", "--json"))
    assert session["counts"] == {"events": 3, "fired": 1, "packets": 1, "claims": 1,
                                 "delivered": 1}
    whats = [e["what"] for e in session["timeline"]]
    assert whats.index("user") < whats.index("broker") < whats.index("inject") \
        < whats.index("claim") < whats.index("feedback")
    user = json.loads(await _cli(s, capsys, "--user", "user-a", "--json"))
    assert {x["sessionId"] for x in user["sessions"]} >= {"mem-a", "ask-a"}
    # (the other test's session of this user may have a packet too)
    assert (pid, True) in [(p["packetId"], p["delivered"]) for p in user["packets"]]


async def test_a_second_sync_reads_only_new_records_and_a_rebuild_gives_the_same(
        scenario: Scenario) -> None:
    s, pid = scenario.settings, scenario.packet_id
    with open_store(s) as store:
        await sync(store, s, s.bootstrap)  # type: ignore[arg-type]  # set by the fixture
        before, audits = store.offsets(), store.count("audit")
        chain = Q.packet_chain(store, pid)
    bs: str = s.bootstrap  # type: ignore[assignment]
    async with HostClient(s, bs) as host, DecisionWatcher(s, bs) as watcher:
        inbox = InboxClient(s, bs, host.producer)
        await inbox.start()
        try:
            more = host.session("more-a", "user-a")
            await more.lifecycle("start", T0 + 2 * DAY, MANIFEST)
            await more.user_message("Which colour did I pick for the bike shed?",
                                    T0 + 2 * DAY + 1000)
            # the gate's record and, if it fired, the broker's (and its inject op) are written
            decided = await StepAssembler(more, inbox, MANIFEST,
                                          decisions=watcher).wait_decision(60)
            assert decided.outcome != TIMEOUT, describe(decided)
        finally:
            await inbox.stop()
    with open_store(s) as store:
        report = await sync(store, s, s.bootstrap)  # type: ignore[arg-type]
        after = store.offsets()
        # read from where the first sync stopped, each new record once
        moved = {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}
        for topic in ("session-events", "segments", "audit"):
            assert report.records[topic] == sum(n for (t, _), n in moved.items() if t == topic)
        assert report.records["session-events"] == 2  # the lifecycle start and the message
        assert report.added["audit"] == report.records["audit"] >= 2  # each new decision, once
        assert store.count("audit") == audits + report.records["audit"]
        assert Q.packet_chain(store, pid) == chain
        session = Q.session_timeline(store, "more-a")
        assert session is not None and session["counts"]["events"] == 2
    # `--rebuild` from another process: the store deleted and folded again gives the same
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "mnemoflow.streams.audit_cli", "--packet", pid, "--json",
        "--rebuild", env=worker_env(s, s.bootstrap),  # type: ignore[arg-type]
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err.decode()
    assert "rebuilt: asked" in err.decode() and str(store_path(s)) in err.decode()
    assert json.loads(out) == chain
    with open_store(s) as store:
        assert store.offsets().keys() >= after.keys()
        assert all(store.offsets()[k] >= v for k, v in after.items())
        assert Q.session_timeline(store, "more-a") == session
        # offsets past a topic's end (the broker was reset, the topics made anew): the sync
        # starts over from offset 0 by itself
        store.con.execute("UPDATE offsets SET next_offset = next_offset + 1000000 "
                          "WHERE topic = 'audit'")
        report = await sync(store, s, s.bootstrap)  # type: ignore[arg-type]
        assert report.rebuilt is not None and "ends before the store's offset" in report.rebuilt
        assert Q.packet_chain(store, pid) == chain
