"""A worker's life: local state checked against the cluster, a bounded shutdown, a restart
limit per agent, a health file, and logs that stay readable while the broker is away.

Nothing here knows the pipeline: `streams/worker.py` wires it to the faust app it builds.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

EXIT_FATAL = 1  # an agent crashed past its restart limit, or recovery failed
EXIT_PREFLIGHT = 2  # the broker, a topic or a setting is missing: nothing ran


# -- local table state ---------------------------------------------------------------------

def read_persisted_offset(db_path: Path, key: bytes) -> int | None:
    """The changelog offset a faust RocksDB partition store says it holds, read-only."""
    from rocksdict import AccessType, Rdict

    db = Rdict(str(db_path), access_type=AccessType.read_only())
    try:
        value = db.get(key)
        return int(value) if value is not None else None
    finally:
        db.close()


def stale_partitions(stores: dict[tuple[str, int], Path], end_offsets: dict[tuple[str, int], int],
                     offset_key: bytes) -> list[str]:
    """Partition stores whose persisted offset is past their changelog's last record: the
    broker was reset or replaced, so the local state describes records that no longer exist
    (faust refuses to start on it: "persisted offset ... is higher than the last offset")."""
    stale = []
    for (topic, partition), path in sorted(stores.items()):
        if not path.exists():
            continue
        try:
            persisted = read_persisted_offset(path, offset_key)
        except Exception:  # unreadable: a store we cannot trust either
            stale.append(f"{topic}[{partition}] (unreadable)")
            continue
        last = end_offsets.get((topic, partition), 0) - 1
        if persisted is not None and persisted > last:
            stale.append(f"{topic}[{partition}] at {persisted} > {last}")
    return stale


def drop_local_state(tabledir: Path, why: str) -> None:
    log.warning("local table state in %s is ahead of the changelog (%s): removing it and "
                "restoring from the changelog", tabledir, why)
    shutil.rmtree(tabledir, ignore_errors=True)


# -- bounded shutdown ------------------------------------------------------------------------

def _exit_now(code: int) -> None:
    logging.shutdown()  # flush what the log holds: the process ends without its atexit hooks
    os._exit(code)


@dataclass
class Watchdog:
    """Ends the process if a stop takes longer than its bound: a stop waits for the broker
    (commits, leaving the group), and a broker that is away would make it wait forever."""

    timeout_s: float
    exit: Callable[[int], None] = field(default=lambda code: _exit_now(code))
    _timer: threading.Timer | None = None

    def arm(self, code: int, why: str) -> None:
        if self._timer is not None:
            return
        self._timer = threading.Timer(self.timeout_s, self._fire, args=(code, why))
        self._timer.daemon = True
        self._timer.start()

    def _fire(self, code: int, why: str) -> None:
        log.error("worker did not stop within %.0fs after %s: exiting now", self.timeout_s, why)
        self.exit(code)

    def disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()


# -- restart limit ---------------------------------------------------------------------------

@dataclass
class CrashLimit:
    """Counts each agent's failures in a row; past `max_retries` the worker must stop, because
    a worker that keeps running without one of its stages loses that stage's work without a
    sign. A success resets the count: an agent that fails now and then is not stopped."""

    max_retries: int
    failures: dict[str, int] = field(default_factory=dict)
    fatal: str | None = None

    def failed(self, agent: str, exc: BaseException) -> bool:
        """Record a failure; True when it is one too many (said once)."""
        n = self.failures[agent] = self.failures.get(agent, 0) + 1
        if n > self.max_retries and self.fatal is None:
            first = str(exc).splitlines()[0] if str(exc) else ""
            self.fatal = (f"agent {agent} failed {n} times in a row (limit "
                          f"MNEMOFLOW_AGENT_MAX_RETRIES={self.max_retries}); last: "
                          f"{type(exc).__name__}: {first}")
            return True
        return False

    def succeeded(self, agent: str) -> None:
        self.failures.pop(agent, None)


# -- health ----------------------------------------------------------------------------------

STALE_AFTER_S = 15.0  # a health file older than this belongs to a stuck or dead worker
MAX_TEMPLATES = 10_000  # distinct message templates a RepeatFilter remembers


@dataclass
class Health:
    """A JSON file per worker process that says what it is doing, rewritten every few
    seconds: `mnemoflow health` reads it. The worker adds to `extra` where its metrics server
    listens (`metrics_port`), so operators and tests find a port the OS chose."""

    path: Path
    app_id: str
    status: str = "starting"
    detail: str = ""
    since: float = field(default_factory=time.time)
    extra: dict[str, Any] = field(default_factory=dict)

    def set(self, status: str, detail: str = "", **extra: Any) -> None:
        if status != self.status:
            self.since = time.time()
        self.status, self.detail = status, detail
        self.extra.update(extra)
        self.write()

    def write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"app": self.app_id, "pid": os.getpid(), "status": self.status,
                                   "detail": self.detail, "since": self.since,
                                   "updated": time.time(), **self.extra}))
        os.replace(tmp, self.path)

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


def health_dir(home: Path) -> Path:
    return home / "health"


def read_health(home: Path, app_id: str, now: float | None = None) -> list[dict[str, Any]]:
    """The health of every live worker of `app_id` under `home` (dead pids are left out)."""
    now = time.time() if now is None else now
    out = []
    for path in sorted(health_dir(home).glob(f"{app_id}.*.json")):
        try:
            h = json.loads(path.read_text())
            os.kill(int(h["pid"]), 0)
        except (OSError, ValueError, KeyError):
            continue
        if h.get("app", app_id) != app_id:  # the glob also matches app ids with dots
            continue
        h["fresh"] = now - float(h.get("updated", 0)) < STALE_AFTER_S
        out.append(h)
    return out


# -- logs while the broker is away -----------------------------------------------------------

class RepeatFilter(logging.Filter):
    """Lets one line of a given message template through per `every_s` seconds, and says how
    many it held back. A broker that is down makes the Kafka client log each failed
    connection (about 33 MB a minute at warn level); one line every 30 s says the same."""

    def __init__(self, every_s: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.every_s, self.clock = every_s, clock
        self._last: dict[tuple[str, str], float] = {}
        self._held: dict[tuple[str, str], int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR and record.exc_info:
            return True  # tracebacks are rare and each one matters
        key = (record.name, str(record.msg))
        now = self.clock()
        if len(self._last) > MAX_TEMPLATES:  # pre-formatted messages are each their own key
            self._last.clear()
            self._held.clear()
        last = self._last.get(key)
        if last is not None and now - last < self.every_s:
            self._held[key] = self._held.get(key, 0) + 1
            return False
        self._last[key] = now
        held = self._held.pop(key, 0)
        if held:
            record.msg = f"{record.msg} [{held} like this in the last {self.every_s:.0f}s held back]"
        return True


def limit_repeats(every_s: float = 30.0) -> None:
    """A RepeatFilter of its own on every handler of the root logger that has none (one filter
    shared by two handlers would take the second handler's copy of a line for a repeat)."""
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, RepeatFilter) for f in handler.filters):
            handler.addFilter(RepeatFilter(every_s))
