"""M-03 revocation as a pure plan over the provenance graph: what a revocation takes with it,
in which order, and what survives on other live provenance. The store carrying the plan out
is tested in tests/projections/test_memory_store.py."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from mnemoflow.agents import procedures as P
from mnemoflow.agents import revocation as R
from mnemoflow.agents.episodes import Episode
from mnemoflow.agents.ids import stable_id
from mnemoflow.agents.memory_events import json_list, memory_event
from mnemoflow.agents.memory_record import AliasRecord, MemoryRecord, record_of
from mnemoflow.agents.procedure_fold import procedure_record

from factories import T0


@dataclass
class Ledger:
    """The tables the store keeps, filled by hand."""

    records: dict[str, MemoryRecord] = field(default_factory=dict)
    aliases: dict[str, AliasRecord] = field(default_factory=dict)
    procedures: dict[str, P.Procedure] = field(default_factory=dict)
    sources: dict[str, set[str]] = field(default_factory=dict)
    derived: dict[str, set[str]] = field(default_factory=dict)
    anchored: set[str] = field(default_factory=set)

    def add(self, mid: str, *srcs: str, revoked: bool = False) -> None:
        ev = memory_event(event_id=f"e-{mid}", op="memory_recorded", memory_id=mid,
                          kind="fact", scope="User", owner="u1", event_time=T0, text=mid)
        self.records[mid] = replace(record_of(ev), revoked=revoked)
        self.link(mid, *srcs)

    def link(self, mid: str, *srcs: str) -> None:
        for s in srcs:
            self.sources.setdefault(mid, set()).add(s)
            self.derived.setdefault(s, set()).add(mid)


def _event(attributes: dict[str, str], kind: str = "fact", source: str = "user") -> dict:
    return memory_event(event_id="e", op="fact_proposed", memory_id="f", kind=kind,
                        scope="User", owner="u1", session_id="s1", event_seq=7,
                        event_time=T0, source=source, attributes=attributes)


def test_the_sources_an_event_names() -> None:
    assert R.sources_of(_event({"sources": json_list(["seg:a", "seg:b"])})) == ("seg:a", "seg:b")
    legacy = R.sources_of(_event({"rule": "my-x-is"}))  # before facts named their segment
    assert legacy == (stable_id("seg", "s1", "session-events", 7),)
    assert R.sources_of(_event({"rule": "host"}, source="host")) is None  # stands on its own
    assert R.sources_of(_event({})) is None
    assert R.sources_of(_event({"rule": "means"}, kind="alias")) is None


def test_orphaned_means_every_source_revoked_and_nothing_else_holding_it() -> None:
    g = Ledger()
    g.add("a")
    g.add("b")
    g.add("f", "a", "b")
    assert not R.orphaned(g, "f")
    g.records["a"] = replace(g.records["a"], revoked=True)
    assert not R.orphaned(g, "f")  # b still backs it
    g.records["b"] = replace(g.records["b"], revoked=True)
    assert R.orphaned(g, "f")
    g.anchored.add("f")
    assert not R.orphaned(g, "f")  # a host write or a person's confirmation
    g.add("free")
    assert not R.orphaned(g, "free")  # derived from nothing: never orphaned
    assert R.orphaned(g, "f", lambda m: True) is False  # anchored wins over any view


def test_a_plan_revokes_depth_first_in_id_order_and_spares_what_has_live_sources() -> None:
    g = Ledger()
    for m in ("seg", "other"):
        g.add(m)
    g.add("f2", "seg")
    g.add("f1", "seg")
    g.add("f1.x", "f1")
    g.add("kept", "seg", "other")
    assert R.plan(g, "seg", "memory_revoked", T0) == [
        R.Revoke("seg", "memory_revoked"), R.Revoke("f1", "cascade:seg"),
        R.Revoke("f1.x", "cascade:f1"), R.Revoke("f2", "cascade:seg")]


def test_a_plan_sees_what_it_already_revoked() -> None:
    """`f` comes from `b` and an alias, both from `a`: only once the plan has taken both
    away is `f` left with no live source."""
    g = Ledger()
    g.add("a")
    g.add("b", "a")
    g.aliases["al"] = AliasRecord("x", "y", "User", "u1")
    g.link("al", "a")
    g.add("f", "b", "al")
    assert R.plan(g, "a", "memory_revoked", T0) == [
        R.Revoke("a", "memory_revoked"), R.DropAlias("al"), R.Revoke("b", "cascade:a"),
        R.Revoke("f", "cascade:b")]
    assert not g.records["b"].revoked and not g.aliases["al"].revoked  # planning changes nothing


def test_a_plan_walks_on_through_memories_revoked_before() -> None:
    g = Ledger()
    g.add("seg", revoked=True)
    g.add("late", "seg")  # came after its segment was revoked
    assert R.plan(g, "seg", "memory_revoked", T0) == [
        R.Revoke("seg", "memory_revoked"), R.Revoke("late", "cascade:seg")]


def _run(session: str, episode: str) -> Episode:
    return Episode(key=f"{session}#1", owner="u1", scope="User", session_id=session, turn=1,
                   intent="ship the docs", actions=("build", "test"), entities=(),
                   unresolved=(), outcome="success", provenance=(), start_time=T0,
                   event_time=T0, event_seq=1, episode_ids=(episode,), failures=())


def _procedure_ledger() -> tuple[Ledger, str]:
    g = Ledger()
    p = None
    for i in (1, 2):
        g.add(f"ep{i}", "seg")
        p = P.observe_episode(p, _run(f"s{i}", f"ep{i}"))
    g.add("seg")
    g.procedures[p.procedure_id] = p
    g.records[p.procedure_id] = procedure_record(p, None)
    g.link(p.procedure_id, "ep1", "ep2")
    return g, p.procedure_id


def test_a_procedure_loses_the_runs_built_on_revoked_episodes() -> None:
    g, _ = _procedure_ledger()
    (revoke, put) = R.plan(g, "ep1", "memory_revoked", T0 + 5)
    assert revoke == R.Revoke("ep1", "memory_revoked")
    p = put.procedure
    assert [(e.key, e.revoked) for e in p.evidence] == [("s1#1", True), ("s2#1", False)]
    assert p.stage == "observed" and P.has_live_runs(p)


def test_a_procedure_with_no_live_run_left_is_deprecated_by_the_cascade() -> None:
    g, pid = _procedure_ledger()
    steps = R.plan(g, "seg", "memory_revoked", T0 + 5)
    assert [type(s).__name__ for s in steps] == [
        "Revoke", "Revoke", "PutProcedure", "Revoke", "PutProcedure"]
    first, last = steps[2].procedure, steps[4].procedure
    assert first.stage == "observed"  # one run left after ep1
    assert last.stage == "deprecated" and not P.has_live_runs(last)  # ep2 saw ep1's change
    assert last.history[-1] == P.Transition("observed", "deprecated", "", T0 + 5, "cascade:ep2")
    rec = procedure_record(last, g.records[pid])
    assert rec.revoked and rec.attributes["revokedBy"] == "cascade:ep2"


def test_a_revoked_record_names_why() -> None:
    g = Ledger()
    g.add("m")
    rec = R.revoked_record(g.records["m"], "host")
    assert rec.revoked and rec.attributes["revokedBy"] == "host"
    assert R.is_revoked(Ledger(records={"m": rec}), "m")
    assert not R.is_revoked(g, "m") and not R.is_revoked(g, "unknown")
    g.aliases["al"] = AliasRecord("x", "y", "User", "u1", revoked=True)
    assert R.is_revoked(g, "al")
