"""The topology's invariants against the real broker and a real worker process."""

from __future__ import annotations

import random

import pytest

from mnemoflow.streams import topics as T
from mnemoflow.streams.host import CapabilityManifest, HostClient
from mnemoflow.streams.producer import AvroProducer

from factories import T0
from support import (
    WorkerProcess,
    broker_audits,
    collect,
    gate_audits,
    isolated_settings,
    prepare_topics,
)

pytestmark = pytest.mark.kafka
MANIFEST = CapabilityManifest(provider="test", model="m", supportsPreStep=True)
DAY = 86_400_000


async def _start(settings, bootstrap) -> WorkerProcess:
    await prepare_topics(settings, bootstrap)
    w = WorkerProcess(settings, bootstrap).start()
    await w.wait_ready()
    return w


async def _two_phase(settings, bootstrap, users: int, seed: int = 7) -> dict[str, int]:
    """Phase 1: each user states a unique secret in one session. Phase 2: asks in another."""
    rng = random.Random(seed)
    sent = {"session-events": 0}
    async with HostClient(settings, bootstrap) as host:
        order = list(range(users))
        rng.shuffle(order)
        for u in order:
            s = host.session(f"mem-{u}", f"user-{u}")
            await s.lifecycle("start", T0 + u, MANIFEST)
            await s.user_message(f"My locker code is zq{u:03d}x and my favourite colour is "
                                 f"shade{u:03d}.", T0 + 1000 + u)
            sent["session-events"] += 2
    return sent


async def _ask(settings, bootstrap, users: list[int], seed: int = 11) -> int:
    rng = random.Random(seed)
    order = list(users)
    rng.shuffle(order)
    async with HostClient(settings, bootstrap) as host:
        for u in order:
            s = host.session(f"ask-{u}", f"user-{u}")
            await s.lifecycle("start", T0 + DAY + u, MANIFEST)
            await s.user_message("What is my locker code? I forgot it.", T0 + DAY + 1000 + u)
    return 2 * len(order)


def _ours(session_id: str) -> bool:
    """The leakage test's own sessions. The module's worker is shared, so its topics can also
    hold other tests' sessions (the stale probe's), whichever order the tests run in."""
    return session_id.startswith(("mem-", "ask-"))


def _answered(users: int):
    """Every question decided, and every packet the decisions name is in the inbox: the
    producer can write a packet after its audit (a partition with a request in flight waits,
    the others do not), so the audits alone do not say the packets are readable."""
    def done(recs) -> bool:
        asks = [a for a in broker_audits(recs) if a["sessionId"].startswith("ask-")]
        inbox = {op["packet"]["packetId"] for op in recs["inbox"] if op["op"] == "inject"}
        return len(asks) >= users and {
            a["packetId"] for a in asks if a["action"] == "inject"} <= inbox
    return done


def _wait_gate(n: int):
    return lambda recs: len([a for a in gate_audits(recs) if _ours(a["sessionId"])]) >= n


@pytest.fixture(scope="module")
async def topo(kafka_bootstrap, tmp_path_factory):
    s = isolated_settings(tmp_path_factory.mktemp("topo"), "topo")
    w = await _start(s, kafka_bootstrap)
    try:
        yield w
    finally:
        w.stop()


async def test_zero_leakage_over_200_interleaved_sessions(topo) -> None:
    s, bs = topo.settings, topo.bootstrap
    users = 100  # 100 memory sessions + 100 question sessions = 200 sessions
    sent = await _two_phase(s, bs, users)
    await collect(s, bs, ["audit"], _wait_gate(sent["session-events"]), 90)
    sent["session-events"] += await _ask(s, bs, list(range(users)))
    recs = await collect(
        s, bs, ["audit", "inbox", "segments", "session-events", "tool-results", "agent-steps"],
        _answered(users), 120)
    # invariant 1: retrieval never writes to the session topics
    assert len([e for e in recs["session-events"] if _ours(e["sessionId"])]) == sent["session-events"]
    assert recs["tool-results"] == [] and recs["agent-steps"] == []
    # segments stay in their session and user
    for seg in recs["segments"]:
        sid = seg["envelope"]["sessionId"]
        if _ours(sid):
            assert seg["userId"] == f"user-{sid.split('-')[1]}"
    packets = [op["packet"] for op in recs["inbox"]
               if op["op"] == "inject" and _ours(op["packet"]["sessionId"])]
    assert packets, "no packet at all: the test would prove nothing"
    found = 0
    for p in packets:
        u = int(p["sessionId"].split("-")[1])
        for item in p["items"]:
            assert item["owner"] == f"user-{u}", f"leak: {item['owner']} into {p['sessionId']}"
            assert item["sourceSessionId"] in (f"mem-{u}", f"ask-{u}")
            found += f"zq{u:03d}x" in item["text"]
    # and the audit never lists another user's memory as a candidate either
    for a in broker_audits(recs):
        if not _ours(a["sessionId"]):
            continue
        u = a["sessionId"].split("-")[1]
        assert all(c["owner"] == f"user-{u}" for c in a["candidates"])
    assert found >= 0.9 * users, f"own secret recalled for only {found}/{users} users"


async def test_stale_request_is_dropped_and_audited(topo) -> None:
    """A request older than its session's latest contextVersion is dropped and audited.

    The test makes its own session and recall request: it used to take the last request on
    the topic, which only the leakage test (sharing this module's worker) produces, so run
    alone (`-k stale`) or first it waited 60 s for nothing. Its ids start with "stale-",
    which the leakage test leaves out of its counts."""
    s, bs = topo.settings, topo.bootstrap
    async with HostClient(s, bs) as host:
        ask = host.session("stale-ask", "user-stale")
        await ask.lifecycle("start", T0, MANIFEST)
        await ask.user_message("What is my locker code? I forgot it.", T0 + 1000)
    recs = await collect(s, bs, ["recall-requests"], lambda r: any(
        q["sessionId"] == "stale-ask" for q in r["recall-requests"]), 60)
    req = dict(next(q for q in recs["recall-requests"] if q["sessionId"] == "stale-ask"))
    # the real request (same key, so the same partition, ahead of the probe) raises the
    # session's latest contextVersion above 0 before the broker sees the probe
    assert req["contextVersion"] > 0
    req.update(requestId="req:stale-probe", contextVersion=0, segmentId="seg:stale-probe")
    async with AvroProducer(s, bs) as p:
        await p.send(T.RECALL_REQUESTS.name(s), "io.mnemoflow.RecallRequest", req["sessionId"], req)
    recs = await collect(s, bs, ["audit"], lambda r: any(
        a["requestId"] == "req:stale-probe" for a in broker_audits(r)), 30)
    a = next(a for a in broker_audits(recs) if a["requestId"] == "req:stale-probe")
    assert a["action"] == "drop" and a["reason"] == "stale-context" and a["packetId"] is None


async def test_failed_recall_produces_no_packet_and_no_session_event(kafka_bootstrap, tmp_path):
    s = isolated_settings(tmp_path, "fail").with_overrides(fault_tiers=("lexical", "vector", "graph"))
    w = await _start(s, kafka_bootstrap)
    try:
        sent = await _two_phase(s, kafka_bootstrap, 5)
        await collect(s, kafka_bootstrap, ["audit"], _wait_gate(sent["session-events"]), 60)
        sent["session-events"] += await _ask(s, kafka_bootstrap, list(range(5)))
        recs = await collect(
            s, kafka_bootstrap, ["audit", "inbox", "session-events"],
            lambda r: len([a for a in broker_audits(r) if a["sessionId"].startswith("ask-")]) >= 5,
            60)
    finally:
        w.stop()
    asks = [a for a in broker_audits(recs) if a["sessionId"].startswith("ask-")]
    assert all(a["action"] == "drop" and a["reason"] == "recall-failed" for a in asks)
    assert all(a["tiers"]["lexical"] == "error" and a["tiers"]["vector"] == "error" for a in asks)
    # read again once the worker has stopped: a packet can be readable after its audit, and
    # a stopped worker has written all it will
    inbox = await collect(s, kafka_bootstrap, ["inbox"], lambda r: True, 30)
    assert recs["inbox"] == [] and inbox["inbox"] == []
    assert len(recs["session-events"]) == sent["session-events"]
