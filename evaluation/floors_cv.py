"""Leave-one-fold-out check of a packet floor: does the value chosen on the other folds hold
on the fold left out?

A floor decides which packets are made, never the ranked list, so one offline replay per value
gives every question's packet figures and every user's ordinary-turn packets. For each fold
the value is then chosen on the other folds (the smallest value whose ordinary-turn packets
are within `--target` per 100 events, the issue's criterion), and the held-out fold's figures
are reported beside the training folds'. The folds are `evaluation/CALIBRATION.md`'s: one
LoCoMo conversation, or one fifth of the LongMemEval questions stratified by type.

    python -m mnemoflow.evaluation.floors_cv longmemeval ../shared/data/longmemeval/dev.json.gz \
        --roles user --knob rank.packet_min_coverage --grid 0 0.15 0.2 0.25 0.3 --target 15
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mnemoflow.agents.tuning import load_tuning
from mnemoflow.evaluation.calibrate import folds_locomo, folds_longmemeval, set_knob
from mnemoflow.evaluation.datasets import Benchmark
from mnemoflow.evaluation.offline import evaluate, load_bench
from mnemoflow.streams.config import Settings


@dataclass(frozen=True)
class Run:
    """One replay at one value: per-question rows and per-user ordinary-turn packets."""

    value: float
    questions: dict[str, dict[str, Any]]  # qid -> its row (metrics.per_question)
    packets: Counter[str]  # user -> packets on that user's ordinary turns


def figures(run: Run, qids: Collection[str], quser: dict[str, str],
            events: Counter[str]) -> dict[str, float]:
    """The questions `qids` and their users' ordinary turns, pooled."""
    users = {quser[q] for q in qids}
    rows = [run.questions[q] for q in qids]
    asked = [r for r in rows if not r["abstention"]]
    made = [r for r in asked if r["packet_rate"]]

    def mean(key: str, rs: Sequence[dict[str, Any]]) -> float:
        return sum(r[key] or 0.0 for r in rs) / len(rs) if rs else 0.0

    return {"ordinary_per_100": 100 * sum(run.packets[u] for u in users)
            / max(1, sum(events[u] for u in users)),
            "packets": mean("packet_rate", asked),
            "packet_turn_recall": mean("packet_turn_recall", asked),
            "precision": mean("packet_precision", made),
            "turn_recall@10": mean("turn_recall@10", asked),
            "abstention_packets": sum(r["packet_rate"] for r in rows if r["abstention"])}


def choose(runs: Sequence[Run], qids: Collection[str], quser: dict[str, str],
           events: Counter[str], target: float) -> Run:
    """The smallest value whose ordinary-turn packets on `qids` are within the target (the
    largest value when none is)."""
    by_value = sorted(runs, key=lambda r: r.value)
    for run in by_value:
        if figures(run, qids, quser, events)["ordinary_per_100"] <= target:
            return run
    return by_value[-1]


def cross_validate(runs: Sequence[Run], fold_of: dict[str, int], quser: dict[str, str],
                   events: Counter[str], target: float) -> list[dict[str, Any]]:
    out = []
    for k in sorted(set(fold_of.values())):
        held = [q for q, f in fold_of.items() if f == k]
        train = [q for q, f in fold_of.items() if f != k]
        run = choose(runs, train, quser, events, target)
        out.append({"fold": k, "chosen": run.value,
                    "train": figures(run, train, quser, events),
                    "held_out": figures(run, held, quser, events)})
    return out


def replay_at(bench: Benchmark, knob: str, value: float) -> Run:
    tuning = set_knob(load_tuning(model=Settings().embedding_model), knob, value)
    _, df, data, log = evaluate(bench, tuning, with_baselines=False)
    packets: Counter[str] = Counter(
        log.haystack_sessions[op["sessionId"]] for op in data.inbox
        if op["op"] == "inject" and op["sessionId"] in log.haystack_sessions)
    return Run(value, {r["qid"]: r for r in df.to_dicts()}, packets)


def ordinary_events(bench: Benchmark) -> Counter[str]:
    """Events the host sends on each user's haystack sessions (a lifecycle start and the
    turns), counted as `ReplayLog.haystack_events` counts them."""
    events: Counter[str] = Counter()
    for s in bench.sessions:
        events[s.user] += len(s.turns) + 1
    return events


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mnemoflow.evaluation.floors_cv")
    p.add_argument("benchmark", choices=["locomo", "longmemeval"])
    p.add_argument("file", type=Path)
    p.add_argument("--roles", default="user,assistant")
    p.add_argument("--knob", default="rank.packet_min_coverage")
    p.add_argument("--grid", type=float, nargs="+", required=True)
    p.add_argument("--target", type=float, default=15.0,
                   help="ordinary-turn packets per 100 events the chosen value must keep within")
    p.add_argument("--out", type=Path)
    a = p.parse_args(argv)
    bench = load_bench(a.benchmark, a.file, roles=tuple(a.roles.split(",")))
    fold_of = (folds_locomo if a.benchmark == "locomo" else folds_longmemeval)(bench.questions)
    quser = {q.qid: q.user for q in bench.questions}
    events = ordinary_events(bench)
    runs = [replay_at(bench, a.knob, v) for v in a.grid]
    every = list(fold_of)
    pooled = {run.value: figures(run, every, quser, events) for run in runs}
    folds = cross_validate(runs, fold_of, quser, events, a.target)
    for value, f in pooled.items():
        print(f"{a.knob}={value:g} pooled: " + ", ".join(f"{k} {v:.3f}" for k, v in f.items()))
    for f in folds:
        tr, te = f["train"], f["held_out"]
        print(f"fold {f['fold']}: chose {f['chosen']:g} (training ordinary "
              f"{tr['ordinary_per_100']:.1f} per 100, packets {tr['packets']:.3f}); held out: "
              f"ordinary {te['ordinary_per_100']:.1f}, packets {te['packets']:.3f}, "
              f"packet turn recall {te['packet_turn_recall']:.3f}")
    if a.out:
        a.out.write_text(json.dumps({"knob": a.knob, "target": a.target, "pooled": pooled,
                                     "folds": folds}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
