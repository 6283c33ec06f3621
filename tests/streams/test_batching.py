"""Records taken together (`streams.batching`): a list holds what was already waiting, never
waits for what has not arrived, keeps the order, and stops its reader when closed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import aclosing

import pytest

from mnemoflow.streams.batching import taken_together


class Source:
    """Items put by the test; iterated as a stream of records is."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[object] = asyncio.Queue()
        self.closed = asyncio.Event()
        self.readers: set[asyncio.Task | None] = set()

    def put(self, *items: object) -> None:
        for item in items:
            self.queue.put_nowait(item)

    async def __aiter__(self) -> AsyncIterator[object]:
        self.readers.add(asyncio.current_task())
        try:
            while (item := await self.queue.get()) is not None:
                if isinstance(item, Exception):
                    raise item
                yield item
        finally:
            self.closed.set()


async def _next(lists: AsyncIterator[list[object]]) -> list[object]:
    return await asyncio.wait_for(anext(lists), 2)


async def test_what_waits_goes_together_up_to_the_bound_in_order() -> None:
    src = Source()
    src.put(*range(7))
    async with aclosing(taken_together(src, 3)) as lists:
        got = [await _next(lists) for _ in range(3)]
    assert got == [[0, 1, 2], [3, 4, 5], [6]]


async def test_a_list_never_waits_for_a_record_not_yet_there() -> None:
    src = Source()
    async with aclosing(taken_together(src, 16)) as lists:
        src.put("a")
        assert await _next(lists) == ["a"]  # alone: nothing else had arrived
        nxt = asyncio.ensure_future(anext(lists))
        await asyncio.sleep(0.05)
        assert not nxt.done()  # nothing to hand over yet
        src.put("b", "c")
        assert await asyncio.wait_for(nxt, 2) in (["b"], ["b", "c"])


async def test_one_at_a_time_reads_in_the_callers_task() -> None:
    src = Source()
    src.put(1, 2, None)
    async with aclosing(taken_together(src, 1)) as lists:
        assert [x async for x in lists] == [[1], [2]]
    assert src.readers == {asyncio.current_task()}
    src = Source()
    src.put(1, None)
    async with aclosing(taken_together(src, 2)) as lists:
        assert [x async for x in lists] == [[1]]
    assert asyncio.current_task() not in src.readers  # a reader task of its own


async def test_the_sources_error_comes_after_what_was_taken_before_it() -> None:
    src = Source()
    src.put(1, 2, RuntimeError("broken"))
    async with aclosing(taken_together(src, 16)) as lists:
        assert await _next(lists) in ([1, 2], [1])
        with pytest.raises(RuntimeError, match="broken"):
            while True:
                await _next(lists)


async def test_the_end_of_the_source_ends_the_lists() -> None:
    src = Source()
    src.put(1, 2, 3, None)
    async with aclosing(taken_together(src, 2)) as lists:
        got = [x async for x in lists]
    assert sum(got, []) == [1, 2, 3] and all(len(x) <= 2 for x in got)


async def test_closing_the_lists_stops_the_reader() -> None:
    src = Source()
    src.put(1)
    async with aclosing(taken_together(src, 4)) as lists:
        assert await _next(lists) == [1]
    await asyncio.wait_for(src.closed.wait(), 2)  # the reader's iteration was closed
