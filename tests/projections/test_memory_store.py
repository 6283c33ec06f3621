"""The memory-log fold: facts (M-03), revocation, scope isolation, idempotence."""

from __future__ import annotations

from mnemoflow.agents.observer import ObserverState, observe
from mnemoflow.agents.tuning import IndexTuning
from mnemoflow.projections.memory_store import MemoryStore

from factories import T0, user_event


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
