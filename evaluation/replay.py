"""Drive a benchmark through the real broker and worker as host traffic, using the host SDK."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from aiokafka import TopicPartition
from rich.progress import Progress

from mnemoflow.evaluation.datasets import Benchmark
from mnemoflow.evaluation.replay_log import ReplayLog, send_haystack
from mnemoflow.streams import topics as T
from mnemoflow.streams.admin import admin_client
from mnemoflow.streams.config import Settings
from mnemoflow.streams.host import CapabilityManifest, HostClient
from mnemoflow.streams.inbox import InboxClient
from mnemoflow.streams.reader import TopicReader
from mnemoflow.streams.step import StepAssembler


def manifest(mode: str) -> CapabilityManifest:
    """soft: a pre-step packet surface; shadow: none, so the pipeline records and never injects."""
    return CapabilityManifest(provider="eval", model="replay", reasoning="none",
                              supportsPreStep=mode == "soft")


@dataclass
class AuditWatch:
    """Incremental view of the audit topic: which sessions' decisions have arrived."""

    reader: TopicReader
    gate: dict[str, set[str]] = field(default_factory=dict)  # session -> gate audit ids
    fired: dict[str, set[str]] = field(default_factory=dict)  # session -> request ids
    brokered: set[str] = field(default_factory=set)

    alive: Callable[[], bool] = lambda: True
    stall_s: float = 600.0  # no audit record for this long while waiting: the wait cannot end
    _last_news: float | None = None

    async def poll(self) -> None:
        if not self.alive():
            raise RuntimeError("the worker stopped during the replay; see its log")
        got = await self.reader.poll(200)
        now = time.monotonic()
        if got or self._last_news is None:
            self._last_news = now
        elif now - self._last_news > self.stall_s:
            raise RuntimeError(f"no audit record for {self.stall_s:.0f} s while waiting for "
                               f"{sum(map(len, self.gate.values()))} gate decisions so far; "
                               "an event without its decision (see the worker log)")
        for r in got:
            a = r.value
            if not a:
                continue
            if a["stage"] == "gate":
                self.gate.setdefault(a["sessionId"], set()).add(a["auditId"])
                if a["requestId"]:
                    self.fired.setdefault(a["sessionId"], set()).add(a["requestId"])
            elif a["stage"] == "broker":
                self.brokered.add(a["requestId"])

    def gated(self, sessions: set[str] | dict) -> int:
        return sum(len(self.gate.get(s, ())) for s in sessions)

    def settled(self, sessions: dict) -> bool:
        return all(self.fired.get(s, set()) <= self.brokered for s in sessions)


async def wait_projection(settings: Settings, bootstrap: str, timeout: float = 3600) -> None:
    """Until the projector group has committed the memory-log's end on every partition."""
    admin = admin_client(settings, bootstrap)
    await admin.start()
    reader = TopicReader(settings, bootstrap, [T.MEMORY_LOG.name(settings)])
    deadline = time.monotonic() + timeout
    try:
        async with reader:
            ends = await reader._c.end_offsets(reader._tps)
            while time.monotonic() < deadline:
                got = await admin.list_consumer_group_offsets(f"{settings.app_id}-projector")
                done = {tp: md.offset for tp, md in got.items()}
                if all(done.get(TopicPartition(tp.topic, tp.partition), 0) >= end
                       for tp, end in ends.items()):
                    return
                await asyncio.sleep(0.5)
    finally:
        await admin.close()
    raise TimeoutError("memory-log projection did not catch up")


async def replay(bench: Benchmark, settings: Settings, bootstrap: str, mode: str,
                 progress: Progress | None = None,
                 alive: Callable[[], bool] = lambda: True) -> ReplayLog:
    log = ReplayLog(mode)
    man = manifest(mode)
    t0 = time.monotonic()
    async with HostClient(settings, bootstrap) as host, \
            TopicReader(settings, bootstrap, [T.AUDIT.name(settings)]) as reader:
        audit = AuditWatch(reader, alive=alive)
        task = progress.add_task("haystack turns", total=sum(len(s.turns) for s in bench.sessions)) \
            if progress else None
        await send_haystack(bench, host.session, man, log,
                            (lambda: progress.advance(task)) if progress else (lambda: None))
        hay = set(log.haystack_sessions)
        wait = progress.add_task("pipeline catching up", total=log.haystack_events) \
            if progress else None
        while audit.gated(hay) < log.haystack_events:
            await audit.poll()
            if progress:
                progress.update(wait, completed=audit.gated(hay))
        await wait_projection(settings, bootstrap)
        log.wall_s["haystack"] = time.monotonic() - t0

        t1 = time.monotonic()
        qtask = progress.add_task("questions", total=len(bench.questions)) if progress else None
        sessions = {}
        for q in bench.questions:
            sid = f"{q.user}/q/{q.qid}"
            log.question_sessions[sid] = q.qid
            qs = host.session(sid, q.user)
            sessions[sid] = (qs, q)
            await qs.lifecycle("start", q.time_ms - 1000, man)
            await qs.user_message(q.text, q.time_ms, remember=False)
        # every question has its gate decisions (lifecycle + message), and a broker decision
        # for every request the gate made
        while audit.gated(sessions) < 2 * len(sessions) or not audit.settled(sessions):
            await audit.poll()
            if progress:
                progress.update(qtask, completed=audit.gated(sessions) // 2)
        log.wall_s["questions"] = time.monotonic() - t1

        # the step boundary after each question claims its packets
        t2 = time.monotonic()
        inbox = InboxClient(settings, bootstrap, host.producer)
        await inbox.start()
        try:
            for qs, q in sessions.values():
                step = StepAssembler(qs, inbox, man)
                await step.step_boundary(q.time_ms + 1000)
        finally:
            await inbox.stop()
        log.wall_s["claims"] = time.monotonic() - t2
    return log
