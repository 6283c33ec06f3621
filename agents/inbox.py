"""N-03 inbox fold: a session's pending packets are the fold of its inbox operations.

Deterministic and idempotent (each op is applied once, by opId), so the pending set can be
rebuilt from the log after any restart, cancel or resume. The log order is the arbiter
between claimers: a packet belongs to the first claim op that names it. The fold mutates
in place (O(1) per op) because a rebuild folds the whole log.

The fold reads only an op's `OpMeta` (kind, ids, digest, expiry). Writers also put that
metadata in the record headers (`op_headers`), so a rebuild can fold a long log without
decoding every Avro body: a pending packet's body is decoded only when it is handed out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

Packet = dict[str, Any]
PacketSource = Packet | Callable[[], Packet]  # the packet, or a loader that decodes it

CLAIM_PAGE = 256  # packet ids per claim op: a claim record stays small however long the queue
HISTORY = 1024  # claimed ids/digests, applied op ids and drop reasons remembered per session

FOLD_HEADER = "mf-fold"  # kind, opId, sessionId, packetId, exactDigest, expiry, packetIds
_SEP = "\x1f"  # ASCII unit separator: never in our ids or hex digests


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


def op_headers(op: dict[str, Any]) -> list[tuple[str, bytes]]:
    """One record header that repeats the op's fold metadata (the Avro body stays the truth).

    One header, one separator-joined string: parsing it costs a fraction of a body decode.
    """
    m = meta_of(op)
    fields = (m.kind, m.op_id, m.session_id, m.packet_id or "", m.digest or "", str(m.expiry),
              *m.packet_ids)
    return [(FOLD_HEADER, _SEP.join(fields).encode())]


def meta_from_headers(headers: Sequence[tuple[str, bytes]] | None) -> OpMeta | None:
    """The op's metadata from its headers; None when they are missing (decode the body).

    Written for speed (a rebuild parses one per record): one decode, one split, and the
    tuple built without NamedTuple's keyword machinery.
    """
    if not headers:
        return None
    for key, value in headers:
        if key == FOLD_HEADER:
            try:
                f = value.decode().split(_SEP)
                return _new_meta(OpMeta, (f[1], f[0], f[2], f[3] or None, f[4] or None,
                                          int(f[5]), tuple(f[6:])))
            except (ValueError, UnicodeDecodeError, IndexError):
                return None
    return None


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
