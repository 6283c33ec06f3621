"""Reading topics back: decode every record of a topic, or wait for records that match."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from mnemoflow.schemas.codec import DecodeError, SchemaRegistry, default_registry
from mnemoflow.streams.config import Settings
from mnemoflow.streams.keyring_slot import KeyringSlot

if TYPE_CHECKING:
    from mnemoflow.streams.keyring import Keyring


@dataclass(frozen=True)
class Record:
    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: dict[str, Any] | None
    error: str | None = None


def _sealed(value: dict[str, Any]) -> bool:
    """A memory event, or an inbox op whose packet has an item, sealed."""
    packet = value.get("packet")
    return bool(value.get("sealed")) or (isinstance(packet, dict) and any(
        i.get("sealed") for i in packet.get("items") or ()))


async def topic_partitions(consumer: AIOKafkaConsumer, topic: str,
                           attempts: int = 50) -> list[TopicPartition]:
    """The partitions of `topic`, refreshing metadata until the broker knows it."""
    for _ in range(attempts):
        parts = consumer.partitions_for_topic(topic)
        if parts:
            return [TopicPartition(topic, p) for p in sorted(parts)]
        await consumer._client.force_metadata_update()
        await asyncio.sleep(0.1)
    raise LookupError(f"topic {topic} does not exist")


class TopicReader:
    """A group-less consumer over all partitions of some topics, from the beginning."""

    def __init__(self, settings: Settings, bootstrap: str, topics: list[str],
                 registry: SchemaRegistry | None = None, keyring: Keyring | None = None) -> None:
        """Memory events come back in the clear (`keyring`, or one made when the first sealed
        one is read); one whose key is shredded comes back with error `key-shredded`."""
        self.settings, self.bootstrap = settings, bootstrap
        self._keyring = KeyringSlot(settings, bootstrap, keyring)
        self.registry = registry or default_registry()
        self.topics = topics
        self._c = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                                   enable_auto_commit=False, auto_offset_reset="earliest",
                                   **settings.client_kwargs())
        self.records: list[Record] = []

    async def __aenter__(self) -> TopicReader:
        await self._c.start()
        try:
            tps = []
            for t in self.topics:
                tps += await topic_partitions(self._c, t)
            self._c.assign(tps)
            await self._c.seek_to_beginning(*tps)
        except BaseException:  # a missing topic: the consumer must not outlive the error
            await self._c.stop()
            raise
        self._tps = tps
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._c.stop()
        await self._keyring.stop()

    async def poll(self, timeout_ms: int = 200) -> list[Record]:
        batch = await self._c.getmany(timeout_ms=timeout_ms, max_records=5000)
        new = []
        for tp, msgs in batch.items():
            for m in msgs:
                try:
                    name, val = self.registry.decode(m.value)
                    if self.settings.seal and _sealed(val):
                        val = await self.keys().open_value(name, val)
                    rec = Record(tp.topic, tp.partition, m.offset, m.timestamp, m.key, val,
                                 None if val is not None else "key-shredded")
                except DecodeError as exc:
                    rec = Record(tp.topic, tp.partition, m.offset, m.timestamp, m.key, None,
                                 exc.reason)
                new.append(rec)
        self.records.extend(new)
        return new

    def keys(self) -> Keyring:
        """This reader's keyring (made on first use)."""
        return self._keyring.get()

    async def drain(self) -> list[Record]:
        """Everything up to the end offsets as of now."""
        ends = await self._c.end_offsets(self._tps)
        while True:
            behind = [tp for tp, end in ends.items() if await self._c.position(tp) < end]
            if not behind:
                return self.records
            await self.poll(100)

    async def wait_for(self, predicate: Callable[[list[Record]], bool],
                       timeout: float = 30.0) -> list[Record]:
        """Poll until `predicate(all records so far)` holds; raise TimeoutError otherwise."""
        deadline = time.monotonic() + timeout
        while not predicate(self.records):
            if time.monotonic() > deadline:
                raise TimeoutError(f"condition not met in {timeout}s on {self.topics}")
            await self.poll(200)
        return self.records
