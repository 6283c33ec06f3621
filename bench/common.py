"""Shared bench helpers: a broker to run against, a worker process, percentiles."""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from mnemoflow.streams.config import Settings
from mnemoflow.streams.kafka_local import LocalKafka

RESULTS = Path(__file__).resolve().parent / "results"


def bench_settings(name: str, **kw: object) -> Settings:
    base = Settings()
    tag = f"{name}-{uuid.uuid4().hex[:6]}"
    return base.with_overrides(topic_prefix=f"bench.{tag}.", app_id=f"bench-{tag}",
                               home=base.home / "bench" / tag, **kw)


def _our_child(pid: int) -> bool:
    try:
        os.waitpid(pid, os.WNOHANG)  # raises unless pid is our child; a running one is left be
    except ChildProcessError:
        return False
    return True


class StartedBroker:
    """A local broker this process started, and so the only one it may stop."""

    def __init__(self, kafka: LocalKafka, pid: int) -> None:
        self.kafka, self.pid = kafka, pid

    def stop(self) -> None:
        """Stop it if it is still ours: after a crash someone may have started another
        broker under the same home, and that one is not ours to stop. Idempotent."""
        st = self.kafka.status()
        if st is not None and st.pid == self.pid:
            self.kafka.down()


def _acquire(settings: Settings) -> tuple[str, StartedBroker | None]:
    if settings.bootstrap:
        return settings.bootstrap, None
    # the user's broker (the one `mnemoflow kafka up` manages, under MNEMOFLOW_HOME), not one
    # under the bench's own per-run home: a running one is reused and never stopped here
    k = LocalKafka(settings.with_overrides(home=Settings().home))
    running = k.status()
    if running:
        return running.bootstrap, None
    st = k.up()
    # up() also returns a broker that another process started since status() above; only
    # our own child is ours to stop
    return st.bootstrap, StartedBroker(k, st.pid) if _our_child(st.pid) else None


@contextmanager
def kafka_broker(settings: Settings) -> Iterator[str]:
    """The bootstrap to bench against: KAFKA_BOOTSTRAP, the running local broker, or a new
    one. A broker started here is stopped on the way out, whichever way that is (return,
    exception, Ctrl-C, a cancelled task); one that was already there is left running."""
    bootstrap, started = _acquire(settings)
    try:
        yield bootstrap
    finally:
        if started is not None:
            started.stop()


def broker(settings: Settings) -> tuple[str, bool]:
    """(bootstrap, started_here), like kafka_broker() for callers without a `with` block: a
    broker started here is stopped when the process exits (atexit: a normal exit, an
    uncaught exception or Ctrl-C; not SIGTERM or SIGKILL). Prefer kafka_broker()."""
    bootstrap, started = _acquire(settings)
    if started is not None:
        atexit.register(started.stop)
    return bootstrap, started is not None


def start_worker(settings: Settings, bootstrap: str, **extra_env: str) -> subprocess.Popen:
    settings.home.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, KAFKA_BOOTSTRAP=bootstrap, MNEMOFLOW_HOME=str(settings.home),
               MNEMOFLOW_TOPIC_PREFIX=settings.topic_prefix, MNEMOFLOW_APP_ID=settings.app_id,
               MNEMOFLOW_STORE=settings.store, **extra_env)
    log = open(settings.home / "worker.log", "ab")
    return subprocess.Popen([sys.executable, "-m", "mnemoflow.streams.cli", "worker"], env=env,
                            stdout=log, stderr=subprocess.STDOUT)


def _cpu_s(stat: str) -> tuple[str, float]:
    """(name, user + system CPU seconds) from a /proc stat line."""
    name = stat[stat.index("(") + 1:stat.rindex(")")]
    fields = stat[stat.rindex(")") + 2:].split()
    return name, (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_cpu_s(pid: int) -> Counter[str]:
    """CPU seconds each thread name of a process has used so far, summed over the threads of
    that name (/proc/<pid>/task/*/stat). LanceDB's Rust threads are `lancedb-tokio-w`; the
    Python threads, and the ONNX Runtime threads they start, are all `python`. A thread that
    ended is no longer counted, so take the difference of two calls over a phase whose
    threads outlive it."""
    out: Counter[str] = Counter()
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            name, cpu = _cpu_s(Path(f"/proc/{pid}/task/{tid}/stat").read_text())
        except OSError:  # the thread ended meanwhile
            continue
        out[name] += cpu
    return out


def process_cpu_s(pid: int) -> float:
    """CPU seconds a process has used so far, every thread (ended ones too)."""
    return _cpu_s(Path(f"/proc/{pid}/stat").read_text())[1]


def local_broker_pid() -> int | None:
    """The pid of the local broker `mnemoflow kafka up` runs, when the benches use it (no
    KAFKA_BOOTSTRAP) and it runs."""
    settings = Settings()
    st = None if settings.bootstrap else LocalKafka(settings).status()
    return st.pid if st is not None else None


def _status_mib(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def peak_rss_mib(pid: int) -> float:
    return _status_mib(pid, "VmHWM")


def rss_mib(pid: int) -> float:
    return _status_mib(pid, "VmRSS")


def private_dirty_mib(pid: int) -> float:
    """Pages a process wrote since it forked (copied, not shared with its parent); 0 once it
    is gone."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0.0
    return sum(int(line.split()[1]) for line in text.splitlines()
               if line.startswith("Private_Dirty:")) / 1024


def pct(xs: list[float]) -> dict[str, float]:
    a = np.asarray(xs, dtype=float)
    return {"p50": float(np.percentile(a, 50)), "p95": float(np.percentile(a, 95)),
            "p99": float(np.percentile(a, 99)), "n": len(xs)}


def fmt(d: dict[str, float], unit: str = "ms") -> str:
    return f"p50 {d['p50']:.2f}{unit}  p95 {d['p95']:.2f}{unit}  p99 {d['p99']:.2f}{unit}  (n={d['n']})"


def now_ms() -> float:
    return time.perf_counter() * 1000


def write_results(name: str, out: dict) -> None:
    """bench/results/<name>.json, the figures the README quotes (numpy floats as floats)."""
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(out, indent=2, default=float))
