"""Records of one agent in flight together, in order per key.

An agent stays one faust agent (concurrency=1, one consumer of its partitions), but a stage
that mostly waits (recall: the projection barrier, the embedder, LanceDB) may start the next
records while earlier ones wait. Records with the same key (a session's requests) run one
after another in arrival order, as they would one at a time; records of different keys
overlap, up to `limit`. With `limit` 1 a record runs to its end before the next starts.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)


class KeyedLanes:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._running: set[asyncio.Task[None]] = set()
        self._tail: dict[str, asyncio.Task[None]] = {}  # the last task started for each key

    async def run(self, key: str, work: Callable[[], Awaitable[None]]) -> None:
        """Start `work` after the key's earlier work; return once fewer than `limit` run."""
        if self.limit <= 1:
            await work()
            return
        before = self._tail.get(key)
        task = asyncio.ensure_future(self._after(before, work))
        self._tail[key] = task
        self._running.add(task)
        task.add_done_callback(lambda t: self._done(key, t))
        while len(self._running) >= self.limit:
            await asyncio.wait(self._running, return_when=asyncio.FIRST_COMPLETED)

    @staticmethod
    async def _after(before: asyncio.Task[None] | None,
                     work: Callable[[], Awaitable[None]]) -> None:
        if before is not None:
            await asyncio.wait([before])
        await work()

    def _done(self, key: str, task: asyncio.Task[None]) -> None:
        self._running.discard(task)
        if self._tail.get(key) is task:
            del self._tail[key]
        if not task.cancelled() and task.exception() is not None:
            # `work` handles its own failures (the runner's retry loop); anything that still
            # escapes leaves its record unacked (it comes again), and is logged
            log.error("a %s record failed outside its retry loop: %r", key, task.exception())

    async def drain(self) -> None:
        if self._running:
            await asyncio.wait(self._running)
