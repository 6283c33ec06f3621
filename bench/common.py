"""Shared bench helpers: a broker to run against, a worker process, percentiles."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
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


def broker(settings: Settings) -> tuple[str, bool]:
    """(bootstrap, started_here): KAFKA_BOOTSTRAP, the running local broker, or a new one."""
    if settings.bootstrap:
        return settings.bootstrap, False
    k = LocalKafka(settings.with_overrides(home=Settings().home))
    running = k.status()
    if running:
        return running.bootstrap, False
    return k.up().bootstrap, True


def start_worker(settings: Settings, bootstrap: str) -> subprocess.Popen:
    settings.home.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, KAFKA_BOOTSTRAP=bootstrap, MNEMOFLOW_HOME=str(settings.home),
               MNEMOFLOW_TOPIC_PREFIX=settings.topic_prefix, MNEMOFLOW_APP_ID=settings.app_id,
               MNEMOFLOW_STORE=settings.store)
    log = open(settings.home / "worker.log", "ab")
    return subprocess.Popen([sys.executable, "-m", "mnemoflow.streams.cli", "worker"], env=env,
                            stdout=log, stderr=subprocess.STDOUT)


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


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
