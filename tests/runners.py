"""The two runners behind one test surface, for the contract suite (`tests/contract/`).

A contract case talks to a `Harness`: it sends host traffic through the host SDK's own
`HostSession` (or raw records), waits until the pipeline is quiet, reads topics, claims
packets and restarts the pipeline. `MemoryHarness` runs the topology in process;
`KafkaHarness` runs it in a real worker process against the real broker.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from aiokafka import TopicPartition

from mnemoflow.agents.injection_rules import load_rules
from mnemoflow.agents.topology import TOPOLOGY, Ports
from mnemoflow.agents.tuning import load_tuning
from mnemoflow.projections.array_index import ArrayIndex
from mnemoflow.projections.embedding import AsyncEmbedder
from mnemoflow.projections.partitioned import build_partitioned
from mnemoflow.projections.vector_tier import index_meta
from mnemoflow.schemas.codec import default_registry
from mnemoflow.streams import topics as T
from mnemoflow.streams.admin import admin_client
from mnemoflow.streams.config import Settings
from mnemoflow.streams.host import HostClient, HostSession
from mnemoflow.streams.inbox import InboxClient
from mnemoflow.streams.memory_runner import InMemoryRunner, MemoryHostClient, wall_ms
from mnemoflow.streams.producer import AvroProducer
from mnemoflow.streams.reader import TopicReader

from factories import HashEmbedder
from support import WorkerProcess, isolated_settings, prepare_topics

# what the stages consume: quiet means every one of these is committed to its end
CONSUMED = sorted({t for s in TOPOLOGY.stages for t in s.inputs})


class Harness(Protocol):
    name: str
    settings: Settings

    def session(self, session_id: str, user_id: str) -> HostSession: ...
    async def send(self, topic: str, key: str, value: dict[str, Any]) -> None: ...
    async def send_bytes(self, topic: str, key: bytes, raw: bytes) -> None: ...
    async def settle(self) -> None: ...
    async def records(self, topic: str) -> list[dict[str, Any]]: ...
    async def claim(self, session_id: str, now_ms: int) -> list[dict[str, Any]]: ...
    async def restart(self) -> None: ...




@dataclass
class MemoryHarness:
    settings: Settings
    name: str = "memory"
    runner: InMemoryRunner = field(init=False)

    def __post_init__(self) -> None:
        self.runner = self._runner()

    def _runner(self) -> InMemoryRunner:
        s = self.settings
        tuning = load_tuning()
        emb = index_for = None
        if s.vector:
            emb = AsyncEmbedder(HashEmbedder())
            meta = index_meta(emb, tuning.index)

            def index_for(p: int, folder: Path | None) -> ArrayIndex:
                return ArrayIndex(meta)
        memory = build_partitioned(tuning, s.partitions, index_for=index_for, embedder=emb,
                                   graph=s.graph, vector_timeout_s=s.vector_timeout_s,
                                   fault_tiers=s.fault_tiers)
        return InMemoryRunner.over(memory, Ports(tuning, s.max_payload_bytes, wall_ms, rules=load_rules()),
                                   registry=default_registry())

    def session(self, session_id: str, user_id: str) -> HostSession:
        return HostSession(MemoryHostClient(self.runner, self.settings),  # type: ignore[arg-type]
                           session_id, user_id)

    async def send(self, topic: str, key: str, value: dict[str, Any]) -> None:
        await self.runner.send(topic, value, key)

    async def send_bytes(self, topic: str, key: bytes, raw: bytes) -> None:
        await self.runner.send_bytes(topic, key, raw)

    async def settle(self) -> None:
        return None  # every send is carried through before it returns

    async def records(self, topic: str) -> list[dict[str, Any]]:
        return self.runner.records(topic)

    async def claim(self, session_id: str, now_ms: int) -> list[dict[str, Any]]:
        return self.runner.claim(session_id, now_ms)

    async def restart(self) -> None:
        """A new runner over the same logs and tables; its memory refolded from the log."""
        old = self.runner
        self.runner = self._runner()
        self.runner.logs, self.runner.tables = old.logs, old.tables
        await self.runner.memory.hold_all()
        for ev in [*old.records("memory-log"), *old.records("memory-shared")]:
            self.runner.memory.apply(ev)


@dataclass
class KafkaHarness:
    settings: Settings
    bootstrap: str
    name: str = "kafka"
    worker: WorkerProcess | None = None
    host: HostClient | None = None
    inbox: InboxClient | None = None
    raw: AvroProducer | None = None

    async def start(self) -> KafkaHarness:
        await prepare_topics(self.settings, self.bootstrap)
        self.host = HostClient(self.settings, self.bootstrap)
        await self.host.start()
        self.inbox = InboxClient(self.settings, self.bootstrap, self.host.producer)
        await self.inbox.start()
        await self._start_worker()
        return self

    async def _start_worker(self) -> None:
        self.worker = WorkerProcess(self.settings, self.bootstrap).start()
        await self.worker.wait_ready()

    async def stop(self) -> None:
        if self.worker is not None:
            self.worker.stop()
        if self.inbox is not None:
            await self.inbox.stop()
        if self.host is not None:
            await self.host.stop()

    def session(self, session_id: str, user_id: str) -> HostSession:
        assert self.host is not None
        return self.host.session(session_id, user_id)

    async def send(self, topic: str, key: str, value: dict[str, Any]) -> None:
        assert self.host is not None
        await self.host.producer.send(self.settings.topic(topic), T.VALUE_SCHEMA[topic], key, value)

    async def send_bytes(self, topic: str, key: bytes, raw: bytes) -> None:
        assert self.host is not None
        await self.host.producer.send_raw(self.settings.topic(topic), key, raw)

    async def settle(self, timeout: float = 120.0) -> None:
        """Until the worker has committed every consumed topic to its end, twice in a row a
        second apart (commits come on faust's timer, after the outputs are written)."""
        assert self.host is not None
        await self.host.producer.flush()
        admin = admin_client(self.settings, self.bootstrap)
        await admin.start()
        names = [self.settings.topic(t) for t in CONSUMED]
        deadline = time.monotonic() + timeout
        quiet = 0
        try:
            async with TopicReader(self.settings, self.bootstrap, names) as reader:
                while time.monotonic() < deadline:
                    ends = await reader._c.end_offsets(reader._tps)
                    got = await admin.list_consumer_group_offsets(self.settings.app_id)
                    done = {TopicPartition(tp.topic, tp.partition): md.offset
                            for tp, md in got.items()}
                    if all(done.get(tp, 0) >= end for tp, end in ends.items() if end > 0):
                        quiet += 1
                        if quiet >= 2:
                            return
                    else:
                        quiet = 0
                    await asyncio.sleep(1.0)
        finally:
            await admin.close()
        raise TimeoutError("the worker did not commit its input topics to their ends")

    async def records(self, topic: str) -> list[dict[str, Any]]:
        async with TopicReader(self.settings, self.bootstrap, [self.settings.topic(topic)]) as r:
            return [rec.value for rec in await r.drain() if rec.value is not None]

    async def claim(self, session_id: str, now_ms: int) -> list[dict[str, Any]]:
        assert self.inbox is not None
        return list((await self.inbox.claim_all(session_id, now_ms)).packets)

    async def restart(self) -> None:
        assert self.worker is not None
        self.worker.stop()
        await self._start_worker()


CONFIGS: dict[str, dict[str, Any]] = {
    "default": {},
    "lexical": {"vector": False, "graph": False},
    "faulty": {"fault_tiers": ("lexical", "vector", "graph")},
}


async def open_harness(kind: str, config: str, tmp: Path, bootstrap: str | None) -> Harness:
    settings = isolated_settings(tmp, f"contract-{config}", **CONFIGS[config])
    if kind == "memory":
        return MemoryHarness(replace(settings))
    assert bootstrap is not None
    return await KafkaHarness(settings, bootstrap).start()
