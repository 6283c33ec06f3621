"""M-01 working memory: a per-session ring (cap 32, TTL 15 min of event time), explainable eviction.

Bounded on purpose: an unbounded window turns association into full-corpus RAG.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, fields, replace
from typing import Any

# The ring is stored per session in a table whose changelog records Kafka caps at 1 MB, and a
# segment's entities are spans of its text, so a 256 kB URL would be one 256 kB entity. An
# entry therefore keeps at most ENTRY_ENTITIES entities of at most ENTITY_MAX_BYTES each; a
# longer entity is kept as a prefix and a digest of the whole (`ring_entity`), which still
# compares equal only to itself. With the default cap of 32 entries a ring holds at most
# 32 x 16 x 64 B = 32 kB of entity text, under 200 kB as JSON even if every byte needed a
# six-byte escape. The segment itself keeps every entity whole.
ENTITY_MAX_BYTES = 64
ENTITY_PREFIX_BYTES = 40
ENTRY_ENTITIES = 16


def ring_entity(entity: str) -> str:
    """`entity` as the ring stores it: itself if short, else its head and a digest of it.

    Whatever compares a segment's entities with the ring's must map them through this too.
    """
    if len(entity) * 4 <= ENTITY_MAX_BYTES:  # short enough whatever its UTF-8 form
        return entity
    raw = entity.encode("utf-8", "surrogatepass")
    if len(raw) <= ENTITY_MAX_BYTES:
        return entity
    head = raw[:ENTITY_PREFIX_BYTES].decode("utf-8", "ignore")
    return f"{head}#{hashlib.sha256(raw).hexdigest()[:16]}"


def ring_entities(entities: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    return tuple(ring_entity(e) for e in entities[:ENTRY_ENTITIES])


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
        ents = ring_entities(entry.entities)
        if ents != entry.entities:
            entry = replace(entry, entities=ents)
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

