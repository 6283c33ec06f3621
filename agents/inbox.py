"""N-03 inbox fold: a session's pending packets are the fold of its inbox operations.

Pure and idempotent (ops are applied once by opId), so the pending set can be rebuilt from
the log after any restart, cancel or resume. The log order is the arbiter between claimers:
a packet belongs to the first claim op that names it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

CLAIMED_CAP = 4096


@dataclass(frozen=True)
class PendingState:
    pending: tuple[dict[str, Any], ...] = ()  # packets, FIFO by inject order
    steer: tuple[str, ...] = ()  # packet ids that should wake the host
    claimed: dict[str, str] = field(default_factory=dict)  # packetId -> claim opId
    claimed_digests: tuple[str, ...] = ()
    applied: frozenset[str] = frozenset()
    dropped: tuple[tuple[str, str], ...] = ()  # (packetId, why) for the audit trail
    last_offset: int = -1

    def pending_ids(self) -> list[str]:
        return [p["packetId"] for p in self.pending]

    def winner(self, packet_id: str) -> str | None:
        return self.claimed.get(packet_id)


def _without(pending: tuple[dict[str, Any], ...], ids: set[str]) -> tuple[dict[str, Any], ...]:
    return tuple(p for p in pending if p["packetId"] not in ids)


def apply(state: PendingState, op: dict[str, Any], offset: int = -1,
          visible_digests: frozenset[str] = frozenset()) -> PendingState:
    """Fold one op. `visible_digests`: packet digests already in the host's context."""
    if op["opId"] in state.applied:
        return state
    state = replace(state, applied=state.applied | {op["opId"]},
                    last_offset=max(state.last_offset, offset))
    kind = op["op"]
    if kind in ("inject", "steer"):
        p = op["packet"]
        if p is None:
            return state
        pid, dig = p["packetId"], p["exactDigest"]
        if pid in state.claimed or dig in state.claimed_digests:
            return replace(state, dropped=(*state.dropped, (pid, "already-claimed")))
        if dig in visible_digests:
            return replace(state, dropped=(*state.dropped, (pid, "already-visible")))
        if any(q["packetId"] == pid or q["exactDigest"] == dig for q in state.pending):
            return replace(state, dropped=(*state.dropped, (pid, "duplicate-pending")))
        steer = (*state.steer, pid) if kind == "steer" else state.steer
        return replace(state, pending=(*state.pending, p), steer=steer)
    ids = set(op.get("packetIds") or ())
    if kind == "claim":
        claimed = dict(state.claimed)
        digests = list(state.claimed_digests)
        for p in state.pending:
            if p["packetId"] in ids and p["packetId"] not in claimed:
                claimed[p["packetId"]] = op["opId"]
                digests.append(p["exactDigest"])
        return replace(state, pending=_without(state.pending, ids), claimed=claimed,
                       claimed_digests=tuple(digests[-CLAIMED_CAP:]),
                       steer=tuple(s for s in state.steer if s not in ids))
    if kind in ("remove", "expire"):
        return replace(state, pending=_without(state.pending, ids),
                       steer=tuple(s for s in state.steer if s not in ids),
                       dropped=(*state.dropped, *[(i, kind) for i in sorted(ids)]))
    return state


def fold(ops: list[tuple[int, dict[str, Any]]]) -> PendingState:
    state = PendingState()
    for offset, op in ops:
        state = apply(state, op, offset)
    return state


def split_expired(state: PendingState, now_ms: int) -> tuple[list[dict], list[dict]]:
    """(live, expired) pending packets at event time `now_ms`; expired are never delivered."""
    live = [p for p in state.pending if p["expiry"] > now_ms]
    dead = [p for p in state.pending if p["expiry"] <= now_ms]
    return live, dead
