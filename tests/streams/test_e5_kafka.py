"""A worker configured with e5-small-v2, against the real broker: recall through the e5 index,
the model named in the audit, and e5's own floors (a filler reply stays out of the packet)."""

from __future__ import annotations

import pytest
from test_topology_kafka import MANIFEST

from mnemoflow.agents.decisions import PACKET
from mnemoflow.agents.text import digest
from mnemoflow.projections.embedding_e5 import E5Embedder
from mnemoflow.streams.decisions import DecisionWatcher, describe
from mnemoflow.streams.host import HostClient
from mnemoflow.streams.inbox import InboxClient
from mnemoflow.streams.step import StepAssembler

from factories import T0
from support import WorkerProcess, collect, isolated_settings, prepare_topics

pytestmark = pytest.mark.kafka
DAY = 86_400_000


async def test_a_worker_on_e5_recalls_through_its_own_index(kafka_bootstrap, tmp_path) -> None:
    # recall waits for the vector rows: the floors judge by them
    s = isolated_settings(tmp_path, "e5").with_overrides(embedding_model="e5-small-v2",
                                                         recall_barrier="projected")
    await prepare_topics(s, kafka_bootstrap)
    w = WorkerProcess(s, kafka_bootstrap).start()
    try:
        await w.wait_ready()
        async with HostClient(s, kafka_bootstrap) as host, \
                DecisionWatcher(s, kafka_bootstrap) as watcher:
            inbox = InboxClient(s, kafka_bootstrap, host.producer)
            await inbox.start()
            try:
                mem = host.session("mem-e5", "user-e5")
                await mem.lifecycle("start", T0, MANIFEST)
                await mem.user_message("Our release manager for the Atlas launch is Priya.",
                                       T0 + 1000)
                await mem.assistant_message("Noted.", T0 + 2000)
                told = await StepAssembler(mem, inbox, MANIFEST,
                                           decisions=watcher).wait_decision(90)
                assert told.outcome is not None, describe(told)

                ask = host.session("ask-e5", "user-e5")
                step = StepAssembler(ask, inbox, MANIFEST, decisions=watcher)
                await ask.lifecycle("start", T0 + DAY, MANIFEST)
                question = "Who is the release manager for Atlas?"
                await ask.user_message(question, T0 + DAY + 1000)
                result = await step.step_boundary(T0 + DAY + 1001, user_message=question,
                                                  wait=90)
                d = result.decision
                assert d is not None and d.outcome == PACKET, describe(d)
                text = result.request.messages[0]["content"]
                assert "Priya" in text
                assert "Noted." not in text
            finally:
                await inbox.stop()
        audits = await collect(s, kafka_bootstrap, ["audit"], lambda r: any(
            a.get("packetId") == d.packet_id for a in r["audit"]), 60)
        broker = next(a for a in audits["audit"] if a.get("packetId") == d.packet_id)
        # the filler was a candidate (its turn context matches), dropped by e5's item floor:
        # it shares no word with the question
        filler = [c for c in broker["candidates"] if c["digest"] == digest("Noted.")]
        assert [c["outcome"] for c in filler] == ["low-relevance"]
        assert E5Embedder.version in (broker.get("indexVersion") or "")
        assert broker["tiers"].get("vector") == "ok"
        assert any("vector" in c["tiers"] for c in broker["candidates"])
    finally:
        w.stop()
