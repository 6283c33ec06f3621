"""Test support: isolated settings per test module and a real worker subprocess."""

from __future__ import annotations

import argparse
import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mnemoflow.streams import process
from mnemoflow.streams.admin import create_topics
from mnemoflow.streams.config import Settings


def isolated_settings(tmp: Path, name: str, **kw: object) -> Settings:
    """Own topic prefix, app id and home: tests never see each other's records or state.

    Recall waits up to 30 s (not 2) for the memory-log projection: the tests check what recall
    answers, and a restarted worker refolding the log on a loaded machine (other tests, a CI
    neighbour) can take longer than 2 s, after which recall would answer from a partial store."""
    tag = f"{name}-{uuid.uuid4().hex[:8]}"
    kw.setdefault("barrier_timeout_s", 30.0)
    return Settings(home=tmp / tag, topic_prefix=f"t.{tag}.", app_id=f"app-{tag}",
                    partitions=int(kw.pop("partitions", 4)), store=str(kw.pop("store", "memory://")),
                    bootstrap=None, **kw)  # type: ignore[arg-type]


async def prepare_topics(settings: Settings, bootstrap: str) -> None:
    await create_topics(settings, bootstrap)


def worker_env(settings: Settings, bootstrap: str) -> dict[str, str]:
    return process.worker_env(settings, bootstrap)


@dataclass
class WorkerProcess(process.WorkerProcess):
    """The shared child-process worker, at the log level the test run asks for."""

    loglevel: str = field(
        default_factory=lambda: os.environ.get("MNEMOFLOW_TEST_WORKER_LOGLEVEL", "warn"))


@asynccontextmanager
async def ready_worker(settings: Settings, bootstrap: str) -> AsyncIterator[WorkerProcess]:
    """Topics created, a worker started and ready; stopped on the way out."""
    await prepare_topics(settings, bootstrap)
    w = WorkerProcess(settings, bootstrap).start()
    try:
        await w.wait_ready()
        yield w
    finally:
        w.stop()


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


async def run_cli(module: Any, settings: Settings, capsys: Any, *argv: str, rc: int = 0) -> str:
    """`mnemoflow <argv>` through the subcommand module's own parser (`module.add_parser`), off
    the event loop (it runs its own); its stdout, or its stderr when `rc` is not 0."""
    parser = argparse.ArgumentParser(prog="mnemoflow")
    module.add_parser(parser.add_subparsers(dest="cmd", required=True))
    args = parser.parse_args(list(argv))
    capsys.readouterr()
    got = await asyncio.to_thread(args.func, args, settings)
    out = capsys.readouterr()
    assert got == rc, out.err
    return out.out if rc == 0 else out.err
