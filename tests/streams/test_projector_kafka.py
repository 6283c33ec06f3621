"""The memory-log projector's two barriers, against the real broker.

`barrier()` waits for the store (lexical recall) only, so recall never waits behind embedding;
`barrier(projected=True)` also waits for every sink's flush, which a replay needs for the same
packets whatever the embedding speed. A sink whose flush is held shows the difference.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from mnemoflow.projections.memory_store import MemoryStore
from mnemoflow.schemas.codec import default_registry
from mnemoflow.streams import topics as T
from mnemoflow.streams.producer import AvroProducer
from mnemoflow.streams.projector import MemoryLogProjector

from factories import memory_event
from support import isolated_settings, prepare_topics

pytestmark = pytest.mark.kafka


class HeldSink:
    """Records events; its flush does not return until the test releases it."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.flushed: list[str] = []
        self.release = asyncio.Event()

    def on_event(self, ev: dict[str, Any]) -> None:
        self.seen.append(ev["memoryId"])

    async def flush(self) -> None:
        todo = list(self.seen)
        await self.release.wait()
        self.flushed = todo


@asynccontextmanager
async def running_projector(bootstrap: str, tmp_path: Path, n: int, owners: int,
                            sink: HeldSink) -> AsyncIterator[tuple[MemoryLogProjector, Any]]:
    """A memory-log with n records of `owners` users, and a projector over it running."""
    s = isolated_settings(tmp_path, "projector")
    await prepare_topics(s, bootstrap)
    topic = T.MEMORY_LOG.name(s)
    send = _sender(s, bootstrap, topic)
    for i in range(n):
        await send(f"m{i}", f"u{i % owners}")
    projector = MemoryLogProjector(bootstrap, topic, MemoryStore(), default_registry(),
                                   s.client_kwargs(), sinks=[sink])
    run = asyncio.create_task(projector.run())
    try:
        yield projector, send
    finally:
        run.cancel()
        await asyncio.gather(run, return_exceptions=True)


def _sender(s: Any, bootstrap: str, topic: str) -> Any:
    async def send(mid: str, owner: str) -> None:
        async with AvroProducer(s, bootstrap) as producer:
            await producer.send(topic, "io.mnemoflow.MemoryEvent", owner,
                                memory_event(mid, ["kafka", mid], owner=owner))
    return send


async def test_projected_barrier_waits_for_the_sinks_and_the_applied_one_does_not(
        kafka_bootstrap, tmp_path):
    sink = HeldSink()
    async with running_projector(kafka_bootstrap, tmp_path, 6, 3, sink) as (projector, send):
        assert await projector.barrier(timeout=30.0)
        assert len(projector.store.records) == 6  # applied: lexical recall sees every record
        # the sink has seen them all but its flush is held: not projected yet
        assert not await projector.barrier(timeout=1.0, projected=True)
        assert sink.flushed == []
        sink.release.set()
        assert await projector.barrier(timeout=30.0, projected=True)
        assert sorted(sink.flushed) == [f"m{i}" for i in range(6)]
        # a record written after the release: applied at once, projected by the next flush
        await send("m6", "u0")
        assert await projector.barrier(timeout=30.0, projected=True)
        assert "m6" in sink.flushed and "m6" in projector.store.records


class HeldOwnerSink(HeldSink):
    """Also says which owners' rows it still holds: u0's until released."""

    def unprojected(self, owners: Any) -> bool:
        return not self.release.is_set() and ("User", "u0") in owners


async def test_the_per_owner_barrier_waits_only_for_the_requesting_owners_rows(
        kafka_bootstrap, tmp_path):
    sink = HeldOwnerSink()
    async with running_projector(kafka_bootstrap, tmp_path, 4, 2, sink) as (projector, _):
        u0, u1 = {("User", "u0"), ("Session", "q")}, {("User", "u1"), ("Session", "q")}
        # u1 has nothing held: answered although the flush (and u0's rows) is still held
        assert await projector.barrier(timeout=30.0, projected=True, owners=u1)
        assert len(projector.store.records) == 4
        assert not await projector.barrier(timeout=1.0, projected=True, owners=u0)
        assert not await projector.barrier(timeout=1.0, projected=True)  # the whole log
        sink.release.set()
        assert await projector.barrier(timeout=30.0, projected=True, owners=u0)
