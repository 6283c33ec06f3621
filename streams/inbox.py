"""Host side of the durable inbox (N-03): rebuild pending state from the log, claim atomically.

Durability: every claim, expire and remove is written to the inbox topic and acknowledged
before the packets are handed out. Atomicity across concurrent claimers comes from the
partition's total order: after writing its claim op, a claimer reads the log up to that op
and keeps only the packets whose first claim is its own.

Checkpoints: after folding `checkpoint_every` more ops of a partition, a host writes the fold
(pending packets with their original op bytes, bounded claim history, position) to the
compacted inbox-checkpoints topic, in the same partition number. A restarted host reads the
newest checkpoint of the partition (its last record) and folds only the log after it. The
fold is deterministic, so any host's checkpoint is valid for every host; one that does not
fit (wrong version, topic, history bound, or a position past the log's end) is ignored and the
whole log is folded, which is always correct.

Outages: every wait on the broker is bounded by the producer's `timeout_s` (a read that makes
no progress for that long too) and ends in BrokerUnavailable. A claim op whose write timed
out may still reach the log when the broker is back; its packets are then this host's, and
the session's next `claim_all` hands them out (see `claim_all`).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError
from aiokafka.partitioner import murmur2

from mnemoflow.agents.ids import stable_id
from mnemoflow.agents.inbox import (
    HISTORY,
    PendingState,
    claim_op,
    claim_pages,
    expire_op,
    meta_from_headers,
    meta_of,
    op_record,
    split_expired,
)
from mnemoflow.schemas.codec import DecodeError
from mnemoflow.streams import topics as T
from mnemoflow.streams.config import Settings
from mnemoflow.streams.producer import (
    AvroProducer,
    BrokerUnavailable,
    TopicsMissing,
    bounded,
    present_topics_settled,
    within,
)
from mnemoflow.streams.reader import topic_partitions

log = logging.getLogger(__name__)

INBOX_SCHEMA = "io.mnemoflow.InboxOp"
CHECKPOINT_SCHEMA = "io.mnemoflow.InboxCheckpoint"
# 2: folds that believe a fold header only when it is bound to its body. A version-1
# checkpoint may hold a fold that believed a header its body contradicts: never restored.
CHECKPOINT_VERSION = 2
CHECKPOINT_EVERY = 2_000  # ops folded since the partition's last checkpoint
CHECKPOINT_MAX_BYTES = 900_000  # under Kafka's default 1 MiB record limit; larger: not written


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
    checkpointed: int = 0  # position of the last checkpoint read or written
    restored: bool = False  # a checkpoint was looked for (once per partition and client)
    folded: int = 0  # records this client folded itself (not restored from a checkpoint)
    checkpoint_bytes: int = 0  # size of the last checkpoint this client encoded


class _OpBody:
    """An inject op's record value: decoded to its packet only when handed out, and kept as
    bytes for a checkpoint."""

    __slots__ = ("raw", "registry")

    def __init__(self, raw: bytes, registry: Any) -> None:
        self.raw = raw
        self.registry = registry

    def __call__(self) -> dict[str, Any] | None:
        try:
            return self.registry.decode(self.raw, INBOX_SCHEMA)[1]["packet"]
        except DecodeError:  # e.g. a newer schema mid-upgrade: never handed out
            return None


class InboxClient:
    """One per host process. It reads only the partitions of the sessions it serves."""

    def __init__(self, settings: Settings, bootstrap: str, producer: AvroProducer,
                 checkpoints: bool = True, timeout_s: float | None = None) -> None:
        """`checkpoints=False`: never read or write one (every rebuild folds the whole log).
        `timeout_s`: the bound on each wait on the broker; by default the producer's."""
        self.settings = settings
        self.bootstrap = bootstrap
        self.topic = T.INBOX.name(settings)
        self.producer = producer
        self.registry = producer.registry
        self.timeout_s = producer.timeout_s if timeout_s is None else timeout_s
        self._consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                                          enable_auto_commit=False, auto_offset_reset="earliest",
                                          fetch_max_wait_ms=10,  # a claim waits on its own op
                                          **settings.client_kwargs())
        self._checkpoints = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                                             enable_auto_commit=False,
                                             fetch_max_wait_ms=10,  # no long poll at the end
                                             max_partition_fetch_bytes=4 * 1024 * 1024,
                                             **settings.client_kwargs())
        self.checkpoint_topic = T.INBOX_CHECKPOINTS.name(settings)
        self.checkpoint_every = CHECKPOINT_EVERY
        self.use_checkpoints = checkpoints
        self._checkpoint_parts: set[int] = set()
        self._parts: list[int] = []
        self._folds: dict[int, _PartitionFold] = {}
        self.claimer_id = f"host-{uuid.uuid4().hex[:12]}"
        self._lock = asyncio.Lock()  # one reader of the shared consumer at a time
        # claim ops written but not known to be settled, per session: (claim op id, packets)
        self._unsettled: dict[str, list[tuple[str, list[dict[str, Any]]]]] = {}
        self._claiming: dict[str, asyncio.Lock] = {}

    async def start(self) -> None:
        """TopicsMissing (one line, with the fix) when the inbox topic does not exist; a
        missing checkpoint topic only turns checkpoints off (it is derived data)."""
        try:
            await self._start()
        except BaseException:
            await self.stop()  # no client left open behind a failed start
            raise

    async def _start(self) -> None:
        present = await present_topics_settled(
            self.settings, self.bootstrap, [self.topic, self.checkpoint_topic], self.timeout_s)
        if self.topic not in present:
            raise TopicsMissing(self.bootstrap, [self.topic])
        if self.use_checkpoints and self.checkpoint_topic not in present:
            log.warning("inbox checkpoints off: topic %s does not exist (`mnemoflow topics "
                        "create` makes it); every rebuild folds the whole log",
                        self.checkpoint_topic)
            self.use_checkpoints = False
        async with within(self.bootstrap, "inbox client start", self.timeout_s):
            await self._consumer.start()
            tps = await topic_partitions(self._consumer, self.topic)
            self._parts = [tp.partition for tp in tps]
            self._consumer.assign(tps)
            await self._checkpoints.start()
            if not self.use_checkpoints:
                return
            try:
                ck = await topic_partitions(self._checkpoints, self.checkpoint_topic, attempts=10)
                self._checkpoint_parts = {tp.partition for tp in ck}
            except (KafkaError, LookupError) as exc:  # deleted since the check: fold whole logs
                log.warning("inbox checkpoints off: %s", exc)

    async def stop(self) -> None:
        for consumer in (self._consumer, self._checkpoints):
            try:
                await consumer.stop()
            except asyncio.CancelledError:
                # aiokafka's fetcher, closing, re-raises the cancellation of a fetch it was
                # retrying (the broker away at stop) and skips closing the connections
                # (aiokafka issue 647); a cancellation of our own is passed on
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise
                await consumer._client.close()

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
        end = (await bounded(self.bootstrap, f"end offset of {tp.topic}:{p}", self.timeout_s,
                             lambda: self._consumer.end_offsets([tp])))[tp]
        if not fold.restored:
            fold.restored = True
            await self._restore(p, fold, end)
        target = end if until_offset is None else max(until_offset + 1, fold.position)
        if fold.position < target:
            self._consumer.seek(tp, fold.position)
        sessions, registry = fold.sessions, self.registry
        progress = time.monotonic()
        while fold.position < target:
            batch = await self._consumer.getmany(tp, timeout_ms=500, max_records=10000)
            await asyncio.sleep(0)  # let the fetcher send the next fetch: it runs while we fold
            if not batch.get(tp) and time.monotonic() - progress > self.timeout_s:
                raise BrokerUnavailable.after(
                    self.bootstrap, f"reading {tp.topic}:{p} from offset {fold.position} "
                    f"(end {target})", progress)
            for m in batch.get(tp, ()):
                meta = meta_from_headers(m.headers, m.value)
                packet: Any
                if meta is None:  # no header bound to this body: decode the body now
                    try:
                        _, op = self.registry.decode(m.value, INBOX_SCHEMA)
                    except DecodeError:
                        continue  # not ours to fix here; the op never happened for the fold
                    meta = meta_of(op)
                # decoded only if it is still pending when the host asks for it
                packet = _OpBody(m.value, registry) if meta.packet_id else None
                state = sessions.get(meta.session_id)
                if state is None:
                    state = sessions[meta.session_id] = PendingState()
                state.apply_meta(meta, packet, m.offset)
            if batch.get(tp):
                fold.position = batch[tp][-1].offset + 1
                fold.folded += len(batch[tp])
                progress = time.monotonic()
        if fold.position - fold.checkpointed >= self.checkpoint_every:
            await self._write_checkpoint(p, fold)
        return fold.sessions.get(session_id, PendingState())

    def ops_folded(self, session_id: str) -> int:
        """Records of the session's partition this client folded itself: with a checkpoint,
        only the log after it."""
        fold = self._folds.get(self.partition_for(session_id))
        return fold.folded if fold else 0

    def _checkpoint_key(self, partition: int) -> bytes:
        return f"{self.topic}:{partition}".encode()

    async def _restore(self, p: int, fold: _PartitionFold, end: int) -> None:
        """Start the partition's fold from its newest checkpoint, if one fits."""
        if p not in self._checkpoint_parts or fold.position:
            return
        tp = TopicPartition(self.checkpoint_topic, p)
        last = (await self._checkpoints.end_offsets([tp]))[tp]
        if last == 0:
            return
        # assign and seek with no await between: the first fetch then starts at the record we
        # want, not at a reset position where it would long-poll an empty end first
        self._checkpoints.assign([tp])
        self._checkpoints.seek(tp, last - 1)
        recs = (await self._checkpoints.getmany(tp, timeout_ms=2000)).get(tp, [])
        if not recs or recs[-1].value is None:
            return
        try:
            _, ck = self.registry.decode(recs[-1].value, CHECKPOINT_SCHEMA)
        except DecodeError as exc:
            log.warning("inbox checkpoint %s:%d unreadable (%s): folding the log", *tp, exc)
            return
        if (ck["checkpointVersion"], ck["inboxTopic"], ck["partition"], ck["history"]) != (
                CHECKPOINT_VERSION, self.topic, p, HISTORY) or ck["position"] > end:
            log.warning("inbox checkpoint %s:%d does not fit this log: folding it", *tp)
            return
        reg = self.registry
        fold.sessions = {
            e["sessionId"]: PendingState.from_snapshot(e["sessionId"], e,
                                                       lambda raw: _OpBody(raw, reg))
            for e in ck["sessions"]}
        fold.position = fold.checkpointed = ck["position"]

    async def _write_checkpoint(self, p: int, fold: _PartitionFold) -> None:
        """Best effort: a checkpoint that cannot be written only makes the next rebuild slower."""
        fold.checkpointed = fold.position  # tried at this position; next after more ops
        if p not in self._checkpoint_parts:
            return
        sessions = []
        for sid, state in fold.sessions.items():
            snap = state.snapshot(lambda e: getattr(e.source, "raw", None))
            if snap is None:
                return
            sessions.append({"sessionId": sid, **snap})
        value = self.registry.encode(CHECKPOINT_SCHEMA, {
            "checkpointVersion": CHECKPOINT_VERSION, "inboxTopic": self.topic, "partition": p,
            "position": fold.position, "history": HISTORY, "writer": self.claimer_id,
            "sessions": sessions})
        fold.checkpoint_bytes = len(value)
        if len(value) > CHECKPOINT_MAX_BYTES:
            log.warning("inbox checkpoint of partition %d is %d bytes: not written", p,
                        len(value))
            return
        try:
            await self.producer.send_raw(self.checkpoint_topic, self._checkpoint_key(p), value,
                                         partition=p)
        except KafkaError as exc:
            log.warning("inbox checkpoint of partition %d not written: %s", p, exc)

    async def _write(self, op: dict[str, Any]) -> int:
        value, headers = op_record(op, self.registry)
        md = await self.producer.send_raw(self.topic, op["sessionId"].encode(), value, headers)
        return int(md.offset)

    async def pending(self, session_id: str, now_ms: int) -> list[dict[str, Any]]:
        live, _ = split_expired(await self.sync(session_id), now_ms)
        return await self._opened(live)

    async def _opened(self, packets: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """The packets as the host reads them: their items in the clear, an item whose key is
        shredded (its owner was forgotten) left out, and a packet left with no item too."""
        if not self.settings.seal:
            return list(packets)
        keys = self.producer.keys()
        opened = [(p, await keys.open_packet(p)) for p in packets]
        return [q for p, q in opened if q["items"] or not p["items"]]

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
        """Atomically claim every live pending packet of the session, FIFO.

        If this raises after a claim op was sent (BrokerUnavailable, say), that op may still
        reach the log, and its packets then belong to this host although nobody got them:
        they stay remembered, and the session's next claim_all (from this client) waits for
        the producer's queue to drain, then hands out first those that went to such a claim.
        Two calls for one session from this client run one after the other (both would
        otherwise hand out those packets).
        """
        lock = self._claiming.setdefault(session_id, asyncio.Lock())
        async with lock:
            return await self._claim_all(session_id, now_ms, visible_digests)

    async def _claim_all(self, session_id: str, now_ms: int,
                         visible_digests: frozenset[str]) -> ClaimResult:
        earlier = self._unsettled.get(session_id, [])
        if earlier:
            await self.producer.flush()  # each earlier claim op is in the log now, or never
        state = await self.sync(session_id)
        recovered = [(cid, p) for cid, page in earlier for p in page
                     if state.winner(p["packetId"]) == cid]
        live, dead = split_expired(state, now_ms)
        expired = tuple(p["packetId"] for p in dead)
        if expired:
            await self._write(expire_op(session_id, expired, now_ms))
        visible = tuple(p["packetId"] for p in live if p["exactDigest"] in visible_digests)
        if visible:
            await self.remove(session_id, list(visible), now_ms, "already-visible")
        live = [p for p in live if p["packetId"] not in visible]
        claim_ids, offset = [], -1
        for page in claim_pages([p["packetId"] for p in live]):
            claim_id = stable_id("op", "claim", self.claimer_id, uuid.uuid4().hex)
            ids = set(page)
            # remembered before the write: a write that raises may still land
            self._unsettled.setdefault(session_id, []).append(
                (claim_id, [p for p in live if p["packetId"] in ids]))
            offset = await self._write(claim_op(claim_id, session_id, page, now_ms,
                                                self.claimer_id))
            claim_ids.append(claim_id)
        if claim_ids:
            state = await self.sync(session_id, until_offset=offset)
        self._unsettled.pop(session_id, None)  # every claim op above is settled: its result is ours
        # a packet an earlier claim won is claimed, so it needs no expire or remove op
        late = [p for _, p in recovered]
        expired += tuple(p["packetId"] for p in late if p["expiry"] <= now_ms)
        visible += tuple(p["packetId"] for p in late
                         if p["expiry"] > now_ms and p["exactDigest"] in visible_digests)
        won = tuple(p for p in late if p["packetId"] not in expired + visible) + tuple(
            p for p in live if state.winner(p["packetId"]) in claim_ids)
        lost = tuple(p["packetId"] for p in live if state.winner(p["packetId"]) not in claim_ids)
        ops = tuple(dict.fromkeys(cid for cid, _ in recovered)) + tuple(claim_ids)
        return ClaimResult(tuple(await self._opened(won)), expired, lost, visible, ops)
