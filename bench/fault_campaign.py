"""Fault campaign: the whole pipeline, a real broker and real workers, under five kinds of fault.

Run: .venv/bin/python bench/fault_campaign.py [--drills 1,2,3,4,5] [--seed N] [--keep]
     [--runs N] [--vector auto|on|off]

The campaign starts a local broker of its own under a temporary MNEMOFLOW home, so that
restarting it touches no other broker; with KAFKA_BOOTSTRAP set it uses that cluster instead
and skips the broker-restart drill (someone else's cluster is not ours to restart). Every
worker and broker it starts is stopped on every way out: a return, an exception, Ctrl-C or
SIGTERM. Figures are printed, never asserted: it is a bench. The exit code is 1 when any run
lost or duplicated something, crashed or had another problem (see below), so that a human
looks; the folder of such a run (worker logs, faust state) is kept and named, the folders and
topics of clean runs are deleted (and the whole temporary home when every run was clean).

Drills (each run has its own topic prefix, app id and home):
1. fresh start, 20 runs: a worker on new topics; a small scenario (users state facts, then
   ask about them in a new session) must be fully processed. Recover = process start -> the
   worker's health file says ready.
2. broker restart, 5 runs, one worker throughout: sessions are sent before, during and after
   an outage of the broker (stopped and started again with its data); a host call that
   fails is repeated with the same record (same eventSeq), which the pipeline must dedupe.
   Recover = broker ready again -> the first segment of an event first sent after the broker
   had stopped.
3. SIGKILL, 10 runs: the worker is killed at a random point of a stream of sessions (while
   they are sent, or while their backlog is processed) and a replacement is started at once;
   one more message per partition follows the kill, so there is new work. Recover = kill ->
   the first output record (segments, audit, recall-requests, inbox, dead-letter) created
   after the kill, i.e. the replacement's.
4. two workers in one consumer group (homes of their own, as on two machines), 3 runs, one of
   them (chosen at random) SIGKILLed mid-stream, no replacement: every input gets exactly one
   segment, every request one broker outcome, and no item of another user reaches a packet
   (30 users state a secret, then ask for it, among 10 more users). Recover = kill -> every
   input partition has a segment again of an event sent after the kill (the survivor took
   over the dead worker's partitions).
5. bad records, 1 run: 2,000 hostile records (random bytes, wrong magic, unknown fingerprint,
   truncated Avro, another record type, schemaVersion 2, eventTime 2**63-1 and -2**63, texts of
   300 kB, values near 1 MB, a 600 kB key, 300-character and `..`-style userIds) interleaved
   with real sessions. A bad record must reach the dead-letter topic with a reason (found by
   its source topic, partition and offset); a valid-but-odd one (long or `..` userId, huge
   key) may instead be processed whole; every real session must be fully processed. No time
   to recover (no fault to recover from).

Definitions:
- lost: an input event with no segment; a recall request (in a gate audit or on the
  recall-requests topic) with no broker audit; an inject whose packet the host can never claim
  (the first of two InboxClients claims every session after the run, and must get every
  injected packet's content; a packet the inbox fold dropped as a duplicate of a pending
  packet with the same exactDigest is delivered through that one). Counted as lost too,
  because a session is then not fully processed: a segment the gate never decided on (no gate
  audit), an inject audit whose inbox op never appears, a real event that was dead-lettered,
  and a bad record that is neither in the dead-letter topic nor processed.
- delivered twice: a packet returned by two claim_all calls (the second InboxClient claims
  the same sessions after the first and must get nothing), or two different packets for one
  request; likewise two different outputs for one input: segments of one input that differ
  (contextVersion, digest, user), gate decisions of one segment or broker outcomes of one
  request that differ, two dead-letter reasons for one bad record. Copies of the same
  deterministic record id with the same content are redeliveries (at-least-once) and are fine.
- crash: a worker process that exited on its own (not stopped or killed by the campaign), or
  any "agent ... crashed" line in a worker's log.
- problems (also a non-zero exit): a leak (a packet item or an audited candidate outside the
  session user's scope chain, or taken from another user's session), a bad record processed
  instead of dead-lettered, an odd record processed with its text cut, a MEMORY.md written
  outside its projection folder, a broker that came back at another address, a host
  producer (the SDK's AvroProducer) that stayed broken after the broker was back, so that the
  campaign had to replace it (it does so at once on OutOfOrderSequenceNumber, which no
  retry of that producer can cure, and after a minute of any other failure).

Workers run with MNEMOFLOW_VECTOR=0 and MNEMOFLOW_GRAPH=0 in drills 2-4 (`--vector auto`): with
the vector tier on, a request recomputed after a kill may see more or fewer embedded rows than
the first pass and give another packet (a timing effect the README describes under "Known
limits"), which would be counted here as "delivered twice"; drills 1 and 5 run with both tiers
on. The printed header says which.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import random
import re
import shutil
import signal
import statistics
import struct
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError, OutOfOrderSequenceNumber
from aiokafka.partitioner import murmur2
from common import write_results

from mnemoflow.agents.ids import stable_id
from mnemoflow.schemas.codec import MAGIC, SchemaRegistry, default_registry
from mnemoflow.streams.admin import create_topics
from mnemoflow.streams.config import Settings
from mnemoflow.streams.host import CapabilityManifest
from mnemoflow.streams.inbox import InboxClient
from mnemoflow.streams.kafka_local import LocalKafka
from mnemoflow.streams.process import WorkerProcess
from mnemoflow.streams.producer import AvroProducer
from mnemoflow.streams.reader import Record, TopicReader

T0 = 1_700_000_000_000
DAY = 86_400_000
MANIFEST = CapabilityManifest(provider="bench", model="m", supportsPreStep=True).to_record()
STATEMENT = "My locker code is {code} and my favourite colour is shade{n}."
QUESTION = "What is my locker code? I forgot it."
OUTPUT_BASES = ("segments", "audit", "recall-requests", "inbox", "dead-letter")
# read too, to count the events a host wrote twice (a resend after an unacknowledged write)
READ_BASES = (*OUTPUT_BASES, "session-events")
CRASH_LINE = re.compile(r"agent \S+ crashed")
# a host call during the outage gives up this fast, then resends; it is also the producer's
# request timeout, which aiokafka uses as the time to live of a queued batch
HOST_TIMEOUT_S = 4.0
SETTLE_S = 1.5  # after everything is seen: wait this long for late copies (redeliveries)
LOGLEVEL = "info"  # the log of a failing run has to explain it
DOTDOTS = ["..", "../..", "../../etc", "a/../../b", "..\\..\\x", "./..", ". .", "%2e%2e",
           "../" * 40, "..\x00..", "../ü/.."]


# -- what the campaign sent -------------------------------------------------------------------

@dataclass
class Input:
    """One record written to an input topic, and what must become of it."""

    source: str  # topic base: session-events | tool-results | agent-steps
    key: bytes
    value: bytes
    expect: str  # process | dlq | either (a valid-but-odd record: dead-lettered or processed whole)
    label: str  # what kind of record it is, for the report
    sid: str | None = None  # for records with a decodable header: what the segment would be
    user: str | None = None
    seq: int = 0
    t: int = 0
    text: str | None = None
    writes: list[tuple[int, int]] = field(default_factory=list)  # (partition, offset) per write
    first_sent: float = 0.0  # wall clock of the first attempt
    attempts: int = 0

    @property
    def seg(self) -> str | None:
        """The deterministic segment id the observer gives this event (agents/observer.py)."""
        return stable_id("seg", self.sid, self.source, self.seq) if self.sid is not None else None


def session_event(sid: str, user: str, seq: int, t: int, etype: str = "user_message",
                  text: str | None = None, lifecycle: str | None = None,
                  capability: dict[str, Any] | None = None, schema_version: int = 1
                  ) -> dict[str, Any]:
    """A SessionEvent as the host SDK writes it; built here so a resend is the same record."""
    return {"schemaVersion": schema_version, "sessionId": sid, "agentId": "agent",
            "userId": user, "workspaceId": None, "eventSeq": seq, "turn": seq, "step": 0,
            "eventTime": t, "type": etype, "text": text, "provenance": None,
            "lifecycle": lifecycle, "capability": capability, "feedbackKind": None,
            "feedbackRef": None, "attributes": {}}


class Scenario:
    """Users who state a fact in one session and ask about it in a later one: the question
    makes the gate retrieve (see tests/streams/test_topology_kafka.py)."""

    def __init__(self, registry: SchemaRegistry) -> None:
        self.registry = registry
        self.n = 0

    def _input(self, rec: dict[str, Any], expect: str = "process", label: str = "real") -> Input:
        return Input("session-events", rec["sessionId"].encode(),
                     self.registry.encode("io.mnemoflow.SessionEvent", rec), expect, label,
                     rec["sessionId"], rec["userId"], rec["eventSeq"], rec["eventTime"],
                     rec["text"])

    def user(self, tag: str, user: str | None = None) -> tuple[list[Input], list[Input]]:
        """(the session that states the fact, the session that asks about it) of a new user."""
        self.n += 1
        n, user = self.n, user or f"user-{tag}-{self.n}"
        t = T0 + n * 10_000
        mem, ask = f"mem-{tag}-{n}", f"ask-{tag}-{n}"
        stated = [session_event(mem, user, 1, t, "lifecycle", lifecycle="start",
                                capability=MANIFEST),
                  session_event(mem, user, 2, t + 1000,
                                text=STATEMENT.format(code=f"zq{n:05d}x", n=n))]
        asked = [session_event(ask, user, 1, t + DAY, "lifecycle", lifecycle="start",
                               capability=MANIFEST),
                 session_event(ask, user, 2, t + DAY + 1000, text=QUESTION)]
        return [self._input(r) for r in stated], [self._input(r) for r in asked]

    def users(self, tag: str, k: int) -> tuple[list[Input], list[Input]]:
        mems: list[Input] = []
        asks: list[Input] = []
        for _ in range(k):
            m, a = self.user(tag)
            mems += m
            asks += a
        return mems, asks


# -- a host that resends ----------------------------------------------------------------------

class Host:
    """Writes inputs; a write that fails is repeated with the same bytes (same eventSeq) until
    it is acknowledged, as a host that got an error would. After a minute of failures the
    producer is replaced, as a host would restart its client."""

    def __init__(self, settings: Settings, bootstrap: str, timeout_s: float = 30.0) -> None:
        self.settings, self.bootstrap, self.timeout_s = settings, bootstrap, timeout_s
        self.producer = AvroProducer(settings, bootstrap, timeout_s=timeout_s)
        self.errors = 0
        self.resends = 0
        self.restarts = 0
        self.poisoned = 0  # sends that failed with OutOfOrderSequenceNumber
        self.last_error = ""
        # each kind of error with its count and wall-clock span: a producer that stays broken
        # after the broker is back shows here
        self.error_kinds: dict[str, dict[str, Any]] = {}

    async def start(self) -> None:
        await self.producer.start()

    async def stop(self) -> None:
        await self.producer.stop()

    async def send(self, inp: Input) -> None:
        topic = self.settings.topic(inp.source)
        failing_since: float | None = None
        while True:
            if not inp.first_sent:
                inp.first_sent = time.time()
            inp.attempts += 1
            try:
                md = await self.producer.send_raw(topic, inp.key, inp.value)
                inp.writes.append((int(md.partition), int(md.offset)))
                return
            except KafkaError as exc:
                self.errors += 1
                self.resends += 1
                self.last_error = f"{type(exc).__name__}: {exc}"[:300]
                kind = re.sub(r"\d+(\.\d+)?", "N", self.last_error)[:160]
                row = self.error_kinds.setdefault(kind, {"count": 0, "first": time.time()})
                row["count"] += 1
                row["last"] = time.time()
                failing_since = failing_since or time.monotonic()
                # OutOfOrderSequenceNumber is permanent for this producer: aiokafka (0.14)
                # fails a batch that expired while the partition had no leader after giving
                # it a sequence number, so the broker waits for a sequence that never comes.
                # A host can only replace the producer; doing it at once keeps the figure of
                # the drill about the pipeline (the poisoning is reported as a problem).
                poisoned = isinstance(exc, OutOfOrderSequenceNumber)
                self.poisoned += poisoned
                if poisoned or time.monotonic() - failing_since > 60:
                    await self.producer.stop()  # gives up its queue within the bound
                    self.producer = AvroProducer(self.settings, self.bootstrap,
                                                 timeout_s=self.timeout_s)
                    await self.producer.start()
                    self.restarts += 1
                    failing_since = time.monotonic()
                await asyncio.sleep(0.5)

    async def send_all(self, inputs: Iterable[Input], pace_s: float = 0.0) -> None:
        for inp in inputs:
            await self.send(inp)
            if pace_s:
                await asyncio.sleep(pace_s)


# -- processes this script started ------------------------------------------------------------

class Fleet:
    """Every worker and the broker this script started: stopped on every way out."""

    def __init__(self) -> None:
        self.workers: list[Worker] = []
        self.broker: LocalKafka | None = None

    def close(self) -> None:
        for w in list(self.workers):  # a stopped worker leaves the list
            try:
                w.stop()
            except Exception as exc:  # go on: the others must be stopped too
                print(f"  could not stop worker {w.name}: {exc}", flush=True)
        self.workers.clear()
        if self.broker is not None:
            self.broker.down()
            self.broker = None


FLEET = Fleet()


class Worker:
    """A WorkerProcess with what the campaign needs to tell a crash from a kill."""

    def __init__(self, name: str, settings: Settings, bootstrap: str) -> None:
        self.name = name
        log = settings.home / f"worker-{name}.log"
        self.proc = WorkerProcess(settings, bootstrap, loglevel=LOGLEVEL, log_path=log)
        self.killed = False
        self.stopped = False
        self.exited_alone: int | None = None  # exit code if it ended by itself
        self.exit_code: int | None = None

    @property
    def log_path(self) -> Path:
        assert self.proc.log_path is not None
        return self.proc.log_path

    def start(self) -> Worker:
        self.proc.settings.home.mkdir(parents=True, exist_ok=True)
        FLEET.workers.append(self)
        self.proc.start()
        return self

    def alive(self) -> bool:
        return self.proc.proc is not None and self.proc.proc.poll() is None

    def _note_exit(self) -> None:
        p = self.proc.proc
        if p is not None and self.exited_alone is None and not (self.killed or self.stopped):
            code = p.poll()
            if code is not None:
                self.exited_alone = code

    async def wait_ready(self, timeout: float = 180.0) -> float:
        started = time.monotonic()
        await self.proc.wait_ready(timeout)
        return time.monotonic() - started

    def kill(self) -> None:
        self._note_exit()
        self.killed = True
        self.proc.kill()

    def stop(self) -> int | None:
        self._note_exit()
        if not self.stopped:
            self.stopped = True
            self.exit_code = self.proc.stop()
        if self in FLEET.workers:
            FLEET.workers.remove(self)
        return self.exit_code

    def crash_lines(self) -> list[str]:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return []
        return [ln.strip()[:400] for ln in text.splitlines()
                if CRASH_LINE.search(ln) and not ln.startswith("error:")]

    def crashes(self) -> int:
        """Crash lines, plus one if the process ended by itself."""
        self._note_exit()
        return len(self.crash_lines()) + (self.exited_alone is not None)

    def log_excerpt(self, n: int = 40) -> list[str]:
        """The lines that explain a failure: errors, warnings, crash and exit lines."""
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return []
        keep = [ln[:400] for ln in lines if re.search(
            r"ERROR|WARNING|error:|crashed|Traceback|Exception|holding|DROPPED", ln)]
        return keep[-n:]


# -- what the pipeline wrote ------------------------------------------------------------------

def _variant(*parts: Any) -> str:
    return json.dumps(parts, sort_keys=True, default=str)


class Index:
    """The output topics of one run, folded by the ids the checks look up."""

    def __init__(self, settings: Settings) -> None:
        self.base = {settings.topic(b): b for b in READ_BASES}
        self.seen = 0
        self.segs: dict[str, set[str]] = {}  # segment id -> distinct contents
        self.seg_first: dict[str, dict[str, Any]] = {}
        self.seg_ts: dict[str, int] = {}  # segment id -> earliest CreateTime (ms)
        self.gate: dict[str, set[str]] = {}  # segment id -> distinct (action, request id)
        self.gate_requests: dict[str, set[str]] = {}  # segment id -> request ids
        self.requests: dict[str, str] = {}  # request id -> session, from recall-requests
        self.broker: dict[str, set[str]] = {}  # request id -> distinct (action, packet id)
        self.broker_first: dict[str, dict[str, Any]] = {}
        self.injects: dict[str, set[str]] = {}  # request id -> packet ids in inbox inject ops
        self.packets: dict[str, dict[str, Any]] = {}  # packet id -> packet
        self.dlq: dict[tuple[str, int, int], set[str]] = {}  # source (topic, p, offset) -> reasons
        self.undecodable: list[str] = []
        self.timestamps: list[int] = []  # CreateTime of every output record
        self.input_copies: dict[tuple[str, int], int] = {}  # (session, eventSeq) -> records

    def add(self, records: Iterable[Record]) -> None:
        for r in records:
            self.seen += 1
            base = self.base.get(r.topic)
            v = r.value
            if base == "session-events":  # an input: only counted (bad records are expected)
                if v is not None and isinstance(v.get("eventSeq"), int):
                    k = (v["sessionId"], v["eventSeq"])
                    self.input_copies[k] = self.input_copies.get(k, 0) + 1
                continue
            self.timestamps.append(r.timestamp)
            if v is None:
                self.undecodable.append(f"{r.topic}[{r.partition}]@{r.offset}: {r.error}")
                continue
            if base == "segments":
                sid = v["segmentId"]
                self.segs.setdefault(sid, set()).add(
                    _variant(v["contextVersion"], v["digest"], v["userId"], v["kind"]))
                self.seg_first.setdefault(sid, v)
                self.seg_ts[sid] = min(self.seg_ts.get(sid, r.timestamp), r.timestamp)
            elif base == "audit" and v["stage"] == "gate":
                self.gate.setdefault(v["segmentId"], set()).add(
                    _variant(v["action"], v["requestId"]))
                if v["requestId"]:
                    self.gate_requests.setdefault(v["segmentId"], set()).add(v["requestId"])
            elif base == "audit" and v["stage"] == "broker":
                self.broker.setdefault(v["requestId"], set()).add(
                    _variant(v["action"], v["packetId"]))
                self.broker_first.setdefault(v["requestId"], v)
            elif base == "recall-requests":
                self.requests[v["requestId"]] = v["sessionId"]
            elif base == "inbox" and v["op"] == "inject" and v["packet"]:
                p = v["packet"]
                self.injects.setdefault(p["requestId"], set()).add(p["packetId"])
                self.packets.setdefault(p["packetId"], p)
            elif base == "dead-letter":
                self.dlq.setdefault((v["sourceTopic"], v["partition"], v["offset"]), set()).add(
                    v["reason"])

    def dead_lettered(self, inp: Input, settings: Settings) -> set[str] | None:
        topic = settings.topic(inp.source)
        found = [self.dlq[(topic, p, o)] for p, o in inp.writes if (topic, p, o) in self.dlq]
        return set().union(*found) if found else None

    def session_packets(self, sid: str) -> list[dict[str, Any]]:
        return [p for p in self.packets.values() if p["sessionId"] == sid]


def settled(inputs: list[Input], idx: Index, settings: Settings) -> bool:
    """Everything these inputs lead to is visible: a segment (or a dead letter), the gate's
    decision on it, the broker's outcome of its request, and the inbox op of an inject."""
    for inp in inputs:
        seg = inp.seg
        if seg is None or seg not in idx.segs:
            if idx.dead_lettered(inp, settings) is None:
                return False
            continue
        if seg not in idx.gate:
            return False
        for req in idx.gate_requests.get(seg, ()):
            audit = idx.broker_first.get(req)
            if audit is None:
                return False
            if audit["action"] == "inject" and audit["packetId"] not in idx.packets:
                return False
    return True


async def collect(settings: Settings, bootstrap: str, inputs: list[Input], timeout: float,
                  alive: Callable[[], bool]) -> Index:
    """Read the run's output topics from the start until `inputs` are settled (or the time is
    up, or no worker is left), then a little longer for late redeliveries."""
    idx = Index(settings)
    async with TopicReader(settings, bootstrap, list(idx.base)) as reader:
        deadline = time.monotonic() + timeout
        dead_since: float | None = None
        while time.monotonic() < deadline:
            idx.add(await reader.poll(250))
            if settled(inputs, idx, settings):
                break
            if not alive():
                dead_since = dead_since or time.monotonic()
                if time.monotonic() - dead_since > 5:
                    break  # nobody left to process the rest
        await asyncio.sleep(SETTLE_S)
        await reader.drain()
        idx.add(reader.records[idx.seen:])
    return idx


# -- the verdict on one run -------------------------------------------------------------------

@dataclass
class Run:
    drill: str
    index: int
    folder: str
    lost: list[str] = field(default_factory=list)
    twice: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    crashes: int = 0
    crash_lines: list[str] = field(default_factory=list)
    recover_s: float | None = None
    facts: dict[str, Any] = field(default_factory=dict)
    excerpts: dict[str, list[str]] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return bool(self.lost or self.twice or self.problems or self.crashes)

    def add_workers(self, workers: Iterable[Worker]) -> None:
        for w in workers:
            n = w.crashes()
            self.crashes += n
            self.crash_lines += [f"{w.name}: {ln}" for ln in w.crash_lines()]
            if w.exited_alone is not None:
                self.crash_lines.append(f"{w.name}: exited by itself with code {w.exited_alone}")
            if w.exit_code not in (None, 0) and not w.killed and w.exited_alone is None:
                self.problems.append(f"worker {w.name} stopped with exit code {w.exit_code} "
                                     f"(SIGTERM bound passed: SIGKILLed by stop)")
            if n or w.exit_code not in (None, 0):
                self.excerpts[w.name] = w.log_excerpt()

    def summary(self) -> dict[str, Any]:
        return {"index": self.index, "folder": self.folder, "lost": len(self.lost),
                "twice": len(self.twice), "problems": len(self.problems),
                "crashes": self.crashes, "recover_s": self.recover_s,
                "lost_detail": self.lost[:30], "twice_detail": self.twice[:30],
                "problem_detail": self.problems[:30], "crash_lines": self.crash_lines[:30],
                "log_excerpts": self.excerpts, **self.facts}


def chain(sid: str, user: str) -> set[tuple[str, str]]:
    """The (scope, owner) pairs a request of this session may see (agents/candidate.py)."""
    return {("Session", sid), ("User", user), ("External", user)}


def judge(run: Run, inputs: list[Input], idx: Index, settings: Settings,
          users_of: dict[str, str]) -> None:
    """Lost, twice and leak checks of these inputs' outputs (claims are checked apart)."""
    requests: set[str] = set()
    for inp in inputs:
        seg, where = inp.seg, f"{inp.label} {inp.source} {(inp.sid or '')[:60]}#{inp.seq}"
        dlq = idx.dead_lettered(inp, settings)
        processed = seg is not None and seg in idx.segs
        if dlq is not None and (not all(dlq) or len(dlq) > 1):
            (run.problems if not all(dlq) else run.twice).append(
                f"{where}: dead-letter reasons {sorted(dlq)}")
        if inp.expect == "dlq":
            if processed:
                run.problems.append(f"{where}: processed instead of dead-lettered")
            elif dlq is None:
                run.lost.append(f"{where}: neither dead-lettered nor processed "
                                f"(written at {inp.writes})")
            continue
        if not processed:
            if dlq is not None and inp.expect == "either":
                continue
            run.lost.append(f"{where}: no segment" + (f" (dead-lettered: {sorted(dlq)})"
                                                        if dlq else ""))
            continue
        assert seg is not None
        if len(idx.segs[seg]) > 1:
            run.twice.append(f"{where}: {len(idx.segs[seg])} different segments {seg}")
        first = idx.seg_first[seg]
        if inp.text is not None and first["text"] != inp.text.strip():
            run.problems.append(f"{where}: processed text differs from the input "
                                f"({len(first['text'])} vs {len(inp.text.strip())} chars)")
        if inp.user is not None and first["userId"] != inp.user:
            run.problems.append(f"{where}: segment userId differs from the input")
        if seg not in idx.gate:
            run.lost.append(f"{where}: segment {seg} has no gate decision")
            continue
        if len(idx.gate[seg]) > 1:
            run.twice.append(f"{where}: different gate decisions {sorted(idx.gate[seg])}")
        requests |= idx.gate_requests.get(seg, set())
    sessions = {inp.sid for inp in inputs if inp.sid is not None and inp.expect != "dlq"}
    requests |= {r for r, sid in idx.requests.items() if sid in sessions}
    for req in sorted(requests):
        if req not in idx.broker:
            run.lost.append(f"request {req}: no broker audit")
            continue
        if len(idx.broker[req]) > 1:
            run.twice.append(f"request {req}: different broker outcomes {sorted(idx.broker[req])}")
        if len(idx.injects.get(req, ())) > 1:
            run.twice.append(f"request {req}: {len(idx.injects[req])} different packets")
        audit = idx.broker_first[req]
        if audit["action"] == "inject" and audit["packetId"] not in idx.packets:
            run.lost.append(f"request {req}: inject audit, but packet {audit['packetId']} "
                            f"never reached the inbox")
        user = users_of.get(audit["sessionId"])
        for c in audit["candidates"]:
            if user is None or (c["scope"], c["owner"]) not in chain(audit["sessionId"], user):
                run.problems.append(f"leak: candidate {c['memoryId']} of {c['scope']}/"
                                    f"{c['owner'][:40]} audited for {audit['sessionId'][:60]}")
    for sid in sorted(sessions):
        user = users_of[sid]
        for p in idx.session_packets(sid):
            for item in p["items"]:
                source_user = users_of.get(item["sourceSessionId"])
                if (item["scope"], item["owner"]) not in chain(sid, user) or source_user != user:
                    run.problems.append(
                        f"leak: packet {p['packetId']} of {sid[:60]} holds {item['scope']}/"
                        f"{item['owner'][:40]} from session {item['sourceSessionId'][:60]}")
    if idx.undecodable:
        run.problems += [f"undecodable output {u}" for u in idx.undecodable[:10]]


async def claim_twice(run: Run, settings: Settings, bootstrap: str, inputs: list[Input],
                      idx: Index) -> None:
    """Two hosts claim every session of the run, one after the other: the first must get the
    content of every injected packet, the second nothing."""
    last_t: dict[str, int] = {}
    for inp in inputs:
        if inp.sid is not None and inp.expect != "dlq" and inp.seg in idx.segs:
            last_t[inp.sid] = max(last_t.get(inp.sid, inp.t), inp.t)
    won: dict[str, dict[str, list[dict[str, Any]]]] = {"first": {}, "second": {}}
    for name in won:
        async with AvroProducer(settings, bootstrap) as producer:
            inbox = InboxClient(settings, bootstrap, producer)
            await inbox.start()
            try:
                for sid, t in last_t.items():
                    got = await inbox.claim_all(sid, t + 1)
                    won[name][sid] = list(got.packets)
            finally:
                await inbox.stop()
    claimed = 0
    for sid in last_t:
        injected = idx.session_packets(sid)
        first, second = won["first"][sid], won["second"][sid]
        claimed += len(first)
        digests = [p["exactDigest"] for p in first]
        for p in injected:
            if p["expiry"] <= last_t[sid] + 1:
                run.problems.append(f"packet {p['packetId']} of {sid[:60]} expired before "
                                    f"the claim (expiry {p['expiry']})")
            elif p["exactDigest"] not in digests:
                run.lost.append(f"packet {p['packetId']} of {sid[:60]}: injected, never claimed")
        if len(set(digests)) < len(digests) or len({p["packetId"] for p in first}) < len(first):
            run.twice.append(f"{sid[:60]}: one claim_all returned the same packet twice")
        for p in second:
            run.twice.append(f"packet {p['packetId']} of {sid[:60]}: claimed by a second host")
    run.facts["packets_claimed"] = claimed
    run.facts["sessions_claimed"] = len(last_t)


def recall_facts(run: Run, inputs: list[Input], idx: Index) -> None:
    """How much of the scenario reached a packet: a campaign whose questions never retrieve
    would prove little about packets."""
    asked = [i for i in inputs if i.text == QUESTION]
    injected = 0
    for q in asked:
        for req in idx.gate_requests.get(q.seg or "", ()):
            audit = idx.broker_first.get(req)
            injected += bool(audit and audit["action"] == "inject")
    run.facts.update(events=len(inputs), questions=len(asked), questions_injected=injected,
                     records_read=idx.seen)


# -- the drills -------------------------------------------------------------------------------

@dataclass
class Drill:
    key: str
    title: str
    recover_what: str
    vector: bool
    runs: list[Run] = field(default_factory=list)
    skipped: str | None = None
    facts: dict[str, Any] = field(default_factory=dict)


class Campaign:
    def __init__(self, root: Path, bootstrap: str, own_broker: LocalKafka | None,
                 rng: random.Random, args: argparse.Namespace) -> None:
        self.root, self.bootstrap, self.broker = root, bootstrap, own_broker
        self.rng, self.args = rng, args
        self.registry = default_registry()
        self.scenario = Scenario(self.registry)
        self.drills: list[Drill] = []
        self.kept: list[str] = []

    def settings(self, name: str, vector: bool, home: Path | None = None) -> Settings:
        tag = f"{name}-{uuid.uuid4().hex[:6]}"
        return Settings().with_overrides(
            home=home or self.root / tag, topic_prefix=f"fc.{tag}.", app_id=f"fc-{tag}",
            bootstrap=self.bootstrap, vector=vector, graph=vector, shutdown_timeout_s=10.0)

    def vector_for(self, drill: str) -> bool:
        if self.args.vector != "auto":
            return bool(self.args.vector == "on")
        return drill in ("1", "5")

    def runs(self, default: int) -> int:
        return self.args.runs or default

    async def finish_run(self, drill: Drill, run: Run, settings: Settings, homes: list[Path],
                         line: str) -> None:
        """Report the run; keep a failing run's folders, delete a clean one's (and its topics)."""
        drill.runs.append(run)
        flag = "FAIL" if run.failed else "ok"
        rec = f"{run.recover_s:.2f}s" if run.recover_s is not None else "-"
        print(f"  [{drill.key}] run {run.index:>2}: {flag:4} recover {rec:>7}  lost "
              f"{len(run.lost)} twice {len(run.twice)} crashes {run.crashes} problems "
              f"{len(run.problems)}  {line}", flush=True)
        if run.failed or self.args.keep:
            self.kept += [str(h) for h in homes]
            for what in (run.lost[:5] + run.twice[:5] + run.problems[:5] + run.crash_lines[:5]):
                print(f"      {what}", flush=True)
            return
        await delete_topics(settings, self.bootstrap)
        for h in homes:
            shutil.rmtree(h, ignore_errors=True)

    # 1 ----------------------------------------------------------------------------------------
    async def fresh_start(self) -> None:
        drill = Drill("1", "fresh start on new topics", "start -> ready", self.vector_for("1"))
        self.drills.append(drill)
        for i in range(1, self.runs(20) + 1):
            s = self.settings(f"start{i}", drill.vector)
            run = Run(drill.key, i, str(s.home))
            await create_topics(s, self.bootstrap)
            w = Worker("w", s, self.bootstrap)
            inputs: list[Input] = []
            try:
                w.start()
                run.recover_s = await w.wait_ready()
                mems, asks = self.scenario.users(f"s{i}", 3)
                inputs = mems + asks
                async with started_host(s, self.bootstrap) as h:
                    await h.send_all(mems)
                    # the statements are processed before the questions, so recall can find them
                    await collect(s, self.bootstrap, mems, 60, w.alive)
                    await h.send_all(asks)
                idx = await collect(s, self.bootstrap, inputs, 90, w.alive)
                judge(run, inputs, idx, s, users_of(inputs))
                await claim_twice(run, s, self.bootstrap, inputs, idx)
                recall_facts(run, inputs, idx)
            except (RuntimeError, TimeoutError) as exc:  # not ready: a crash or a hang
                run.problems.append(f"worker not ready: {str(exc)[:300]}")
            finally:
                w.stop()
            run.add_workers([w])
            await self.finish_run(drill, run, s, [s.home], _questions(run))

    # 2 ----------------------------------------------------------------------------------------
    async def broker_restart(self) -> None:
        drill = Drill("2", "broker restart mid-stream", "broker ready -> first segment of an "
                      "event sent after it stopped", self.vector_for("2"))
        self.drills.append(drill)
        if self.broker is None:
            drill.skipped = "KAFKA_BOOTSTRAP is set: that broker is not ours to restart"
            print(f"  [2] skipped: {drill.skipped}", flush=True)
            return
        broker = self.broker
        s = self.settings("restart", drill.vector)
        h = Host(s, self.bootstrap, timeout_s=HOST_TIMEOUT_S)
        w = await self._start_shared(s, "w", h)
        all_inputs: list[Input] = []
        try:
            for i in range(1, self.runs(5) + 1):
                run = Run(drill.key, i, str(s.home))
                mems_a, asks_a = self.scenario.users(f"r{i}a", 4)
                mems_b, asks_b = self.scenario.users(f"r{i}b", 4)
                during = _interleave(asks_a, mems_b)
                inputs = mems_a + during + asks_b
                all_inputs += inputs
                errors_before, poisoned_before, restarts_before = h.errors, h.poisoned, h.restarts
                h.error_kinds = {}
                await h.send_all(mems_a, 0.02)  # before
                sender = asyncio.create_task(h.send_all(during, 0.4))  # across the outage
                await asyncio.sleep(0.3)
                await asyncio.to_thread(broker.down)
                down_at = time.time()  # the broker process is gone: nothing is written now
                await asyncio.sleep(2.0)
                state = await asyncio.to_thread(broker.up)
                up_at = time.time()
                if state.bootstrap != self.bootstrap:
                    run.problems.append(f"the broker came back at {state.bootstrap}, not at "
                                        f"{self.bootstrap}: clients cannot find it")
                    self.bootstrap = state.bootstrap  # for the drills after this one
                await sender
                # a host whose acknowledgement was lost in the outage resends events that had
                # in fact been written: the same records again, which the pipeline must dedupe
                # (the resends above rarely leave two copies: aiokafka drops a batch that
                # timed out while the partition had no leader)
                for x in during[:3]:
                    await h.send(x)
                await h.send_all(asks_b, 0.02)  # after
                idx = await collect(s, self.bootstrap, inputs, 150, w.alive)
                judge(run, inputs, idx, s, users_of(all_inputs))
                await claim_twice(run, s, self.bootstrap, inputs, idx)
                recall_facts(run, inputs, idx)
                firsts = [idx.seg_ts[x.seg] for x in inputs
                          if x.first_sent >= down_at and x.seg in idx.seg_ts]
                run.recover_s = (min(firsts) / 1000 - up_at) if firsts else None
                if h.restarts > restarts_before:
                    oos = h.error_kinds.get("OutOfOrderSequenceNumber: [Error N] "
                                            "OutOfOrderSequenceNumber", {})
                    run.problems.append(
                        f"host SDK: after the restart the AvroProducer failed "
                        f"{h.poisoned - poisoned_before} send(s) with OutOfOrderSequenceNumber "
                        f"(first {oos.get('first', up_at) - up_at:.1f}s after the broker was "
                        f"ready), which no retry of that producer cures; sends went through "
                        f"after the campaign replaced it ({h.restarts - restarts_before}x)")
                run.facts.update(outage_s=round(up_at - down_at, 2),
                                 host_errors=h.errors - errors_before,
                                 host_resends=sum(x.attempts - 1 for x in inputs),
                                 events_written_twice=sum(
                                     idx.input_copies.get((x.sid or "", x.seq), 0) > 1
                                     for x in inputs),
                                 host_restarts_total=h.restarts,
                                 host_errors_by_kind={k: {"count": v["count"],
                                                          "from_up_s": round(v["first"] - up_at, 2),
                                                          "to_up_s": round(v["last"] - up_at, 2)}
                                                      for k, v in h.error_kinds.items()})
                drill.runs.append(run)
                _print_run(drill, run, f"outage {up_at - down_at:.1f}s, host errors "
                                       f"{h.errors - errors_before}")
                if not w.alive():
                    break  # the worker is gone: the next restarts would prove nothing
        finally:
            await _quietly(h.stop())
            w.stop()
        # the one worker ran through every restart: when one of its crashes happened is not
        # known, so they are put on the last run, which is where its exit would show
        if not drill.runs:
            drill.runs.append(Run(drill.key, 1, str(s.home)))
        drill.runs[-1].add_workers([w])
        drill.facts.update(host_producer_restarts=h.restarts, host_last_error=h.last_error)
        await self._finish_shared(drill, s, [s.home])

    # 3 ----------------------------------------------------------------------------------------
    async def sigkill(self) -> None:
        drill = Drill("3", "SIGKILL the worker, start a replacement",
                      "kill -> replacement's first output", self.vector_for("3"))
        self.drills.append(drill)
        s = self.settings("kill", drill.vector)
        h = Host(s, self.bootstrap)
        w = await self._start_shared(s, "w0", h)
        workers = [w]
        all_inputs: list[Input] = []
        try:
            for i in range(1, self.runs(10) + 1):
                run = Run(drill.key, i, str(s.home))
                mems, asks = self.scenario.users(f"k{i}", 6)
                inputs = mems + asks
                all_inputs += inputs
                pace = 0.06
                sender = asyncio.create_task(h.send_all(inputs, pace))
                # a random point: while the sessions are being sent, or while their backlog is
                # processed after the last one
                delay = self.rng.uniform(0.05, len(inputs) * pace + 1.0)
                await asyncio.sleep(delay)
                killed = w
                killed.kill()
                killed_at = time.time()
                w = Worker(f"w{i}", s, self.bootstrap).start()
                workers.append(w)
                await sender
                # at least one event per partition after the kill: the replacement has new work
                # even when the kill came after the round's last output
                probes = self._probes(f"k{i}", s.partitions)
                await h.send_all(probes)
                inputs += probes
                all_inputs += probes
                try:
                    ready = await w.wait_ready()
                except (RuntimeError, TimeoutError) as exc:
                    run.problems.append(f"replacement not ready: {str(exc)[:300]}")
                    ready = float("nan")
                idx = await collect(s, self.bootstrap, inputs, 120, w.alive)
                judge(run, inputs, idx, s, users_of(all_inputs))
                await claim_twice(run, s, self.bootstrap, inputs, idx)
                recall_facts(run, inputs, idx)
                after = [ts for ts in idx.timestamps if ts > killed_at * 1000]
                run.recover_s = (min(after) / 1000 - killed_at) if after else None
                run.facts.update(kill_after_s=round(delay, 2), replacement_ready_s=round(ready, 2))
                run.add_workers([killed])
                drill.runs.append(run)
                _print_run(drill, run, f"killed {delay:.2f}s into the round, replacement ready "
                                       f"{ready:.1f}s")
                if not w.alive():
                    break
        finally:
            await _quietly(h.stop())
            w.stop()
        if not drill.runs:
            drill.runs.append(Run(drill.key, 1, str(s.home)))
        drill.runs[-1].add_workers([w])  # the last replacement, stopped here
        await self._finish_shared(drill, s, [s.home])

    async def _start_shared(self, s: Settings, worker: str, h: Host) -> Worker:
        """For a drill whose runs share one topic set, worker and host: the topics created,
        the worker ready and `h` started. What started is stopped again if the rest fails."""
        w = Worker(worker, s, self.bootstrap)
        try:
            await create_topics(s, self.bootstrap)
            w.start()
            await w.wait_ready()
            await h.start()
        except BaseException:
            await _quietly(h.stop())
            w.stop()
            raise
        return w

    async def _finish_shared(self, drill: Drill, s: Settings, homes: list[Path]) -> None:
        """A drill whose runs shared one topic set: keep it all if any run failed."""
        if any(r.failed for r in drill.runs) or self.args.keep:
            self.kept += [str(h) for h in homes]
            for r in drill.runs:
                for what in (r.lost[:5] + r.twice[:5] + r.problems[:5] + r.crash_lines[:5]):
                    print(f"      run {r.index}: {what}", flush=True)
        else:
            await delete_topics(s, self.bootstrap)
            for home in homes:
                shutil.rmtree(home, ignore_errors=True)

    # 4 ----------------------------------------------------------------------------------------
    async def two_workers(self) -> None:
        drill = Drill("4", "two workers in a group, one SIGKILLed",
                      "kill -> every input partition served again", self.vector_for("4"))
        self.drills.append(drill)
        for i in range(1, self.runs(3) + 1):
            s = self.settings(f"pair{i}", drill.vector)
            run = Run(drill.key, i, str(s.home))
            homes = [s.home / "a", s.home / "b"]
            await create_topics(s, self.bootstrap)
            pair = [Worker(n, s.with_overrides(home=home), self.bootstrap)
                    for n, home in zip(("a", "b"), homes, strict=True)]
            inputs: list[Input] = []
            try:
                for w in pair:
                    w.start()
                await _both_ready(pair, 180)
                mems, asks = self.scenario.users(f"p{i}", 30)
                more_mems, _ = self.scenario.users(f"p{i}x", 10)
                async with started_host(s, self.bootstrap) as h:
                    await h.send_all(mems, 0.005)
                    await collect(s, self.bootstrap, mems, 90, _any_alive(pair))
                    stream = _interleave(asks, more_mems)
                    pace = 0.03
                    sender = asyncio.create_task(h.send_all(stream, pace))
                    delay = self.rng.uniform(0.1, len(stream) * pace)
                    await asyncio.sleep(delay)
                    victim = self.rng.choice(pair)
                    victim.kill()
                    killed_at = time.time()
                    await sender
                    probes = self._probes(f"p{i}", s.partitions)
                    await h.send_all(probes)  # at least one event per partition after the kill
                inputs = mems + stream + probes
                survivor = next(w for w in pair if w is not victim)
                idx = await collect(s, self.bootstrap, inputs, 150, survivor.alive)
                judge(run, inputs, idx, s, users_of(inputs))
                await claim_twice(run, s, self.bootstrap, inputs, idx)
                recall_facts(run, inputs, idx)
                per_partition: dict[int, int] = {}
                for x in inputs:
                    if x.first_sent > killed_at and x.seg in idx.seg_ts and x.writes:
                        p = x.writes[0][0]
                        per_partition[p] = min(per_partition.get(p, 1 << 62), idx.seg_ts[x.seg])
                if len(per_partition) == s.partitions:
                    run.recover_s = max(per_partition.values()) / 1000 - killed_at
                run.facts.update(kill_after_s=round(delay, 2), victim=victim.name,
                                 partitions_served_after_kill=len(per_partition))
            except (RuntimeError, TimeoutError) as exc:
                run.problems.append(f"workers not ready: {str(exc)[:300]}")
            finally:
                for w in pair:
                    w.stop()
            run.add_workers(pair)
            await self.finish_run(drill, run, s, [s.home], _questions(run))

    def _probes(self, tag: str, partitions: int) -> list[Input]:
        """One single-message session per partition (the producer's murmur2 partitioner)."""
        out: list[Input] = []
        covered: set[int] = set()
        k = 0
        while len(covered) < partitions:
            k += 1
            sid = f"probe-{tag}-{k}"
            p = (murmur2(sid.encode()) & 0x7FFFFFFF) % partitions
            if p in covered:
                continue
            covered.add(p)
            rec = session_event(sid, f"probe-user-{tag}-{k}", 1, T0 + 2 * DAY, text="a probe "
                                "message after the kill")
            out.append(self.scenario._input(rec))
        return out

    # 5 ----------------------------------------------------------------------------------------
    async def bad_records(self) -> None:
        drill = Drill("5", "2,000 bad records among real sessions", "-", self.vector_for("5"))
        self.drills.append(drill)
        s = self.settings("bad", drill.vector)
        run = Run(drill.key, 1, str(s.home))
        await create_topics(s, self.bootstrap)
        bad = self._bad(f"b{uuid.uuid4().hex[:4]}")
        mems, asks = self.scenario.users("bad", 40)
        # users with `..`-style ids also state a fact and ask about it, so that recall and the
        # projections run on those scopes too
        for k, user in enumerate(DOTDOTS):
            m, a = self.scenario.user(f"dd{k}", user=user)
            mems += [_odd(x) for x in m]
            asks += [_odd(x) for x in a]
        # the real sessions spread through the bad ones: statements in the first half, the
        # questions in the second
        half = len(bad) // 2
        stream = _spread(bad[:half], mems, self.rng) + _spread(bad[half:], asks, self.rng)
        inputs = stream
        w = Worker("w", s, self.bootstrap)
        try:
            w.start()
            ready = await w.wait_ready()
            async with started_host(s, self.bootstrap) as h:
                await h.send_all(stream)
            idx = await collect(s, self.bootstrap, inputs, 180, w.alive)
            judge(run, inputs, idx, s, users_of(inputs))
            await claim_twice(run, s, self.bootstrap, [x for x in inputs if x.expect != "dlq"],
                              idx)
            recall_facts(run, [x for x in inputs if x.label == "real"], idx)
            by_label: dict[str, dict[str, int]] = {}
            for x in bad:
                row = by_label.setdefault(x.label, {"sent": 0, "dead-lettered": 0, "processed": 0})
                row["sent"] += 1
                row["dead-lettered"] += idx.dead_lettered(x, s) is not None
                row["processed"] += x.seg is not None and x.seg in idx.segs
            reasons: dict[str, int] = {}
            for rs in idx.dlq.values():
                for reason in rs:
                    reasons[reason] = reasons.get(reason, 0) + 1
            run.facts.update(ready_s=round(ready, 2), bad_records=len(bad),
                             by_kind=by_label, dead_letter_reasons=reasons)
            run.problems += stray_markdown(self.root)
        except (RuntimeError, TimeoutError) as exc:
            run.problems.append(f"worker not ready: {str(exc)[:300]}")
        finally:
            w.stop()
        run.add_workers([w])
        await self.finish_run(drill, run, s, [s.home], _questions(run))
        for label, row in sorted(run.facts.get("by_kind", {}).items()):
            print(f"      {label:24} sent {row['sent']:4}  dead-lettered {row['dead-lettered']:4}  "
                  f"processed {row['processed']:4}", flush=True)

    def _bad(self, tag: str) -> list[Input]:
        """2,000 hostile records, each in a session of its own (so none disturbs another)."""
        rng, reg = self.rng, self.registry
        out: list[Input] = []

        def event(label: str, expect: str, user: str | None = None, text: str = "Atlas notes",
                  t: int | None = None, schema_version: int = 1, key: bytes | None = None
                  ) -> Input:
            n = len(out)
            sid = f"bad-{tag}-{n}"
            user = user or f"bad-user-{tag}-{n}"
            rec = session_event(sid, user, 1, T0 + n if t is None else t, text=text,
                                schema_version=schema_version)
            value = reg.encode("io.mnemoflow.SessionEvent", rec)
            return Input("session-events", key or sid.encode(), value, expect, label, sid, user,
                         1, rec["eventTime"], text)

        def junk(label: str, value: bytes, source: str = "session-events") -> Input:
            return Input(source, f"bad-{tag}-{len(out)}".encode(), value, "dlq", label)

        def valid_bytes(source: str) -> bytes:
            n = len(out)
            if source == "tool-results":
                rec = {"schemaVersion": 1, "sessionId": f"bad-{tag}-{n}", "agentId": "a",
                       "userId": "u", "workspaceId": None, "eventSeq": 1, "turn": 1, "step": 1,
                       "eventTime": T0, "callId": "c1", "rootCallId": None, "parentCallId": None,
                       "toolName": "deploy", "status": "ok", "attempt": 1, "output": "done",
                       "error": None, "memoryRefs": []}
                return reg.encode("io.mnemoflow.ToolResult", rec)
            if source == "agent-steps":
                rec = {"schemaVersion": 1, "sessionId": f"bad-{tag}-{n}", "agentId": "a",
                       "userId": "u", "workspaceId": None, "eventSeq": 1, "turn": 1, "step": 1,
                       "eventTime": T0, "phase": "end", "text": "a step of the agent"}
                return reg.encode("io.mnemoflow.AgentStep", rec)
            return reg.encode("io.mnemoflow.SessionEvent",
                              session_event(f"bad-{tag}-{n}", "u", 1, T0, text="Atlas notes"))

        sources = ("session-events", "tool-results", "agent-steps")
        plan: list[tuple[str, int]] = [
            ("random-bytes", 400), ("wrong-magic", 250), ("unknown-fingerprint", 250),
            ("truncated-avro", 250), ("wrong-record-type", 46), ("schema-version-2", 250),
            ("event-time-max", 100), ("event-time-min", 100), ("user-300-chars", 150),
            ("user-dotdot", 150), ("text-300kB", 40), ("value-1MB-random", 4),
            ("value-1MB-avro", 4), ("key-600kB", 6)]
        for label, count in plan:
            for k in range(count):
                src = sources[k % 3]
                if label == "random-bytes":
                    out.append(junk(label, os.urandom(rng.randint(1, 300)), src))
                elif label == "wrong-magic":
                    v = valid_bytes(src)
                    out.append(junk(label, rng.choice([b"\xc3\x02", b"\x00\x01", b"{\""]) + v[2:],
                                    src))
                elif label == "unknown-fingerprint":
                    v = valid_bytes(src)
                    out.append(junk(label, MAGIC + struct.pack("<Q", rng.getrandbits(64)) + v[10:],
                                    src))
                elif label == "truncated-avro":
                    v = valid_bytes(src)
                    out.append(junk(label, v[:rng.randint(10, len(v) - 1)], src))
                elif label == "wrong-record-type":  # a valid AgentStep on session-events
                    out.append(junk(label, valid_bytes("agent-steps")))
                elif label == "schema-version-2":
                    out.append(event(label, "dlq", schema_version=2))
                elif label == "event-time-max":
                    out.append(event(label, "dlq", t=2**63 - 1))
                elif label == "event-time-min":
                    out.append(event(label, "dlq", t=-(2**63)))
                elif label == "user-300-chars":
                    user = "".join(rng.choice("abcdefghijklmnopqrstuvwxyzü-_.") for _ in range(300))
                    out.append(event(label, "either", user=user,
                                     text=f"My badge number is b{k:04d} for the Atlas lab."))
                elif label == "user-dotdot":
                    out.append(event(label, "either", user=DOTDOTS[k % len(DOTDOTS)],
                                     text=f"My badge number is d{k:04d} for the Atlas lab."))
                elif label == "text-300kB":
                    out.append(event(label, "dlq", text="Atlas rollout notes. " * (300_000 // 21)))
                elif label == "value-1MB-random":
                    out.append(junk(label, os.urandom(1_000_000)))
                elif label == "value-1MB-avro":  # a valid record whose text is near 1 MB
                    out.append(event(label, "dlq", text="x" * 999_700))
                elif label == "key-600kB":
                    out.append(event(label, "either", key=b"k" * 600_000,
                                     text=f"A message with a huge key, number {k}."))
        assert len(out) == 2000, len(out)
        rng.shuffle(out)
        return out


def _odd(x: Input) -> Input:
    x.expect, x.label = "either", "dotdot-question"
    return x


def _questions(run: Run) -> str:
    f = run.facts
    if "questions" not in f:
        return ""
    return (f"{f['events']} events, {f['questions_injected']}/{f['questions']} questions "
            f"injected, {f.get('packets_claimed', 0)} packets claimed")


def _print_run(drill: Drill, run: Run, line: str) -> None:
    flag = "FAIL" if run.failed else "ok"
    rec = f"{run.recover_s:.2f}s" if run.recover_s is not None else "-"
    print(f"  [{drill.key}] run {run.index:>2}: {flag:4} recover {rec:>7}  lost {len(run.lost)} "
          f"twice {len(run.twice)} crashes {run.crashes} problems {len(run.problems)}  "
          f"{_questions(run)}; {line}", flush=True)


def _interleave(a: list[Input], b: list[Input]) -> list[Input]:
    out: list[Input] = []
    for i in range(max(len(a), len(b))):
        out += a[i:i + 1] + b[i:i + 1]
    return out


def _spread(bad: list[Input], real: list[Input], rng: random.Random) -> list[Input]:
    """`real` in its order, each at a random place among `bad`."""
    slots = sorted(rng.sample(range(len(bad) + len(real)), len(real)))
    out: list[Input] = []
    bi = ri = 0
    for pos in range(len(bad) + len(real)):
        if ri < len(real) and slots[ri] == pos:
            out.append(real[ri])
            ri += 1
        else:
            out.append(bad[bi])
            bi += 1
    return out


def users_of(inputs: Iterable[Input]) -> dict[str, str]:
    return {x.sid: x.user for x in inputs if x.sid is not None and x.user is not None}


def stray_markdown(root: Path) -> list[str]:
    """MEMORY.md files outside <home>/markdown/<app>/<scope>/<owner folder>/ (a `..` owner
    id must never move a file out of its folder)."""
    out = []
    for path in root.rglob("MEMORY.md"):
        parts = path.relative_to(root).parts
        if "markdown" not in parts or len(parts) - parts.index("markdown") != 5:
            out.append(f"MEMORY.md outside its folder: {path}")
    return out


@contextlib.asynccontextmanager
async def started_host(settings: Settings, bootstrap: str) -> AsyncIterator[Host]:
    """A started Host, stopped on the way out."""
    h = Host(settings, bootstrap)
    await h.start()
    try:
        yield h
    finally:
        await h.stop()


async def _both_ready(workers: list[Worker], timeout: float) -> None:
    """Both workers ready at the same moment: the group has settled after the second join."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for w in workers:
            if not w.alive():
                raise RuntimeError(f"worker {w.name} exited: {w.proc.log_tail(1500)}")
        if all(w.proc.ready() for w in workers):
            return
        await asyncio.sleep(0.25)
    raise TimeoutError(f"workers not both ready in {timeout}s")


def _any_alive(workers: list[Worker]) -> Callable[[], bool]:
    return lambda: any(w.alive() for w in workers)


async def _quietly(aw: Awaitable[Any]) -> None:
    try:
        await aw
    except Exception as exc:  # a cleanup step must not hide the drill's own outcome
        print(f"  (cleanup: {type(exc).__name__}: {exc})", flush=True)


async def delete_topics(settings: Settings, bootstrap: str) -> None:
    """A clean run's topics (the catalogue and the changelogs): a campaign makes hundreds."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=15000,
                                **settings.client_kwargs())
    try:
        await admin.start()
        names = [t for t in await admin.list_topics()
                 if t.startswith((settings.topic_prefix, f"{settings.app_id}-"))]
        if names:
            await admin.delete_topics(names)
    except KafkaError as exc:
        print(f"  (topics of {settings.app_id} not deleted: {exc})", flush=True)
    finally:
        await admin.close()


# -- the report -------------------------------------------------------------------------------

def _p50_max(xs: list[float]) -> tuple[float | None, float | None]:
    return (statistics.median(xs), max(xs)) if xs else (None, None)


def report(camp: Campaign, started: float, load: tuple[float, float, float]) -> dict[str, Any]:
    vec = {d.key: d.vector for d in camp.drills}
    print()
    print(f"fault campaign: {time.monotonic() - started:.0f}s, seed {camp.args.seed}, broker "
          f"{'own (temporary)' if camp.broker else camp.bootstrap}, load before "
          f"{load[0]:.1f} after {os.getloadavg()[0]:.1f}")
    off = [k for k, v in vec.items() if not v]
    on = [k for k, v in vec.items() if v]
    print(f"workers with MNEMOFLOW_VECTOR=0 MNEMOFLOW_GRAPH=0 in drills {','.join(off) or '-'}; "
          f"vector and graph tiers on in drills {','.join(on) or '-'}")
    head = (f"{'drill':44} {'runs':>4} {'lost':>5} {'twice':>5} {'crashes':>7} {'problems':>8} "
            f"{'recover p50':>11} {'max':>7}  recover =")
    print(head)
    print("-" * len(head))
    out: dict[str, Any] = {"seed": camp.args.seed, "root": str(camp.root),
                           "broker": "own" if camp.broker else camp.bootstrap,
                           "load_before": load, "load_after": os.getloadavg(),
                           "wall_s": round(time.monotonic() - started, 1), "drills": {}}
    for d in camp.drills:
        name = f"{d.key}. {d.title}"
        if d.skipped:
            print(f"{name:44} skipped: {d.skipped}")
            out["drills"][d.key] = {"title": d.title, "skipped": d.skipped}
            continue
        recs = [r.recover_s for r in d.runs if r.recover_s is not None]
        p50, mx = _p50_max(recs)
        row = {"runs": len(d.runs), "lost": sum(len(r.lost) for r in d.runs),
               "twice": sum(len(r.twice) for r in d.runs),
               "crashes": sum(r.crashes for r in d.runs),
               "problems": sum(len(r.problems) for r in d.runs)}
        cell = (f"{p50:>10.2f}s {mx:>6.2f}s" if p50 is not None and mx is not None
                else f"{'-':>11} {'-':>7}")
        print(f"{name:44} {row['runs']:>4} {row['lost']:>5} {row['twice']:>5} "
              f"{row['crashes']:>7} {row['problems']:>8} {cell}  {d.recover_what}")
        out["drills"][d.key] = {"title": d.title, "vector_and_graph": d.vector,
                                "recover": d.recover_what, **row,
                                "recover_p50_s": p50, "recover_max_s": mx,
                                "recover_s": recs, **d.facts,
                                "runs_detail": [r.summary() for r in d.runs]}
    failed = [(d.key, r) for d in camp.drills for r in d.runs if r.failed]
    for key, r in failed:
        print(f"FAILED drill {key} run {r.index}: lost {len(r.lost)}, twice {len(r.twice)}, "
              f"crashes {r.crashes}, problems {len(r.problems)}; folder kept: {r.folder}")
        for what in (r.lost[:3] + r.twice[:3] + r.problems[:3] + r.crash_lines[:3]):
            print(f"    {what}")
    if camp.kept:
        print(f"kept folders (worker logs inside): {', '.join(sorted(set(camp.kept)))}")
    out["failed_runs"] = [{"drill": k, "run": r.index, "folder": r.folder} for k, r in failed]
    out["kept"] = sorted(set(camp.kept))
    return out


# -- main -------------------------------------------------------------------------------------

async def run_campaign(args: argparse.Namespace) -> int:
    started, load = time.monotonic(), os.getloadavg()
    root = Path(tempfile.mkdtemp(prefix="mnemoflow-faults-"))
    # the Kafka clients of the campaign itself log every failed connection during the broker
    # drill: to a file, so that the console keeps the figures
    logging.basicConfig(filename=root / "campaign.log", level=logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    print(f"fault campaign: seed {args.seed}, folder {root}", flush=True)
    env_bootstrap = Settings().bootstrap
    own: LocalKafka | None = None
    if env_bootstrap:
        bootstrap = env_bootstrap
        print(f"using KAFKA_BOOTSTRAP={bootstrap}; the broker-restart drill is skipped",
              flush=True)
    else:
        own = LocalKafka(Settings(home=root / "broker"))
        FLEET.broker = own
        bootstrap = (await asyncio.to_thread(own.up)).bootstrap
    camp = Campaign(root, bootstrap, own, random.Random(args.seed), args)
    drills: dict[str, Callable[[], Awaitable[None]]] = {
        "1": camp.fresh_start, "2": camp.broker_restart, "3": camp.sigkill,
        "4": camp.two_workers, "5": camp.bad_records}
    try:
        for key in args.drills.split(","):
            print(f"== drill {key}", flush=True)
            before = len(camp.drills)
            try:
                await drills[key.strip()]()
            except Exception as exc:  # one drill's failure must not hide the rest
                traceback.print_exc()
                if len(camp.drills) == before:
                    camp.drills.append(Drill(key, f"drill {key}", "-", False))
                d = camp.drills[-1]
                d.runs.append(Run(key, len(d.runs) + 1, str(camp.root),
                                  problems=[f"drill aborted: {type(exc).__name__}: {exc}"[:500]]))
    finally:
        FLEET.close()  # every worker and the broker, also on Ctrl-C and errors
    out = report(camp, started, load)
    write_results("fault_campaign", out)
    bad = bool(out["failed_runs"])
    if not bad and not args.keep:
        shutil.rmtree(root, ignore_errors=True)  # the broker's data too: nothing to look at
    return 1 if bad else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--drills", default="1,2,3,4,5")
    ap.add_argument("--seed", type=int, default=int(time.time()) % 100_000)
    ap.add_argument("--runs", type=int, default=0, help="runs per drill (default: the drill's)")
    ap.add_argument("--vector", choices=("auto", "on", "off"), default="auto")
    ap.add_argument("--keep", action="store_true", help="keep every run's folder")
    args = ap.parse_args()

    async def guarded() -> int:
        task = asyncio.current_task()
        assert task is not None
        # SIGTERM cancels the campaign like Ctrl-C does, so its finally blocks stop everything
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
        return await run_campaign(args)

    code = 130
    try:
        code = asyncio.run(guarded())
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("interrupted: workers and broker stopped", flush=True)
    finally:
        FLEET.close()  # idempotent; covers an exit before the campaign's own finally ran
    sys.exit(code)


if __name__ == "__main__":
    main()
