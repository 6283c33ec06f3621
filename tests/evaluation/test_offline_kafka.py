"""Both runners replay LoCoMo conv-26 to the same audits and the same per-question figures
(needs the broker): the Kafka evaluation runs the worker's faust runner, the offline replay
the in-memory runner, over one topology."""

from __future__ import annotations

import json

import pytest

from mnemoflow.evaluation import offline
from mnemoflow.evaluation.run import run_eval

pytestmark = pytest.mark.kafka
# activations are rounded to 6 places, and MiniLM vectors differ in their last float32 bits
# with the batch they were embedded in (the worker embeds as events arrive, the replay in
# large batches): seen up to 4e-6
SCORES = ("score",)


def _audits(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _same(a, b) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(
            a[k] == pytest.approx(b[k], abs=1e-5) if k in SCORES and
            isinstance(a[k], float) else _same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def test_offline_and_kafka_give_the_same_audits_and_figures(kafka_bootstrap, shared_dir, tmp_path):
    bench = offline.load_bench("locomo", shared_dir / "data" / "locomo" / "dev.json", None,
                               ["conv-26"])
    run_eval("locomo", bench, tmp_path / "k", "soft", "test", bootstrap=kafka_bootstrap)
    offline.main(["locomo", str(shared_dir / "data" / "locomo" / "dev.json"),
                  "--conversations", "conv-26", "--out", str(tmp_path / "o")])
    kafka, mem = _audits(tmp_path / "k" / "question_audits.jsonl"), \
        _audits(tmp_path / "o" / "question_audits.jsonl")
    assert len(kafka) == len(mem) >= 2 * len(bench.questions)
    broker = [a for a in kafka if a["stage"] == "broker"]
    assert len(broker) == len(bench.questions) and all(a["candidates"] for a in broker)
    for k, m in zip(kafka, mem, strict=True):
        assert _same(k, m), (k["auditId"], k["stage"])
    assert (tmp_path / "k" / "per_question.csv").read_bytes() == \
        (tmp_path / "o" / "per_question.csv").read_bytes()
