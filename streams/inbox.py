"""Host side of the durable inbox (N-03): rebuild pending state from the log, claim atomically.

Durability: every claim, expire and remove is written to the inbox topic and acknowledged
before the packets are handed out. Atomicity across concurrent claimers comes from the
partition's total order: after writing its claim op, a claimer reads the log up to that op
and keeps only the packets whose first claim is its own.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.partitioner import murmur2

from mnemoflow.agents.ids import stable_id
from mnemoflow.agents.inbox import (
    PendingState,
    claim_pages,
    meta_from_headers,
    meta_of,
    op_headers,
    split_expired,
)
from mnemoflow.schemas.codec import DecodeError
from mnemoflow.streams import topics as T
from mnemoflow.streams.config import Settings
from mnemoflow.streams.producer import AvroProducer
from mnemoflow.streams.reader import topic_partitions

INBOX_SCHEMA = "io.mnemoflow.InboxOp"


@dataclass(frozen=True)
class ClaimResult:
    packets: tuple[dict[str, Any], ...]
    expired: tuple[str, ...] = ()
    lost: tuple[str, ...] = ()  # packets another claimer got first
    already_visible: tuple[str, ...] = ()
    claim_ops: tuple[str, ...] = ()  # one per page of packet ids (agents.inbox.CLAIM_PAGE)


@dataclass
class _PartitionFold:
    position: int = 0
    sessions: dict[str, PendingState] = field(default_factory=dict)


class InboxClient:
    """One per host process. It reads only the partitions of the sessions it serves."""

    def __init__(self, settings: Settings, bootstrap: str, producer: AvroProducer) -> None:
        self.settings = settings
        self.topic = T.INBOX.name(settings)
        self.producer = producer
        self.registry = producer.registry
        self._consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                                          enable_auto_commit=False, auto_offset_reset="earliest",
                                          fetch_max_wait_ms=10,  # a claim waits on its own op
                                          **settings.client_kwargs())
        self._parts: list[int] = []
        self._folds: dict[int, _PartitionFold] = {}
        self.claimer_id = f"host-{uuid.uuid4().hex[:12]}"
        self._lock = asyncio.Lock()  # one reader of the shared consumer at a time

    async def start(self) -> None:
        await self._consumer.start()
        tps = await topic_partitions(self._consumer, self.topic)
        self._parts = [tp.partition for tp in tps]
        self._consumer.assign(tps)

    async def stop(self) -> None:
        await self._consumer.stop()

    def partition_for(self, session_id: str) -> int:
        """The producer's default partitioner (murmur2), so we read where the worker wrote."""
        return self._parts[(murmur2(session_id.encode()) & 0x7FFFFFFF) % len(self._parts)]

    async def sync(self, session_id: str, until_offset: int | None = None) -> PendingState:
        """Fold the session's partition up to its end (or up to `until_offset`, inclusive)."""
        async with self._lock:
            return await self._sync(session_id, until_offset)

    async def _sync(self, session_id: str, until_offset: int | None) -> PendingState:
        p = self.partition_for(session_id)
        tp = TopicPartition(self.topic, p)
        fold = self._folds.setdefault(p, _PartitionFold())
        end = (await self._consumer.end_offsets([tp]))[tp]
        target = end if until_offset is None else max(until_offset + 1, fold.position)
        if fold.position < target:
            self._consumer.seek(tp, fold.position)
        sessions, loader = fold.sessions, self._loader
        while fold.position < target:
            batch = await self._consumer.getmany(tp, timeout_ms=500, max_records=10000)
            for m in batch.get(tp, ()):
                meta = meta_from_headers(m.headers)
                packet: Any
                if meta is None:  # an op written without headers: decode its body now
                    try:
                        _, op = self.registry.decode(m.value, INBOX_SCHEMA)
                    except DecodeError:
                        continue  # not ours to fix here; the op never happened for the fold
                    meta, packet = meta_of(op), op.get("packet") or {}
                else:  # decoded only if it is still pending when the host asks for it
                    packet = loader(m.value) if meta.packet_id else None
                state = sessions.get(meta.session_id)
                if state is None:
                    state = sessions[meta.session_id] = PendingState()
                state.apply_meta(meta, packet, m.offset)
            if batch.get(tp):
                fold.position = batch[tp][-1].offset + 1
        return fold.sessions.get(session_id, PendingState())

    def _loader(self, value: bytes) -> Any:
        def load() -> dict[str, Any] | None:
            try:
                return self.registry.decode(value, INBOX_SCHEMA)[1]["packet"]
            except DecodeError:  # e.g. a newer schema mid-upgrade: never handed out
                return None
        return load

    async def _write(self, op: dict[str, Any]) -> int:
        md = await self.producer.send(self.topic, INBOX_SCHEMA, op["sessionId"], op,
                                      op_headers(op))
        return int(md.offset)

    async def pending(self, session_id: str, now_ms: int) -> list[dict[str, Any]]:
        live, _ = split_expired(await self.sync(session_id), now_ms)
        return live

    async def steer(self, session_id: str, packet: dict[str, Any], now_ms: int,
                    authorised_by: str) -> None:
        """Write to the next step and wake the host; only a user or the system may do this."""
        if authorised_by not in ("user", "system"):
            raise PermissionError("steer needs user or system authorisation")
        await self._write({"opId": stable_id("op", "steer", packet["packetId"]), "op": "steer",
                           "sessionId": session_id, "eventTime": now_ms, "packet": packet,
                           "packetIds": [packet["packetId"]], "claimer": None,
                           "reason": "steer", "authorisedBy": authorised_by})

    async def remove(self, session_id: str, packet_ids: list[str], now_ms: int,
                     reason: str) -> None:
        await self._write({"opId": stable_id("op", "remove", session_id, *packet_ids, reason),
                           "op": "remove", "sessionId": session_id, "eventTime": now_ms,
                           "packet": None, "packetIds": packet_ids, "claimer": self.claimer_id,
                           "reason": reason, "authorisedBy": None})

    async def claim_all(self, session_id: str, now_ms: int,
                        visible_digests: frozenset[str] = frozenset()) -> ClaimResult:
        """Atomically claim every live pending packet of the session, FIFO."""
        state = await self.sync(session_id)
        live, dead = split_expired(state, now_ms)
        expired = tuple(p["packetId"] for p in dead)
        if expired:
            await self._write({"opId": stable_id("op", "expire", session_id, *expired),
                               "op": "expire", "sessionId": session_id, "eventTime": now_ms,
                               "packet": None, "packetIds": list(expired), "claimer": None,
                               "reason": "expired", "authorisedBy": None})
        visible = tuple(p["packetId"] for p in live if p["exactDigest"] in visible_digests)
        if visible:
            await self.remove(session_id, list(visible), now_ms, "already-visible")
        live = [p for p in live if p["packetId"] not in visible]
        if not live:
            return ClaimResult((), expired, (), visible)
        claim_ids, offset = [], -1
        for page in claim_pages([p["packetId"] for p in live]):
            claim_id = stable_id("op", "claim", self.claimer_id, uuid.uuid4().hex)
            offset = await self._write({
                "opId": claim_id, "op": "claim", "sessionId": session_id, "eventTime": now_ms,
                "packet": None, "packetIds": page, "claimer": self.claimer_id, "reason": None,
                "authorisedBy": None})
            claim_ids.append(claim_id)
        state = await self.sync(session_id, until_offset=offset)
        won = tuple(p for p in live if state.winner(p["packetId"]) in claim_ids)
        lost = tuple(p["packetId"] for p in live if state.winner(p["packetId"]) not in claim_ids)
        return ClaimResult(won, expired, lost, visible, tuple(claim_ids))
