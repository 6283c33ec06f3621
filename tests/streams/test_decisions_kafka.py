"""A step boundary that waits for the pipeline's decision, against the real broker."""

from __future__ import annotations

import asyncio

import pytest
from test_topology_kafka import MANIFEST, _start

from mnemoflow.agents.decisions import PACKET, SUPPRESS, TIMEOUT
from mnemoflow.streams.decisions import DecisionWatcher, describe
from mnemoflow.streams.host import HostClient
from mnemoflow.streams.inbox import InboxClient
from mnemoflow.streams.step import StepAssembler

from factories import T0
from support import collect, isolated_settings, prepare_topics

pytestmark = pytest.mark.kafka
DAY = 86_400_000


@pytest.fixture(scope="module")
async def worker(kafka_bootstrap, tmp_path_factory):
    s = isolated_settings(tmp_path_factory.mktemp("decide"), "decide")
    w = await _start(s, kafka_bootstrap)
    try:
        yield w
    finally:
        w.stop()


async def test_the_boundary_waits_for_the_packet_then_claims_it(worker) -> None:
    s, bs = worker.settings, worker.bootstrap
    async with HostClient(s, bs) as host, DecisionWatcher(s, bs) as watcher:
        inbox = InboxClient(s, bs, host.producer)
        await inbox.start()
        try:
            mem = host.session("mem-w", "user-w")
            await mem.lifecycle("start", T0, MANIFEST)
            await mem.user_message("My locker code is zq417x.", T0 + 1000)
            told = await StepAssembler(mem, inbox, MANIFEST, decisions=watcher).wait_decision(60)
            assert told.outcome != TIMEOUT, describe(told)

            ask = host.session("ask-w", "user-w")
            step = StepAssembler(ask, inbox, MANIFEST, decisions=watcher)
            await ask.lifecycle("start", T0 + DAY, MANIFEST)
            question = "What is my locker code? I forgot it."
            await ask.user_message(question, T0 + DAY + 1000)
            result = await step.step_boundary(T0 + DAY + 1001, user_message=question, wait=60)
            d = result.decision
            assert d is not None and d.outcome == PACKET, describe(d)
            assert d.gate is not None and d.gate["action"] in ("retrieve", "prefetch")
            assert d.broker is not None and d.broker["packetId"] == d.packet_id
            # no polling: the packet the decision names is claimed by this very boundary
            assert result.delivered == (d.packet_id,)
            assert "zq417x" in result.request.messages[0]["content"]

            # the same question at once: the gate's cooldown suppresses it, and the wait
            # returns on the gate's record alone
            await ask.user_message(question, T0 + DAY + 2000)
            again = await step.step_boundary(T0 + DAY + 2001, wait=60)
            assert again.decision is not None and again.decision.outcome == SUPPRESS
            assert again.decision.gate["reason"] == "cooldown"
            assert again.delivered == ()
        finally:
            await inbox.stop()


async def test_an_event_that_is_never_decided_ends_in_a_timeout(worker) -> None:
    """A dead-lettered event gets no gate record: the wait ends at its bound and names it."""
    s, bs = worker.settings, worker.bootstrap
    async with HostClient(s, bs) as host, DecisionWatcher(s, bs) as watcher:
        lost = host.session("lost-w", "user-lost")
        await lost.user_message("hello", -5)  # eventTime out of range: dead-lettered
        seq = lost.decision_seq
        recs = await collect(s, bs, ["dead-letter"], lambda r: any(
            d.get("reason") == "invalid" for d in r["dead-letter"]), 60)
        assert recs["dead-letter"]
        d = await watcher.wait("lost-w", lost.take_owed(), 2.0)
        assert d.outcome == TIMEOUT and d.undecided == (seq,) and d.waited_ms >= 2000


async def test_waits_of_different_sessions_do_not_queue_behind_each_other(worker) -> None:
    """A long wait (an event that is never decided) does not hold up another session's."""
    s, bs = worker.settings, worker.bootstrap
    async with HostClient(s, bs) as host, DecisionWatcher(s, bs) as watcher:
        lost = host.session("stuck-w", "user-stuck")
        await lost.user_message("hello", -5)  # dead-lettered: never decided
        stuck = asyncio.create_task(watcher.wait("stuck-w", lost.take_owed(), 60.0))
        try:
            other = host.session("quick-w", "user-quick")
            await other.lifecycle("start", T0, MANIFEST)
            await other.user_message("Thanks, that is all for today.", T0 + 1000)
            d = await watcher.wait("quick-w", other.take_owed(), 50.0)
            assert d.outcome != TIMEOUT, describe(d)
            assert not stuck.done()
        finally:
            stuck.cancel()


async def test_a_resumed_session_never_reuses_an_event_seq(kafka_bootstrap, tmp_path) -> None:
    """A host that restarts continues the session's numbering from the input topics."""
    s = isolated_settings(tmp_path, "resume")
    await prepare_topics(s, kafka_bootstrap)
    async with HostClient(s, kafka_bootstrap) as host:
        first = host.session("res-1", "user-res")
        await first.user_message("one", T0)
        await first.agent_step("start", T0 + 1)
        await first.tool_result("c1", "deploy", "ok", T0 + 2, output="done")
        assert (first.last_seq, first.turn, first.step) == (3, 1, 1)
    async with HostClient(s, kafka_bootstrap) as host:
        again = await host.resume("res-1", "user-res")
        rec = await again.user_message("two", T0 + 3)
        assert (rec["eventSeq"], rec["turn"], rec["step"]) == (4, 2, 0)
        fresh = await host.resume("res-2", "user-res")
        assert (await fresh.user_message("new", T0 + 4))["eventSeq"] == 1
