"""A worker in a child process, for the demo, the evaluation and the tests: started with the
caller's settings, ready when its health file says so, and stopped on every exit path."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from mnemoflow.streams.config import Settings
from mnemoflow.streams.lifecycle import read_health


def worker_env(settings: Settings, bootstrap: str, **extra: str) -> dict[str, str]:
    """The environment that gives a child worker exactly these settings."""
    env = dict(os.environ)
    env.update(KAFKA_BOOTSTRAP=bootstrap, MNEMOFLOW_HOME=str(settings.home),
               MNEMOFLOW_TOPIC_PREFIX=settings.topic_prefix, MNEMOFLOW_APP_ID=settings.app_id,
               MNEMOFLOW_PARTITIONS=str(settings.partitions), MNEMOFLOW_STORE=settings.store,
               MNEMOFLOW_FAULT_TIERS=",".join(settings.fault_tiers),
               MNEMOFLOW_FAULT_AGENTS=",".join(settings.fault_agents),
               MNEMOFLOW_CONNECT_TIMEOUT_S=str(settings.connect_timeout_s),
               MNEMOFLOW_VECTOR="1" if settings.vector else "0",
               MNEMOFLOW_GRAPH="1" if settings.graph else "0",
               MNEMOFLOW_CONSOLIDATE_INTERVAL_S=str(settings.consolidate_interval_s),
               MNEMOFLOW_CONSOLIDATE_IDLE_S=str(settings.consolidate_idle_s),
               MNEMOFLOW_SHUTDOWN_TIMEOUT_S=str(settings.shutdown_timeout_s),
               MNEMOFLOW_AGENT_MAX_RETRIES=str(settings.agent_max_retries),
               MNEMOFLOW_SESSION_TIMEOUT_S=str(settings.session_timeout_s),
               MNEMOFLOW_HOST_TIMEOUT_S=str(settings.host_timeout_s),
               MNEMOFLOW_RECALL_BARRIER=settings.recall_barrier,
               MNEMOFLOW_EMBEDDING_MODEL=settings.embedding_model,
               MNEMOFLOW_BARRIER_TIMEOUT_S=str(settings.barrier_timeout_s),
               MNEMOFLOW_RECALL_BATCH=str(settings.recall_batch),
               MNEMOFLOW_VECTOR_TIMEOUT_S=str(settings.vector_timeout_s),
               MNEMOFLOW_MAX_PAYLOAD_BYTES=str(settings.max_payload_bytes),
               MNEMOFLOW_SEAL="1" if settings.seal else "0",
               MNEMOFLOW_KEK_FILE=str(settings.kek_path),
               PYTHONUNBUFFERED="1")  # the log is read after a SIGKILL too
    if settings.weights_file:
        env["MNEMOFLOW_WEIGHTS"] = settings.weights_file
    env.update(extra)
    return env


@dataclass
class WorkerProcess:
    settings: Settings
    bootstrap: str
    loglevel: str = "warn"
    extra_env: dict[str, str] = field(default_factory=dict)
    log_path: Path | None = None
    proc: subprocess.Popen | None = None

    def start(self) -> WorkerProcess:
        self.settings.home.mkdir(parents=True, exist_ok=True)
        self.log_path = self.log_path or self.settings.home / "worker.log"
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mnemoflow.streams.cli", "worker", "--loglevel", self.loglevel],
            env=worker_env(self.settings, self.bootstrap, **self.extra_env), stdout=log,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        return self

    def ready(self) -> bool:
        """The worker's own word: its partitions are assigned and its tables restored."""
        assert self.proc is not None
        return any(h["pid"] == self.proc.pid and h["status"] == "ready" and h["fresh"]
                   for h in read_health(self.settings.home, self.settings.app_id))

    async def wait_ready(self, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker exited {self.proc.returncode}: {self.log_tail()}")
            if self.ready():
                return
            await asyncio.sleep(0.25)
        raise TimeoutError(f"worker not ready in {timeout}s: {self.log_tail()}")

    def log_tail(self, n: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:] if self.log_path else ""
        except OSError:
            return ""

    def kill(self) -> None:
        """SIGKILL: no shutdown hooks, no final commit, like a crash."""
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL if the worker's own bound (plus a margin) passes."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(self.settings.shutdown_timeout_s + 5)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.returncode

    def __enter__(self) -> WorkerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
