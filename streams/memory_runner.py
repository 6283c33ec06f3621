"""Runs the topology (`agents.topology`) in process, without Kafka: deterministic, in order.

Each record sent is carried through every stage before `send` returns: its outputs are
appended to in-memory topic logs and handed to their consumers in the order they were
written (first in, first out). Memory events are folded into the memory as they are written,
into the partition Kafka's partitioner would give them (the runner holds every partition), so
a recall always sees everything written before it: the "projected" barrier holds by
construction. The offline evaluation, calibration and the contract suite run on it; it
imports no Kafka client.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from mnemoflow.agents.ids import stable_id
from mnemoflow.agents.inbox import claim_op, claim_pages, expire_op, fold, split_expired
from mnemoflow.agents.respond import Projection
from mnemoflow.agents.topology import TOPOLOGY, Emit, Ports, Record, Reject, Topology, run_step
from mnemoflow.projections.partitioned import PartitionedMemory
from mnemoflow.schemas.codec import DecodeError, SchemaRegistry
from mnemoflow.streams import topics as T
from mnemoflow.streams.deadletter import dead_letter

CLAIMER = "memory-runner"


def wall_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class InMemoryRunner:
    """The pipeline over in-memory logs and tables; `logs[topic]` holds (key, value) pairs."""

    memory: PartitionedMemory
    ports: Ports
    topology: Topology = TOPOLOGY
    registry: SchemaRegistry | None = None  # only for `send_bytes`
    ingest_clock: Callable[[], int] = wall_ms
    logs: dict[str, list[tuple[str, dict[str, Any]]]] = field(default_factory=dict)
    tables: dict[str, dict[str, Any]] = field(default_factory=dict)
    _queue: deque[tuple[str, str, dict[str, Any]]] = field(default_factory=deque)
    _holding: bool = False

    @classmethod
    def over(cls, memory: PartitionedMemory, ports: Ports, **kw: Any) -> InMemoryRunner:
        """A runner whose ports read this memory (index version, tiers, consolidation)."""
        ports = replace(ports, tiers=memory.tiers, index_version=lambda: memory.version,
                        stores=memory.stores, link_proposals=memory.link_proposals)
        return cls(memory, ports, **kw)

    def records(self, topic: str) -> list[dict[str, Any]]:
        return [v for _, v in self.logs.get(topic, [])]

    async def send(self, topic: str, value: dict[str, Any], key: str | None = None) -> None:
        """Append one input record and carry it, and all that follows from it, through."""
        await self._hold()
        self._append(topic, key if key is not None else value.get("sessionId", ""), value)
        await self._drain()

    async def send_bytes(self, topic: str, key: bytes, raw: bytes) -> None:
        """An encoded record, as a host would write it: bad bytes go to the dead letters."""
        assert self.registry is not None, "send_bytes needs a registry"
        try:
            _, value = self.registry.decode(raw, T.VALUE_SCHEMA[topic])
        except DecodeError as exc:
            stages = self.topology.consumers(topic)
            self._dead_letter(exc.reason, exc.detail, topic, key, raw,
                              stages[0].name if stages else "")
            return
        await self.send(topic, value, key.decode("utf-8", "replace"))

    async def idle(self) -> None:
        """What the worker does when idle: the periodic steps (consolidation)."""
        await self._hold()
        for periodic in self.topology.periodic:
            await self.memory.flush()
            for out in periodic.run(self.ports):
                if isinstance(out, Emit):
                    self._append(out.topic, out.key, out.value)
        await self._drain()

    def claim(self, session_id: str, now_ms: int) -> list[dict[str, Any]]:
        """The host's step boundary (N-03): expire what is past its expiry, claim the rest."""
        ops = [(i, v) for i, (k, v) in enumerate(self.logs.get("inbox", [])) if k == session_id]
        live, dead = split_expired(fold(ops), now_ms)
        if dead:
            self._append("inbox", session_id,
                         expire_op(session_id, [p["packetId"] for p in dead], now_ms))
        for page in claim_pages([p["packetId"] for p in live]):
            op_id = stable_id("op", "claim", CLAIMER, session_id, *page)
            self._append("inbox", session_id, claim_op(op_id, session_id, page, now_ms, CLAIMER))
        return list(live)

    # ---------------------------------------------------------------------------- inside

    def _append(self, topic: str, key: str, value: dict[str, Any]) -> None:
        self.logs.setdefault(topic, []).append((key, value))
        if topic in ("memory-log", "memory-shared"):
            self.memory.apply(value)
        if self.topology.consumers(topic):
            self._queue.append((topic, key, value))

    def _dead_letter(self, reason: str, detail: str, topic: str, key: bytes | None,
                     raw: bytes | None, stage: str) -> None:
        offset = len(self.logs.get(topic, []))
        rec = dead_letter(reason, detail, topic, 0, offset, key, raw, stage)
        self.logs.setdefault("dead-letter", []).append((str(rec["key"]), rec))

    async def _hold(self) -> None:
        if not self._holding:
            await self.memory.hold_all()
            self._holding = True

    async def _drain(self) -> None:
        await self._hold()
        while self._queue:
            topic, key, value = self._queue.popleft()
            ingest = self.ingest_clock()
            for stage in self.topology.consumers(topic):
                await self._run(stage, topic, key, value, ingest)

    async def _run(self, stage: Any, topic: str, key: str, value: dict[str, Any],
                   ingest: int) -> None:
        table = self.tables.setdefault(stage.table, {})
        skey = stage.key(value)
        stored = table.get(skey)
        projection = None
        if stage.barrier:
            await self.memory.flush()
            projection = Projection(self.memory.version, True)
        state = stage.load(self.ports, stored)
        new, outs = await run_step(stage, self.ports, state,
                                   Record(topic, value, ingest, projection))
        for out in outs:
            if isinstance(out, Reject):
                self._dead_letter(out.reason, out.detail, topic, key.encode(), None, stage.name)
            else:
                self._append(out.topic, out.key, out.value)
        dumped = stage.dump(new)
        if dumped != stored:
            table[skey] = dumped


@dataclass
class RunnerProducer:
    """The host producer's `send`, into the runner: what a host sends is processed at once."""

    runner: InMemoryRunner
    prefix: str = ""

    async def send(self, topic: str, schema: str, key: str, value: dict[str, Any]) -> None:
        await self.runner.send(topic.removeprefix(self.prefix), value, key)


@dataclass
class MemoryHostClient:
    """What `HostSession` needs of a client (`settings`, `producer`), over an InMemoryRunner;
    topic names carry the settings' prefix, as the Kafka client's do."""

    runner: InMemoryRunner
    settings: Any
    producer: RunnerProducer = field(init=False)

    def __post_init__(self) -> None:
        self.producer = RunnerProducer(self.runner, self.settings.topic_prefix)
