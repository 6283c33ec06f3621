"""The faust App the worker runs: stock faust, with the consumer changes at-least-once needs.

A record delivered twice is harmless (every stage's outputs have deterministic ids); a record
counted as read that never reached its stream, or a changelog record that never reached table
recovery, is lost. So in faust's delivery loop (`_Consumer._drain_messages`) a record counts as
read only once it was delivered. A record that cannot be delivered now (the flow stopped, a
rebalance came between its fetch and its delivery, its partition was paused meanwhile, or a
stream partition's next offset is unknown) is fetched again: its partition is sought back to
it, unless the partition was sought since that fetch, for that seek says where to read. An
offset gap, which our topics never have, is sought back to unless the broker's log starts
after it; and seeks run on the consumer's thread, beside the fetcher they would otherwise
race. A partition that was never committed starts at its log start, as
`auto_offset_reset="earliest"` says, and faust is given that offset as the next one. A record
that a stream skips unseen across a rebalance is not acked, and a commit never passes a record
missing at the head of what was acked.

Resuming the app's flow control when it already runs leaves the stream queues alone. faust
clears every stream queue on each resume, and table recovery resumes twice in one rebalance:
once to read the changelogs, and again after seeking the stream partitions to their committed
offsets. A record delivered between that seek and the second resume was dropped from its queue
unprocessed, while its successors were processed.

aiokafka's `prefetch_backoff` is cut from 100 to 5 ms: one consumer reads every agent's topics
from the broker, and no fetch is sent while any partition still holds buffered records younger
than it, so an event would wait behind another topic's buffer.

What showed each of these, and the tests that hold them: docs/decisions.md.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, cast

import faust
from aiokafka import AIOKafkaConsumer
from aiokafka.errors import IllegalStateError
from faust.transport.consumer import CONSUMER_FETCHING
from faust.transport.drivers import aiokafka as driver
from mode.utils.objects import cached_property
from mode.utils.queues import FlowControlEvent

GAP_SEEKS = 3  # seeks back to one gap before asking the broker whether its records are gone
GAP_BACKOFF_S = 0.05  # between seeks after that, so a stuck gap does not spin
UNSETTLED_BACKOFF_S = 0.01  # before fetching a held partition again
UNSETTLED_LOG_S = 5.0  # at most one "holding" log line per partition this often
PREFETCH_BACKOFF_S = 0.005  # aiokafka's default is 0.1 (see the module docstring)


class _ConsumerThread(driver.AIOKafkaConsumerThread):
    async def on_start(self) -> None:
        await super().on_start()
        # not a constructor argument of AIOKafkaConsumer: set on the fetcher it just built
        self._ensure_consumer()._fetcher._prefetch_backoff = PREFETCH_BACKOFF_S

    def topic_partitions(self, topic: str) -> int | None:
        """None ("not known yet") instead of 0 for a topic missing from the group's metadata
        snapshot: faust compares a table's changelog partitions with its source topic's
        and crashes the agent on 0 when the changelog was created after the snapshot. The
        worker's preflight has already checked both counts."""
        return super().topic_partitions(topic) or None

    async def _fetch_records(self, consumer: AIOKafkaConsumer, active_partitions: Any,
                             timeout: float | None = None,
                             max_records: int | None = None) -> Any:
        records = await super()._fetch_records(consumer, active_partitions, timeout=timeout,
                                               max_records=max_records)
        # on this thread, before any seek can run: where the batch left each partition
        self.fetched_to = {tp: _position(consumer, tp) for tp in records}
        return records

    async def refetch(self, tp: Any, offset: int) -> bool:
        """Seek `tp` back to `offset`, a record of the last batch that was not delivered,
        unless the partition was sought since that batch (by a rebalance, table recovery):
        then that seek says where to read, and seeking back would undo it."""
        return bool(await self.call_thread(self._refetch, tp, offset))

    async def _refetch(self, tp: Any, offset: int) -> bool:
        consumer = self._ensure_consumer()
        at = _position(consumer, tp)
        if at is None or at != getattr(self, "fetched_to", {}).get(tp):
            return False
        consumer.seek(tp, offset)
        return True

    async def seek_to_committed(self) -> Mapping[Any, int]:
        return await self.call_thread(self._seek_to_committed_or_beginning)

    async def _seek_to_committed_or_beginning(self) -> Mapping[Any, int]:
        consumer = self._ensure_consumer()
        committed = dict(await consumer.seek_to_committed())
        changelogs = self.app.tables.changelog_topics  # recovery seeks those itself
        fresh = [tp for tp, off in committed.items() if not off and tp.topic not in changelogs]
        if fresh:
            await consumer.seek_to_beginning(*fresh)
            # faust takes these as the next offsets to deliver: a number, not None ("any")
            committed.update(await consumer.beginning_offsets(fresh))
        return committed


def _position(consumer: AIOKafkaConsumer, tp: Any) -> int | None:
    """The consumer's next fetch offset for `tp`, None when it is not assigned or has no
    position; read without waiting (aiokafka's `position()` waits for one)."""
    subscriptions = consumer._subscription
    if tp not in subscriptions.assigned_partitions():
        return None
    tp_state = subscriptions.subscription.assignment.state_value(tp)
    return tp_state._position if tp_state is not None else None


class _Consumer(driver.Consumer):
    async def getmany(self, timeout: float) -> AsyncIterator[tuple[Any, Any]]:
        """faust's, without its filter: every record fetched is handed to `_drain_messages`,
        marked with the generation current when the fetch returned, and that loop fetches
        again whatever it does not deliver. faust drops such records here and seeks back only
        to committed offsets, which changelog partitions do not have."""
        records, _ = await self._wait_next_records(timeout)
        if records is None or self.should_stop:
            return
        generation = self.app.consumer_generation_id
        for tp, record in self.scheduler.iterate(records):
            self.app.monitor.track_tp_end_offset(tp, self.highwater(tp))
            message = self._to_message(tp, record)
            message.generation_id = generation
            yield tp, message

    def _deliverable(self, tp: Any, message: Any) -> bool:
        """Whether a stream or table recovery may take it now: the flow runs, the record was
        fetched in this generation, and its partition is still being read."""
        return (self.flow_active
                and message.generation_id == self.app.consumer_generation_id
                and (tp in self._get_active_partitions() or tp in self._buffered_partitions))

    def _new_consumer_thread(self) -> driver.AIOKafkaConsumerThread:
        return _ConsumerThread(self, loop=self.loop, beacon=self.beacon)

    async def _seek(self, partition: Any, offset: int) -> None:
        """Seek on the consumer's own thread: from the event loop's, as faust seeks, a fetch
        under way can land past the offset sought."""
        thread = self._thread
        try:
            await thread.call_thread(thread.seek, partition, offset)
        except IllegalStateError:
            pass  # revoked meanwhile: its next owner seeks it to the committed offset

    async def _refetch(self, tp: Any, offset: int) -> None:
        thread = self._thread
        try:
            await thread.refetch(tp, offset)
        except IllegalStateError:
            pass  # revoked meanwhile: its next owner seeks it to the committed offset

    async def _seek_back(self, tp: Any, offset: int) -> None:
        """Refetch from `offset` and expect exactly it next (faust's `seek` would store
        offset 0 as "any offset", and a stale record past the gap would then pass)."""
        await self._seek(tp, offset)
        self._read_offset[tp] = offset

    async def _gone(self, tp: Any, offset: int) -> bool:
        """True if `offset` is before the partition's log start: deleted, not in flight."""
        thread = self._thread
        starts = await thread.call_thread(thread._ensure_consumer().beginning_offsets, [tp])
        return bool(starts.get(tp, 0) > offset)

    def ack(self, message: Any) -> bool:
        """A record a stream skipped unseen (delivered before a rebalance, taken from its
        queue after it) reaches here untracked: it is not done, so it is not acked, and the
        seek to the committed offset after the rebalance fetches it again."""
        if not message.tracked:
            return False
        return bool(super().ack(message))

    def _new_offset(self, tp: Any) -> int | None:
        """faust's own check lets one missing record at the head pass (min(acked) - committed
        > 1, where committed is already the next offset) and none at all when the committed
        offset is 0 or unknown; a record missing at the head holds the commit back here."""
        acked = self._acked[tp]
        if acked and min(acked) > (self._committed_offset[tp] or 0):
            return None
        return cast(int | None, super()._new_offset(tp))

    async def _drain_messages(self, fetcher: Any) -> None:  # pragma: no cover - runs in faust
        """faust's loop (faust/transport/consumer.py), changed as the module docstring says."""
        read_offset = self._read_offset
        commit_every = self._commit_every
        acks_enabled_for = self.app.topics.acks_enabled_for  # False for compacted changelogs
        sought: dict[Any, tuple[int, int]] = {}  # partition -> (gap offset, seeks back to it)
        waited: dict[Any, float] = {}  # partition -> when a hold on it was last logged
        num_since_yield = 0
        try:
            while not (self._stopped.is_set() or fetcher._stopped.is_set()):
                self.diag.set_flag(CONSUMER_FETCHING)
                batch = self.getmany(timeout=1.0)
                await self.sleep(0)
                if self.should_stop:
                    continue
                resync: set[Any] = set()  # partitions sought back: the rest of the batch is stale
                unsettled = False
                async for tp, message in batch:
                    if tp in resync:
                        continue
                    num_since_yield += 1
                    if num_since_yield > 100:
                        await asyncio.sleep(0)
                        num_since_yield = 0
                    offset, expected = message.offset, read_offset.get(tp)
                    acking = acks_enabled_for(tp.topic)
                    if not self._deliverable(tp, message) or (acking and expected is None):
                        # a rebalance is under way (a stream would skip the record and ack it
                        # unseen; table recovery would wait for it forever), its partition was
                        # paused meanwhile, or a stream partition's position is unknown until
                        # the rebalance's seek: fetch it again, from here
                        now = time.monotonic()
                        if now - waited.get(tp, 0.0) > UNSETTLED_LOG_S:
                            waited[tp] = now
                            self.log.info("holding %r at %r: next offset %r, generation %r/%r",
                                          tp, offset, expected, message.generation_id,
                                          self.app.consumer_generation_id)
                        await self._refetch(tp, offset)
                        resync.add(tp)
                        unsettled = True
                        continue
                    # _read_offset holds the next offset to deliver, as faust's seeks set it
                    if expected is not None and offset < expected:
                        continue  # delivered already: a refetch after a seek
                    if expected is not None and offset > expected and acking:
                        gap, tries = sought.get(tp, (-1, 0))
                        tries = tries + 1 if gap == expected else 1
                        # a fetch that was under way at the seek can land past the gap again;
                        # the records are skipped only once the broker says they are gone
                        # (retention, a reset to earliest), never because seeks ran out
                        if tries <= GAP_SEEKS or not await self._gone(tp, expected):
                            self.log.warning("offset gap on %r (%r -> %r): seeking back", tp,
                                             expected, offset)
                            sought[tp] = (expected, tries)
                            if tries > GAP_SEEKS:
                                await asyncio.sleep(GAP_BACKOFF_S)
                            await self._seek_back(tp, expected)
                            resync.add(tp)
                            continue
                    if commit_every is not None and self._n_acked >= commit_every:
                        self._n_acked = 0
                        await self.commit()
                    delivery = self.callback(message)
                    res = await self.wait_first(delivery, self.suspend_flow.wait())
                    if delivery not in res.done:
                        # the flow stopped mid-delivery; the check above does the same for the
                        # rest of the batch
                        await self._refetch(tp, offset)
                        resync.add(tp)
                        unsettled = True
                        continue
                    read_offset[tp] = offset + 1
                self.diag.unset_flag(CONSUMER_FETCHING)
                if unsettled:
                    await asyncio.sleep(UNSETTLED_BACKOFF_S)
        except self.consumer_stopped_errors:
            if self.transport.app.should_stop:
                return
            raise
        except asyncio.CancelledError:
            if self.transport.app.should_stop:
                return
            raise
        except Exception as exc:
            self.log.exception("Drain messages raised: %r", exc)
            raise
        finally:
            self.diag.unset_flag(CONSUMER_FETCHING)


class _Transport(driver.Transport):
    Consumer = _Consumer


class _FlowControl(FlowControlEvent):
    def resume(self) -> None:
        """Resume a suspended flow, and clear the stream queues of what was delivered before the
        suspension (faust's); a flow that runs already is left as it is, queues included."""
        if not self.is_active():
            super().resume()


class WorkerApp(faust.App):
    """faust.App with the consumer above; everything else is configured by the caller.

    `agent_crashed`, when set, hears of every agent crash before faust restarts the agent
    (the worker counts them and stops past a limit)."""

    agent_crashed: Callable[[Any, BaseException], Awaitable[None]] | None = None

    async def _on_agent_error(self, agent: Any, exc: BaseException) -> None:
        if self.agent_crashed is not None:
            await self.agent_crashed(agent, exc)
        await super()._on_agent_error(agent, exc)

    def _new_transport(self) -> Any:
        return _Transport(self.conf.broker_consumer, self)

    @cached_property
    def flow_control(self) -> FlowControlEvent:
        return _FlowControl(loop=self.loop)
