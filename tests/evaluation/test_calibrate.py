"""Calibration: folds, the cached replay equals the full offline path, the search only climbs."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest

from mnemoflow.agents.tuning import load_tuning
from mnemoflow.evaluation import calibrate as C
from mnemoflow.evaluation import offline
from mnemoflow.evaluation.datasets import Question
from mnemoflow.evaluation.metrics import host_provenance

from factories import HashEmbedder, tiny_bench


def _q(qid: str, cat: str) -> Question:
    return Question(qid, "u", "?", 0, cat, frozenset(), frozenset())


def test_longmemeval_folds_are_stratified_and_deterministic() -> None:
    qs = [_q(f"{c}{i}", c) for c in ("temporal", "multi") for i in range(10)]
    f = C.folds_longmemeval(qs)
    assert f == C.folds_longmemeval(list(reversed(qs)))
    for cat in ("temporal", "multi"):
        counts = [sum(1 for q in qs if q.category == cat and f[q.qid] == k) for k in range(5)]
        assert counts == [2] * 5


def test_locomo_folds_are_conversations() -> None:
    qs = [replace(_q(f"q{i}", "1"), user=u) for i, u in enumerate(["conv-2", "conv-1", "conv-2"])]
    assert C.folds_locomo(qs) == {"q0": 1, "q1": 0, "q2": 1}


def _prepared(t):
    bench = tiny_bench()
    return C.prepare("locomo", bench, t, HashEmbedder(), C.folds_locomo(bench.questions))


def test_cached_replay_gives_the_broker_audits_ranked_list() -> None:
    t = load_tuning()
    p = _prepared(t)
    runner = offline.runner_for(t, embedder=HashEmbedder(), graph=False)
    asyncio.run(offline.replay(p.bench, runner, "soft"))
    audits = {a["requestId"]: a for a in runner.records("audit") if a["stage"] == "broker"}
    res = p.recall_results(t)
    assert p.requests
    for qid, req in p.requests.items():
        listed = [host_provenance(c["provenance"]) for c in audits[req["requestId"]]["candidates"]
                  if c["outcome"] != "visible"]
        assert C.ranked_turns(req, res[qid], t.rank) == listed


def test_search_never_returns_a_worse_objective_than_its_start() -> None:
    t = load_tuning()
    bad = C.set_knob(replace(t, rank=replace(t.rank, fusion="convex")), "rank.lexical_share", 0.0)
    p = _prepared(bad)
    split = [(p, list(p.folds))]
    start_score, _, _ = C.objective(split, bad)
    best, trace = C.coordinate_search(split, bad, {"rank.lexical_share": [0.0, 0.5, 1.0]},
                                      log=lambda _: None)
    assert C.objective(split, best)[0] >= start_score
    assert trace[0]["objective"] == start_score
    assert C.get_knob(best, "rank.lexical_share") in (0.0, 0.5, 1.0)


def test_render_lists_every_fold_and_knob() -> None:
    sc = {"turn_recall@10": 0.5, "session_recall_any@5": 1.0}
    fold = {"fold": 0, "held_out": {"locomo": {"questions": 3, "users": ["conv-26"]}},
            "objective_train": 0.7, "objective_held_out": 0.6, "knobs": {"rank.base": 0.1},
            "train": {"locomo": sc, "longmemeval_s": sc},
            "held_out_scores": {"locomo": sc, "longmemeval_s": sc}}
    report = {"space": {"rank.base": [0.0, 0.1]}, "start": {"rank.base": 0.0},
              "final": {"rank.base": 0.1},
              "cross_validation": {"folds": [fold], "pooled_held_out": {"locomo": sc}}}
    text = C.render(report)
    assert "| 0 | conv-26 + LME fold 0 | 0.700 | 0.600 |" in text
    assert "| rank.base | 0.0 | 0.1 | 0.1 |" in text
    assert "| locomo | nan | nan | nan | 0.500 | nan | 1.000 | nan |" in text


def test_cross_validation_can_run_some_folds_only() -> None:
    """`--folds`: a long search split over runs; each fold still holds out only its own."""
    t = load_tuning()
    bench = tiny_bench()
    qids = [q.qid for q in bench.questions]
    p = C.prepare("locomo", bench, t, HashEmbedder(), {qids[0]: 0, qids[1]: 3})
    space = {"rank.base": [t.rank.base]}
    cv = C.cross_validate([p], t, space, log=lambda _: None, only=[3])
    assert [f["fold"] for f in cv["folds"]] == [3]
    assert cv["folds"][0]["held_out"]["locomo"]["questions"] == 1
    everything = C.cross_validate([p], t, space, log=lambda _: None)
    assert [f["fold"] for f in everything["folds"]] == list(range(C.FOLDS))


def test_folds_and_no_cv_are_refused_together(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        C.main(["--locomo", "x", "--longmemeval", "y", "--out", str(tmp_path),
                "--folds", "1", "--no-cv"])


def test_a_search_with_another_model_keeps_every_searched_knob_as_its_own() -> None:
    """Even a searched value equal to MiniLM's is e5's own, so that recalibrating MiniLM later
    leaves e5's fusion be; the lexical share is stored as the tier weights it sets."""
    e5 = load_tuning(model="e5-small-v2")
    minilm = load_tuning()
    assert e5.rank.base == minilm.rank.base
    d = C.tuning_json(e5, {}, "e5-small-v2", ["rank.base", "rank.lexical_share"])
    own = d["models"]["e5-small-v2"]["rank"]
    assert (own["base"], own["tier_weights"]) == (e5.rank.base, e5.rank.tier_weights)
    assert d["rank"]["tier_weights"] == minilm.rank.tier_weights
    assert "max_items" not in own
