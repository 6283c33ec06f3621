"""Keeps a MemoryStore in step with the memory-log topic (all partitions, from the start).

The store is a projection: every worker folds the whole log, so recall sees a user's
memories whatever partition their sessions hashed to. `barrier()` lets recall wait until
everything already in the log is applied to the store (lexical recall), or, with
`projected=True`, also flushed through every sink (the vector index above all), or only
through the rows of given owners: the first keeps recall from ever waiting behind embedding,
the others make a bulk replay's vector hits independent of how far embedding had got, so the
same input gives the same packets.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Collection
from typing import Any, Protocol, runtime_checkable

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from mnemoflow.projections.memory_store import MemoryStore
from mnemoflow.schemas.codec import DecodeError, SchemaRegistry
from mnemoflow.streams.reader import topic_partitions


class Sink(Protocol):
    """A projection fed event by event, and flushed in the background between batches."""

    def on_event(self, ev: dict[str, Any]) -> None: ...

    def flush(self) -> Any: ...


@runtime_checkable
class OwnerTracking(Protocol):
    """A sink that can say whether it still buffers rows of some (scope, owner) pairs."""

    def unprojected(self, owners: Collection[tuple[str, str]]) -> bool: ...


OWNER_POLL_S = 0.01  # a per-owner barrier re-checks this often (flushes write in batches)
log = logging.getLogger(__name__)


class MemoryLogProjector:
    def __init__(self, bootstrap: str, topic: str, store: MemoryStore, registry: SchemaRegistry,
                 client_kwargs: dict[str, object], group: str | None = None,
                 sinks: list[Sink] | None = None) -> None:
        self.bootstrap, self.topic, self.store, self.registry = bootstrap, topic, store, registry
        self.client_kwargs = client_kwargs
        self.group = group
        self.sinks = list(sinks or [])
        self.applied: dict[TopicPartition, int] = {}  # next offset to apply
        self.projected: dict[TopicPartition, int] = {}  # next offset not yet in every sink
        self.skipped = 0
        self._consumer: AIOKafkaConsumer | None = None
        # a second client only for end offsets: a broker answers one connection's requests in
        # order, so asking on the fetching connection would queue behind a long-poll fetch
        self._offsets: AIOKafkaConsumer | None = None
        self._ready = asyncio.Event()
        self._progress = asyncio.Condition()

    async def run(self) -> None:
        consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, group_id=self.group,
                                    enable_auto_commit=False, auto_offset_reset="earliest",
                                    fetch_max_wait_ms=20, **self.client_kwargs)
        await consumer.start()
        self._consumer = consumer
        self._offsets = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, group_id=None,
                                         enable_auto_commit=False, **self.client_kwargs)
        await self._offsets.start()
        self._offsets._client.add_topic(self.topic)  # so its metadata knows the partitions' leaders
        await self._offsets._client.force_metadata_update()
        flushing: asyncio.Task[dict[TopicPartition, int] | None] | None = None
        try:
            tps = await topic_partitions(consumer, self.topic, attempts=600)
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            for tp in tps:
                self.applied[tp] = self.projected[tp] = 0
            self._ready.set()
            unflushed = 0
            while True:
                batch = await consumer.getmany(timeout_ms=200, max_records=2000)
                for tp, msgs in batch.items():
                    for m in msgs:
                        try:
                            _, ev = self.registry.decode(m.value, "io.mnemoflow.MemoryEvent")
                            if self.store.apply(ev):  # False: a redelivered record
                                for sink in self.sinks:
                                    sink.on_event(ev)
                        except DecodeError as exc:
                            self.skipped += 1  # the observer dead-letters at the source
                            log.warning("memory-log %s@%s skipped: %s", tp, m.offset, exc)
                        self.applied[tp] = m.offset + 1
                async with self._progress:
                    self._progress.notify_all()
                unflushed += sum(len(m) for m in batch.values())
                if not self.sinks:
                    self.projected.update(self.applied)
                if flushing is not None and flushing.done():
                    covered, flushing = flushing.result(), None
                    if covered is None:
                        unflushed = max(unflushed, 1)  # a sink failed: not committed, retry
                    elif self.group:  # committed = fully projected (lexical and vector)
                        await consumer.commit(covered)
                # flush in the background whenever the previous flush is done: recall's barrier
                # never waits behind embedding, and a busy stream batches by itself (whatever
                # arrived during one flush is the next one's batch)
                if unflushed and flushing is None:
                    unflushed = 0
                    flushing = asyncio.create_task(self._flush_sinks(dict(self.applied)))
        finally:
            if flushing is not None:
                flushing.cancel()
            await consumer.stop()
            await self._offsets.stop()

    async def _flush_sinks(self, applied: dict[TopicPartition, int]
                           ) -> dict[TopicPartition, int] | None:
        """Flush every projection; the offsets they now cover, or None if one failed.

        A failing projection (vector, Markdown) never stops recall: the lexical store is
        already current, and the next flush retries what was not written.
        """
        ok = True
        for sink in self.sinks:
            try:
                res = sink.flush()
                if inspect.isawaitable(res):
                    await res
            except Exception:
                log.exception("projection %s failed; retrying with the next batch",
                              type(sink).__name__)
                ok = False
        if not ok:
            return None
        self.projected.update(applied)
        async with self._progress:
            self._progress.notify_all()
        return applied

    async def barrier(self, timeout: float = 2.0, projected: bool = False,
                      owners: Collection[tuple[str, str]] | None = None) -> bool:
        """Wait until every record already in the log is applied (and, if `projected`, in
        every sink too); False on timeout or error.

        With `owners` (a request's scope chain), `projected` waits only until no sink holds
        an unwritten row of those (scope, owner) pairs: recall sees the same memories as a
        full wait would, without waiting for other users' embeddings in a bulk replay.
        Bounded as a whole (the end-offset request included): recall must never hang on it.
        """
        try:
            return await asyncio.wait_for(self._barrier(projected, owners), timeout)
        except (TimeoutError, KafkaError):
            return False

    async def _barrier(self, projected: bool,
                       owners: Collection[tuple[str, str]] | None) -> bool:
        await self._ready.wait()
        assert self._offsets is not None
        ends = await self._offsets.end_offsets(list(self.applied))
        done = self.projected if projected and owners is None else self.applied

        def caught_up() -> bool:
            return all(done.get(tp, 0) >= end for tp, end in ends.items())

        async with self._progress:
            await self._progress.wait_for(caught_up)
        if projected and owners is not None:
            # every record up to the end is now in the store and was offered to every sink;
            # a sink that buffers says whether it still holds one of these owners' rows
            while any(sink.unprojected(owners) for sink in self.sinks
                      if isinstance(sink, OwnerTracking)):
                await asyncio.sleep(OWNER_POLL_S)
        return True
