"""M-03/G-01 fact rules as pure functions: slots and conflict sets, confirmation, disputes,
bounded evidence steps. The store's fold over them is tested in tests/projections."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from mnemoflow.agents import facts as F
from mnemoflow.agents.memory_events import memory_event
from mnemoflow.agents.memory_record import MemoryRecord, record_of
from mnemoflow.agents.revocation import Revoke

from factories import T0


def _fact(mid: str, obj: str, source: str = "user", subject: str | None = "editor",
          predicate: str | None = "is", **attrs: str) -> dict[str, Any]:
    return memory_event(event_id=f"e-{mid}", op="fact_proposed", memory_id=mid, kind="fact",
                        scope="User", owner="u1", session_id="s1", event_time=T0,
                        text=f"{subject} {predicate} {obj}", source=source,
                        provenance=[f"s1#{mid}"], subject=subject, predicate=predicate,
                        object_=obj, attributes=attrs)


def _rec(mid: str, obj: str, source: str = "user", **kw: Any) -> MemoryRecord:
    return record_of(_fact(mid, obj, source, **kw))


def test_a_free_note_has_no_slot() -> None:
    assert F.fact_key(_fact("n1", "", subject=None, predicate=None)) is None
    assert F.fact_key(_fact("n1", "", subject=None)) == ("u1", "", "is")


def test_the_first_value_of_a_slot_is_put_in_force() -> None:
    ev = _fact("f1", "vim")
    assert F.fact_key(ev) == ("u1", "editor", "is")
    assert F.upsert(ev, None, None) == F.Upsert(active="f1", record=record_of(ev))
    revoked = F.upsert(ev, replace(_rec("f0", "ed"), revoked=True), None)
    assert revoked.active == "f1" and revoked.sides is None and revoked.revoke is None


def test_a_restatement_only_grows_provenance_and_frequency() -> None:
    cur = _rec("f1", "vim")
    up = F.upsert({**_fact("f1", "vim"), "provenance": ["s2#1", "s1#f1"]}, cur, None)
    assert not up.reindex and up.active is None and up.sides is None
    assert up.record == F.restated(cur, ["s2#1"])
    assert up.record.provenance == ("s1#f1", "s2#1") and up.record.frequency == 1


def test_an_inference_never_overwrites_a_persons_value() -> None:
    for source in ("user", "host"):
        up = F.upsert(_fact("f2", "emacs", "inference"), _rec("f1", "vim", source), None)
        assert up.record is None and up.active is None and up.revoke is None
        assert [(s["memoryId"], s.get("status")) for s in up.sides] == [
            ("f1", None), ("f2", "rejected-inference")]


@pytest.mark.parametrize(("new_source", "cur_source", "correction"), [
    ("user", "user", "1"), ("host", "inference", "0"), ("user", "inference", "0"),
    ("inference", "inference", "1")])
def test_a_correction_or_a_person_against_an_inference_supersedes(
        new_source: str, cur_source: str, correction: str) -> None:
    ev = _fact("f2", "emacs", new_source, correction=correction)
    up = F.upsert(ev, _rec("f1", "vim", cur_source), None)
    assert up.revoke == Revoke("f1", "superseded by f2")
    assert up.active == "f2" and up.record == record_of(ev)
    assert up.sides[-1] == {"memoryId": "f2", "object": "emacs", "source": new_source,
                            "provenance": ["s1#f2"], "status": "superseded-previous"}


def test_two_disagreeing_user_statements_both_stay_and_the_later_is_open() -> None:
    up = F.upsert(_fact("f2", "emacs"), _rec("f1", "vim"), None)
    assert up.revoke is None and up.active is None
    assert up.record.attributes["conflict"] == "open" and up.reindex
    assert [s["memoryId"] for s in up.sides] == ["f1", "f2"]
    assert up.sides[0] == {"memoryId": "f1", "object": "editor is vim", "source": "user",
                           "provenance": ["s1#f1"]}
    again = F.upsert(_fact("f3", "nano"), _rec("f1", "vim"), up.sides)
    assert [s["memoryId"] for s in again.sides] == ["f1", "f2", "f3"]  # the same set grows


def test_confirming_settles_the_set_and_revokes_the_other_sides() -> None:
    sides = F.upsert(_fact("f2", "emacs"), _rec("f1", "vim"), None).sides
    other = F.upsert(_fact("g2", "x", subject="os"), _rec("g1", "y", subject="os"), None).sides
    conflicts = {("u1", "os", "is"): other, ("u1", "editor", "is"): sides}
    assert F.conflict_of(conflicts, "f1") == F.conflict_of(conflicts, "f2") == ("u1", "editor", "is")
    assert F.conflict_of(conflicts, "f9") is None
    kept, losers = F.settle(sides, "f2")
    assert kept == sides and losers == [Revoke("f1", "conflict resolved for f2")]
    disputed = F.with_side(None, _rec("f1", "vim"),
                           {**F.dispute_side({"eventId": "d1", "text": "no"}), "memoryId": "f1"})
    kept, losers = F.settle(disputed, "f1")
    assert [s.get("status") for s in kept] == [None, "dismissed"] and losers == []


def test_an_accepted_candidate_is_a_confirmed_fact_and_people_vouch_for_it() -> None:
    cand = _fact("c1", "timeout", "inference", status="candidate", sources='["seg:1"]')
    ev = F.accepted(cand)
    assert ev["attributes"] == {"status": "confirmed", "sources": '["seg:1"]'}
    assert cand["attributes"]["status"] == "candidate"  # the logged event is left as it was
    assert F.vouched({"source": "host"}) and F.vouched({"source": "user"})
    assert not F.vouched({"source": "inference"}) and not F.vouched({})


def test_a_dispute_joins_the_slot_weakens_and_hides_until_lifted() -> None:
    rec = _rec("f1", "vim")
    assert F.dispute_key(rec) == ("u1", "editor", "is")
    seg = record_of({**_fact("s1", "", subject=None, predicate=None), "kind": "segment"})
    assert F.dispute_key(seg) == ("u1", "s1", "")
    side = F.dispute_side({"eventId": "d1", "text": "that's wrong", "source": "user",
                           "provenance": ["s2#4.0"]})
    assert side == {"memoryId": "d1", "object": "that's wrong", "source": "user",
                    "provenance": ["s2#4.0"], "status": "disputed"}
    assert F.with_side(None, rec, side) == (F.side_of(rec), side)
    d = F.disputed(rec)
    assert d.disputed and d.attributes["conflict"] == "disputed"
    assert d.confidence == pytest.approx(rec.confidence - F.WEAKEN_STEP)
    lifted = F.undisputed(d)
    assert not lifted.disputed and lifted.attributes == rec.attributes
    assert lifted.confidence == d.confidence  # lifting a dispute is no evidence for it


def test_confidence_steps_are_bounded_and_never_go_the_wrong_way() -> None:
    assert F.reinforced(0.5) == 0.5 + F.REINFORCE_STEP
    assert F.reinforced(0.94) == F.CONFIDENCE_CEIL
    assert F.reinforced(0.99) == 0.99  # above the ceiling (a host write): not lowered
    assert F.weakened(0.5) == 0.5 - F.WEAKEN_STEP
    assert F.weakened(0.1) == F.CONFIDENCE_FLOOR
    assert F.weakened(0.01) == 0.01  # below the floor: not raised
    assert F.WEAKEN_STEP > F.REINFORCE_STEP  # a failure weighs more than a success


def _evidence(op: str, n: int) -> dict[str, Any]:
    return {"op": op, "eventId": f"ev{n}"}


def test_evidence_keeps_a_bounded_trail_newest_last() -> None:
    rec = _rec("f1", "vim")
    up = F.with_evidence(rec, _evidence("evidence_reinforce", 1), procedure=False)
    assert up.evidence == ("+ev1",) and up.frequency == rec.frequency + 1
    assert up.confidence == F.reinforced(rec.confidence)
    for n in range(2, 2 + F.EVIDENCE_KEPT):
        up = F.with_evidence(up, _evidence("evidence_weaken", n), procedure=False)
    assert len(up.evidence) == F.EVIDENCE_KEPT
    assert up.evidence[0] == "-ev2" and up.evidence[-1] == f"-ev{1 + F.EVIDENCE_KEPT}"
    assert up.confidence == F.CONFIDENCE_FLOOR


def test_a_procedures_evidence_moves_only_its_trail() -> None:
    rec = _rec("p1", "x")
    up = F.with_evidence(rec, _evidence("evidence_weaken", 1), procedure=True)
    assert up.evidence == ("-ev1",)
    assert (up.confidence, up.frequency) == (rec.confidence, rec.frequency)
