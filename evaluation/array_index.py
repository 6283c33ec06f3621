"""An in-memory numpy stand-in for `projections.vector_index.VectorIndex` (offline replay only).

Same `add` / `revoke` / `search` / `ids` surface and the same filters (scope chain, revoked,
event time before the request, expiry, optional event-time window), computed as an exact
flat scan like LanceDB below its ANN threshold. Similarities are cosines rounded to 1e-6 as
VectorIndex returns them; equal similarities go by memory id, as there. Rows are grouped by
(scope, owner), so a search touches only the caller's own memories.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class _Group:
    ids: list[str] = field(default_factory=list)
    times: list[int] = field(default_factory=list)
    expires: list[int] = field(default_factory=list)
    vecs: list[np.ndarray] = field(default_factory=list)
    _stacked: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self._stacked is None:
            m = np.stack(self.vecs).astype(np.float32) if self.vecs else np.zeros((0, 1), np.float32)
            norms = np.linalg.norm(m, axis=1) if len(m) else np.zeros(0, np.float32)
            self._stacked = (m / np.where(norms == 0, 1, norms)[:, None],
                             np.asarray(self.times, np.int64), np.asarray(self.expires, np.int64))
        return self._stacked


class ArrayIndex:
    """Exact cosine search over vectors held in memory, grouped by (scope, owner)."""

    def __init__(self) -> None:
        self._groups: dict[tuple[str, str], _Group] = {}
        self._where: dict[str, tuple[str, str]] = {}
        self.ids: set[str] = set()

    def __len__(self) -> int:
        return len(self.ids)

    def add(self, rows: list[dict[str, Any]], vectors: np.ndarray) -> None:
        for r, v in zip(rows, vectors, strict=True):
            if r["memory_id"] in self.ids:
                self.revoke(r["memory_id"])  # idempotent re-add, as VectorIndex does
            key = (r["scope"], r["owner"])
            g = self._groups.setdefault(key, _Group())
            g.ids.append(r["memory_id"])
            g.times.append(int(r["event_time"]))
            g.expires.append(int(r.get("expires_at") or 0))
            g.vecs.append(np.asarray(v, np.float32))
            g._stacked = None
            self._where[r["memory_id"]] = key
            self.ids.add(r["memory_id"])

    def revoke(self, memory_id: str) -> None:
        key = self._where.pop(memory_id, None)
        if key is None:
            return
        g = self._groups[key]
        i = g.ids.index(memory_id)
        for col in (g.ids, g.times, g.expires, g.vecs):
            del col[i]
        g._stacked = None
        self.ids.discard(memory_id)

    def vector(self, memory_id: str) -> np.ndarray | None:
        key = self._where.get(memory_id)
        if key is None:
            return None
        g = self._groups[key]
        return g.vecs[g.ids.index(memory_id)]

    def search(self, vector: np.ndarray, chain: frozenset[tuple[str, str]], before_ms: int,
               k: int, window: tuple[int, int] | None = None) -> list[tuple[str, float]]:
        """(memory_id, cosine similarity), best first, only within the scope chain."""
        q = np.asarray(vector, np.float32)
        q = q / (np.linalg.norm(q) or 1.0)
        found: list[tuple[float, str]] = []
        for key in sorted(chain):
            g = self._groups.get(key)
            if g is None or not g.ids:
                continue
            m, times, expires = g.arrays()
            ok = (times < before_ms) & ((expires == 0) | (expires > before_ms))
            if window:
                ok &= (times >= window[0]) & (times < window[1])
            idx = np.nonzero(ok)[0]
            sims = m[idx] @ q
            for i, s in zip(idx, sims, strict=True):
                found.append((-round(float(s), 6), g.ids[i]))
        found.sort()  # equal similarities by memory id, as the LanceDB index merges them
        return [(mid, -neg) for neg, mid in found[:k]]
