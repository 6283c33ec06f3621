"""Train the injection classifier (agents/injection_model.py) and report it on the frozen splits.

    .venv/bin/python -m mnemoflow.evaluation.injection_train [--write] [--json PATH]

Data (evaluation/data/injection/, see its README.md):
- train.jsonl: attacks and benign look-alikes written by family, plus the rules' older corpus
  (tests/agents/data/injection_corpus.jsonl), whose figures are therefore reported out of fold;
- frozen.jsonl, frozen2.jsonl and frozen3.jsonl: test sets written separately, each frozen (its
  sha256 is checked) before the training it was first scored on;
- real chats from the dev splits (../shared/data), benign by assumption: every LoCoMo and
  LongMemEval oracle dev turn, and a quarter of the LongMemEval_S sessions; conversations are
  split between a training half and an evaluation half (chat_rows).

Model selection uses 5-fold cross-validation on the training data only (chat turns grouped by
conversation): the inverse L2 strength C (the smallest within one standard error of the best
recall), then the threshold, the lowest one at which the model,
on cross-validated scores, flags at most FPR_LOOKALIKE of the benign look-alikes and FPR_CHAT of
the real chats that the rules pass. The frozen splits are scored once, after that choice.
`--write` saves the weights as agents/injection_model.npz; the threshold goes into
injection_rules.toml's [model] table by hand, from the figure printed here. Needs scikit-learn
(`pip install -e .[train]`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time
import zlib
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mnemoflow.agents.injection_model import (
    BUCKETS,
    InjectionModel,
    counts,
    inverse_document_frequency,
    save_model,
    sigmoid,
)
from mnemoflow.agents.injection_rules import RuleSet, load_rules
from mnemoflow.evaluation.datasets import Session, load_locomo, load_longmemeval

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "evaluation" / "data" / "injection"
SHARED = Path(os.environ.get("MNEMOFLOW_SHARED", REPO.parent / "shared")) / "data"
OLD_CORPUS = REPO / "tests" / "agents" / "data" / "injection_corpus.jsonl"
MODEL_FILE = REPO / "agents" / "injection_model.npz"
FPR_LOOKALIKE = 0.02
FPR_CHAT = 0.002
C_GRID = (10.0, 30.0, 100.0, 300.0, 1000.0)
FROZEN_SPLITS = ("frozen", "frozen2", "frozen3")
SEED = 20261204

Row = dict[str, str]


def read_jsonl(path: Path) -> list[Row]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()
            if line.strip()]


def frozen_rows(name: str = "frozen") -> list[Row]:
    """A frozen split, refused if it changed since it was frozen."""
    path = DATA / f"{name}.jsonl"
    want = (DATA / f"{name}.sha256").read_text().split()[0]
    got = hashlib.sha256(path.read_bytes()).hexdigest()
    if got != want:
        raise SystemExit(f"{path} changed after it was frozen ({got} != {want})")
    return read_jsonl(path)


def chat_rows() -> tuple[list[Row], list[Row]]:
    """Real dev-split turns as benign rows: (training half, evaluation half), by conversation.
    LoCoMo and LongMemEval oracle conversations alternate between the halves; LongMemEval_S
    sessions not in the oracle file add one in eight to each half (chosen by a hash of the
    session id), for the variety of requests people make of assistants."""
    halves: tuple[list[Row], list[Row]] = ([], [])
    oracle = load_longmemeval(SHARED / "longmemeval" / "dev_oracle.json")
    for bench in (load_locomo(SHARED / "locomo" / "dev.json"), oracle):
        users = sorted({s.user for s in bench.sessions})
        half = {u: i % 2 for i, u in enumerate(users)}
        for s in bench.sessions:
            halves[half[s.user]].extend(_turns(s, f"chat-{bench.name}", s.user))
    seen = {s.key for s in oracle.sessions}
    for s in load_longmemeval(SHARED / "longmemeval" / "dev.json.gz").sessions:
        pick = zlib.crc32(s.key.encode()) % 8
        if s.key not in seen and pick < 2:
            seen.add(s.key)
            halves[pick].extend(_turns(s, "chat-longmemeval-s", s.key))
    return halves


def _turns(session: Session, family: str, group: str) -> list[Row]:
    return [{"text": t.text, "label": "benign", "family": family, "group": group}
            for t in session.turns]


def design(rows: Sequence[Row]) -> tuple[Any, np.ndarray]:
    """The training rows as one sparse matrix over the hashed buckets (scipy CSR), weighted as
    featurise weighs a text, and the idf that weighting used (document frequencies over all
    training rows)."""
    from scipy.sparse import csr_matrix, diags

    feats = [counts(r["text"]) for r in rows]
    indptr = np.cumsum([0] + [len(i) for i, _ in feats])
    x = csr_matrix((np.concatenate([v for _, v in feats]),
                    np.concatenate([i for i, _ in feats]), indptr), shape=(len(rows), BUCKETS))
    idf = inverse_document_frequency(np.bincount(x.indices, minlength=BUCKETS), len(rows))
    x = x @ diags(idf.astype(np.float64))
    norms = np.sqrt(np.asarray(x.multiply(x).sum(axis=1)).ravel())
    return (diags(1.0 / np.maximum(norms, 1e-12)) @ x).tocsr(), idf


def fit(x: Any, y: np.ndarray, weight: np.ndarray, docs: np.ndarray, c: float
        ) -> tuple[np.ndarray, float]:
    """Weighted, L2-regularised logistic regression on rows `docs` (scikit-learn, liblinear)."""
    from sklearn.linear_model import LogisticRegression

    sw = weight[docs] * len(docs) / weight[docs].sum()
    lr = LogisticRegression(C=c, solver="liblinear", max_iter=1000)
    lr.fit(x[docs], y[docs], sample_weight=sw)
    return lr.coef_[0].astype(np.float32), float(lr.intercept_[0])


def probabilities(x: Any, w: np.ndarray, b: float) -> np.ndarray:
    return np.asarray(sigmoid(x @ w.astype(np.float64) + b))


def weights_for(rows: Sequence[Row]) -> np.ndarray:
    """Attacks, written benign look-alikes and real chats each carry a third of the weight."""
    group = ["attack" if r["label"] == "attack" else
             "chat" if r["family"].startswith("chat-") else "lookalike" for r in rows]
    count = defaultdict(int)
    for g in group:
        count[g] += 1
    return np.array([1.0 / count[g] for g in group])


def threshold_for(scores: np.ndarray, rows: Sequence[Row], by_rules: np.ndarray) -> float:
    """The lowest threshold at which the model, on cross-validated scores, adds at most the two
    false-positive budgets to what the rules already flag."""
    look = np.array([r["label"] == "benign" and not r["family"].startswith("chat-") for r in rows])
    chat = np.array([r["family"].startswith("chat-") for r in rows])
    for t in np.round(np.arange(0.05, 1.0, 0.01), 2):
        added = ~by_rules & (scores >= t)
        if added[look].mean() <= FPR_LOOKALIKE and added[chat].mean() <= FPR_CHAT:
            return float(t)
    return 0.99


def folds_of(rows: Sequence[Row], folds: int) -> np.ndarray:
    """Each row's fold: chat turns by conversation (a model must not learn a conversation's own
    words and then be scored on its other turns), written texts one by one."""
    rng = np.random.default_rng(SEED)
    groups = sorted({r["group"] for r in rows if "group" in r})
    of_group = dict(zip(groups, rng.permutation(len(groups)) % folds, strict=True))
    single = rng.permutation(len(rows)) % folds
    return np.array([of_group[r["group"]] if "group" in r else single[i]
                     for i, r in enumerate(rows)])


def cross_validate(x: Any, y: np.ndarray, sw: np.ndarray, c: float, fold: np.ndarray
                   ) -> np.ndarray:
    scores = np.zeros(x.shape[0])
    for k in np.unique(fold):
        test = np.flatnonzero(fold == k)
        w, b = fit(x, y, sw, np.flatnonzero(fold != k), c)
        scores[test] = probabilities(x[test], w, b)
    return scores


def figures(rows: Sequence[Row], flagged: Sequence[bool]) -> dict[str, object]:
    """Missed attacks and flagged benign texts, overall and per family."""
    fam: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for r, f in zip(rows, flagged, strict=True):
        wrong = f != (r["label"] == "attack")
        fam[f"{r['label']}/{r['family']}"][0] += int(wrong)
        fam[f"{r['label']}/{r['family']}"][1] += 1
    att = [f for r, f in zip(rows, flagged, strict=True) if r["label"] == "attack"]
    ben = [f for r, f in zip(rows, flagged, strict=True) if r["label"] == "benign"]
    return {"attacks": len(att), "missed": round(1 - sum(att) / len(att), 4) if att else None,
            "benign": len(ben), "flagged": round(sum(ben) / len(ben), 4) if ben else None,
            "families": {k: f"{bad}/{n}" for k, (bad, n) in sorted(fam.items())}}


def verdicts(rows: Sequence[Row], rules: RuleSet, model: InjectionModel
             ) -> dict[str, list[bool]]:
    by_rules = [rules.detect_by_rules(r["text"]).flagged for r in rows]
    by_model = [model.flags(r["text"]) for r in rows]
    return {"rules": by_rules, "model": by_model,
            "combined": [a or b for a, b in zip(by_rules, by_model, strict=True)]}


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--write", action="store_true", help="save agents/injection_model.npz")
    ap.add_argument("--json", type=Path, help="write the figures here")
    ap.add_argument("--cv-only", action="store_true",
                    help="stop after cross-validation: score neither the frozen splits nor others")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    old = [{**r, "source": "old-corpus"} for r in read_jsonl(OLD_CORPUS)]
    written = read_jsonl(DATA / "train.jsonl") + old
    chat_train, chat_eval = chat_rows()
    rows = written + chat_train
    fold = folds_of(rows, 5)
    x, idf = design(rows)
    y = np.array([r["label"] == "attack" for r in rows], float)
    sw = weights_for(rows)
    print(f"training rows: {len(written)} written ({int(y.sum())} attacks), "
          f"{len(chat_train)} chat turns; features in {time.perf_counter() - t0:.1f} s")
    rules = load_rules(model=False)
    by_rules = np.array([rules.detect_by_rules(r["text"]).flagged for r in rows])
    tried: list[tuple[float, float, float, np.ndarray]] = []
    for c in C_GRID:
        cv = cross_validate(x, y, sw, c, fold)
        t = threshold_for(cv, rows, by_rules)
        recall = float((by_rules | (cv >= t))[y == 1].mean())
        print(f"  C={c:g}: cv threshold {t:.2f}, cv attacks caught (with the rules) {recall:.3f}")
        tried.append((c, t, recall, cv))
    # the one-standard-error rule: the most regularised C whose recall is within one standard
    # error of the best, since weak regularisation fits rare n-grams that other data lacks
    top = max(r for _, _, r, _ in tried)
    se = float(np.sqrt(top * (1 - top) / y.sum()))
    c, threshold, _, cv = next(t for t in tried if t[2] >= top - se)
    cv_figures = figures(rows, list(by_rules | (cv >= threshold)))
    print(f"cross-validated with the rules at C={c:g}, threshold {threshold:.2f}: attacks "
          f"missed {cv_figures['missed']}, benign flagged {cv_figures['flagged']}")
    for family, errors in cv_figures["families"].items():  # type: ignore[union-attr]
        print(f"    {family:40} {errors}")
    low = cv < 0.05
    print(f"rule hits the model scores below 0.05: {int((by_rules & low & (y == 1)).sum())} "
          f"attacks, {int((by_rules & low & (y == 0)).sum())} benign")
    if args.cv_only:
        return
    w, b = fit(x, y, sw, np.arange(x.shape[0]), c)
    version = hashlib.sha256(w.astype(np.float32).tobytes()).hexdigest()[:12]
    model = InjectionModel(w.astype(np.float32), idf, b, threshold, version)
    if args.write:
        save_model(MODEL_FILE, w, idf, b, version)
        print(f"wrote {MODEL_FILE} (version {version}); set [model] threshold = {threshold}")
    report: dict[str, object] = {"C": c, "threshold": threshold, "version": version,
                                 "cross_validated": cv_figures,
                                 "train_rows": len(written), "chat_train_rows": len(chat_train)}
    in_old = np.array([r.get("source") == "old-corpus" for r in rows])
    report["old_corpus_out_of_fold"] = {
        "rules": figures(old, list(by_rules[in_old])),
        "model": figures(old, list(cv[in_old] >= threshold)),
        "combined": figures(old, list(by_rules[in_old] | (cv[in_old] >= threshold)))}
    for k, f in report["old_corpus_out_of_fold"].items():
        print(f"{'old corpus (cv)':20} {k:9} attacks missed {f['missed']}  "
              f"benign flagged {f['flagged']}")
    tests = [(name, frozen_rows(name)) for name in FROZEN_SPLITS]
    for name, data in [*tests, ("dev_chats_eval_half", chat_eval)]:
        v = verdicts(data, rules, model)
        report[name] = {k: figures(data, f) for k, f in v.items()}
        for k in ("rules", "model", "combined"):
            f = report[name][k]  # type: ignore[index]
            print(f"{name:20} {k:9} attacks missed {f['missed']}  benign flagged {f['flagged']}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    print(f"done in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
