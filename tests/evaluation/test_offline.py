"""The Kafka-free replay: the host SDK's own records, through the in-memory runner, scored by
the Kafka evaluation's metrics."""

from __future__ import annotations

import asyncio

from mnemoflow.agents.tuning import load_tuning
from mnemoflow.evaluation import offline
from mnemoflow.evaluation.metrics import host_provenance

from factories import tiny_bench


def _broker_lists(data) -> dict[str, list[str]]:
    return {a["sessionId"]: [host_provenance(c["provenance"]) for c in a["candidates"]
                             if c["outcome"] != "visible"]
            for a in data.audit if a["stage"] == "broker"}


def test_lexical_replay_finds_the_evidence_and_never_another_users_memory() -> None:
    bench = tiny_bench()
    _, df, data, _ = offline.evaluate(bench, load_tuning(), vector=False, with_baselines=False)
    assert set(df["gate_action"].to_list()) <= {"retrieve", "prefetch"}
    lists = _broker_lists(data)
    assert lists["u/q/u/q0"][0] == "D1:1" and lists["u/q/u/q1"][0] == "D2:1"
    owners = {c["owner"] for a in data.audit if a["stage"] == "broker" for c in a["candidates"]}
    assert owners == {"u"}
    assert df.sort("qid")["turn_recall@1"].to_list() == [1.0, 1.0]
    claimed = [op for op in data.inbox if op["op"] == "claim"]
    assert {op["sessionId"] for op in claimed} == {"u/q/u/q0", "u/q/u/q1"}


def test_the_replay_is_deterministic() -> None:
    bench = tiny_bench()

    def audits() -> list[dict]:
        _, _, data, _ = offline.evaluate(bench, load_tuning(), vector=False, with_baselines=False)
        return [{k: v for k, v in a.items() if k not in ("emitTime", "ingestTime")}
                for a in data.audit]

    assert audits() == audits()


def test_shadow_mode_audits_and_claims_nothing() -> None:
    runner = offline.runner_for(load_tuning(), vector=False)
    asyncio.run(offline.replay(tiny_bench(), runner, "shadow"))
    assert runner.records("inbox") == []
    assert {a["action"] for a in runner.records("audit") if a["stage"] == "broker"} <= {
        "shadow", "suppress", "drop"}
