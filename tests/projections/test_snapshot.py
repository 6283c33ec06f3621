"""A partition's local checkpoint: what is saved comes back, and a foreign one is ignored
(how a load treats the garbage collector: test_heap). A checkpoint written by a forked
child lands whole or not at all, can be abandoned, and its writer dies with the worker."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from mnemoflow.agents.graph import GraphState
from mnemoflow.projections import snapshot
from mnemoflow.projections.memory_store import MemoryStore
from mnemoflow.projections.snapshot import Checkpoint

from factories import SlowToPickle, memory_event


def _ended(writer: snapshot.Writer, timeout: float = 30.0) -> bool | None:
    deadline = time.monotonic() + timeout
    while (done := writer.poll()) is None and time.monotonic() < deadline:
        time.sleep(0.02)
    return done


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


def test_a_forked_writer_puts_the_checkpoint_in_place_and_leaves_no_temporary(
        tmp_path: Path) -> None:
    writer = snapshot.fork_write(tmp_path, _checkpoint())
    assert writer.pid != os.getpid()
    assert _ended(writer) is True
    cp = snapshot.load(tmp_path, "b1")
    assert cp is not None and len(cp.store) == 50 and cp.offsets == {"memory-log": 50}
    assert [p.name for p in tmp_path.iterdir()] == [snapshot.FILE]


def test_a_writer_that_fails_leaves_the_previous_checkpoint(tmp_path: Path) -> None:
    snapshot.save(tmp_path, _checkpoint())
    broken = Checkpoint("b1", {"memory-log": 99}, MemoryStore(), threading.Lock())
    assert _ended(snapshot.fork_write(tmp_path, broken)) is False  # a lock does not pickle
    cp = snapshot.load(tmp_path, "b1")
    assert cp is not None and cp.offsets == {"memory-log": 50}
    assert [p.name for p in tmp_path.iterdir()] == [snapshot.FILE]


def test_an_abandoned_writer_is_killed_and_its_checkpoint_never_lands(tmp_path: Path) -> None:
    writer = snapshot.fork_write(tmp_path, Checkpoint("b1", {}, MemoryStore(), SlowToPickle()))
    time.sleep(0.2)
    assert writer.poll() is None
    t = time.monotonic()
    writer.abandon()
    assert time.monotonic() - t < 5.0 and writer.poll() is False
    assert list(tmp_path.iterdir()) == []


def test_temporaries_of_dead_writers_are_dropped(tmp_path: Path) -> None:
    snapshot.save(tmp_path, _checkpoint())
    (tmp_path / f".{snapshot.FILE}.123.abcd").write_bytes(b"half")
    assert snapshot.drop_temporaries(tmp_path) == 1
    assert [p.name for p in tmp_path.iterdir()] == [snapshot.FILE]


def _gone(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "State:\tZ" in status  # dead, not yet reaped by its new parent


def test_a_writer_dies_with_its_worker(tmp_path: Path) -> None:
    """A killed worker leaves no writer behind that could put back a checkpoint holding an
    owner that the partition's next holder forgets."""
    script = f"""
import time
from pathlib import Path
from factories import SlowToPickle
from mnemoflow.projections import snapshot
from mnemoflow.projections.memory_store import MemoryStore
writer = snapshot.fork_write(Path({str(tmp_path)!r}),
                             snapshot.Checkpoint("b1", {{}}, MemoryStore(), SlowToPickle()))
print(writer.pid, flush=True)
time.sleep(120)
"""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}  # tests/, for factories
    worker = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                              env=env)
    try:
        assert worker.stdout is not None
        child = int(worker.stdout.readline())
        assert not _gone(child)
        worker.kill()
        worker.wait(10)
        deadline = time.monotonic() + 10
        while not _gone(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _gone(child)
    finally:
        worker.kill()
        worker.wait(10)
