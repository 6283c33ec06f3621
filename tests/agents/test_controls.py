"""Memory off and on (agents/controls.py): by event time, per user and per session; what a
switched-off user writes is never stored, and a request gets no packet, audited why."""

from __future__ import annotations

from test_safety_broker import TUNING, _Tier

from mnemoflow.agents import memory_events as M
from mnemoflow.agents.broker import BrokerState
from mnemoflow.agents.controls import Controls
from mnemoflow.agents.recall import TierSpec
from mnemoflow.agents.respond import Projection, respond
from mnemoflow.projections.memory_store import MemoryStore

from factories import T0, candidate, request


def _switch(off: bool, t: int, session: str = "", user: str = "u1") -> dict:
    return M.as_operator(M.memory_switch(user, off, t, session=session), "test", "ops")


def test_a_switch_holds_from_its_event_time_until_the_next() -> None:
    c = Controls()
    for ev in (_switch(True, T0 + 10), _switch(False, T0 + 20), _switch(True, T0 + 5, "s2")):
        c.apply(ev)
        c.apply(ev)  # a redelivery changes nothing
    assert not c.off("u1", "s1", T0 + 9)
    assert c.off("u1", "s1", T0 + 10) and c.off("u1", "s1", T0 + 19)
    assert not c.off("u1", "s1", T0 + 20)
    assert c.off("u1", "s2", T0 + 30)  # the session's own switch is still off
    assert not c.off("u2", "s2", T0 + 30)  # another user's session of the same name
    assert [s["memory"] for s in c.state("u1")] == ["off", "on", "off"]


def test_what_a_switched_off_user_writes_is_never_stored() -> None:
    store = MemoryStore()
    before = M.host_fact("u1", "prefers blue-green releases", T0)
    during = M.host_fact("u1", "the release manager is Priya", T0 + 15)
    after = M.host_fact("u1", "deploys on Tuesdays", T0 + 25)
    other = M.host_fact("u2", "likes tea", T0 + 15)
    for ev in (before, _switch(True, T0 + 10), during, other, _switch(False, T0 + 20), after):
        store.apply(ev)
    assert set(store.records) == {before["memoryId"], other["memoryId"], after["memoryId"]}
    revoke = M.host_revoke("u1", before["memoryId"], T0 + 12)  # removing still works
    store.apply(revoke)
    assert not store.recallable(before["memoryId"])


async def test_a_request_while_memory_is_off_gets_no_packet_and_is_not_recalled() -> None:
    tier = _Tier([candidate("a", "You parked on level 3", 2.0)])
    _, out = await respond(BrokerState(), request(), [TierSpec(tier)], Projection("v", True),
                           lambda: "v", TUNING, memory_off=True)
    assert out.inbox_op is None and tier.calls == 0
    assert (out.audit["action"], out.audit["reason"]) == ("suppress", "disabled")
    assert out.audit["candidates"] == [] and out.audit["packetId"] is None


def test_a_dropped_memory_reaches_no_projection() -> None:
    """`Memory.apply` offers the sinks (vectors, graph, MEMORY.md) only what the store took."""
    store = MemoryStore()
    assert store.apply(_switch(True, T0))
    assert not store.apply(M.host_fact("u1", "the release manager is Priya", T0 + 1))
    assert store.apply(M.host_fact("u2", "likes tea", T0 + 1))
