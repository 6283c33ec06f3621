"""Idle-time consolidation: episodes -> procedure and fact candidates, deterministic and idempotent."""

from __future__ import annotations

from typing import Any

from mnemoflow.agents.consolidate import QUIET_MS, closed_episodes, consolidate
from mnemoflow.agents.episodes import Episode
from mnemoflow.projections.memory_store import MemoryStore
from mnemoflow.schemas.codec import default_registry

from factories import T0, observe_log, tool_run

HOUR = 3_600_000
DOCS = [("build", "ok"), ("test", "ok"), ("render_docs", "ok")]


def _log(runs: list[list[tuple[str, dict[str, Any]]]]) -> list[dict[str, Any]]:
    return observe_log([x for run in runs for x in run])


def _store(events: list[dict[str, Any]]) -> MemoryStore:
    s = MemoryStore()
    for e in events:
        s.apply(e)
    return s


def _settled(store: MemoryStore, now: int) -> list[dict[str, Any]]:
    """Consolidate and fold the result, as the worker does (through the log)."""
    out = consolidate(store, now)
    for e in out:
        store.apply(e)
    return out


def _sessions(n: int, tools: list[tuple[str, str]] = DOCS, user: str = "u1",
              start: int = T0, prefix: str = "s") -> list[list[tuple[str, dict[str, Any]]]]:
    return [tool_run(f"{user}-{prefix}{i}", start + i * HOUR, tools, user=user)
            for i in range(n)]


def test_episode_has_intent_actions_outcome_and_provenance() -> None:
    store = _store(_log([tool_run("s1", T0, [("build", "ok"), ("deploy", "error"),
                                             ("deploy", "ok")])]))
    (ep,) = closed_episodes(store, T0 + HOUR)
    assert isinstance(ep, Episode) and ep.intent == "deploy atlas to staging"
    assert ep.actions == ("build", "deploy") and ep.outcome == "success"  # retry collapsed
    assert ep.provenance == ("s1#1.1", "s1#1.2", "s1#1.3") and ep.event_time == T0 + 3000
    assert ep.unresolved == ()  # the failed deploy was recovered in the same turn
    failed = _store(_log([tool_run("s2", T0, [("build", "ok"), ("deploy", "error")])]))
    (bad,) = closed_episodes(failed, T0 + HOUR)
    assert bad.outcome == "failure" and bad.failures[0][0] == "deploy"


def test_an_open_turn_waits_for_quiet_or_the_next_turn() -> None:
    run = tool_run("s1", T0, DOCS)
    store = _store(_log([run]))
    last = T0 + 3000
    assert closed_episodes(store, last + QUIET_MS - 1) == []
    assert len(closed_episodes(store, last + QUIET_MS)) == 1
    nxt = _store(_log([run, tool_run("s1", last + 10, [("read", "ok")], turn=2, seq0=10)]))
    assert [e.turn for e in closed_episodes(nxt, last + 20)] == [1]


def test_cross_session_evidence_promotes_and_a_second_run_adds_nothing() -> None:
    store = _store(_log(_sessions(3)))
    now = store.latest_event_time + QUIET_MS
    first = _settled(store, now)
    ops = [(e["op"], e["attributes"].get("stage")) for e in first]
    assert ops == [("procedure_observed", None)] * 3 + [("procedure_promoted", "candidate"),
                                                       ("procedure_promoted", "validated")]
    promo = first[-1]
    assert promo["attributes"]["fromStage"] == "candidate" and len(promo["provenance"]) == 3
    assert consolidate(store, now) == []
    assert consolidate(store, now + 10 * HOUR) == []  # time alone changes nothing


def test_repeats_in_one_session_are_not_promoted() -> None:
    runs = [tool_run("s1", T0 + i * HOUR, DOCS, turn=i + 1, seq0=10 * i + 1) for i in range(3)]
    store = _store(_log(runs))
    out = _settled(store, store.latest_event_time + QUIET_MS)
    assert [e["op"] for e in out] == ["procedure_observed"] * 3
    (p,) = store.all_procedures()
    assert p.stage == "observed"


def test_two_workers_on_the_same_log_write_the_same_events() -> None:
    log = _log(_sessions(4))
    a, b = _store(log), _store(log)
    now = a.latest_event_time + QUIET_MS
    ea, eb = consolidate(a, now), consolidate(b, now)
    assert ea == eb
    for e in ea + eb:  # both land on the log; the fold takes each id once
        a.apply(e)
    assert consolidate(a, now) == []


def test_a_worker_behind_the_log_cannot_undo_a_newer_decision() -> None:
    runs = _sessions(4)
    full, behind = _store(_log(runs)), _store(_log(runs[:2]))
    now = full.latest_event_time + QUIET_MS
    stale, fresh = consolidate(behind, now), consolidate(full, now)
    log = _log(runs) + stale + fresh  # the stale worker happened to write first
    merged = _store(log)
    (p,) = merged.all_procedures()
    assert p.stage == "validated" and [t.to_stage for t in p.history] == ["candidate", "validated"]
    assert consolidate(merged, now) == []


def test_high_risk_asks_and_approval_lets_it_through() -> None:
    store = _store(_log(_sessions(3, [("build", "ok"), ("deploy", "ok")])))
    now = store.latest_event_time + QUIET_MS
    out = _settled(store, now)
    ask = out[-1]
    assert ask["op"] == "procedure_staged" and ask["attributes"]["decision"] == "ask"
    (p,) = store.all_procedures()
    assert p.stage == "candidate" and p.risk_level == "high" and not store.recallable(p.procedure_id)
    assert consolidate(store, now) == []  # asked once
    approve = {**ask, "eventId": "approve-1", "op": "procedure_approved", "source": "inference",
               "attributes": {}}
    store.apply(approve)  # the pipeline cannot approve its own procedure
    assert consolidate(store, now) == []
    store.apply({**approve, "eventId": "approve-2", "source": "host"})
    out = _settled(store, now + 1)
    assert [e["attributes"]["stage"] for e in out] == ["validated"]


def test_repeated_failures_become_fact_candidates_never_facts() -> None:
    failing = [("build", "ok"), ("deploy", "error")]
    store = _store(_log(_sessions(2, failing)))
    out = _settled(store, store.latest_event_time + QUIET_MS)
    (cand,) = [e for e in out if e["op"] == "fact_proposed"]
    assert cand["source"] == "inference" and cand["attributes"]["status"] == "candidate"
    assert cand["text"] == "deploy fails with: deploy timed out after 30s"
    assert not store.recallable(cand["memoryId"])
    req = {"sessionId": "q", "userId": "u1", "workspaceId": None, "text": "deploy timed out",
           "entities": [], "eventTime": T0 + 100 * HOUR}
    assert cand["memoryId"] not in {c.memory_id for c in store.search_lexical(req, 10)}
    store.apply({**cand, "eventId": "confirm", "op": "fact_confirmed", "source": "host"})
    assert cand["memoryId"] in {c.memory_id for c in store.search_lexical(req, 10)}


def test_one_users_episodes_never_feed_another_users_procedures() -> None:
    log = _log(_sessions(2, user="alice") + _sessions(1, user="bob"))
    store = _store(log)
    _settled(store, store.latest_event_time + QUIET_MS)
    stages = {p.owner: p.stage for p in store.all_procedures()}
    assert stages == {"alice": "candidate", "bob": "observed"}


def test_every_event_survives_the_codec() -> None:
    store = _store(_log(_sessions(2, [("build", "ok"), ("deploy", "error")], prefix="f")
                        + _sessions(5, [("build", "ok"), ("deploy", "ok")], start=T0 + 9 * HOUR)))
    out = consolidate(store, store.latest_event_time + QUIET_MS)
    assert {e["op"] for e in out} >= {"procedure_observed", "procedure_promoted",
                                      "procedure_staged", "fact_proposed"}
    reg = default_registry()
    for ev in out:
        assert reg.decode(reg.encode("io.mnemoflow.MemoryEvent", ev))[1] == ev
