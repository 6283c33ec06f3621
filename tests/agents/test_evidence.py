"""G-01 evidence updater: which tool outcomes credit which delivered memories."""

from __future__ import annotations

import json
from typing import Any

from mnemoflow.agents.evidence import REUSE_WINDOW_MS, EvidenceState, update
from mnemoflow.agents.observer import ObserverState, observe
from mnemoflow.schemas.codec import default_registry

from factories import T0, feedback_event, tool_event, user_event


class Session:
    """Observer then evidence updater, one session, as the worker will chain them."""

    def __init__(self, sid: str = "s1") -> None:
        self.sid, self.seq = sid, 0
        self.obs, self.ev = ObserverState(), EvidenceState()

    def _feed(self, source: str, rec: dict[str, Any]) -> list[dict[str, Any]]:
        self.obs, o = observe(self.obs, source, rec)
        assert o.segment is not None
        self.last_segment = o.segment
        self.ev, out = update(self.ev, o.segment)
        return out

    def _next(self) -> int:
        self.seq += 1
        return self.seq

    turn = 1

    def deliver(self, t: int, *mids: str, packet: str = "pkt:1") -> list[dict[str, Any]]:
        return self._feed("session-events", feedback_event(self.sid, self._next(),
                                                           "packet_delivered", packet, t,
                                                           memory_ids=mids, turn=self.turn))

    def tool(self, t: int, status: str = "ok", root: str | None = None,
             refs: tuple[str, ...] = ()) -> list[dict[str, Any]]:
        return self._feed("tool-results", tool_event(
            self.sid, self._next(), status, t, root=root, memoryRefs=list(refs),
            error=None if status == "ok" else "boom", turn=self.turn))

    def say(self, t: int, text: str) -> list[dict[str, Any]]:
        self.turn += 1
        return self._feed("session-events", user_event(self.sid, self._next(), text, t,
                                                       turn=self.turn))


def _ops(events: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return sorted((e["op"], e["memoryId"]) for e in events)


def test_success_after_delivery_reinforces_and_failure_weakens() -> None:
    s = Session()
    assert s.deliver(T0, "fact:a", "seg:b") == []
    assert _ops(s.tool(T0 + 1000)) == [("evidence_reinforce", "fact:a"),
                                       ("evidence_reinforce", "seg:b")]
    s.say(T0 + 1500, "and now the other thing")  # a new turn: a fresh request
    s.deliver(T0 + 2000, "fact:c", packet="pkt:2")
    assert _ops(s.tool(T0 + 3000, "error", root="r2")) == [("evidence_weaken", "fact:c")]


def test_a_later_turn_is_no_evidence_about_an_earlier_delivery() -> None:
    s = Session()
    s.deliver(T0, "fact:a")
    s.say(T0 + 500, "unrelated question")
    assert s.tool(T0 + 1000) == []


def test_a_delivery_is_credited_once_per_root_call() -> None:
    s = Session()
    s.deliver(T0, "fact:a")
    assert _ops(s.tool(T0 + 1000, root="r1")) == [("evidence_reinforce", "fact:a")]
    assert s.tool(T0 + 2000, root="r1") == []  # the same plan's next call: already credited
    assert _ops(s.tool(T0 + 3000, "error", root="r2")) == [("evidence_weaken", "fact:a")]


def test_retry_and_cancel_conclude_nothing() -> None:
    s = Session()
    s.deliver(T0, "fact:a")
    assert s.tool(T0 + 1000, "retry", root="r1") == []
    assert s.tool(T0 + 1500, "cancel", root="r1") == []
    assert _ops(s.tool(T0 + 2000, "ok", root="r1")) == [("evidence_reinforce", "fact:a")]


def test_deliveries_outside_the_window_are_not_reuse() -> None:
    s = Session()
    s.deliver(T0, "fact:old")
    assert s.tool(T0 + REUSE_WINDOW_MS + 1) == []
    assert s.ev.deliveries == ()  # pruned by event time, not kept forever


def test_host_memory_refs_count_without_a_delivery() -> None:
    s = Session()
    out = s.tool(T0, refs=("proc:x",))
    assert _ops(out) == [("evidence_reinforce", "proc:x")]
    assert out[0]["attributes"]["via"] == "memoryRefs"


def test_late_delivery_gives_the_same_events_as_in_order() -> None:
    in_order = Session()
    in_order.deliver(T0, "fact:a")
    expected = in_order.tool(T0 + 1000, root="r1")
    late = Session()
    late.seq = 1  # the tool result carries seq 2 in both runs: same segment id
    assert late.tool(T0 + 1000, root="r1") == []
    late.seq = 0
    got = late.deliver(T0, "fact:a")
    assert [e["eventId"] for e in got] == [e["eventId"] for e in expected]
    assert got == expected


def test_correction_feedback_and_correcting_words_dispute_what_was_delivered() -> None:
    s = Session()
    s.say(T0, "What is the staging host?")
    s.deliver(T0 + 100, "fact:host")
    out = s.say(T0 + 200, "No, that's outdated, we moved it last week.")
    assert _ops(out) == [("fact_conflicted", "fact:host")]
    assert out[0]["source"] == "user" and out[0]["text"].startswith("No, that's outdated")
    assert s.tool(T0 + 300) == []  # a disputed memory earns no credit afterwards
    s.deliver(T0 + 400, "fact:x", "fact:y", packet="pkt:9")
    fb = s._feed("session-events", feedback_event("s1", s._next(), "correction", "pkt:9",
                                                  T0 + 500))
    assert _ops(fb) == [("fact_conflicted", "fact:x"), ("fact_conflicted", "fact:y")]


def test_ordinary_no_is_not_a_correction() -> None:
    s = Session()
    s.deliver(T0, "fact:a")
    assert s.say(T0 + 100, "No, I want the blue one.") == []


def test_redelivered_segment_re_emits_the_same_events() -> None:
    s = Session()
    s.deliver(T0, "fact:a")
    first = s.tool(T0 + 1000)
    seg = s.last_segment
    state, again = update(s.ev, seg)
    assert again == first and state == s.ev


def test_a_redelivered_correction_gives_its_text_back_which_the_state_does_not_hold() -> None:
    """A dispute copies the user's whole message once per disputed memory; kept in the
    state that made a 200 kB correction after a packet of 6 memories a 1.2 MB record."""
    s = Session()
    s.deliver(T0, *(f"fact:{i}" for i in range(6)))
    long = "No, that's wrong. " + "The staging host moved to the new cluster. " * 4000
    first = s.say(T0 + 100, long)
    assert len(first) == 6 and all(e["text"] == long.strip() for e in first)
    assert len(json.dumps(s.ev.to_json())) < 20_000
    state, again = update(s.ev, s.last_segment)
    assert again == first and state == s.ev


def test_state_survives_json_and_sessions_stay_apart() -> None:
    a, b = Session("A"), Session("B")
    a.deliver(T0, "fact:secret")
    assert EvidenceState.from_json(a.ev.to_json()) == a.ev
    assert b.tool(T0 + 1000) == []  # B never sees A's deliveries


def test_events_carry_every_schema_field() -> None:
    s = Session()
    s.deliver(T0, "fact:a")
    reg = default_registry()
    events = s.tool(T0 + 1000) + s.say(T0 + 2000, "that's wrong")
    s.deliver(T0 + 3000, "fact:b", packet="pkt:2")
    events += s.say(T0 + 4000, "That is not right")
    assert [e["op"] for e in events] == ["evidence_reinforce", "fact_conflicted", "fact_conflicted"]
    for ev in events:
        assert reg.decode(reg.encode("io.mnemoflow.MemoryEvent", ev))[1] == ev
