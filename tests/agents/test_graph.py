"""C-04 tier 3 core: personalized PageRank and the scoped, revocable, time-cut graph fold."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mnemoflow.agents.graph import GraphState, View, entity_node
from mnemoflow.agents.graph_links import link_added, link_revoked
from mnemoflow.agents.ppr import LocalPush, personalized_pagerank, top_nodes

from factories import memory_event, revoke_event

T = 1_000_000
ALICE = frozenset({("User", "alice"), ("Session", "qa")})
BOB = frozenset({("User", "bob"), ("Session", "qb")})


def mem(mid: str, ents: list[str], t: int = T, owner: str = "alice", **kw: Any) -> dict[str, Any]:
    return memory_event(mid, ents, t, owner, **kw)


def revoke(mid: str) -> dict[str, Any]:
    return revoke_event(mid, "alice")


def state(*events: dict[str, Any]) -> GraphState:
    g = GraphState()
    for ev in events:
        g.apply(ev)
    return g


def walk(g: GraphState, seeds: list[str], view: View) -> dict[str, float]:
    personal = {entity_node(s): 1.0 for s in seeds}
    return personalized_pagerank(g.subgraph(personal, view), personal)


def push_walk(g: GraphState, seeds: list[str], view: View, eps: float = 1e-4) -> dict[str, float]:
    personal = {entity_node(s): 1.0 for s in seeds}
    return LocalPush(lambda n: g.neighbours(n, view), lambda n: g.degree(n, view), personal,
                     eps=eps).run()


def memories(scores: dict[str, float]) -> list[str]:
    return [n for n, _ in top_nodes(scores, 100) if not n.startswith("entity:")]


BASE = (mem("m1", ["Rex", "Brighton"]), mem("m2", ["Brighton", "Lisbon"]),
        mem("m3", ["Paris"]))
NOW = View(ALICE, T + 1)

# ------------------------------------------------------------------ PPR


def test_ppr_is_a_distribution_that_decays_with_distance() -> None:
    line = {"a": [("b", 1.0)], "b": [("a", 1.0), ("c", 1.0)], "c": [("b", 1.0), ("d", 1.0)],
            "d": [("c", 1.0)]}
    p = personalized_pagerank(line, {"a": 1.0}, alpha=0.3, iters=200)
    assert sum(p.values()) == pytest.approx(1.0)
    assert p["a"] > p["b"] > p["c"] > p["d"] > 0


def test_ppr_dangling_mass_returns_to_the_seeds() -> None:
    p = personalized_pagerank({"a": [("b", 1.0)]}, {"a": 1.0}, alpha=0.5, iters=200)
    assert sum(p.values()) == pytest.approx(1.0)
    assert p["a"] == pytest.approx(2 / 3) and p["b"] == pytest.approx(1 / 3)


def test_ppr_rejects_a_bad_alpha_and_empty_seeds() -> None:
    with pytest.raises(ValueError):
        personalized_pagerank({}, {"a": 1.0}, alpha=0.0)
    assert personalized_pagerank({"a": [("b", 1.0)]}, {"a": 0.0}) == {}


def test_local_push_converges_to_power_iteration() -> None:
    rnd = random.Random(5)
    g = state(*(mem(f"m{i:02}", sorted({f"E{rnd.randrange(12)}" for _ in range(3)}))
                for i in range(40)), mem("lonely", []))
    personal = {entity_node("e1"): 0.7, entity_node("e2"): 0.3, "lonely": 0.2}
    exact = personalized_pagerank(g.subgraph(personal, NOW, max_hops=50), personal,
                                  alpha=0.3, iters=500, tol=1e-15)
    push = LocalPush(lambda n: g.neighbours(n, NOW), lambda n: g.degree(n, NOW), personal,
                     alpha=0.3, eps=1e-10, max_pushes=10**7).run()
    assert sum(push.values()) == pytest.approx(1.0)
    assert max(abs(push.get(n, 0.0) - exact[n]) for n in exact) < 1e-6
    assert memories(push)[:10] == memories(exact)[:10]


def test_local_push_work_is_bounded_and_skips_hubs() -> None:
    g = state(*(mem(f"m{i:04}", ["Hub", f"E{i}"]) for i in range(3000)))
    asked: list[str] = []

    def nbrs(n: str) -> list[tuple[str, float]]:
        asked.append(n)
        return g.neighbours(n, NOW)

    push = LocalPush(nbrs, lambda n: g.degree(n, NOW), {entity_node("e7"): 1.0}, eps=1e-3)
    scores = push.run()
    assert entity_node("hub") not in asked  # 3000 mentions: never worth a push at this eps
    assert sum(g.degree(n, NOW) for n in asked) <= 1 / (0.5 * 1e-3)
    assert memories(scores)[0] == "m0007"


def test_local_push_steps_give_the_same_scores_as_one_run() -> None:
    g = state(*BASE)
    view, seeds = NOW, {entity_node("rex"): 1.0}
    one = LocalPush(lambda n: g.neighbours(n, view), lambda n: g.degree(n, view), seeds,
                    eps=1e-6).run()
    stepped = LocalPush(lambda n: g.neighbours(n, view), lambda n: g.degree(n, view), seeds,
                        eps=1e-6)
    while not stepped.step(1):
        pass
    assert stepped.scores() == one


def test_top_nodes_breaks_ties_by_id() -> None:
    assert top_nodes({"b": 0.5, "a": 0.5, "c": 0.1, "z": 0.0}, 3) == [
        ("a", 0.5), ("b", 0.5), ("c", 0.1)]


# ------------------------------------------------------------------ walking the graph


def test_a_two_hop_memory_is_reached_only_through_a_shared_entity() -> None:
    ranked = memories(walk(state(*BASE), ["rex"], NOW))
    assert ranked == ["m1", "m2"]  # m2 never mentions Rex; m3 shares nothing


def test_two_users_with_the_same_entity_never_reach_each_other() -> None:
    g = state(*BASE, mem("b1", ["Rex", "Zermatt"], owner="bob"),
              mem("b2", ["Zermatt"], owner="bob"))
    # a link bob's side holds towards alice's memory must not open a door either way
    g.apply(link_added("User", "bob", "b2", "m2", ["b2"], event_time=T, session_id="s",
                       event_seq=1))
    assert memories(walk(g, ["rex"], NOW)) == ["m1", "m2"]
    assert memories(walk(g, ["rex"], View(BOB, T + 1))) == ["b1", "b2"]
    assert not set(g.subgraph([entity_node("rex")], View(BOB, T + 1))) & {"m1", "m2"}


def test_an_explicit_link_spreads_and_its_revocation_stops_it_for_good() -> None:
    link = link_added("User", "alice", entity_node("rex"), entity_node("paris"), ["m1", "m3"],
                      event_time=T, session_id="s", event_seq=2)
    g = state(*BASE, link)
    assert "m3" in memories(walk(g, ["rex"], NOW))
    g.apply(link_revoked(link, "wrong", ["s#9.0"], event_time=T + 5, session_id="s",
                         event_seq=9))
    assert "m3" not in memories(walk(g, ["rex"], View(ALICE, T + 10)))
    again = link_added("User", "alice", entity_node("paris"), entity_node("rex"), ["m3"],
                       event_time=T + 20, session_id="s", event_seq=20)
    assert again["memoryId"] == link["memoryId"]
    g.apply(again)
    assert "m3" not in memories(walk(g, ["rex"], View(ALICE, T + 30)))


def test_a_revoked_memory_neither_shows_nor_bridges() -> None:
    g = state(*BASE, revoke("m1"))
    assert memories(walk(g, ["rex"], NOW)) == []
    assert memories(walk(g, ["brighton"], NOW)) == ["m2"]


def test_a_memory_revoked_before_it_arrives_stays_revoked() -> None:
    g = state(revoke("m1"), *BASE)
    assert memories(walk(g, ["rex"], NOW)) == []


def test_a_link_whose_evidence_was_revoked_has_no_ground() -> None:
    link = link_added("User", "alice", entity_node("rex"), entity_node("paris"), ["m3"],
                      event_time=T, session_id="s", event_seq=2)
    g = state(*BASE, link)
    assert "m3" in memories(walk(g, ["rex"], NOW))
    g.apply({**revoke("m3")})
    g.apply(mem("m4", ["Paris"]))
    assert "m4" not in memories(walk(g, ["rex"], NOW))


def test_the_store_can_veto_a_memory_it_revoked_without_an_event() -> None:
    g = state(*BASE)
    assert memories(walk(g, ["rex"], View(ALICE, T + 1, alive=lambda m: m != "m1"))) == []


def test_only_memories_and_links_before_the_request_are_walked() -> None:
    later = T + 100
    g = state(*BASE, mem("m5", ["Rex", "Paris"], t=later),
              link_added("User", "alice", "m1", "m3", ["m1"], event_time=later,
                         session_id="s", event_seq=3))
    assert memories(walk(g, ["rex"], NOW)) == ["m1", "m2"]
    assert set(memories(walk(g, ["rex"], View(ALICE, later + 1)))) == {"m1", "m2", "m3", "m5"}


def test_an_expired_memory_is_not_walked() -> None:
    g = state(mem("m1", ["Rex", "Brighton"], ttlMs=10), mem("m2", ["Brighton"]))
    assert memories(walk(g, ["rex"], View(ALICE, T + 5))) == ["m1", "m2"]
    assert memories(walk(g, ["rex"], View(ALICE, T + 50))) == []


def test_aliases_join_entities_until_revoked() -> None:
    alias = {**mem("a", []), "eventId": "al", "op": "alias_added", "kind": "alias",
             "subject": "Rexy", "object": "Rex"}
    g = state(*BASE, alias)
    assert memories(walk(g, ["rexy"], NOW)) == ["m1", "m2"]
    g.apply({**alias, "eventId": "al-rv", "op": "alias_revoked"})
    assert memories(walk(g, ["rexy"], NOW)) == []


def test_the_fold_is_idempotent_and_ignores_other_ops() -> None:
    g = state(*BASE)
    assert not g.apply(BASE[0])
    assert not g.apply({**mem("x", []), "eventId": "ev", "op": "evidence_reinforce"})
    assert sorted(g.memories) == ["m1", "m2", "m3"]


def test_subgraph_is_bounded() -> None:
    g = state(*(mem(f"m{i:03}", ["Hub", f"E{i}"]) for i in range(100)))
    sub = g.subgraph([entity_node("hub")], NOW, max_nodes=10)
    assert len(sub) == 10
    assert all(v in sub for nbrs in sub.values() for v, _ in nbrs)  # closed snapshot


SCRIPT = """
import json, random, sys
sys.path[:0] = [{tests!r}, {here!r}]
from test_graph import BASE, NOW, mem, push_walk, state, walk
evs = list(BASE) + [mem(f"x{{i}}", ["Brighton", f"E{{i % 3}}", "Rex" if i % 2 else "Lisbon"])
                    for i in range(30)]
random.Random(int(sys.argv[1])).shuffle(evs)
g = state(*evs)
print(json.dumps([sorted(walk(g, ["rex", "lisbon"], NOW).items()),
                  sorted(push_walk(g, ["rex", "lisbon"], NOW).items())]))
"""


def test_scores_do_not_depend_on_hash_seed_or_arrival_order() -> None:
    code = SCRIPT.format(tests=str(Path(__file__).parents[1]), here=str(Path(__file__).parent))
    outs = set()
    for seed in ("1", "2", "3"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        res = subprocess.run([sys.executable, "-c", code, seed], env=env, capture_output=True,
                             text=True, check=True)
        outs.add(res.stdout)
    assert len(outs) == 1 and json.loads(outs.pop())
