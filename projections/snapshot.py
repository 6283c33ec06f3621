"""Local checkpoints of a partition's fold: the store and graph with the offsets they cover,
so that a restart folds only the memory-log written after them.

A checkpoint is taken only when every sink has written everything folded so far, so the
partition's vector index (kept next to it on disk) holds at least what the checkpoint does;
rows written after it are found there again and not embedded twice. A checkpoint is derived
data: a missing, unreadable or foreign one (another format or build, or an offset past the end
of the log, which means the topic was recreated) is ignored and the partition is folded from
the start. Written atomically (a temporary file renamed), so a crash leaves the previous one.
"""

from __future__ import annotations

import fcntl
import gc
import logging
import os
import pickle
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)
FORMAT = 2  # 2: the store holds the memory switches (agents.controls)
FILE = "checkpoint.pickle"


@dataclass(frozen=True)
class Checkpoint:
    build: str  # the memory's index version and tuning: a checkpoint of another is not used
    offsets: dict[str, int]  # topic name -> the next offset to fold (its partition is the dir's)
    store: Any
    graph: Any


def dumps(checkpoint: Checkpoint) -> bytes:
    """Serialised on the fold's loop (the fold must not move meanwhile); written off it."""
    return pickle.dumps((FORMAT, checkpoint), protocol=pickle.HIGHEST_PROTOCOL)


def write_bytes(folder: Path, data: bytes) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{FILE}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, folder / FILE)


def save(folder: Path, checkpoint: Checkpoint) -> None:
    write_bytes(folder, dumps(checkpoint))


class FolderLock:
    """An exclusive lock on a partition's folder (its vector index and checkpoint): two
    workers on one machine never write one index. `acquire` is False if another process
    holds it; the lock goes with the process, so a killed worker leaves none behind."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._fd: int | None = None

    def acquire(self) -> bool:
        self.folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.folder / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        self._fd = fd
        return True

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


@contextmanager
def long_lived_load() -> Iterator[None]:
    """The cyclic garbage collector off while a checkpoint is unpickled, and what it made
    filed with the oldest generation afterwards; the collector is then as it was.

    A checkpoint makes millions of objects that live as long as the partition is held. With
    the collector on, each threshold of allocations walks the objects made so far: more than
    half the load time (docs/decisions.md, "Loading a checkpoint"). Left in the youngest
    generation, they would each be walked three times by the collections that follow (young,
    middle, old) while the tail is folded; freezing and unfreezing moves every tracked object
    to the oldest generation without a walk. Nothing the unpickler makes is garbage, so no
    collection is missed."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.unfreeze()
        if was:
            gc.enable()


def load(folder: Path, build: str) -> Checkpoint | None:
    path = folder / FILE
    if not path.exists():
        return None
    try:
        with open(path, "rb") as f, long_lived_load():
            fmt, cp = pickle.load(f)
    except Exception as exc:  # a checkpoint is derived: fold from the start instead
        log.warning("checkpoint %s unreadable (%r); folding the partition from the start",
                    path, exc)
        return None
    if fmt != FORMAT or not isinstance(cp, Checkpoint) or cp.build != build:
        log.info("checkpoint %s is of another build; folding the partition from the start", path)
        return None
    return cp


def drop(folder: Path) -> None:
    """Remove one partition's checkpoint (it holds what a forget dropped)."""
    (folder / FILE).unlink(missing_ok=True)


def drop_all(root: Path) -> int:
    """Remove every partition's checkpoint under `root` (the broker's data was reset)."""
    gone = 0
    for path in root.glob(f"*/{FILE}"):
        path.unlink(missing_ok=True)
        gone += 1
    return gone
