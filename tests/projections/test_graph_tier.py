"""C-04 tier 3 as a recall tier: seeds, scoping, confidence untouched, skip and fallback (G-05)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from mnemoflow.agents.candidate import scope_chain
from mnemoflow.agents.graph import GraphState, View, entity_node
from mnemoflow.agents.recall import FaultyTier, TierSpec, recall
from mnemoflow.projections.graph_tier import GraphConfig, GraphSink, GraphTier
from mnemoflow.projections.memory_store import LexicalTier, MemoryStore

from factories import T0, memory_event, request, revoke_event

LATER = T0 + 10_000


def project(*events: dict[str, Any]) -> tuple[MemoryStore, GraphSink]:
    """What the projector does: the store first, then each sink."""
    store, sink = MemoryStore(), GraphSink(GraphState())
    sink.store = store
    for ev in events:
        store.apply(ev)
        sink.on_event(ev)
    sink.flush()
    return store, sink


# one session per memory: a segment is indexed with its session's previous turn as lexical
# context, which would let m2 be found by m1's words; here m2 must be reachable by the graph only
EVENTS = (
    memory_event("m1", ["Rex", "Brighton"], T0, text="Rex loves the beach at Brighton",
                 sessionId="s1"),
    memory_event("m2", ["Brighton", "Pier"], T0 + 1, text="the pier was closed for repairs",
                 sessionId="s2"),
    memory_event("m3", ["Paris"], T0 + 2, text="a weekend in Paris", sessionId="s3"),
    memory_event("b1", ["Rex", "Zermatt"], T0 + 3, owner="bob", text="Rex hiked near Zermatt",
                 sessionId="s4"),
    memory_event("b2", ["Zermatt"], T0 + 4, owner="bob", text="snow in the valley",
                 sessionId="s5"),
)


def ask(text: str, entities: list[str], user: str = "u1", t: int = LATER) -> dict[str, Any]:
    return request(text, user=user, t=t, entities=entities)


async def test_the_tier_finds_what_only_a_shared_entity_connects() -> None:
    store, sink = project(*EVENTS)
    tier = GraphTier(store, sink.graph)
    hits = await tier.search(ask("how is Rex?", ["rex"]), 5, ())
    assert [c.memory_id for c in hits] == ["m1", "m2"]
    assert store.search_lexical(ask("how is Rex?", ["rex"]), 5)[0].memory_id == "m1"
    assert all(c.confidence == store.records[c.memory_id].confidence for c in hits)


async def test_earlier_hits_seed_the_walk_and_are_not_returned_again() -> None:
    store, sink = project(*EVENTS)
    seed = store.records["m1"].candidate(1.0)
    hits = await GraphTier(store, sink.graph).search(ask("and then?", []), 5, (seed,))
    assert [c.memory_id for c in hits] == ["m2"]


async def test_one_user_never_gets_anothers_memories() -> None:
    store, sink = project(*EVENTS)
    tier = GraphTier(store, sink.graph)
    alice = await tier.search(ask("Rex", ["rex"], user="u1"), 10, ())
    bob = await tier.search(ask("Rex", ["rex"], user="bob"), 10, ())
    assert {c.owner for c in alice} == {"u1"} and {c.owner for c in bob} == {"bob"}
    assert [c.memory_id for c in bob] == ["b1", "b2"]


async def test_revoked_and_later_memories_are_not_returned() -> None:
    store, sink = project(*EVENTS, memory_event("m4", ["Rex", "Paris"], LATER + 5))
    tier = GraphTier(store, sink.graph)
    assert "m4" not in [c.memory_id for c in await tier.search(ask("Rex", ["rex"]), 10, ())]
    store2, sink2 = project(*EVENTS, revoke_event("m1"))
    assert await GraphTier(store2, sink2.graph).search(ask("Rex", ["rex"]), 10, ()) == []


def fact(mid: str, obj: str, ents: list[str], t: int, correction: bool = False) -> dict:
    return memory_event(mid, ents, t, op="fact_proposed", kind="fact", subject="city",
                        predicate="is", object=obj, text=f"city is {obj}",
                        attributes={"correction": "1" if correction else "0"})


async def test_a_superseded_fact_is_not_walked() -> None:
    """The store revokes a corrected fact without a revocation event; the walk asks it."""
    store, sink = project(fact("f1", "Porto", ["Porto", "Douro"], T0),
                          fact("f2", "Lyon", ["Lyon"], T0 + 1, correction=True),
                          memory_event("m9", ["Douro"], T0 + 2, text="a boat on the river"))
    assert store.records["f1"].revoked and not sink.graph.memories["f1"].revoked
    req = ask("Porto", ["porto"])
    unvetoed = View(scope_chain(req), LATER)
    assert "m9" in sink.graph.subgraph([entity_node("porto")], unvetoed)  # the bridge exists
    assert await GraphTier(store, sink.graph).search(req, 10, ()) == []


async def test_a_big_walk_yields_to_the_event_loop() -> None:
    evs = [memory_event(f"m{i:03}", ["Hub", f"E{i % 17}", f"F{i % 5}"], T0 + i) for i in range(300)]
    store, sink = project(*evs)
    ticks = 0

    async def other_work() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    bg = asyncio.create_task(other_work())
    await asyncio.sleep(0)
    before = ticks
    tier = GraphTier(store, sink.graph, GraphConfig(step_pushes=1))
    hits = await tier.search(ask("e3 and f1", ["e3", "f1"]), 20, ())
    during = ticks - before
    bg.cancel()
    assert len(hits) == 20 and during > 10  # the loop ran other work between push steps
    again = await GraphTier(store, sink.graph).search(ask("e3 and f1", ["e3", "f1"]), 20, ())
    assert [(c.memory_id, c.relevance) for c in again] == [(c.memory_id, c.relevance)
                                                           for c in hits]


async def test_proposed_links_come_back_through_the_fold() -> None:
    evs = [memory_event("m1", ["Rex", "Kite"], T0), memory_event("m2", ["Kite", "Rex"], T0 + 1),
           memory_event("m3", ["Kite", "Lake"], T0 + 2)]
    store, sink = project(*evs)
    (link,) = sink.take_proposals()
    assert sink.take_proposals() == []  # taken once
    store.apply(link)
    sink.on_event(link)
    assert link["memoryId"] in sink.graph.links
    sink.on_event(memory_event("m4", ["Rex", "Kite"], T0 + 3))
    assert sink.take_proposals() == []  # same first evidence: already held
    hits = await GraphTier(store, sink.graph).search(ask("Rex", ["rex"]), 10, ())
    assert link["memoryId"] not in [c.memory_id for c in hits]  # a link is never a candidate


# ------------------------------------------------------------------ inside recall (G-05)


class BrokenGraph(GraphState):
    def neighbours(self, *args: Any, **kw: Any) -> list:
        raise RuntimeError("graph projection is corrupt")


async def test_graph_runs_only_when_hits_are_few_and_adds_to_the_lexical_answer() -> None:
    store, sink = project(*EVENTS)
    tiers = [TierSpec(LexicalTier(store)),
             TierSpec(GraphTier(store, sink.graph), timeout_s=1.0, only_when_fewer_than=3)]
    res = await recall(ask("how is Rex?", ["rex"]), tiers, 5)
    assert res.tiers == {"lexical": "ok", "graph": "ok"}
    assert [c.memory_id for c in res.candidates][:1] == ["m1"]
    assert "m2" in [c.memory_id for c in res.candidates]
    enough = [tiers[0], replace(tiers[1], only_when_fewer_than=1)]
    res = await recall(ask("how is Rex?", ["rex"]), enough, 5)
    assert res.tiers["graph"] == "skipped" and "m2" not in [c.memory_id for c in res.candidates]


async def test_a_failing_graph_tier_leaves_the_lexical_answer() -> None:
    store, sink = project(*EVENTS)
    broken = GraphState.__new__(BrokenGraph)
    broken.__dict__.update(sink.graph.__dict__)
    lexical = await recall(ask("how is Rex?", ["rex"]), [TierSpec(LexicalTier(store))], 5)
    for graph_tier in (GraphTier(store, broken), FaultyTier(GraphTier(store, sink.graph))):
        res = await recall(ask("how is Rex?", ["rex"]),
                           [TierSpec(LexicalTier(store)),
                            TierSpec(graph_tier, only_when_fewer_than=5)], 5)
        assert res.tiers == {"lexical": "ok", "graph": "error"} and not res.failed
        assert res.candidates == lexical.candidates
