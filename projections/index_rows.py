"""What every memory index means, whichever backend holds it: the kind families, the model an
index was built with, the visibility of a row to a search, and the merge order of hits.

`vector_index.VectorIndex` (LanceDB) and `array_index.ArrayIndex` (in memory) implement
`MemoryIndex` with these semantics; this module imports neither backend.
"""

from __future__ import annotations

from collections.abc import KeysView, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

FAMILIES: dict[str, tuple[str, ...]] = {
    "episodes": ("segment", "episode"), "facts": ("fact",), "procedures": ("procedure",),
    "aliases": ("alias",),
}
FAMILY_OF = {kind: fam for fam, kinds in FAMILIES.items() for kind in kinds}
# aliases have no MemoryStore record to become a Candidate, so recall does not search them
RECALL_FAMILIES = ("episodes", "facts", "procedures")

Hits = list[tuple[str, float]]


@dataclass(frozen=True)
class IndexMeta:
    model: str
    dim: int
    version: str

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "dim": self.dim, "version": self.version}

    def schema_metadata(self) -> dict[str, str]:
        return {f"mnemoflow.{k}": str(v) for k, v in self.to_json().items()}


class MemoryIndex(Protocol):
    """What the vector tier and sink need of an index: vector_index.VectorIndex (LanceDB) and
    array_index.ArrayIndex (in memory) both are one, with the semantics VectorIndex documents."""

    meta: IndexMeta

    @property
    def ids(self) -> KeysView[str]: ...

    def __len__(self) -> int: ...

    async def add(self, rows: list[dict[str, Any]], vectors: np.ndarray) -> None: ...

    async def revoke(self, memory_id: str) -> None: ...

    async def vector(self, memory_id: str) -> np.ndarray | None: ...

    async def search(self, vector: np.ndarray, chain: frozenset[tuple[str, str]], before_ms: int,
                     k: int, window: tuple[int, int] | None = None,
                     families: tuple[str, ...] = RECALL_FAMILIES) -> Hits: ...

    async def text_search(self, query: str, chain: frozenset[tuple[str, str]], before_ms: int,
                          k: int, window: tuple[int, int] | None = None,
                          families: tuple[str, ...] = RECALL_FAMILIES) -> Hits: ...

    async def optimize(self) -> None: ...


def family_of(kind: str) -> str:
    """The table a kind of memory lives in; ValueError for a kind no table holds."""
    try:
        return FAMILY_OF[kind]
    except KeyError:
        raise ValueError(f"no table for kind {kind!r}") from None


def last_of_each_id(rows: list[dict[str, Any]]) -> list[int]:
    """Positions of the rows an add writes: one per memory id, the last given (re-adding an
    id replaces it, within one call too), in the order given. Every kind is checked first,
    so a bad row writes nothing."""
    for r in rows:
        family_of(r["kind"])
    return sorted({r["memory_id"]: i for i, r in enumerate(rows)}.values())


def visible(event_time: int, expires_at: int, before_ms: int,
            window: tuple[int, int] | None = None) -> bool:
    """Existed before `before_ms`, not expired by then (expires_at 0: never), in the window."""
    return event_time < before_ms and (expires_at == 0 or expires_at > before_ms) and (
        window is None or window[0] <= event_time < window[1])


def merge(parts: list[Hits], k: int) -> Hits:
    """Best first across tables; equal scores ordered by memory id (deterministic)."""
    return sorted((h for p in parts for h in p), key=lambda h: (-h[1], h[0]))[:k]


class HeldRows:
    """`ids` and `len` of an index, read from its in-memory map of rows by memory id (no I/O)."""

    _rows: Mapping[str, Any]

    @property
    def ids(self) -> KeysView[str]:
        """Memory ids held (a live view: the sink asks it to skip what is already embedded)."""
        return self._rows.keys()

    def __len__(self) -> int:
        return len(self._rows)
