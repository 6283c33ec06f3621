"""Idempotent, ordered, retried Avro producer used by the host SDK, the tools and the tests."""

from __future__ import annotations

from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.errors import (
    KafkaConnectionError,
    KafkaTimeoutError,
    NotLeaderForPartitionError,
    RequestTimedOutError,
)
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from mnemoflow.schemas.codec import SchemaRegistry
from mnemoflow.streams.config import Settings

TRANSIENT = (KafkaConnectionError, KafkaTimeoutError, NotLeaderForPartitionError,
             RequestTimedOutError)


class AvroProducer:
    """enable_idempotence keeps a retried send from duplicating and keeps per-partition order."""

    def __init__(self, settings: Settings, bootstrap: str,
                 registry: SchemaRegistry | None = None) -> None:
        from mnemoflow.schemas.codec import default_registry

        self.settings = settings
        self.registry = registry or default_registry()
        self._producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap, enable_idempotence=True, acks="all",
            linger_ms=0, **settings.client_kwargs())

    async def start(self) -> None:
        async for attempt in AsyncRetrying(
            retry=retry_if_exception_type(TRANSIENT), stop=stop_after_attempt(5),
            wait=wait_exponential(multiplier=0.2, max=3), reraise=True,
        ):
            with attempt:
                await self._producer.start()

    async def stop(self) -> None:
        await self._producer.stop()

    async def __aenter__(self) -> AvroProducer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def send_raw(self, topic: str, key: bytes | None, value: bytes,
                       headers: list[tuple[str, bytes]] | None = None,
                       partition: int | None = None) -> Any:
        """Send and wait for the broker's ack, retrying transient errors. `partition`: only
        for records that must sit next to another topic's partition (inbox checkpoints)."""
        async for attempt in AsyncRetrying(
            retry=retry_if_exception_type(TRANSIENT), stop=stop_after_attempt(5),
            wait=wait_exponential(multiplier=0.1, max=2), reraise=True,
        ):
            with attempt:
                return await self._producer.send_and_wait(topic, value, key=key, headers=headers,
                                                          partition=partition)

    async def send(self, topic: str, schema: str, key: str, record: dict[str, Any],
                   headers: list[tuple[str, bytes]] | None = None,
                   partition: int | None = None) -> Any:
        return await self.send_raw(topic, key.encode(), self.registry.encode(schema, record),
                                   headers, partition)
