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


class _Handshake:
    """Two tiers that can only both answer if they run at the same time: the first waits
    for the second to have started."""

    def __init__(self) -> None:
        self.second_started = asyncio.Event()

    def first(self) -> StaticTier:
        outer = self

        class First(StaticTier):
            async def search(self, req, k, seeds):
                await outer.second_started.wait()
                return list(self.cands)

        return First("lexical", [candidate("a", "Caroline went hiking", 5.0)])

    def second(self) -> StaticTier:
        outer = self

        class Second(StaticTier):
            async def search(self, req, k, seeds):
                outer.second_started.set()
                return list(self.cands)

        return Second("vector", [candidate("a", "Caroline went hiking", 0.9),
                                 candidate("c", "Dana cooks", 0.8)])


async def test_tiers_without_seeds_run_side_by_side_and_merge_in_tier_order() -> None:
    h = _Handshake()
    res = await recall(request(), [TierSpec(h.first(), timeout_s=2.0), TierSpec(h.second())], 10)
    assert res.tiers == {"lexical": "ok", "vector": "ok"}  # one after another: a timeout
    sequential = await recall(request(), [TierSpec(StaticTier("lexical", h.first().cands)),
                                          TierSpec(StaticTier("vector", h.second().cands))], 10)
    assert res.candidates == sequential.candidates


async def test_a_tier_that_uses_seeds_waits_for_the_tiers_before_it() -> None:
    seen: list[tuple[str, ...]] = []

    class Seeded(StaticTier):
        uses_seeds = True

        async def search(self, req, k, seeds):
            seen.append(tuple(sorted(c.memory_id for c in seeds)))
            return []

    vec = StaticTier("vector", [candidate("c", "Dana cooks", 0.8)], delay=0.01)
    await recall(request(), [TierSpec(LEX), TierSpec(vec), TierSpec(Seeded("graph", []))], 10)
    assert seen == [("a", "b", "c")]
