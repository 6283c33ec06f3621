"""Against a real broker: a worker's start, its restarts, its faults and its stop.

The broker drills (restart, reset) run a broker of their own in the test's folder, so that
stopping it touches no other test.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from pathlib import Path

import pytest

from mnemoflow.streams import topics as T
from mnemoflow.streams.admin import create_topics, existing_partitions
from mnemoflow.streams.kafka_local import LocalKafka
from mnemoflow.streams.preflight import connect, worker_preflight
from mnemoflow.streams.producer import AvroProducer
from mnemoflow.streams.reader import TopicReader
from mnemoflow.streams.worker import build_pipeline, internal_topics

from factories import T0, user_event
from support import WorkerProcess, isolated_settings, prepare_topics

pytestmark = pytest.mark.kafka


async def _send_messages(s, bs: str, sid: str, n: int, start: int = 1) -> None:
    async with AvroProducer(s, bs) as p:
        for i in range(start, start + n):
            await p.send(T.SESSION_EVENTS.name(s), "io.mnemoflow.SessionEvent", sid,
                         user_event(sid, i, f"We decided to roll out Atlas in stage {i}",
                                    T0 + i * 1000))


async def _gate_audits(s, bs: str, sid: str, n: int, timeout: float = 60) -> list[dict]:
    async with TopicReader(s, bs, [T.AUDIT.name(s)]) as r:
        def mine(rs):
            return [x.value for x in rs if x.value and x.value["sessionId"] == sid
                    and x.value["stage"] == "gate"]
        await r.wait_for(lambda rs: len(mine(rs)) >= n, timeout)
        return mine(await r.drain())


def _wait_exit(w: WorkerProcess, timeout: float) -> int:
    assert w.proc is not None
    try:
        return w.proc.wait(timeout)
    except subprocess.TimeoutExpired:
        w.kill()
        raise AssertionError(f"worker still running after {timeout}s: {w.log_tail()}") from None


async def test_a_worker_without_its_topics_says_so_in_one_line(kafka_bootstrap, tmp_path) -> None:
    s = isolated_settings(tmp_path, "notopics")  # topics never created
    w = WorkerProcess(s, kafka_bootstrap).start()
    assert _wait_exit(w, 60) == 2
    out = w.log_tail().strip().splitlines()
    assert len(out) == 1, out
    assert out[0].startswith(f"error: {len(T.CATALOGUE)} topic(s) missing") \
        and "mnemoflow topics create" in out[0]


async def test_changelog_topics_exist_with_their_partitions_before_faust_starts(
        kafka_bootstrap, tmp_path) -> None:
    """faust created them itself while its agents ran, and a table write that came before
    the new topic was in the consumer's metadata crashed the agent (PartitionsMismatch)."""
    s = isolated_settings(tmp_path, "changelogs", partitions=3).with_overrides(
        vector=False, graph=False)
    await prepare_topics(s, kafka_bootstrap)
    internal = internal_topics(build_pipeline(s, kafka_bootstrap).app)
    assert {t.name for t in internal} == {f"{s.app_id}-{n}-changelog" for n in (
        "observer-state", "gate-state", "broker-state", "evidence-state")}
    view = await worker_preflight(s, kafka_bootstrap, internal, timeout=30)
    assert sorted(view.created) == sorted(t.name for t in internal)
    admin = await connect(s, kafka_bootstrap, 10)
    try:
        have = await existing_partitions(admin, [t.name for t in internal])
    finally:
        await admin.close()
    assert have == {t.name: 3 for t in internal}
    again = await worker_preflight(s, kafka_bootstrap, internal, timeout=30)
    assert again.created == [] and again.end_offsets == view.end_offsets


async def test_an_agent_that_keeps_failing_stops_the_worker_and_loses_nothing(
        kafka_bootstrap, tmp_path) -> None:
    """A failing agent used to be restarted every few seconds for ever while the rest of the
    worker went on, and faust acked the record in hand at each crash, so the records it
    failed on were committed past and lost. Now the record is retried, the worker stops past
    the limit, and the next worker processes every record."""
    s = isolated_settings(tmp_path, "crashloop").with_overrides(
        fault_agents=("observer",), agent_max_retries=2, vector=False, graph=False)
    await prepare_topics(s, kafka_bootstrap)
    w = WorkerProcess(s, kafka_bootstrap).start()
    try:
        await w.wait_ready()
        await _send_messages(s, kafka_bootstrap, "s-crash", 4)
        assert _wait_exit(w, 90) == 1
    finally:
        w.stop()
    lines = [ln for ln in w.log_tail(20000).splitlines() if ln.startswith("error:")]
    assert lines == ["error: agent observer failed 3 times in a row (limit "
                     "MNEMOFLOW_AGENT_MAX_RETRIES=2); last: RuntimeError: injected fault in "
                     "agent observer (MNEMOFLOW_FAULT_AGENTS); stopping the worker"]
    with WorkerProcess(s.with_overrides(fault_agents=()), kafka_bootstrap) as again:
        await again.wait_ready()
        audits = await _gate_audits(s, kafka_bootstrap, "s-crash", 4)
    assert sorted({a["eventSeq"] for a in audits}) == [1, 2, 3, 4]


@pytest.fixture
def own_broker(tmp_path: Path):
    settings = isolated_settings(tmp_path, "ownbroker")
    broker = LocalKafka(settings)
    state = broker.up()
    try:
        yield broker, state.bootstrap
    finally:
        broker.down()


async def test_broker_restart_keeps_data_and_the_worker_recovers_by_itself(
        own_broker, tmp_path) -> None:
    broker, bs = own_broker
    s = isolated_settings(tmp_path, "restart", store="rocksdb://").with_overrides(
        vector=False, graph=False, shutdown_timeout_s=5.0)
    await create_topics(s, bs)
    w = WorkerProcess(s, bs).start()
    try:
        await w.wait_ready()
        await _send_messages(s, bs, "s-before", 3)
        before = await _gate_audits(s, bs, "s-before", 3)

        broker.down()
        log_size = w.log_path.stat().st_size
        await asyncio.sleep(12)  # the worker retries in the background meanwhile
        away_log = w.log_path.read_bytes()[log_size:].decode(errors="replace")
        assert broker.up().bootstrap == bs  # `up` keeps the address and every record
        await _send_messages(s, bs, "s-after", 2)
        after = await _gate_audits(s, bs, "s-after", 2, timeout=120)
        assert len(await _gate_audits(s, bs, "s-before", 3)) == len(before) == 3
        assert len(after) == 2
        # a failed connection is logged once per message template and 30 s, not each time
        lines = [ln for ln in away_log.splitlines() if "nable connect" in ln]
        assert len(lines) <= 6, away_log[-3000:]

        broker.down()  # a stop with the broker away is bounded all the same
        started = time.monotonic()
        w.stop()
        assert w.proc is not None and w.proc.returncode is not None
        assert time.monotonic() - started < s.shutdown_timeout_s + 5
    finally:
        w.stop()


async def test_a_reset_broker_makes_the_worker_drop_its_stale_state(own_broker, tmp_path) -> None:
    """The worker used to crash on faust's ConsistencyError ("persisted offset ... is
    higher than the last offset") after it had joined its group, so nothing was processed."""
    broker, bs = own_broker
    s = isolated_settings(tmp_path, "reset", store="rocksdb://").with_overrides(
        vector=False, graph=False)
    await create_topics(s, bs)
    with WorkerProcess(s, bs) as w:
        await w.wait_ready()
        await _send_messages(s, bs, "s-old", 3)
        await _gate_audits(s, bs, "s-old", 3)
    assert broker.reset()  # every topic, record and offset gone; the worker's files kept
    bs = broker.up().bootstrap
    await create_topics(s, bs)
    w2 = WorkerProcess(s.with_overrides(bootstrap=bs), bs).start()
    try:
        await w2.wait_ready()
        await _send_messages(s, bs, "s-new", 2)
        assert len(await _gate_audits(s, bs, "s-new", 2)) == 2
        log = w2.log_tail(20000)
        assert "ahead of the changelog" in log and "ConsistencyError" not in log
    finally:
        w2.stop()
