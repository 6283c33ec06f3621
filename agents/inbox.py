"""N-03 inbox fold: a session's pending packets are the fold of its inbox operations.

Deterministic and idempotent (each op is applied once, by opId), so the pending set can be
rebuilt from the log after any restart, cancel or resume. The log order is the arbiter
between claimers: a packet belongs to the first claim op that names it. The fold mutates
in place (O(1) per op) because a rebuild folds the whole log.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class PendingState:
    pending_by_id: dict[str, dict[str, Any]] = field(default_factory=dict)  # FIFO (insertion)
    steer: set[str] = field(default_factory=set)  # packet ids that should wake the host
    claimed: dict[str, str] = field(default_factory=dict)  # packetId -> claim opId
    claimed_digests: set[str] = field(default_factory=set)
    pending_digests: set[str] = field(default_factory=set)
    applied: set[str] = field(default_factory=set)
    dropped: list[tuple[str, str]] = field(default_factory=list)  # (packetId, why)
    last_offset: int = -1

    @property
    def pending(self) -> tuple[dict[str, Any], ...]:
        return tuple(self.pending_by_id.values())

    def pending_ids(self) -> list[str]:
        return list(self.pending_by_id)

    def winner(self, packet_id: str) -> str | None:
        return self.claimed.get(packet_id)

    def _take(self, ids: set[str]) -> list[dict[str, Any]]:
        out = []
        for pid in ids:
            p = self.pending_by_id.pop(pid, None)
            if p is not None:
                self.pending_digests.discard(p["exactDigest"])
                out.append(p)
            self.steer.discard(pid)
        return out

    def apply(self, op: dict[str, Any], offset: int = -1,
              visible_digests: frozenset[str] = frozenset()) -> PendingState:
        """Fold one op. `visible_digests`: packet digests already in the host's context."""
        if op["opId"] in self.applied:
            return self
        self.applied.add(op["opId"])
        self.last_offset = max(self.last_offset, offset)
        kind = op["op"]
        if kind in ("inject", "steer"):
            p = op["packet"]
            if p is None:
                return self
            pid, dig = p["packetId"], p["exactDigest"]
            if pid in self.claimed or dig in self.claimed_digests:
                self.dropped.append((pid, "already-claimed"))
            elif dig in visible_digests:
                self.dropped.append((pid, "already-visible"))
            elif pid in self.pending_by_id or dig in self.pending_digests:
                self.dropped.append((pid, "duplicate-pending"))
            else:
                self.pending_by_id[pid] = p
                self.pending_digests.add(dig)
                if kind == "steer":
                    self.steer.add(pid)
            return self
        ids = set(op.get("packetIds") or ())
        if kind == "claim":
            for p in self._take(ids):
                self.claimed[p["packetId"]] = op["opId"]
                self.claimed_digests.add(p["exactDigest"])
        elif kind in ("remove", "expire"):
            self._take(ids)
            self.dropped += [(i, kind) for i in sorted(ids)]
        return self


def apply(state: PendingState, op: dict[str, Any], offset: int = -1,
          visible_digests: frozenset[str] = frozenset()) -> PendingState:
    return state.apply(op, offset, visible_digests)


def fold(ops: list[tuple[int, dict[str, Any]]]) -> PendingState:
    state = PendingState()
    for offset, op in ops:
        state.apply(op, offset)
    return state


def split_expired(state: PendingState, now_ms: int) -> tuple[list[dict], list[dict]]:
    """(live, expired) pending packets at event time `now_ms`; expired are never delivered."""
    live = [p for p in state.pending_by_id.values() if p["expiry"] > now_ms]
    dead = [p for p in state.pending_by_id.values() if p["expiry"] <= now_ms]
    return live, dead
