"""Flushing a memory's sinks: the ones recall reads in their order, MEMORY.md beside them."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from mnemoflow.projections.markdown import MarkdownSink
from mnemoflow.projections.memory import Memory, ProjectionFailed, flush_sinks
from mnemoflow.projections.memory_store import MemoryStore


class _Sink:
    def __init__(self, name: str, log: list[str], fail: bool = False) -> None:
        self.name, self.log, self.fail = name, log, fail

    async def flush(self) -> None:
        await asyncio.sleep(0)
        self.log.append(self.name)
        if self.fail:
            raise OSError("disk full")


class _HeldCopy(MarkdownSink):
    """A MEMORY.md sink whose write does not finish until `release` is set."""

    def __init__(self, root: Path, log: list[str]) -> None:
        super().__init__(root, MemoryStore())
        self.log, self.release = log, asyncio.Event()

    async def flush(self) -> int:
        self.log.append("markdown started")
        await self.release.wait()
        self.log.append("markdown")
        return 0


async def test_a_slow_memory_md_write_does_not_hold_up_the_sinks_recall_reads(
        tmp_path: Path) -> None:
    log: list[str] = []
    copy = _HeldCopy(tmp_path, log)
    flushing = asyncio.create_task(flush_sinks([copy, _Sink("vector", log),
                                                _Sink("graph", log)]))
    for _ in range(20):
        await asyncio.sleep(0)
    assert log == ["markdown started", "vector", "graph"]  # both done, and in their order
    assert not flushing.done()  # the flush covers MEMORY.md too: it ends when that is written
    copy.release.set()
    assert await flushing is True
    assert log[-1] == "markdown"


async def test_a_failing_sink_fails_the_flush_and_the_others_are_still_flushed(
        tmp_path: Path) -> None:
    log: list[str] = []
    copy = _HeldCopy(tmp_path, log)
    copy.release.set()
    ok = await flush_sinks([copy, _Sink("vector", log, fail=True), _Sink("graph", log)])
    assert ok is False
    assert sorted(log) == ["graph", "markdown", "markdown started", "vector"]


async def test_a_flush_of_sinks_that_all_work_is_true(tmp_path: Path) -> None:
    log: list[str] = []
    assert await flush_sinks([_Sink("vector", log), _Sink("graph", log)]) is True
    assert await flush_sinks([]) is True
    assert log == ["vector", "graph"]


async def test_memory_flush_raises_after_flushing_the_other_sinks() -> None:
    """`Memory.flush` (the in-memory runner's) has no next batch to retry a failed sink
    with, so it raises; the sinks after the failing one were still flushed."""
    log: list[str] = []
    mem = Memory(MemoryStore(), [], sinks=[_Sink("vector", log, fail=True), _Sink("graph", log)])
    with pytest.raises(ProjectionFailed):
        await mem.flush()
    assert log == ["vector", "graph"]
    mem.sinks = [_Sink("vector", log)]
    await mem.flush()
