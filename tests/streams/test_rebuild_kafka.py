"""`mnemoflow rebuild` after a loss gives back the recall of before the loss, through a real
broker, real workers and the real command, on the path a user takes: memories stored and a
question answered; the broker reset (every topic gone, the memory-log with them), up again,
`rebuild --from markdown`, a worker, the same question. Then the index and MEMORY.md deleted,
`rebuild --from memory-log`, a worker, the same question.

The test runs its own local broker in its own MNEMOFLOW_HOME, so that it can reset it. The
workers use the `projected` recall barrier (as `mnemoflow eval` does): the first answer then
comes from a fully embedded index, as every later one does, so the packets can be compared.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from mnemoflow.projections.markdown import events_from_markdown
from mnemoflow.streams.config import Settings
from mnemoflow.streams.host import CapabilityManifest, HostClient
from mnemoflow.streams.kafka_local import KafkaSetupError, LocalKafka
from mnemoflow.streams.restore import read_memory_log, restore_from_markdown
from mnemoflow.streams.worker import memory_dir

from factories import T0
from support import WorkerProcess, broker_audits, collect, isolated_settings, prepare_topics, worker_env

pytestmark = pytest.mark.kafka
MANIFEST = CapabilityManifest(provider="test", model="m", supportsPreStep=True)
DAY = 86_400_000
USER = "ana"
MESSAGES = ["My sister Marta lives in Porto and works as a nurse.",
            "I parked the blue van on level 3 of the airport garage.",
            "Our wifi password at the cabin is larch-delta-42.",
            "I am allergic to peanuts, so no satay for me.",
            "My locker code at the gym is 5512."]  # a fact too (subject, predicate, object)
QUESTION = "Where did I park the van at the airport?"
WORKER_ENV = {"MNEMOFLOW_RECALL_BARRIER": "projected", "MNEMOFLOW_BARRIER_TIMEOUT_S": "60",
              "MNEMOFLOW_VECTOR_TIMEOUT_S": "30"}
# what a restored record must carry over from the one it was made from
FIELDS = ("op", "memoryId", "kind", "scope", "owner", "sessionId", "eventSeq", "eventTime", "text",
          "entities", "provenance", "source", "confidence", "ttlMs", "subject", "predicate",
          "object", "riskLevel", "attributes")
timings: dict[str, float] = {}


async def _start_worker(s: Settings, bootstrap: str) -> WorkerProcess:
    w = WorkerProcess(s, bootstrap, extra_env=dict(WORKER_ENV)).start()
    try:
        await w.wait_ready(120)
    except BaseException:
        w.stop()
        raise
    return w


async def _ask(s: Settings, bootstrap: str, session: str) -> dict[str, Any]:
    """Ask QUESTION in a new session of USER; the broker's decision and the packet's items."""
    async with HostClient(s, bootstrap) as host:
        ask = host.session(session, USER)
        await ask.lifecycle("start", T0 + DAY, MANIFEST)
        await ask.user_message(QUESTION, T0 + DAY + 1, remember=False)

    def answered(r: dict[str, list[dict]]) -> bool:
        done = [a for a in broker_audits(r) if a["sessionId"] == session]
        return bool(done) and (done[0]["action"] != "inject" or any(
            op["op"] == "inject" and op["sessionId"] == session for op in r["inbox"]))

    recs = await collect(s, bootstrap, ["audit", "inbox"], answered, 90)
    audit = next(a for a in broker_audits(recs) if a["sessionId"] == session)
    packets = [op["packet"] for op in recs["inbox"] if op["op"] == "inject"
               and op["sessionId"] == session]
    return {"action": audit["action"], "reason": audit["reason"], "tiers": audit["tiers"],
            "candidates": [(c["memoryId"], c["outcome"], round(c["score"], 4))
                           for c in audit["candidates"]],
            "items": [(it["memoryId"], it["kind"], it["text"], tuple(it["tiers"]), it["score"])
                      for p in packets for it in p["items"]]}


async def _ask_a_new_worker(s: Settings, bootstrap: str, session: str) -> dict[str, Any]:
    """`_ask`, answered by a worker started for this question and stopped after it."""
    w = await _start_worker(s, bootstrap)
    try:
        return await _ask(s, bootstrap, session)
    finally:
        w.stop()


def _same_answer(after: dict[str, Any], before: dict[str, Any]) -> None:
    assert after["action"] == before["action"] == "inject", after
    assert after["tiers"] == before["tiers"]
    assert [it[:4] for it in after["items"]] == [it[:4] for it in before["items"]]
    for a, b in zip(after["items"], before["items"], strict=True):
        assert a[4] == pytest.approx(b[4], abs=1e-4)  # MiniLM batch noise in the last bits
    assert [c[:2] for c in after["candidates"]] == [c[:2] for c in before["candidates"]]


def _cli(s: Settings, *args: str) -> str:
    """The `mnemoflow` command in a child process, with the local broker found the way a
    user's shell finds it (MNEMOFLOW_HOME, no KAFKA_BOOTSTRAP)."""
    env = worker_env(s, "unused")
    del env["KAFKA_BOOTSTRAP"]
    t = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "mnemoflow.streams.cli", *args], env=env,
                         capture_output=True, text=True, timeout=300)
    timings[" ".join(args)] = time.monotonic() - t
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout


def _memory_files(s: Settings) -> list[Path]:
    return sorted((s.home / "markdown" / s.app_id).rglob("MEMORY.md"))


async def _wait_markdown(s: Settings, texts: list[str], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        shown = {e["text"] for e in events_from_markdown(s.home / "markdown" / s.app_id)}
        if set(texts) <= shown:
            return
        await asyncio.sleep(0.25)
    raise TimeoutError("MEMORY.md never showed the memories")


@pytest.fixture
async def own_broker(tmp_path):
    s = isolated_settings(tmp_path, "rebuild")
    broker = LocalKafka(s)
    try:  # on a thread: up() runs its readiness probe in an event loop of its own
        await asyncio.to_thread(broker.up)
    except KafkaSetupError as exc:  # no Java or jars here: this test needs a broker it can reset
        pytest.skip(f"cannot start a local broker to reset: {exc}")
    try:
        yield s, broker
    finally:
        await asyncio.to_thread(broker.down)


async def test_recall_after_a_lost_memory_log_and_a_lost_index(own_broker) -> None:
    s, broker = own_broker
    started = time.monotonic()
    bootstrap = broker.status().bootstrap
    await prepare_topics(s, bootstrap)
    w = await _start_worker(s, bootstrap)
    try:
        async with HostClient(s, bootstrap) as host:
            mem = host.session("mem", USER)
            await mem.lifecycle("start", T0, MANIFEST)
            for i, text in enumerate(MESSAGES, start=1):
                await mem.user_message(text, T0 + i * 1000)
        await _wait_markdown(s, MESSAGES)
        before = await _ask(s, bootstrap, "ask-before")
        original = await read_memory_log(s, bootstrap)
    finally:
        w.stop()
    assert before["action"] == "inject" and before["items"], before
    assert any("vector" in it[3] for it in before["items"])  # the index answered, not only BM25
    assert any("level 3" in it[2] for it in before["items"])
    assert {ev["kind"] for ev in original} >= {"segment", "fact"}

    # the loss: the broker's data is deleted (every topic, so the memory-log too); up again
    await asyncio.to_thread(broker.reset)
    await asyncio.to_thread(broker.up)
    bootstrap = broker.status().bootstrap
    out = _cli(s, "rebuild", "--from", "markdown")
    assert "restored" in out and "rebuilt from" in out, out
    restored = await read_memory_log(s, bootstrap)
    assert restored, out
    first = {}
    for ev in original:
        first.setdefault(ev["memoryId"], ev)
    assert {ev["memoryId"] for ev in restored} == set(first)  # every memory is back
    for ev in restored:  # the records they were made from, field for field
        assert {k: ev[k] for k in FIELDS} == {k: first[ev["memoryId"]][k] for k in FIELDS}
    again = await restore_from_markdown(s, bootstrap, s.home / "markdown" / s.app_id)
    assert again.appended == 0 and again.log_records == len(restored)  # idempotent
    assert len(await read_memory_log(s, bootstrap)) == len(restored)

    _same_answer(await _ask_a_new_worker(s, bootstrap, "ask-after-markdown"), before)

    # the index and MEMORY.md lost, the memory-log kept
    kept = {e["memoryId"]: e for e in events_from_markdown(s.home / "markdown" / s.app_id)}
    shutil.rmtree(memory_dir(s))
    for path in _memory_files(s):
        path.unlink()
    out = _cli(s, "rebuild", "--from", "memory-log")
    assert _memory_files(s), out
    assert {e["memoryId"]: e for e in events_from_markdown(s.home / "markdown" / s.app_id)} == kept
    _same_answer(await _ask_a_new_worker(s, bootstrap, "ask-after-memory-log"), before)
    timings["total"] = time.monotonic() - started
    print("timings (s):", {k: round(v, 1) for k, v in timings.items()}, file=sys.stderr)
