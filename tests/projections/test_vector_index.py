"""M-06/M-07: per-kind LanceDB tables, prefilters, merge order, full text, ANN per table,
model metadata, and the move from the single-table layout."""

from __future__ import annotations

import json
from pathlib import Path

import lancedb
import numpy as np
import pyarrow as pa
import pytest

from mnemoflow.projections.vector_index import (
    LEGACY_TABLE,
    OVERFETCH,
    IndexMeta,
    IndexMismatch,
    open_index,
)

META = IndexMeta("fake/model", 8, "1")
ALICE = frozenset({("User", "alice"), ("Session", "qa")})
T = 1_000


def unit(*xs: float) -> np.ndarray:
    v = np.zeros(8, dtype=np.float32)
    v[: len(xs)] = xs
    return v / np.linalg.norm(v)


def row(mid: str, kind: str, text: str = "", owner: str = "alice", t: int = T, **kw) -> dict:
    return {"memory_id": mid, "kind": kind, "text": text or mid, "scope": "User", "owner": owner,
            "event_time": t, **kw}


def filled(tmp_path: Path, **kw):
    idx = open_index(tmp_path / "idx", META, **kw)
    rows = [row("seg1", "segment", "the dog Rex loves the beach"),
            row("ep1", "episode", "deploy failed with a timeout"),
            row("fact1", "fact", "favourite city is Porto"),
            row("proc1", "procedure", "run the tests before a deploy"),
            row("bob1", "segment", "Rex belongs to bob", owner="bob")]
    vecs = np.stack([unit(1, 0.2), unit(1, 0.6), unit(1, 0.1), unit(1, 0.9), unit(1, 0)])
    idx.add(rows, vecs)
    return idx


def test_each_kind_goes_to_its_family_table(tmp_path: Path) -> None:
    idx = filled(tmp_path)
    sizes = {name: len(t) for name, t in idx.tables.items()}
    assert sizes == {"episodes": 3, "facts": 1, "procedures": 1, "aliases": 0}
    assert len(idx) == 5 and set(idx.ids) == {"seg1", "ep1", "fact1", "proc1", "bob1"}
    meta = json.loads((tmp_path / "idx" / "index_meta.json").read_text())
    assert meta["layout"].startswith("per-kind") and meta["model"] == "fake/model"
    with pytest.raises(ValueError):
        idx.add([row("x", "mystery")], np.ones((1, 8)))


def test_search_merges_tables_by_similarity_within_the_scope_chain(tmp_path: Path) -> None:
    idx = filled(tmp_path)
    hits = idx.search(unit(1, 0), ALICE, T + 1, 10)
    assert [m for m, _ in hits] == ["fact1", "seg1", "ep1", "proc1"]  # bob1 is closest, not ours
    sims = [s for _, s in hits]
    assert sims == sorted(sims, reverse=True)
    assert [m for m, _ in idx.search(unit(1, 0), ALICE, T + 1, 2)] == ["fact1", "seg1"]
    assert [m for m, _ in idx.search(unit(1, 0), ALICE, T + 1, 10, families=("facts",))] == [
        "fact1"]


def test_equal_similarities_are_ordered_by_memory_id(tmp_path: Path) -> None:
    idx = open_index(tmp_path / "idx", META)
    idx.add([row("b", "fact"), row("c", "segment"), row("a", "procedure")],
            np.stack([unit(1)] * 3))
    assert [m for m, _ in idx.search(unit(1), ALICE, T + 1, 3)] == ["a", "b", "c"]


def test_time_expiry_and_window_prefilters(tmp_path: Path) -> None:
    idx = open_index(tmp_path / "idx", META)
    idx.add([row("old", "segment", t=100), row("new", "fact", t=900),
             row("brief", "segment", t=500, expires_at=600)], np.stack([unit(1)] * 3))
    assert {m for m, _ in idx.search(unit(1), ALICE, 550, 10)} == {"old", "brief"}
    assert {m for m, _ in idx.search(unit(1), ALICE, 1000, 10)} == {"old", "new"}
    assert {m for m, _ in idx.search(unit(1), ALICE, 1000, 10, window=(800, 950))} == {"new"}


@pytest.mark.parametrize("concurrent", [True, False])
def test_hidden_rows_beyond_the_overfetch_fall_back_to_the_whole_prefilter(
        tmp_path: Path, concurrent: bool) -> None:
    """The closest rows are from after the request or expired, more of them than the
    scope-only search over-fetches: the answer is still the visible rows, best first."""
    idx = open_index(tmp_path / "idx", META)
    idx.concurrent = concurrent
    n = OVERFETCH + 5
    idx.add([row(f"later{i:02}", "segment", t=2 * T) for i in range(n)]
            + [row(f"gone{i:02}", "segment", expires_at=T + 5) for i in range(n)]
            + [row("kept1", "segment"), row("kept2", "fact")],
            np.stack([unit(1, 0.01 * i) for i in range(2 * n)] + [unit(1, 0.5), unit(1, 0.9)]))
    assert [m for m, _ in idx.search(unit(1), ALICE, T + 10, 2)] == ["kept1", "kept2"]
    assert [m for m, _ in idx.search(unit(1), ALICE, T + 10, 3)] == ["kept1", "kept2"]
    # before their expiry, the expiring rows are the best visible ones
    assert [m for m, _ in idx.search(unit(1), ALICE, T + 1, 2)] == ["gone00", "gone01"]
    with_window = idx.search(unit(1), ALICE, 3 * T, 3, window=(2 * T, 3 * T))
    assert [m for m, _ in with_window] == ["later00", "later01", "later02"]
    reopened = open_index(tmp_path / "idx", META)  # the event times come back from disk
    reopened.concurrent = concurrent
    assert [m for m, _ in reopened.search(unit(1), ALICE, T + 10, 2)] == ["kept1", "kept2"]


def test_revoke_and_re_add(tmp_path: Path) -> None:
    idx = filled(tmp_path)
    idx.revoke("fact1")
    idx.revoke("never-there")
    assert "fact1" not in idx.ids and len(idx.tables["facts"]) == 0
    assert "fact1" not in [m for m, _ in idx.search(unit(1, 0), ALICE, T + 1, 10)]
    idx.add([row("seg1", "segment")], unit(0, 1)[None, :])  # replaced, not duplicated
    idx.add([row("ep1", "fact")], unit(1)[None, :])  # a changed kind moves tables
    assert len(idx.tables["episodes"]) == 2 and len(idx.tables["facts"]) == 1
    again = open_index(tmp_path / "idx", META)
    assert set(again.ids) == {"seg1", "ep1", "proc1", "bob1"}
    assert again.search(unit(1), ALICE, T + 1, 1)[0][0] == "ep1"


def test_full_text_search_is_prefiltered_and_sees_new_rows(tmp_path: Path) -> None:
    idx = filled(tmp_path)
    assert [m for m, _ in idx.text_search("Rex", ALICE, T + 1, 5)] == ["seg1"]  # not bob's
    assert {m for m, _ in idx.text_search("deploy", ALICE, T + 1, 5)} == {"ep1", "proc1"}
    assert idx.text_search("deploy", ALICE, T, 5) == []  # not before the request
    idx.add([row("seg2", "segment", "Rex chased a gull", t=T + 5)], unit(0, 1)[None, :])
    assert {m for m, _ in idx.text_search("rex", ALICE, T + 10, 5)} == {"seg1", "seg2"}
    idx.optimize()
    assert {m for m, _ in idx.text_search("rex", ALICE, T + 10, 5)} == {"seg1", "seg2"}
    assert all(any(i.index_type == "FTS" for i in t.table.list_indices())
               for t in idx.tables.values())


def test_the_ann_index_is_built_per_table_past_its_threshold(tmp_path: Path) -> None:
    idx = open_index(tmp_path / "idx", META, ann_min_rows=300)
    rng = np.random.default_rng(0)
    vecs = rng.standard_normal((300, 8)).astype(np.float32)
    idx.add([row(f"f{i:03}", "fact") for i in range(300)], vecs)
    idx.add([row("s1", "segment")], unit(1)[None, :])
    assert idx.tables["facts"].has_ann and not idx.tables["episodes"].has_ann
    reopened = open_index(tmp_path / "idx", META, ann_min_rows=300)
    assert reopened.tables["facts"].has_ann and not reopened.tables["episodes"].has_ann
    hits = reopened.search(vecs[7], ALICE, T + 1, 5)
    assert len(hits) == 5 and hits[0][0] == "f007"
    reopened.concurrent = False
    assert reopened.search(vecs[7], ALICE, T + 1, 5) == hits


def test_another_model_is_refused_even_without_the_meta_file(tmp_path: Path) -> None:
    filled(tmp_path)
    other = IndexMeta("fake/model", 8, "2")
    with pytest.raises(IndexMismatch):
        open_index(tmp_path / "idx", other)
    (tmp_path / "idx" / "index_meta.json").unlink()
    with pytest.raises(IndexMismatch):  # every table carries the model in its schema
        open_index(tmp_path / "idx", other)
    assert len(open_index(tmp_path / "idx", other, rebuild=True)) == 0


def test_a_single_table_index_is_moved_to_per_kind_tables(tmp_path: Path) -> None:
    path = tmp_path / "idx"
    db = lancedb.connect(str(path))
    legacy = pa.schema([
        pa.field("memory_id", pa.string()), pa.field("kind", pa.string()),
        pa.field("text", pa.string()), pa.field("scope", pa.string()),
        pa.field("owner", pa.string()), pa.field("event_time", pa.int64()),
        pa.field("expires_at", pa.int64()), pa.field("revoked", pa.bool_()),
        pa.field("vector", pa.list_(pa.float32(), 8))])
    vecs = np.stack([unit(1, 0.3), unit(1, 0.1), unit(1, 0.7)])
    db.create_table(LEGACY_TABLE, pa.table({
        "memory_id": ["s", "f", "p"], "kind": ["segment", "fact", "procedure"],
        "text": ["a", "b", "c"], "scope": ["User"] * 3, "owner": ["alice"] * 3,
        "event_time": pa.array([T] * 3, pa.int64()), "expires_at": pa.array([0] * 3, pa.int64()),
        "revoked": [False] * 3,
        "vector": pa.FixedSizeListArray.from_arrays(pa.array(vecs.ravel()), 8)}, schema=legacy))
    (path / "index_meta.json").write_text(json.dumps(META.to_json()))
    idx = open_index(path, META)
    assert LEGACY_TABLE not in lancedb.connect(str(path)).list_tables().tables
    assert {n: len(t) for n, t in idx.tables.items() if len(t)} == {
        "episodes": 1, "facts": 1, "procedures": 1}
    assert [m for m, _ in idx.search(unit(1), ALICE, T + 1, 3)] == ["f", "s", "p"]


def test_tables_without_the_callers_rows_are_not_queried(tmp_path: Path, monkeypatch) -> None:
    bob = frozenset({("User", "bob")})
    for idx in (filled(tmp_path), open_index(tmp_path / "idx", META)):  # also after reopening
        for name in ("facts", "procedures"):
            for method in ("search", "asearch"):  # the sync and the concurrent path
                monkeypatch.setattr(idx.tables[name], method, lambda *a: pytest.fail("queried"))
        assert [m for m, _ in idx.search(unit(1), bob, T + 1, 5)] == ["bob1"]
        assert idx.tables["facts"].owners == {("User", "alice")}


def test_tables_searched_together_answer_as_one_by_one(tmp_path: Path) -> None:
    idx = filled(tmp_path)
    assert idx.concurrent  # the installed LanceDB lets one search await all its tables
    idx.add([row("seg9", "segment", "Rex again", t=T + 3)], unit(1, 0.05)[None, :])  # unindexed
    queries = [unit(1, 0), unit(0, 1), unit(1, 1, 1)]
    together = [idx.search(q, ALICE, T + 10, 3) for q in queries] + \
        [idx.text_search(w, ALICE, T + 10, 3) for w in ("rex", "deploy", "porto")]
    idx.concurrent = False
    one_by_one = [idx.search(q, ALICE, T + 10, 3) for q in queries] + \
        [idx.text_search(w, ALICE, T + 10, 3) for w in ("rex", "deploy", "porto")]
    assert together == one_by_one and all(together)
