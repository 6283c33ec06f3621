"""M-06/M-07: the index contract (families, filters, merge order, revocation, full text) run
over both backends, LanceDB's VectorIndex and the in-memory ArrayIndex; then what only the
LanceDB index has: persistence, ANN per table, model and layout metadata."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import lancedb
import numpy as np
import pyarrow as pa
import pytest

from mnemoflow.projections.array_index import ArrayIndex
from mnemoflow.projections.index_rows import IndexMeta, MemoryIndex
from mnemoflow.projections.vector_index import (
    COMPACT_EVERY,
    OVERFETCH,
    IndexMismatch,
    VectorIndex,
    open_index,
)

META = IndexMeta("fake/model", 8, "1")
ALICE = frozenset({("User", "alice"), ("Session", "qa")})
T = 1_000


def unit(*xs: float) -> np.ndarray:
    v = np.zeros(8, dtype=np.float32)
    v[: len(xs)] = xs
    return v / np.linalg.norm(v)


def row(mid: str, kind: str, text: str = "", owner: str = "alice", t: int = T,
        **kw: Any) -> dict[str, Any]:
    return {"memory_id": mid, "kind": kind, "text": text or mid, "scope": "User", "owner": owner,
            "event_time": t, **kw}


def ids(hits: list[tuple[str, float]]) -> list[str]:
    return [m for m, _ in hits]


FILLED = [row("seg1", "segment", "the dog Rex loves the beach"),
          row("ep1", "episode", "deploy failed with a timeout"),
          row("fact1", "fact", "favourite city is Porto"),
          row("proc1", "procedure", "run the tests before a deploy"),
          row("bob1", "segment", "Rex belongs to bob", owner="bob")]
FILLED_VECS = np.stack([unit(1, 0.2), unit(1, 0.6), unit(1, 0.1), unit(1, 0.9), unit(1, 0)])


class IndexContract:
    """What every MemoryIndex does; a subclass per backend says how to make one."""

    async def make(self, tmp_path: Path) -> MemoryIndex:
        raise NotImplementedError

    async def filled(self, tmp_path: Path) -> MemoryIndex:
        idx = await self.make(tmp_path)
        await idx.add(FILLED, FILLED_VECS)
        return idx

    async def test_rows_are_held_by_id_and_an_unknown_kind_writes_nothing(
            self, tmp_path: Path) -> None:
        idx = await self.filled(tmp_path)
        assert idx.meta == META
        assert len(idx) == 5 and set(idx.ids) == {"seg1", "ep1", "fact1", "proc1", "bob1"}
        with pytest.raises(ValueError, match="mystery"):
            await idx.add([row("new", "fact"), row("x", "mystery")], np.ones((2, 8)))
        assert "new" not in idx.ids and len(idx) == 5
        assert np.allclose(await idx.vector("fact1"), unit(1, 0.1))
        assert await idx.vector("never-there") is None

    async def test_search_merges_families_by_similarity_within_the_scope_chain(
            self, tmp_path: Path) -> None:
        idx = await self.filled(tmp_path)
        hits = await idx.search(unit(1, 0), ALICE, T + 1, 10)
        assert ids(hits) == ["fact1", "seg1", "ep1", "proc1"]  # bob1 is closest, not ours
        assert [s for _, s in hits] == sorted((s for _, s in hits), reverse=True)
        assert hits[0][1] == pytest.approx(float(unit(1, 0.1) @ unit(1, 0)), abs=1e-6)
        assert ids(await idx.search(unit(1, 0), ALICE, T + 1, 2)) == ["fact1", "seg1"]
        assert ids(await idx.search(unit(1, 0), ALICE, T + 1, 10, families=("facts",))) == [
            "fact1"]
        await idx.add([row("al1", "alias")], unit(1)[None, :])
        assert "al1" not in ids(await idx.search(unit(1), ALICE, T + 1, 10))  # not a recall family
        assert ids(await idx.search(unit(1), ALICE, T + 1, 10, families=("aliases",))) == ["al1"]

    async def test_equal_similarities_are_ordered_by_memory_id(self, tmp_path: Path) -> None:
        idx = await self.make(tmp_path)
        await idx.add([row("b", "fact"), row("c", "segment"), row("a", "procedure")],
                      np.stack([unit(1)] * 3))
        assert ids(await idx.search(unit(1), ALICE, T + 1, 3)) == ["a", "b", "c"]

    async def test_event_time_expiry_and_window(self, tmp_path: Path) -> None:
        idx = await self.make(tmp_path)
        await idx.add([row("old", "segment", t=100), row("new", "fact", t=900),
                       row("brief", "segment", t=500, expires_at=600)], np.stack([unit(1)] * 3))
        assert set(ids(await idx.search(unit(1), ALICE, 550, 10))) == {"old", "brief"}
        assert set(ids(await idx.search(unit(1), ALICE, 1000, 10))) == {"old", "new"}
        assert ids(await idx.search(unit(1), ALICE, 1000, 10, window=(800, 950))) == ["new"]
        assert await idx.search(unit(1), ALICE, 100, 10) == []  # nothing existed before 100

    async def test_the_nearest_rows_hidden_by_time_do_not_hide_the_visible_ones(
            self, tmp_path: Path) -> None:
        """The closest rows are from after the request or expired, more of them than the
        LanceDB search over-fetches: the answer is still the visible rows, best first."""
        idx = await self.make(tmp_path)
        n = OVERFETCH + 5
        await idx.add(
            [row(f"later{i:02}", "segment", t=2 * T) for i in range(n)]
            + [row(f"gone{i:02}", "segment", expires_at=T + 5) for i in range(n)]
            + [row("kept1", "segment"), row("kept2", "fact")],
            np.stack([unit(1, 0.01 * i) for i in range(2 * n)] + [unit(1, 0.5), unit(1, 0.9)]))
        assert ids(await idx.search(unit(1), ALICE, T + 10, 2)) == ["kept1", "kept2"]
        assert ids(await idx.search(unit(1), ALICE, T + 10, 3)) == ["kept1", "kept2"]
        # before their expiry, the expiring rows are the best visible ones
        assert ids(await idx.search(unit(1), ALICE, T + 1, 2)) == ["gone00", "gone01"]
        with_window = await idx.search(unit(1), ALICE, 3 * T, 3, window=(2 * T, 3 * T))
        assert ids(with_window) == ["later00", "later01", "later02"]

    async def test_revoke_and_re_add(self, tmp_path: Path) -> None:
        idx = await self.filled(tmp_path)
        await idx.revoke("fact1")
        await idx.revoke("never-there")
        assert "fact1" not in idx.ids and len(idx) == 4
        assert await idx.vector("fact1") is None
        assert "fact1" not in ids(await idx.search(unit(1, 0), ALICE, T + 1, 10))
        await idx.add([row("seg1", "segment")], unit(0, 1)[None, :])  # replaced, not duplicated
        await idx.add([row("ep1", "fact")], unit(1)[None, :])  # a changed kind moves families
        assert len(idx) == 4
        assert ids(await idx.search(unit(1), ALICE, T + 1, 10, families=("facts",))) == ["ep1"]
        assert ids(await idx.search(unit(1), ALICE, T + 1, 10, families=("episodes",))) == [
            "seg1"]
        # one call giving an id twice: the last row wins
        await idx.add([row("dup", "fact", t=T), row("dup", "fact", t=T + 500)],
                      np.stack([unit(1), unit(0, 1)]))
        assert len(idx) == 5 and np.allclose(await idx.vector("dup"), unit(0, 1))
        assert "dup" not in ids(await idx.search(unit(1), ALICE, T + 1, 10))

    async def test_full_text_search_is_filtered_like_search_and_sees_new_rows(
            self, tmp_path: Path) -> None:
        idx = await self.filled(tmp_path)
        assert ids(await idx.text_search("Rex", ALICE, T + 1, 5)) == ["seg1"]  # not bob's
        assert set(ids(await idx.text_search("deploy", ALICE, T + 1, 5))) == {"ep1", "proc1"}
        assert await idx.text_search("deploy", ALICE, T, 5) == []  # not before the request
        assert await idx.text_search("   ", ALICE, T + 1, 5) == []
        assert await idx.text_search("zebra", ALICE, T + 1, 5) == []  # no term matches
        await idx.add([row("seg2", "segment", "Rex chased a gull", t=T + 5)], unit(0, 1)[None, :])
        assert set(ids(await idx.text_search("rex", ALICE, T + 10, 5))) == {"seg1", "seg2"}
        assert ids(await idx.text_search("rex", ALICE, T + 10, 5, window=(T + 5, T + 6))) == [
            "seg2"]
        await idx.optimize()
        assert set(ids(await idx.text_search("rex", ALICE, T + 10, 5))) == {"seg1", "seg2"}
        await idx.revoke("seg2")
        assert ids(await idx.text_search("rex", ALICE, T + 10, 5)) == ["seg1"]
        scores = [s for _, s in await idx.text_search("deploy timeout", ALICE, T + 1, 5)]
        assert scores == sorted(scores, reverse=True) and scores[0] > scores[-1] > 0


class TestVectorIndexContract(IndexContract):
    """Every vector search a LanceDB query."""

    async def make(self, tmp_path: Path) -> MemoryIndex:
        return await open_index(tmp_path / "idx", META, held_vectors=False)


class TestHeldVectorIndexContract(IndexContract):
    """Vector searches of tables without an ANN index answered from the vectors held."""

    async def make(self, tmp_path: Path) -> MemoryIndex:
        return await open_index(tmp_path / "idx", META)


class TestArrayIndexContract(IndexContract):
    async def make(self, tmp_path: Path) -> MemoryIndex:
        return ArrayIndex(META)


async def test_both_backends_return_the_same_hits_on_random_vectors(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    day = 86_400_000
    rows = [{"memory_id": f"m{i:03d}", "kind": ("segment", "fact", "procedure")[i % 3],
             "text": f"t{i}", "scope": "User", "owner": f"u{i % 4}", "event_time": i * day,
             "expires_at": 30 * day if i % 7 == 0 else 0} for i in range(80)]
    vecs = rng.normal(size=(80, 8)).astype(np.float32)
    lance = await open_index(tmp_path / "idx", META, held_vectors=False)
    arr = ArrayIndex(META)
    for idx in (lance, arr):
        await idx.add(rows, vecs)
        await idx.revoke("m005")
    held = await open_index(tmp_path / "idx", META)  # the vectors loaded from the tables
    assert held.near is not None and set(held.near.ids) == set(lance.ids)
    chain = frozenset({("User", "u1"), ("Session", "s"), ("External", "u1")})
    full = 0
    for j in range(6):
        q = rng.normal(size=8).astype(np.float32)
        before = (20 + 8 * j) * day
        window = (5 * day, 25 * day) if j % 2 else None
        a = await arr.search(q, chain, before, 10, window)
        for other in (lance, held):
            b = await other.search(q, chain, before, 10, window)
            assert ids(a) == ids(b) and a
            assert np.allclose([s for _, s in a], [s for _, s in b], atol=2e-6)
        assert all(int(m[1:]) % 4 == 1 for m in ids(a)) and "m005" not in ids(a)
        full += len(a) == 10
    assert full  # some searches were cut at k, not only filtered


# ------------------------------------------------------------------ LanceDB only


async def lance_filled(tmp_path: Path, **kw: Any) -> VectorIndex:
    idx = await open_index(tmp_path / "idx", META, **kw)
    await idx.add(FILLED, FILLED_VECS)
    return idx


async def sizes(idx: VectorIndex) -> dict[str, int]:
    return {name: await t.table.count_rows() for name, t in idx.tables.items()}


async def test_each_kind_goes_to_its_family_table_and_stays_there(tmp_path: Path) -> None:
    idx = await lance_filled(tmp_path)
    assert await sizes(idx) == {"episodes": 3, "facts": 1, "procedures": 1, "aliases": 0}
    meta = json.loads((tmp_path / "idx" / "index_meta.json").read_text())
    assert meta["layout"] == "per-kind/3" and meta["model"] == "fake/model"
    await idx.revoke("fact1")
    await idx.add([row("ep1", "fact")], unit(1)[None, :])  # moved, not copied
    await idx.add([row("seg1", "segment")], unit(0, 1)[None, :])  # replaced in place
    assert await sizes(idx) == {"episodes": 2, "facts": 1, "procedures": 1, "aliases": 0}
    again = await open_index(tmp_path / "idx", META)
    assert set(again.ids) == {"seg1", "ep1", "proc1", "bob1"} and len(again) == 4
    assert ids(await again.search(unit(1), ALICE, T + 1, 1)) == ["ep1"]
    assert np.allclose(await again.vector("seg1"), unit(0, 1))


async def test_event_times_and_owners_come_back_from_disk(tmp_path: Path) -> None:
    idx = await open_index(tmp_path / "idx", META)
    await idx.add([row("later", "segment", t=2 * T), row("kept", "fact")],
                  np.stack([unit(1), unit(1, 0.5)]))
    reopened = await open_index(tmp_path / "idx", META)
    assert reopened.tables["facts"].owners == {("User", "alice")}
    assert ids(await reopened.search(unit(1), ALICE, T + 10, 2)) == ["kept"]


async def test_full_text_indices_exist_on_every_table(tmp_path: Path) -> None:
    idx = await lance_filled(tmp_path)
    await idx.optimize()
    for t in idx.tables.values():
        assert any(i.index_type == "FTS" for i in await t.table.list_indices())


async def test_the_ann_index_is_built_per_table_past_its_threshold(tmp_path: Path) -> None:
    idx = await open_index(tmp_path / "idx", META, ann_min_rows=300)
    rng = np.random.default_rng(0)
    vecs = rng.standard_normal((300, 8)).astype(np.float32)
    await idx.add([row(f"f{i:03}", "fact") for i in range(300)], vecs)
    await idx.add([row("s1", "segment")], unit(1)[None, :])
    assert idx.tables["facts"].has_ann and not idx.tables["episodes"].has_ann
    reopened = await open_index(tmp_path / "idx", META, ann_min_rows=300)
    assert reopened.tables["facts"].has_ann and not reopened.tables["episodes"].has_ann
    for i in (idx, reopened):  # memory holds the vectors of the table without ANN only
        assert i.near is not None and set(i.near.ids) == {"s1"}
        hits = await i.search(vecs[7], ALICE, T + 1, 5)
        assert len(hits) == 5 and hits[0][0] == "f007"
        assert (await i.search(unit(1), ALICE, T + 1, 1))[0][0] == "s1"


async def test_another_model_is_refused_even_without_the_meta_file(tmp_path: Path) -> None:
    await lance_filled(tmp_path)
    other = IndexMeta("fake/model", 8, "2")
    with pytest.raises(IndexMismatch):
        await open_index(tmp_path / "idx", other)
    (tmp_path / "idx" / "index_meta.json").unlink()
    with pytest.raises(IndexMismatch):  # every table carries the model in its schema
        await open_index(tmp_path / "idx", other)
    assert len(await open_index(tmp_path / "idx", other, rebuild=True)) == 0


def _old_schema(revoked: bool) -> pa.Schema:
    """The columns of layouts 1 and 2, which had an always-false `revoked` column."""
    return pa.schema([
        pa.field("memory_id", pa.string()), pa.field("kind", pa.string()),
        pa.field("text", pa.string()), pa.field("scope", pa.string()),
        pa.field("owner", pa.string()), pa.field("event_time", pa.int64()),
        pa.field("expires_at", pa.int64())]
        + ([pa.field("revoked", pa.bool_())] if revoked else [])
        + [pa.field("vector", pa.list_(pa.float32(), 8))], metadata=META.schema_metadata())


@pytest.mark.parametrize("table, layout", [("memories", None), ("facts", "per-kind/2")])
async def test_an_index_of_an_older_layout_is_refused_until_rebuilt(
        tmp_path: Path, table: str, layout: str | None) -> None:
    """Layout 1 (one `memories` table) and layout 2 (per-kind tables with a `revoked`
    column): refused, with or without the meta file, and rebuild=True replaces them."""
    path = tmp_path / "idx"
    db = await lancedb.connect_async(str(path))
    await db.create_table(table, schema=_old_schema(revoked=True))
    (path / "index_meta.json").write_text(json.dumps({**META.to_json(), "layout": layout}))
    with pytest.raises(IndexMismatch, match="layout"):
        await open_index(path, META)
    (path / "index_meta.json").unlink()
    with pytest.raises(IndexMismatch, match="layout"):
        await open_index(path, META)
    idx = await open_index(path, META, rebuild=True)
    await idx.add(FILLED, FILLED_VECS)
    assert len(await open_index(path, META)) == 5


async def test_tables_without_the_callers_rows_are_not_queried(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bob = frozenset({("User", "bob")})
    for idx in (await lance_filled(tmp_path, held_vectors=False),
                await open_index(tmp_path / "idx", META, held_vectors=False)):
        for name in ("facts", "procedures"):
            for method in ("search", "text_search"):
                monkeypatch.setattr(idx.tables[name], method, lambda *a: pytest.fail("queried"))
        assert ids(await idx.search(unit(1), bob, T + 1, 5)) == ["bob1"]
        assert ids(await idx.text_search("rex", bob, T + 1, 5)) == ["bob1"]
        assert idx.tables["facts"].owners == {("User", "alice")}


@pytest.mark.filterwarnings("ignore:optimize\\(cleanup_older_than=0\\):UserWarning")
async def test_a_compaction_deletes_the_versions_it_replaced_unless_a_query_is_in_flight(
        tmp_path: Path) -> None:
    idx = await open_index(tmp_path / "idx", META)
    facts = idx.tables["facts"]
    facts.keep_versions = timedelta(0)

    async def writes(first: int) -> int:
        """COMPACT_EVERY one-row writes, the last of which compacts; the versions after."""
        for i in range(first, first + COMPACT_EVERY):
            await idx.add([row(f"f{i:03}", "fact")], unit(1, i / 100)[None, :])
        return len(await facts.table.list_versions())

    facts.readers += 1  # as a query of the table in flight at the compaction
    kept = await writes(0)
    assert kept > COMPACT_EVERY
    facts.readers -= 1
    assert await writes(COMPACT_EVERY) < 5 < kept
    reopened = await open_index(tmp_path / "idx", META, held_vectors=False)
    hits = await reopened.search(unit(1, 0.5), ALICE, T + 1, 3)
    assert ids(hits) == ["f050", "f049", "f051"] and len(reopened) == 2 * COMPACT_EVERY
