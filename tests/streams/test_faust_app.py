"""The worker consumer's fetch, ack and commit rules and its flow control
(streams/faust_app.py), on faust's objects.

A record that a stream skips after a rebalance must not count as done, and the commit must
never pass a record missing at the head of what was acked: either one loses a record whose
later neighbours were processed (docs/decisions.md)."""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

from aiokafka.consumer.subscription_state import SubscriptionState
from faust.types import TP
from faust.types.tuples import ConsumerMessage

from mnemoflow.streams.faust_app import WorkerApp, _Consumer, _ConsumerThread

TOPIC = "t.session-events"
PART = TP(TOPIC, 2)


def _consumer(committed: int | None) -> _Consumer:
    """The state faust's ack and commit bookkeeping reads, on a consumer built without I/O."""
    c = object.__new__(_Consumer)
    c.app = SimpleNamespace(topics=SimpleNamespace(acks_enabled_for=lambda t: t == TOPIC))
    c._committed_offset = defaultdict(lambda: None)
    c._committed_offset[PART] = committed
    c._acked = defaultdict(list)
    c._acked_index = defaultdict(set)
    c._gap = defaultdict(lambda: None)
    c._unacked_messages = set()
    c._n_acked = 0
    c._waiting_for_ack = None
    return c


def _message(offset: int, tracked: bool) -> ConsumerMessage:
    m = ConsumerMessage(TOPIC, PART.partition, offset, 0.0, 0, None, b"k", b"v", None)
    m.tracked = tracked
    return m


def test_a_record_the_stream_skipped_unseen_is_not_acked() -> None:
    c = _consumer(committed=58)
    assert not c.ack(_message(58, tracked=False))  # taken from the queue after a rebalance
    assert c._acked[PART] == []
    assert c.ack(_message(58, tracked=True))  # the same record, delivered again and processed
    assert c._acked[PART] == [58]


def test_the_commit_never_passes_a_record_missing_at_the_head() -> None:
    c = _consumer(committed=58)
    assert c.ack(_message(59, tracked=True))
    assert c.ack(_message(60, tracked=True))
    assert c._new_offset(PART) is None  # 58 is not done: faust's own check would commit 61
    assert c.ack(_message(58, tracked=True))
    assert c._new_offset(PART) == 61


def test_a_partition_never_committed_starts_its_commits_at_zero() -> None:
    c = _consumer(committed=None)
    assert c.ack(_message(1, tracked=True))
    assert c._new_offset(PART) is None  # offset 0 was not processed
    assert c.ack(_message(0, tracked=True))
    assert c._new_offset(PART) == 2


class _Fetching:
    """What `_ConsumerThread._refetch` reads of an aiokafka consumer: its real subscription
    state (positions), and the seeks it is asked for."""

    def __init__(self) -> None:
        self._subscription = SubscriptionState()
        self._subscription.assign_from_user({PART})
        self.seeks: list[tuple[TP, int]] = []

    def at(self, offset: int) -> None:
        self._subscription.subscription.assignment.state_value(PART).seek(offset)

    def seek(self, tp: TP, offset: int) -> None:
        self.seeks.append((tp, offset))
        self.at(offset)


def _thread(consumer: _Fetching) -> _ConsumerThread:
    thread = object.__new__(_ConsumerThread)
    thread._ensure_consumer = lambda: consumer  # type: ignore[method-assign]
    return thread


async def test_a_record_not_delivered_is_fetched_again_from_it() -> None:
    consumer = _Fetching()
    consumer.at(6)  # a batch of offsets 0..5 came back: the fetch left the partition at 6
    thread = _thread(consumer)
    thread.fetched_to = {PART: 6}
    assert await thread._refetch(PART, 0)
    assert consumer.seeks == [(PART, 0)]


async def test_a_seek_since_the_fetch_is_not_undone() -> None:
    """Table recovery (or the rebalance) sought the partition after the batch came back:
    seeking back to the batch's record would skip what that seek asked for."""
    consumer = _Fetching()
    thread = _thread(consumer)
    thread.fetched_to = {PART: 26}  # the batch held 20..25
    consumer.at(3)  # recovery: read from 3
    assert not await thread._refetch(PART, 20)
    assert consumer.seeks == []
    assert not await thread._refetch(TP(TOPIC, 3), 0)  # not assigned here


def test_a_record_is_deliverable_only_in_its_generation_while_the_flow_runs() -> None:
    c = object.__new__(_Consumer)
    c.app = SimpleNamespace(consumer_generation_id=4)
    c.flow_active = True
    c._active_partitions = {PART}
    c._paused_partitions = set()
    c._buffered_partitions = set()
    m = _message(7, tracked=False)
    m.generation_id = 4
    assert c._deliverable(PART, m)
    c.app.consumer_generation_id = 5  # fetched before the rebalance, handed on after it
    assert not c._deliverable(PART, m)
    c.app.consumer_generation_id = 4
    c.flow_active = False  # the rebalance has begun
    assert not c._deliverable(PART, m)
    c.flow_active = True
    c._active_partitions = set()  # paused meanwhile
    assert not c._deliverable(PART, m)


async def test_resuming_a_running_flow_keeps_what_the_streams_were_given() -> None:
    """Table recovery resumes the flow twice in one rebalance; faust's second resume emptied
    the stream queues of records delivered after the seek to the committed offsets, so one
    was never processed while the next one was (the SIGKILL scale test, docs/decisions.md)."""
    app = WorkerApp("flow-test", broker="kafka://127.0.0.1:1")
    queue = app.channel().queue  # a stream's queue, managed by the app's flow control
    app.flow_control.resume()  # recovery, to read the changelogs
    queue.put_nowait("offset 30")  # delivered after the seek to the committed offset
    app.flow_control.resume()  # recovery, done
    assert queue.qsize() == 1
    app.flow_control.suspend()  # a rebalance: what was delivered before it is stale
    app.flow_control.resume()
    assert queue.qsize() == 0
