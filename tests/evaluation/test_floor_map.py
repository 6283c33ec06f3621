"""A floor carried to another model's scale keeps the share of pairs it lets through."""

from __future__ import annotations

import numpy as np
import pytest

from mnemoflow.evaluation.floor_map import carry, pair_similarities

from factories import HashEmbedder, tiny_bench


def test_a_floor_keeps_its_share_under_a_monotone_change_of_scale() -> None:
    rng = np.random.default_rng(7)
    source = rng.normal(0.2, 0.1, 10_000)
    target = 0.7 + 0.3 * source  # another model: the same order, a compressed scale
    share, value = carry(0.35, source, target)
    assert share == pytest.approx(float((source < 0.35).mean()))
    assert value == pytest.approx(0.7 + 0.3 * 0.35, abs=2e-3)
    assert float((target < value).mean()) == pytest.approx(share, abs=1e-3)


def test_pairs_are_each_question_against_its_own_user_s_turns() -> None:
    bench = tiny_bench()
    sims = pair_similarities(bench, HashEmbedder())
    per_user = {s.user: 0 for s in bench.sessions}
    for s in bench.sessions:
        per_user[s.user] += len(s.turns)
    assert len(sims) == sum(per_user[q.user] for q in bench.questions)
    assert np.all(np.abs(sims) <= 1 + 1e-6)
