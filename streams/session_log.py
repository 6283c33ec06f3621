"""What the input topics hold of each session: its latest event (eventSeq, turn, step, ids).

A host that (re)starts serving a session continues its numbering above this, so no eventSeq
is written twice: a reused one gives the same segment and memory ids as the old event, and the
pipeline would take the new event for a redelivery of the old one. It holds while the topics
keep one of the session's events (their retention, 7 days by default).

A partition is read once, from its log start, the first time a session on it is asked about;
later questions read only what was written since. Every session of a read partition is kept
(one small entry each), so the cost is one pass over the retained log per partition.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, TopicPartition

from mnemoflow.agents.partitioning import partition_of
from mnemoflow.schemas.codec import DecodeError, SchemaRegistry
from mnemoflow.streams import topics as T
from mnemoflow.streams.config import Settings
from mnemoflow.streams.producer import BrokerUnavailable, bounded, within
from mnemoflow.streams.reader import topic_partitions

INPUTS = ((T.SESSION_EVENTS, "io.mnemoflow.SessionEvent"),
          (T.TOOL_RESULTS, "io.mnemoflow.ToolResult"),
          (T.AGENT_STEPS, "io.mnemoflow.AgentStep"))


@dataclass(frozen=True)
class Seen:
    """A session's latest event in the input topics."""

    seq: int
    turn: int
    step: int
    user_id: str
    agent_id: str
    workspace_id: str | None


class SessionLog:
    """Made and started inside the event loop (aiokafka needs it); every wait on the broker
    ends in BrokerUnavailable after `timeout_s` without progress."""

    def __init__(self, settings: Settings, bootstrap: str, registry: SchemaRegistry,
                 timeout_s: float) -> None:
        self.bootstrap = bootstrap
        self.registry = registry
        self.timeout_s = timeout_s
        self._schemas = {spec.name(settings): schema for spec, schema in INPUTS}
        self._consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                                          enable_auto_commit=False, auto_offset_reset="earliest",
                                          fetch_max_wait_ms=10, **settings.client_kwargs())
        self._parts: dict[str, int] = {}
        self._positions: dict[TopicPartition, int] = {}
        self._seen: dict[str, Seen] = {}
        self._lock = asyncio.Lock()  # one reader of the consumer at a time

    async def start(self) -> None:
        async with within(self.bootstrap, "session log start", self.timeout_s):
            await self._consumer.start()
            for topic in self._schemas:
                self._parts[topic] = len(await topic_partitions(self._consumer, topic))

    async def stop(self) -> None:
        await self._consumer.stop()

    async def last(self, session_id: str) -> Seen | None:
        """The session's latest event written up to now, or None if the topics hold none."""
        async with self._lock:
            for topic, schema in self._schemas.items():
                p = partition_of(session_id, self._parts[topic])  # where the producer put it
                await self._read(TopicPartition(topic, p), schema)
            return self._seen.get(session_id)

    async def _read(self, tp: TopicPartition, schema: str) -> None:
        c, bs, bound = self._consumer, self.bootstrap, self.timeout_s
        where = f"{tp.topic}:{tp.partition}"
        end = (await bounded(bs, f"end offset of {where}", bound, lambda: c.end_offsets([tp])))[tp]
        if tp not in self._positions:
            self._positions[tp] = (await bounded(bs, f"log start of {where}", bound,
                                                 lambda: c.beginning_offsets([tp])))[tp]
        if self._positions[tp] >= end:
            return
        c.assign([tp])
        c.seek(tp, self._positions[tp])
        progress = time.monotonic()
        while self._positions[tp] < end:  # bounded by progress: a long log takes its time
            batch = (await c.getmany(tp, timeout_ms=500, max_records=10_000)).get(tp, [])
            if not batch and time.monotonic() - progress > bound:
                raise BrokerUnavailable.after(bs, f"reading {where} from offset "
                                              f"{self._positions[tp]} (end {end})", progress)
            for m in batch:
                self._fold(m.value, schema)
            if batch:
                self._positions[tp] = batch[-1].offset + 1
                progress = time.monotonic()

    def _fold(self, raw: bytes | None, schema: str) -> None:
        try:
            _, rec = self.registry.decode(raw, schema)
        except DecodeError:
            return  # the pipeline dead-letters it: it numbers nothing
        sid, prev = rec["sessionId"], self._seen.get(rec["sessionId"])
        if prev is None or rec["eventSeq"] > prev.seq:
            self._seen[sid] = Seen(rec["eventSeq"], max(rec["turn"], prev.turn if prev else 0),
                                   rec["step"], rec["userId"], rec["agentId"],
                                   rec.get("workspaceId"))
