"""The faust worker: thin agents around the pure stages in mnemoflow.agents.

observer (3 input topics -> segments, memory-log)   state: observer-state table
gate     (segments -> recall-requests, audit)        state: gate-state table
evidence (segments -> memory-log)                    state: evidence-state table
recall   (recall-requests -> inbox, audit)           state: broker-state table
         recall -> rank -> safety -> broker, all pure but the tier I/O
projector (memory-log -> MemoryStore), a task over all partitions
consolidation (MemoryStore -> memory-log), a timer on the leader when the worker is idle

Every table is keyed by sessionId and co-partitioned with its source topic, so a session's
state lives with its events. Values are raw Avro bytes: bad bytes go to the dead-letter
topic with a reason and the stream goes on. concurrency=1 everywhere (see README).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import faust
from aiokafka.errors import MessageSizeTooLargeError
from faust.exceptions import ProducerSendError

from mnemoflow.agents.broker import BrokerOutput, BrokerState, build
from mnemoflow.agents.candidate import scope_chain
from mnemoflow.agents.consolidate import consolidate
from mnemoflow.agents.evidence import EvidenceState
from mnemoflow.agents.evidence import update as update_evidence
from mnemoflow.agents.gate import GateState, decide
from mnemoflow.agents.graph import GraphState
from mnemoflow.agents.inbox import op_record
from mnemoflow.agents.observer import ObserverState, observe
from mnemoflow.agents.rank import rank
from mnemoflow.agents.recall import FaultyTier, TierSpec, recall
from mnemoflow.agents.safety import check
from mnemoflow.agents.tuning import Tuning, load_tuning
from mnemoflow.projections.embedding import AsyncEmbedder, CachedEmbedder, MiniLMEmbedder
from mnemoflow.projections.graph_tier import GraphSink, GraphTier
from mnemoflow.projections.markdown import MarkdownSink
from mnemoflow.projections.memory_store import LexicalTier, MemoryStore
from mnemoflow.projections.vector_index import open_index
from mnemoflow.projections.vector_tier import VectorSink, VectorTier, index_meta
from mnemoflow.schemas.codec import DecodeError, SchemaRegistry, default_registry
from mnemoflow.streams import topics as T
from mnemoflow.streams.config import Settings
from mnemoflow.streams.deadletter import dead_letter
from mnemoflow.streams.faust_app import WorkerApp
from mnemoflow.streams.lifecycle import (
    EXIT_FATAL,
    EXIT_PREFLIGHT,
    CrashLimit,
    Health,
    Watchdog,
    drop_local_state,
    health_dir,
    limit_repeats,
    read_health,
    stale_partitions,
)
from mnemoflow.streams.preflight import InternalTopic, PreflightError, worker_preflight
from mnemoflow.streams.projector import MemoryLogProjector

log = logging.getLogger(__name__)
PRODUCER_BATCH_BYTES = 512 * 1024
RETRY_FIRST_S = 0.5  # back-off before a record that failed for no fault of its own is retried
RETRY_MAX_S = 8.0
RAW = {"value_type": bytes, "value_serializer": "raw", "key_type": bytes, "key_serializer": "raw"}


def _now_ms() -> int:
    return int(time.time() * 1000)


class OutputTooLarge(Exception):
    """An output of this record is over the broker's message size: the record's fault."""


class StageError(Exception):
    """A pure stage raised on this record (its cause): the record's fault, not the worker's."""


class stage_errors:  # noqa: N801 - used as a `with` block
    """Marks a block of pure-stage code: any exception in it becomes a StageError."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, et: type[BaseException] | None, exc: BaseException | None,
                 tb: object) -> bool:
        if exc is not None and isinstance(exc, Exception) and not isinstance(exc, StageError):
            raise StageError(str(exc)) from exc
        return False


@dataclass
class Pipeline:
    """One worker's app, its projection and its tiers; no module-level state anywhere."""

    settings: Settings
    bootstrap: str
    tuning: Tuning
    registry: SchemaRegistry
    store: MemoryStore
    app: faust.App
    projector: MemoryLogProjector
    embedder: AsyncEmbedder | None = None
    graph_sink: GraphSink | None = None
    tiers: list[TierSpec] = field(default_factory=list)
    counters: dict[str, int] = field(default_factory=dict)
    last_input: float = 0.0  # monotonic time of the last input event: idle detection only
    crashes: CrashLimit = field(default_factory=lambda: CrashLimit(5))
    # set by the runner: called once when an agent is past its limit
    on_fatal: Callable[[str], None] | None = None

    def bump(self, name: str) -> None:
        self.counters[name] = self.counters.get(name, 0) + 1


def build_pipeline(settings: Settings, bootstrap: str, tuning: Tuning | None = None,
                   extra_tiers: list[TierSpec] | None = None) -> Pipeline:
    tuning = tuning or load_tuning(settings.weights_file)
    registry = default_registry()
    store = MemoryStore(index=tuning.index)
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
    app = WorkerApp(
        settings.app_id, broker=f"kafka://{bootstrap}", store=settings.store,
        datadir=str(datadir),
        topic_replication_factor=1, topic_partitions=settings.partitions,
        web_enabled=False, consumer_auto_offset_reset="earliest", producer_acks=-1,
        table_standby_replicas=0,
        # commits come from faust's timer, beside the stream; a count-based commit runs inside
        # the delivery loop and waits for the consumer thread's poll (seen: 1.5 s stalls in
        # bench_topology every 20th question with 100 here), so it is left at faust's default
        broker_commit_every=10_000, broker_commit_interval=1.0,
        stream_buffer_maxsize=1024,
        # a table changelog record (the working-memory ring, 10-30 kB) overflows aiokafka's
        # default 16 kB batch, and a full batch makes the next send wait for the previous
        # produce request's ack: every event then paid a broker round trip per table write
        producer_max_batch_size=PRODUCER_BATCH_BYTES,
        # a crashed worker's partitions move on within seconds instead of a minute
        broker_session_timeout=settings.session_timeout_s,
        broker_heartbeat_interval=max(1.0, settings.session_timeout_s / 4),
        # a revoke or a stop does not wait for in-flight records to be acked: with a broker
        # away, or a peer killed mid-rebalance, that wait never ended. Unacked records are
        # not committed, and their next owner processes them again (every stage is
        # idempotent), so nothing is lost by not waiting.
        stream_wait_empty=False, **kw)
    tiers = [TierSpec(LexicalTier(store), timeout_s=2.0)]
    sinks: list[Any] = [MarkdownSink(settings.home / "markdown" / settings.app_id, store)]
    embedder = None
    if settings.vector:
        embedder = AsyncEmbedder(CachedEmbedder(MiniLMEmbedder()))
        index = open_index(settings.home / "lancedb" / settings.app_id,
                           index_meta(embedder, tuning.index))
        sinks.append(VectorSink(index, embedder, store=store,
                                context_weight=tuning.index.vector_context_weight,
                                embed_max_chars=tuning.index.embed_max_chars))
        store.name = f"lexical+vector:{embedder.version}"  # the retrievalVersion says which
        tiers.append(TierSpec(VectorTier(store, index, embedder,
                                         embed_timeout_s=max(0.1, settings.vector_timeout_s - 1)),
                              timeout_s=settings.vector_timeout_s))
    graph_sink = None
    if settings.graph:  # C-04 tier 3: only when the tiers before it found few hits
        graph_sink = GraphSink(GraphState(), store=store)
        sinks.append(graph_sink)
        store.name += "+graph"
        tiers.append(TierSpec(GraphTier(store, graph_sink.graph), timeout_s=1.0,
                              only_when_fewer_than=tuning.rank.graph_when_fewer_than))
    tiers += extra_tiers or []
    projector = MemoryLogProjector(bootstrap, T.MEMORY_LOG.name(settings), store, registry,
                                   settings.client_kwargs(), group=f"{settings.app_id}-projector",
                                   sinks=sinks)
    pipe = Pipeline(settings, bootstrap, tuning, registry, store, app, projector, embedder,
                    graph_sink, crashes=CrashLimit(settings.agent_max_retries))
    pipe.tiers = [replace(t, tier=FaultyTier(t.tier)) if t.tier.name in settings.fault_tiers
                  else t for t in tiers]
    _wire(pipe)
    return pipe


def _wire(pipe: Pipeline) -> None:
    s, app, reg, tun = pipe.settings, pipe.app, pipe.registry, pipe.tuning
    t = {spec.base: app.topic(spec.name(s), partitions=s.partitions, **RAW) for spec in T.CATALOGUE}
    inputs = app.topic(*(spec.name(s) for spec in T.INPUT_TOPICS), **RAW)
    base_of = {spec.name(s): spec for spec in T.CATALOGUE}
    p = s.partitions
    observer_state = app.Table("observer-state", default=None, partitions=p)
    gate_state = app.Table("gate-state", default=None, partitions=p)
    broker_state = app.Table("broker-state", default=None, partitions=p)
    evidence_state = app.Table("evidence-state", default=None, partitions=p)

    async def to_dlq(ev: faust.types.EventT, reason: str, detail: str, stage: str) -> None:
        m = ev.message
        pipe.bump(f"dead-letter:{reason}")
        rec = dead_letter(reason, detail, m.topic, m.partition, m.offset, m.key, m.value, stage)
        # the kept key: a key near the broker's size limit would not fit beside the record
        await t["dead-letter"].send(key=rec["key"], value=reg.encode("io.mnemoflow.DeadLetter", rec))

    def decode(ev: faust.types.EventT) -> dict[str, Any]:
        spec = base_of[ev.message.topic]
        return reg.decode(ev.message.value, spec.value_schema)[1]

    async def records(stream: faust.StreamT, stage: str) -> Any:
        """(stream, event, decoded value) of each record, on a stream whose records are acked
        by hand: faust acks the record in hand when an agent raises, and a record acked
        without being processed is committed past. Bad bytes go to the dead letters."""
        manual = stream.noack()
        async for ev in manual.events():
            try:
                value = decode(ev)
            except DecodeError as exc:
                await to_dlq(ev, exc.reason, exc.detail, stage)
                await manual.ack(ev)
                continue
            yield manual, ev, value

    async def send(topic: str, schema: str, key: str, value: dict[str, Any]) -> None:
        await send_encoded(topic, key, reg.encode(schema, value))

    async def send_encoded(topic: str, key: str, value: bytes,
                           headers: list[tuple[str, bytes]] | None = None) -> None:
        try:
            await t[topic].send(key=key.encode(), value=value, headers=headers)
        except (MessageSizeTooLargeError, ProducerSendError) as exc:
            cause = exc if isinstance(exc, MessageSizeTooLargeError) else exc.__cause__
            if not isinstance(cause, MessageSizeTooLargeError):
                raise
            raise OutputTooLarge(f"a {topic} record for this input is over the broker's "
                                 f"message size limit") from exc

    async def agent_crashed(agent: Any, exc: BaseException) -> None:
        """An error outside `guarded` (faust's own); faust restarts the agent, and past the
        limit the worker stops instead. The record in hand stays unacked."""
        name = agent.name.rsplit(".", 1)[-1]
        log.error("agent %s crashed: %r", name, exc)
        if pipe.crashes.failed(name, exc) and pipe.on_fatal is not None:
            pipe.on_fatal(pipe.crashes.fatal)

    app.agent_crashed = agent_crashed

    async def guarded(stream: faust.StreamT, ev: faust.types.EventT, stage: str,
                      body: Callable[[], Awaitable[None]]) -> None:
        """Run one record through a stage, then ack it. An error of the record's own making
        (the pure stage raised, or an output is too large to write) dead-letters the record
        and the stream goes on. Anything else (the broker, a table) is retried on the same
        record with a back-off; past MNEMOFLOW_AGENT_MAX_RETRIES failures in a row the worker
        stops, leaving the record unacked, so that the next worker gets it again."""
        failures = 0
        while True:
            try:
                if stage in s.fault_agents:  # a drill: an infrastructure fault
                    raise RuntimeError(f"injected fault in agent {stage} (MNEMOFLOW_FAULT_AGENTS)")
                await body()
            except OutputTooLarge as exc:
                await to_dlq(ev, "oversized", str(exc), stage)
            except StageError as exc:
                log.warning("%s failed on %s[%s]@%s: %s", stage, ev.message.topic,
                            ev.message.partition, ev.message.offset, exc.__cause__)
                await to_dlq(ev, "processing-error", repr(exc.__cause__), stage)
            except Exception as exc:
                failures += 1
                log.error("%s failed on %s[%s]@%s (try %d), trying again: %r", stage,
                          ev.message.topic, ev.message.partition, ev.message.offset,
                          failures, exc)
                if pipe.crashes.failed(stage, exc):
                    if pipe.on_fatal is not None:
                        pipe.on_fatal(pipe.crashes.fatal)
                    await asyncio.Event().wait()  # unacked until the stop cancels this
                await asyncio.sleep(min(RETRY_FIRST_S * 2 ** (failures - 1), RETRY_MAX_S))
                continue
            pipe.crashes.succeeded(stage)
            await stream.ack(ev)
            return

    async def observe_one(ev: faust.types.EventT, rec: dict[str, Any]) -> None:
        sid = rec["sessionId"]
        source = base_of[ev.message.topic].base
        ingest = int((ev.message.timestamp or 0) * 1000)
        stored = observer_state.get(sid)  # a table error is not the record's fault
        with stage_errors():
            state = ObserverState.from_json(stored, tun.gate.window_cap, tun.gate.window_ms)
            state, obs = observe(state, source, rec, s.max_payload_bytes, ingest)
        if obs.dead_letter:
            await to_dlq(ev, *obs.dead_letter, "observer")
            return
        for mem in obs.memory_events:
            await send("memory-log", "io.mnemoflow.MemoryEvent", mem["owner"], mem)
        if obs.segment is not None:
            pipe.bump("segments")
            await send("segments", "io.mnemoflow.Segment", sid, obs.segment)
        observer_state[sid] = state.to_json()

    @app.agent(inputs, concurrency=1)
    async def observer(stream: faust.StreamT) -> None:
        async for manual, ev, rec in records(stream, "observer"):
            pipe.last_input = time.monotonic()
            await guarded(manual, ev, "observer", partial(observe_one, ev, rec))

    async def gate_one(seg: dict[str, Any]) -> None:
        sid = seg["envelope"]["sessionId"]
        stored = gate_state.get(sid)
        with stage_errors():
            state = GateState.from_json(stored, tun.gate)
            state, out = decide(state, seg, tun.gate)
        if out.decision is None:
            return
        audit = {**out.audit, "emitTime": _now_ms()}
        await send("audit", "io.mnemoflow.AuditRecord", sid, audit)
        if out.request is not None:
            await send("recall-requests", "io.mnemoflow.RecallRequest", sid, out.request)
        gate_state[sid] = state.to_json()

    @app.agent(t["segments"], concurrency=1)
    async def gate(stream: faust.StreamT) -> None:
        async for manual, ev, seg in records(stream, "gate"):
            await guarded(manual, ev, "gate", partial(gate_one, seg))

    async def evidence_one(seg: dict[str, Any]) -> None:
        sid = seg["envelope"]["sessionId"]
        old = evidence_state.get(sid)
        with stage_errors():
            state, events = update_evidence(EvidenceState.from_json(old), seg)
            new = state.to_json()
        for mem in events:
            await send("memory-log", "io.mnemoflow.MemoryEvent", mem["owner"], mem)
        if new != old:  # most segments (plain text) leave the state as it was
            evidence_state[sid] = new

    @app.agent(t["segments"], concurrency=1)
    async def evidence(stream: faust.StreamT) -> None:
        """G-01: tool outcomes after a delivery reinforce or weaken the delivered memories."""
        async for manual, ev, seg in records(stream, "evidence"):
            await guarded(manual, ev, "evidence", partial(evidence_one, seg))

    @app.timer(interval=s.consolidate_interval_s, on_leader=True)
    async def consolidate_when_idle() -> None:
        """Idle-time consolidation (M-02 -> M-03/M-04): repeated episodes become candidates,
        and entities that keep co-occurring become graph links (C-04 tier 3).

        The wall clock only schedules it; what it writes depends on the memory-log alone
        (event time, ids derived from the inputs), so a rerun or a second worker adds nothing.
        """
        if time.monotonic() - pipe.last_input < s.consolidate_idle_s:
            return  # not idle: the stream comes first
        if not await pipe.projector.barrier(timeout=2.0):
            return
        links = pipe.graph_sink.take_proposals() if pipe.graph_sink else []
        for mem in [*consolidate(pipe.store, pipe.store.latest_event_time), *links]:
            pipe.bump("consolidation-events")
            await send("memory-log", "io.mnemoflow.MemoryEvent", mem["owner"], mem)

    async def recall_one(req: dict[str, Any]) -> None:
        sid = req["sessionId"]
        state = BrokerState.from_json(broker_state.get(sid))
        again = state.replayed(req["requestId"])
        if again is not None:  # redelivered: re-emit exactly what the first pass emitted
            out = BrokerOutput(again[0], again[1], replayed=True)
        else:
            version = pipe.store.version
            caught_up = await pipe.projector.barrier(
                s.barrier_timeout_s, projected=s.recall_barrier == "projected",
                owners=scope_chain(req))
            with stage_errors():  # one bad request must not stop the session's stream
                result = await recall(req, pipe.tiers, tun.rank.recall_k)
                if not caught_up:
                    result.tiers["projection"] = "lagging"
                ranked = rank(result.candidates, req, state.recent_digests(req["eventTime"]),
                              version, tun.rank)
                verdict = check(ranked.kept, req)
                state, out = build(state, req, result, ranked, verdict, version,
                                   pipe.store.version, tun.rank)
        if out.inbox_op is not None:
            pipe.bump("packets")
            await send_encoded("inbox", sid, *op_record(out.inbox_op, reg))
        await send("audit", "io.mnemoflow.AuditRecord", sid,
                   {**out.audit, "emitTime": out.audit.get("emitTime") or _now_ms()})
        broker_state[sid] = state.to_json()

    @app.agent(t["recall-requests"], concurrency=1)
    async def recall_agent(stream: faust.StreamT) -> None:
        async for manual, ev, req in records(stream, "recall"):
            await guarded(manual, ev, "recall", partial(recall_one, req))

    @app.task
    async def project_memory_log() -> None:
        if pipe.embedder is not None:
            await pipe.embedder.warm_up()
        await pipe.projector.run()


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


async def _watch_readiness(pipe: Pipeline, health: Health) -> None:
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
    pipe = build_pipeline(settings, bootstrap)
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
    if view.cluster_id:
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(view.cluster_id)

    health = Health(health_dir(settings.home) / f"{settings.app_id}.{os.getpid()}.json",
                    settings.app_id)
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
        if not failed and pipe.crashes.fatal is None:
            health.remove()
    return EXIT_FATAL if failed or pipe.crashes.fatal else 0


def _offset_key() -> bytes:
    from faust.stores.rocksdb import Store

    return Store.offset_key
