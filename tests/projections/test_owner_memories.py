"""One owner's memories as the operator sees them, and the operator's events (pure)."""

from __future__ import annotations

import pytest

from mnemoflow.agents import memory_events as M
from mnemoflow.projections.owner_memories import fold_owner

from factories import T0, locker_code


def test_only_the_owners_memories_are_folded_and_listed() -> None:
    log = [M.host_fact("alice", "prefers blue-green releases", T0),
           M.host_fact("bob", "prefers canary releases", T0 + 1)]
    view = fold_owner(log, "alice")
    assert [r["text"] for r in view.rows()] == ["prefers blue-green releases"]
    assert view.rows()[0]["status"] == "recallable"
    assert view.detail(log[1]["memoryId"]) is None  # bob's id, asked through alice


def test_an_operator_revoke_is_an_event_with_its_reason_and_actor() -> None:
    fact = M.host_fact("alice", "the release manager is Priya", T0)
    revoke = M.as_operator(M.host_revoke("alice", fact["memoryId"], T0 + 5),
                           "stale: Priya left", "ops")
    assert revoke["source"] == "operator" and revoke["op"] == "memory_revoked"
    assert revoke["attributes"]["reason"] == "stale: Priya left"
    assert revoke["provenance"] == [f"operator:ops@{T0 + 5}"]
    view = fold_owner([fact, revoke], "alice")
    assert view.status(fact["memoryId"]) == "revoked"
    assert view.rows() == [] and [r["status"] for r in view.rows(everything=True)] == ["revoked"]
    history = view.detail(fact["memoryId"])["history"]
    assert [(h["op"], h["source"], h["reason"], h["actor"]) for h in history] == [
        ("fact_upserted", "host", "", ""),
        ("memory_revoked", "operator", "stale: Priya left", "ops")]


def test_operator_event_ids_are_stable_per_action_and_reason() -> None:
    base = M.host_revoke("alice", "fact:1", T0)
    assert M.as_operator(base, "r", "ops")["eventId"] == M.as_operator(base, "r", "ops")["eventId"]
    assert M.as_operator(base, "r", "ops")["eventId"] != M.as_operator(base, "s", "ops")["eventId"]
    assert M.as_operator(base, "r", "ops")["eventId"] != base["eventId"]
    with pytest.raises(ValueError, match="reason"):
        M.as_operator(base, "  ", "ops")


def test_an_operator_resolves_a_conflict_for_one_side() -> None:
    old, new = locker_code("alice", "zq417x", T0), locker_code("alice", "kk555m", T0 + 10)
    view = fold_owner([old, new], "alice")
    assert view.status(new["memoryId"]) == "conflict"
    assert [s["memoryId"] for s in view.detail(new["memoryId"])["conflict"]["sides"]] == [
        old["memoryId"], new["memoryId"]]
    resolve = M.as_operator(M.host_confirm("alice", new["memoryId"], T0 + 20), "user said so",
                            "ops")
    view = fold_owner([old, new, resolve], "alice")
    assert view.status(new["memoryId"]) == "recallable"
    assert view.status(old["memoryId"]) == "revoked"


def test_an_operator_approval_counts_as_a_persons() -> None:
    from mnemoflow.agents import procedure_fold as PF
    from mnemoflow.agents.procedures import Procedure

    proc = Procedure("proc:1", "User", "alice", ("deploy",), risk_level="high",
                     requires_approval=True)
    approve = M.as_operator(M.host_approve_procedure("alice", "proc:1", T0), "reviewed", "ops")
    assert PF.step(proc, approve, lambda _: False).approved
    inferred = {**approve, "source": "inference"}
    assert PF.step(proc, inferred, lambda _: False) is None


def test_a_procedure_is_listed_once_and_a_deprecated_one_only_with_everything() -> None:
    from mnemoflow.agents.consolidate import QUIET_MS, consolidate
    from mnemoflow.projections.memory_store import MemoryStore

    from factories import observe_log, tool_run

    runs = [x for i in range(3) for x in tool_run(f"p{i}", T0 + i * 3_600_000,
                                                  [("build", "ok"), ("test", "ok")],
                                                  intent="ship the docs")]
    log = observe_log(runs)
    store = MemoryStore()
    for ev in log:
        store.apply(ev)
    log += consolidate(store, store.latest_event_time + QUIET_MS)
    view = fold_owner(log, "u1")
    (pid,) = view.store.procedures
    listed = [r for r in view.rows() if r["memoryId"] == pid]
    assert [(r["kind"], r["status"]) for r in listed] == [("procedure", view.status(pid))]
    gone = M.as_operator(M.host_revoke("u1", pid, store.latest_event_time + QUIET_MS + 1),
                         "wrong steps", "ops")
    view = fold_owner([*log, gone], "u1")
    assert view.status(pid) == "deprecated"
    assert pid not in {r["memoryId"] for r in view.rows()}
    assert [r["status"] for r in view.rows(everything=True) if r["memoryId"] == pid] == [
        "deprecated"]
