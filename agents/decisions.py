"""What the pipeline decided for a host's events, read back from the audit (C-03, G-02).

The gate writes one audit record (stage "gate") for every event it sees, with the event's
`eventSeq`; when it fires (retrieve or prefetch) the record names a `requestId`, and the
broker later writes one audit record (stage "broker") for that request: action "inject" with
the `packetId` of the packet it put in the inbox, or another action when no packet comes.
This module folds those records per session and answers, for a set of events, whether the
pipeline has decided all of them and what came of it. It is pure: the Kafka reading is in
`mnemoflow.streams.decisions`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

SUPPRESS, PACKET, NONE, TIMEOUT = "suppress", "packet", "none", "timeout"
FIRED = ("retrieve", "prefetch")
KEEP = 256  # gate and broker records kept per session: the newest ones


@dataclass(frozen=True)
class Decision:
    """The outcome for a host's events.

    suppress: the gate fired for none of them, so no packet is coming;
    packet: the broker injected at least one packet (`packet_ids`), now in the inbox;
    none: the gate fired, and the broker decided without a packet (empty, dropped, blocked);
    timeout: some event had no decision within the bound (`undecided` names them), e.g. the
    pipeline is behind, or the event was dead-lettered and will never have one."""

    outcome: str
    event_seq: int
    gate: dict[str, Any] | None = None  # the gate's record for `event_seq`
    broker: dict[str, Any] | None = None  # the broker's record of a packet, or of a fired event
    packet_ids: tuple[str, ...] = ()
    undecided: tuple[int, ...] = ()
    waited_ms: float = 0.0

    @property
    def packet_id(self) -> str | None:
        return self.packet_ids[0] if self.packet_ids else None


@dataclass
class SessionAudits:
    """One session's gate records by eventSeq and broker records by requestId (bounded)."""

    gates: dict[int, dict[str, Any]] = field(default_factory=dict)
    brokers: dict[str, dict[str, Any]] = field(default_factory=dict)

    def add(self, audit: dict[str, Any]) -> bool:
        """Fold one audit record; True if it was a gate or broker record."""
        if audit["stage"] == "gate":
            self.gates[int(audit["eventSeq"])] = audit
            _trim(self.gates)
        elif audit["stage"] == "broker" and audit.get("requestId"):
            self.brokers[audit["requestId"]] = audit
            _trim(self.brokers)
        else:
            return False
        return True


def _trim(d: dict[Any, Any]) -> None:
    while len(d) > KEEP:
        d.pop(next(iter(d)))


def decide(audits: SessionAudits, seqs: Iterable[int]) -> Decision | None:
    """The outcome for the events `seqs` of one session, or None while one is undecided.

    Decided means: its gate record is there and, if the gate fired, so is the broker's
    record of its request. A redelivered gate record carries the same request id, so a
    replay decides the same way."""
    wanted = sorted(set(seqs))
    if not wanted:
        return Decision(SUPPRESS, 0)
    fired: list[dict[str, Any]] = []
    packets: list[dict[str, Any]] = []
    for seq in wanted:
        gate = audits.gates.get(seq)
        if gate is None:
            return None
        if gate["action"] in FIRED and gate.get("requestId"):
            broker = audits.brokers.get(gate["requestId"])
            if broker is None:
                return None
            fired.append(broker)
            if broker["action"] == "inject" and broker.get("packetId"):
                packets.append(broker)
    last = wanted[-1]
    gate = audits.gates[last]
    if packets:
        return Decision(PACKET, last, gate, packets[-1], tuple(b["packetId"] for b in packets))
    if fired:
        return Decision(NONE, last, gate, fired[-1])
    return Decision(SUPPRESS, last, gate)


def undecided(audits: SessionAudits, seqs: Iterable[int]) -> tuple[int, ...]:
    """The events of `seqs` that have no decision yet (for a timeout's report)."""
    out = []
    for seq in sorted(set(seqs)):
        gate = audits.gates.get(seq)
        if gate is None or (gate["action"] in FIRED and gate.get("requestId")
                            and gate["requestId"] not in audits.brokers):
            out.append(seq)
    return tuple(out)
