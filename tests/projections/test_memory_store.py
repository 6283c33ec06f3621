"""The memory-log fold: facts (M-03), revocation and its cascade, aliases (M-05), evidence
(G-01), procedures (M-04), scope isolation, idempotence."""

from __future__ import annotations

from mnemoflow.agents.consolidate import QUIET_MS, consolidate
from mnemoflow.agents.facts import CONFIDENCE_CEIL, CONFIDENCE_FLOOR, EVIDENCE_KEPT, REINFORCE_STEP
from mnemoflow.agents.memory_events import (
    host_alias,
    host_approve_procedure,
    host_confirm,
    host_fact,
    host_revoke,
    memory_event,
)
from mnemoflow.agents.observer import ObserverState, observe
from mnemoflow.agents.rank import Ranked
from mnemoflow.agents.safety import check
from mnemoflow.agents.tuning import IndexTuning
from mnemoflow.projections.memory_store import MemoryStore
from mnemoflow.projections.vector_tier import VectorSink

from factories import T0, observe_log, tool_run, user_event


def _events(texts: list[str], user: str = "u1", sid: str = "s1") -> list[dict]:
    st, out = ObserverState(), []
    for i, t in enumerate(texts, start=1):
        st, obs = observe(st, "session-events", user_event(sid, i, t, T0 + i * 1000, user=user))
        out += obs.memory_events
    return out


def _req(text: str, user: str = "u1") -> dict:
    return {"sessionId": "q", "userId": user, "workspaceId": None, "text": text,
            "entities": [], "eventTime": T0 + 10**9}


def _facts(store: MemoryStore) -> dict[str, str]:
    return {r.memory_id: r.text for r in store.records.values()
            if r.kind == "fact" and not r.revoked}


def test_fold_is_idempotent() -> None:
    evs = _events(["My dog is called Rex.", "I prefer aisle seats."])
    a, b = MemoryStore(), MemoryStore()
    for e in evs:
        a.apply(e)
    for e in evs + evs:
        b.apply(e)
    assert a.records == b.records


def test_correction_supersedes_and_keeps_both_sides_in_the_conflict_set() -> None:
    s = MemoryStore()
    for e in _events(["My favourite colour is teal.", "Actually, my favourite colour is green."]):
        s.apply(e)
    assert list(_facts(s).values()) == ["favourite colour is green"]
    sides = s.conflicts[("u1", "favourite colour", "is")]
    assert len(sides) == 2 and sides[1]["status"] == "superseded-previous"
    assert all(side["provenance"] for side in sides)


def test_inference_never_overwrites_a_user_fact() -> None:
    s = MemoryStore()
    user = _events(["My editor is vim."])[1]
    s.apply(user)
    inferred = {**user, "eventId": "e2", "memoryId": "fact:inferred", "source": "inference",
                "object": "emacs", "text": "editor is emacs", "attributes": {}}
    s.apply(inferred)
    assert list(_facts(s).values()) == ["editor is vim"]
    assert s.conflicts[("u1", "editor", "is")][-1]["status"] == "rejected-inference"


def test_disagreeing_user_statements_stay_open_until_confirmed() -> None:
    s = MemoryStore()
    evs = _events(["My office is room 12."]) + _events(["My office is room 14."], sid="s2")
    for e in evs:
        s.apply(e)
    assert sorted(_facts(s).values()) == ["office is room 12", "office is room 14"]
    keep = next(m for m, t in _facts(s).items() if t.endswith("14"))
    s.apply({**evs[1], "eventId": "confirm", "op": "fact_confirmed", "memoryId": keep})
    assert list(_facts(s).values()) == ["office is room 14"]


def test_revocation_hides_a_memory_from_recall() -> None:
    s = MemoryStore()
    evs = _events(["The wifi password is hunter2 at the cabin."])
    for e in evs:
        s.apply(e)
    assert s.search_lexical(_req("wifi password cabin"), 5)
    seg = evs[0]
    s.apply({**seg, "eventId": "rv", "op": "memory_revoked"})
    assert s.search_lexical(_req("wifi password cabin"), 5) == []


def test_one_users_memories_are_never_recalled_for_another() -> None:
    s = MemoryStore()
    for e in _events(["My locker code is 4471."], user="alice") + \
            _events(["My locker code is 9902."], user="bob", sid="s2"):
        s.apply(e)
    hits = s.search_lexical(_req("locker code", user="bob"), 10)
    assert hits and all(c.owner == "bob" for c in hits)


# ------------------------------------------------------------------ revocation cascade


def _fact_ids(store: MemoryStore) -> set[str]:
    return set(_facts(store))


def test_revoking_a_segment_revokes_the_facts_extracted_only_from_it() -> None:
    s = MemoryStore()
    evs = _events(["My dog is called Rex."])
    for e in evs:
        s.apply(e)
    seg, fact = evs[0], evs[1]
    assert fact["op"] == "fact_proposed" and _fact_ids(s) == {fact["memoryId"]}
    assert s.search_lexical(_req("dog called Rex"), 5)
    s.apply({**seg, "eventId": "rv", "op": "memory_revoked"})
    assert _fact_ids(s) == set() and s.search_lexical(_req("dog called Rex"), 5) == []
    assert s.records[fact["memoryId"]].attributes["revokedBy"] == f"cascade:{seg['memoryId']}"


def test_a_fact_with_other_live_provenance_survives() -> None:
    s = MemoryStore()
    first = _events(["My dog is called Rex."])
    again = _events(["My dog is called Rex."], sid="s2")
    for e in first + again:
        s.apply(e)
    assert first[1]["memoryId"] == again[1]["memoryId"]
    s.apply({**first[0], "eventId": "rv1", "op": "memory_revoked"})
    assert _fact_ids(s) == {first[1]["memoryId"]}  # s2's statement still backs it
    s.apply({**again[0], "eventId": "rv2", "op": "memory_revoked"})
    assert _fact_ids(s) == set()


def test_a_host_written_fact_is_not_cascaded() -> None:
    s = MemoryStore()
    evs = _events(["My dog is called Rex."])
    for e in evs:
        s.apply(e)
    s.apply(host_fact("u1", "", T0 + 5, subject="dog", predicate="is", obj="called Rex"))
    s.apply({**evs[0], "eventId": "rv", "op": "memory_revoked"})
    assert _fact_ids(s) == {evs[1]["memoryId"]}


def test_a_fact_arriving_after_its_segment_was_revoked_is_born_revoked() -> None:
    s = MemoryStore()
    seg, fact = _events(["My dog is called Rex."])
    s.apply(seg)
    s.apply({**seg, "eventId": "rv", "op": "memory_revoked"})
    s.apply(fact)
    assert _fact_ids(s) == set()


def test_facts_logged_before_they_named_their_segment_still_cascade() -> None:
    s = MemoryStore()
    seg, fact = _events(["My dog is called Rex."])
    legacy = {**fact, "attributes": {k: v for k, v in fact["attributes"].items()
                                     if k != "sources"}}
    for e in (seg, legacy, {**seg, "eventId": "rv", "op": "memory_revoked"}):
        s.apply(e)
    assert _fact_ids(s) == set()


def test_revoking_a_segment_revokes_its_aliases() -> None:
    s = MemoryStore()
    for e in _events(["Our billing service is big."]):
        s.apply(e)
    evs = _events(["SRE stands for site reliability engineering."], sid="s2")
    for e in evs:
        s.apply(e)
    assert {e["op"] for e in evs} >= {"alias_added"}
    s.apply({**evs[0], "eventId": "rv", "op": "memory_revoked"})
    assert all(a.revoked for a in s.aliases.values())


# ------------------------------------------------------------------ aliases and evidence


def test_an_alias_expands_recall_but_never_changes_text_or_confidence() -> None:
    s = MemoryStore()
    for e in _events(["The site reliability engineering rota starts Monday."]):
        s.apply(e)
    before = dict(s.records)
    assert s.search_lexical(_req("SRE schedule"), 5) == []
    for e in _events(["SRE stands for site reliability engineering."], sid="s2"):
        if e["op"] == "alias_added":
            s.apply(e)
    assert s.records == before  # no record touched, no confidence raised
    hits = s.search_lexical(_req("SRE schedule"), 5)
    assert [c.text for c in hits] == ["The site reliability engineering rota starts Monday."]
    alias = next(iter(s.aliases))
    s.apply(host_alias("u1", s.aliases[alias].alias, s.aliases[alias].target, T0 + 9,
                       revoke=True))
    assert s.search_lexical(_req("SRE schedule"), 5) == []


def _evidence(mid: str, op: str, n: int, base: int = T0 + 100) -> dict:
    return memory_event(event_id=f"ev{op}{n}", op=op, memory_id=mid, kind="evidence",
                        scope="User", owner="u1", session_id="s9", event_time=base + n,
                        source="tool")


def test_evidence_moves_confidence_within_bounds_and_keeps_a_trail() -> None:
    s = MemoryStore()
    seg = _events(["The deploy key lives in vault path kv/deploy."])[0]
    s.apply(seg)
    mid = seg["memoryId"]
    start = s.records[mid].confidence
    s.apply(_evidence(mid, "evidence_reinforce", 1))
    assert s.records[mid].confidence == start + REINFORCE_STEP
    for n in range(2, 40):
        s.apply(_evidence(mid, "evidence_reinforce", n))
    assert s.records[mid].confidence == CONFIDENCE_CEIL
    for n in range(40, 80):
        s.apply(_evidence(mid, "evidence_weaken", n))
    rec = s.records[mid]
    assert rec.confidence == CONFIDENCE_FLOOR and len(rec.evidence) == EVIDENCE_KEPT
    assert rec.evidence[-1] == "-evevidence_weaken79"
    s.apply(_evidence(mid, "evidence_weaken", 79))  # a redelivered event changes nothing
    assert s.records[mid] == rec


def test_a_disputed_memory_is_hidden_until_confirmed() -> None:
    s = MemoryStore()
    seg, fact = _events(["My office is room 12."])
    s.apply(seg)
    s.apply(fact)
    dispute = memory_event(event_id="d1", op="fact_conflicted", memory_id=fact["memoryId"],
                           kind="evidence", scope="User", owner="u1", session_id="s2",
                           event_time=T0 + 50, text="No, that's outdated", source="user",
                           provenance=["s2#4.0"])
    s.apply(dispute)
    assert not s.recallable(fact["memoryId"])
    assert fact["memoryId"] not in {c.memory_id for c in s.search_lexical(_req("office room"), 5)}
    sides = s.conflicts[("u1", "office", "is")]
    assert sides[-1]["status"] == "disputed" and sides[-1]["provenance"] == ["s2#4.0"]
    s.apply(host_confirm("u1", fact["memoryId"], T0 + 60))
    assert fact["memoryId"] in {c.memory_id for c in s.search_lexical(_req("office room"), 5)}


# ------------------------------------------------------------------ procedures


def _procedure_store(tools: list[tuple[str, str]], sessions: int) -> tuple[MemoryStore, str]:
    runs = [x for i in range(sessions)
            for x in tool_run(f"p{i}", T0 + i * 3_600_000, tools, intent="ship the docs")]
    s = _store_of(observe_log(runs))
    for e in consolidate(s, s.latest_event_time + QUIET_MS):
        s.apply(e)
    (p,) = s.all_procedures()
    return s, p.procedure_id


DOCS = [("build", "ok"), ("test", "ok"), ("render_docs", "ok")]


def _doc_req(t: int = T0 + 10**9) -> dict:
    return {**_req("ship the docs: build test render_docs"), "eventTime": t}


def test_only_validated_and_active_procedures_are_recalled_as_procedures() -> None:
    two, pid = _procedure_store(DOCS, 2)
    assert two.procedures[pid].stage == "candidate"
    assert pid not in {c.memory_id for c in two.search_lexical(_doc_req(), 10)}
    three, pid = _procedure_store(DOCS, 3)
    (hit,) = [c for c in three.search_lexical(_doc_req(), 10) if c.memory_id == pid]
    assert hit.kind == "procedure" and hit.risk_level == "low"
    entered = three.records[pid].event_time
    assert pid not in {c.memory_id for c in three.search_lexical(_doc_req(entered), 10)}


def test_a_high_risk_procedure_makes_the_safety_gate_ask() -> None:
    s, pid = _procedure_store([("build", "ok"), ("deploy", "ok")], 3)
    s.apply(host_approve_procedure("u1", pid, s.latest_event_time + 1))
    for e in consolidate(s, s.latest_event_time + 1):
        s.apply(e)
    assert s.procedures[pid].stage == "validated"
    req = _doc_req()
    kept = [c for c in s.search_lexical(req, 10) if c.memory_id == pid]
    assert kept and kept[0].risk_level == "high"
    verdict = check([Ranked(kept[0], 1.0, "kept")], {**req, "reason": "above-threshold"})
    assert verdict.action == "ask"


def test_deprecated_or_revoked_procedures_are_never_recalled() -> None:
    s, pid = _procedure_store(DOCS, 3)
    assert s.recallable(pid)
    s.apply(host_revoke("u1", pid, s.latest_event_time + 1))
    assert s.procedures[pid].stage == "deprecated" and not s.recallable(pid)
    assert pid in s.revocations
    for e in consolidate(s, s.latest_event_time + QUIET_MS):
        s.apply(e)
    assert not s.recallable(pid)


def test_revoking_the_episodes_behind_a_procedure_deprecates_it() -> None:
    s, pid = _procedure_store(DOCS, 3)
    episodes = [r.memory_id for r in s.records_of("episode")]
    s.apply(host_revoke("u1", episodes[0], T0 + 10**8))
    assert s.procedures[pid].stage == "validated"  # not yet re-planned
    for e in consolidate(s, s.latest_event_time + QUIET_MS):
        s.apply(e)
    assert s.procedures[pid].stage == "candidate"  # two sessions of evidence left
    for i, m in enumerate(episodes[1:]):
        s.apply(host_revoke("u1", m, T0 + 10**8 + i + 1))
    assert s.procedures[pid].stage == "deprecated" and not s.recallable(pid)


def test_reuse_evidence_promotes_to_active_and_failures_demote() -> None:
    s, pid = _procedure_store(DOCS, 3)
    t = s.latest_event_time
    for n, sid in enumerate(["r1", "r2"]):
        s.apply({**_evidence(pid, "evidence_reinforce", n, t), "sessionId": sid})
    for e in consolidate(s, s.latest_event_time + 1):
        s.apply(e)
    assert s.procedures[pid].stage == "active"
    s.apply(_evidence(pid, "evidence_weaken", 5, t))
    assert consolidate(s, s.latest_event_time + 1) == []  # one failure is noise
    s.apply(_evidence(pid, "evidence_weaken", 6, t))
    out = consolidate(s, s.latest_event_time + 1)
    assert [(e["op"], e["attributes"]["stage"]) for e in out] == [
        ("procedure_staged", "validated"), ("procedure_staged", "candidate")]


def test_the_fold_rebuilds_the_same_state_from_the_log() -> None:
    s, pid = _procedure_store(DOCS, 3)
    runs = [x for i in range(3)
            for x in tool_run(f"p{i}", T0 + i * 3_600_000, DOCS, intent="ship the docs")]
    log = observe_log(runs)
    first = _store_of(log)
    log += consolidate(first, first.latest_event_time + QUIET_MS)
    rebuilt = _store_of(log + log)  # redelivered records change nothing
    assert rebuilt.records == s.records and rebuilt.procedures == s.procedures


def _store_of(events: list[dict]) -> MemoryStore:
    out = MemoryStore()
    for e in events:
        out.apply(e)
    return out


def test_the_vector_sink_follows_the_cascade() -> None:
    class FakeIndex:
        def __init__(self) -> None:
            self.ids: set[str] = set()

    s = MemoryStore()
    sink = VectorSink(FakeIndex(), embedder=None, store=s)  # type: ignore[arg-type]
    seg, fact = _events(["My dog is called Rex."])
    for e in (seg, fact, {**seg, "eventId": "rv", "op": "memory_revoked"}):
        s.apply(e)
        sink.on_event(e)
    assert set(sink.revoked) == {seg["memoryId"], fact["memoryId"]}
    assert sink.pending == []


def _ctx_store(weight: float = 0.5) -> MemoryStore:
    return MemoryStore(index=IndexTuning(context_weight=weight))


def _ids(hits: list) -> list[str]:
    return [c.memory_id for c in hits]


def test_a_segment_is_found_through_the_turn_before_it_in_its_session() -> None:
    s = _ctx_store()
    evs = _events(["Which team did you sign with?", "The Minnesota Wolves, I start in May."])
    other = _events(["Which team did you sign with?"], sid="s2")[:1]
    for e in evs + other:
        s.apply(e)
    question, answer = evs[0]["memoryId"], evs[1]["memoryId"]
    hits = _ids(s.search_lexical(_req("what team did he sign with"), 5))
    assert answer in hits and question in hits and other[0]["memoryId"] in hits
    assert s.context_of(answer).memory_id == question
    assert s.context_of(question) is None  # the first turn of its session
    assert s.context_of(other[0]["memoryId"]) is None  # sessions never share context
    off = _ctx_store(0.0)
    for e in evs:
        off.apply(e)
    assert answer not in _ids(off.search_lexical(_req("what team did he sign with"), 5))


def test_revoking_a_turn_removes_it_from_the_next_turns_context() -> None:
    s = _ctx_store()
    evs = [e for e in _events(["We repainted the kitchen.", "The wifi code is hunter2.",
                               "It took two weekends."]) if e["op"] == "segment_recorded"]
    for e in evs:
        s.apply(e)
    first, secret, last = (e["memoryId"] for e in evs)
    assert last in _ids(s.search_lexical(_req("wifi code"), 5))
    s.apply({**evs[1], "eventId": "rv", "op": "memory_revoked"})
    assert _ids(s.search_lexical(_req("wifi code hunter2"), 5)) == []
    assert s.context_of(last).memory_id == first  # relinked to the turn before the revoked one
    assert last in _ids(s.search_lexical(_req("repainted kitchen"), 5))


def test_context_index_is_the_same_after_a_rebuild_without_revoked_rows() -> None:
    evs = [e for e in _events(["We repainted the kitchen.", "The wifi code is hunter2.",
                               "It took two weekends."]) if e["op"] == "segment_recorded"]
    a = _ctx_store()
    for e in evs + [{**evs[1], "eventId": "rv", "op": "memory_revoked"}]:
        a.apply(e)
    b = _ctx_store()  # what MEMORY.md gives back: the revoked row is simply absent
    for e in (evs[0], evs[2]):
        b.apply(e)
    for q in ("repainted kitchen", "two weekends", "wifi"):
        assert [(c.memory_id, c.relevance) for c in a.search_lexical(_req(q), 5)] == \
            [(c.memory_id, c.relevance) for c in b.search_lexical(_req(q), 5)]


def test_candidates_name_the_turn_they_follow() -> None:
    s = _ctx_store()
    evs = _events(["Which team did you sign with?", "The Minnesota Wolves, I start in May."])
    for e in evs:
        s.apply(e)
    hits = {c.memory_id: c for c in s.search_lexical(_req("minnesota wolves team"), 5)}
    assert hits[evs[1]["memoryId"]].follows == evs[0]["memoryId"]
    assert hits[evs[0]["memoryId"]].follows is None


def test_confirming_a_candidate_refused_by_a_users_fact_leaves_no_dangling_id() -> None:
    """An inference never overwrites a user's fact, even once confirmed; the refused candidate
    leaves every read index, so consolidation and the Markdown projection keep working."""
    from mnemoflow.agents.memory_events import memory_event

    s = MemoryStore()
    s.apply(host_fact("u1", "", T0, subject="deploy", predicate="fails with", obj="timeout",
                      session_id="s1"))
    cand = memory_event(event_id="e:cand", op="fact_proposed", memory_id="fact:cand",
                        kind="fact", scope="User", owner="u1", session_id="s2", event_seq=3,
                        event_time=T0 + 1, text="deploy fails with: disk full",
                        source="inference", confidence=0.3, subject="deploy",
                        predicate="fails with", object_="disk full",
                        attributes={"status": "candidate"})
    s.apply(cand)
    assert "fact:cand" in s.fact_candidates
    s.apply(host_confirm("u1", "fact:cand", T0 + 2))
    assert "fact:cand" not in s.records
    assert all(r.memory_id != "fact:cand" for r in s.records_of("fact"))
    assert s.session_records("s2") == []
    assert "fact:cand" not in s.by_owner[("User", "u1")]


def test_one_owner_cannot_revoke_or_confirm_another_owners_memory() -> None:
    """A store holds many owners: naming another owner's memory id changes nothing."""
    s = MemoryStore(IndexTuning())
    s.apply(host_fact("alice", "alice parks in bay 7", T0, memory_id="note-a"))
    s.apply(host_fact("bob", "bob parks in bay 9", T0, memory_id="note-b"))
    assert s.apply(host_revoke("bob", "note-a", T0 + 1))  # applied, without effect
    assert s.apply(host_confirm("bob", "note-a", T0 + 2))
    assert not s.records["note-a"].revoked and s.recallable("note-a")
    s.apply(host_revoke("alice", "note-a", T0 + 3))
    assert s.records["note-a"].revoked and not s.records["note-b"].revoked
