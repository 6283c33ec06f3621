"""Host SDK: wait, with a bound, until the pipeline has decided about a session's events.

A `DecisionWatcher` reads the audit topic's partitions of the sessions it is asked about
(the audit is keyed by sessionId, like the inbox) and folds their gate and broker records
(`mnemoflow.agents.decisions`). `wait` returns as soon as every asked event is decided: at
once after a suppress, after the broker's record when the gate fired. A partition is read
from `lookback_s` before the watcher started (by record timestamp), so records written
before the first wait are not missed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from mnemoflow.agents.decisions import TIMEOUT, Decision, SessionAudits, decide, undecided
from mnemoflow.agents.partitioning import partition_of
from mnemoflow.schemas.codec import DecodeError, SchemaRegistry, default_registry
from mnemoflow.streams import topics as T
from mnemoflow.streams.config import Settings
from mnemoflow.streams.producer import TopicsMissing, bounded, present_topics_settled, within
from mnemoflow.streams.reader import topic_partitions

AUDIT_SCHEMA = "io.mnemoflow.AuditRecord"
READ_S = 0.1  # the longest one read holds the consumer (a fetch returns as soon as data comes)
SESSIONS_KEPT = 10_000  # sessions whose audits are kept, the most recently touched


class DecisionWatcher:
    """One per host process; `wait` may be called from many tasks at once: they take turns
    reading, one short fetch at a time."""

    def __init__(self, settings: Settings, bootstrap: str, timeout_s: float | None = None,
                 lookback_s: float = 300.0, registry: SchemaRegistry | None = None) -> None:
        self.settings = settings
        self.bootstrap = bootstrap
        self.topic = T.AUDIT.name(settings)
        self.timeout_s = settings.host_timeout_s if timeout_s is None else timeout_s
        self.registry = registry or default_registry()
        self.since_ms = int((time.time() - lookback_s) * 1000)
        self._consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                                          enable_auto_commit=False, auto_offset_reset="latest",
                                          fetch_max_wait_ms=20, **settings.client_kwargs())
        self._parts = 0
        self._positions: dict[int, int] = {}  # assigned partition -> next offset to read
        self._sessions: dict[str, SessionAudits] = {}
        self._lock = asyncio.Lock()  # one reader of the consumer at a time

    async def start(self) -> None:
        present = await present_topics_settled(self.settings, self.bootstrap, [self.topic],
                                               self.timeout_s)
        if self.topic not in present:
            raise TopicsMissing(self.bootstrap, [self.topic])
        async with within(self.bootstrap, "decision watcher start", self.timeout_s):
            await self._consumer.start()
            self._parts = len(await topic_partitions(self._consumer, self.topic))

    async def stop(self) -> None:
        await self._consumer.stop()

    async def __aenter__(self) -> DecisionWatcher:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def audits(self, session_id: str) -> SessionAudits:
        """What has been read of the session so far."""
        return self._sessions.get(session_id) or SessionAudits()

    async def wait(self, session_id: str, seqs: int | Iterable[int],
                   timeout_s: float) -> Decision:
        """The decision for the session's events `seqs` (one eventSeq or several), or a
        `timeout` decision naming the undecided ones after `timeout_s`."""
        wanted = (seqs,) if isinstance(seqs, int) else tuple(seqs)
        started = time.monotonic()
        deadline = started + timeout_s
        async with self._lock:
            await self._watch(partition_of(session_id, self._parts))
        while True:
            found = decide(self.audits(session_id), wanted)
            left = deadline - time.monotonic()
            if found is not None or left <= 0:
                break
            # one short read at a time: it folds every watched partition, so each waiter sees
            # what another's read brought, and none waits behind a whole other wait
            async with self._lock:
                if decide(self.audits(session_id), wanted) is None:
                    await self._read(min(left, READ_S))
        waited = (time.monotonic() - started) * 1000
        if found is None:
            audits = self.audits(session_id)
            last = max(wanted, default=0)
            return Decision(TIMEOUT, last, audits.gates.get(last),
                            undecided=undecided(audits, wanted), waited_ms=waited)
        return Decision(found.outcome, found.event_seq, found.gate, found.broker,
                        found.packet_ids, waited_ms=waited)

    async def _watch(self, partition: int) -> None:
        if partition in self._positions:
            return
        tp = TopicPartition(self.topic, partition)
        # the end first: a record written between the two requests is then after `end`,
        # where a missing timestamp match starts reading, and is not skipped
        end = await bounded(self.bootstrap, f"end offset of {self.topic}:{partition}",
                            self.timeout_s, lambda: self._consumer.end_offsets([tp]))
        found = await bounded(self.bootstrap, f"offset by time on {self.topic}:{partition}",
                              self.timeout_s,
                              lambda: self._consumer.offsets_for_times({tp: self.since_ms}))
        start = found[tp].offset if found.get(tp) is not None else end[tp]
        self._positions[partition] = start
        # a new assignment forgets the positions of the old one: seek every partition again
        self._consumer.assign([TopicPartition(self.topic, p) for p in self._positions])
        for p, offset in self._positions.items():
            self._consumer.seek(TopicPartition(self.topic, p), offset)

    async def _read(self, timeout_s: float) -> None:
        batches = await self._consumer.getmany(timeout_ms=max(1, int(timeout_s * 1000)),
                                               max_records=5000)
        for tp, records in batches.items():
            for m in records:
                self._fold(m.value)
            if records:
                self._positions[tp.partition] = records[-1].offset + 1

    def _fold(self, raw: bytes | None) -> None:
        if raw is None:
            return
        try:
            _, audit = self.registry.decode(raw, AUDIT_SCHEMA)
        except DecodeError:
            return  # not a record this client can read; the pipeline dead-letters its own
        sid = audit["sessionId"]
        audits = self._sessions.pop(sid, None) or SessionAudits()
        self._sessions[sid] = audits  # most recently touched last
        audits.add(audit)
        while len(self._sessions) > SESSIONS_KEPT:
            self._sessions.pop(next(iter(self._sessions)))


def describe(decision: Decision) -> dict[str, Any]:
    """A decision as plain data (for logs, the gateway and tests)."""
    gate = decision.gate or {}
    broker = decision.broker or {}
    return {"outcome": decision.outcome, "eventSeq": decision.event_seq,
            "gate": {"action": gate.get("action"), "reason": gate.get("reason")} if gate else None,
            "broker": ({"action": broker.get("action"), "reason": broker.get("reason")}
                       if broker else None),
            "packetIds": list(decision.packet_ids), "undecided": list(decision.undecided),
            "waitedMs": round(decision.waited_ms, 1)}
