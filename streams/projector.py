"""Keeps the worker's partitioned memory (`projections.partitioned`) in step with the log.

The worker holds the memory-log partitions whose recall-requests partitions faust assigned it
(the same numbers: both topics are keyed by the user), and all of memory-shared. On an
assignment it restores each new partition: its local checkpoint, if there is one, then the
partition's vectors from memory-vectors (so nothing is embedded again), then the memory-log
after the checkpoint. A partition that moved away is dropped. Recall on a partition waits,
within a bound, until that partition is restored (`barrier`), and says why when it was not.

Exactly one worker embeds a memory: the one assigned its partition, because only it folds
that partition (a consumer group assigns a partition to one member at a time). It writes the
vector to memory-vectors under the memory id, in the same partition number; if two ever do
(a crash between embedding and writing), they write the same key and compaction keeps one.

`barrier()` lets recall wait until everything already in the log is applied to the store
(lexical recall), or, with `projected=True`, also flushed through the sinks for the request's
owners (the vector index above all), so the same input gives the same packets.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError

from mnemoflow.agents.candidate import scope_chain
from mnemoflow.agents.sealing import FORGET_OP
from mnemoflow.projections import snapshot
from mnemoflow.projections.heap import Freezer
from mnemoflow.projections.memory import Memory, flush_sinks
from mnemoflow.projections.partitioned import PartitionedMemory, partition_dir
from mnemoflow.projections.snapshot import Checkpoint, FolderLock
from mnemoflow.schemas.codec import DecodeError, SchemaRegistry
from mnemoflow.streams.keyring import Keyring
from mnemoflow.streams.metrics import Lag, WorkerMetrics
from mnemoflow.streams.reader import topic_partitions

OWNER_POLL_S = 0.01  # a per-owner barrier re-checks this often (flushes write in batches)
# records folded into a partition between two checkpoints: at least this many, and at least
# a quarter of what the partition holds, because a checkpoint's cost grows with the partition
# (its forked writer pickles the whole store, about 4 s of a core at 100k memories, and copies
# the pages it touches)
CHECKPOINT_EVERY = 20_000
# a checkpoint writer still at work after this long is killed, and the checkpoint tried again
# (a partition of 250k memories is written in about 10 s)
WRITER_LIMIT_S = 600.0
# records folded between two turns of the event loop: a fetch returns without waiting while
# the consumer holds fetched records, so without a turn a backlog is folded in one stretch
# (0.9 s at 100k memories, 4.4 s at 1M) and the agents, heartbeats and recall barriers that
# share the loop wait for all of it; 500 records take about 45 ms
FOLD_BATCH = 500
# with a Freezer (projections.heap), what a restore folds is frozen after each batch at least
# this big; a live stream's few records are left to the collector
SETTLE_RECORDS = FOLD_BATCH // 2
log = logging.getLogger(__name__)


@runtime_checkable
class OwnerTracking(Protocol):
    """A sink that can say whether it still buffers rows of some (scope, owner) pairs."""

    def unprojected(self, owners: Collection[tuple[str, str]]) -> bool: ...


class MemoryProjector:
    def __init__(self, bootstrap: str, topics: dict[str, str], memory: PartitionedMemory,
                 registry: SchemaRegistry, client_kwargs: dict[str, object], *,
                 folder: Path | None = None, build: str = "", group: str | None = None,
                 vector_meta: Any = None, checkpoint_every: int = CHECKPOINT_EVERY,
                 metrics: WorkerMetrics | None = None, keyring: Keyring | None = None,
                 freezer: Freezer | None = None) -> None:
        """`topics`: the memory-log, memory-shared and memory-vectors topic names by base
        name; `folder`: where partition checkpoints go (None: none are kept);
        `vector_meta`: the vector index's meta (model, dim, version), None without vectors;
        `group`: the consumer group the offsets every sink covers are committed to (what
        `mnemoflow eval` waits for; each worker commits the partitions it holds);
        `metrics`: where the projection lag is published after each batch; `keyring`: opens
        sealed records (None: every record is taken as it is); `freezer`: freezes what a
        restore makes out of the garbage collector's walks, which acts on the whole process,
        so only the process's owner passes one (None: the collector is left alone)."""
        self.bootstrap, self.topics, self.memory = bootstrap, topics, memory
        self.registry, self.client_kwargs = registry, client_kwargs
        self.folder, self.build, self.vector_meta = folder, build, vector_meta
        self.checkpoint_every = checkpoint_every
        self.group = group
        self.metrics = metrics
        self.keyring = keyring
        self.freezer = freezer
        self.applied: dict[TopicPartition, int] = {}  # next offset to apply
        self.projected: dict[TopicPartition, int] = {}  # next offset in every sink
        self.restoring: dict[int, int] = {}  # partition -> the log end it must reach
        self.since_checkpoint: dict[int, int] = {}
        self.skipped = 0
        self.restored_vectors = 0
        self._wanted: set[int] | None = None  # the assignment to take, set by `assign`
        self._dirs: dict[int, Path] = {}  # partition -> its folder, while held
        self._locks: dict[int, FolderLock] = {}
        self._writers: dict[int, snapshot.Writer] = {}  # partition -> its checkpoint being written
        self._covered: dict[TopicPartition, int] = {}  # what the last good flush covered
        self._consumer: AIOKafkaConsumer | None = None
        # a second client only for end offsets: a broker answers one connection's requests in
        # order, so asking on the fetching connection would queue behind a long-poll fetch
        self._offsets: AIOKafkaConsumer | None = None
        self._producer: AIOKafkaProducer | None = None
        # memory-vectors records to send (None: a tombstone)
        self._outbox: list[tuple[int, bytes, bytes | None]] = []
        self._ready = asyncio.Event()
        self._progress = asyncio.Condition()

    # --------------------------------------------------------------------------- control

    def assign(self, partitions: Collection[int]) -> None:
        """Hold these memory-log partitions from now on (the run loop takes them over)."""
        self._wanted = set(partitions)

    def held(self) -> set[int]:
        return set(self.memory.parts)

    def ready(self, partition: int) -> bool:
        return partition in self.memory.parts and partition not in self.restoring

    # ------------------------------------------------------------------------------ run

    def _tp(self, base: str, partition: int) -> TopicPartition:
        return TopicPartition(self.topics[base], partition)

    async def run(self) -> None:
        kw = self.client_kwargs
        consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, group_id=self.group,
                                    enable_auto_commit=False, auto_offset_reset="earliest",
                                    fetch_max_wait_ms=20, **kw)
        await consumer.start()
        self._consumer = consumer
        self._offsets = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, group_id=None,
                                         enable_auto_commit=False, **kw)
        await self._offsets.start()
        for t in self.topics.values():  # so its metadata knows the partitions' leaders
            self._offsets._client.add_topic(t)
        await self._offsets._client.force_metadata_update()
        if self.vector_meta is not None:
            self._producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, acks="all",
                                              enable_idempotence=True, linger_ms=20, **kw)
            await self._producer.start()
        flushing: asyncio.Task[dict[TopicPartition, int] | None] | None = None
        try:
            shared = await topic_partitions(consumer, self.topics["memory-shared"], attempts=600)
            await topic_partitions(consumer, self.topics["memory-log"], attempts=600)
            for tp in shared:
                self.applied[tp] = self.projected[tp] = 0
            await self._take(set(self._wanted or ()), consumer)
            self._ready.set()
            unflushed = 0
            while True:
                if self._wanted is not None and self._wanted != self.held():
                    if flushing is not None:  # a partition's sinks must be settled to move
                        await asyncio.wait([flushing])
                    await self._take(set(self._wanted), consumer)
                batch = await consumer.getmany(timeout_ms=200, max_records=FOLD_BATCH)
                for tp, msgs in batch.items():
                    mem = self.memory.memory_for(self._base(tp), tp.partition)
                    if mem is None or tp not in self.applied:
                        continue  # a partition just given up
                    for ev in await self._open(tp, msgs):
                        if ev["op"] == FORGET_OP:
                            self._forgetting(tp, mem, str(ev["owner"]))
                        mem.apply(ev)
                    self.applied[tp] = msgs[-1].offset + 1
                    self.since_checkpoint[tp.partition] = (
                        self.since_checkpoint.get(tp.partition, 0) + len(msgs))
                folded = sum(len(m) for m in batch.values())
                if self.freezer is not None and self.restoring and folded >= SETTLE_RECORDS:
                    self.freezer.settle()
                self._restored()
                self._reap()
                if self.metrics is not None:
                    self.metrics.set_projection_lag(self.lag())
                async with self._progress:
                    self._progress.notify_all()
                unflushed += folded
                if flushing is not None and flushing.done():
                    covered, flushing = flushing.result(), None
                    await self._send_vectors()
                    if covered is None:
                        unflushed = max(unflushed, 1)  # a sink failed: retry
                    else:
                        self._covered = covered
                        self._checkpoint(covered)
                        await self._commit(consumer, covered)
                # flush in the background whenever the previous flush is done: recall's barrier
                # never waits behind embedding, and a busy stream batches by itself
                if unflushed and flushing is None:
                    unflushed = 0
                    flushing = asyncio.create_task(self._flush_sinks(dict(self.applied)))
                await asyncio.sleep(0)  # a turn of the loop between batches (FOLD_BATCH)
        finally:
            if flushing is not None:
                flushing.cancel()
                # its writes into the partitions' folders end before the folders are let go
                await asyncio.gather(flushing, return_exceptions=True)
            # a projector started next in this process must be able to take the folders
            for p in list(self._dirs):  # a writer's partition always has its folder
                self._release(p)
            if self.freezer is not None:
                self.freezer.thaw()
            await consumer.stop()
            await self._offsets.stop()
            if self._producer is not None:
                await self._producer.stop()

    def _base(self, tp: TopicPartition) -> str:
        return "memory-shared" if tp.topic == self.topics["memory-shared"] else "memory-log"

    async def _open(self, tp: TopicPartition, msgs: list[Any]) -> list[dict[str, Any]]:
        """The batch's memory events in the clear; undecodable ones and those whose key is
        shredded (a forgotten owner's) are skipped."""
        events = []
        for m in msgs:
            try:
                events.append(self.registry.decode(m.value, "io.mnemoflow.MemoryEvent")[1])
            except DecodeError as exc:
                self.skipped += 1  # the observer dead-letters at the source
                log.warning("%s@%s skipped: %s", tp, m.offset, exc)
        if self.keyring is None:
            return events
        return [ev for ev in await self.keyring.open_all(events) if ev is not None]

    def _forgetting(self, tp: TopicPartition, mem: Memory, owner: str) -> None:
        """Before the fold drops the owner: their vectors go from memory-vectors (tombstones)
        and the partition's checkpoint, which holds their text, is deleted; the next flush
        writes a new one."""
        ids = sorted(mem.store.ids_of(owner))
        for mid in ids:
            mem.known_vectors.pop(mid, None)
        if self._base(tp) == "memory-log":
            self._outbox += [(tp.partition, mid.encode(), None) for mid in ids]
            if tp.partition in self._dirs:
                writer = self._writers.pop(tp.partition, None)
                if writer is not None:  # it was forked with the owner's memories in the fold
                    writer.abandon()
                snapshot.drop(self._dirs[tp.partition])
                self.since_checkpoint[tp.partition] = max(self.checkpoint_every,
                                                          len(mem.store))
        log.info("owner forgotten on %s: %d memories dropped", tp, len(ids))

    def lag(self) -> Lag:
        """Records of each held partition not yet applied: the end the consumer last saw (or,
        while restoring, the end it must reach) minus the next offset to apply."""
        out = {}
        for tp, applied in self.applied.items():
            seen = self._consumer.highwater(tp) if self._consumer is not None else None
            end = max(seen or 0, self.restoring.get(tp.partition, 0)
                      if self._base(tp) == "memory-log" else 0)
            out[(self._base(tp), tp.partition)] = max(0, end - applied)
        return out

    def _restored(self) -> None:
        for p, end in list(self.restoring.items()):
            if self.applied.get(self._tp("memory-log", p), 0) >= end:
                del self.restoring[p]
                log.info("memory-log partition %d restored", p)

    # ------------------------------------------------------------------- (re)assignment

    async def _take(self, wanted: set[int], consumer: AIOKafkaConsumer) -> None:
        """Give up the partitions not wanted and restore the new ones."""
        dropped = sorted(self.held() - wanted)
        if dropped and self.freezer is not None:
            self.freezer.thaw()  # a dropped memory is a reference cycle: frozen, it would stay
        for p in dropped:
            self.memory.drop(p)
            self._release(p)
            tp = self._tp("memory-log", p)
            self.applied.pop(tp, None)
            self.projected.pop(tp, None)
            self.restoring.pop(p, None)
            log.info("memory-log partition %d given up", p)
        new = sorted(wanted - self.held())
        starts: dict[TopicPartition, int] = {}
        loaded = False
        for p in new:
            folder = self._claim(p)
            cp = snapshot.load(folder, self.build) if folder and p in self._locks else None
            tp = self._tp("memory-log", p)
            end = (await self._end_offsets([tp]))[tp]
            if cp is not None and cp.offsets.get(tp.topic, 0) > end:
                log.warning("checkpoint of partition %d is past the log's end (%d > %d): the "
                            "topic was recreated; folding from the start", p, cp.offsets[tp.topic],
                            end)
                cp = None
            loaded = loaded or cp is not None
            mem = self.memory.make(p, folder, (cp.store, cp.graph) if cp else None)
            mem.known_vectors.update(await self._read_vectors(p))
            mem.on_embedded = self._publisher(p)
            await self.memory.assign(p, mem)
            starts[tp] = cp.offsets.get(tp.topic, 0) if cp else 0
            self.applied[tp] = self.projected[tp] = starts[tp]
            self.since_checkpoint[p] = 0
            if end > starts[tp]:
                self.restoring[p] = end
            log.info("memory-log partition %d taken: checkpoint at %s, log end %d, %d vectors "
                     "known", p, starts[tp] if cp else "none", end, len(mem.known_vectors))
        if loaded and self.freezer is not None:
            self.freezer.settle()
        consumer.assign(list(self.applied))
        for tp, pos in self.applied.items():
            consumer.seek(tp, pos)
        async with self._progress:
            self._progress.notify_all()

    def _claim(self, partition: int) -> Path | None:
        """The partition's folder: its own, locked; or, while another worker on this machine
        still holds that one, a private one that this worker fills from memory-vectors and
        removes when it gives the partition up (no checkpoint is kept there)."""
        if self.folder is None:
            return None
        own = self.folder / partition_dir(partition)
        lock = FolderLock(own)
        if lock.acquire():
            self._locks[partition] = lock
            self._dirs[partition] = own
            snapshot.drop_temporaries(own)
        else:
            self._dirs[partition] = own.with_name(f"{own.name}.{os.getpid()}")
            shutil.rmtree(self._dirs[partition], ignore_errors=True)
        return self._dirs[partition]

    def _release(self, partition: int) -> None:
        writer = self._writers.pop(partition, None)
        if writer is not None:  # the next holder may forget an owner the child still holds
            writer.abandon()
        folder = self._dirs.pop(partition, None)
        lock = self._locks.pop(partition, None)
        if lock is not None:
            lock.release()
        elif folder is not None:
            shutil.rmtree(folder, ignore_errors=True)

    async def _end_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        assert self._offsets is not None
        return await self._offsets.end_offsets(tps)

    # --------------------------------------------------------------------------- vectors

    async def _read_vectors(self, partition: int) -> dict[str, tuple[str, np.ndarray]]:
        """The partition's vectors of this model and version, by memory id."""
        meta = self.vector_meta
        if meta is None:
            return {}
        tp = self._tp("memory-vectors", partition)
        end = (await self._end_offsets([tp]))[tp]
        out: dict[str, tuple[str, np.ndarray]] = {}
        if end == 0:
            return out
        reader = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, group_id=None,
                                  enable_auto_commit=False, **self.client_kwargs)
        await reader.start()
        try:
            reader.assign([tp])
            await reader.seek_to_beginning(tp)
            while await reader.position(tp) < end:
                for msgs in (await reader.getmany(tp, timeout_ms=500)).values():
                    for m in msgs:
                        key = m.key.decode() if m.key else ""
                        if m.value is None:
                            out.pop(key, None)
                            continue
                        try:
                            _, v = self.registry.decode(m.value, "io.mnemoflow.MemoryVector")
                        except DecodeError:
                            continue
                        if (v["model"], v["version"], v["dim"]) == (meta.model, meta.version,
                                                                    meta.dim):
                            out[v["memoryId"]] = (v["inputDigest"],
                                                  np.frombuffer(v["vector"], dtype="<f4"))
        finally:
            await reader.stop()
        self.restored_vectors += len(out)
        return out

    def _publisher(self, partition: int) -> Any:
        meta = self.vector_meta

        def embedded(rows: list[dict[str, Any]], digests: list[str], vectors: Any) -> None:
            if meta is None or self._producer is None:
                return
            for row, digest, vec in zip(rows, digests, vectors, strict=True):
                value = self.registry.encode("io.mnemoflow.MemoryVector", {
                    "memoryId": row["memory_id"], "scope": row["scope"], "owner": row["owner"],
                    "model": meta.model, "version": meta.version, "dim": meta.dim,
                    "inputDigest": digest,
                    "vector": np.asarray(vec, dtype="<f4").tobytes()})
                self._outbox.append((partition, row["memory_id"].encode(), value))

        return embedded

    async def _send_vectors(self) -> None:
        if self._producer is None or not self._outbox:
            return
        out, self._outbox = self._outbox, []
        topic = self.topics["memory-vectors"]
        try:
            futs = [await self._producer.send(topic, value, key=key, partition=p)
                    for p, key, value in out]
            await asyncio.gather(*futs)
        except KafkaError as exc:
            # derived data: a vector not written is embedded again by a later owner
            log.warning("memory-vectors not written (%r); the next owner embeds again", exc)

    async def _commit(self, consumer: AIOKafkaConsumer,
                      covered: dict[TopicPartition, int]) -> None:
        held = {tp: off for tp, off in covered.items() if tp in self.applied and off > 0}
        if self.group and held:
            try:
                await consumer.commit(held)
            except KafkaError as exc:  # informational: the next flush commits again
                log.warning("projector offsets not committed: %r", exc)

    # ----------------------------------------------------------------------- checkpoints

    def _checkpoint(self, covered: dict[TopicPartition, int]) -> None:
        """Checkpoint the partitions folded far enough since the last one, whose sinks hold
        everything folded (nothing was applied during the flush that covered them)."""
        if self.folder is None:
            return
        for p, mem in list(self.memory.parts.items()):
            tp = self._tp("memory-log", p)
            if (p not in self._locks or self.since_checkpoint.get(p, 0) < self._due(mem)
                    or p in self.restoring or covered.get(tp) != self.applied.get(tp)):
                continue
            self._save(p, mem, {tp.topic: self.applied[tp]})

    def _save(self, partition: int, mem: Memory, offsets: dict[str, int]) -> None:
        """Fork the partition's checkpoint writer; the fold goes on meanwhile. One writer at a
        time, whatever the partition: each copies the pages its pickling touches, up to the
        whole heap, so a second would double that (docs/decisions.md, "Checkpoints written by
        a forked child"); a partition still due is checkpointed at a later flush."""
        if self._writers:
            return
        graph = mem.graph_sink.graph if mem.graph_sink is not None else None
        self._writers[partition] = snapshot.fork_write(
            self._dirs[partition], Checkpoint(self.build, offsets, mem.store, graph))
        self.since_checkpoint[partition] = 0
        log.info("checkpoint of partition %d at %s being written (pid %d)", partition, offsets,
                 self._writers[partition].pid)

    def _reap(self) -> None:
        """Note the checkpoint writer that ended, and fork the next one due; a failed one is
        tried again at the next flush (its partition counts as due)."""
        for p, writer in list(self._writers.items()):
            done = writer.poll()
            if done is None and time.monotonic() - writer.started > WRITER_LIMIT_S:
                writer.abandon()
                done = False
            if done is None:
                continue
            del self._writers[p]
            if done:
                log.info("checkpoint of partition %d written (%.2f s)", p,
                         time.monotonic() - writer.started)
                # the next partition due, if nothing was folded since the last flush (an idle
                # log has no next flush to wait for)
                self._checkpoint(self._covered)
            else:
                log.warning("checkpoint of partition %d not written (its writer failed or "
                            "ran past %.0f s); trying again at the next flush", p,
                            WRITER_LIMIT_S)
                mem = self.memory.parts.get(p)
                if mem is not None:
                    self.since_checkpoint[p] = max(self.since_checkpoint.get(p, 0),
                                                   self._due(mem))

    def _due(self, mem: Memory) -> int:
        """Records to fold into a partition before its next checkpoint."""
        return max(self.checkpoint_every, len(mem.store) // 4)

    # ---------------------------------------------------------------------------- flush

    async def _flush_sinks(self, applied: dict[TopicPartition, int]
                           ) -> dict[TopicPartition, int] | None:
        """Flush every projection; the offsets they now cover, or None if one failed.

        A failing projection (vector, Markdown) never stops recall: the lexical store is
        already current, and the next flush retries what was not written.
        """
        if not await flush_sinks([s for mem in self.memory.memories() for s in mem.sinks]):
            return None
        for tp, off in applied.items():
            if tp in self.projected:
                self.projected[tp] = max(self.projected[tp], off)
        async with self._progress:
            self._progress.notify_all()
        return applied

    # -------------------------------------------------------------------------- barrier

    async def log_ends(self, requests: Sequence[dict[str, Any]],
                       timeout: float = 2.0) -> dict[TopicPartition, int]:
        """The log ends the barriers of several requests wait for, looked up in one round
        trip (`barrier(ends=...)`): looked up after every one of the requests arrived, so each
        request's own writes are below them. Partitions not restored yet are left out (their
        barrier looks its end up once they are); {} if the broker did not answer in time."""
        if not self._ready.is_set():
            return {}
        tps = {self._tp("memory-shared", 0)}
        tps |= {self._tp("memory-log", p) for p in {self.memory.partition_for(r)
                                                    for r in requests} if self.ready(p)}
        try:
            return await asyncio.wait_for(self._end_offsets(sorted(tps)), timeout)
        except (TimeoutError, KafkaError):
            return {}

    async def barrier(self, timeout: float = 2.0, projected: bool = False,
                      request: dict[str, Any] | None = None,
                      ends: Mapping[TopicPartition, int] | None = None) -> tuple[bool, str]:
        """Wait until the request's partition is held and restored, and every record already
        in its memory-log partition and in memory-shared is applied (and, if `projected`, in
        the sinks, for the request's owners); without a request, every held partition.
        (True, "") or (False, why): "restoring" (the partition is still being taken over,
        or is not held here) or "lagging". Bounded as a whole: recall never hangs on it.
        `ends`: log ends looked up since the request arrived (`log_ends`), used instead of
        asking the broker again."""
        part = self.memory.partition_for(request) if request is not None else None
        try:
            await asyncio.wait_for(self._barrier(part, projected, request, ends or {}), timeout)
            return True, ""
        except (TimeoutError, KafkaError):
            held = part is None or self.ready(part)
            return False, "lagging" if held else "restoring"

    async def _barrier(self, part: int | None, projected: bool, request: dict[str, Any] | None,
                       known: Mapping[TopicPartition, int]) -> None:
        await self._ready.wait()
        if part is not None:
            async with self._progress:
                await self._progress.wait_for(lambda: self.ready(part))
        tps = [self._tp("memory-shared", 0)]
        tps += [self._tp("memory-log", part)] if part is not None else \
            [self._tp("memory-log", p) for p in sorted(self.held())]
        ends = {tp: known[tp] for tp in tps if tp in known}
        if missing := [tp for tp in tps if tp not in known]:
            ends.update(await self._end_offsets(missing))
        owners = scope_chain(request) if request is not None else None
        done = self.projected if projected and owners is None else self.applied

        def caught_up() -> bool:
            return all(done.get(tp, end) >= end for tp, end in ends.items())

        async with self._progress:
            await self._progress.wait_for(caught_up)
        if projected and owners is not None:
            mems = self.memory.serving(request) if request is not None else []
            while any(sink.unprojected(owners) for m in mems for sink in m.sinks
                      if isinstance(sink, OwnerTracking)):
                await asyncio.sleep(OWNER_POLL_S)
