"""Catching the audit store (`projections/audit_store.py`) up with its topics.

A group-less consumer (as `streams/reader.py`'s TopicReader) reads every partition of the
folded topics from the offsets the store holds to the end offsets of the moment the sync
began, and hands each polled batch to the store, which writes the rows and the new offsets
in one transaction. A sync never commits offsets to Kafka: the store's file is the only
record of how far it got.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from aiokafka import AIOKafkaConsumer, TopicPartition

from mnemoflow.projections.audit_store import TOPICS, AuditStore, LogRecord
from mnemoflow.schemas.codec import DecodeError, SchemaRegistry, default_registry
from mnemoflow.streams.config import Settings
from mnemoflow.streams.keyring import Keyring
from mnemoflow.streams.keyring_slot import KeyringSlot
from mnemoflow.streams.producer import require_topics
from mnemoflow.streams.reader import topic_partitions
from mnemoflow.streams.topics import VALUE_SCHEMA

BATCH = 5000  # records per poll, and so per transaction


def store_path(settings: Settings) -> Path:
    """Where `mnemoflow audit` keeps the app's store."""
    return settings.home / "audit" / f"{settings.app_id}.duckdb"


def open_store(settings: Settings, path: Path | None = None) -> AuditStore:
    """The app's store; one folded from another topic prefix is emptied on open."""
    return AuditStore(path or store_path(settings), source=settings.topic_prefix)


@dataclass
class SyncReport:
    records: dict[str, int] = field(default_factory=dict)  # records read, per topic base
    added: dict[str, int] = field(default_factory=dict)  # rows added, per table
    skipped: int = 0  # records that did not decode
    rebuilt: str | None = None  # why the store was emptied first, if it was
    seconds: float = 0.0

    def summary(self) -> str:
        read = sum(self.records.values())
        parts = [f"{read} new record(s)"]
        if read:
            parts.append(", ".join(f"{t} {n}" for t, n in sorted(self.records.items()) if n))
        if self.skipped:
            parts.append(f"{self.skipped} undecodable")
        if self.rebuilt:
            parts.append(f"rebuilt: {self.rebuilt}")
        return f"{'; '.join(parts)} in {self.seconds:.1f}s"


async def sync(store: AuditStore, settings: Settings, bootstrap: str,
               registry: SchemaRegistry | None = None, stall_s: float | None = None,
               rebuild: bool = False, keyring: Keyring | None = None) -> SyncReport:
    """Fold every record written to the topics since the store's offsets, up to the end
    offsets as of now. With `rebuild`, the store is emptied first and folds from offset 0;
    so it is, too, if it holds an offset past a partition's end (the topics were deleted
    and made again, or the broker was reset). Raises TimeoutError if no record arrives for
    `stall_s` (default the host timeout) while some partition is still behind. Memory events
    are folded in the clear (`keyring`, or one made for the sync); those whose key is shredded
    are folded as undecodable (`key-shredded`)."""
    started = time.monotonic()
    report = SyncReport()
    registry = registry or default_registry()
    names = {settings.topic(base): base for base in TOPICS}
    await require_topics(settings, bootstrap, list(names), settings.connect_timeout_s)
    if rebuild:
        store.rebuild()
        report.rebuilt = "asked"
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                                enable_auto_commit=False, auto_offset_reset="earliest",
                                **settings.client_kwargs())
    slot = KeyringSlot(settings, bootstrap, keyring, registry)
    if settings.seal:
        keyring = slot.get()
    await consumer.start()
    try:
        tps: list[TopicPartition] = []
        for name in names:
            tps += await topic_partitions(consumer, name)
        ends = await consumer.end_offsets(tps)
        firsts = await consumer.beginning_offsets(tps)
        stored = store.offsets()
        ahead = [tp for tp in tps if stored.get((names[tp.topic], tp.partition), 0) > ends[tp]]
        if ahead:
            store.rebuild()
            stored = {}
            tp = ahead[0]
            report.rebuilt = (f"{tp.topic}[{tp.partition}] ends before the store's offset "
                              f"(topics made anew?)")
        # what retention already deleted cannot be read; the store keeps what it folded
        behind = {tp: max(stored.get((names[tp.topic], tp.partition), 0), firsts[tp])
                  for tp in tps}
        behind = {tp: pos for tp, pos in behind.items() if pos < ends[tp]}
        consumer.assign(list(behind))
        for tp, pos in behind.items():
            consumer.seek(tp, pos)
        forgets = store.forgets_seen
        await _drain(consumer, store, names, behind, ends, registry, report,
                     settings.host_timeout_s if stall_s is None else stall_s, keyring)
        if store.forgets_seen > forgets and not rebuild:
            # an owner was forgotten: the file is made anew, so that none of the bytes their
            # deleted rows held stay in it (the topics no longer open to their text)
            again = await sync(store, settings, bootstrap, registry, stall_s, rebuild=True,
                               keyring=keyring)
            again.rebuilt = "an owner was forgotten"
            return again
    finally:
        await consumer.stop()
        await slot.stop()
    report.seconds = time.monotonic() - started
    return report


async def _drain(consumer: AIOKafkaConsumer, store: AuditStore, names: dict[str, str],
                 behind: dict[TopicPartition, int], ends: dict[TopicPartition, int],
                 registry: SchemaRegistry, report: SyncReport, stall_s: float,
                 keyring: Keyring | None) -> None:
    last_progress = time.monotonic()
    while behind:
        batch = await consumer.getmany(timeout_ms=500, max_records=BATCH)
        records: list[LogRecord] = []
        for tp, msgs in batch.items():
            base = names[tp.topic]
            for m in msgs:
                try:
                    _, value = registry.decode(m.value, VALUE_SCHEMA[base])
                    records.append(LogRecord(base, tp.partition, m.offset, value))
                except DecodeError as exc:
                    records.append(LogRecord(base, tp.partition, m.offset, None, exc.reason))
                    report.skipped += 1
                report.records[base] = report.records.get(base, 0) + 1
        if keyring is not None:
            records = await _opened(records, keyring)
        if records:
            last_progress = time.monotonic()
            for table, n in store.fold(records).items():
                report.added[table] = report.added.get(table, 0) + n
        for tp in list(behind):
            if await consumer.position(tp) >= ends[tp]:
                del behind[tp]
                consumer.pause(tp)  # read to the end of the sync's moment, no further
        if behind and time.monotonic() - last_progress > stall_s:
            late = ", ".join(f"{tp.topic}[{tp.partition}]" for tp in list(behind)[:3])
            raise TimeoutError(f"audit sync: no record for {stall_s:.0f}s from {late} "
                               f"(still behind its end offset)")


async def _opened(records: list[LogRecord], keyring: Keyring) -> list[LogRecord]:
    """Memory events and packets in the clear (a memory event whose key is shredded is folded
    as undecodable: `key-shredded`)."""
    out = list(records)
    for i, r in enumerate(records):
        if r.value is not None and r.topic in ("memory-log", "memory-shared", "inbox"):
            value = await keyring.open_value(VALUE_SCHEMA[r.topic], r.value)
            out[i] = r._replace(value=value, error=None if value is not None else "key-shredded")
    return out
