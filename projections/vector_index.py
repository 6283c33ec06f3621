"""LanceDB projection of the memory-log: vectors + scalar columns, searched with prefilters (M-07).

The index records the embedding model's name, dimension and version next to the data. A
mismatch is refused, never mixed: `open_index(..., rebuild=True)` drops it so the projector
re-embeds from the memory-log. Revocation deletes the row, so it cannot be recalled.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lancedb
import numpy as np
import pyarrow as pa

TABLE = "memories"
META = "index_meta.json"
ANN_MIN_ROWS = 50_000  # below this a flat scan is exact and fast enough


class IndexMismatch(RuntimeError):
    """The stored index was built with another embedding model: rebuild, do not mix."""


@dataclass(frozen=True)
class IndexMeta:
    model: str
    dim: int
    version: str

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "dim": self.dim, "version": self.version}


def _schema(dim: int) -> pa.Schema:
    return pa.schema([
        pa.field("memory_id", pa.string()), pa.field("kind", pa.string()),
        pa.field("text", pa.string()), pa.field("scope", pa.string()),
        pa.field("owner", pa.string()), pa.field("event_time", pa.int64()),
        pa.field("expires_at", pa.int64()), pa.field("revoked", pa.bool_()),
        pa.field("vector", pa.list_(pa.float32(), dim)),
    ])


def _q(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


class VectorIndex:
    """One LanceDB table of memories with their vectors; all filters are prefilters."""

    def __init__(self, path: Path, meta: IndexMeta) -> None:
        self.path = path
        self.meta = meta
        self.db = lancedb.connect(str(path))
        if TABLE in self.db.list_tables().tables:
            self.table = self.db.open_table(TABLE)
        else:
            self.table = self.db.create_table(TABLE, schema=_schema(meta.dim))
        self._indexed_ann = False
        self._adds = 0
        self.ids: set[str] = set(
            self.table.search().select(["memory_id"]).limit(None).to_arrow()
            .column("memory_id").to_pylist()) if len(self) else set()

    def __len__(self) -> int:
        return int(self.table.count_rows())

    def add(self, rows: list[dict[str, Any]], vectors: np.ndarray) -> None:
        if not rows:
            return
        ids = [r["memory_id"] for r in rows]
        again = [i for i in ids if i in self.ids]
        if again:  # idempotent re-add; a delete scans the table, so only when needed
            self.table.delete("memory_id IN (" + ",".join(_q(i) for i in again) + ")")
        data = pa.table({
            "memory_id": ids, "kind": [r["kind"] for r in rows], "text": [r["text"] for r in rows],
            "scope": [r["scope"] for r in rows], "owner": [r["owner"] for r in rows],
            "event_time": pa.array([r["event_time"] for r in rows], pa.int64()),
            "expires_at": pa.array([r.get("expires_at") or 0 for r in rows], pa.int64()),
            "revoked": [False] * len(rows),
            "vector": pa.FixedSizeListArray.from_arrays(
                pa.array(vectors.astype(np.float32).ravel()), self.meta.dim),
        }, schema=_schema(self.meta.dim))
        self.table.add(data)
        self.ids.update(ids)
        self._adds += 1
        if self._adds % 50 == 0:  # many small appends make many fragments: compact them
            self.table.optimize()
        if not self._indexed_ann and len(self) >= ANN_MIN_ROWS:
            self.table.create_index(metric="cosine", vector_column_name="vector")
            self._indexed_ann = True

    def revoke(self, memory_id: str) -> None:
        self.table.delete(f"memory_id = {_q(memory_id)}")
        self.ids.discard(memory_id)

    def search(self, vector: np.ndarray, chain: frozenset[tuple[str, str]], before_ms: int,
               k: int, window: tuple[int, int] | None = None) -> list[tuple[str, float]]:
        """(memory_id, cosine similarity), best first, only within the scope chain."""
        scopes = " OR ".join(f"(scope = {_q(s)} AND owner = {_q(o)})" for s, o in sorted(chain))
        where = f"({scopes}) AND revoked = false AND event_time < {int(before_ms)} " \
                f"AND (expires_at = 0 OR expires_at > {int(before_ms)})"
        if window:
            where += f" AND event_time >= {int(window[0])} AND event_time < {int(window[1])}"
        rows = (self.table.search(vector.astype(np.float32), vector_column_name="vector")
                .distance_type("cosine").where(where, prefilter=True).limit(k)
                .select(["memory_id", "_distance"]).to_list())
        return [(r["memory_id"], round(1.0 - float(r["_distance"]), 6)) for r in rows]


def open_index(path: Path, meta: IndexMeta, rebuild: bool = False) -> VectorIndex:
    """Open (or create) the index at `path`; refuse one built with another model."""
    meta_file = path / META
    if rebuild and path.exists():
        shutil.rmtree(path)
    if meta_file.exists():
        stored = json.loads(meta_file.read_text())
        if stored != meta.to_json():
            raise IndexMismatch(f"index at {path} was built with {stored}, not {meta.to_json()};"
                                " rebuild it from the memory-log")
    path.mkdir(parents=True, exist_ok=True)
    index = VectorIndex(path, meta)
    tmp = meta_file.with_suffix(".tmp")
    tmp.write_text(json.dumps(meta.to_json()))
    tmp.replace(meta_file)
    return index
