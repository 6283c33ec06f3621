"""A fold's objects and the cyclic garbage collector.

A partition's store and graph are millions of small objects that live as long as the
partition is held: about nine per memory. Left to the collector, every full collection walks
all of them, and a full collection comes each time the objects that survived since the last
one reach a quarter of those it walked. While a backlog is folded this happens again and
again, each time over a bigger heap: 0.55 s a walk at 100k memories, seconds at 1M, with the
worker's loop held (docs/decisions.md, "The fold gives the loop a turn per batch, and
its objects leave the collector's walks").

`Freezer` is the worker's answer: what a restore made is frozen (`gc.freeze`), and the
permanent generation it goes to is walked by no collection. Freezing acts on the whole
interpreter, so only the process's owner (the worker's entry point) makes a Freezer and hands
it to its projector; a library or a test that makes none leaves the collector alone.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


class Freezer:
    """Freezes what a restore made, and thaws when a partition is dropped.

    A frozen object that becomes garbage is still freed by its reference count, but a frozen
    reference cycle is never collected: a held partition's memory is one (its vector sink
    calls back into it), and so may be anything else that was alive at a freeze, such as a
    task that later fails with its traceback. So a dropped partition, or a stopped projector,
    thaws everything (`gc.unfreeze`), and the first settle after a thaw collects every
    generation before it freezes again: a young collection does not reach what the thaw put
    in the oldest generation, and freezing it again would keep the dropped cycles for good.
    That full collection walks the whole heap once, as every full collection did before."""

    def __init__(self) -> None:
        self.settled = 0  # how many times (the tests read these)
        self.thawed = 0
        self._thawed_since = False  # a thaw since the last settle: collect everything first

    def settle(self) -> None:
        """Collect the young generations (cheap: only what is new, and any young garbage in
        cycles goes), or every generation after a thaw; then freeze what is left."""
        if self._thawed_since:
            gc.collect()
            self._thawed_since = False
        else:
            gc.collect(1)
        gc.freeze()
        self.settled += 1

    def thaw(self) -> None:
        gc.unfreeze()
        self._thawed_since = True
        self.thawed += 1


@contextmanager
def long_lived_load() -> Iterator[None]:
    """For unpickling a checkpoint: the collector off while it runs, since every object it
    makes lives on and each threshold of allocations would walk those made so far (more than
    half the load time). What it made is then moved to the oldest generation without a walk
    (frozen and thawed at once); a Freezer may freeze it for good afterwards. The collector is
    put back as it was, also when the load fails."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.unfreeze()
        if was:
            gc.enable()
