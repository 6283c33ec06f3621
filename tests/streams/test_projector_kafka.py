"""The partitioned memory projector against the real broker: it holds only the partitions it
is given, recall on a partition being restored is told so, vectors are embedded once and read
back by the next owner, a checkpoint bounds a restart to the tail, an owner forgotten while a
checkpoint is being written is not put back by it, a backlog is folded a batch per turn of
the event loop, and the two barriers.
"""

from __future__ import annotations

import asyncio
import pickle
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from mnemoflow.agents.memory_events import as_operator, owner_forget
from mnemoflow.agents.partitioning import partition_of
from mnemoflow.agents.tuning import load_tuning
from mnemoflow.projections import snapshot
from mnemoflow.projections.array_index import ArrayIndex
from mnemoflow.projections.embedding import AsyncEmbedder
from mnemoflow.projections.heap import Freezer
from mnemoflow.projections.partitioned import PartitionedMemory, build_partitioned
from mnemoflow.projections.vector_tier import index_meta
from mnemoflow.schemas.codec import default_registry
from mnemoflow.streams import topics as T
from mnemoflow.streams.keyring import Keyring
from mnemoflow.streams.producer import AvroProducer
from mnemoflow.streams.projector import FOLD_BATCH, MemoryProjector
from mnemoflow.streams.reader import TopicReader

from factories import HashEmbedder, memory_event
from support import isolated_settings, prepare_topics

pytestmark = pytest.mark.kafka
PARTS = 4


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


class CountingFreezer(Freezer):
    """Counts the projector's calls and leaves the test process's collector alone."""

    def settle(self) -> None:
        self.settled += 1

    def thaw(self) -> None:
        self.thawed += 1


class CountingEmbedder(HashEmbedder):
    def __init__(self) -> None:
        self.texts = 0

    def embed(self, texts: list[str]) -> Any:
        self.texts += len(texts)
        return super().embed(texts)


def users_on(partition: int, n: int) -> list[str]:
    """n user ids that Kafka's partitioner puts on this partition."""
    out, i = [], 0
    while len(out) < n:
        if partition_of(f"u{i}", PARTS) == partition:
            out.append(f"u{i}")
        i += 1
    return out


def memory(emb: Any = None, sink: HeldSink | None = None) -> PartitionedMemory:
    tuning = load_tuning()
    aemb = AsyncEmbedder(emb) if emb is not None else None
    meta = index_meta(emb, tuning.index) if emb is not None else None
    mem = build_partitioned(tuning, PARTS, embedder=aemb, graph=False,
                            index_for=(lambda p, f: ArrayIndex(meta)) if emb else None)
    if sink is not None:
        make = mem.make

        def with_sink(p: int, folder: Path | None, restored: Any) -> Any:
            m = make(p, folder, restored)
            m.sinks.append(sink)
            return m

        mem.make = with_sink
    return mem


@asynccontextmanager
async def projecting(s: Any, bootstrap: str, mem: PartitionedMemory, parts: set[int],
                     **kw: Any) -> AsyncIterator[MemoryProjector]:
    topics = {spec.base: spec.name(s) for spec in (T.MEMORY_LOG, T.MEMORY_SHARED, T.MEMORY_VECTORS)}
    keyring = Keyring(s, bootstrap)  # what `write` seals, the projector opens
    proj = MemoryProjector(bootstrap, topics, mem, default_registry(), s.client_kwargs(),
                           keyring=keyring, **kw)
    proj.assign(parts)
    await mem.start()
    run = asyncio.create_task(proj.run())
    try:
        yield proj
    finally:
        run.cancel()
        await asyncio.gather(run, return_exceptions=True)
        await keyring.stop()


async def write(s: Any, bootstrap: str, events: list[dict[str, Any]]) -> None:
    async with AvroProducer(s, bootstrap) as producer:
        for ev in events:
            topic = T.MEMORY_LOG if ev["scope"] == "User" else T.MEMORY_SHARED
            await producer.send(topic.name(s), "io.mnemoflow.MemoryEvent", ev["owner"], ev)


def request(user: str, workspace: str | None = None) -> dict[str, Any]:
    return {"sessionId": f"s-{user}", "userId": user, "workspaceId": workspace}


@pytest.fixture
async def topics_for(kafka_bootstrap: str, tmp_path: Path) -> Any:
    s = isolated_settings(tmp_path, "projector", partitions=PARTS)
    await prepare_topics(s, kafka_bootstrap)
    return s


async def test_a_worker_holds_only_its_partitions_and_says_when_one_is_restoring(
        topics_for: Any, kafka_bootstrap: str) -> None:
    s = topics_for
    mine, theirs = users_on(0, 2), users_on(1, 2)
    await write(s, kafka_bootstrap, [memory_event(f"m-{u}", ["kafka", u], owner=u)
                                     for u in mine + theirs])
    await write(s, kafka_bootstrap, [memory_event("ws-note", ["kafka"], owner="w1",
                                                  scope="Workspace")])
    mem = memory()
    freezer = CountingFreezer()
    async with projecting(s, kafka_bootstrap, mem, {0}, freezer=freezer) as proj:
        assert await proj.barrier(30.0, request=request(mine[0])) == (True, "")
        assert set(mem.parts) == {0}
        held = {m for part in mem.memories() for m in part.store.records}
        assert held == {f"m-{u}" for u in mine} | {"ws-note"}  # never another partition's
        # a request of a partition not held here is told so, within the bound
        assert await proj.barrier(0.5, request=request(theirs[0])) == (False, "restoring")
        assert freezer.thawed == 0
        proj.assign({1})  # a rebalance: partition 0 moves away, 1 comes
        assert await proj.barrier(30.0, request=request(theirs[0])) == (True, "")
        assert set(mem.parts) == {1}
        assert freezer.thawed == 1  # what partition 0 held can be collected
        held = {m for part in mem.memories() for m in part.store.records}
        assert held == {f"m-{u}" for u in theirs} | {"ws-note"}


async def test_requests_taken_together_share_one_log_end_lookup(
        topics_for: Any, kafka_bootstrap: str) -> None:
    """`log_ends` looks up the ends of every held partition a list of requests reads (and
    memory-shared's); each request's barrier then waits for those ends, not others."""
    s = topics_for
    a, b, elsewhere = users_on(0, 1)[0], users_on(2, 1)[0], users_on(1, 1)[0]
    await write(s, kafka_bootstrap, [memory_event(f"m{i}-{u}", ["kafka", u], owner=u)
                                     for u in (a, b, elsewhere) for i in range(3 if u == a else 2)])
    await write(s, kafka_bootstrap, [memory_event("ws", ["kafka"], owner="w1", scope="Workspace")])
    mem = memory()
    async with projecting(s, kafka_bootstrap, mem, {0, 2}) as proj:
        assert await proj.barrier(30.0) == (True, "")
        asks = [request(a, "w1"), request(b), request(elsewhere)]
        ends = await proj.log_ends(asks)
        log, shared = T.MEMORY_LOG.name(s), T.MEMORY_SHARED.name(s)
        assert {(tp.topic, tp.partition): end for tp, end in ends.items()} == {
            (log, 0): 3, (log, 2): 2, (shared, 0): 1}  # partition 1 is not held here
        for ask in asks[:2]:
            assert await proj.barrier(30.0, request=ask, ends=ends) == (True, "")
        assert await proj.barrier(0.5, request=asks[2], ends=ends) == (False, "restoring")
        # the ends given are the ones waited for: one past the log's is never reached
        past = {tp: end + 1 if tp.partition == 0 and tp.topic == log else end
                for tp, end in ends.items()}
        assert await proj.barrier(0.5, request=asks[0], ends=past) == (False, "lagging")
        assert await proj.barrier(30.0, request=asks[1], ends=past) == (True, "")


async def test_vectors_are_embedded_once_and_read_back_by_the_next_owner(
        topics_for: Any, kafka_bootstrap: str) -> None:
    s = topics_for
    users = users_on(2, 3)
    await write(s, kafka_bootstrap, [memory_event(f"m{i}-{u}", ["deploy", u, str(i)], owner=u)
                                     for u in users for i in range(4)])
    first = CountingEmbedder()
    meta = index_meta(first, load_tuning().index)
    async with projecting(s, kafka_bootstrap, memory(first), {2}, vector_meta=meta) as proj:
        assert await proj.barrier(30.0, projected=True, request=request(users[0]))
        # the vectors reach memory-vectors after the flush that embedded them
        for _ in range(300):
            async with TopicReader(s, kafka_bootstrap, [T.MEMORY_VECTORS.name(s)]) as r:
                vectors = await r.drain()
            if len(vectors) == 12:
                break
            await asyncio.sleep(0.1)
    assert first.texts >= 12 and len(vectors) == 12  # (each turn's context is embedded too)
    assert {v.partition for v in vectors} == {2}  # the memory-log partition's number

    second = CountingEmbedder()
    mem = memory(second)
    async with projecting(s, kafka_bootstrap, mem, {2}, vector_meta=meta) as proj:
        assert await proj.barrier(30.0, projected=True, request=request(users[0]))
        assert proj.restored_vectors == 12
        assert second.texts == 0  # taken over without embedding again
        assert len(mem.parts[2].index) == 12


async def test_a_checkpoint_bounds_the_restart_to_the_tail(
        topics_for: Any, kafka_bootstrap: str, tmp_path: Path) -> None:
    s = topics_for
    users = users_on(3, 2)
    await write(s, kafka_bootstrap, [memory_event(f"a{i}-{u}", ["early", u], owner=u)
                                     for u in users for i in range(10)])
    folder = tmp_path / "memory"
    async with projecting(s, kafka_bootstrap, memory(), {3}, folder=folder, build="b",
                          checkpoint_every=1) as proj:
        assert await proj.barrier(30.0, request=request(users[0]))
        for _ in range(300):
            if (folder / "p3" / "checkpoint.pickle").exists():
                break
            await asyncio.sleep(0.1)
    assert (folder / "p3" / "checkpoint.pickle").exists()
    await write(s, kafka_bootstrap, [memory_event(f"b-{u}", ["late", u], owner=u) for u in users])

    mem = memory()
    freezer = CountingFreezer()
    # the projector before let go of the partition's folder when it stopped
    async with projecting(s, kafka_bootstrap, mem, {3}, folder=folder, build="b",
                          freezer=freezer) as proj:
        assert await proj.barrier(30.0, request=request(users[0]))
        assert freezer.settled == 1  # what the checkpoint made (the tail is too short)
        store = mem.parts[3].store
        assert len(store) == 22  # the checkpoint's 20 and the tail's 2
        assert store.applied_count == 20 + 2  # counted in the checkpoint, then 2 folded now
        # of another build, a checkpoint is not used: the whole partition is folded
    mem = memory()
    freezer = CountingFreezer()
    async with projecting(s, kafka_bootstrap, mem, {3}, folder=folder, build="other",
                          freezer=freezer) as proj:
        assert await proj.barrier(30.0, request=request(users[0]))
        assert len(mem.parts[3].store) == 22
        assert freezer.settled == 0  # nothing loaded, and 22 records are no backlog to settle


async def test_an_owner_forgotten_while_a_checkpoint_is_written_is_not_put_back(
        topics_for: Any, kafka_bootstrap: str, tmp_path: Path, monkeypatch: Any) -> None:
    """A checkpoint writer is a fork of the fold, so one forked before a forget holds the
    forgotten owner's memories: the forget kills it, and the checkpoint that lands holds none."""
    s = topics_for
    kept, gone = users_on(3, 2)
    hold = tmp_path / "hold"  # while it exists, a checkpoint writer waits before it pickles
    hold.touch()

    def held_dump(obj: Any, f: Any, protocol: int | None = None) -> None:
        while hold.exists():
            time.sleep(0.02)
        pickle.dump(obj, f, protocol=protocol)

    monkeypatch.setattr(snapshot, "pickle", type("HeldPickle", (), {
        "HIGHEST_PROTOCOL": pickle.HIGHEST_PROTOCOL, "dump": staticmethod(held_dump),
        "dumps": staticmethod(pickle.dumps), "load": staticmethod(pickle.load)}))
    await write(s, kafka_bootstrap, [memory_event(f"a{i}-{u}", ["early", u], owner=u)
                                     for u in (kept, gone) for i in range(10)])
    folder, mem = tmp_path / "memory", memory()
    async with projecting(s, kafka_bootstrap, mem, {3}, folder=folder, build="b",
                          checkpoint_every=1) as proj:
        assert await proj.barrier(30.0, request=request(kept))
        for _ in range(300):  # the writer has its temporary file open and waits
            if list((folder / "p3").glob(f".{snapshot.FILE}.*")):
                break
            await asyncio.sleep(0.1)
        assert list((folder / "p3").glob(f".{snapshot.FILE}.*"))
        await write(s, kafka_bootstrap, [as_operator(owner_forget(gone, 2), "asked", "test")])
        for _ in range(300):
            if not mem.parts[3].store.ids_of(gone):
                break
            await asyncio.sleep(0.1)
        assert not mem.parts[3].store.ids_of(gone) and mem.parts[3].store.ids_of(kept)
        hold.unlink()
        for _ in range(300):
            if (folder / "p3" / snapshot.FILE).exists():
                break
            await asyncio.sleep(0.1)
        cp = snapshot.load(folder / "p3", "b")
    assert cp is not None
    assert not cp.store.ids_of(gone) and len(cp.store.ids_of(kept)) == 10


async def test_projected_barrier_waits_for_the_sinks_and_the_applied_one_does_not(
        topics_for: Any, kafka_bootstrap: str) -> None:
    s = topics_for
    user = users_on(0, 1)[0]
    sink = HeldSink()
    await write(s, kafka_bootstrap, [memory_event(f"m{i}", ["kafka"], owner=user)
                                     for i in range(6)])
    async with projecting(s, kafka_bootstrap, memory(sink=sink), {0}) as proj:
        req = request(user)
        assert await proj.barrier(30.0, request=req) == (True, "")
        assert len(sink.seen) == 6  # applied: lexical recall sees every record
        assert await proj.barrier(1.0, projected=True) == (False, "lagging")
        sink.release.set()
        assert await proj.barrier(30.0, projected=True) == (True, "")
        assert len(sink.flushed) == 6


async def test_a_backlog_is_folded_one_batch_per_turn_of_the_loop(
        topics_for: Any, kafka_bootstrap: str) -> None:
    """A fetch returns at once while the consumer holds fetched records, so the fold must give
    the loop a turn between batches: a task that runs at every turn sees the applied offsets
    grow by at most FOLD_BATCH between two of its turns. The restore is settled (frozen) as it
    goes, and everything thawed when the projector stops."""
    s = topics_for
    n = 6 * FOLD_BATCH
    registry = default_registry()
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, linger_ms=20,
                                **s.client_kwargs())
    await producer.start()
    try:  # batched, not a wait per record: the backlog must be there before the fold starts
        sent = [await producer.send(T.MEMORY_LOG.name(s), registry.encode(
            "io.mnemoflow.MemoryEvent", memory_event(f"b{i}", ["backlog", f"w{i}"],
                                                     owner=f"u{i % 40}")), key=f"u{i % 40}".encode())
            for i in range(n)]
        await asyncio.gather(*sent)
    finally:
        await producer.stop()
    growth: list[int] = []
    mem = memory()
    freezer = CountingFreezer()
    async with projecting(s, kafka_bootstrap, mem, set(range(PARTS)), freezer=freezer) as proj:
        last = 0
        deadline = time.monotonic() + 60.0
        while time.monotonic() < deadline:
            applied = sum(proj.applied.values())
            growth.append(applied - last)
            last = applied
            if len(mem) == n:  # folded in the step that moved `applied` last: counted
                break
            await asyncio.sleep(0)
        assert freezer.thawed == 0
    assert len(mem) == n
    assert max(growth) <= FOLD_BATCH
    assert sum(g > 0 for g in growth) >= n // FOLD_BATCH
    assert freezer.settled >= 1 and freezer.thawed == 1
