"""Test support: isolated settings per test module and a real worker subprocess."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mnemoflow.streams.admin import create_topics, group_stable
from mnemoflow.streams.config import Settings


def isolated_settings(tmp: Path, name: str, **kw: object) -> Settings:
    """Own topic prefix, app id and home: tests never see each other's records or state."""
    tag = f"{name}-{uuid.uuid4().hex[:8]}"
    return Settings(home=tmp / tag, topic_prefix=f"t.{tag}.", app_id=f"app-{tag}",
                    partitions=int(kw.pop("partitions", 4)), store=str(kw.pop("store", "memory://")),
                    bootstrap=None, **kw)  # type: ignore[arg-type]


async def prepare_topics(settings: Settings, bootstrap: str) -> None:
    await create_topics(settings, bootstrap)


def worker_env(settings: Settings, bootstrap: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(KAFKA_BOOTSTRAP=bootstrap, MNEMOFLOW_HOME=str(settings.home),
               MNEMOFLOW_TOPIC_PREFIX=settings.topic_prefix, MNEMOFLOW_APP_ID=settings.app_id,
               MNEMOFLOW_PARTITIONS=str(settings.partitions), MNEMOFLOW_STORE=settings.store)
    env["PYTHONUNBUFFERED"] = "1"  # the log is read after a SIGKILL too
    env["MNEMOFLOW_FAULT_TIERS"] = ",".join(settings.fault_tiers)
    env["MNEMOFLOW_VECTOR"] = "1" if settings.vector else "0"
    env["MNEMOFLOW_GRAPH"] = "1" if settings.graph else "0"
    env["MNEMOFLOW_CONSOLIDATE_INTERVAL_S"] = str(settings.consolidate_interval_s)
    env["MNEMOFLOW_CONSOLIDATE_IDLE_S"] = str(settings.consolidate_idle_s)
    if settings.weights_file:
        env["MNEMOFLOW_WEIGHTS"] = settings.weights_file
    return env


@dataclass
class WorkerProcess:
    settings: Settings
    bootstrap: str
    proc: subprocess.Popen | None = None

    def start(self) -> WorkerProcess:
        self.settings.home.mkdir(parents=True, exist_ok=True)
        log = open(self.settings.home / "worker.log", "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mnemoflow.streams.cli", "worker", "--loglevel",
             os.environ.get("MNEMOFLOW_TEST_WORKER_LOGLEVEL", "warn")],
            env=worker_env(self.settings, self.bootstrap), stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True)
        return self

    async def wait_ready(self, timeout: float = 90.0) -> None:
        """Ready when the faust consumer group is Stable with a member."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker exited {self.proc.returncode}: {self.log_tail()}")
            if await group_stable(self.settings, self.bootstrap, self.settings.app_id):
                await asyncio.sleep(1.0)  # let the assignment settle into the agents
                return
            await asyncio.sleep(0.5)
        raise TimeoutError(f"worker not ready in {timeout}s: {self.log_tail()}")

    def log_tail(self, n: int = 3000) -> str:
        try:
            return (self.settings.home / "worker.log").read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def kill(self) -> None:
        """SIGKILL: no shutdown hooks, no final commit, like a crash."""
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()


async def collect(settings: Settings, bootstrap: str, bases: list[str],
                  until: Callable[[dict[str, list[dict]]], bool], timeout: float = 60.0
                  ) -> dict[str, list[dict]]:
    """Read topics (by base name) from the start until `until(records by base)` holds."""
    from mnemoflow.streams.reader import TopicReader

    names = {f"{settings.topic_prefix}{b}": b for b in bases}
    async with TopicReader(settings, bootstrap, list(names)) as r:
        def grouped() -> dict[str, list[dict]]:
            out: dict[str, list[dict]] = {b: [] for b in bases}
            for rec in r.records:
                if rec.value is not None:
                    out[names[rec.topic]].append(rec.value)
            return out

        await r.wait_for(lambda _: until(grouped()), timeout)
        await r.drain()
        return grouped()


def broker_audits(recs: dict[str, list[dict]]) -> list[dict]:
    return [a for a in recs["audit"] if a["stage"] == "broker"]


def gate_audits(recs: dict[str, list[dict]]) -> list[dict]:
    return [a for a in recs["audit"] if a["stage"] == "gate"]
