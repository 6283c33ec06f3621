"""The worker's metrics without Kafka: the counters fed with the records the pipeline makes
(the in-memory runner runs the real topology), and the HTTP server on a free port."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from runners import MemoryHarness

from mnemoflow.streams.host import CapabilityManifest
from mnemoflow.streams.metrics import MetricsServer, WorkerMetrics

from factories import T0
from support import isolated_settings

DAY = 86_400_000
PATCH = CapabilityManifest(provider="test", model="m", supportsPreStep=True)


def _value(m: WorkerMetrics, name: str, **labels: str) -> float:
    return m.registry.get_sample_value(name, labels) or 0.0


def _by_labels(m: WorkerMetrics, name: str, *keys: str) -> dict[tuple[str, ...], float]:
    """Every non-zero sample of a counter, by its label values."""
    out = {}
    for family in m.registry.collect():
        for s in family.samples:
            if s.name == name and s.value:
                out[tuple(s.labels[k] for k in keys)] = s.value
    return out


def _audit(stage: str, action: str, reason: str, **kw: Any) -> dict[str, Any]:
    """An audit record with the fields the metrics read, as gate._audit / broker.build make it."""
    return {"auditId": f"audit:{stage}:{action}:{reason}", "sessionId": "s1", "userId": "u1",
            "stage": stage, "action": action, "reason": reason, "tiers": {}, "ingestTime": 0,
            "emitTime": 0, **kw}


async def _pipeline(tmp: Path) -> dict[str, list[tuple[str, dict[str, Any]]]]:
    """Three users state a fact in one session and ask for it in another."""
    h = MemoryHarness(isolated_settings(tmp, "metrics", vector=False, graph=False))
    for n in range(3):
        mem = h.session(f"mem-{n}", f"user-{n}")
        await mem.lifecycle("start", T0 + n, PATCH)
        await mem.user_message(f"My locker code is zq00{n}x and my favourite colour is "
                               f"shade00{n}.", T0 + 1000 + n)
        ask = h.session(f"ask-{n}", f"user-{n}")
        await ask.lifecycle("start", T0 + DAY + n, PATCH)
        await ask.user_message("What is my locker code? I forgot it.", T0 + DAY + 1000 + n)
    return h.runner.logs


async def test_counters_equal_the_records_the_pipeline_wrote(tmp_path: Path) -> None:
    logs = await _pipeline(tmp_path)
    m = WorkerMetrics(CollectorRegistry())
    for topic in ("audit", "inbox", "segments", "recall-requests", "memory-log"):
        for _, value in logs.get(topic, []):
            m.emitted(topic, value)
    audits = [v for _, v in logs["audit"]]
    gate = Counter((a["action"], a["reason"]) for a in audits if a["stage"] == "gate")
    broker = Counter((a["action"], a["reason"]) for a in audits if a["stage"] == "broker")
    assert len(gate) >= 2 and ("inject",) in {k[:1] for k in broker}, (gate, broker)
    assert _by_labels(m, "mnemoflow_gate_decisions_total", "action", "reason") == gate
    assert _by_labels(m, "mnemoflow_broker_decisions_total", "action", "reason") == broker
    injects = [op for _, op in logs["inbox"] if op["op"] == "inject"]
    assert _value(m, "mnemoflow_packets_total") == len(injects) > 0
    assert _value(m, "mnemoflow_packet_bytes_total") == sum(
        op["packet"]["budgetBytes"] for op in injects) > 0
    tiers = Counter(kv for a in audits if a["stage"] == "broker" for kv in a["tiers"].items())
    assert _by_labels(m, "mnemoflow_recall_tier_outcomes_total", "tier", "outcome") == tiers
    timed = [a for a in audits if a["stage"] == "broker" and a["action"] == "inject"
             and a["ingestTime"] > 0]
    assert _value(m, "mnemoflow_event_to_packet_seconds_count") == len(timed) > 0
    for topic in ("audit", "inbox", "segments"):
        assert _value(m, "mnemoflow_records_emitted_total", topic=topic) == len(logs[topic])


def test_a_redelivered_record_counts_again_as_the_topic_holds_it_twice() -> None:
    m = WorkerMetrics(CollectorRegistry())
    a = _audit("broker", "drop", "stale-context", tiers={"lexical": "ok"})
    m.emitted("audit", a)
    m.emitted("audit", dict(a))  # the same auditId, re-emitted by a redelivered request
    assert _value(m, "mnemoflow_broker_decisions_total", action="drop",
                  reason="stale-context") == 2
    assert _value(m, "mnemoflow_recall_tier_outcomes_total", tier="lexical", outcome="ok") == 2


def test_latency_only_for_injects_with_an_ingest_time() -> None:
    m = WorkerMetrics(CollectorRegistry())
    m.emitted("audit", _audit("broker", "inject", "above-threshold", ingestTime=10_000,
                              emitTime=10_600))
    m.emitted("audit", _audit("broker", "inject", "warm", ingestTime=0, emitTime=10_600))
    m.emitted("audit", _audit("broker", "suppress", "empty", ingestTime=10_000, emitTime=20_000))
    # the producer's clock ahead of the worker's: counted as 0, never negative
    m.emitted("audit", _audit("broker", "inject", "warm", ingestTime=20_000, emitTime=19_990))
    assert _value(m, "mnemoflow_event_to_packet_seconds_count") == 2
    assert _value(m, "mnemoflow_event_to_packet_seconds_sum") == pytest.approx(0.6)
    assert _value(m, "mnemoflow_event_to_packet_seconds_bucket", le="0.5") == 1
    assert _value(m, "mnemoflow_event_to_packet_seconds_bucket", le="1.0") == 2


def test_tier_outcomes_gate_decisions_and_dead_letters() -> None:
    m = WorkerMetrics(CollectorRegistry())
    m.emitted("audit", _audit("broker", "drop", "recall-failed",
                              tiers={"lexical": "error", "vector": "timeout", "graph": "skipped"}))
    m.emitted("audit", _audit("gate", "suppress", "lifecycle"))
    m.emitted("audit", _audit("gate", "retrieve", "above-threshold"))
    m.emitted("inbox", {"op": "claim", "packetIds": ["p1"]})  # not a packet
    m.dead_lettered("invalid", "observer")
    m.dead_lettered("invalid", "observer")
    m.dead_lettered("bad-magic", "gate")
    assert _by_labels(m, "mnemoflow_recall_tier_outcomes_total", "tier", "outcome") == {
        ("lexical", "error"): 1, ("vector", "timeout"): 1, ("graph", "skipped"): 1}
    assert _by_labels(m, "mnemoflow_gate_decisions_total", "action", "reason") == {
        ("suppress", "lifecycle"): 1, ("retrieve", "above-threshold"): 1}
    assert _value(m, "mnemoflow_packets_total") == 0
    assert _by_labels(m, "mnemoflow_dead_letters_total", "reason", "stage") == {
        ("invalid", "observer"): 2, ("bad-magic", "gate"): 1}


def test_lag_gauges_show_the_last_snapshot_whole() -> None:
    m = WorkerMetrics(CollectorRegistry())
    m.set_consumer_lag({("segments", 0): 3, ("session-events", 1): 0})
    m.set_projection_lag({("memory-log", 2): 7})
    assert _value(m, "mnemoflow_consumer_lag_records", topic="segments", partition="0") == 3
    assert _value(m, "mnemoflow_projection_lag_records", topic="memory-log", partition="2") == 7
    m.set_consumer_lag({("session-events", 1): 4})  # partition 0 of segments was revoked
    assert m.registry.get_sample_value("mnemoflow_consumer_lag_records",
                                       {"topic": "segments", "partition": "0"}) is None
    assert _value(m, "mnemoflow_consumer_lag_records", topic="session-events", partition="1") == 4


def test_each_worker_has_its_own_registry() -> None:
    a, b = WorkerMetrics(CollectorRegistry()), WorkerMetrics(CollectorRegistry())
    a.dead_lettered("invalid", "observer")
    assert _value(b, "mnemoflow_dead_letters_total", reason="invalid", stage="observer") == 0
    assert not [n for n in REGISTRY._names_to_collectors if n.startswith("mnemoflow_")]


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_the_server_serves_metrics_liveness_and_readiness() -> None:
    m = WorkerMetrics(CollectorRegistry())
    m.emitted("audit", _audit("gate", "suppress", "lifecycle"))
    status = ["starting", ""]
    one = MetricsServer(m.registry, lambda: (status[0], status[1])).start()
    two = MetricsServer(CollectorRegistry(), lambda: ("ready", "")).start()
    try:
        assert one.port != two.port and one.port > 0  # port 0: each gets a free one
        code, text = _get(one.port, "/metrics")
        assert code == 200
        families = {f.name: f for f in text_string_to_metric_families(text)}
        assert {"mnemoflow_gate_decisions", "mnemoflow_consumer_lag_records",
                "mnemoflow_event_to_packet_seconds"} <= set(families)
        [sample] = [s for s in families["mnemoflow_gate_decisions"].samples
                    if s.name.endswith("_total")]
        assert sample.labels == {"action": "suppress", "reason": "lifecycle"} and sample.value == 1
        assert _get(one.port, "/healthz") == (200, "ok\n")
        assert _get(one.port, "/readyz") == (503, "starting\n")
        status[:] = ["rebalancing", "partitions moving"]
        assert _get(one.port, "/readyz") == (503, "rebalancing: partitions moving\n")
        status[:] = ["ready", ""]
        assert _get(one.port, "/readyz") == (200, "ready\n")
        assert _get(one.port, "/nope")[0] == 404
        port = one.port
    finally:
        one.stop()
        two.stop()
    with pytest.raises(urllib.error.URLError):
        _get(port, "/healthz")


def test_a_taken_port_is_an_error() -> None:
    one = MetricsServer(CollectorRegistry(), lambda: ("ready", "")).start()
    try:
        with pytest.raises(OSError):
            MetricsServer(CollectorRegistry(), lambda: ("ready", ""), one.port).start()
    finally:
        one.stop()
