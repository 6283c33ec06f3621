"""Replay by resetting offsets: the same observations and packets, by id and digest."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter

import pytest
from test_topology_kafka import _ask, _start, _two_phase, _wait_gate

from support import broker_audits, collect, isolated_settings, worker_env

pytestmark = pytest.mark.kafka
USERS = 8


def _injects_landed(r: dict[str, list[dict]]) -> bool:
    """Every inject the broker audited is on the inbox too (the two topics land in any order)."""
    audited = sum(a["action"] == "inject" for a in broker_audits(r))
    return sum(o["op"] == "inject" for o in r["inbox"]) >= audited


async def test_replay_gives_the_same_segments_and_packets(kafka_bootstrap, tmp_path) -> None:
    s = isolated_settings(tmp_path, "replay", store="rocksdb://", vector=False, graph=False)
    w = await _start(s, kafka_bootstrap)
    try:
        sent = await _two_phase(s, kafka_bootstrap, USERS)
        await collect(s, kafka_bootstrap, ["audit"], _wait_gate(sent["session-events"]), 60)
        await _ask(s, kafka_bootstrap, list(range(USERS)))
        first = await collect(s, kafka_bootstrap, ["audit", "inbox", "segments"],
                              lambda r: len(broker_audits(r)) >= USERS and _injects_landed(r), 60)
    finally:
        w.stop()
    n_seg, n_inbox = len(first["segments"]), len(first["inbox"])
    out = subprocess.run([sys.executable, "-m", "mnemoflow.streams.cli", "replay", "--to-earliest"],
                         env=worker_env(s, kafka_bootstrap), capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert "session-events[0] -> 0" in out.stdout and "deleted changelog" in out.stdout
    w.start()
    try:
        await w.wait_ready()
        both = await collect(s, kafka_bootstrap, ["audit", "inbox", "segments"],
                             lambda r: len(r["segments"]) >= 2 * n_seg
                             and len(broker_audits(r)) >= 2 * USERS and _injects_landed(r), 90)
    finally:
        w.stop()
    # every observation and every packet of the first run appears once more, identical
    segs = Counter((g["segmentId"], g["digest"], g["contextVersion"]) for g in both["segments"])
    assert len(segs) == n_seg and set(segs.values()) == {2}
    pk = Counter((o["packet"]["packetId"], o["packet"]["exactDigest"]) for o in both["inbox"]
                 if o["op"] == "inject")
    assert pk and len(both["inbox"]) == 2 * n_inbox and set(pk.values()) == {2}
