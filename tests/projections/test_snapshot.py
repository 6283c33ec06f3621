"""A partition's local checkpoint: what is saved comes back, a foreign one is ignored, and
loading one leaves the garbage collector as it found it."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest

from mnemoflow.agents.graph import GraphState
from mnemoflow.projections import snapshot
from mnemoflow.projections.memory_store import MemoryStore
from mnemoflow.projections.snapshot import Checkpoint

from factories import memory_event


def _checkpoint(build: str = "b1") -> Checkpoint:
    store = MemoryStore()
    for i in range(50):
        store.apply(memory_event(f"m{i}", [f"locker{i}", "gym"], owner=f"u{i % 3}"))
    return Checkpoint(build, {"memory-log": 50}, store, GraphState())


def test_a_checkpoint_comes_back_with_its_store_and_offsets(tmp_path: Path) -> None:
    snapshot.save(tmp_path, _checkpoint())
    cp = snapshot.load(tmp_path, "b1")
    assert cp is not None and cp.offsets == {"memory-log": 50}
    assert len(cp.store) == 50
    assert sorted(cp.store.by_owner) == [("User", "u0"), ("User", "u1"), ("User", "u2")]
    assert cp.store.has_event("e:m7") and not cp.store.has_event("e:m50")


def test_a_checkpoint_of_another_build_or_unreadable_is_ignored(tmp_path: Path) -> None:
    snapshot.save(tmp_path, _checkpoint("b1"))
    assert snapshot.load(tmp_path, "b2") is None
    (tmp_path / snapshot.FILE).write_bytes(b"not a pickle")
    assert snapshot.load(tmp_path, "b1") is None
    assert snapshot.load(tmp_path / "none", "b1") is None


@pytest.mark.parametrize("enabled", [True, False])
def test_loading_leaves_the_collector_as_it_was(tmp_path: Path, enabled: bool) -> None:
    snapshot.save(tmp_path, _checkpoint())
    was = gc.isenabled()
    try:
        gc.enable() if enabled else gc.disable()
        seen: list[bool] = []
        with snapshot.long_lived_load():
            seen.append(gc.isenabled())
        cp = snapshot.load(tmp_path, "b1")
        assert cp is not None
        assert any(o is cp.store.records for o in gc.get_objects(generation=2))
        (tmp_path / snapshot.FILE).write_bytes(b"not a pickle")  # and when loading fails
        assert snapshot.load(tmp_path, "b1") is None
        assert seen == [False]
        assert gc.isenabled() is enabled
    finally:
        gc.enable() if was else gc.disable()
