"""The write-behind state cache: one table write per dirty key per flush, acks only after
the write, and nothing of a dropped (rebalanced) generation is written or acked."""

from __future__ import annotations

import pytest

from mnemoflow.streams.state_cache import FLUSH_RECORDS, StateCache, StateLoadError


class CountingTable(dict):
    def __init__(self) -> None:
        super().__init__()
        self.sets = 0

    def __setitem__(self, key, value) -> None:
        self.sets += 1
        super().__setitem__(key, value)


def cache(table=None, **kw) -> StateCache:
    return StateCache(table if table is not None else CountingTable(),
                      load=lambda d: dict(d or {"n": 0}), dump=dict, **kw)


def step(c: StateCache, key: str, event: str) -> None:
    g = c.generation
    state = c.get(key)
    c.put(key, {"n": state["n"] + 1}, g)
    c.done(event, g)


def test_many_records_of_a_key_make_one_write_and_are_acked_after_it() -> None:
    table = CountingTable()
    c = cache(table)
    for i in range(10):
        step(c, "s1", f"e{i}")
    step(c, "s2", "e10")
    assert table.sets == 0  # nothing written yet, nothing acked
    assert c.flush() == [f"e{i}" for i in range(11)]
    assert table == {"s1": {"n": 10}, "s2": {"n": 1}} and table.sets == 2
    assert c.flush() == [] and table.sets == 2  # clean: no write


def test_a_drop_forgets_unflushed_states_and_their_acks() -> None:
    table = CountingTable()
    c = cache(table)
    step(c, "s1", "e0")
    c.flush()
    g = c.generation
    state = c.get("s1")
    step(c, "s1", "e1")
    c.drop()  # a rebalance: e1 will be delivered again
    c.put("s1", {"n": state["n"] + 100}, g)  # a step that began before the drop
    c.done("e2", g)
    assert c.flush() == [] and table == {"s1": {"n": 1}}
    step(c, "s1", "e1")  # redelivered, folded from the table's state
    assert c.flush() == ["e1"] and table == {"s1": {"n": 2}}


def test_eviction_keeps_dirty_states_and_reloads_clean_ones() -> None:
    table = CountingTable()
    c = cache(table, capacity=2)
    for k in ("a", "b", "c", "d"):
        step(c, k, k)
    c.flush()
    assert len(c.entries) == 2 and table == {k: {"n": 1} for k in "abcd"}
    step(c, "a", "a2")  # evicted: loaded from the table again
    assert c.flush() == ["a2"] and table["a"] == {"n": 2}


def test_due_after_enough_records_and_a_bad_stored_state_is_the_records_fault() -> None:
    c = cache()
    for i in range(FLUSH_RECORDS - 1):
        step(c, "s", str(i))
    assert not c.due
    step(c, "s", "last")
    assert c.due
    bad = StateCache({"x": "not a mapping"}, load=lambda d: dict(d), dump=dict)
    with pytest.raises(StateLoadError):
        bad.get("x")
