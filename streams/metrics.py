"""A worker's live metrics: Prometheus counters of what its stages wrote, gauges of how far
its consumers are behind, and a small HTTP server for them (`/metrics`, `/healthz`, `/readyz`).

Every metric lives in the worker's own `CollectorRegistry`, passed in, never in
prometheus_client's global one: two runners in one process (tests) never share a count.

What the counters count: the records the worker wrote, each when the producer accepted it,
so they equal what the output topics hold from this process, redelivered inputs included (a
redelivered input re-emits the same records, ids and all, and each copy is in the topic and
in the count). They start at zero with the process: after a restart or a replay they count
what the new process wrote, not what the topics held before it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Histogram, make_wsgi_app
from prometheus_client.core import GaugeMetricFamily, Metric

# event -> packet latency: a packet is built within a second when the pipeline keeps up; the
# top buckets show a backlog (and, after a replay, how old the replayed events are)
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
Lag = Mapping[tuple[str, int], int]  # (topic base name, partition) -> records behind


class _LagGauge:
    """A gauge per (topic, partition), served from the last snapshot its owner published. The
    lags are computed on the worker's event loop, which owns the consumers, and scraped from
    the server's thread, which therefore only reads a dict that is replaced whole."""

    def __init__(self, name: str, doc: str) -> None:
        self.name, self.doc = name, doc
        self.values: Lag = {}

    def _family(self) -> GaugeMetricFamily:
        return GaugeMetricFamily(self.name, self.doc, labels=["topic", "partition"])

    def describe(self) -> list[Metric]:
        return [self._family()]

    def collect(self) -> Iterator[Metric]:
        family = self._family()
        for (topic, partition), lag in sorted(self.values.items()):
            family.add_metric([topic, str(partition)], lag)
        yield family


class WorkerMetrics:
    """The worker's metrics, fed by the runner (`emitted`, `dead_lettered`, `set_consumer_lag`)
    and the projector (`set_projection_lag`); pure bookkeeping, no I/O."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.records = Counter("mnemoflow_records_emitted", "Records written, by output topic",
                               ["topic"], registry=registry)
        self.gate = Counter("mnemoflow_gate_decisions", "Gate audit records written",
                            ["action", "reason"], registry=registry)
        self.broker = Counter("mnemoflow_broker_decisions", "Broker audit records written",
                              ["action", "reason"], registry=registry)
        self.packets = Counter("mnemoflow_packets", "Inbox inject ops written (one packet each)",
                               registry=registry)
        self.packet_bytes = Counter("mnemoflow_packet_bytes",
                                    "Item text bytes of the packets written (budgetBytes)",
                                    registry=registry)
        self.latency = Histogram("mnemoflow_event_to_packet_seconds",
                                 "Broker audit emitTime - ingestTime of injected packets",
                                 buckets=LATENCY_BUCKETS, registry=registry)
        self.tiers = Counter("mnemoflow_recall_tier_outcomes",
                             "Recall tier outcomes in broker audits (the audit's tiers map)",
                             ["tier", "outcome"], registry=registry)
        self.recall_lists = Histogram("mnemoflow_recall_requests_taken_together",
                                      "Recall requests per list the recall stage took at once "
                                      "(MNEMOFLOW_RECALL_BATCH bounds it)",
                                      buckets=(1, 2, 4, 8, 16, 32, 64), registry=registry)
        self.dead_letters = Counter("mnemoflow_dead_letters", "Dead letters written",
                                    ["reason", "stage"], registry=registry)
        self.consumer_lag = _LagGauge(
            "mnemoflow_consumer_lag_records",
            "Records past the next one the consumer hands to a stage, per assigned partition")
        self.projection_lag = _LagGauge(
            "mnemoflow_projection_lag_records",
            "Records of a held memory partition not yet applied to the worker's memory")
        registry.register(self.consumer_lag)
        registry.register(self.projection_lag)

    def emitted(self, topic: str, value: dict[str, Any]) -> None:
        """A record (the step's value, before encoding) was written to `topic` (a base name)."""
        self.records.labels(topic).inc()
        if topic == "audit":
            self._audit(value)
        elif topic == "inbox" and value.get("op") == "inject" and value.get("packet"):
            self.packets.inc()
            self.packet_bytes.inc(value["packet"].get("budgetBytes", 0))

    def _audit(self, audit: dict[str, Any]) -> None:
        action, reason = audit["action"], audit["reason"]
        if audit["stage"] == "gate":
            self.gate.labels(action, reason).inc()
            return
        if audit["stage"] != "broker":
            return
        self.broker.labels(action, reason).inc()
        for tier, outcome in (audit.get("tiers") or {}).items():
            self.tiers.labels(tier, outcome).inc()
        ingest, emit = audit.get("ingestTime") or 0, audit.get("emitTime") or 0
        if action == "inject" and ingest > 0 and emit > 0:
            # the two clocks are the producer's and the worker's: never a negative latency
            self.latency.observe(max(0, emit - ingest) / 1000)

    def dead_lettered(self, reason: str, stage: str) -> None:
        self.dead_letters.labels(reason, stage).inc()

    def set_consumer_lag(self, lag: Lag) -> None:
        self.consumer_lag.values = dict(lag)

    def set_projection_lag(self, lag: Lag) -> None:
        self.projection_lag.values = dict(lag)


# -- the HTTP server --------------------------------------------------------------------------

class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a hung scraper never holds up the worker's exit
    # SO_REUSEADDR (HTTPServer's default) stays: on Linux it lets a restarted worker take its
    # fixed port back from connections in TIME_WAIT, and still refuses a port another listens on


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes every few seconds would flood the worker's log."""


class MetricsServer:
    """`/metrics` (Prometheus text format), `/healthz` (200 while the process runs) and
    `/readyz` (200 when `status()` says ready, else 503 with the status), on 127.0.0.1.

    It runs on a thread of its own rather than on the worker's event loop: a scrape is then
    answered while the loop is busy (a checkpoint holds it for seconds), and it is up before
    faust starts and until the worker has stopped. Port 0 lets the OS choose a free port, so
    two workers on one machine never collide; `port` says which one it got."""

    def __init__(self, registry: CollectorRegistry, status: Callable[[], tuple[str, str]],
                 port: int = 0, host: str = "127.0.0.1") -> None:
        self.registry, self.status, self.host, self.requested = registry, status, host, port
        self._metrics = make_wsgi_app(registry)
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        assert self._server is not None, "not started"
        return int(self._server.server_port)

    def start(self) -> MetricsServer:
        """Bind and serve; an OSError if the port is taken."""
        self._server = make_server(self.host, self.requested, self._app, server_class=_Server,
                                   handler_class=_Quiet)
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.2,),
                                        name="metrics-http", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is None:
            return
        self._server.shutdown()  # returns once serve_forever has left its loop
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
        self._server = self._thread = None

    def _app(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        if path == "/metrics":
            return self._metrics(environ, start_response)
        if path == "/healthz":
            return _text(start_response, "200 OK", "ok")
        if path == "/readyz":
            status, detail = self.status()
            if status == "ready":
                return _text(start_response, "200 OK", "ready")
            return _text(start_response, "503 Service Unavailable",
                         f"{status}: {detail}" if detail else status)
        return _text(start_response, "404 Not Found", "not found: try /metrics, /healthz, /readyz")


def _text(start_response: Callable[..., Any], status: str, body: str) -> list[bytes]:
    data = (body + "\n").encode()
    start_response(status, [("Content-Type", "text/plain; charset=utf-8"),
                            ("Content-Length", str(len(data)))])
    return [data]
