"""N-03 inbox fold: a session's pending packets are the fold of its inbox operations.

Deterministic and idempotent (each op is applied once, by opId), so the pending set can be
rebuilt from the log after any restart, cancel or resume. The log order is the arbiter
between claimers: a packet belongs to the first claim op that names it. The fold mutates
in place (O(1) per op) because a rebuild folds the whole log.

The fold reads only an op's `OpMeta` (kind, ids, digest, expiry). Writers also put that
metadata in a record header (`op_headers`), so a rebuild can fold a long log without
decoding every Avro body: a pending packet's body is decoded only when it is handed out.
The body stays the truth: the header is believed only when it is bound to the body it
travels with (`meta_from_headers`); otherwise the reader decodes the body.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from mnemoflow.agents.ids import stable_id

Packet = dict[str, Any]
PacketSource = Packet | Callable[[], Packet]  # the packet, or a loader that decodes it

CLAIM_PAGE = 256  # packet ids per claim op: a claim record stays small however long the queue
HISTORY = 1024  # claimed ids/digests, applied op ids and drop reasons remembered per session

# kind, opId, sessionId, packetId, exactDigest, expiry, packetIds..., then the tag that binds
# them to the record value. Its key differs from the untagged `mf-fold` header's, so neither
# format is ever read as the other: an op that carries only `mf-fold` is decoded.
FOLD_HEADER = "mf-fold2"
_SEP = "\x1f"  # ASCII unit separator: never in our ids or hex digests
_TAG_BYTES = 12  # blake2b digest size
_TAG_HEX = 2 * _TAG_BYTES  # the header ends with a separator and the tag in hex

# What a header is checked against without decoding: the body's first fields, where the
# InboxOp schema puts them after the 10-byte single-object header (opId, op, sessionId,
# eventTime, then the packet union: a MemoryPacket starts with packetSchemaVersion, packetId;
# with no packet, packetIds follows at once). The op enum's index, zigzag-encoded:
_KIND_BYTE = {k: 2 * i for i, k in enumerate(("inject", "steer", "claim", "remove", "expire"))}
_BODY_START = 10
_IDS_CHECKED = 8  # an op naming more packet ids is decoded instead: fastavro is faster there


class OpMeta(NamedTuple):
    """What the fold needs of one inbox op (a tuple: a rebuild makes one per record)."""

    op_id: str
    kind: str  # inject | steer | claim | remove | expire
    session_id: str
    packet_id: str | None = None
    digest: str | None = None
    expiry: int = 0
    packet_ids: tuple[str, ...] = ()


def meta_of(op: dict[str, Any]) -> OpMeta:
    p = op.get("packet")
    return OpMeta(op["opId"], op["op"], op["sessionId"],
                  p["packetId"] if p else None, p["exactDigest"] if p else None,
                  int(p["expiry"]) if p else 0, tuple(op.get("packetIds") or ()))


class Encoder(Protocol):
    """What writing an op needs of a schema registry (`mnemoflow.schemas.codec.SchemaRegistry`)."""

    def encode(self, name: str, record: dict[str, Any]) -> bytes: ...


def op_record(op: dict[str, Any], registry: Encoder | None = None
              ) -> tuple[bytes, list[tuple[str, bytes]]]:
    """The op's record value (InboxOp, single-object encoded) and its fold header, bound to
    that value: write both, unchanged, in one record.

    Writers pass the registry they already hold. Without one, a registry of the current
    schemas is built for this call alone (milliseconds): nothing is cached between calls."""
    value = (registry or _current_schemas()).encode("io.mnemoflow.InboxOp", op)
    m = meta_of(op)
    text = _SEP.join((m.kind, m.op_id, m.session_id, m.packet_id or "", m.digest or "",
                      str(m.expiry), *m.packet_ids)).encode()
    return value, [(FOLD_HEADER, text + b"\x1f" + _tag(text, value))]


def op_headers(op: dict[str, Any], registry: Encoder | None = None) -> list[tuple[str, bytes]]:
    """The fold header of a writer that encodes the value itself with the current InboxOp
    schema: Avro encoding is deterministic, so the tag computed here matches its bytes (if
    it did not, readers would only decode the body)."""
    return op_record(op, registry)[1]


def _current_schemas() -> Encoder:
    # imported here, not at the top: the fold and the rest of the agents package need no
    # Avro codec, only this fallback does
    from mnemoflow.schemas.codec import default_registry

    return default_registry()


def _tag(text: bytes, value: bytes) -> bytes:
    """blake2b of the header text, then the record value: the header belongs to this value.
    A checksum, not a signature: it catches a header that is not this record's (truncated,
    copied, written by older code); the body check catches a wrong header tagged right."""
    h = hashlib.blake2b(text, digest_size=_TAG_BYTES)
    h.update(value)
    return h.hexdigest().encode()


def meta_from_headers(headers: Sequence[tuple[str, bytes]] | None,
                      value: bytes | None) -> OpMeta | None:
    """The op's metadata from its fold header, or None (then decode the body): no header, a
    tag that does not match, anything that does not parse, or fields the body's first bytes
    contradict (its opId, kind, sessionId, and its packetId or, with no packet, its packet
    ids). An op with a packet must name just that packet in its packet ids, as every
    writer's does; its exactDigest and expiry sit after the packet's items, out of the
    check's reach, and rest on the tag alone.

    Written for speed (a rebuild calls this once per record): one hash, one split and a few
    byte comparisons, where the fallback is an Avro decode.
    """
    if not headers or value is None:
        return None
    for key, header in headers:
        if key != FOLD_HEADER:
            continue
        text = header[:-_TAG_HEX - 1]
        if header[-_TAG_HEX - 1:-_TAG_HEX] != b"\x1f" or header[-_TAG_HEX:] != _tag(text, value):
            return None
        try:
            f = text.decode().split(_SEP)
            kind, op_id, sid, pid = f[0], f[1], f[2], f[3]
            ob, sb = op_id.encode(), sid.encode()
            if len(ob) < 64 and len(sb) < 64:  # each length one byte: the usual case, inlined
                head = b"%c%s%c%c%s" % (len(ob) << 1, ob, _KIND_BYTE[kind], len(sb) << 1, sb)
            else:
                head = _avro_str(ob) + bytes((_KIND_BYTE[kind],)) + _avro_str(sb)
            if len(f) > 6 + _IDS_CHECKED or not value.startswith(head, _BODY_START):
                return None
            i = _BODY_START + len(head)
            while value[i] & 0x80:  # eventTime, a varint
                i += 1
            if pid:  # the union's packet branch (1), packetSchemaVersion (a varint), packetId
                if len(f) != 7 or f[6] != pid or value[i + 1] != 2:
                    return None
                i += 2
                while value[i] & 0x80:
                    i += 1
                if not value.startswith(_avro_str(pid.encode()), i + 1):
                    return None
            elif value[i + 1] != 0 or not value.startswith(_avro_ids(f[6:]), i + 2):
                return None  # not the union's null branch (0), or other packetIds
            return _new_meta(OpMeta, (op_id, kind, sid, pid or None, f[4] or None, int(f[5]),
                                      tuple(f[6:])))
        except (KeyError, IndexError, ValueError, UnicodeDecodeError):
            return None
    return None


def _avro_str(b: bytes) -> bytes:
    """An Avro string: its length as a zigzag varint, then its bytes."""
    n = len(b) << 1
    if n < 0x80:
        return b"%c%s" % (n, b)
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out) + b


def _avro_ids(ids: list[str]) -> bytes:
    """An array of strings as fastavro writes it: one block (its count, the items), then the
    empty block. At most _IDS_CHECKED items, so the count is one byte."""
    if len(ids) == 1:  # a claim of one packet: the usual claim
        return b"\x02%s\0" % _avro_str(ids[0].encode())
    if not ids:
        return b"\0"
    return b"%c%s\0" % (len(ids) << 1, b"".join([_avro_str(x.encode()) for x in ids]))


_new_meta = tuple.__new__


_UNSET: Any = object()


@dataclass(slots=True)
class _Pending:
    meta: OpMeta
    source: PacketSource
    decoded: Any = _UNSET

    def packet(self) -> Packet | None:
        """The packet, decoded on first use; None if its body cannot be read. The source is
        kept (a checkpoint writes the op's original bytes, not a re-encoding)."""
        if self.decoded is _UNSET:
            self.decoded = self.source() if callable(self.source) else self.source
        return self.decoded


def _trim(d: dict[str, Any], keep: int) -> None:
    """Forget all but the newest `keep` entries once there are twice as many (amortised O(1),
    and a pure function of the op sequence, so a restored checkpoint trims the same way)."""
    if len(d) > 2 * keep:
        newest = list(d.items())[-keep:]
        d.clear()
        d.update(newest)


@dataclass
class PendingState:
    """One session's fold. History (claimed ids and digests, applied op ids, dropped reasons)
    is bounded to the newest `history` entries, so a long-lived session's state and its
    checkpoint stay small: "already claimed" dedupe covers the last `history` claims."""

    pending_by_id: dict[str, _Pending] = field(default_factory=dict)  # FIFO (insertion)
    steer: set[str] = field(default_factory=set)  # packet ids that should wake the host
    claimed: dict[str, str] = field(default_factory=dict)  # packetId -> claim opId, oldest first
    claimed_digests: dict[str, None] = field(default_factory=dict)  # an ordered set
    pending_digests: set[str] = field(default_factory=set)
    applied: dict[str, None] = field(default_factory=dict)  # op ids, an ordered set
    dropped: list[tuple[str, str]] = field(default_factory=list)  # (packetId, why)
    last_offset: int = -1
    history: int = HISTORY

    @property
    def pending(self) -> tuple[Packet, ...]:
        return tuple(self._packets(self.pending_by_id.values()))

    def _packets(self, entries: Any) -> list[Packet]:
        """Decoded packets; one whose body cannot be read is dropped with its reason, so it
        can never block the session's inbox."""
        out = []
        for e in list(entries):
            p = e.packet()
            if p is None:
                pid = e.meta.packet_id or ""
                self.pending_by_id.pop(pid, None)
                self.pending_digests.discard(e.meta.digest or "")
                self._drop(pid, "undecodable")
            else:
                out.append(p)
        return out

    def _drop(self, pid: str, why: str) -> None:
        self.dropped.append((pid, why))
        if len(self.dropped) > 2 * self.history:
            del self.dropped[:-self.history]

    def pending_ids(self) -> list[str]:
        return list(self.pending_by_id)

    def winner(self, packet_id: str) -> str | None:
        return self.claimed.get(packet_id)

    def _take(self, ids: Sequence[str]) -> list[_Pending]:
        out = []
        for pid in ids:
            p = self.pending_by_id.pop(pid, None)
            if p is not None:
                self.pending_digests.discard(p.meta.digest or "")
                out.append(p)
            self.steer.discard(pid)
        return out

    def apply(self, op: dict[str, Any], offset: int = -1,
              visible_digests: frozenset[str] = frozenset()) -> PendingState:
        """Fold one decoded op. `visible_digests`: packet digests already in the host's context."""
        return self.apply_meta(meta_of(op), op.get("packet") or {}, offset, visible_digests)

    def apply_meta(self, m: OpMeta, packet: PacketSource | None, offset: int = -1,
                   visible_digests: frozenset[str] = frozenset()) -> PendingState:
        """Fold one op given its metadata; `packet` is only kept (or loaded) if it stays pending.

        A rebuild calls this once per record, so the hot path binds locals and avoids calls.
        """
        op_id, kind, _sid, pid, dig, _expiry, ids = m
        applied = self.applied
        if op_id in applied:
            return self
        applied[op_id] = None
        if len(applied) > 2 * self.history:
            _trim(applied, self.history)
        if offset > self.last_offset:
            self.last_offset = offset
        if kind == "claim":
            pending, steer = self.pending_by_id, self.steer
            for i in ids:
                p = pending.pop(i, None)
                if p is not None:
                    d = p.meta[4] or ""
                    self.pending_digests.discard(d)
                    self.claimed[i] = op_id
                    self.claimed_digests[d] = None
                if steer:
                    steer.discard(i)
            if len(self.claimed) > 2 * self.history:
                _trim(self.claimed, self.history)
                _trim(self.claimed_digests, self.history)
        elif kind == "inject" or kind == "steer":
            if pid is None:
                return self
            dig = dig or ""
            if pid in self.claimed or dig in self.claimed_digests:
                self._drop(pid, "already-claimed")
            elif dig in visible_digests:
                self._drop(pid, "already-visible")
            elif pid in self.pending_by_id or dig in self.pending_digests:
                self._drop(pid, "duplicate-pending")
            else:
                self.pending_by_id[pid] = _Pending(m, packet if packet is not None else {})
                self.pending_digests.add(dig)
                if kind == "steer":
                    self.steer.add(pid)
        elif kind == "remove" or kind == "expire":
            self._take(ids)
            for i in sorted(ids):
                self._drop(i, kind)
        return self

    def snapshot(self, raw_of: Callable[[_Pending], bytes | None]) -> dict[str, Any] | None:
        """This fold as one checkpoint entry (the InboxCheckpointSession record, without the
        session id); None if a pending packet has no original op bytes to keep."""
        pending = []
        for pid, e in self.pending_by_id.items():
            raw = raw_of(e)
            if raw is None:
                return None
            m = e.meta
            pending.append({"opId": m.op_id, "kind": m.kind, "packetId": pid, "digest": m.digest,
                            "expiry": m.expiry, "packetIds": list(m.packet_ids),
                            "opBytes": raw})
        return {"lastOffset": self.last_offset, "pending": pending, "steer": sorted(self.steer),
                "claimedIds": list(self.claimed), "claimOps": list(self.claimed.values()),
                "claimedDigests": list(self.claimed_digests), "applied": list(self.applied),
                "droppedIds": [d[0] for d in self.dropped],
                "droppedWhy": [d[1] for d in self.dropped]}

    @classmethod
    def from_snapshot(cls, session_id: str, snap: dict[str, Any],
                      load: Callable[[bytes], PacketSource], history: int = HISTORY,
                      ) -> PendingState:
        """The exact fold that `snapshot` saw: folding on from here equals folding from zero."""
        st = cls(history=history, last_offset=snap["lastOffset"])
        for e in snap["pending"]:
            m = OpMeta(e["opId"], e["kind"], session_id, e["packetId"], e["digest"],
                       e["expiry"], tuple(e["packetIds"]))
            st.pending_by_id[e["packetId"]] = _Pending(m, load(e["opBytes"]))
            st.pending_digests.add(e["digest"] or "")
        st.steer = set(snap["steer"])
        st.claimed = dict(zip(snap["claimedIds"], snap["claimOps"], strict=True))
        st.claimed_digests = dict.fromkeys(snap["claimedDigests"])
        st.applied = dict.fromkeys(snap["applied"])
        st.dropped = list(zip(snap["droppedIds"], snap["droppedWhy"], strict=True))
        return st


def apply(state: PendingState, op: dict[str, Any], offset: int = -1,
          visible_digests: frozenset[str] = frozenset()) -> PendingState:
    return state.apply(op, offset, visible_digests)


def fold(ops: list[tuple[int, dict[str, Any]]]) -> PendingState:
    state = PendingState()
    for offset, op in ops:
        state.apply(op, offset)
    return state


def split_expired(state: PendingState, now_ms: int) -> tuple[list[Packet], list[Packet]]:
    """(live, expired) pending packets at event time `now_ms`; expired are never delivered."""
    entries = list(state.pending_by_id.values())
    live = state._packets(e for e in entries if e.meta.expiry > now_ms)
    dead = state._packets(e for e in entries if e.meta.expiry <= now_ms)
    return live, dead


def claim_pages(packet_ids: Sequence[str], page: int = CLAIM_PAGE) -> list[list[str]]:
    """FIFO pages of packet ids, one claim op each: every op is atomic on its own."""
    return [list(packet_ids[i:i + page]) for i in range(0, len(packet_ids), page)]


def expire_op(session_id: str, packet_ids: Sequence[str], now_ms: int) -> dict[str, Any]:
    """The op that retires packets past their expiry; its id follows from them (idempotent)."""
    return {"opId": stable_id("op", "expire", session_id, *packet_ids), "op": "expire",
            "sessionId": session_id, "eventTime": now_ms, "packet": None,
            "packetIds": list(packet_ids), "claimer": None, "reason": "expired",
            "authorisedBy": None}


def claim_op(op_id: str, session_id: str, packet_ids: Sequence[str], now_ms: int,
             claimer: str) -> dict[str, Any]:
    """One page of a claim: the fold gives each packet to the first claim op that names it."""
    return {"opId": op_id, "op": "claim", "sessionId": session_id, "eventTime": now_ms,
            "packet": None, "packetIds": list(packet_ids), "claimer": claimer, "reason": None,
            "authorisedBy": None}
