from __future__ import annotations

from mnemoflow.agents.observer import ObserverState, observe

from factories import T0, tool_event, user_event


def test_segment_has_envelope_with_digest_only() -> None:
    st, obs = observe(ObserverState(), "session-events", user_event("s1", 1, "Deploy Atlas now"))
    seg = obs.segment
    assert seg is not None and seg["contextVersion"] == 1
    env = seg["envelope"]
    assert env["schemaVersion"] == 1 and env["sourceKind"] == "user"
    assert len(env["payloadDigest"]) == 64 and "text" not in env
    assert seg["provenance"] == "s1#1.0"
    assert [m["op"] for m in obs.memory_events] == ["segment_recorded"]
    assert obs.memory_events[0]["owner"] == "u1" and obs.memory_events[0]["scope"] == "User"


def test_wrong_schema_version_is_dead_lettered() -> None:
    st, obs = observe(ObserverState(), "session-events", user_event("s1", 1, "x", schemaVersion=2))
    assert obs.dead_letter and obs.dead_letter[0] == "schema-version"
    assert obs.segment is None and st == ObserverState()


def test_oversized_is_dead_lettered() -> None:
    _, obs = observe(ObserverState(), "session-events", user_event("s1", 1, "x" * 100), 50)
    assert obs.dead_letter and obs.dead_letter[0] == "oversized"


def test_context_version_strictly_increases_and_redelivery_is_identical() -> None:
    st = ObserverState()
    versions = []
    first = None
    for i in range(1, 6):
        st, obs = observe(st, "session-events", user_event("s1", i, f"message {i}", T0 + i))
        versions.append(obs.segment["contextVersion"])
        first = first or obs.segment
    assert versions == sorted(set(versions))
    st2, again = observe(st, "session-events", user_event("s1", 1, "message 1", T0 + 1))
    assert again.redelivered and again.segment == first and st2 == st


def test_ring_evicts_with_reasons() -> None:
    st = ObserverState()
    for i in range(40):
        st, obs = observe(st, "session-events", user_event("s1", i + 1, f"note {i}", T0 + i))
    assert len(st.ring.entries) == 32
    assert obs.segment["evicted"] and obs.segment["evicted"][0].endswith(":capacity")
    st, obs = observe(st, "session-events", user_event("s1", 99, "late", T0 + 16 * 60_000))
    assert len(st.ring.entries) == 1
    assert all(e.endswith(":ttl") for e in obs.segment["evicted"])


def test_tool_results_give_stable_observations_for_every_status() -> None:
    outs = {}
    for i, status in enumerate(["ok", "error", "retry", "cancel"], start=1):
        ev = tool_event("s1", i, status, error="boom" if status != "ok" else None,
                        root="root-1", parent="c0")
        a = observe(ObserverState(), "tool-results", ev)[1].segment
        b = observe(ObserverState(), "tool-results", dict(ev))[1].segment
        assert a == b  # frozen: the same input always gives the same observation
        outs[status] = a
        assert a["envelope"]["rootCallId"] == "root-1" and a["envelope"]["callId"] == f"c{i}"
    assert outs["ok"]["ok"] is True and outs["error"]["ok"] is False
    assert outs["retry"]["ok"] is False and outs["cancel"]["ok"] is None
    _, obs = observe(ObserverState(), "tool-results", tool_event("s1", 9, "error", error="x"))
    ep = obs.memory_events[0]
    assert ep["op"] == "episode_recorded" and ep["attributes"]["status"] == "candidate"


def test_sessions_do_not_share_state() -> None:
    a, _ = observe(ObserverState(), "session-events", user_event("A", 1, "secret alpha"))
    b, obs = observe(ObserverState(), "session-events", user_event("B", 1, "hello"))
    assert obs.segment["contextVersion"] == 1
    assert all(e.segment_id not in {x.segment_id for x in a.ring.entries} for e in b.ring.entries)


def test_attributes_are_copied_through_for_the_evidence_updater() -> None:
    fb = user_event("s1", 1, None, type="feedback", feedbackKind="packet_delivered",
                    feedbackRef="pkt:1", attributes={"memoryIds": "fact:a,seg:b"})
    seg = observe(ObserverState(), "session-events", fb)[1].segment
    assert seg["kind"] == "feedback" and seg["attributes"] == {"memoryIds": "fact:a,seg:b"}
    tool = tool_event("s1", 2, "retry", error="boom", memoryRefs=["proc:x", "fact:y"])
    seg = observe(ObserverState(), "tool-results", tool)[1].segment
    assert seg["attributes"] == {"status": "retry", "memoryRefs": "proc:x,fact:y"}
    plain = observe(ObserverState(), "tool-results", tool_event("s1", 3, "ok"))[1].segment
    assert plain["attributes"] == {"status": "ok"}
