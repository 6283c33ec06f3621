"""The Kafka side of `mnemoflow rebuild`: read the memory-log in fold order, and append to it the
records MEMORY.md gives back (projections/rebuild.py says which, and rebuilds from the log)."""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mnemoflow.agents.partitioning import memory_topic
from mnemoflow.projections.markdown import events_from_markdown
from mnemoflow.projections.rebuild import missing_from_log
from mnemoflow.streams import topics as T
from mnemoflow.streams.config import Settings
from mnemoflow.streams.reader import Record, TopicReader

SCHEMA = "io.mnemoflow.MemoryEvent"
EVENT_KEYS = frozenset({"eventId", "op", "memoryId", "scope", "owner"})


@dataclass(frozen=True)
class Restored:
    recovered: int  # records MEMORY.md describes
    appended: int  # of those, written to the memory-log now
    log_records: int  # memory-log records before the restore


def fold_order(records: Iterable[Record]) -> list[dict[str, Any]]:
    """Each partition in offset order (the order its owners' records were written), the
    partitions merged by record time: what the worker's projector folds, which reads every
    partition in its own order too. Records that are not MemoryEvents are left out, as the
    projector skips them."""
    parts: dict[int, list[Record]] = {}
    for r in records:
        if r.value is not None and EVENT_KEYS <= r.value.keys():
            parts.setdefault(r.partition, []).append(r)
    ordered = [sorted(p, key=lambda r: r.offset) for _, p in sorted(parts.items())]
    # merge compares only the heads, so each partition keeps its own order whatever its times
    return [r.value for r in heapq.merge(*ordered, key=lambda r: r.timestamp)
            if r.value is not None]


async def read_memory_log(settings: Settings, bootstrap: str) -> list[dict[str, Any]]:
    """Every memory-log record there is now, in fold order. TopicsMissing (a LookupError whose
    message names the fix) if the topic does not exist."""
    from mnemoflow.streams.producer import require_topics

    topic = T.MEMORY_LOG.name(settings)
    await require_topics(settings, bootstrap, [topic])  # asked without creating it
    async with TopicReader(settings, bootstrap, [topic]) as reader:
        return fold_order(await reader.drain())


async def append_to_log(settings: Settings, bootstrap: str, events: list[dict[str, Any]]) -> int:
    """Write `events` to the memory-log (or memory-shared) keyed by scope owner, as the worker
    does, one at a time
    and acknowledged, so each owner's partition gets them in the order given. All are
    encoded first: a record the schema refuses (a hand-edited MEMORY.md line) stops the
    restore before anything is written, rather than half-way."""
    from mnemoflow.streams.producer import AvroProducer

    if not events:
        return 0
    async with AvroProducer(settings, bootstrap) as producer:
        encoded = [(settings.topic(memory_topic(ev)), ev["owner"].encode(),
                    producer.registry.encode(SCHEMA, await producer.sealed(SCHEMA, ev)))
                   for ev in events]
        for topic, key, value in encoded:
            await producer.send_raw(topic, key, value)
    return len(events)


async def restore_from_markdown(settings: Settings, bootstrap: str, root: Path) -> Restored:
    """Append to the memory-log what the MEMORY.md files under `root` hold and the log does not
    (same memory ids, event times and fields as the records they were made from). Running it
    again appends nothing."""
    log_events = await read_memory_log(settings, bootstrap)
    recovered = events_from_markdown(root)
    appended = await append_to_log(settings, bootstrap, missing_from_log(recovered, log_events))
    return Restored(len(recovered), appended, len(log_events))
