"""M-01 working memory: a per-session ring (cap 32, TTL 15 min of event time), explainable eviction.

Bounded on purpose: an unbounded window turns association into full-corpus RAG.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True)
class RingEntry:
    segment_id: str
    digest: str
    semantic_key: str
    event_time: int
    kind: str
    entities: tuple[str, ...]
    ok: bool | None = None


_ENTRY_FIELDS = tuple(f.name for f in fields(RingEntry))


@dataclass(frozen=True)
class WorkingMemory:
    """Immutable: `push` returns a new ring and the evictions it caused, each with a reason."""

    entries: tuple[RingEntry, ...] = ()
    cap: int = 32
    ttl_ms: int = 15 * 60_000

    def push(self, entry: RingEntry) -> tuple[WorkingMemory, list[tuple[str, str]]]:
        evicted: list[tuple[str, str]] = []
        kept: list[RingEntry] = []
        for e in self.entries:
            if entry.event_time - e.event_time >= self.ttl_ms:
                evicted.append((e.segment_id, "ttl"))
            elif e.digest == entry.digest:
                evicted.append((e.segment_id, "duplicate"))
            else:
                kept.append(e)
        kept.append(entry)
        while len(kept) > self.cap:
            evicted.append((kept.pop(0).segment_id, "capacity"))
        return WorkingMemory(tuple(kept), self.cap, self.ttl_ms), evicted

    def window(self, now_ms: int) -> tuple[RingEntry, ...]:
        """Entries still inside the TTL at event time `now_ms`."""
        return tuple(e for e in self.entries if now_ms - e.event_time < self.ttl_ms)

    def to_json(self) -> list[dict[str, Any]]:
        """Field by field, not `dataclasses.asdict`: this runs twice per event (observer and
        gate state) and asdict's recursive deep copy was half of the stages' CPU time."""
        return [{f: getattr(e, f) for f in _ENTRY_FIELDS} for e in self.entries]

    @classmethod
    def from_json(cls, data: list[dict[str, Any]] | None, cap: int, ttl_ms: int) -> WorkingMemory:
        entries = tuple(
            RingEntry(**{**d, "entities": tuple(d.get("entities", ()))}) for d in (data or [])
        )
        return cls(entries, cap, ttl_ms)

