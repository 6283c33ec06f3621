"""Scale-out against the real broker: 200 sessions of 50 users, run by one worker, by two
workers in one group, and by three, one of which is SIGKILLed midway. The others take its partitions over
(the memory-log partitions with them) and finish: every question is answered, with the same
packets as the single worker gave, and no user's memory reaches another user's packet.

Vectors and graph are off, as in the crash test: which items a packet holds would otherwise
depend on how far embedding had got when the worker died.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter

import pytest

from mnemoflow.streams.host import CapabilityManifest, HostClient
from mnemoflow.streams.lifecycle import read_health

from factories import T0
from support import WorkerProcess, broker_audits, collect, isolated_settings, prepare_topics

pytestmark = pytest.mark.kafka
USERS, ASKS = 50, 3  # 50 telling sessions and 150 asking ones
MANIFEST = CapabilityManifest(provider="test", model="m", supportsPreStep=True)
DAY = 86_400_000
# a run takes about 35 s; past this the workers have stalled, and the test says where, well
# inside pytest's own timeout (which would say nothing)
ANSWER_BOUND_S = 150


async def _tell(s, bs) -> None:
    async with HostClient(s, bs) as host:
        for u in random.Random(5).sample(range(USERS), USERS):
            ses = host.session(f"mem-{u}", f"user-{u}")
            await ses.lifecycle("start", T0 + u, MANIFEST)
            await ses.user_message(f"My locker code is zq{u:03d}x and my favourite colour is "
                                   f"shade{u:03d}.", T0 + 1000 + u)


async def _ask(s, bs) -> None:
    asks = [(u, k) for u in range(USERS) for k in range(ASKS)]
    async with HostClient(s, bs) as host:
        for u, k in random.Random(9).sample(asks, len(asks)):
            ses = host.session(f"ask-{u}-{k}", f"user-{u}")
            t = T0 + DAY * (k + 1) + u
            await ses.lifecycle("start", t, MANIFEST)
            await ses.user_message("What is my locker code? I forgot it.", t + 1000)


def _told(recs) -> bool:
    return len({m["memoryId"] for m in recs["memory-log"]
                if m["op"] == "segment_recorded" and m["sessionId"].startswith("mem-")}) >= USERS


def _asked(n: int):
    return lambda r: len({a["sessionId"] for a in broker_audits(r)
                          if a["sessionId"].startswith("ask-")}) >= n


def _answered(r) -> bool:
    injected = {a["packetId"] for a in broker_audits(r) if a["action"] == "inject"}
    return _asked(USERS * ASKS)(r) and injected <= _packets(r).keys()


async def _stalled(s, bs, ws: list[WorkerProcess]) -> str:
    """What a run that did not finish got to: the questions not decided, how the decided ones
    waited for their memory partition, each worker's health, and the workers' log."""
    r = await collect(s, bs, ["audit", "inbox"], lambda _: True, 30)
    decisions = broker_audits(r)
    decided = {a["sessionId"] for a in decisions}
    missing = sorted({f"ask-{u}-{k}" for u in range(USERS) for k in range(ASKS)} - decided)
    injected = {a["packetId"] for a in decisions if a["action"] == "inject"}
    in_inbox = set(_packets(r))
    waits = Counter(a.get("tiers", {}).get("projection", "caught up") for a in decisions)
    slowest = max((a["emitTime"] - a["ingestTime"] for a in decisions), default=0)
    health = [(h["pid"], h["status"], h["fresh"]) for h in read_health(s.home, s.app_id)]
    alive = [(w.proc.pid, w.proc.poll()) for w in ws if w.proc is not None]
    return (f"{len(missing)} questions not decided {missing[:10]}; {len(injected - in_inbox)} "
            f"injected packets not in the inbox; projection waits {dict(waits)}, slowest "
            f"decision {slowest / 1000:.1f} s after its event; workers "
            f"(pid, exit code) {alive}; health {health}\n--- worker log ---\n"
            f"{ws[-1].log_tail(8000)}")


async def _run(tmp_path, bs, name: str, workers: int, kill: bool, recall_batch: int = 16):
    s = isolated_settings(tmp_path, name, vector=False, graph=False, recall_batch=recall_batch)
    await prepare_topics(s, bs)
    # at info: a stall is diagnosed from the log (see _stalled)
    ws = [WorkerProcess(s, bs, loglevel="info").start() for _ in range(workers)]
    try:
        for w in ws:
            await w.wait_ready()
        await _tell(s, bs)
        await collect(s, bs, ["memory-log"], _told, 120)
        asking = asyncio.create_task(_ask(s, bs))
        if kill:
            await collect(s, bs, ["audit"], _asked(20), 120)
            ws[0].kill()
        await asking
        try:
            return await collect(s, bs, ["audit", "inbox"], _answered, ANSWER_BOUND_S)
        except TimeoutError:
            pytest.fail(f"not answered in {ANSWER_BOUND_S} s: {await _stalled(s, bs, ws)}")
    finally:
        for w in ws:
            w.stop()


def _packets(recs) -> dict[str, str]:
    return {op["packet"]["packetId"]: op["packet"]["exactDigest"]
            for op in recs["inbox"] if op["op"] == "inject"}


@pytest.fixture(scope="module")
async def one_worker(kafka_bootstrap, tmp_path_factory):
    """The reference: the same traffic through a single worker, which takes recall requests
    one at a time (the others take those already waiting together, `MNEMOFLOW_RECALL_BATCH`)."""
    recs = await _run(tmp_path_factory.mktemp("scale-1"), kafka_bootstrap, "scale-1", 1, False,
                      recall_batch=1)
    assert len(_packets(recs)) == USERS * ASKS  # every asking session got its packet
    return recs


@pytest.mark.parametrize(("workers", "kill"), [(2, False), (3, True)])
async def test_more_workers_give_the_single_workers_packets(
        one_worker, kafka_bootstrap, tmp_path, workers: int, kill: bool) -> None:
    """Two workers share the partitions; of three, one is SIGKILLed midway."""
    many = await _run(tmp_path, kafka_bootstrap, f"scale-{workers}", workers, kill)
    # none lost, none different; else say how each such question was decided
    got, want = _packets(many), _packets(one_worker)
    differ = {op["sessionId"] for recs in (many, one_worker) for op in recs["inbox"]
              if op["op"] == "inject"
              and got.get(op["packet"]["packetId"]) != want.get(op["packet"]["packetId"])}
    assert not differ, [(a["sessionId"], a["stage"], a["eventSeq"], a["action"], a["reason"])
                        for a in many["audit"] if a["sessionId"] in differ]
    for recs in (one_worker, many):
        for op in recs["inbox"]:
            if op["op"] != "inject":
                continue
            user = "user-" + op["sessionId"].split("-")[1]
            assert {it["owner"] for it in op["packet"]["items"]} == {user}  # no leakage
        # each session's question was decided once: a redelivery re-emits the same audit
        per_session: dict[str, set[str]] = {}
        for a in broker_audits(recs):
            per_session.setdefault(a["sessionId"], set()).add(a["requestId"])
        assert all(len(ids) == 1 for sid, ids in per_session.items() if sid.startswith("ask-"))
