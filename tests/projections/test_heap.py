"""A fold's objects leave the garbage collector's walks: `settle` collects the young
generations first (so young garbage in cycles is freed) and then freezes what is left, and a
checkpoint load freezes what it made and leaves the collector as it found it."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest

from mnemoflow.agents.graph import GraphState
from mnemoflow.projections import heap, snapshot
from mnemoflow.projections.memory_store import MemoryStore
from mnemoflow.projections.snapshot import Checkpoint

from factories import memory_event


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


@pytest.fixture(autouse=True)
def collector() -> Iterator[None]:
    """Each test starts with nothing frozen, and leaves the collector as it found it."""
    was = gc.isenabled()
    gc.unfreeze()
    yield
    gc.unfreeze()
    gc.enable() if was else gc.disable()


def walked(obj: object) -> bool:
    """Whether a collection can walk `obj`: it is in one of the three generations."""
    return any(o is obj for o in gc.get_objects())


def test_settle_freezes_what_lives_and_frees_young_cycles_first() -> None:
    store = MemoryStore()
    for i in range(20):
        store.apply(memory_event(f"m{i}", ["locker"], owner="u1"))
    a, b = Node(), Node()
    a.other, b.other = b, a  # a cycle: only the collector frees it
    gone = weakref.ref(a)
    del a, b
    before = gc.get_freeze_count()
    heap.settle()
    assert gone() is None
    assert gc.get_freeze_count() > before
    assert gc.is_tracked(store.records) and not walked(store.records)
    assert not walked(store.lexical)


def test_a_frozen_memory_is_still_freed_when_it_is_dropped() -> None:
    store = MemoryStore()
    store.apply(memory_event("m1", ["locker"], owner="u1"))
    gone = weakref.ref(store)
    heap.settle()
    frozen = gc.get_freeze_count()
    del store
    assert gone() is None  # by its reference count, with no collection
    assert gc.get_freeze_count() < frozen


@pytest.mark.parametrize("enabled", [True, False])
def test_a_checkpoint_load_freezes_what_it_made_and_restores_the_collector(
        tmp_path: Path, enabled: bool) -> None:
    store = MemoryStore()
    for i in range(50):
        store.apply(memory_event(f"m{i}", ["locker", "gym"], owner=f"u{i % 3}"))
    snapshot.save(tmp_path, Checkpoint("b1", {"memory-log": 50}, store, GraphState()))
    gc.enable() if enabled else gc.disable()
    seen: list[bool] = []
    with heap.long_lived_load():
        seen.append(gc.isenabled())
    cp = snapshot.load(tmp_path, "b1")
    assert cp is not None and len(cp.store) == 50
    assert gc.is_tracked(cp.store.records) and not walked(cp.store.records)
    (tmp_path / snapshot.FILE).write_bytes(b"not a pickle")  # and when loading fails
    assert snapshot.load(tmp_path, "b1") is None
    assert seen == [False]
    assert gc.isenabled() is enabled
