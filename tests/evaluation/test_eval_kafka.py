"""A small replay evaluation inside `make test`: metrics are computed and agree with the packets."""

from __future__ import annotations

import json

import polars as pl
import pytest

from mnemoflow.evaluation.run import load, run_eval

pytestmark = pytest.mark.kafka


def _check(out, name: str, n_questions: int) -> dict:
    res = json.loads((out / "metrics.json").read_text())
    df = pl.read_csv(out / "per_question.csv")
    assert res["pipeline"]["questions"] == df.height == n_questions
    assert res["pipeline"]["harm"]["leaked_items"] == 0
    assert 0.0 <= res["pipeline"]["question_trigger_rate"] <= 1.0
    for col in [c for c in df.columns if "@" in c or c.startswith("packet_")]:
        vals = df[col].drop_nulls()
        assert vals.min() >= 0, col
        if "recall" in col or "ndcg" in col:
            assert vals.max() <= 1.0 + 1e-9, col
    # recall@k never decreases with k, for every question
    for k1, k2 in [(1, 3), (3, 5), (5, 10), (10, 25)]:
        a, b = f"turn_recall@{k1}", f"turn_recall@{k2}"
        if a in df.columns:
            assert (df[b].fill_null(0) >= df[a].fill_null(0) - 1e-9).all()
    # a question with no delivered item cannot have packet recall
    if "packet_turn_recall" in df.columns:
        assert df.filter((pl.col("packet_items") == 0) & (pl.col("packet_turn_recall") > 0)).height == 0
    # the packets the metrics saw are the ones on the inbox: bytes are counted from them
    assert res["pipeline"]["packets"] >= df.filter(pl.col("packet_items") > 0).height
    for f in ("report.md", "recall_at_k.png", "latency_cdf.png", "packets_per_100.png",
              "per_category.png"):
        assert (out / f).stat().st_size > 0
    assert res["mode"] in ("soft", "shadow")
    return res


def test_small_locomo_and_longmemeval_oracle_runs(kafka_bootstrap, shared_dir, tmp_path):
    data = shared_dir / "data"
    lo = load("locomo", data / "locomo" / "dev.json", 30, ["conv-26"], ("user",))
    res = run_eval("locomo", lo, tmp_path / "locomo", "soft", "test", bootstrap=kafka_bootstrap)
    _check(tmp_path / "locomo", "locomo", 30)
    assert res["pipeline"]["packets"] > 0
    lme = load("longmemeval", data / "longmemeval" / "dev_oracle.json", 10, None,
               ("user", "assistant"))
    run_eval("longmemeval", lme, tmp_path / "lme", "shadow", "test", bootstrap=kafka_bootstrap)
    res = _check(tmp_path / "lme", "longmemeval", 10)
    # shadow mode: decisions recorded, nothing injected
    assert res["pipeline"]["packets"] == 0
