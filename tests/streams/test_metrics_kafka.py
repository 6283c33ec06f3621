"""The worker's /metrics against the real broker and a real worker: its counters equal what
the audit, inbox and dead-letter topics hold, before and after a replay.

What is asserted (README, "Worker lifecycle" / "Metrics"): a counter counts the records the
worker process wrote, duplicates included, from zero at its start. So
- in the first run, a recall request sent twice makes the broker re-emit the same audit
  (same auditId); the topic holds it twice and the counter counts it twice, so the counter
  equals the topic's record count, one more than its distinct auditIds;
- after `mnemoflow replay --to-earliest` (offsets of the input topics and the table state
  reset), a new worker re-emits every gate and broker audit with the same auditId, except the
  duplicate request's second one (recall-requests is not an input topic: it is not replayed).
  Its counters must equal the audit records at offsets past the first run's end, which are
  each first-run auditId exactly once: neither the first run's count (one more broker audit)
  nor the topic's whole (twice as many).
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import Counter

import pytest
from aiokafka import TopicPartition
from prometheus_client.parser import text_string_to_metric_families
from test_topology_kafka import _ask, _start, _two_phase

from mnemoflow.agents.partitioning import request_key
from mnemoflow.agents.topology import TOPOLOGY
from mnemoflow.streams import topics as T
from mnemoflow.streams.admin import admin_client
from mnemoflow.streams.config import Settings
from mnemoflow.streams.lifecycle import read_health
from mnemoflow.streams.producer import AvroProducer
from mnemoflow.streams.reader import Record, TopicReader

from factories import user_event
from support import (
    WorkerProcess,
    broker_audits,
    collect,
    gate_audits,
    isolated_settings,
    prepare_topics,
    worker_env,
)

pytestmark = pytest.mark.kafka
USERS = 6
CONSUMED = sorted({t for s in TOPOLOGY.stages for t in s.inputs})
Samples = dict[tuple[str, ...], float]


def _cli(s: Settings, bs: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mnemoflow.streams.cli", *args],
                          env=worker_env(s, bs), capture_output=True, text=True, timeout=120)


def _port(w: WorkerProcess) -> int:
    assert w.proc is not None
    [h] = [h for h in read_health(w.settings.home, w.settings.app_id) if h["pid"] == w.proc.pid]
    return int(h["metrics_port"])


def _http(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


async def _scrape(port: int) -> dict[str, Samples]:
    """Every sample of the scrape: by sample name, then by label values in sorted label order."""
    code, text = await asyncio.to_thread(_http, port, "/metrics")
    assert code == 200, text
    out: dict[str, Samples] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(v for _, v in sorted(s.labels.items()))] = s.value
    return out


def _nonzero(samples: Samples) -> Counter:
    return Counter({k: int(v) for k, v in samples.items() if v})


def _decisions(audits: list[dict]) -> Counter:
    return Counter((a["action"], a["reason"]) for a in audits)  # the labels' sorted order


async def _read(s: Settings, bs: str, base: str) -> list[Record]:
    async with TopicReader(s, bs, [s.topic(base)]) as r:
        return [x for x in await r.drain() if x.value is not None]


async def _quiet(s: Settings, bs: str, timeout: float = 120.0) -> None:
    """Until the worker's group has committed every topic a stage consumes to its end, twice in
    a row a second apart: every record was processed, so every output was sent and counted."""
    admin = admin_client(s, bs)
    await admin.start()
    deadline, quiet = time.monotonic() + timeout, 0
    try:
        async with TopicReader(s, bs, [s.topic(t) for t in CONSUMED]) as reader:
            while time.monotonic() < deadline:
                ends = await reader._c.end_offsets(reader._tps)
                got = await admin.list_consumer_group_offsets(s.app_id)
                done = {TopicPartition(tp.topic, tp.partition): md.offset for tp, md in got.items()}
                quiet = quiet + 1 if all(done.get(tp, 0) >= end for tp, end in ends.items()
                                         if end > 0) else 0
                if quiet >= 2:
                    return
                await asyncio.sleep(1.0)
    finally:
        await admin.close()
    raise TimeoutError("the worker did not commit its input topics to their ends")


async def _lags_settle(port: int, name: str, expect: set[tuple[str, str]],
                       timeout: float = 30.0) -> Samples:
    """The lag gauge `name` once it has a sample for each of `expect` (partition, topic) and
    every sample is 0; the gauges are refreshed within a second."""
    deadline = time.monotonic() + timeout
    while True:
        lag = (await _scrape(port)).get(name, {})
        if expect <= set(lag) and not any(lag.values()):
            return lag
        if time.monotonic() > deadline:
            raise AssertionError(f"{name} not settled at 0 for {sorted(expect)}: {lag}")
        await asyncio.sleep(0.5)


def _assert_counts(m: dict[str, Samples], audits: list[dict], inbox: list[dict],
                   dead: list[dict]) -> None:
    """The scrape's counters equal these records of the audit, inbox and dead-letter topics."""
    assert _nonzero(m["mnemoflow_gate_decisions_total"]) == _decisions(gate_audits({"audit": audits}))
    brokers = broker_audits({"audit": audits})
    assert _nonzero(m["mnemoflow_broker_decisions_total"]) == _decisions(brokers)
    assert _nonzero(m["mnemoflow_recall_tier_outcomes_total"]) == Counter(
        (outcome, tier) for a in brokers for tier, outcome in a["tiers"].items())
    injects = [op for op in inbox if op["op"] == "inject"]
    assert m["mnemoflow_packets_total"][()] == len(injects)
    assert m["mnemoflow_packet_bytes_total"][()] == sum(op["packet"]["budgetBytes"] for op in injects)
    assert m["mnemoflow_event_to_packet_seconds_count"][()] == sum(
        a["action"] == "inject" and a["ingestTime"] > 0 for a in brokers)
    assert _nonzero(m["mnemoflow_dead_letters_total"]) == Counter(
        (d["reason"], d["stage"]) for d in dead)


async def test_counters_equal_the_topics_and_start_again_after_a_replay(kafka_bootstrap,
                                                                        tmp_path) -> None:
    s = isolated_settings(tmp_path, "metrics", store="rocksdb://", vector=False, graph=False)
    bs = kafka_bootstrap
    w = await _start(s, bs)
    try:
        # operators find the port in the health file, through `mnemoflow health --json`
        out = _cli(s, bs, "health", "--json")
        assert out.returncode == 0, out.stdout + out.stderr
        port = json.loads(out.stdout.splitlines()[0])["metrics_port"]
        assert port == _port(w)
        assert await asyncio.to_thread(_http, port, "/readyz") == (200, "ready\n")
        assert await asyncio.to_thread(_http, port, "/healthz") == (200, "ok\n")

        sent = (await _two_phase(s, bs, USERS))["session-events"]
        await collect(s, bs, ["audit"], lambda r: len(gate_audits(r)) >= sent, 90)
        sent += await _ask(s, bs, list(range(USERS)))
        async with AvroProducer(s, bs) as p:  # dead-lettered by the observer as `invalid`
            await p.send(T.SESSION_EVENTS.name(s), "io.mnemoflow.SessionEvent", "bad-1",
                         user_event("bad-1", 1, "a time before 1970", -5, user="user-bad"))

        def fired(r: dict[str, list[dict]]) -> int:
            return sum(a["action"] != "suppress" for a in gate_audits(r))

        recs = await collect(s, bs, ["audit", "recall-requests", "dead-letter"], lambda r: len(
            gate_audits(r)) >= sent and len(broker_audits(r)) >= fired(r) > 0
            and len(r["dead-letter"]) >= 1, 90)
        # one request redelivered: the broker re-emits its first answer, the same audit
        again = recs["recall-requests"][-1]
        async with AvroProducer(s, bs) as p:
            await p.send(T.RECALL_REQUESTS.name(s), "io.mnemoflow.RecallRequest",
                         request_key(again), again)
        await collect(s, bs, ["audit", "inbox"], lambda r: len(broker_audits(r)) >= fired(r) + 1
                      and sum(op["op"] == "inject" for op in r["inbox"])
                      >= sum(a["action"] == "inject" for a in broker_audits(r)), 60)
        await _quiet(s, bs)
        m = await _scrape(port)
        audit1, inbox1, dead1 = (await _read(s, bs, "audit"), await _read(s, bs, "inbox"),
                                 await _read(s, bs, "dead-letter"))
        audits = [x.value for x in audit1]
        ids = Counter(a["auditId"] for a in broker_audits({"audit": audits}))
        [(twice, n)] = [(i, n) for i, n in ids.items() if n > 1]
        assert n == 2 and {a["requestId"] for a in audits if a["auditId"] == twice} == {
            again["requestId"]}, ids
        assert len(gate_audits({"audit": audits})) == sent
        _assert_counts(m, audits, [x.value for x in inbox1], [x.value for x in dead1])
        assert sum(m["mnemoflow_broker_decisions_total"].values()) == len(ids) + 1
        assert _nonzero(m["mnemoflow_dead_letters_total"]) == {("invalid", "observer"): 1}
        assert m["mnemoflow_records_emitted_total"][("audit",)] == len(audits)
        partitions = {str(p) for p in range(s.partitions)}
        await _lags_settle(port, "mnemoflow_consumer_lag_records",
                           {(p, t) for p in partitions for t in CONSUMED})
        await _lags_settle(port, "mnemoflow_projection_lag_records",
                           {(p, "memory-log") for p in partitions} | {("0", "memory-shared")})
    finally:
        w.stop()

    out = _cli(s, bs, "replay", "--to-earliest")
    assert out.returncode == 0, out.stderr
    assert "deleted changelog" in out.stdout
    first = {(x.topic, x.partition, x.offset) for x in [*audit1, *inbox1, *dead1]}
    n_gate, n_broker = len(gate_audits({"audit": audits})), len(ids)
    w.start()
    try:
        await w.wait_ready()
        port2 = _port(w)
        await collect(s, bs, ["audit", "dead-letter"], lambda r: len(gate_audits(r)) >= 2 * n_gate
                      and len(broker_audits(r)) >= 2 * n_broker + 1 and len(r["dead-letter"]) >= 2,
                      120)
        await _quiet(s, bs)
        m2 = await _scrape(port2)
        audit2, inbox2, dead2 = (await _read(s, bs, "audit"), await _read(s, bs, "inbox"),
                                 await _read(s, bs, "dead-letter"))
    finally:
        w.stop()
    # what the new worker wrote: the records past the first run's, by partition and offset
    audits2 = [x.value for x in audit2 if (x.topic, x.partition, x.offset) not in first]
    new_ids = Counter(a["auditId"] for a in audits2)
    assert set(new_ids.values()) == {1} and set(new_ids) == {a["auditId"] for a in audits}
    assert len(audits2) == len(set(a["auditId"] for a in audits)) == len(audits) - 1
    _assert_counts(m2, audits2, [x.value for x in inbox2 if (x.topic, x.partition, x.offset)
                                 not in first],
                   [x.value for x in dead2 if (x.topic, x.partition, x.offset) not in first])
    assert sum(m2["mnemoflow_broker_decisions_total"].values()) == n_broker
    assert sum(m2["mnemoflow_gate_decisions_total"].values()) == n_gate
    assert _nonzero(m2["mnemoflow_dead_letters_total"]) == {("invalid", "observer"): 1}


async def test_a_fixed_port_that_is_taken_stops_the_worker_in_one_line(kafka_bootstrap,
                                                                       tmp_path) -> None:
    s = isolated_settings(tmp_path, "metrics-port", vector=False, graph=False)
    await prepare_topics(s, kafka_bootstrap)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        w = WorkerProcess(s, kafka_bootstrap,
                          extra_env={"MNEMOFLOW_METRICS_PORT": str(port)}).start()
        assert w.proc is not None
        try:
            code = w.proc.wait(60)
        finally:
            w.stop()
    lines = w.log_tail().strip().splitlines()
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"error: cannot serve metrics on 127.0.0.1:{port}")
    assert "MNEMOFLOW_METRICS_PORT" in lines[0]
