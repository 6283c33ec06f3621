"""The faust worker: configuration around `streams.faust_runner`, which runs the topology
declared in `agents.topology` (observer, gate, evidence, recall, and idle consolidation) over
the memory built by `projections.memory` and kept current by `streams.projector`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from functools import partial
from pathlib import Path
from typing import Any

import faust
from prometheus_client import CollectorRegistry

from mnemoflow.agents.injection_rules import load_rules
from mnemoflow.agents.partitioning import SHARED
from mnemoflow.agents.topology import Ports
from mnemoflow.agents.tuning import Tuning, load_tuning
from mnemoflow.projections import snapshot
from mnemoflow.projections.array_index import ArrayIndex
from mnemoflow.projections.embedders import build_embedder
from mnemoflow.projections.embedding import AsyncEmbedder, CachedEmbedder
from mnemoflow.projections.heap import Freezer
from mnemoflow.projections.partitioned import PartitionedMemory, build_partitioned, partition_dir
from mnemoflow.projections.vector_index import IndexMeta, IndexMismatch, VectorIndex, open_index
from mnemoflow.projections.vector_tier import index_meta
from mnemoflow.schemas.codec import default_registry
from mnemoflow.streams import topics as T
from mnemoflow.streams.config import Settings
from mnemoflow.streams.faust_app import WorkerApp
from mnemoflow.streams.faust_runner import FaustRunner
from mnemoflow.streams.keyring import Keyring
from mnemoflow.streams.lifecycle import (
    EXIT_FATAL,
    EXIT_PREFLIGHT,
    STALE_AFTER_S,
    CrashLimit,
    Health,
    Watchdog,
    drop_local_state,
    health_dir,
    limit_repeats,
    read_health,
    stale_partitions,
)
from mnemoflow.streams.metrics import MetricsServer, WorkerMetrics
from mnemoflow.streams.preflight import InternalTopic, PreflightError, worker_preflight
from mnemoflow.streams.projector import MemoryProjector

log = logging.getLogger(__name__)
PRODUCER_BATCH_BYTES = 512 * 1024


def _now_ms() -> int:
    return int(time.time() * 1000)


def faust_app(settings: Settings, bootstrap: str) -> faust.App:
    kw: dict[str, Any] = {}
    datadir = settings.home / "faust" / settings.app_id
    datadir.parent.mkdir(parents=True, exist_ok=True)
    if settings.sasl_mechanism:
        kw["broker_credentials"] = faust.SASLCredentials(
            username=settings.sasl_username, password=settings.sasl_password,
            mechanism=settings.sasl_mechanism,
            ssl_context=settings.client_kwargs().get("ssl_context"))
    elif settings.security_protocol == "SSL":
        kw["broker_credentials"] = settings.client_kwargs()["ssl_context"]
    return WorkerApp(
        settings.app_id, broker=f"kafka://{bootstrap}", store=settings.store,
        datadir=str(datadir),
        topic_replication_factor=1, topic_partitions=settings.partitions,
        web_enabled=False, consumer_auto_offset_reset="earliest", producer_acks=-1,
        table_standby_replicas=0,
        # commits come from faust's timer, beside the stream: a count-based commit runs inside
        # the delivery loop and waits for the consumer thread's poll (docs/decisions.md)
        broker_commit_every=10_000, broker_commit_interval=1.0,
        stream_buffer_maxsize=1024,
        # a table changelog record (the working-memory ring, 10-30 kB) overflows aiokafka's
        # default 16 kB batch, and a full batch makes the next send wait for the previous
        # produce request's ack
        producer_max_batch_size=PRODUCER_BATCH_BYTES,
        # a crashed worker's partitions move on within seconds instead of a minute
        broker_session_timeout=settings.session_timeout_s,
        broker_heartbeat_interval=max(1.0, settings.session_timeout_s / 4),
        # a revoke or a stop does not wait for in-flight records to be acked: with a broker
        # away that wait never ends. Unacked records are not committed, and their next owner
        # processes them again (every stage is idempotent).
        stream_wait_empty=False, **kw)


def memory_dir(settings: Settings) -> Path:
    """Where the worker keeps each memory-log partition's vector index and checkpoint."""
    return settings.home / "memory" / settings.app_id


def checkpoint_build(memory: PartitionedMemory, tuning: Tuning) -> str:
    """What a checkpoint must have been made with to be used: the same index build and
    index tuning (the lexical index's shape)."""
    return f"{memory.version}|{tuning.index!r}"


async def open_or_replace(path: Path, meta: IndexMeta, held_vectors: bool = True) -> VectorIndex:
    """A partition's vector index. One built with another model or in an older layout is
    replaced, never mixed, and filled again from the memory-log (and memory-vectors)."""
    try:
        return await open_index(path, meta, held_vectors=held_vectors)
    except IndexMismatch as exc:
        log.warning("%s; building it again from the memory-log", exc)
        return await open_index(path, meta, rebuild=True, held_vectors=held_vectors)


def build_pipeline(settings: Settings, bootstrap: str, tuning: Tuning | None = None,
                   freezer: Freezer | None = None) -> FaustRunner:
    """The worker's runner: its faust app, memory, projector and ports, wired. `freezer`:
    only for a process that is the worker (projections.heap)."""
    tuning = tuning or load_tuning(settings.weights_file, settings.embedding_model)
    registry = default_registry()
    embedder = meta = index_for = None
    folder = memory_dir(settings)
    if settings.vector:
        embedder = AsyncEmbedder(CachedEmbedder(build_embedder(settings.embedding_model,
                                                               settings.embedder)))
        meta = index_meta(embedder, tuning.index)

        def index_for(p: int, at: Path | None) -> Any:
            if p == SHARED:  # held by every worker and folded whole on each start: in memory
                return ArrayIndex(meta)
            return partial(open_or_replace, (at or folder / partition_dir(p)) / "vectors", meta,
                           settings.held_vectors)
    memory = build_partitioned(tuning, settings.partitions, index_for=index_for,
                               embedder=embedder, graph=settings.graph,
                               vector_timeout_s=settings.vector_timeout_s,
                               markdown_dir=settings.home / "markdown" / settings.app_id,
                               fault_tiers=settings.fault_tiers)
    topics = {spec.base: spec.name(settings)
              for spec in (T.MEMORY_LOG, T.MEMORY_SHARED, T.MEMORY_VECTORS)}
    metrics = WorkerMetrics(CollectorRegistry())  # this worker's own: no process-global registry
    keyring = Keyring(settings, bootstrap, registry) if settings.seal else None
    projector = MemoryProjector(bootstrap, topics, memory, registry, settings.client_kwargs(),
                                folder=folder, build=checkpoint_build(memory, tuning),
                                group=f"{settings.app_id}-projector", vector_meta=meta,
                                metrics=metrics, keyring=keyring, freezer=freezer)
    ports = Ports(tuning, settings.max_payload_bytes, _now_ms, tiers=memory.tiers,
                  index_version=lambda: memory.version, stores=memory.stores,
                  link_proposals=memory.link_proposals, rules=load_rules(),
                  seal_packet=keyring.seal_packet if keyring is not None else None)
    runner = FaustRunner(settings, faust_app(settings, bootstrap), registry, memory, projector,
                         ports, crashes=CrashLimit(settings.agent_max_retries), metrics=metrics,
                         keyring=keyring)
    runner.wire()
    return runner


def internal_topics(app: faust.App) -> list[InternalTopic]:
    """The changelog topics of the app's tables, as faust would create them."""
    return [InternalTopic(table.changelog_topic.get_topic_name(), table.partitions or 1,
                          {"cleanup.policy": "compact"})
            for table in app.tables.values()]


def _local_stores(app: faust.App) -> tuple[Path, dict[tuple[str, int], Path]]:
    """The RocksDB store path of each changelog partition; empty for an in-memory store."""
    stores: dict[tuple[str, int], Path] = {}
    for table in app.tables.values():
        store = table.data
        if hasattr(store, "partition_path"):
            topic = table.changelog_topic.get_topic_name()
            for p in range(table.partitions or 1):
                stores[(topic, p)] = store.partition_path(p)
    return Path(app.conf.tabledir), stores


async def _watch_readiness(pipe: FaustRunner, health: Health) -> None:
    """Health is `ready` once the worker holds partitions, nothing is rebalancing and the
    tables are restored; the first time, one line says so at any log level."""
    app, announced = pipe.app, False
    while True:
        assigned = len(app.assignor.assigned_actives()) if app.assignor else 0
        recovered = app.tables.recovery.completed.is_set()
        if app.rebalancing or not recovered:
            health.set("starting" if not announced else "rebalancing", partitions=assigned)
        else:
            health.set("ready", partitions=assigned, counters=dict(pipe.counters),
                       failures=dict(pipe.crashes.failures))
            if not announced:
                announced = True
                print(f"mnemoflow worker ready: app {pipe.settings.app_id}, {assigned} "
                      f"topic partitions, topics {pipe.settings.topic_prefix}*", flush=True)
        await asyncio.sleep(1.0)


class _Worker(faust.Worker):
    """faust's worker with a bound on every stop and the repeat filter on its log."""

    watchdog: Watchdog
    health: Health

    def _setup_logging(self) -> None:
        super()._setup_logging()
        limit_repeats()

    def _on_sigterm(self) -> None:
        self.stop_within("SIGTERM", 0)

    def _on_sigint(self) -> None:
        self.stop_within("SIGINT", 0)

    def stop_within(self, why: str, code: int) -> None:
        self.health.set("stopping", why)
        self.watchdog.arm(code, why)
        self._schedule_shutdown(signal.SIGTERM)


def run_worker(settings: Settings, bootstrap: str, loglevel: str = "warn") -> int:
    """Blocking: run the faust worker until a signal or a fatal crash stops it; the exit code.

    Before faust starts: the broker must answer, the catalogue's topics must exist, the
    tables' changelog topics are created and visible, and local table state that is ahead
    of its changelog (a reset broker) is dropped so that faust restores it instead of
    refusing to start."""
    pipe = build_pipeline(settings, bootstrap, freezer=Freezer())
    internal = internal_topics(pipe.app)
    try:
        view = asyncio.run(worker_preflight(settings, bootstrap, internal,
                                            settings.connect_timeout_s))
    except PreflightError as exc:
        print(f"error: {exc}", flush=True)
        return EXIT_PREFLIGHT
    logging.getLogger("aiokafka").setLevel(logging.NOTSET)  # the worker's log level rules now
    tabledir, stores = _local_stores(pipe.app)
    stale = stale_partitions(stores, view.end_offsets, _offset_key())
    marker = settings.home / "faust" / settings.app_id / "cluster-id"
    known = marker.read_text().strip() if marker.exists() else None
    if known and view.cluster_id and known != view.cluster_id:
        stale.insert(0, f"cluster {view.cluster_id}, not {known}")
    peers = [h["pid"] for h in read_health(settings.home, settings.app_id)
             if h["pid"] != os.getpid()]
    if stale and peers:
        log.warning("local table state looks stale (%s) but worker(s) %s of this app use the "
                    "same folder: leaving it", stale[0], peers)
    elif stale:
        drop_local_state(tabledir, "; ".join(stale[:4]) + (" ..." if len(stale) > 4 else ""))
        snapshot.drop_all(memory_dir(settings))
    if view.cluster_id:
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(view.cluster_id)

    health = Health(health_dir(settings.home) / f"{settings.app_id}.{os.getpid()}.json",
                    settings.app_id)

    def readiness() -> tuple[str, str]:
        """What /readyz answers: the status `mnemoflow health` would read, so a worker whose
        loop has not refreshed its health for STALE_AFTER_S is not ready either."""
        try:
            age = time.time() - health.path.stat().st_mtime
        except OSError:
            age = float("inf")
        if health.status == "ready" and age >= STALE_AFTER_S:
            return "stale", f"health not refreshed for {age:.0f}s"
        return health.status, health.detail

    server = MetricsServer(pipe.metrics.registry, readiness, settings.metrics_port)
    try:
        server.start()
    except OSError as exc:
        print(f"error: cannot serve metrics on 127.0.0.1:{settings.metrics_port}: "
              f"{exc.strerror or exc}; set MNEMOFLOW_METRICS_PORT to a free port, or 0", flush=True)
        return EXIT_PREFLIGHT
    health.extra["metrics_port"] = server.port  # how `mnemoflow health --json` readers find it
    worker = _Worker(pipe.app, loglevel=loglevel, quiet=True, redirect_stdouts=False)
    worker.watchdog = Watchdog(settings.shutdown_timeout_s)
    worker.health = health
    # no terminal spinner: to animate it faust sets the root logger to DEBUG, and then every
    # debug call of faust and aiokafka builds a LogRecord that the handler throws away
    # (py-spy: ~4 % of the worker's samples under load)
    worker.spinner = None

    def on_fatal(reason: str) -> None:
        print(f"error: {reason}; stopping the worker", flush=True)
        health.set("failed", reason)
        worker.stop_within("a fatal crash", EXIT_FATAL)

    pipe.on_fatal = on_fatal

    @pipe.app.task
    async def readiness() -> None:
        await _watch_readiness(pipe, health)

    health.set("starting")
    failed = False
    try:
        worker.execute_from_commandline()
    except SystemExit as exc:  # mode turns a crash of the app into a non-zero SystemExit
        failed = exc.code not in (0, None) or worker.crash_reason is not None
        if failed and pipe.crashes.fatal is None:
            print(f"error: worker crashed: {worker.crash_reason!r}", flush=True)
    finally:
        worker.watchdog.disarm()
        server.stop()
        if not failed and pipe.crashes.fatal is None:
            health.remove()
    return EXIT_FATAL if failed or pipe.crashes.fatal else 0


def _offset_key() -> bytes:
    from faust.stores.rocksdb import Store

    return Store.offset_key
