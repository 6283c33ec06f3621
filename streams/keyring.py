"""The owner keys of one process: the memory-keys topic read whole, proposals, sealing, forgets.

`agents.sealing` holds the rules; this is the I/O around them. Every process that writes or
reads memory text (worker, host, gateway, console, commands) holds one `Keyring`. A record is
only ever sealed with a key that is already on memory-keys, so a reader that meets an unknown
key id reads the topic to its end once: if the key is still not there, it was shredded.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from mnemoflow.agents import sealing
from mnemoflow.schemas.codec import DecodeError, SchemaRegistry, default_registry
from mnemoflow.streams import topics as T
from mnemoflow.streams.config import ConfigError, Settings
from mnemoflow.streams.producer import AvroProducer
from mnemoflow.streams.reader import topic_partitions

log = logging.getLogger("mnemoflow.keyring")
SCHEMA = "io.mnemoflow.OwnerKey"
FRESH_S = 1.0  # how old the fold may be when a record is sealed or opened
MEMORY_EVENT = "io.mnemoflow.MemoryEvent"
INBOX_OP = "io.mnemoflow.InboxOp"


def load_kek(path: Path) -> bytes:
    """The key-encryption key, created (32 random bytes, mode 0600) if there is none yet. Two
    processes creating it at once agree: only one create succeeds, the other reads it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass
    else:
        with os.fdopen(fd, "wb") as f:
            f.write(os.urandom(sealing.KEY_LEN))
            f.flush()
            os.fsync(f.fileno())
    for _ in range(50):  # a creator between its open and its write
        kek = path.read_bytes()
        if len(kek) == sealing.KEY_LEN:
            return kek
        time.sleep(0.01)
    raise ConfigError(f"{path} is not a key-encryption key ({sealing.KEY_LEN} bytes expected)")


class Keyring:
    """memory-keys folded (`sealing.OwnerKeys`), with a producer for proposals and forgets."""

    def __init__(self, settings: Settings, bootstrap: str,
                 registry: SchemaRegistry | None = None) -> None:
        self.settings = settings
        self.bootstrap = bootstrap
        self.registry = registry or default_registry()
        self.kek = load_kek(settings.kek_path)
        self.kek_id = sealing.kek_id(self.kek)
        self.keys = sealing.OwnerKeys()
        self.topic = T.MEMORY_KEYS.name(settings)
        self.tp = TopicPartition(self.topic, 0)
        self.shredded_reads = 0  # sealed records met whose key is gone
        self._consumer: AIOKafkaConsumer | None = None
        self._producer: AvroProducer | None = None
        self._reading = asyncio.Lock()
        self._proposing = asyncio.Lock()
        self._unwrapped: dict[str, bytes] = {}
        self._started = asyncio.Lock()
        self._read_at = 0.0  # monotonic time of the last read to the end

    async def start(self) -> Keyring:
        async with self._started:
            if self._consumer is not None:
                return self
            c = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, group_id=None,
                                 enable_auto_commit=False, auto_offset_reset="earliest",
                                 **self.settings.client_kwargs())
            await c.start()
            try:
                await topic_partitions(c, self.topic, attempts=100)
                c.assign([self.tp])
                await c.seek_to_beginning(self.tp)
            except BaseException:
                await c.stop()
                raise
            self._consumer = c
        await self.catch_up()
        return self

    async def stop(self) -> None:
        if self._consumer is not None:
            await self._consumer.stop()
            self._consumer = None
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None

    async def _writer(self) -> AvroProducer:
        """The producer for proposals and forgets, started on first use: a process that only
        opens records never needs one."""
        if self._producer is None:
            producer = AvroProducer(self.settings, self.bootstrap, self.registry)
            await producer.start()
            self._producer = producer
        return self._producer

    async def catch_up(self) -> None:
        """Fold memory-keys up to its end as of now."""
        c = self._consumer
        if c is None:
            await self.start()
            return
        async with self._reading:
            asked = time.monotonic()
            end = (await c.end_offsets([self.tp]))[self.tp]
            while await c.position(self.tp) < end:
                batch = await c.getmany(self.tp, timeout_ms=200, max_records=5000)
                for m in batch.get(self.tp, []):
                    self._apply(m.offset, m.key, m.value)
            self._read_at = asked

    def _apply(self, offset: int, key: bytes | None, raw: bytes | None) -> None:
        if key is None:
            return
        value = None
        if raw is not None:
            try:
                _, value = self.registry.decode(raw, SCHEMA)
            except DecodeError as exc:
                log.warning("memory-keys@%d skipped: %s", offset, exc)
                return
        rk = key.decode("utf-8", "replace")
        self.keys.apply(offset, rk, value)
        if value is None:
            self._unwrapped.pop(rk, None)

    async def tail(self, interval_s: float = 1.0) -> None:
        """Keep folding: a long-running process notices a shredded key within about this."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.catch_up()
            except Exception as exc:  # the broker away: the next round tries again
                log.warning("memory-keys not read: %r", exc)

    # ------------------------------------------------------------------------ keys

    def _data_key(self, key_id: str) -> bytes | None:
        entry = self.keys.keys.get(key_id)
        if entry is None:
            return None
        if key_id not in self._unwrapped:
            value = entry[1]
            if value["kekId"] != self.kek_id:
                raise sealing.SealError(
                    f"the key {key_id!r} was wrapped by another key-encryption key "
                    f"({value['kekId']}, this process has {self.kek_id}): give every process "
                    f"of the deployment the same MNEMOFLOW_KEK_FILE")
            self._unwrapped[key_id] = sealing.unwrap(self.kek, key_id, value["wrappedKey"])
        return self._unwrapped[key_id]

    async def _current(self, owner: str) -> tuple[str, bytes]:
        await self._fresh(False)  # a forget ends the epoch: never seal with a shredded key
        cur = self.keys.current(owner)
        if cur is None:
            async with self._proposing:
                await self.catch_up()
                while (cur := self.keys.current(owner)) is None:
                    await self._propose(owner)
        key = self._data_key(cur[0])
        assert key is not None
        return cur[0], key

    async def _propose(self, owner: str) -> None:
        """Append a key for the owner's open epoch and read the topic back: of the proposals
        of that epoch, the first one on the topic is the key."""
        producer = await self._writer()
        rk, value = sealing.key_proposal(self.kek, owner, self.keys.epoch(owner),
                                         uuid.uuid4().hex, os.urandom(sealing.KEY_LEN),
                                         os.urandom(sealing.NONCE_LEN), int(time.time() * 1000))
        await producer.send(self.topic, SCHEMA, rk, value, partition=0)
        await self.catch_up()

    # ------------------------------------------------------------------------ records

    async def seal(self, ev: dict[str, Any]) -> dict[str, Any]:
        """The memory event as it is written: sealed with its owner's key."""
        if not sealing.sealable(ev):
            return ev
        if self._consumer is None:
            await self.start()
        key_id, key = await self._current(str(ev["owner"]))
        return sealing.seal(ev, key_id, key, os.urandom(sealing.NONCE_LEN))

    def needs_catch_up(self, ev: dict[str, Any]) -> bool:
        s = ev.get("sealed")
        return bool(s) and s["keyId"] not in self.keys.keys and s["keyId"] not in \
            self.keys.shredded

    def open_known(self, ev: dict[str, Any]) -> dict[str, Any] | None:
        """The event in the clear, or None when its key is shredded (or was never written) or
        it does not open with its key (damaged: logged); call `catch_up` first when
        `needs_catch_up`. A key of another KEK raises: that is a misconfiguration."""
        s = ev.get("sealed")
        if not s:
            return ev
        key = self._data_key(s["keyId"])
        if key is None:
            self.shredded_reads += 1
            return None
        try:
            return sealing.open_sealed(ev, key)
        except sealing.SealError as exc:
            log.warning("memory event %s skipped: %s", ev.get("eventId"), exc)
            return None

    async def _fresh(self, unknown: bool) -> None:
        """Read the topic on when a key is not known yet, or when it was last read more than
        FRESH_S ago: a long-running reader sees a forget within about that. With the broker
        away, a read for freshness is given up (the next call tries again), and a read for an
        unknown key is tried again until it succeeds, as a consumer waits for its fetch."""
        if self._consumer is not None and not unknown and \
                time.monotonic() - self._read_at <= FRESH_S:
            return
        wait = 0.5
        while True:
            try:
                await self.catch_up()
                return
            except KafkaError as exc:
                if not unknown and self._consumer is not None:
                    log.warning("memory-keys not read (%r): using the keys read %.0f s ago",
                                exc, time.monotonic() - self._read_at)
                    return
                log.warning("memory-keys not read (%r); trying again in %.1f s", exc, wait)
                await asyncio.sleep(wait)
                wait = min(wait * 2, 5.0)

    async def open(self, ev: dict[str, Any]) -> dict[str, Any] | None:
        if ev.get("sealed"):
            await self._fresh(self.needs_catch_up(ev))
        return self.open_known(ev)

    async def open_all(self, events: list[dict[str, Any]]) -> list[dict[str, Any] | None]:
        """Each event opened, with at most one read of the topic for the lot."""
        if any(ev.get("sealed") for ev in events):
            await self._fresh(any(self.needs_catch_up(ev) for ev in events))
        return [self.open_known(ev) for ev in events]

    async def seal_packet(self, packet: dict[str, Any]) -> dict[str, Any]:
        """The packet as the inbox keeps it: each item's text sealed with its owner's key."""
        if self._consumer is None:
            await self.start()
        items = []
        for item in packet["items"]:
            if item.get("sealed"):
                items.append(item)
                continue
            key_id, key = await self._current(str(item["owner"]))
            items.append(sealing.seal_item(item, key_id, key, os.urandom(sealing.NONCE_LEN)))
        return {**packet, "items": items}

    async def open_packet(self, packet: dict[str, Any]) -> dict[str, Any]:
        """The packet in the clear; an item whose key is shredded (a forgotten owner's) is left
        out."""
        sealed = [i.get("sealed") for i in packet["items"]]
        if not any(sealed):
            return packet
        await self._fresh(any(s and s["keyId"] not in self.keys.keys
                              and s["keyId"] not in self.keys.shredded for s in sealed))
        items = []
        for item in packet["items"]:
            s = item.get("sealed")
            if not s:
                items.append(item)
            elif (key := self._data_key(s["keyId"])) is None:
                self.shredded_reads += 1
            else:
                try:
                    items.append(sealing.open_item(item, key))
                except sealing.SealError as exc:
                    log.warning("packet item %s left out: %s", item.get("memoryId"), exc)
        return {**packet, "items": items}

    async def open_value(self, schema: str, value: dict[str, Any]) -> dict[str, Any] | None:
        """A decoded record of any topic in the clear: a memory event (None when its key is
        shredded) or an inbox op's packet; others as they are."""
        if schema == MEMORY_EVENT:
            return await self.open(value)
        if schema == INBOX_OP and value.get("packet"):
            return {**value, "packet": await self.open_packet(value["packet"])}
        return value

    # ------------------------------------------------------------------------ forget

    async def shred(self, owner: str) -> list[str]:
        """End the owner's epoch and tombstone every key of the owner: what they sealed can
        no longer be read, here or anywhere. Returns the shredded key ids."""
        if self._consumer is None:
            await self.start()
        producer = await self._writer()
        async with self._proposing:
            await self.catch_up()
            rk, value = sealing.epoch_end(owner, self.keys.epoch(owner), self.kek,
                                          int(time.time() * 1000))
            await producer.send(self.topic, SCHEMA, rk, value, partition=0)
            await self.catch_up()  # a proposal made before the end is in the fold now
            gone = self.keys.of_owner(owner)
            for key_id in gone:
                await producer.send_raw(self.topic, key_id.encode(), None, partition=0)
            await self.catch_up()
        return gone
