"""Invariant 5: SIGKILL the worker mid-stream; after a restart the packets are the same, by id.

This test found faust dropping records during the restarted worker's first rebalance (see
streams/faust_app.py): before that fix about half of its runs lost recall requests.

The workers here run with the vector and graph layers off (invariant 9: recall still answers
lexically); graph links are proposed by an idle timer, so they too depend on timing.
The recall barrier waits for the lexical projection only, so with vectors on, which items a
packet holds would depend on how far embedding had got when the worker died; that timing is
not what this test is about (see the issue note).
"""

from __future__ import annotations

import asyncio

import pytest
from test_topology_kafka import _ask, _start, _two_phase, _wait_gate

from support import broker_audits, collect, isolated_settings

pytestmark = pytest.mark.kafka
USERS = 30


def _asked(n: int):
    return lambda r: len({a["requestId"] for a in broker_audits(r)
                          if a["sessionId"].startswith("ask-")}) >= n


def _answered(n: int):
    """n questions audited, and every packet an audit says was injected is readable: the
    inbox op and the audit go to different topics, so the audit can be read first."""
    def done(r: dict[str, list[dict]]) -> bool:
        injected = {a["packetId"] for a in broker_audits(r) if a["action"] == "inject"}
        in_inbox = {op["packet"]["packetId"] for op in r["inbox"] if op["op"] == "inject"}
        return _asked(n)(r) and injected <= in_inbox
    return done


async def _phase1(s, bs) -> int:
    sent = await _two_phase(s, bs, USERS)
    await collect(s, bs, ["audit"], _wait_gate(sent["session-events"]), 90)
    return sent["session-events"]


async def test_sigkill_mid_stream_gives_the_same_packets(kafka_bootstrap, tmp_path) -> None:
    # the uninterrupted run
    a = isolated_settings(tmp_path, "crash-a", store="rocksdb://", vector=False,
                          graph=False)
    wa = await _start(a, kafka_bootstrap)
    try:
        await _phase1(a, kafka_bootstrap)
        await _ask(a, kafka_bootstrap, list(range(USERS)))
        ra = await collect(a, kafka_bootstrap, ["audit", "inbox"], _answered(USERS), 120)
    finally:
        wa.stop()

    # the same input, with a SIGKILL while the questions are being processed
    b = isolated_settings(tmp_path, "crash-b", store="rocksdb://", vector=False,
                          graph=False)
    wb = await _start(b, kafka_bootstrap)
    killed_after = 0
    try:
        await _phase1(b, kafka_bootstrap)
        ask = asyncio.create_task(_ask(b, kafka_bootstrap, list(range(USERS))))
        part = await collect(b, kafka_bootstrap, ["audit"], _asked(3), 60)
        killed_after = len(broker_audits(part))
        wb.kill()
        await ask
        wb.start()
        await wb.wait_ready()
        rb = await collect(b, kafka_bootstrap, ["audit", "inbox"], _answered(USERS), 120)
    finally:
        wb.stop()

    def packets(recs):
        return {op["packet"]["packetId"]: op["packet"]["exactDigest"]
                for op in recs["inbox"] if op["op"] == "inject"}

    assert killed_after < 2 * USERS + 2 * USERS  # the kill happened before the end
    pa, pb = packets(ra), packets(rb)
    assert pa, "no packets: nothing was compared"
    tiers = {t for x in broker_audits(rb) for t in x["tiers"]}
    assert "lexical" in tiers and not tiers & {"vector", "graph"}  # the optional layers were off
    assert pb == pa  # no packet lost, none different
    # duplicates only as byte-identical re-emissions that the inbox fold drops by opId
    ops_b = [op for op in rb["inbox"] if op["op"] == "inject"]
    by_id: dict[str, list[dict]] = {}
    for op in ops_b:
        by_id.setdefault(op["opId"], []).append(op)
    assert all(all(o == same[0] for o in same) for same in by_id.values())
    assert {op["packet"]["packetId"] for op in ops_b} == set(pa)
