"""Runs the topology (`agents.topology`) as faust agents: one thin agent per stage.

Each stage's state lives in a faust Table keyed like its input and co-partitioned with it, so
a session's state moves with its events. Values are raw Avro bytes: bad bytes go to the
dead-letter topic with a reason and the stream goes on. Agents run with concurrency=1, and
records are acked by hand once processed or dead-lettered (faust acks the record in hand when
an agent raises, and a record acked unprocessed would be committed past and lost).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import faust
from aiokafka.errors import MessageSizeTooLargeError
from faust.exceptions import ProducerSendError
from prometheus_client import CollectorRegistry

from mnemoflow.agents.inbox import op_record
from mnemoflow.agents.respond import Projection
from mnemoflow.agents.topology import (
    INPUT_TOPICS,
    TOPOLOGY,
    Emit,
    Periodic,
    Ports,
    Record,
    Stage,
    Topology,
)
from mnemoflow.agents.topology import run_step as run_stage_step
from mnemoflow.projections.partitioned import PartitionedMemory
from mnemoflow.schemas.codec import DecodeError, SchemaRegistry
from mnemoflow.streams import topics as T
from mnemoflow.streams.batching import taken_together
from mnemoflow.streams.config import Settings
from mnemoflow.streams.deadletter import dead_letter
from mnemoflow.streams.keyring import Keyring
from mnemoflow.streams.lifecycle import CrashLimit
from mnemoflow.streams.metrics import Lag, WorkerMetrics
from mnemoflow.streams.projector import MemoryProjector

log = logging.getLogger(__name__)
RETRY_FIRST_S = 0.5  # back-off before a record that failed for no fault of its own is retried
RETRY_MAX_S = 8.0
LAG_EVERY_S = 1.0  # how often the consumer lag gauges are refreshed
RAW = {"value_type": bytes, "value_serializer": "raw", "key_type": bytes, "key_serializer": "raw"}


class OutputTooLarge(Exception):
    """An output of this record is over the broker's message size: the record's fault."""


class StageError(Exception):
    """A step raised on this record (its cause): the record's fault, not the worker's."""


@dataclass
class FaustRunner:
    """The topology on a faust app; the app, memory and projector come from the worker."""

    settings: Settings
    app: faust.App
    registry: SchemaRegistry
    memory: PartitionedMemory
    projector: MemoryProjector
    ports: Ports
    topology: Topology = TOPOLOGY
    counters: dict[str, int] = field(default_factory=dict)
    last_input: float = 0.0  # monotonic time of the last input event: idle detection only
    crashes: CrashLimit = field(default_factory=lambda: CrashLimit(5))
    # set by the worker: called once when an agent is past its limit
    on_fatal: Callable[[str], None] | None = None
    topics: dict[str, faust.TopicT] = field(default_factory=dict)
    # what the runner writes is counted here; the worker passes the one its server exposes
    metrics: WorkerMetrics = field(default_factory=lambda: WorkerMetrics(CollectorRegistry()))
    # seals what goes to the memory-log (None: memory text is written in the clear)
    keyring: Keyring | None = None

    def bump(self, name: str) -> None:
        self.counters[name] = self.counters.get(name, 0) + 1

    def wire(self) -> None:
        s, app = self.settings, self.app
        self.topics = {spec.base: app.topic(spec.name(s), partitions=s.partitions, **RAW)
                       for spec in T.CATALOGUE}
        app.agent_crashed = self._agent_crashed
        for stage in self.topology.stages:
            self._agent(stage)
        for periodic in self.topology.periodic:
            self._timer(periodic)

        requests = self.topics["recall-requests"].get_topic_name()

        @app.on_partitions_assigned.connect
        async def follow_assignment(app: faust.App, assigned: set[Any], **kw: Any) -> None:
            """The memory-log partitions held are the recall-requests partitions assigned."""
            self.projector.assign({tp.partition for tp in assigned if tp.topic == requests})

        @app.task
        async def project_memory_log() -> None:
            await self.memory.start()
            if self.memory.embedder is not None:
                await self.memory.embedder.warm_up()
            await self.projector.run()

        keyring = self.keyring
        if keyring is not None:
            @app.task
            async def follow_owner_keys() -> None:
                """A shredded key is noticed within a second, and forgotten here too."""
                try:
                    await keyring.start()
                    await keyring.tail()
                finally:
                    await keyring.stop()

        @app.timer(interval=LAG_EVERY_S)
        async def metrics_consumer_lag() -> None:
            self.metrics.set_consumer_lag(self.consumer_lag())

    def consumer_lag(self) -> Lag:
        """Per assigned partition of a topic a stage consumes: its highwater minus the next
        offset the consumer hands to a stage (the changelogs are left out). A partition whose
        highwater is not known yet (no fetch answered) is left out too."""
        consumer = self.app.consumer
        consumed = {self.settings.topic(b) for stage in self.topology.stages for b in stage.inputs}
        # the patched delivery loop (streams/faust_app.py) keeps it as the next offset to deliver;
        # faust stores offset 0 as None
        delivered = dict(consumer._read_offset)
        lag = {}
        for tp in consumer.assignment():
            if tp.topic not in consumed:
                continue
            try:
                high = consumer.highwater(tp)
            except Exception:  # revoked since assignment() answered: it is no longer ours
                continue
            if high is not None:
                base = tp.topic.removeprefix(self.settings.topic_prefix)
                lag[(base, tp.partition)] = max(0, high - (delivered.get(tp) or 0))
        return lag

    # ------------------------------------------------------------------------ generation

    def _agent(self, stage: Stage) -> None:
        s, app = self.settings, self.app
        table = app.Table(stage.table, default=None, partitions=s.partitions)
        source = (self.topics[stage.inputs[0]] if len(stage.inputs) == 1
                  else app.topic(*(s.topic(b) for b in stage.inputs), **RAW))
        base_of = {s.topic(b): b for b in stage.inputs}
        is_input = set(stage.inputs) <= set(INPUT_TOPICS)

        async def body(ev: faust.types.EventT, value: dict[str, Any],
                       ends: dict[Any, int]) -> None:
            m = ev.message
            skey = stage.key(value)
            stored = table.get(skey)  # a table error is not the record's fault
            projection = None
            if stage.barrier:
                version = self.memory.version
                caught_up, lag = await self.projector.barrier(
                    s.barrier_timeout_s, projected=s.recall_barrier == "projected",
                    request=value, ends=ends)
                projection = Projection(version, caught_up, lag or "lagging")
            record = Record(base_of[m.topic], value, int((m.timestamp or 0) * 1000), projection)
            try:
                state = stage.load(self.ports, stored)
                new, outs = await run_stage_step(stage, self.ports, state, record)
                dumped = stage.dump(new)
            except Exception as exc:
                raise StageError(str(exc)) from exc
            for out in outs:
                if isinstance(out, Emit):
                    await self._send(out)
                else:
                    await self._to_dlq(ev, out.reason, out.detail, stage.name)
                    return
            if dumped != stored:
                table[skey] = dumped

        most = s.recall_batch if stage.barrier else 1

        async def agent(stream: faust.StreamT) -> None:
            manual = stream.noack()
            async with aclosing(taken_together(manual.events(), most)) as lists:
                async for taken in lists:
                    await step_list(manual, taken)

        async def step_list(manual: faust.StreamT, taken: list[Any]) -> None:
            batch = [(ev, value) for ev in taken
                     if (value := await self._decoded(manual, ev, stage.name, base_of)) is not None]
            if not batch:
                return
            if is_input:
                self.last_input = time.monotonic()
            if stage.barrier:
                self.metrics.recall_lists.observe(len(batch))
            ends = await self._prepare(batch) if len(batch) > 1 else {}
            for ev, value in batch:
                if (not self.app.flow_control.is_active()
                        or ev.message.generation_id != self.app.consumer_generation_id):
                    # a rebalance came after it was taken: its partition may be another
                    # worker's now. Left unacked, it is fetched again from the committed
                    # offset (by us, if the partition stayed), as faust leaves a record it skips
                    continue
                # faust's tables write to the changelog partition of the task's current
                # event, which faust sets in the task that takes the records (the reader's)
                manual._set_current_event(ev)
                await self._guarded(manual, ev, stage.name, partial(body, ev, value, ends))

        agent.__name__ = agent.__qualname__ = stage.name
        agent.__doc__ = stage.doc
        app.agent(source, name=stage.name, concurrency=1)(agent)

    def _timer(self, periodic: Periodic) -> None:
        s = self.settings

        async def tick() -> None:
            """The wall clock only schedules it; what it writes depends on the memory-log."""
            if time.monotonic() - self.last_input < s.consolidate_idle_s:
                return  # not idle: the stream comes first
            if not (await self.projector.barrier(timeout=2.0))[0]:
                return
            for out in periodic.run(self.ports):
                if isinstance(out, Emit):
                    self.bump(f"{periodic.name}-events")
                    await self._send(out)

        tick.__name__ = tick.__qualname__ = periodic.name
        # on every worker: each consolidates the partitions it holds
        self.app.timer(interval=s.consolidate_interval_s)(tick)

    # ------------------------------------------------------------------------------ I/O

    async def _decoded(self, manual: faust.StreamT, ev: Any, stage: str,
                       base_of: dict[str, str]) -> dict[str, Any] | None:
        """The record's value, or None: its bytes are not the schema's, and it went to the
        dead letters (and was acked)."""
        try:
            _, value = self.registry.decode(ev.message.value,
                                            T.VALUE_SCHEMA[base_of[ev.message.topic]])
        except DecodeError as exc:
            await self._to_dlq(ev, exc.reason, exc.detail, stage)
            await manual.ack(ev)
            return None
        return value

    async def _prepare(self, batch: list[tuple[Any, dict[str, Any]]]) -> dict[Any, int]:
        """For recall requests taken together: their log ends in one lookup, and their
        queries embedded in one forward pass, side by side. Returns the ends."""
        requests = [value for _, value in batch]
        # bounded like the vector tier's own query embedding, which it saves
        embed_timeout = max(0.1, self.settings.vector_timeout_s - 1)
        ends, _ = await asyncio.gather(
            self.projector.log_ends(requests, self.settings.barrier_timeout_s),
            self.memory.warm_queries(requests, embed_timeout), return_exceptions=True)
        # outside `_guarded`, so nothing here may fail the list: without the shared ends, each
        # barrier looks its own up (and is retried there)
        return ends if isinstance(ends, dict) else {}

    async def _to_dlq(self, ev: faust.types.EventT, reason: str, detail: str, stage: str) -> None:
        m = ev.message
        self.bump(f"dead-letter:{reason}")
        rec = dead_letter(reason, detail, m.topic, m.partition, m.offset, m.key, m.value, stage)
        # under the kept key: a key near the broker's size limit would not fit beside the record
        await self.topics["dead-letter"].send(
            key=rec["key"], value=self.registry.encode("io.mnemoflow.DeadLetter", rec))
        self.metrics.dead_lettered(reason, stage)

    async def _send(self, out: Emit) -> None:
        headers = None
        if out.topic == "inbox":
            self.bump("packets")
            op = out.value
            if self.keyring is not None and op.get("packet"):
                op = {**op, "packet": await self.keyring.seal_packet(op["packet"])}
            value, headers = op_record(op, self.registry)
        else:
            if out.topic == "segments":
                self.bump("segments")
            record = out.value
            if self.keyring is not None and out.topic in ("memory-log", "memory-shared"):
                record = await self.keyring.seal(record)
            value = self.registry.encode(T.VALUE_SCHEMA[out.topic], record)
        try:
            await self.topics[out.topic].send(key=out.key.encode(), value=value, headers=headers)
        except (MessageSizeTooLargeError, ProducerSendError) as exc:
            cause = exc if isinstance(exc, MessageSizeTooLargeError) else exc.__cause__
            if not isinstance(cause, MessageSizeTooLargeError):
                raise
            raise OutputTooLarge(f"a {out.topic} record for this input is over the broker's "
                                 f"message size limit") from exc
        # counted once the producer took it: a record refused above is not in the topic either
        self.metrics.emitted(out.topic, out.value)

    async def _agent_crashed(self, agent: Any, exc: BaseException) -> None:
        """An error outside `_guarded` (faust's own); faust restarts the agent, and past the
        limit the worker stops instead. The record in hand stays unacked."""
        name = agent.name.rsplit(".", 1)[-1]
        log.error("agent %s crashed: %r", name, exc)
        if self.crashes.failed(name, exc) and self.on_fatal is not None:
            self.on_fatal(self.crashes.fatal)

    async def _guarded(self, stream: faust.StreamT, ev: faust.types.EventT, stage: str,
                       body: Callable[[], Awaitable[None]]) -> None:
        """Run one record through a stage, then ack it. An error of the record's own making
        (the step raised, or an output is too large to write) dead-letters the record and the
        stream goes on. Anything else (the broker, a table) is retried on the same record with
        a back-off; past MNEMOFLOW_AGENT_MAX_RETRIES failures in a row the worker stops,
        leaving the record unacked, so that the next worker gets it again."""
        failures = 0
        while True:
            try:
                if stage in self.settings.fault_agents:  # a drill: an infrastructure fault
                    raise RuntimeError(f"injected fault in agent {stage} (MNEMOFLOW_FAULT_AGENTS)")
                await body()
            except OutputTooLarge as exc:
                await self._to_dlq(ev, "oversized", str(exc), stage)
            except StageError as exc:
                log.warning("%s failed on %s[%s]@%s: %s", stage, ev.message.topic,
                            ev.message.partition, ev.message.offset, exc.__cause__)
                await self._to_dlq(ev, "processing-error", repr(exc.__cause__), stage)
            except Exception as exc:
                failures += 1
                log.error("%s failed on %s[%s]@%s (try %d), trying again: %r", stage,
                          ev.message.topic, ev.message.partition, ev.message.offset,
                          failures, exc)
                if self.crashes.failed(stage, exc):
                    if self.on_fatal is not None:
                        self.on_fatal(self.crashes.fatal)
                    await asyncio.Event().wait()  # unacked until the stop cancels this
                await asyncio.sleep(min(RETRY_FIRST_S * 2 ** (failures - 1), RETRY_MAX_S))
                continue
            self.crashes.succeeded(stage)
            await stream.ack(ev)
            return
