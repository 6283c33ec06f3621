"""C-04/G-05: tiers behind timeouts; a failing optional tier leaves the lexical answer."""

from __future__ import annotations

import asyncio

from mnemoflow.agents.recall import FaultyTier, TierSpec, recall

from factories import candidate, request


class StaticTier:
    def __init__(self, name: str, cands, delay: float = 0.0) -> None:
        self.name, self.cands, self.delay = name, cands, delay

    async def search(self, req, k, seeds):
        await asyncio.sleep(self.delay)
        return list(self.cands)


LEX = StaticTier("lexical", [candidate("a", "Caroline went hiking", 5.0),
                             candidate("b", "Melanie paints", 2.0)])


async def test_vector_error_falls_back_to_lexical() -> None:
    res = await recall(request(), [TierSpec(LEX), TierSpec(FaultyTier(StaticTier("vector", [])))],
                       10)
    assert res.tiers == {"lexical": "ok", "vector": "error"} and not res.failed
    assert [c.memory_id for c in res.candidates] == ["a", "b"]


async def test_vector_timeout_falls_back_to_lexical() -> None:
    slow = StaticTier("vector", [candidate("z", "late", 9.0)], delay=1.0)
    res = await recall(request(), [TierSpec(LEX), TierSpec(slow, timeout_s=0.05)], 10)
    assert res.tiers["vector"] == "timeout" and [c.memory_id for c in res.candidates] == ["a", "b"]


async def test_fusion_rewards_agreement_and_records_tiers() -> None:
    vec = StaticTier("vector", [candidate("b", "Melanie paints", 0.9),
                                candidate("c", "Dana cooks", 0.8)])
    res = await recall(request(), [TierSpec(LEX), TierSpec(vec)], 10)
    top = res.candidates[0]
    assert top.memory_id == "b" and top.tiers == ("lexical", "vector")


async def test_graph_tier_runs_only_when_hits_are_few() -> None:
    graph = StaticTier("graph", [candidate("g", "linked", 1.0)])
    res = await recall(request(), [TierSpec(LEX), TierSpec(graph, only_when_fewer_than=2)], 10)
    assert res.tiers["graph"] == "skipped"
    res = await recall(request(), [TierSpec(LEX), TierSpec(graph, only_when_fewer_than=5)], 10)
    assert res.tiers["graph"] == "ok"


async def test_all_tiers_failing_is_a_failed_recall() -> None:
    res = await recall(request(), [TierSpec(FaultyTier(LEX))], 10)
    assert res.failed and res.candidates == ()


async def test_fusion_keeps_each_tiers_own_score() -> None:
    vec = StaticTier("vector", [candidate("b", "Melanie paints", 0.9),
                                candidate("c", "Dana cooks", 0.8)])
    res = await recall(request(), [TierSpec(LEX), TierSpec(vec)], 10)
    scores = {c.memory_id: dict(c.tier_scores) for c in res.candidates}
    assert scores == {"a": {"lexical": 5.0}, "b": {"lexical": 2.0, "vector": 0.9},
                      "c": {"vector": 0.8}}
