"""A fold's objects and the garbage collector: a Freezer collects the young generations
first (so young garbage in cycles is freed) and then freezes what is left; a dropped
partition's memory, a reference cycle, is freed once thawed; a checkpoint load leaves the
collector as it found it."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest

from mnemoflow.agents.graph import GraphState
from mnemoflow.agents.tuning import load_tuning
from mnemoflow.projections import heap, snapshot
from mnemoflow.projections.array_index import ArrayIndex
from mnemoflow.projections.embedding import AsyncEmbedder
from mnemoflow.projections.memory_store import MemoryStore
from mnemoflow.projections.partitioned import build_partitioned
from mnemoflow.projections.snapshot import Checkpoint
from mnemoflow.projections.vector_tier import index_meta

from factories import HashEmbedder, memory_event


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


def test_settle_frees_young_cycles_then_freezes_what_lives() -> None:
    store = MemoryStore()
    for i in range(20):
        store.apply(memory_event(f"m{i}", ["locker"], owner="u1"))
    a, b = Node(), Node()
    a.other, b.other = b, a  # a cycle: only the collector frees it
    gone = weakref.ref(a)
    del a, b
    freezer = heap.Freezer()
    freezer.settle()
    assert gone() is None
    assert freezer.settled == 1
    assert gc.is_tracked(store.records) and not walked(store.records)
    assert not walked(store.lexical)


async def dropped_partition(freezer: heap.Freezer) -> weakref.ref[MemoryStore]:
    """A partition folded, settled and then dropped: a weak reference to its store."""
    emb = HashEmbedder()
    tuning = load_tuning()
    meta = index_meta(emb, tuning.index)
    memory = build_partitioned(tuning, 2, embedder=AsyncEmbedder(emb), graph=False,
                               index_for=lambda p, f: ArrayIndex(meta))
    await memory.hold_all()
    memory.apply(memory_event("m1", ["locker"], owner="u1"))
    part = memory.partition_of("u1")
    gone = weakref.ref(memory.parts[part].store)
    freezer.settle()
    memory.drop(part)
    return gone


async def test_a_dropped_partition_is_freed_once_thawed() -> None:
    freezer = heap.Freezer()
    gone = await dropped_partition(freezer)
    gc.collect()
    # the partition's memory is a reference cycle (its vector sink calls back into it), so
    # frozen, no collection frees it
    assert gone() is not None
    freezer.thaw()
    gc.collect()
    assert gone() is None


async def test_the_settle_after_a_thaw_frees_what_was_dropped() -> None:
    """As a rebalance runs: drop, thaw, then settle what the new partitions made."""
    freezer = heap.Freezer()
    gone = await dropped_partition(freezer)
    freezer.thaw()
    freezer.settle()  # no collection in between: the settle must reach the oldest generation
    assert gone() is None


@pytest.mark.parametrize("enabled", [True, False])
def test_a_checkpoint_load_files_what_it_made_as_old_and_restores_the_collector(
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
    assert any(o is cp.store.records for o in gc.get_objects(generation=2))
    (tmp_path / snapshot.FILE).write_bytes(b"not a pickle")  # and when loading fails
    assert snapshot.load(tmp_path, "b1") is None
    assert seen == [False]
    assert gc.isenabled() is enabled
