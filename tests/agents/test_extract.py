"""Rule-based extraction: facts name their segment; aliases (M-05) from the user's words."""

from __future__ import annotations

import json

import pytest

from mnemoflow.agents.extract import extract_aliases, extract_facts, extract_memories
from mnemoflow.agents.observer import ObserverState, observe
from mnemoflow.schemas.codec import default_registry

from factories import user_event


def _seg(text: str, kind: str = "user") -> dict:
    ev = user_event("s1", 3, text, type="user_message" if kind == "user" else
                    "assistant_message")
    seg = observe(ObserverState(), "session-events", ev)[1].segment
    assert seg is not None
    return seg


def _pairs(text: str) -> set[tuple[str, str, str]]:
    return {(e["op"], e["subject"], e["object"]) for e in extract_aliases(_seg(text))}


@pytest.mark.parametrize(("text", "expected"), [
    ("SRE stands for site reliability engineering.",
     {("alias_added", "SRE", "site reliability engineering"),
      ("alias_added", "site reliability engineering", "SRE")}),
    ("Atlas means the billing service.",
     {("alias_added", "Atlas", "the billing service"),
      ("alias_added", "the billing service", "Atlas")}),
    ("Kubernetes aka k8s is hard", {("alias_added", "Kubernetes", "k8s"),
                                   ("alias_added", "k8s", "Kubernetes")}),
    ("We hired a Site Reliability Engineering (SRE) team.",
     {("alias_added", "SRE", "Site Reliability Engineering"),
      ("alias_added", "Site Reliability Engineering", "SRE")}),
    ("Open a PR (pull request) today", {("alias_added", "PR", "pull request"),
                                        ("alias_added", "pull request", "PR")}),
    ("Call me Jay.", {("alias_added", "Jay", "user")}),
    ("Don't call me Jay anymore.", {("alias_revoked", "Jay", "user")}),
    ("ETA no longer means arrival time", {("alias_revoked", "ETA", "arrival time"),
                                          ("alias_revoked", "arrival time", "ETA")}),
])
def test_alias_statements(text: str, expected: set) -> None:
    assert _pairs(text) == expected


@pytest.mark.parametrize("text", [
    "I went to the store (again).", "Please call me later.", "This means we are late.",
    "The meeting (on Monday) was long.", "It means a lot to me.",
])
def test_look_alikes_are_not_aliases(text: str) -> None:
    assert _pairs(text) == set()


def test_aliases_are_scoped_low_prior_and_name_their_segment() -> None:
    seg = _seg("SRE stands for site reliability engineering.")
    for ev in extract_aliases(seg):
        assert (ev["scope"], ev["owner"], ev["kind"]) == ("User", "u1", "alias")
        assert ev["confidence"] < 0.5 and ev["source"] == "user"
        assert json.loads(ev["attributes"]["sources"]) == [seg["segmentId"]]
    assert extract_aliases(_seg("SRE stands for site reliability engineering.", "assistant")) == []


def test_facts_name_their_segment_and_all_events_round_trip() -> None:
    seg = _seg("My editor is vim. SRE stands for site reliability engineering.")
    facts = extract_facts(seg)
    assert facts and all(json.loads(f["attributes"]["sources"]) == [seg["segmentId"]]
                         for f in facts)
    everything = extract_memories(seg)
    assert {e["op"] for e in everything} == {"fact_proposed", "alias_added"}
    reg = default_registry()
    for ev in everything:
        assert reg.decode(reg.encode("io.mnemoflow.MemoryEvent", ev))[1] == ev


def test_the_observer_emits_aliases_with_the_segment() -> None:
    obs = observe(ObserverState(), "session-events",
                  user_event("s1", 1, "Call me Jay, everyone does."))[1]
    assert [e["op"] for e in obs.memory_events] == ["segment_recorded", "alias_added"]
    off = observe(ObserverState(), "session-events",
                  user_event("s1", 1, "Call me Jay.", attributes={"memory": "off"}))[1]
    assert off.memory_events == ()  # an ephemeral message stores nothing, aliases included


def test_extractors_are_pluggable() -> None:
    seg = _seg("Call me Jay.")

    def shout(s: dict) -> list[dict]:
        return [{"op": "note", "text": s["text"].upper()}]

    assert extract_memories(seg, (shout,)) == [{"op": "note", "text": "CALL ME JAY."}]
