"""The host SDK when the broker is away or the topics were never created.

The outage tests run against a broker of their own (a LocalKafka in a temporary home), which
they stall (SIGSTOP) or stop; the shared broker of the session is never touched.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest
from aiokafka.errors import (
    KafkaConnectionError,
    KafkaTimeoutError,
    LeaderNotAvailableError,
    MessageSizeTooLargeError,
    NotEnoughReplicasError,
    NotLeaderForPartitionError,
    OutOfOrderSequenceNumber,
    RequestTimedOutError,
    TopicAuthorizationFailedError,
)
from test_inbox_kafka import _client, _close, _inject, _packet

from mnemoflow.streams import topics as T
from mnemoflow.streams.admin import create_topics
from mnemoflow.streams.config import Settings
from mnemoflow.streams.host import HostClient
from mnemoflow.streams.inbox import InboxClient
from mnemoflow.streams.kafka_local import LocalKafka
from mnemoflow.streams.producer import AvroProducer, BrokerUnavailable, TopicsMissing, transient

from factories import T0
from support import isolated_settings, prepare_topics

BOUND = 3.0  # the host's bound in these tests: small, so an outage test takes seconds
SLACK = 2.5  # scheduling on a loaded 2-core machine


# -- retries (no broker needed) -----------------------------------------------------------------

def test_what_aiokafka_marks_retriable_is_retried_and_nothing_else() -> None:
    for exc in (LeaderNotAvailableError(), NotLeaderForPartitionError(), NotEnoughReplicasError(),
                RequestTimedOutError(), KafkaConnectionError(), KafkaTimeoutError()):
        assert transient(exc), exc
    for exc in (MessageSizeTooLargeError(), TopicAuthorizationFailedError(),
                BrokerUnavailable("gave up already"), ValueError()):
        assert not transient(exc), exc


class _Flaky:
    """Stands in for aiokafka's producer inside AvroProducer: raises `errors`, then acks."""

    def __init__(self, errors: list[Exception]) -> None:
        self.errors = errors
        self.calls = 0

    async def send_and_wait(self, *args: Any, **kw: Any) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "ack"


async def _flaky_producer(errors: list[Exception], timeout_s: float) -> tuple[AvroProducer, _Flaky]:
    producer = AvroProducer(Settings(), "127.0.0.1:9", timeout_s=timeout_s)
    await producer._producer.stop()  # never started: nothing to flush
    producer._producer = flaky = _Flaky(errors)  # type: ignore[assignment]
    return producer, flaky


async def test_a_send_is_retried_through_a_leader_election() -> None:
    producer, flaky = await _flaky_producer([LeaderNotAvailableError(), LeaderNotAvailableError()],
                                            timeout_s=10)
    assert await producer.send_raw("t", b"k", b"v") == "ack" and flaky.calls == 3


async def test_retries_that_outlast_the_bound_end_in_broker_unavailable() -> None:
    producer, flaky = await _flaky_producer([LeaderNotAvailableError()] * 1000, timeout_s=1.0)
    t0 = time.monotonic()
    with pytest.raises(BrokerUnavailable, match=r"127\.0\.0\.1:9 .*send to t.*LeaderNotAvailable"):
        await producer.send_raw("t", b"k", b"v")
    assert time.monotonic() - t0 < 1.0 + SLACK and flaky.calls > 1


# -- topics that were never created -----------------------------------------------------------

def _one_line(exc: BaseException) -> str:
    msg = str(exc)
    assert "\n" not in msg
    return msg


async def test_topics_never_created_fail_at_start_at_once_with_one_line(
        kafka_bootstrap, tmp_path, caplog):
    s = isolated_settings(tmp_path, "never")  # a prefix nobody ran `topics create` for
    caplog.set_level(logging.INFO)
    t0 = time.monotonic()
    with pytest.raises(TopicsMissing) as err:
        async with asyncio.timeout(20):  # without the check: a 40 s metadata wait per send
            async with HostClient(s, kafka_bootstrap, timeout_s=10) as host:
                await host.session("sN", "u").user_message("hello", T0)
    assert time.monotonic() - t0 < 3.0
    msg = _one_line(err.value)
    for spec in (T.SESSION_EVENTS, T.TOOL_RESULTS, T.AGENT_STEPS, T.MEMORY_LOG):
        assert spec.name(s) in msg
    assert "mnemoflow topics create" in msg and kafka_bootstrap in msg

    prod = AvroProducer(s, kafka_bootstrap, timeout_s=10)
    await prod.start()
    try:
        t0 = time.monotonic()
        with pytest.raises(TopicsMissing) as err:
            async with asyncio.timeout(20):
                inbox = InboxClient(s, kafka_bootstrap, prod)
                await inbox.start()
                await inbox.claim_all("sN", T0)
        assert time.monotonic() - t0 < 3.0
        assert T.INBOX.name(s) in _one_line(err.value)
    finally:
        await prod.stop()
    flood = [r for r in caplog.records if r.levelno >= logging.INFO]
    assert len(flood) <= 5, [r.getMessage() for r in flood]


async def test_a_missing_checkpoint_topic_only_turns_checkpoints_off(
        kafka_bootstrap, tmp_path, caplog):
    s = isolated_settings(tmp_path, "nock")
    await create_topics(s, kafka_bootstrap, specs=(T.INBOX,))
    await _inject(s, kafka_bootstrap, [_packet("sK", 1)])
    caplog.set_level(logging.INFO)
    caplog.clear()
    t0 = time.monotonic()
    prod, inbox = await _client(s, kafka_bootstrap)
    try:
        assert time.monotonic() - t0 < 3.0 and not inbox.use_checkpoints
        warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(warned) == 1 and T.INBOX_CHECKPOINTS.name(s) in warned[0], warned
        assert len((await inbox.claim_all("sK", T0)).packets) == 1
    finally:
        await _close(prod, inbox)


# -- outages, on a broker of our own --------------------------------------------------------------

@pytest.fixture(scope="module")
def own_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafka]:
    broker = LocalKafka(Settings(home=tmp_path_factory.mktemp("outage-kafka")))
    broker.up()
    try:
        yield broker
    finally:
        broker.down()


async def _up(broker: LocalKafka, tmp_path, name: str) -> tuple[Settings, str, int]:
    """The broker running (a test before may have stopped it) and fresh topics on it."""
    state = await asyncio.to_thread(broker.up)
    s = isolated_settings(tmp_path, name)
    await prepare_topics(s, state.bootstrap)
    return s, state.bootstrap, state.pid


@pytest.mark.parametrize("written", [True, False], ids=["claim-op-lands-late", "claim-op-lost"])
async def test_a_claim_cut_off_by_an_outage_hands_its_packets_out_once(own_broker, tmp_path,
                                                                       written):
    """The broker stalls between a claim's read and its write: claim_all gives up within
    the bound. The claim op lands when the broker is back (its producer had the topic's
    metadata) or, mostly, never (it was still waiting for it); either way the next claim_all
    hands the packets out, once, and no other claimer gets them."""
    s, bs, pid = await _up(own_broker, tmp_path, "stall")
    await _inject(s, bs, [_packet("sS", n) for n in range(1, 4)])
    prod = AvroProducer(s, bs, timeout_s=BOUND)
    await prod.start()
    inbox = InboxClient(s, bs, prod)
    await inbox.start()
    if written:  # a host that has written an inbox op before knows where the claim goes
        await inbox.remove("sS-warm", [], T0, "warm-up")
    write, stalled = inbox._write, []

    async def stall_before_the_claim(op: dict) -> int:
        if op["op"] == "claim" and not stalled:
            stalled.append(op["opId"])
            os.kill(pid, signal.SIGSTOP)  # the broker stops answering mid-claim
        return await write(op)

    inbox._write = stall_before_the_claim  # type: ignore[method-assign]
    try:
        t0 = time.monotonic()
        with pytest.raises(BrokerUnavailable):
            async with asyncio.timeout(BOUND + 10):  # without a bound: as long as the stall
                await inbox.claim_all("sS", T0)
        assert time.monotonic() - t0 < BOUND + SLACK
    finally:
        os.kill(pid, signal.SIGCONT)
    try:
        got = await inbox.claim_all("sS", T0 + 1)
        assert [p["contextCursor"] for p in got.packets] == [1, 2, 3]
        if written:  # the op was queued behind the stall: it landed and took them
            assert got.claim_ops == tuple(stalled)
        else:  # usually never sent; seen once to land late on a loaded machine (cause not
            # established, see the README's known limits): either op may have taken them
            assert len(got.claim_ops) == 1
        assert (await inbox.claim_all("sS", T0 + 2)).packets == ()
        other = await _client(s, bs)
        try:
            assert (await other[1].claim_all("sS", T0 + 3)).packets == ()
        finally:
            await _close(*other)
    finally:
        await _close(prod, inbox)


async def test_a_send_during_an_outage_raises_broker_unavailable_within_the_bound(
        own_broker, tmp_path):
    s, bs, _ = await _up(own_broker, tmp_path, "outage")
    host = HostClient(s, bs, timeout_s=BOUND)
    await host.start()
    inbox = InboxClient(s, bs, host.producer)
    await inbox.start()
    session = host.session("sO", "u")
    await session.user_message("before the outage", T0)
    await inbox.claim_all("sO", T0)
    await asyncio.to_thread(own_broker.down)
    for what, call in (("send", lambda: session.user_message("during the outage", T0 + 1)),
                       ("claim", lambda: inbox.claim_all("sO", T0 + 2))):
        t0 = time.monotonic()
        with pytest.raises(BrokerUnavailable) as err:
            async with asyncio.timeout(BOUND + 10):  # without a bound: as long as the outage
                await call()
        elapsed = time.monotonic() - t0
        assert elapsed < BOUND + SLACK, (what, elapsed)
        msg = _one_line(err.value)
        assert bs in msg and re.search(r"no answer in \d+\.\ds", msg), msg
    t0 = time.monotonic()
    async with asyncio.timeout(2 * BOUND + 10):  # without a bound: as long as the outage
        await inbox.stop()
        await host.stop()  # the queued record: a flush within the bound, then given up
    assert time.monotonic() - t0 < 2 * BOUND + SLACK


async def test_a_broken_idempotent_session_is_replaced_and_the_send_goes_through(
        monkeypatch) -> None:
    """OutOfOrderSequenceNumber never heals in the producer that got it (aiokafka issue
    1017): the send is made again on a new producer."""
    made: list[_Flaky] = []

    def new_producer(self: AvroProducer) -> Any:
        made.append(_Replaceable([OutOfOrderSequenceNumber()] if not made else []))
        return made[-1]

    monkeypatch.setattr(AvroProducer, "_new_producer", new_producer)
    producer = AvroProducer(Settings(), "127.0.0.1:9", timeout_s=10)
    assert await producer.send_raw("t", b"k", b"v") == "ack"
    assert [p.calls for p in made] == [1, 1]
    assert made[0].stopped and made[1].started


async def test_a_replacement_producer_that_fails_to_start_is_not_used(monkeypatch) -> None:
    """The replacement is started before it is swapped in: a broker still flapping when the
    old session breaks leaves the old producer in place, and the send tries again."""
    made: list[_Replaceable] = []

    def new_producer(self: AvroProducer) -> Any:
        made.append(_Replaceable([OutOfOrderSequenceNumber()] if not made else [],
                                 start_errors=[KafkaConnectionError()] if len(made) == 1 else []))
        return made[-1]

    monkeypatch.setattr(AvroProducer, "_new_producer", new_producer)
    producer = AvroProducer(Settings(), "127.0.0.1:9", timeout_s=10)
    assert await producer.send_raw("t", b"k", b"v") == "ack"
    assert producer._producer is made[1] and made[1].started and made[0].stopped


class _Replaceable(_Flaky):
    """A _Flaky with what AvroProducer touches when it replaces a producer."""

    def __init__(self, errors: list[Exception], start_errors: list[Exception] | None = None
                 ) -> None:
        super().__init__(errors)
        self.start_errors = start_errors or []
        self.started = self.stopped = False
        self._sender = type("Sender", (), {"sender_task": None})()
        self._message_accumulator = type("Acc", (), {
            "_batches": {}, "_pending_batches": set(), "fail_all": lambda self, exc: None})()

    async def start(self) -> None:
        if self.start_errors:
            raise self.start_errors.pop(0)
        self.started = True

    async def stop(self) -> None:
        self.stopped = True


async def test_a_host_keeps_sending_after_the_broker_restarts(own_broker, tmp_path) -> None:
    """Sends that wait out a restart with no partition leader used to leave the host's
    producer refusing every later send with OutOfOrderSequenceNumber, until the host
    restarted (seen in 8 of 8 broker-restart drills of bench/fault_campaign.py)."""
    s, bs, _ = await _up(own_broker, tmp_path, "restart-send")
    producer = AvroProducer(s, bs, timeout_s=BOUND + 1)
    await producer.start()
    topic = T.SESSION_EVENTS.name(s)
    try:
        await producer.send_raw(topic, b"k", b"before")
        stop = asyncio.Event()

        async def pump() -> None:  # the host goes on sending through the outage
            while not stop.is_set():
                try:
                    await producer.send_raw(topic, b"k", b"during")
                except BrokerUnavailable:
                    pass
                await asyncio.sleep(0.3)

        task = asyncio.create_task(pump())
        await asyncio.sleep(0.5)
        await asyncio.to_thread(own_broker.down)
        await asyncio.sleep(BOUND + 2)
        await asyncio.to_thread(own_broker.up)
        await asyncio.sleep(3)
        stop.set()
        await task
        for i in range(5):
            await producer.send_raw(topic, b"k", f"after {i}".encode())
    finally:
        await producer.stop()
