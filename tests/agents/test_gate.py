from __future__ import annotations

import json

import pytest

from mnemoflow.agents.gate import DONE_CAP, GateState, decide
from mnemoflow.agents.observer import ObserverState, observe
from mnemoflow.agents.tuning import load_tuning

from factories import T0, user_event

TUNING = load_tuning().gate


def _segments(texts: list[str], sid: str = "s1", step_ms: int = 1000) -> list[dict]:
    st, out = ObserverState(), []
    for i, text in enumerate(texts, start=1):
        st, obs = observe(st, "session-events", user_event(sid, i, text, T0 + i * step_ms))
        out.append(obs.segment)
    return out


def _run(segs: list[dict], state: GateState | None = None) -> tuple[GateState, list]:
    state = state or GateState.from_json(None, TUNING)
    outs = []
    for seg in segs:
        state, out = decide(state, seg, TUNING)
        outs.append(out)
    return state, outs


def test_question_with_cue_retrieves_with_reason_and_audit() -> None:
    _, outs = _run(_segments(["Where did I say we would meet Caroline last week?"]))
    d = outs[0].decision
    assert d.action == "retrieve" and d.reason == "above-threshold"
    assert outs[0].request["requestId"].startswith("req:")
    assert outs[0].request["timeWindow"] is not None
    assert outs[0].audit["stage"] == "gate" and outs[0].audit["signals"]["question"] == 1.0


def test_small_talk_is_suppressed_below_threshold() -> None:
    _, outs = _run(_segments(["ok", "ok thanks"]))
    assert outs[-1].decision.action == "suppress"
    assert outs[-1].request is None and outs[-1].audit["action"] == "suppress"


def test_cooldown_suppresses_the_same_topic_again() -> None:
    segs = _segments(["What did Melanie paint last time?", "What did Melanie paint last time, again?"])
    _, outs = _run(segs)
    assert outs[0].decision.action == "retrieve"
    assert outs[1].decision.reason == "cooldown"


def test_cooldown_ends_in_event_time() -> None:
    segs = _segments(["What did Melanie paint last time?", "What did Melanie paint last time, again?"],
                     step_ms=TUNING.cooldown_ms + 1)
    _, outs = _run(segs)
    assert outs[1].decision.action != "suppress"


def test_user_ignored_digest_is_suppressed() -> None:
    segs = _segments(["What was the Atlas deploy command?"])
    state = GateState.from_json(None, TUNING)
    from dataclasses import replace

    state = replace(state, ignored=(segs[0]["digest"],))
    _, outs = _run(segs, state)
    assert outs[0].decision.reason == "user-ignored"


def test_redelivered_segment_reemits_the_same_outputs() -> None:
    segs = _segments(["What did I tell you about Atlas?", "and Melanie?"])
    state, outs = _run(segs)
    state2, out = decide(state, segs[0], TUNING)
    assert out.replayed and state2 == state
    assert out.request == outs[0].request and out.audit == outs[0].audit


def test_capability_comes_from_lifecycle_segment() -> None:
    st, obs = observe(ObserverState(), "session-events", user_event(
        "s1", 1, None, type="lifecycle", lifecycle="start",
        capability={"model": "gpt-x", "supportsPreStep": True}))
    state, out = decide(GateState.from_json(None, TUNING), obs.segment, TUNING)
    assert out.decision.action == "suppress" and out.decision.reason == "lifecycle"
    assert state.capability["supportsPreStep"] is True


# ------------------------------------------------------------------ hostile segments

def _segment(text: str, seq: int, t: int = T0, **kw: object) -> dict:
    """A segment as the observer emits it for `text` (whole, however long), as the
    session's `seq`-th."""
    seg = observe(ObserverState(), "session-events", user_event("s1", seq, text, t, **kw),
                  max_payload_bytes=10**9)[1].segment
    return {**seg, "contextVersion": seq}


@pytest.mark.parametrize("t", [2**63 - 1, -2**63, -62_135_596_800_000, 253_402_300_799_999])
def test_gate_never_raises_on_an_event_time(t: int) -> None:
    """Segments already in the topic (or from another producer) may carry any long."""
    seg = {**_segments(["What did we do last week, yesterday, in December and 3 years ago?"])[0],
           "eventTime": t}
    state, out = decide(GateState.from_json(None, TUNING), seg, TUNING)
    assert out.decision is not None and out.audit["eventTime"] == t
    json.dumps(state.to_json())


def test_gate_state_stays_small_when_texts_are_long() -> None:
    """The gate keeps its last requests for redelivery; they must not carry the text (up to
    the payload limit each) into the gate-state changelog record (Kafka's limit is 1 MB)."""
    state = GateState.from_json(None, TUNING)
    segs, outs = [], []
    for i in range(DONE_CAP + 1):
        seg = _segment(f"What did we decide about Project{i}? " + "more words " * 3_000, i + 1,
                       T0 + i * (TUNING.cooldown_ms + 1))
        state, out = decide(state, seg, TUNING)
        assert out.request is not None and out.request["text"] == seg["text"]
        segs.append(seg)
        outs.append(out)
    assert len(segs[-1]["text"]) > 30_000
    assert len(json.dumps(state.to_json())) < 64_000
    state = GateState.from_json(json.loads(json.dumps(state.to_json())), TUNING)
    again_state, again = decide(state, segs[-1], TUNING)
    assert again.replayed and again_state == state
    assert again.request == outs[-1].request and again.audit == outs[-1].audit


def test_long_entities_are_bounded_in_the_window_and_history() -> None:
    from mnemoflow.agents.working_memory import ENTITY_MAX_BYTES

    url = "https://example.com/" + "a" * 5000
    segs = [_segment(f"Have a look at {url} please", 1, T0),
            _segment(f"Did you open {url} yet?", 2, T0 + 1000)]
    state, outs = _run(segs)
    assert all(len(e.encode()) <= ENTITY_MAX_BYTES for r in state.window.entries for e in r.entities)
    assert all(len(e.encode()) <= ENTITY_MAX_BYTES for e, _ in state.history)
    assert outs[1].decision.signals["unresolved"] == 0.0  # the URL is known from the first


def test_only_digests_are_kept_as_ignored() -> None:
    digest_ref = "ab" * 32
    state = GateState.from_json(None, TUNING)
    for i, ref in enumerate(["pkt:0123456789abcdef01234567", "r" * 200, digest_ref], start=1):
        seg = _segment(None, i, T0 + i, type="feedback", feedbackKind="packet_ignored",  # type: ignore[arg-type]
                       feedbackRef=ref)
        state, _ = decide(state, seg, TUNING)
    assert state.ignored == (digest_ref,)


def test_cooldowns_are_capped() -> None:
    from mnemoflow.agents.gate import COOLDOWN_CAP

    state = GateState.from_json(None, TUNING)
    fired = 0
    for i in range(COOLDOWN_CAP + 50):  # distinct topics, all within one cooldown
        seg = _segment(f"What did Zorblax{i} Quintar{i} say about Vexil{i} last time?", i + 1,
                       T0 + i)
        state, out = decide(state, seg, TUNING)
        fired += out.request is not None
    assert fired > COOLDOWN_CAP
    assert len(state.cooldown) == COOLDOWN_CAP
    assert len(json.dumps(state.to_json())) < 64_000
