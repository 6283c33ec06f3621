"""Deterministic ids: the same inputs always give the same id, so reprocessing is idempotent."""

from __future__ import annotations

import hashlib


def stable_id(kind: str, *parts: object, length: int = 24) -> str:
    """`kind:` + a sha256 prefix of the parts; readable kind, collision-safe body."""
    h = hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).hexdigest()[:length]
    return f"{kind}:{h}"


def digest_of(*parts: object) -> str:
    return hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).hexdigest()


class RecentIds:
    """The last `capacity` ids added, as a set: a fold's redelivery guard that does not grow
    with history. A redelivered record comes back soon after the original (a crashed stage's
    outputs, a retried send); one older than the window is applied again."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._ids: dict[str, None] = {}  # insertion-ordered: the oldest is evicted first

    def __contains__(self, item: object) -> bool:
        return item in self._ids

    def __len__(self) -> int:
        return len(self._ids)

    def add(self, item: str) -> None:
        if item in self._ids:
            return
        self._ids[item] = None
        if len(self._ids) > self.capacity:
            del self._ids[next(iter(self._ids))]
