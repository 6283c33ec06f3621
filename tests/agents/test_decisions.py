"""The decision fold: which audit records decide a host's events, and how."""

from __future__ import annotations

from mnemoflow.agents.decisions import (
    KEEP,
    NONE,
    PACKET,
    SUPPRESS,
    SessionAudits,
    decide,
    undecided,
)


def _gate(seq: int, action: str = "suppress", request: str | None = None) -> dict:
    return {"stage": "gate", "eventSeq": seq, "action": action, "reason": "r",
            "requestId": request, "packetId": None}


def _broker(request: str, action: str = "inject", packet: str | None = "pkt-1") -> dict:
    return {"stage": "broker", "eventSeq": 0, "action": action, "reason": "r",
            "requestId": request, "packetId": packet if action == "inject" else None}


def _fold(*records: dict) -> SessionAudits:
    a = SessionAudits()
    for r in records:
        a.add(r)
    return a


def test_suppress_is_decided_by_the_gate_alone() -> None:
    d = decide(_fold(_gate(3)), [3])
    assert d is not None and d.outcome == SUPPRESS and d.event_seq == 3 and d.packet_id is None


def test_a_fired_event_waits_for_the_broker() -> None:
    audits = _fold(_gate(4, "retrieve", "req-4"))
    assert decide(audits, [4]) is None
    assert undecided(audits, [4]) == (4,)
    audits.add(_broker("req-4"))
    d = decide(audits, [4])
    assert d is not None and d.outcome == PACKET and d.packet_ids == ("pkt-1",)
    assert undecided(audits, [4]) == ()


def test_a_broker_without_a_packet_is_none() -> None:
    for action in ("suppress", "drop", "block", "shadow"):
        d = decide(_fold(_gate(5, "prefetch", "req-5"), _broker("req-5", action)), [5])
        assert d is not None and d.outcome == NONE and d.broker is not None


def test_every_asked_event_must_be_decided() -> None:
    audits = _fold(_gate(1, "retrieve", "req-1"), _gate(2))
    assert decide(audits, [1, 2]) is None
    assert undecided(audits, [1, 2, 3]) == (1, 3)
    audits.add(_broker("req-1"))
    d = decide(audits, [2, 1])
    assert d is not None and d.outcome == PACKET and d.event_seq == 2
    assert d.gate is not None and d.gate["eventSeq"] == 2


def test_records_of_other_stages_are_ignored_and_the_fold_is_bounded() -> None:
    audits = SessionAudits()
    assert not audits.add({"stage": "recall", "eventSeq": 1, "action": "x"})
    for seq in range(KEEP + 10):
        audits.add(_gate(seq))
    assert len(audits.gates) == KEEP and 0 not in audits.gates and KEEP + 9 in audits.gates


def test_nothing_asked_is_a_suppress() -> None:
    d = decide(SessionAudits(), [])
    assert d is not None and d.outcome == SUPPRESS
