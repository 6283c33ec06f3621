"""A fold's objects and the cyclic garbage collector.

A partition's store and graph are millions of small objects that live as long as the
partition is held: about nine per memory. Left to the collector, every full collection walks
all of them, and a full collection comes each time the objects that survived since the last
one reach a quarter of those it walked. While a backlog is folded this happens again and
again, each time over a bigger heap: 0.55 s a walk at 100k memories, seconds at 1M, with the
worker's loop held (docs/decisions.md, "The fold's objects out of the collector's walks").

So what a large fold batch made is filed in the collector's permanent generation
(`gc.freeze`), which no collection walks. The fold makes no reference cycles (a full
collection after folding 100k memories found nothing unreachable), so nothing there needs the
collector: a revoked memory or a dropped partition is freed by its reference count. Young
cyclic garbage of the rest of the process is collected first, so only what was already old
is frozen with the fold.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


def settle() -> None:
    """Collect the young generations (cheap: only what is new), then freeze what is left."""
    gc.collect(1)
    gc.freeze()


@contextmanager
def long_lived_load() -> Iterator[None]:
    """For unpickling a checkpoint: the collector off while it runs, since every object it
    makes lives on and each threshold of allocations would walk those made so far (more than
    half the load time); what it made is then frozen as a settled fold is. The collector is
    put back as it was, also when the load fails."""
    gc.collect(1)
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was:
            gc.enable()
