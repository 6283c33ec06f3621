"""Link records (every memory-log field, Avro round trip) and co-occurrence proposals."""

from __future__ import annotations

import pytest

from mnemoflow.agents.graph import GraphState, entity_node
from mnemoflow.agents.graph_links import link_added, link_revoked, propose_links
from mnemoflow.schemas.codec import default_registry, topic_schema

from factories import memory_event, revoke_event

REX, BEACH = entity_node("rex"), entity_node("beach")
T = 1_000_000


def mem(mid: str, ents: list[str], t: int = T, owner: str = "alice") -> dict:
    return memory_event(mid, ents, t, owner)


def revoke(mid: str) -> dict:
    return revoke_event(mid, "alice")


def state(*events: dict) -> GraphState:
    g = GraphState()
    for ev in events:
        g.apply(ev)
    return g


def test_link_records_fill_every_field_and_round_trip() -> None:
    fields = [f["name"] for f in topic_schema("memory-log.avsc")["fields"]]
    reg = default_registry()
    add = link_added("User", "alice", REX, "seg:s:1", ["seg:s:1"], event_time=T,
                     session_id="s", event_seq=4, ttl_ms=60_000, weight=0.5)
    rv = link_revoked(add, "user said no", ["s#7.0"], event_time=T + 9, session_id="s",
                      event_seq=7)
    for rec in (add, rv):
        assert set(rec) == set(fields)
        name, back = reg.decode(reg.encode("io.mnemoflow.MemoryEvent", rec))
        assert name == "io.mnemoflow.MemoryEvent" and back == rec
    assert (add["op"], rv["op"]) == ("link_added", "link_revoked")
    assert rv["memoryId"] == add["memoryId"] and rv["eventId"] != add["eventId"]
    assert add["text"] == "" and add["entities"] == ["rex"]
    assert rv["attributes"] == {"basis": "explicit", "weight": "0.5", "reason": "user said no"}


def test_links_need_evidence_and_two_nodes() -> None:
    with pytest.raises(ValueError):
        link_added("User", "a", REX, BEACH, [], event_time=T, session_id="s", event_seq=1)
    with pytest.raises(ValueError):
        link_added("User", "a", REX, REX, ["m"], event_time=T, session_id="s", event_seq=1)


def test_the_same_pair_is_the_same_link_whichever_way_round() -> None:
    a = link_added("User", "a", REX, BEACH, ["m"], event_time=T, session_id="s", event_seq=1)
    b = link_added("User", "a", BEACH, REX, ["m"], event_time=T, session_id="s", event_seq=1)
    c = link_added("User", "b", REX, BEACH, ["m"], event_time=T, session_id="s", event_seq=1)
    assert a["memoryId"] == b["memoryId"] != c["memoryId"]


def test_co_occurrence_in_enough_memories_of_one_owner_proposes_a_link() -> None:
    g = state(mem("m1", ["Rex", "Beach"], t=T), mem("m2", ["Beach", "Rex", "Kite"], t=T + 5),
              mem("m3", ["Rex", "Beach"], t=T + 9), mem("b1", ["Kite", "Rex"], owner="bob"))
    props = propose_links(g, ["m1", "m2", "m3", "b1"])
    assert [(p["subject"], p["object"], p["owner"]) for p in props] == [
        (entity_node("beach"), REX, "alice")]
    p = props[0]
    assert p["provenance"] == ["m1", "m2"] and p["eventTime"] == T + 5
    assert p["source"] == "inference" and p["predicate"] == "co-occurs-with"
    assert propose_links(g, ["m3", "m1"]) == props  # pure and deterministic
    assert propose_links(g, ["m1"], min_count=4) == []


def test_a_held_link_is_not_proposed_again_unless_its_evidence_changes() -> None:
    g = state(mem("m1", ["Rex", "Beach"], t=T), mem("m2", ["Rex", "Beach"], t=T + 1),
              mem("m3", ["Rex", "Beach"], t=T + 2))
    (p,) = propose_links(g, ["m3"])
    g.apply(p)
    assert propose_links(g, ["m1", "m2", "m3"]) == []
    g.apply(revoke("m1"))
    (q,) = propose_links(g, ["m2"])
    assert q["memoryId"] == p["memoryId"] and q["provenance"] == ["m2", "m3"]
    assert q["eventId"] != p["eventId"]


def test_a_revoked_link_is_never_proposed_again() -> None:
    g = state(mem("m1", ["Rex", "Beach"], t=T), mem("m2", ["Rex", "Beach"], t=T + 1))
    (p,) = propose_links(g, ["m1"])
    g.apply(p)
    g.apply(link_revoked(p, "spurious", ["s#3.0"], event_time=T + 3, session_id="s",
                         event_seq=3))
    g.apply(mem("m3", ["Rex", "Beach"], t=T + 4))
    assert propose_links(g, ["m3"]) == []


def test_superseded_memories_are_not_evidence() -> None:
    g = GraphState()
    for ev in (mem("m1", ["Rex", "Beach"]), mem("m2", ["Rex", "Beach"])):
        g.apply(ev)
    assert propose_links(g, ["m1"], alive=lambda m: m != "m2") == []


def test_memories_that_expire_are_not_evidence() -> None:
    g = state(memory_event("m1", ["Rex", "Beach"], T, "alice", ttlMs=1000),
              memory_event("m2", ["Rex", "Beach"], T + 1, "alice"))
    assert propose_links(g, ["m1", "m2"]) == []
