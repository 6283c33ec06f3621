"""LanceDB projection of the memory-log: one table per kind family, through LanceDB's async API.

Tables: `episodes` (segments and episodes), `facts`, `procedures`, `aliases` (M-06/M-07). Each
has the vector, the text with a full-text (BM25) index, and the columns searches filter on:
scope and owner (with scalar indices), event time and expiry. Revocation deletes the row.
Splitting by kind keeps each table's ANN index trained on one distribution and lets a caller
search only the kinds it wants; a search over several tables queries them side by side and
merges by score with ties broken by memory id, so the answer does not depend on table order.

Filtering (VectorIndex.search, VectorIndex.text_search): the full-text search and a vector
search with a time window give LanceDB the whole filter as a prefilter (scope chain, event time
before the request, not expired, the window). A vector search without a window prefilters on
the scope chain only and post-filters the hits on event time and expiry, from the times held
in memory, with a whole-prefilter query when that leaves too few.

The embedding model's name, dimension and version are stored next to the data (index_meta.json
and every table's Arrow schema metadata), and so is the layout. An index of another model or
of another layout is refused with IndexMismatch, never mixed or moved:
`open_index(..., rebuild=True)` drops it so the projector re-embeds from the memory-log.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Awaitable, Callable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, NamedTuple

import lancedb
import numpy as np
import pyarrow as pa
from lancedb.db import AsyncConnection
from lancedb.index import FTS, Bitmap, BTree, IvfPq
from lancedb.table import AsyncTable

from mnemoflow.projections.array_index import ArrayIndex
from mnemoflow.projections.index_rows import (
    FAMILIES,
    FAMILY_OF,
    RECALL_FAMILIES,
    HeldRows,
    Hits,
    IndexMeta,
    last_of_each_id,
    merge,
    visible,
)

LAYOUT = "per-kind/3"  # 3: no `revoked` column (revocation always deleted the row)
META = "index_meta.json"
ANN_MIN_ROWS = 50_000  # per table: below this a prefiltered flat scan is exact and fast enough
REFINE_FACTOR = 5  # an ANN search re-scores 5k PQ candidates with the stored vectors
# scalar indices let the scope/owner prefilter read only the caller's rows instead of all
SCALAR_INDICES = (("owner", BTree), ("scope", Bitmap))
COMPACT_EVERY = 50  # writes; many small appends make many fragments
# how long a compaction keeps the files of versions a newer one replaced (LanceDB: 7 days,
# about 3.6 files a write, so 300,000 files a day per table at a flush a second)
KEEP_VERSIONS = timedelta(minutes=10)
PURGE_WAITS = 100  # 50 ms each
OVERFETCH = 10  # rows beyond k a scope-only prefiltered search asks for (VectorIndex.search)
HELD_COLUMNS = ("memory_id", "scope", "owner", "event_time", "expires_at")


class IndexMismatch(RuntimeError):
    """The stored index was built with another embedding model or another layout: rebuild it
    from the memory-log, do not mix."""


def _schema(meta: IndexMeta) -> pa.Schema:
    return pa.schema([
        pa.field("memory_id", pa.string()), pa.field("kind", pa.string()),
        pa.field("text", pa.string()), pa.field("scope", pa.string()),
        pa.field("owner", pa.string()), pa.field("event_time", pa.int64()),
        pa.field("expires_at", pa.int64()),
        pa.field("vector", pa.list_(pa.float32(), meta.dim)),
    ], metadata=meta.schema_metadata())


def _q(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def owner_filter(chain: AbstractSet[tuple[str, str]]) -> str:
    """The scope-chain part of the filter, which the scalar indices answer without a scan."""
    return "(" + " OR ".join(f"(scope = {_q(s)} AND owner = {_q(o)})"
                             for s, o in sorted(chain)) + ")"


def visibility_filter(chain: AbstractSet[tuple[str, str]], before_ms: int,
                      window: tuple[int, int] | None = None) -> str:
    """The whole filter: scope chain, existed before, not expired, optionally the window."""
    where = f"{owner_filter(chain)} AND event_time < {int(before_ms)} " \
            f"AND (expires_at = 0 OR expires_at > {int(before_ms)})"
    if window:
        where += f" AND event_time >= {int(window[0])} AND event_time < {int(window[1])}"
    return where


class Row(NamedTuple):
    """What the index keeps in memory per memory id: its table and the bounds of its
    visibility, which a scope-only prefiltered search checks itself (VectorIndex.search)."""

    table: str
    event_time: int
    expires_at: int  # 0: never


def _rows(table: str, t: pa.Table) -> dict[str, Row]:
    return {m: Row(table, et, ex) for m, et, ex in zip(
        t.column("memory_id").to_pylist(), t.column("event_time").to_pylist(),
        t.column("expires_at").to_pylist(), strict=True)}


def _near_rows(t: pa.Table) -> list[dict[str, Any]]:
    """The rows of `t` as `VectorIndex.near` takes them: it answers vector searches only, so
    it is given no text."""
    return [{"memory_id": m, "kind": k, "text": "", "scope": s, "owner": o, "event_time": et,
             "expires_at": ex} for m, k, s, o, et, ex in zip(
        *(t.column(c).to_pylist() for c in ("memory_id", "kind", "scope", "owner", "event_time",
                                           "expires_at")), strict=True)]


def _owners(t: pa.Table) -> set[tuple[str, str]]:
    return set(zip(t.column("scope").to_pylist(), t.column("owner").to_pylist(), strict=True))


async def _table_names(db: AsyncConnection) -> set[str]:
    names: set[str] = set()
    token = None
    while True:
        page = await db.list_tables(page_token=token)
        names.update(page.tables)
        token = page.page_token
        if not token:
            return names


@dataclass
class KindTable:
    """One family's LanceDB table, the indices it has built, and the (scope, owner) pairs that
    have ever had a row in it: a query whose scope chain has none of them skips the table (a
    LanceDB query costs milliseconds even when empty). Revocations do not shrink the set,
    which only costs a needless query, never a miss."""

    name: str
    table: AsyncTable
    ann_min_rows: int
    has_ann: bool
    owners: set[tuple[str, str]] = field(default_factory=set)
    writes: int = 0
    keep_versions: timedelta = KEEP_VERSIONS
    readers: int = 0  # queries of this table in flight

    @classmethod
    async def open(cls, db: AsyncConnection, name: str, meta: IndexMeta, ann_min_rows: int,
                   exists: bool, vectors: bool) -> tuple[KindTable, pa.Table]:
        """Open or create the table, build the indices it lacks; also the columns of its rows
        that the index holds in memory (`HELD_COLUMNS`), and with `vectors` and no ANN index
        yet their kinds and vectors too."""
        schema = _schema(meta)
        if exists:
            table = await db.open_table(name)
            stored = await table.schema()
            model = {k.decode(): v.decode() for k, v in (stored.metadata or {}).items()
                     if k.startswith(b"mnemoflow.")}
            if model != meta.schema_metadata():
                raise IndexMismatch(f"table {name} was built with {model}, not "
                                    f"{meta.schema_metadata()}; rebuild it from the memory-log")
            if not stored.remove_metadata().equals(schema.remove_metadata()):
                raise IndexMismatch(f"table {name} has the columns of another layout "
                                    f"({stored.names}); rebuild it from the memory-log")
        else:
            table = await db.create_table(name, schema=schema)
        indexed = {c for i in await table.list_indices() for c in i.columns}
        if "text" not in indexed:  # on an empty table too: later rows are searched unindexed
            await table.create_index("text", config=FTS())
        for column, kind in SCALAR_INDICES:
            if column not in indexed:
                await table.create_index(column, config=kind())
        has_ann = "vector" in indexed
        columns = HELD_COLUMNS + (("kind", "vector") if vectors and not has_ann else ())
        held = await table.query().select(list(columns)).to_arrow()
        return cls(name, table, ann_min_rows, has_ann, _owners(held)), held

    async def write(self, data: pa.Table, upsert: bool) -> None:
        """Append the rows, or with `upsert` replace those whose memory id the table holds
        (one transaction); compact now and then, and build the ANN index past its threshold."""
        if upsert:
            await (self.table.merge_insert("memory_id").when_matched_update_all()
                   .when_not_matched_insert_all().execute(data))
        else:
            await self.table.add(data)
        self.owners |= _owners(data)
        self.writes += 1
        if self.writes % COMPACT_EVERY == 0:  # compacts fragments, folds new rows into indices
            await self.compact()
        if not self.has_ann and await self.table.count_rows() >= self.ann_min_rows:
            await self.table.create_index("vector", config=IvfPq(distance_type="cosine"))
            self.has_ann = True

    async def compact(self, purge: bool = False) -> None:
        """Compact fragments, fold new rows into the indices, and delete the files of the
        versions replaced more than `keep_versions` ago (with `purge`: of every version but
        the newest, once no query is in flight or after PURGE_WAITS tries: a forget's
        erasure outweighs a query that then fails and falls back to the lexical tier).

        Deleting a version's files fails a query still reading it. Every reader of these
        tables is in this process and counted in `readers`, and a query reads the newest
        version when it starts: so with no query in flight, only a query that starts during
        the compaction can read a version, a newer one than `keep_versions` ago. With a query
        in flight, LanceDB's default (7 days) is kept this time.
        """
        if purge:
            for _ in range(PURGE_WAITS):
                if self.readers == 0:
                    break
                await asyncio.sleep(0.05)
            await self.table.optimize(cleanup_older_than=timedelta(0), delete_unverified=True)
            return
        await self.table.optimize(
            cleanup_older_than=self.keep_versions if self.readers == 0 else None)

    async def read(self, query: Awaitable[pa.Table]) -> pa.Table:
        """Run a query of this table, counted as in flight while it runs (`compact`)."""
        self.readers += 1
        try:
            return await query
        finally:
            self.readers -= 1

    async def delete(self, ids: list[str]) -> None:
        await self.table.delete("memory_id IN (" + ",".join(_q(i) for i in ids) + ")")

    async def search(self, vector: np.ndarray, where: str, k: int) -> Hits:
        """(memory_id, cosine similarity) of the k nearest rows among those `where` admits."""
        q = (self.table.query().nearest_to(vector.astype(np.float32)).column("vector")
             .distance_type("cosine").where(where).limit(k))
        if self.has_ann and REFINE_FACTOR:
            q = q.refine_factor(REFINE_FACTOR)
        t = await self.read(q.select(["memory_id", "_distance"]).to_arrow())
        return [(m, round(1.0 - float(d), 6)) for m, d in
                zip(t.column("memory_id").to_pylist(), t.column("_distance").to_pylist(),
                    strict=True)]

    async def text_search(self, query: str, where: str, k: int) -> Hits:
        """(memory_id, BM25 score) of the k best rows among those `where` admits."""
        t = await self.read(self.table.query().nearest_to_text(query, columns="text")
                            .where(where).limit(k).select(["memory_id", "_score"]).to_arrow())
        return [(m, round(float(sc), 6)) for m, sc in
                zip(t.column("memory_id").to_pylist(), t.column("_score").to_pylist(),
                    strict=True)]


class VectorIndex(HeldRows):
    """Per-kind LanceDB tables of memories with their vectors, and an in-memory map of every
    row (its table, event time and expiry) by memory id. Open it with `VectorIndex.open` (or
    `open_index`); every method that reads or writes the tables is a coroutine.

    With `held_vectors` (the default), the vectors of every table that has no ANN index yet
    are also held in memory (`near`, an ArrayIndex), and vector searches of those tables are
    answered there: an exact flat scan of the caller's own rows, as LanceDB's prefiltered scan
    is, in microseconds instead of milliseconds of LanceDB's threads (measured in the recall
    bench). The tables stay the durable projection, reloaded on open. That costs 4 bytes per
    dimension per row, at most `ann_min_rows` rows a table; a table past it drops its rows from
    memory and is searched by its ANN index.
    """

    def __init__(self, path: Path, meta: IndexMeta, db: AsyncConnection,
                 tables: dict[str, KindTable], rows: dict[str, Row],
                 near: ArrayIndex | None) -> None:
        self.path, self.meta, self.db, self.tables = path, meta, db, tables
        self._rows = rows
        self.near = near

    @classmethod
    async def open(cls, path: Path, meta: IndexMeta, rebuild: bool = False,
                   ann_min_rows: int = ANN_MIN_ROWS, held_vectors: bool = True) -> VectorIndex:
        """Open (or create) the index at `path`. IndexMismatch if it was built with another
        model or in another layout; `rebuild=True` deletes whatever is there first."""
        meta_file = path / META
        if rebuild and path.exists():
            await asyncio.to_thread(shutil.rmtree, path)
        if meta_file.exists():
            stored = json.loads(meta_file.read_text())
            if {k: stored.get(k) for k in meta.to_json()} != meta.to_json():
                raise IndexMismatch(f"index at {path} was built with {stored}, not "
                                    f"{meta.to_json()}; rebuild it from the memory-log")
            if stored.get("layout") != LAYOUT:
                raise IndexMismatch(f"index at {path} has layout {stored.get('layout')}, not "
                                    f"{LAYOUT}; rebuild it from the memory-log")
        path.mkdir(parents=True, exist_ok=True)
        db = await lancedb.connect_async(str(path))
        names = await _table_names(db)
        if foreign := names - set(FAMILIES):  # e.g. the single `memories` table of layout 1
            raise IndexMismatch(f"index at {path} holds tables of another layout "
                                f"({sorted(foreign)}); rebuild it from the memory-log")
        opened: dict[str, KindTable] = {}
        rows: dict[str, Row] = {}
        near = ArrayIndex(meta) if held_vectors else None
        # the tables held first: a refused index is left as it was found
        for name in sorted(FAMILIES, key=lambda f: f not in names):
            opened[name], held = await KindTable.open(db, name, meta, ann_min_rows, name in names,
                                                      held_vectors)
            rows.update(_rows(name, held))
            if near is not None and not opened[name].has_ann and held.num_rows:
                await near.add(_near_rows(held), held.column("vector").combine_chunks()
                               .flatten().to_numpy().reshape(held.num_rows, meta.dim))
        tables = {name: opened[name] for name in FAMILIES}
        tmp = meta_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({**meta.to_json(), "layout": LAYOUT,
                                   "tables": {f: list(k) for f, k in FAMILIES.items()}}))
        tmp.replace(meta_file)
        return cls(path, meta, db, tables, rows, near)

    async def add(self, rows: list[dict[str, Any]], vectors: np.ndarray) -> None:
        """Write rows (memory_id, kind, text, scope, owner, event_time[, expires_at]) and their
        vectors, each into its kind's table; re-adding an id replaces it, also when its kind
        moved it to another table. ValueError, before anything is written, for an unknown kind."""
        if not rows:
            return
        vectors = np.asarray(vectors, dtype=np.float32).reshape(len(rows), self.meta.dim)
        by_table: dict[str, list[int]] = {}
        for i in last_of_each_id(rows):
            by_table.setdefault(FAMILY_OF[rows[i]["kind"]], []).append(i)
        for name, idx in by_table.items():
            part = [rows[i] for i in idx]
            held = {r["memory_id"]: row.table for r in part
                    if (row := self._rows.get(r["memory_id"])) is not None}
            for old in set(held.values()) - {name}:
                moved = [i for i, t in held.items() if t == old]
                await self.tables[old].delete(moved)
                for mid in moved:
                    del self._rows[mid]
            data = pa.table({
                "memory_id": [r["memory_id"] for r in part], "kind": [r["kind"] for r in part],
                "text": [r["text"] for r in part], "scope": [r["scope"] for r in part],
                "owner": [r["owner"] for r in part],
                "event_time": pa.array([r["event_time"] for r in part], pa.int64()),
                "expires_at": pa.array([r.get("expires_at") or 0 for r in part], pa.int64()),
                "vector": pa.FixedSizeListArray.from_arrays(pa.array(vectors[idx].ravel()),
                                                            self.meta.dim),
            }, schema=_schema(self.meta))
            # a merge joins the rows with the whole table: an append when no id is held here
            table = self.tables[name]
            had_ann = table.has_ann
            await table.write(data, upsert=name in held.values())
            self._rows.update(_rows(name, data))
            if self.near is None:
                continue
            if not table.has_ann:
                await self.near.add(_near_rows(data), vectors[idx])
            elif not had_ann:  # past the threshold now: its ANN index answers from here on
                for mid in [m for m, r in self._rows.items() if r.table == name]:
                    await self.near.revoke(mid)
            else:  # a row moved here from a table still held in memory
                for mid in held:
                    await self.near.revoke(mid)

    async def revoke(self, memory_id: str) -> None:
        """Delete the row (nothing if it is not held); searches stop returning it at once."""
        row = self._rows.pop(memory_id, None)
        if row is not None:
            await self.tables[row.table].delete([memory_id])
            if self.near is not None:
                await self.near.revoke(memory_id)

    async def vector(self, memory_id: str) -> np.ndarray | None:
        """The stored vector of a memory, or None if it is not held."""
        row = self._rows.get(memory_id)
        if row is None:
            return None
        if self.near is not None and memory_id in self.near.ids:
            return await self.near.vector(memory_id)
        table = self.tables[row.table]
        t = await table.read(table.table.query().where(f"memory_id = {_q(memory_id)}")
                             .select(["vector"]).limit(1).to_arrow())
        return np.asarray(t.column("vector")[0].as_py(), np.float32) if t.num_rows else None

    async def _fan_out(self, one: Callable[[KindTable], Awaitable[Hits]],
                       families: tuple[str, ...], chain: AbstractSet[tuple[str, str]],
                       k: int) -> Hits:
        """Ask every table of `families` that may hold something of the chain, side by side
        (a query is mostly fixed cost in Rust, so they overlap), and merge the answers."""
        live = [self.tables[f] for f in families if not self.tables[f].owners.isdisjoint(chain)]
        return merge(list(await asyncio.gather(*(one(t) for t in live))), k)

    async def search(self, vector: np.ndarray, chain: frozenset[tuple[str, str]], before_ms: int,
                     k: int, window: tuple[int, int] | None = None,
                     families: tuple[str, ...] = RECALL_FAMILIES) -> Hits:
        """(memory_id, cosine similarity), best first: the k nearest rows of `families` within
        the scope chain that existed before `before_ms`, were not expired by then and, with a
        `window`, have their event time in [start, end).

        With a window, each table gets that whole filter as a LanceDB prefilter. Without one,
        each table is prefiltered on the scope chain only, over-fetching OVERFETCH rows, and
        the hits are post-filtered here on the event times held in memory. The time columns
        have no index: in the prefilter they nearly doubled a search (measured on an 850k-row
        table: 17 vs 9.5 ms p50), and so did reading them back with the hits (16 vs 10 ms).
        When post-filtering leaves fewer than k of a full page, that table is asked again with
        the whole prefilter, so the answer is the whole prefilter's (exactly, for a flat scan).

        The tables whose vectors are held in memory are searched there, with the same answer.
        """
        if self.near is not None:
            held = tuple(f for f in families if not self.tables[f].has_ann)
            if held:
                rest = tuple(f for f in families if f not in held)
                parts = [await self.near.search(vector, chain, before_ms, k, window, held)]
                if rest:
                    parts.append(await self._search_tables(vector, chain, before_ms, k, window,
                                                           rest))
                return merge(parts, k)
        return await self._search_tables(vector, chain, before_ms, k, window, families)

    async def _search_tables(self, vector: np.ndarray, chain: frozenset[tuple[str, str]],
                             before_ms: int, k: int, window: tuple[int, int] | None,
                             families: tuple[str, ...]) -> Hits:
        """`search`, by LanceDB queries of the families' tables."""
        if window:
            where = visibility_filter(chain, before_ms, window)
            return await self._fan_out(lambda t: t.search(vector, where, k), families, chain, k)
        limit = k + OVERFETCH

        async def one(t: KindTable) -> Hits:
            hits = await t.search(vector, owner_filter(chain & t.owners), limit)
            kept = [h for h in hits if self._visible(h[0], before_ms)][:k]
            if len(kept) >= k or len(hits) < limit:
                return kept
            return await t.search(vector, visibility_filter(chain, before_ms), k)

        return await self._fan_out(one, families, chain, k)

    def _visible(self, memory_id: str, before_ms: int) -> bool:
        """Held (a row revoked during the query is dropped) and visible at `before_ms`."""
        row = self._rows.get(memory_id)
        return row is not None and visible(row.event_time, row.expires_at, before_ms)

    async def text_search(self, query: str, chain: frozenset[tuple[str, str]], before_ms: int,
                          k: int, window: tuple[int, int] | None = None,
                          families: tuple[str, ...] = RECALL_FAMILIES) -> Hits:
        """(memory_id, BM25 score) from the LanceDB full-text index, best first, with the whole
        filter of `search` as a prefilter.

        BM25 statistics are per table, so scores of different families are only roughly
        comparable; recall fuses by rank anyway.
        """
        if not query.strip():
            return []
        where = visibility_filter(chain, before_ms, window)
        return await self._fan_out(lambda t: t.text_search(query, where, k), families, chain, k)

    async def optimize(self) -> None:
        """Compact every table and fold unindexed rows into its indices (`KindTable.compact`)."""
        for t in self.tables.values():
            await t.compact()

    async def purge(self) -> None:
        """Compact, then delete every file that only older versions use, at once: rows
        deleted for a forget leave the disk, not only the newest version."""
        for t in self.tables.values():
            await t.compact(purge=True)


async def open_index(path: Path, meta: IndexMeta, rebuild: bool = False,
                     ann_min_rows: int = ANN_MIN_ROWS, held_vectors: bool = True) -> VectorIndex:
    """`VectorIndex.open`, under the name its callers know."""
    return await VectorIndex.open(path, meta, rebuild, ann_min_rows, held_vectors)
