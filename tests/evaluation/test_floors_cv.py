"""The floors' leave-one-fold-out check (evaluation/floors_cv.py): the value is chosen on the
training folds alone, and the held-out figures come from the held-out fold alone."""

from __future__ import annotations

from collections import Counter

from mnemoflow.evaluation.floors_cv import Run, choose, cross_validate, figures

QUSER = {"q0": "u0", "q1": "u1", "q2": "u2"}
FOLD = {"q0": 0, "q1": 1, "q2": 2}
EVENTS = Counter({"u0": 100, "u1": 100, "u2": 100})


def row(packet: float, recall: float = 0.5, abstention: bool = False) -> dict:
    return {"abstention": abstention, "packet_rate": packet, "packet_turn_recall": recall,
            "packet_precision": 0.25, "turn_recall@10": 1.0}


def run(value: float, packets: dict[str, int], made: dict[str, float]) -> Run:
    return Run(value, {q: row(made[q]) for q in QUSER}, Counter(packets))


# a loose value: many ordinary-turn packets; a tight one: few, and q2 loses its packet
LOOSE = run(0.0, {"u0": 30, "u1": 20, "u2": 5}, {"q0": 1.0, "q1": 1.0, "q2": 1.0})
TIGHT = run(0.3, {"u0": 10, "u1": 10, "u2": 2}, {"q0": 1.0, "q1": 1.0, "q2": 0.0})


def test_figures_pool_the_fold_users_ordinary_turns_and_questions() -> None:
    f = figures(LOOSE, ["q0", "q2"], QUSER, EVENTS)
    assert f["ordinary_per_100"] == 17.5 and f["packets"] == 1.0
    abstaining = Run(0.0, {**LOOSE.questions, "q2": row(1.0, abstention=True)}, LOOSE.packets)
    f = figures(abstaining, ["q0", "q2"], QUSER, EVENTS)
    assert f["packets"] == 1.0 and f["abstention_packets"] == 1.0


def test_the_smallest_value_within_the_target_is_chosen() -> None:
    assert choose([TIGHT, LOOSE], ["q0", "q1"], QUSER, EVENTS, 15.0) is TIGHT
    assert choose([TIGHT, LOOSE], ["q2"], QUSER, EVENTS, 15.0) is LOOSE
    # none within: the tightest there is
    assert choose([LOOSE, TIGHT], ["q0"], QUSER, EVENTS, 5.0) is TIGHT


def test_the_held_out_fold_never_takes_part_in_the_choice() -> None:
    folds = {f["fold"]: f for f in cross_validate([LOOSE, TIGHT], FOLD, QUSER, EVENTS, 15.0)}
    # without q2's user (5 per 100) the training folds hold 25 per 100 at the loose value:
    # the tight one is chosen, and q2, held out, loses its packet
    assert folds[2]["chosen"] == 0.3
    assert folds[2]["held_out"] == figures(TIGHT, ["q2"], QUSER, EVENTS)
    assert folds[2]["held_out"]["packets"] == 0.0
    # without q0's user the loose value is within the target (12.5 per 100), so it stays
    assert folds[0]["chosen"] == 0.0 and folds[0]["train"]["ordinary_per_100"] == 12.5
    assert folds[1]["chosen"] == 0.3
