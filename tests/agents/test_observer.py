from __future__ import annotations

import json

import pytest

from mnemoflow.agents.observer import EXTRACT_CHARS, ObserverState, observe

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


# ------------------------------------------------------------------ what the observer takes

def _sentences(n_chars: int, seed: str = "") -> str:
    """Plain lowercase prose of at least n_chars characters: no entities, no facts."""
    out, i = [], 0
    while sum(len(s) for s in out) < n_chars:
        out.append(f"the deploy log{seed} line {i} says nothing new happened here. ")
        i += 1
    return "".join(out)


def test_oversized_text_is_dead_lettered_never_cut() -> None:
    for size in (300_000, 600_000):
        _, obs = observe(ObserverState(), "session-events", user_event("s1", 1, "x" * size))
        assert obs.dead_letter is not None and obs.dead_letter[0] == "oversized"
        assert str(size) in obs.dead_letter[1] and "text" in obs.dead_letter[1]
        assert obs.segment is None and obs.memory_events == ()
    for field in ("output", "error"):
        ev = tool_event("s1", 2, "ok" if field == "output" else "error", **{field: "y" * 400_000})
        _, obs = observe(ObserverState(), "tool-results", ev)
        assert obs.dead_letter is not None and obs.dead_letter[0] == "oversized"
        assert field in obs.dead_letter[1]


def test_text_within_the_limit_is_carried_whole() -> None:
    text = _sentences(200_000)
    st, obs = observe(ObserverState(), "session-events", user_event("s1", 1, text))
    assert obs.dead_letter is None and obs.segment["text"] == text.strip()
    assert obs.memory_events[0]["text"] == text.strip()
    out = _sentences(150_000, "x")
    _, obs = observe(ObserverState(), "tool-results", tool_event("s1", 2, "ok", output=out))
    assert obs.segment["text"] == f"deploy ok: {out.strip()}"
    assert obs.memory_events[0]["text"] == obs.segment["text"]


def test_working_memory_state_stays_small_with_long_entities() -> None:
    """Each ring entry keeps bounded entities, so the observer-state changelog record stays
    far under Kafka's 1 MB however long the texts' URLs and names are."""
    from mnemoflow.agents.working_memory import ENTITY_MAX_BYTES, ring_entity

    st = ObserverState()
    for i in range(40):
        urls = " ".join(f"https://example.com/{i}/{j}/" + "a" * 4000 for j in range(16))
        st, obs = observe(st, "session-events", user_event("s1", i + 1, f"See {urls}", T0 + i))
        assert len(obs.segment["entities"]) == 16 and len(obs.segment["entities"][0]) > 4000
    assert len(st.ring.entries) == 32
    assert all(len(e.encode()) <= ENTITY_MAX_BYTES for r in st.ring.entries for e in r.entities)
    assert len(json.dumps(st.to_json())) < 64_000
    last = st.ring.entries[-1]
    assert last.entities == tuple(ring_entity(e) for e in obs.segment["entities"])
    assert len(set(last.entities)) == 16  # the stand-ins of distinct entities stay distinct


@pytest.mark.parametrize("t", [2**63 - 1, -2**63, -1, 253_402_300_800_000])
def test_event_time_out_of_range_is_dead_lettered_as_invalid(t: int) -> None:
    for source, ev in (("session-events", user_event("s1", 1, "hello", t)),
                       ("tool-results", tool_event("s1", 2, "ok", t)),
                       ("agent-steps", {**user_event("s1", 3, "done", t), "phase": "end"})):
        st, obs = observe(ObserverState(), source, ev)
        assert obs.dead_letter is not None and obs.dead_letter[0] == "invalid"
        assert obs.dead_letter[1].startswith("eventTime")
        assert obs.segment is None and st == ObserverState()


@pytest.mark.parametrize("t", [0, T0, 253_402_300_799_999])
def test_event_times_in_range_are_taken(t: int) -> None:
    _, obs = observe(ObserverState(), "session-events", user_event("s1", 1, "hello", t))
    assert obs.dead_letter is None and obs.segment["eventTime"] == t


CAP = {"provider": "acme", "model": "m1"}


@pytest.mark.parametrize(("source", "ev", "field"), [
    ("session-events", user_event("", 1, "hi"), "sessionId"),
    ("session-events", user_event("s1", 1, "hi", user=""), "userId"),
    ("session-events", user_event("s1", 1, "hi", user="u" * 256), "userId"),
    ("session-events", user_event("s\x001", 1, "hi"), "sessionId"),
    ("session-events", user_event("s1", 1, "hi", user="alice\nbob"), "userId"),
    ("session-events", user_event("s1", 1, "hi", agentId="a" * 600_000), "agentId"),
    ("session-events", user_event("s1", 1, "hi", workspaceId="\x7f"), "workspaceId"),
    ("session-events", user_event("s1", 1, "hi", provenance="p" * 300), "provenance"),
    ("session-events", user_event("s1", 1, None, type="feedback", feedbackKind="packet_ignored",
                                  feedbackRef="r" * 500_000), "feedbackRef"),
    ("session-events", user_event("s1", 1, None, type="lifecycle", lifecycle="start",
                                  capability={**CAP, "model": "m" * 1000}), "capability.model"),
    ("session-events", user_event("s1", 1, None, type="feedback", feedbackKind="correction",
                                  attributes={"memoryIds": ",".join(f"m{i}" for i in range(65))}),
     "attributes.memoryIds"),
    ("tool-results", tool_event("s1", 2, "ok", toolName="t" * 600), "toolName"),
    ("tool-results", tool_event("s1", 2, "ok", callId="c\x00"), "callId"),
    ("tool-results", tool_event("s1", 2, "ok", memoryRefs=[f"fact:{i}" for i in range(65)]),
     "memoryRefs"),
    ("tool-results", tool_event("s1", 2, "ok", memoryRefs=["fact:a", "f" * 300]),
     "memoryRefs[1]"),
])
def test_hostile_identifiers_are_dead_lettered_as_invalid(source: str, ev: dict, field: str) -> None:
    st, obs = observe(ObserverState(), source, ev)
    assert obs.dead_letter is not None and obs.dead_letter[0] == "invalid"
    assert obs.dead_letter[1].startswith(f"{field} ")
    assert len(obs.dead_letter[1]) < 200  # names the field, never echoes the value
    assert obs.segment is None and st == ObserverState()


def test_odd_but_harmless_numbers_are_taken() -> None:
    """Sequence, turn and step numbers are only copied and hashed: any long/int is fine."""
    for ev in (user_event("s1", -5, "What about Atlas?"),
               user_event("s1", 2**63 - 1, "What about Atlas?", turn=2**31 - 1, step=-2**31),
               tool_event("s1", 3, "error", error="boom", attempt=-3)):
        source = "tool-results" if "toolName" in ev else "session-events"
        _, obs = observe(ObserverState(), source, ev)
        assert obs.dead_letter is None and obs.segment is not None


def test_facts_come_from_whole_sentences_of_a_long_text() -> None:
    """The extractors read a bounded head of a long text, cut at a sentence end: a fact
    straddling the bound is not proposed from half its sentence."""
    head = "My favourite city is Lisbon. "
    text = head + ("word " * EXTRACT_CHARS)[:EXTRACT_CHARS - len(head) - 15] + ". "
    text += "My dog is Rex the good boy. " + _sentences(10_000, "z")
    assert text.index("Rex") < EXTRACT_CHARS < text.index("good boy")
    _, obs = observe(ObserverState(), "session-events", user_event("s1", 1, text))
    facts = {(m["subject"], m["object"]) for m in obs.memory_events if m["op"] == "fact_proposed"}
    assert ("favourite city", "Lisbon") in facts
    assert not any(subject == "dog" for subject, _ in facts)
    assert obs.memory_events[0]["text"] == text.strip()


def test_a_long_run_without_spaces_is_observed_quickly() -> None:
    """Some extractor patterns backtrack quadratically on long runs of word characters; the
    observer must not hand them a whole 250 kB text."""
    import time

    t0 = time.perf_counter()
    _, obs = observe(ObserverState(), "session-events", user_event("s1", 1, "1" * 250_000))
    assert obs.segment is not None and len(obs.segment["text"]) == 250_000
    assert time.perf_counter() - t0 < 20


def test_text_whose_entities_expand_past_the_limit_is_dead_lettered() -> None:
    """Entities are NFKC-normalised: U+3316 (one character, 3 bytes) becomes six katakana
    (18 bytes), so a 240 kB URL would give a 1.4 MB entity and a segment Kafka refuses."""
    text = "http://x/" + "\u3316" * 80_000
    assert len(text.encode()) < 262_144
    _, obs = observe(ObserverState(), "session-events", user_event("s1", 1, text))
    assert obs.dead_letter is not None and obs.dead_letter[0] == "oversized"
    assert "entities" in obs.dead_letter[1] and obs.segment is None
