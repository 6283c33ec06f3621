"""An in-memory index with the async API and the semantics of `vector_index.VectorIndex`.

The Kafka-free offline replay and the tests use it where a LanceDB folder is not wanted. The
same methods (`add`, `revoke`, `vector`, `search`, `text_search`, `optimize`, `ids`, `len`,
`meta`) mean the same: rows go by kind into the same families (an unknown kind is refused),
re-adding an id replaces it, and a search sees only the scope chain's rows that existed before
the request, were not expired by then and lie in the optional event-time window.

`search` is an exact flat cosine scan, as LanceDB's below its ANN threshold; similarities are
rounded to 1e-6 and equal ones go by memory id, as there. `text_search` is BM25 (k1 1.2,
b 0.75, Lucene's idf, LanceDB's formula) with statistics per family, as LanceDB keeps them per
table; its tokenizer lower-cases, folds accents to ASCII and splits on non-word characters,
but neither stems nor drops stop words as LanceDB's does, so scores and the matches of
inflected words differ. Rows are grouped by (scope, owner): a search touches only the
caller's own memories.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from mnemoflow.projections.index_rows import (
    FAMILY_OF,
    RECALL_FAMILIES,
    HeldRows,
    Hits,
    IndexMeta,
    last_of_each_id,
    merge,
)

K1, B = 1.2, 0.75
MAX_TOKEN_CHARS = 40  # longer tokens are not indexed (LanceDB's default)


def tokens(text: str) -> list[str]:
    folded = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode().lower()
    return [t for t in re.findall(r"\w+", folded) if len(t) <= MAX_TOKEN_CHARS]


@dataclass(frozen=True, eq=False)
class _Row:
    key: tuple[str, str]
    family: str
    event_time: int
    expires_at: int
    vector: np.ndarray
    terms: Counter[str]
    length: int


class _Stacked(NamedTuple):
    ids: list[str]
    unit: np.ndarray  # (rows, dim) unit vectors
    event_time: np.ndarray
    expires_at: np.ndarray
    family: np.ndarray


@dataclass
class _Group:
    """One (scope, owner)'s rows and, built on demand, their columns as arrays."""

    rows: dict[str, _Row] = field(default_factory=dict)
    _stacked: _Stacked | None = None

    def stacked(self) -> _Stacked:
        if self._stacked is None:
            ids = sorted(self.rows)
            rows = [self.rows[i] for i in ids]
            m = np.stack([r.vector for r in rows])
            norms = np.linalg.norm(m, axis=1, keepdims=True)
            self._stacked = _Stacked(
                ids, m / np.where(norms == 0, 1, norms),
                np.array([r.event_time for r in rows], np.int64),
                np.array([r.expires_at for r in rows], np.int64),
                np.array([r.family for r in rows]))
        return self._stacked

    def admitted(self, families: tuple[str, ...], before_ms: int,
                 window: tuple[int, int] | None) -> np.ndarray:
        """Positions, in stacked order, of the rows a search may return
        (`vector_index.visible`, over arrays)."""
        s = self.stacked()
        ok = np.isin(s.family, families) & (s.event_time < before_ms) & (
            (s.expires_at == 0) | (s.expires_at > before_ms))
        if window:
            ok &= (s.event_time >= window[0]) & (s.event_time < window[1])
        return np.flatnonzero(ok)


@dataclass
class _Bm25Stats:
    """A family's document count, total length and document frequencies."""

    docs: int = 0
    length: int = 0
    df: Counter[str] = field(default_factory=Counter)

    def update(self, row: _Row, sign: int) -> None:
        self.docs += sign
        self.length += sign * row.length
        self.df.update({t: sign for t in row.terms})

    def score(self, row: _Row, query: set[str]) -> float:
        avg = self.length / self.docs
        s = 0.0
        for t in query & row.terms.keys():
            n, tf = self.df[t], row.terms[t]
            idf = math.log(1 + (self.docs - n + 0.5) / (n + 0.5))
            s += idf * tf * (K1 + 1) / (tf + K1 * (1 - B + B * row.length / avg))
        return s


class ArrayIndex(HeldRows):
    """Exact search over rows held in memory, grouped by (scope, owner)."""

    def __init__(self, meta: IndexMeta) -> None:
        self.meta = meta
        self._groups: dict[tuple[str, str], _Group] = {}
        self._rows: dict[str, _Row] = {}
        self._stats: dict[str, _Bm25Stats] = {}

    async def add(self, rows: list[dict[str, Any]], vectors: np.ndarray) -> None:
        """As VectorIndex.add: re-adding an id replaces it; ValueError for an unknown kind."""
        if not rows:
            return
        vectors = np.asarray(vectors, dtype=np.float32).reshape(len(rows), self.meta.dim)
        for i in last_of_each_id(rows):
            r = rows[i]
            self._drop(r["memory_id"])
            terms = Counter(tokens(r["text"]))
            row = _Row((r["scope"], r["owner"]), FAMILY_OF[r["kind"]], int(r["event_time"]),
                       int(r.get("expires_at") or 0), vectors[i].copy(), terms,
                       sum(terms.values()))
            g = self._groups.setdefault(row.key, _Group())
            g.rows[r["memory_id"]] = row
            g._stacked = None
            self._rows[r["memory_id"]] = row
            self._stats.setdefault(row.family, _Bm25Stats()).update(row, 1)

    def _drop(self, memory_id: str) -> None:
        row = self._rows.pop(memory_id, None)
        if row is not None:
            g = self._groups[row.key]
            del g.rows[memory_id]
            g._stacked = None
            self._stats[row.family].update(row, -1)

    async def revoke(self, memory_id: str) -> None:
        """Forget the row (nothing if it is not held)."""
        self._drop(memory_id)

    async def vector(self, memory_id: str) -> np.ndarray | None:
        row = self._rows.get(memory_id)
        return None if row is None else row.vector.copy()

    def _groups_of(self, chain: frozenset[tuple[str, str]]) -> list[_Group]:
        return [g for key in sorted(chain) if (g := self._groups.get(key)) is not None and g.rows]

    async def search(self, vector: np.ndarray, chain: frozenset[tuple[str, str]], before_ms: int,
                     k: int, window: tuple[int, int] | None = None,
                     families: tuple[str, ...] = RECALL_FAMILIES) -> Hits:
        """(memory_id, cosine similarity), best first; the rows VectorIndex.search admits."""
        q = np.asarray(vector, np.float32)
        q = q / (np.linalg.norm(q) or 1.0)
        parts: list[Hits] = []
        for g in self._groups_of(chain):
            st, keep = g.stacked(), g.admitted(families, before_ms, window)
            sims = st.unit[keep] @ q
            parts.append([(st.ids[i], round(float(s), 6)) for i, s in zip(keep, sims, strict=True)])
        return merge(parts, k)

    async def text_search(self, query: str, chain: frozenset[tuple[str, str]], before_ms: int,
                          k: int, window: tuple[int, int] | None = None,
                          families: tuple[str, ...] = RECALL_FAMILIES) -> Hits:
        """(memory_id, BM25 score), best first, of the admitted rows holding a query term."""
        terms = set(tokens(query))
        parts: list[Hits] = []
        for g in self._groups_of(chain):
            ids = g.stacked().ids
            rows = ((ids[i], g.rows[ids[i]]) for i in g.admitted(families, before_ms, window))
            parts.append([(m, round(self._stats[r.family].score(r, terms), 6))
                          for m, r in rows if not terms.isdisjoint(r.terms)])
        return merge(parts, k)

    async def optimize(self) -> None:
        """Nothing to compact: kept for the API VectorIndex has."""
