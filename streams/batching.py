"""Records taken together: what is already waiting behind a record goes with it.

A stage that pays a fixed cost per step (a broker round trip, a forward pass) pays it once
for such a list; under no load every list is one record, so nothing waits for a record that
has not arrived. The records are taken by a task of their own, so that a source which holds
one back (faust skips a record fetched before a rebalance and waits for the next) never keeps
a list from going out; the queue between them bounds how far it reads ahead.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, AsyncIterator
from typing import TypeVar

T = TypeVar("T")
_END = object()


async def taken_together(source: AsyncIterable[T], most: int) -> AsyncIterator[list[T]]:
    """The items of `source` in order, in lists of one item and those already taken behind it,
    up to `most`. With `most` 1, the source is read in the caller's task, one item a list. An
    error of the source is raised after the items taken before it."""
    if most <= 1:
        async for item in source:
            yield [item]
        return
    taken: asyncio.Queue[object] = asyncio.Queue(maxsize=most)

    async def take() -> None:
        try:
            async for item in source:
                await taken.put(item)
            await taken.put(_END)
        except Exception as exc:  # the caller's to raise, in order
            await taken.put(exc)

    reader = asyncio.get_running_loop().create_task(take())
    try:
        while True:
            batch: list[T] = []
            item = await taken.get()
            while True:
                if item is _END or isinstance(item, Exception):
                    if batch:
                        yield batch
                    if isinstance(item, Exception):
                        raise item
                    return
                batch.append(item)  # type: ignore[arg-type]
                if len(batch) >= most or taken.empty():
                    break
                item = taken.get_nowait()
            yield batch
    finally:
        reader.cancel()
