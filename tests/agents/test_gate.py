from __future__ import annotations

from mnemoflow.agents.gate import GateState, decide
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
