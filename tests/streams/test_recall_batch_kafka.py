"""Recall requests taken together against the real broker: a worker restarted behind a backlog of
questions takes the waiting requests in lists (one log-end lookup, one forward pass for their
queries) and writes the same packets as a worker that takes them one at a time.

Vectors are on and recall waits for them (`projected`), so the packets do not depend on how
far embedding had got; the graph is off, as in the scale test.
"""

from __future__ import annotations

import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from mnemoflow.streams.host import CapabilityManifest, HostClient
from mnemoflow.streams.lifecycle import read_health

from factories import T0
from support import WorkerProcess, broker_audits, collect, isolated_settings, prepare_topics

pytestmark = pytest.mark.kafka
USERS, ASKS = 12, 3
MANIFEST = CapabilityManifest(provider="test", model="m", supportsPreStep=True)
DAY = 86_400_000
TAKEN = "mnemoflow_recall_requests_taken_together"


def _taken(w: WorkerProcess) -> tuple[float, float]:
    """(lists, requests) the recall stage took, from the worker's /metrics."""
    assert w.proc is not None
    [h] = [h for h in read_health(w.settings.home, w.settings.app_id) if h["pid"] == w.proc.pid]
    with urllib.request.urlopen(f"http://127.0.0.1:{h['metrics_port']}/metrics", timeout=10) as r:
        text = r.read().decode()
    samples = {s.name: s.value for f in text_string_to_metric_families(text)
               if f.name == TAKEN for s in f.samples}
    return samples[f"{TAKEN}_count"], samples[f"{TAKEN}_sum"]


async def _run(tmp_path, bs, batch: int) -> tuple[dict[str, str], tuple[float, float]]:
    s = isolated_settings(tmp_path, f"batch-{batch}", graph=False, recall_batch=batch,
                          recall_barrier="projected")
    await prepare_topics(s, bs)
    w = WorkerProcess(s, bs).start()
    try:
        await w.wait_ready()
        async with HostClient(s, bs) as host:
            for u in range(USERS):
                ses = host.session(f"mem-{u}", f"user-{u}")
                await ses.lifecycle("start", T0 + u, MANIFEST)
                await ses.user_message(f"My locker code is zq{u:03d}x and my bike is parked at "
                                       f"rack{u:03d}.", T0 + 1000 + u)
        await collect(s, bs, ["memory-log"], lambda r: len(
            {m["sessionId"] for m in r["memory-log"] if m["op"] == "segment_recorded"}) >= USERS,
            120)
    finally:
        w.stop()
    # the questions wait in the log while no worker runs: the next one starts behind them
    async with HostClient(s, bs) as host:
        for k in range(ASKS):
            for u in range(USERS):
                ses = host.session(f"ask-{u}-{k}", f"user-{u}")
                t = T0 + DAY * (k + 1) + u
                await ses.lifecycle("start", t, MANIFEST)
                await ses.user_message("Where is my bike parked? And my locker code?", t + 1000)
    w = WorkerProcess(s, bs).start()
    try:
        await w.wait_ready()

        def answered(r) -> bool:
            asks = [a for a in broker_audits(r) if a["sessionId"].startswith("ask-")]
            injected = {a["packetId"] for a in asks if a["action"] == "inject"}
            inbox = {op["packet"]["packetId"] for op in r["inbox"] if op["op"] == "inject"}
            return len({a["sessionId"] for a in asks}) >= USERS * ASKS and injected <= inbox

        recs = await collect(s, bs, ["audit", "inbox"], answered, 180)
        taken = _taken(w)  # a list is counted before its steps
    finally:
        w.stop()
    packets = {op["packet"]["packetId"]: op["packet"]["exactDigest"]
               for op in recs["inbox"] if op["op"] == "inject"}
    for op in recs["inbox"]:
        if op["op"] == "inject":  # no user's memory in another's packet
            assert {it["owner"] for it in op["packet"]["items"]} == {
                "user-" + op["sessionId"].split("-")[1]}
    return packets, taken


async def test_a_backlog_is_taken_together_with_the_packets_of_one_at_a_time(
        kafka_bootstrap, tmp_path) -> None:
    alone, (lists1, requests1) = await _run(tmp_path, kafka_bootstrap, 1)
    together, (lists, requests) = await _run(tmp_path, kafka_bootstrap, 16)
    assert len(alone) == USERS * ASKS  # every question got its packet
    assert together == alone
    # a request redelivered after a rebalance is counted again: at least every question's
    assert lists1 == requests1 >= USERS * ASKS  # one at a time: lists of one
    # the restarted worker took its backlog in lists, not one by one
    assert requests >= USERS * ASKS and lists < requests, (lists, requests)
