"""Which operator actions `mnemoflow memories` refuses before writing anything (pure)."""

from __future__ import annotations

from mnemoflow.agents import memory_events as M
from mnemoflow.projections.owner_memories import fold_owner
from mnemoflow.streams.memories_cli import operator_event, refusal

from factories import T0, locker_code


def test_actions_that_do_not_apply_are_refused() -> None:
    old, new = locker_code("alice", "zq417x", T0), locker_code("alice", "kk555m", T0 + 10)
    note = M.host_fact("alice", "prefers blue-green releases", T0 + 20)
    view = fold_owner([old, new, note, M.host_fact("bob", "likes tea", T0)], "alice")
    assert refusal(view, "resolve", new["memoryId"]) is None
    assert "no conflict set" in refusal(view, "resolve", note["memoryId"])
    assert "not a procedure" in refusal(view, "approve", note["memoryId"])
    assert "no memory" in refusal(view, "revoke", "fact:nope")
    bobs = fold_owner([M.host_fact("bob", "likes tea", T0)], "bob").rows()[0]["memoryId"]
    assert "no memory" in refusal(view, "revoke", bobs)  # bob's memory, through alice
    revoke = operator_event(view, "revoke", note["memoryId"], "stale", "ops", T0)
    assert revoke["eventTime"] == T0 + 21  # after the memory it acts on
    view = fold_owner([old, new, note, revoke], "alice")
    assert "revoked already" in refusal(view, "revoke", note["memoryId"])
