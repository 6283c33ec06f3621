"""A write-behind cache in front of a stage's table, like Kafka Streams' record cache.

A step reads and writes the cached state object; the table (and so its changelog) gets one
write per dirty key per flush, not one per record, and the state is neither decoded nor
encoded per record. The records folded into the cache are acknowledged only when the flush
has written their keys, so an offset is committed only once the state that includes it is
in the table: a crash or a rebalance before the flush redelivers those records to whoever
holds the partition next, which folds them again from the table's older state (every stage
is idempotent), exactly as if the worker had died before processing them.
"""

from __future__ import annotations

from collections.abc import Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

FLUSH_RECORDS = 500  # a flush once this many records wait for their ack
CAPACITY = 20_000  # clean states kept after a flush (the most recently used)


_UNKNOWN = object()  # the table's form of an entry re-added after eviction: always written


class StateLoadError(Exception):
    """The table's stored form of a state does not load: the record's fault."""


@dataclass
class _Entry:
    state: Any
    stored: Any  # what the table holds for the key (its JSON form), to skip unchanged writes
    event: Any = None  # the last record that changed it: its partition is the key's


@dataclass
class StateCache:
    """Live states by key over `table`; `load`/`dump` convert to and from the table's form."""

    table: MutableMapping[str, Any]
    load: Callable[[Any], Any]
    dump: Callable[[Any], Any]
    # writes one key to the table in the context of the record that last changed it (a faust
    # table writes a key to the changelog partition of the record in hand)
    write: Callable[[MutableMapping[str, Any], str, Any, Any], None] | None = None
    capacity: int = CAPACITY
    entries: dict[str, _Entry] = field(default_factory=dict)  # insertion order = recency
    dirty: set[str] = field(default_factory=set)
    unacked: list[Any] = field(default_factory=list)  # events waiting for the next flush
    writes: int = 0  # table writes made (what reached the changelog)
    generation: int = 0  # bumped by `drop`: a step begun before it must not write after it

    def get(self, key: str) -> Any:
        """The live state of `key`. A table error propagates as it is (not the record's
        fault); a stored form that does not load raises StateLoadError."""
        entry = self.entries.pop(key, None)
        if entry is None:
            stored = self.table.get(key)
            try:
                entry = _Entry(self.load(stored), stored)
            except Exception as exc:
                raise StateLoadError(str(exc)) from exc
        self.entries[key] = entry  # most recently used last
        return entry.state

    def put(self, key: str, state: Any, generation: int, event: Any = None) -> None:
        """The state after the record `event`, read at `generation`; the event itself goes
        to `done`."""
        if generation != self.generation:
            return  # read before a rebalance: its record is delivered again
        entry = self.entries.get(key)
        if entry is None:  # evicted by a flush while the step ran: written by the next one
            self.entries[key] = _Entry(state, _UNKNOWN, event)
        else:
            entry.state, entry.event = state, event
        self.dirty.add(key)

    def done(self, event: Any, generation: int) -> None:
        """The record of `event` is processed (its state `put`, or nothing to keep): acked by
        the next flush, once its state is in the table."""
        if generation == self.generation:
            self.unacked.append(event)

    @property
    def due(self) -> bool:
        return len(self.unacked) >= FLUSH_RECORDS

    def flush(self) -> list[Any]:
        """Write every dirty key to the table; the events now safe to ack, in order."""
        for key in sorted(self.dirty):
            entry = self.entries[key]
            dumped = self.dump(entry.state)
            if dumped != entry.stored:
                if self.write is None:
                    self.table[key] = dumped
                else:
                    self.write(self.table, key, dumped, entry.event)
                entry.stored = dumped
                self.writes += 1
            entry.event = None
        self.dirty.clear()
        acks, self.unacked = self.unacked, []
        while len(self.entries) > self.capacity:
            del self.entries[next(iter(self.entries))]
        return acks

    def drop(self) -> None:
        """Forget everything unflushed (a rebalance): those records are delivered again and
        folded from the table's state, which never saw them."""
        self.entries.clear()
        self.dirty.clear()
        self.unacked.clear()
        self.generation += 1
