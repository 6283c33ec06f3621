"""Idempotent, ordered, retried Avro producer used by the host SDK, the tools and the tests.

Every wait on the broker is bounded (`timeout_s`, retries included): a host calling during an
outage gets BrokerUnavailable after that long, not a send that blocks until the broker is
back. The host SDK checks the topics it uses once, at start (`present_topics`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import (
    InvalidProducerEpoch,
    KafkaError,
    KafkaTimeoutError,
    OutOfOrderSequenceNumber,
)
from tenacity import AsyncRetrying, retry_if_exception, stop_after_delay, wait_exponential
from tenacity.wait import wait_base

from mnemoflow.schemas.codec import SchemaRegistry
from mnemoflow.streams.config import Settings
from mnemoflow.streams.keyring_slot import KeyringSlot

if TYPE_CHECKING:
    from mnemoflow.streams.keyring import Keyring

log = logging.getLogger(__name__)

T = TypeVar("T")

BROKER_TIMEOUT_S = 30.0  # longest a host call waits for the broker, retries included
CREATE_HINT = "run `mnemoflow topics create`"
# an idempotent session the broker no longer accepts: only a new producer id helps
BROKEN_SESSION = (OutOfOrderSequenceNumber, InvalidProducerEpoch)
MEMORY_EVENT = "io.mnemoflow.MemoryEvent"
RECHECK_S = 1.0  # how long a missing topic is looked for again before it counts as missing


class BrokerUnavailable(KafkaError):
    """The broker did not answer a host call within its bound; the message is one line naming
    the bootstrap address, what waited, for how long, and the last client error.

    A record whose send timed out may still be written once the broker is back: the
    idempotent producer keeps it queued (its retries never duplicate it) until it is
    acknowledged or the producer stops. A KafkaError, so handlers of client errors see it."""

    retriable = False  # the retries already happened within the bound

    @classmethod
    def after(cls, bootstrap: str, what: str, started: float,
              last: BaseException | None = None) -> BrokerUnavailable:
        why = f" (last error: {type(last).__name__}: {last})" if last is not None else ""
        return cls(f"Kafka at {bootstrap} unavailable: {what} got no answer in "
                   f"{time.monotonic() - started:.1f}s{why}".replace("\n", " "))


class TopicsMissing(LookupError):
    """Topics a host uses do not exist; the message is one line naming them and the fix."""

    def __init__(self, bootstrap: str, names: list[str]) -> None:
        super().__init__(f"{len(names)} topic(s) missing on {bootstrap}: {', '.join(names)}; "
                         f"{CREATE_HINT}")
        self.names = names


class SessionReplaced(KafkaError):
    """The send failed on a broken idempotent session, which was replaced: send again."""

    retriable = True


def transient(exc: BaseException) -> bool:
    """Worth retrying within the bound: what aiokafka marks retriable (a leader election,
    a broker restarting, replicas not yet in sync, stale metadata) and its own timeouts."""
    return isinstance(exc, KafkaError) and not isinstance(exc, BrokerUnavailable) and (
        exc.retriable or isinstance(exc, KafkaTimeoutError))


@contextlib.asynccontextmanager
async def within(bootstrap: str, what: str, timeout_s: float) -> AsyncIterator[None]:
    """The block, cancelled after `timeout_s` with BrokerUnavailable."""
    started = time.monotonic()
    try:
        async with asyncio.timeout(timeout_s):
            yield
    except TimeoutError as exc:
        raise BrokerUnavailable.after(bootstrap, what, started) from exc


async def bounded(bootstrap: str, what: str, timeout_s: float, call: Callable[[], Awaitable[T]],
                  wait: wait_base | None = None) -> T:
    """`call()`, retried on transient errors, all within `timeout_s`; BrokerUnavailable past
    it. Other errors are raised as they are."""
    started = time.monotonic()
    last: BaseException | None = None
    try:
        async with asyncio.timeout(timeout_s):
            async for attempt in AsyncRetrying(
                retry=retry_if_exception(transient), stop=stop_after_delay(timeout_s),
                wait=wait or wait_exponential(multiplier=0.1, max=2), reraise=True,
            ):
                with attempt:
                    try:
                        return await call()
                    except KafkaError as exc:
                        last = exc
                        raise
    except TimeoutError as exc:
        raise BrokerUnavailable.after(bootstrap, what, started, last) from exc
    except KafkaError as exc:
        if transient(exc):  # retried until the bound left no time for another attempt
            raise BrokerUnavailable.after(bootstrap, what, started, exc) from exc
        raise
    raise AssertionError("unreachable: tenacity returns or raises")  # pragma: no cover


async def present_topics(settings: Settings, bootstrap: str, names: Iterable[str],
                         timeout_s: float = BROKER_TIMEOUT_S) -> set[str]:
    """Which of `names` exist, from one listing of the cluster's topics. Not a metadata
    request naming them: on a cluster with auto-create on, that would create them, with the
    broker's default partition count."""
    async def listed() -> set[str]:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap,
                                    request_timeout_ms=max(1000, int(timeout_s * 1000)),
                                    **settings.client_kwargs())
        try:
            await admin.start()
            return set(await admin.list_topics())
        finally:
            await admin.close()

    have = await bounded(bootstrap, "listing topics", timeout_s, listed,
                         wait_exponential(multiplier=0.2, max=3))
    return {n for n in names if n in have}


async def require_topics(settings: Settings, bootstrap: str, names: list[str],
                         timeout_s: float = BROKER_TIMEOUT_S) -> None:
    """TopicsMissing naming every one of `names` that does not exist."""
    have = await present_topics_settled(settings, bootstrap, names, timeout_s)
    missing = [n for n in names if n not in have]
    if missing:
        raise TopicsMissing(bootstrap, missing)


async def present_topics_settled(settings: Settings, bootstrap: str, names: list[str],
                                 timeout_s: float = BROKER_TIMEOUT_S) -> set[str]:
    """`present_topics`, asked again for a moment while some are missing: a broker lists a
    topic created a moment ago (`mnemoflow topics create` just before the host starts) only
    once its metadata has caught up with the controller's."""
    deadline = time.monotonic() + RECHECK_S
    while True:
        have = await present_topics(settings, bootstrap, names, timeout_s)
        if len(have) == len(set(names)) or time.monotonic() > deadline:
            return have
        await asyncio.sleep(0.2)


class AvroProducer:
    """enable_idempotence keeps a retried send from duplicating and keeps per-partition order.

    `timeout_s` bounds start, every send (its retries included) and the flush at stop."""

    def __init__(self, settings: Settings, bootstrap: str,
                 registry: SchemaRegistry | None = None,
                 timeout_s: float | None = None, keyring: Keyring | None = None) -> None:
        """`keyring`: seals memory events (one is made when the first is sent and
        settings.seal holds; a caller that has one passes it)."""
        from mnemoflow.schemas.codec import default_registry

        self.settings = settings
        self._keyring = KeyringSlot(settings, bootstrap, keyring, registry)
        self.bootstrap = bootstrap
        self.registry = registry or default_registry()
        self.timeout_s = timeout_s = settings.host_timeout_s if timeout_s is None else timeout_s
        self._producer = self._new_producer()
        self._generation = 0  # bumped each time a broken idempotent session is replaced
        self._replacing = asyncio.Lock()

    def _new_producer(self) -> AIOKafkaProducer:
        # the bound is ours (BrokerUnavailable); the client's own waits (metadata, one
        # request) end within it too, and a request that times out is retried with the same
        # sequence number, so it is never written twice
        return AIOKafkaProducer(
            bootstrap_servers=self.bootstrap, enable_idempotence=True, acks="all",
            linger_ms=0, request_timeout_ms=max(1000, int(self.timeout_s * 1000)),
            **self.settings.client_kwargs())

    async def _replace(self, generation: int, exc: KafkaError) -> None:
        """A new idempotent session after the old one broke its sequence. aiokafka fails a
        batch that waited past request_timeout_ms for a partition with no leader (a broker
        restarting) after giving it a sequence number it never sends; the broker then
        refuses every later batch of that partition as out of order, for as long as the
        producer lives (aiokafka issue 1017). A new producer id starts the sequences anew."""
        async with self._replacing:
            if generation != self._generation:
                return  # another send replaced it already
            log.warning("producer session broken (%s: %s): starting a new one",
                        type(exc).__name__, exc)
            new = self._new_producer()
            try:  # started before it is used: a failed start leaves the old one in place
                await bounded(self.bootstrap, "producer restart", self.timeout_s, new.start,
                              wait_exponential(multiplier=0.2, max=3))
            except BaseException:
                await new.stop()
                raise
            old, self._producer = self._producer, new
            self._generation += 1
            # its queued sends fail retriably: their callers send again on the new producer
            await self._give_up_queued(SessionReplaced(f"replaced after {exc!r}"), old)
            await old.stop()

    async def start(self) -> None:
        await bounded(self.bootstrap, "producer start", self.timeout_s, self._producer.start,
                      wait_exponential(multiplier=0.2, max=3))

    async def flush(self) -> None:
        """Wait until every queued record is acknowledged (BrokerUnavailable past the bound)."""
        await bounded(self.bootstrap, "flush", self.timeout_s, self._producer.flush)

    async def stop(self) -> None:
        """Flush within the bound, then close. Records the broker has not acknowledged by
        then are given up (logged), so a host can always shut down during an outage."""
        try:
            await self.flush()
        except BrokerUnavailable as exc:
            log.warning("producer stopping with records the broker never acknowledged, given "
                        "up: %s", exc)
            await self._give_up_queued(exc)
        await self._producer.stop()
        await self._keyring.stop()

    async def _give_up_queued(self, exc: KafkaError,
                              producer: AIOKafkaProducer | None = None) -> None:
        """Fail every queued record. aiokafka has no call for this (its stop waits for them
        as long as the broker is away), so: end its sender (a request in flight ends within
        request_timeout_ms, the bound), then fail what is left. A batch that was sent and
        re-queued carries a done-callback that removes it from the in-flight set, so it goes
        back there first; otherwise that callback raises."""
        producer = producer or self._producer
        task = producer._sender.sender_task
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait([task], timeout=self.timeout_s + 1)
        acc = producer._message_accumulator
        left = [b for batches in acc._batches.values() for b in batches]
        acc._pending_batches.update(b for b in left if b.retry_count)
        left += acc._pending_batches
        acc.fail_all(exc)
        for batch in left:  # nobody waits for these any more: not unretrieved errors
            for f in (batch.future, batch._drain_waiter, *(f for f, _ in batch._msg_futures)):
                if f.done() and not f.cancelled():
                    f.exception()

    async def __aenter__(self) -> AvroProducer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def send_raw(self, topic: str, key: bytes | None, value: bytes | None,
                       headers: list[tuple[str, bytes]] | None = None,
                       partition: int | None = None) -> Any:
        """Send and wait for the broker's ack, retrying transient errors, within the bound.
        `partition`: only for records that must sit next to another topic's partition
        (inbox checkpoints)."""
        async def once() -> Any:
            generation = self._generation
            try:
                return await self._producer.send_and_wait(topic, value, key=key,
                                                          headers=headers, partition=partition)
            except BROKEN_SESSION as exc:
                await self._replace(generation, exc)
                raise SessionReplaced(str(exc)) from exc  # retried on the new producer

        return await bounded(self.bootstrap, f"send to {topic}", self.timeout_s, once)

    async def send(self, topic: str, schema: str, key: str, record: dict[str, Any],
                   headers: list[tuple[str, bytes]] | None = None,
                   partition: int | None = None) -> Any:
        return await self.send_raw(topic, key.encode(),
                                   self.registry.encode(schema, await self.sealed(schema, record)),
                                   headers, partition)

    async def sealed(self, schema: str, record: dict[str, Any]) -> dict[str, Any]:
        """The record as it is written: a memory event sealed with its owner's key."""
        if schema == MEMORY_EVENT and self.settings.seal:
            return await self.keys().seal(record)
        return record

    def keys(self) -> Keyring:
        """This producer's keyring (made on first use)."""
        return self._keyring.get()
