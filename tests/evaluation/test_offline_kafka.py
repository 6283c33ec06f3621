"""The offline replay agrees with the Kafka evaluation, question by question (needs the broker)."""

from __future__ import annotations

import polars as pl
import pytest

from mnemoflow.agents.tuning import load_tuning
from mnemoflow.evaluation import offline
from mnemoflow.evaluation.embed_cache import DiskCachedEmbedder
from mnemoflow.evaluation.run import run_eval
from mnemoflow.projections.embedding import MiniLMEmbedder

pytestmark = pytest.mark.kafka


def test_offline_and_kafka_give_the_same_per_question_figures(kafka_bootstrap, shared_dir,
                                                              tmp_path):
    bench = offline.load_bench("locomo", shared_dir / "data" / "locomo" / "dev.json", 15,
                               ["conv-26"])
    run_eval("locomo", bench, tmp_path / "k", "soft", "test", bootstrap=kafka_bootstrap)
    kafka = pl.read_csv(tmp_path / "k" / "per_question.csv").sort("qid")
    _, off = offline.evaluate(bench, load_tuning(),
                              embedder=DiskCachedEmbedder(MiniLMEmbedder(), tmp_path / "emb"))
    off = off.sort("qid")
    cols = [c for c in off.columns if "@" in c]
    assert kafka["qid"].to_list() == off["qid"].to_list()
    for c in cols:
        assert kafka[c].fill_null(-1).to_list() == pytest.approx(off[c].fill_null(-1).to_list()), c
