"""Local checkpoints of a partition's fold: the store and graph with the offsets they cover,
so that a restart folds only the memory-log written after them.

A checkpoint is taken only when every sink has written everything folded so far, so the
partition's vector index (kept next to it on disk) holds at least what the checkpoint does;
rows written after it are found there again and not embedded twice. A checkpoint is derived
data: a missing, unreadable or foreign one (another format or build, or an offset past the end
of the log, which means the topic was recreated) is ignored and the partition is folded from
the start. Written atomically (a temporary file renamed), so a crash leaves the previous one.

A checkpoint is written by a forked child (`fork_write`): the fork is a copy-on-write image
of the fold as it stands, so the worker goes on folding while the child pickles it. Pickled on
the worker's loop, a checkpoint held everything for a time that grows with the partition:
about 0.6 s at 25k memories, 10 s at 250k (docs/decisions.md, "Checkpoints written by a
forked child").
"""

from __future__ import annotations

import ctypes
import fcntl
import gc
import logging
import os
import pickle
import signal
import time
import uuid
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from mnemoflow.projections import heap

log = logging.getLogger(__name__)
FORMAT = 2  # 2: the store holds the memory switches (agents.controls)
FILE = "checkpoint.pickle"
PR_SET_PDEATHSIG = 1  # linux/prctl.h
# looked up here, not in the child: a dlopen there could wait forever on a loader lock that
# another of the worker's threads held at the fork
_PRCTL = getattr(ctypes.CDLL(None), "prctl", None)


@dataclass(frozen=True)
class Checkpoint:
    build: str  # the memory's index version and tuning: a checkpoint of another is not used
    offsets: dict[str, int]  # topic name -> the next offset to fold (its partition is the dir's)
    store: Any
    graph: Any


def dumps(checkpoint: Checkpoint) -> bytes:
    """The bytes a checkpoint file holds (the bench times this: what the loop spent before
    checkpoints were forked)."""
    return pickle.dumps((FORMAT, checkpoint), protocol=pickle.HIGHEST_PROTOCOL)


def _write(folder: Path, tmp: Path, checkpoint: Checkpoint) -> None:
    """Pickle into `tmp`, fsync, and rename it into place: a crash leaves the previous one."""
    with open(tmp, "wb") as f:
        pickle.dump((FORMAT, checkpoint), f, protocol=pickle.HIGHEST_PROTOCOL)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, folder / FILE)


def save(folder: Path, checkpoint: Checkpoint) -> None:
    """Write in this process (`fork_write` is the worker's way)."""
    folder.mkdir(parents=True, exist_ok=True)
    _write(folder, _temporary(folder), checkpoint)


def _temporary(folder: Path) -> Path:
    return folder / f".{FILE}.{os.getpid()}.{uuid.uuid4().hex[:8]}"


def drop_temporaries(folder: Path) -> int:
    """Remove what writers that died (a killed worker, or its child) left half written; only
    for a folder this process holds the lock of, so no live writer's file is taken."""
    gone = 0
    for path in folder.glob(f".{FILE}.*"):
        path.unlink(missing_ok=True)
        gone += 1
    return gone


@dataclass
class Writer:
    """A checkpoint being written by a forked child; `done` is None while it runs."""

    pid: int
    folder: Path
    tmp: Path
    started: float = field(default_factory=time.monotonic)
    done: bool | None = None

    def poll(self) -> bool | None:
        """True once the checkpoint is in place, False if the child failed, None while it
        runs. Never blocks."""
        if self.done is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: the file says how it ended
                pid, status = self.pid, 0 if not self.tmp.exists() else 1
            if pid == 0:
                return None
            self.done = os.waitstatus_to_exitcode(status) == 0 if pid == self.pid else False
            if not self.done:
                self.tmp.unlink(missing_ok=True)
        return self.done

    def abandon(self) -> None:
        """Kill the child, wait for it and remove its temporary file: what it holds must not
        land (an owner forgotten since the fork) or outlive the partition here."""
        if self.poll() is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
            self.done = False
        self.tmp.unlink(missing_ok=True)


def fork_write(folder: Path, checkpoint: Checkpoint) -> Writer:
    """Write `checkpoint` into `folder` from a forked child; the returned Writer says when it
    is in place. The child dies with this process (a killed worker leaves no writer that
    could put back a checkpoint that a later forget removed)."""
    folder.mkdir(parents=True, exist_ok=True)
    tmp = _temporary(folder)
    parent = os.getpid()
    with warnings.catch_warnings():
        # LanceDB (and Python from 3.12) warn that another thread's state may deadlock a
        # forked child; the child never touches LanceDB or any other library's threads: it
        # pickles, writes and exits
        warnings.filterwarnings("ignore", message=".*fork.*")
        pid = os.fork()
    if pid == 0:
        _child(parent, tmp, folder, checkpoint)
    return Writer(pid, folder, tmp)


def _child(parent: int, tmp: Path, folder: Path, checkpoint: Checkpoint) -> NoReturn:
    code = 1
    try:
        # the loop's signal handlers write to its wakeup socket, which the parent shares: a
        # signal to the child would be handled as one to the worker
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        if _PRCTL is not None:
            _PRCTL(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the worker died before the line above
            os._exit(1)
        gc.disable()  # a collection would touch, and so copy, every page of the fold
        _write(folder, tmp, checkpoint)
        code = 0
    except BaseException:  # the parent sees the exit code; nothing may run the parent's code
        pass
    finally:
        os._exit(code)


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


def load(folder: Path, build: str) -> Checkpoint | None:
    path = folder / FILE
    if not path.exists():
        return None
    try:
        with open(path, "rb") as f, heap.long_lived_load():
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
