"""Offline calibration of the retrieval weights, with cross-validation so it cannot hide overfitting.

Procedure (what `python -m mnemoflow.evaluation.calibrate` runs):

1. Both dev benchmarks are replayed offline once (`offline.observe_haystack`), and each
   question's RecallRequest comes from the real gate.
2. Folds: LoCoMo leave-one-conversation-out (5 conversations = 5 folds); LongMemEval_S
   questions are put in 5 folds stratified by question type (within a type, ordered by the
   SHA-256 of the question id and dealt round-robin). Fold k holds out LoCoMo conversation k
   and LongMemEval fold k together.
3. Objective on a set of questions: turn recall@10 (abstention questions excluded, as in the
   reports), averaged first within a benchmark family and then over families, so LoCoMo
   weighs as much as LongMemEval; with `--oracle` the LongMemEval family is the mean of
   LongMemEval_S (user turns) and the oracle variant (user and assistant turns, which the S
   run does not index). Turn recall@5 breaks ties. The oracle shares its question ids with
   S; folds are computed over the union of ids, so a question is held out in both at once.
4. Search: coordinate ascent from the current tuning over a fixed grid (SPACE): each round
   tries every value of every knob with the others fixed and keeps the best (a change must
   gain at least MIN_GAIN, so ties keep the current value); at most ROUNDS rounds.
5. Cross-validation: for each fold the search runs on the other four folds' questions and the
   result is scored on the held-out fold. The pooled held-out figure (every question scored
   by weights not tuned on it) is the estimate of what the procedure generalises to.
6. The weights written to tuning.json come from the same search on all dev questions.

Speed: a tier's hits depend only on the knobs of its own index, so lexical and vector hits
are cached per index configuration and recall's fusion is replayed over them (the same
`recall()`); rank knobs then re-rank the cached candidates. The memory-log, the stores and the
vectors are built by the same code the worker runs (MemoryStore, VectorSink).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from mnemoflow.agents.broker import audit_candidates
from mnemoflow.agents.candidate import Candidate
from mnemoflow.agents.partitioning import partition_of, request_key
from mnemoflow.agents.rank import rank
from mnemoflow.agents.recall import RecallResult, TierSpec, recall
from mnemoflow.agents.tuning import IndexTuning, RankTuning, Tuning, load_tuning, models_json
from mnemoflow.evaluation import offline
from mnemoflow.evaluation.datasets import Benchmark, Question, session_of
from mnemoflow.evaluation.metrics import host_provenance
from mnemoflow.projections.array_index import ArrayIndex
from mnemoflow.projections.embedding import AsyncEmbedder, Embedder, as_queries
from mnemoflow.projections.memory_store import MemoryStore
from mnemoflow.projections.vector_tier import VectorSink, VectorTier, index_meta
from mnemoflow.streams.config import Settings

FOLDS = 5
ROUNDS = 3
MIN_GAIN = 1e-4
KS = (1, 3, 5, 10, 25)

# knob -> grid; "index.*" and "rank.*" name IndexTuning / RankTuning fields,
# "rank.lexical_share" sets tier_weights to {lexical: x, vector: 1 - x}
SPACE: dict[str, list[Any]] = {
    "rank.fusion": ["rrf", "convex"],
    "rank.lexical_share": [0.4, 0.5, 0.6, 0.7, 0.8],
    "index.context_weight": [0.0, 0.25, 0.5, 0.75, 1.0],
    "index.context_max_terms": [16, 32, 64],
    "index.bm25_b": [0.3, 0.5, 0.75],
    "index.bm25_k1": [0.9, 1.2, 1.6],
    "index.vector_context_weight": [0.0, 0.25, 0.5, 0.75],
    "rank.next_weight": [0.0, 0.1, 0.2, 0.3],
    "rank.session_weight": [0.0, 0.1, 0.2, 0.3],
    "rank.recency": [0.0, 0.05, 0.15],
    "rank.salience": [0.0, 0.03, 0.05, 0.1, 0.2],
    "rank.time_window_bonus": [0.0, 0.15, 0.3, 0.5],
    "rank.base": [0.0, 0.1, 0.3],
    "rank.recall_k": [50, 100],
}


def knob_field(knob: str) -> str:
    """The tuning field a knob of SPACE sets ("section.name"): the lexical share is a view of
    the tier weights."""
    return "rank.tier_weights" if knob == "rank.lexical_share" else knob


def get_knob(t: Tuning, knob: str) -> Any:
    section, name = knob.split(".", 1)
    if name == "lexical_share":
        return t.rank.tier_weights.get("lexical", 1.0) if t.rank.tier_weights else None
    return getattr(getattr(t, section), name)


def set_knob(t: Tuning, knob: str, value: Any) -> Tuning:
    section, name = knob.split(".", 1)
    if name == "lexical_share":
        return replace(t, rank=replace(t.rank, tier_weights={"lexical": value,
                                                             "vector": round(1 - value, 6)}))
    if section == "index":
        return replace(t, index=replace(t.index, **{name: value}))
    return replace(t, rank=replace(t.rank, **{name: value}))


def folds_longmemeval(questions: Sequence[Question], k: int = FOLDS) -> dict[str, int]:
    """qid -> fold: stratified by type, ordered by a hash of the id, dealt round-robin."""
    out: dict[str, int] = {}
    by_type: dict[str, list[str]] = {}
    for q in questions:
        by_type.setdefault(q.category, []).append(q.qid)
    offset = 0
    for cat in sorted(by_type):
        ids = sorted(by_type[cat], key=lambda x: hashlib.sha256(x.encode()).hexdigest())
        for i, qid in enumerate(ids):
            out[qid] = (offset + i) % k
        offset += len(ids)
    return out


def folds_locomo(questions: Sequence[Question]) -> dict[str, int]:
    """qid -> fold: the index of its conversation among the sorted conversation ids."""
    convs = sorted({q.user for q in questions})
    return {q.qid: convs.index(q.user) for q in questions}


class CachedTier:
    """A recall tier that answers from precomputed hits (same objects, same order)."""

    def __init__(self, name: str, hits: dict[str, list[Candidate]]) -> None:
        self.name, self.hits = name, hits

    async def search(self, request: dict[str, Any], k: int,
                     seeds: Sequence[Candidate]) -> list[Candidate]:
        return list(self.hits[request["requestId"]])


def _put(cache: dict[Any, Any], key: Any, value: Any, cap: int) -> Any:
    """Insert into a small cache, evicting the least recently used entries past `cap`."""
    cache[key] = value
    while len(cache) > cap:
        cache.pop(next(iter(cache)))
    return value


def _hit(cache: dict[Any, Any], key: Any) -> Any:
    """The cached value (None if absent), marked as the most recently used."""
    if key not in cache:
        return None
    cache[key] = cache.pop(key)
    return cache[key]


def _lex_key(t: IndexTuning) -> tuple[Any, ...]:
    return (t.bm25_k1, t.bm25_b, t.context_weight, t.context_max_terms)


@dataclass
class Prepared:
    """One benchmark replayed once: memory-log, gate requests, and per-config caches."""

    name: str
    bench: Benchmark
    events: list[dict[str, Any]]
    requests: dict[str, dict[str, Any]]  # qid -> RecallRequest (questions the gate fired on)
    embedder: AsyncEmbedder
    folds: dict[str, int]
    partitions: int = 1  # the runner's: lexical statistics are per partition, as there
    stores: dict[tuple[Any, ...], PartitionStores] = field(default_factory=dict)
    vectors: dict[float, Any] = field(default_factory=dict)
    lex_hits: dict[tuple[Any, ...], dict[str, list[Candidate]]] = field(default_factory=dict)
    vec_hits: dict[tuple[Any, ...], dict[str, list[Candidate]]] = field(default_factory=dict)
    results: dict[tuple[Any, ...], dict[str, RecallResult]] = field(default_factory=dict)

    @property
    def questions(self) -> dict[str, Question]:
        return {q.qid: q for q in self.bench.questions}

    def store(self, t: Tuning) -> PartitionStores:
        key = _lex_key(t.index)
        if (hit := _hit(self.stores, key)) is not None:
            return hit
        return _put(self.stores, key, PartitionStores.fold(self.events, t, self.partitions), 2)

    def vector_index(self, t: Tuning) -> Any:
        key = t.index.vector_context_weight
        if (hit := _hit(self.vectors, key)) is not None:
            return hit
        return _put(self.vectors, key, build_vectors(self.events, t, self.embedder), 2)

    def recall_results(self, t: Tuning) -> dict[str, RecallResult]:
        """Recall for every request under the index knobs of `t` (cached per configuration)."""
        k = t.rank.recall_k
        lk, vk = (*_lex_key(t.index), k), (t.index.vector_context_weight, k)
        key = (*lk, *vk)
        if (hit := _hit(self.results, key)) is not None:
            return hit
        if _hit(self.lex_hits, lk) is None:
            store = self.store(t)
            _put(self.lex_hits, lk, {r["requestId"]: store.search_lexical(r, k)
                                     for r in self.requests.values()}, 12)
        if _hit(self.vec_hits, vk) is None:
            tier = VectorTier(self.store(t).whole, self.vector_index(t), self.embedder)

            async def go() -> dict[str, list[Candidate]]:
                return {r["requestId"]: await tier.search(r, k, ())
                        for r in self.requests.values()}

            _put(self.vec_hits, vk, asyncio.run(go()), 8)
        tiers = [TierSpec(CachedTier("lexical", self.lex_hits[lk])),
                 TierSpec(CachedTier("vector", self.vec_hits[vk]))]

        async def fuse() -> dict[str, RecallResult]:
            return {qid: await recall(r, tiers, k) for qid, r in self.requests.items()}

        return _put(self.results, key, asyncio.run(fuse()), 3)


def fold_store(events: Sequence[dict[str, Any]], tuning: Tuning) -> MemoryStore:
    """A lexical store for these index knobs, folded from the replay's memory-log."""
    store = MemoryStore(index=tuning.index)
    for ev in events:
        store.apply(ev)
    return store


@dataclass
class PartitionStores:
    """The memory-log folded per partition, as the runner folds it (lexical scores use each
    partition's statistics), and whole (for the vector tier's record lookups)."""

    partitions: int
    parts: dict[int, MemoryStore]
    whole: MemoryStore

    @classmethod
    def fold(cls, events: Sequence[dict[str, Any]], tuning: Tuning,
             partitions: int) -> PartitionStores:
        by_part: dict[int, list[dict[str, Any]]] = {}
        for ev in events:
            by_part.setdefault(partition_of(ev["owner"], partitions), []).append(ev)
        return cls(partitions, {p: fold_store(evs, tuning) for p, evs in by_part.items()},
                   fold_store(events, tuning))

    def search_lexical(self, request: dict[str, Any], k: int) -> list[Candidate]:
        store = self.parts.get(partition_of(request_key(request), self.partitions))
        return store.search_lexical(request, k) if store is not None else []


def build_vectors(events: Sequence[dict[str, Any]], tuning: Tuning,
                  embedder: AsyncEmbedder) -> ArrayIndex:
    """An in-memory vector index for these index knobs, fed by the worker's VectorSink."""
    index = ArrayIndex(index_meta(embedder, tuning.index))
    sink = VectorSink(index, embedder, batch=512, timeout_s=3600.0,
                      context_weight=tuning.index.vector_context_weight,
                      embed_max_chars=tuning.index.embed_max_chars)
    for ev in events:
        sink.on_event(ev)
    asyncio.run(sink.flush())
    return index


def prepare(name: str, bench: Benchmark, tuning: Tuning, embedder: Embedder,
            folds: dict[str, int]) -> Prepared:
    """The benchmark replayed once through the in-memory runner (lexical only: the vectors
    are built per configuration below); its memory-log and the questions' requests."""
    runner = offline.runner_for(tuning, vector=False, graph=False)
    log = asyncio.run(offline.replay(bench, runner, "soft"))
    asked = {sid for sid in log.question_sessions}
    reqs = {log.question_sessions[r["sessionId"]]: r for r in runner.records("recall-requests")
            if r["sessionId"] in asked}
    # one batch, then cache hits
    embedder.embed(as_queries(embedder, sorted({r["text"] for r in reqs.values()})))
    return Prepared(name, bench, runner.records("memory-log"), reqs, AsyncEmbedder(embedder),
                    folds, runner.memory.partitions)


def ranked_turns(request: dict[str, Any], result: RecallResult, t: RankTuning) -> list[str]:
    """The turn ids the broker's audit lists (`broker.audit_candidates`), without the
    question's own visible items (what metrics.per_question reads)."""
    ranked = rank(result.candidates, request, (), "calibration", t)
    return [host_provenance(c["provenance"]) for c in audit_candidates(ranked, {}, t)
            if c["outcome"] != "visible"]


def question_scores(q: Question, turns: list[str]) -> dict[str, float]:
    out: dict[str, float] = {}
    if q.evidence_turns:
        for k in KS:
            out[f"turn_recall@{k}"] = len(q.evidence_turns & set(turns[:k])) / len(q.evidence_turns)
    if q.evidence_sessions:
        sessions = list(dict.fromkeys(session_of(x) for x in turns))
        for k in (5, 10):
            out[f"session_recall_any@{k}"] = float(bool(q.evidence_sessions & set(sessions[:k])))
    return out


def evaluate(p: Prepared, qids: Sequence[str], t: Tuning) -> dict[str, float]:
    """Mean scores over `qids` (abstention questions excluded; a question the gate did not
    fire on scores zero)."""
    res = p.recall_results(t)
    qs = p.questions
    sums: dict[str, list[float]] = {}
    for qid in qids:
        q = qs[qid]
        if q.abstention:
            continue
        turns = ranked_turns(p.requests[qid], res[qid], t.rank) if qid in res else []
        for m, v in question_scores(q, turns).items():
            sums.setdefault(m, []).append(v)
    return {m: float(np.mean(v)) for m, v in sorted(sums.items())}


Split = list[tuple[Prepared, list[str]]]


def family(name: str) -> str:
    return name.split("_")[0]


def _family_mean(per: dict[str, dict[str, float]], metric: str) -> float:
    fams: dict[str, list[float]] = {}
    for name, s in per.items():
        fams.setdefault(family(name), []).append(s.get(metric, 0.0))
    return float(np.mean([np.mean(v) for v in fams.values()]))


def objective(split: Split, t: Tuning) -> tuple[float, float, dict[str, dict[str, float]]]:
    per = {p.name: evaluate(p, qids, t) for p, qids in split}
    return _family_mean(per, "turn_recall@10"), _family_mean(per, "turn_recall@5"), per


def coordinate_search(split: Split, start: Tuning, space: dict[str, list[Any]],
                      log: Callable[[str], None] = print) -> tuple[Tuning, list[dict[str, Any]]]:
    best = start
    b_main, b_tie, _ = objective(split, best)
    trace = [{"round": 0, "knob": None, "value": None, "objective": b_main}]
    for rnd in range(1, ROUNDS + 1):
        improved = False
        for knob, grid in space.items():
            current = get_knob(best, knob)
            for value in grid:
                if value == current:
                    continue
                cand = set_knob(best, knob, value)
                main, tie, _ = objective(split, cand)
                if main > b_main + MIN_GAIN or (abs(main - b_main) <= MIN_GAIN
                                                and tie > b_tie + MIN_GAIN):
                    best, b_main, b_tie, current = cand, main, tie, value
                    improved = True
                    trace.append({"round": rnd, "knob": knob, "value": value,
                                  "objective": round(main, 4)})
                    log(f"  round {rnd}: {knob} = {value} -> {main:.4f}")
        if not improved:
            break
    return best, trace


def knobs(t: Tuning, space: dict[str, list[Any]]) -> dict[str, Any]:
    return {k: get_knob(t, k) for k in space}


def cross_validate(preps: list[Prepared], start: Tuning, space: dict[str, list[Any]],
                   log: Callable[[str], None] = print,
                   only: Sequence[int] | None = None) -> dict[str, Any]:
    """Every fold's search and held-out score (`only`: these folds, so a long run can be
    split; the pooled figure then covers only their questions)."""
    folds = []
    pooled: dict[str, dict[str, list[float]]] = {p.name: {} for p in preps}
    for k in (range(FOLDS) if only is None else sorted(set(only))):
        train = [(p, [q for q, f in p.folds.items() if f != k]) for p in preps]
        test = [(p, [q for q, f in p.folds.items() if f == k]) for p in preps]
        t0 = time.monotonic()
        log(f"fold {k}: held out " + ", ".join(
            f"{p.name} {len(qids)} questions" for p, qids in test))
        chosen, trace = coordinate_search(train, start, space, log)
        _, _, start_train = objective(train, start)
        _, _, start_test = objective(test, start)
        main_tr, _, per_train = objective(train, chosen)
        main_te, _, per_test = objective(test, chosen)
        for p, qids in test:
            for qid in qids:
                q = p.questions[qid]
                if q.abstention:
                    continue
                res = p.recall_results(chosen)
                turns = ranked_turns(p.requests[qid], res[qid], chosen.rank) if qid in res else []
                for m, v in question_scores(q, turns).items():
                    pooled[p.name].setdefault(m, []).append(v)
        folds.append({"fold": k,
                      "held_out": {p.name: {"questions": len(qids),
                                            "users": sorted({p.questions[q].user for q in qids})
                                            if p.name == "locomo" else None}
                                   for p, qids in test},
                      "knobs": knobs(chosen, space), "trace": trace,
                      "train": per_train, "held_out_scores": per_test,
                      "train_at_start": start_train, "held_out_at_start": start_test,
                      "objective_train": main_tr, "objective_held_out": main_te,
                      "seconds": round(time.monotonic() - t0, 1)})
        log(f"fold {k}: train {main_tr:.4f} held-out {main_te:.4f}")
    return {"folds": folds,
            "pooled_held_out": {n: {m: float(np.mean(v)) for m, v in sorted(d.items())}
                                for n, d in pooled.items()}}


def render(report: dict[str, Any]) -> str:
    """Markdown tables of a calibration.json: per-fold train / held-out and the pooled figure."""
    lines = ["| fold | held out | objective train | objective held-out | "
             "LoCoMo tr@10 train / held-out | LME_S tr@10 train / held-out | "
             "LME_S sa@5 held-out | LME oracle tr@10 train / held-out |",
             "|---|---|---|---|---|---|---|---|"]
    cv = report.get("cross_validation", {})
    for f in cv.get("folds", []):
        lo = f["held_out"].get("locomo", {})
        tr, te = f["train"], f["held_out_scores"]
        lines.append(
            f"| {f['fold']} | {', '.join(lo.get('users') or [])} + LME fold {f['fold']} | "
            f"{f['objective_train']:.3f} | {f['objective_held_out']:.3f} | "
            f"{tr['locomo']['turn_recall@10']:.3f} / {te['locomo']['turn_recall@10']:.3f} | "
            f"{tr['longmemeval_s']['turn_recall@10']:.3f} / "
            f"{te['longmemeval_s']['turn_recall@10']:.3f} | "
            f"{te['longmemeval_s'].get('session_recall_any@5', float('nan')):.3f} | "
            + (f"{tr['longmemeval_oracle']['turn_recall@10']:.3f} / "
               f"{te['longmemeval_oracle']['turn_recall@10']:.3f} |"
               if "longmemeval_oracle" in tr else "– |"))
    lines.append("")
    if cv.get("pooled_held_out"):
        lines += ["Pooled held-out (every question scored by weights not tuned on it):", "",
                  "| benchmark | " + " | ".join(f"tr@{k}" for k in KS) + " | sa@5 | sa@10 |",
                  "|---|" + "---|" * (len(KS) + 2)]
        for name, sc in cv["pooled_held_out"].items():
            lines.append(f"| {name} | " + " | ".join(
                f"{sc.get(f'turn_recall@{k}', float('nan')):.3f}" for k in KS) + " | "
                + " | ".join(f"{sc.get(f'session_recall_any@{k}', float('nan')):.3f}"
                             for k in (5, 10)) + " |")
        lines.append("")
    lines += ["Knobs chosen per fold and on all dev questions:", "",
              "| knob | start | " + " | ".join(f"fold {f['fold']}" for f in cv.get("folds", []))
              + " | all dev |", "|---|---|" + "---|" * (len(cv.get("folds", [])) + 1)]
    for knob in report["space"]:
        lines.append(f"| {knob} | {report['start'].get(knob)} | " + " | ".join(
            str(f["knobs"].get(knob)) for f in cv.get("folds", [])) + " | "
            + (str(report["final"].get(knob)) if "final" in report else "–") + " |")
    return "\n".join(lines)


def tuning_json(t: Tuning, calibration: dict[str, Any], model: str,
                space: Iterable[str] = ()) -> dict[str, Any]:
    """The tuning.json of a search: for a model other than MiniLM, every searched knob is
    that model's own (`models_json`)."""
    d = models_json(t, model, [knob_field(k) for k in space])
    d["calibration"] = {**calibration, "embedding_model": model}
    return d


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mnemoflow.evaluation.calibrate",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--locomo", type=Path)
    ap.add_argument("--longmemeval", type=Path, help="LongMemEval_S dev file")
    ap.add_argument("--roles", default="user", help="LongMemEval_S roles indexed (upstream: user)")
    ap.add_argument("--oracle", type=Path, help="LongMemEval oracle dev file (user + assistant)")
    ap.add_argument("--weights", type=Path, help="start from this tuning instead of the packaged")
    ap.add_argument("--no-cv", action="store_true", help="only the final search on all questions")
    ap.add_argument("--folds", type=int, nargs="+", choices=range(FOLDS), metavar="K",
                    help="cross-validate only these folds, and skip the final search")
    ap.add_argument("--knobs", nargs="*", help="search only these knobs of SPACE")
    ap.add_argument("--out", type=Path, help="folder for calibration.json and tuning.json")
    ap.add_argument("--report", type=Path, help="only print the tables of a calibration.json")
    a = ap.parse_args(argv)
    if a.report:
        print(render(json.loads(a.report.read_text())))
        return 0
    if not (a.locomo and a.longmemeval and a.out):
        ap.error("--locomo, --longmemeval and --out are required")
    if a.folds is not None and a.no_cv:
        ap.error("--folds runs cross-validation folds; --no-cv runs none")
    start = load_tuning(a.weights, Settings().embedding_model)
    space = {k: v for k, v in SPACE.items() if not a.knobs or k in a.knobs}
    embedder = offline.default_embedder()
    lo = offline.load_bench("locomo", a.locomo)
    lme = offline.load_bench("longmemeval", a.longmemeval, roles=tuple(a.roles.split(",")))
    ora = offline.load_bench("longmemeval", a.oracle) if a.oracle else None
    lme_folds = folds_longmemeval(list({q.qid: q for q in lme.questions + (
        ora.questions if ora else [])}.values()))
    preps = [prepare("locomo", lo, start, embedder, folds_locomo(lo.questions)),
             prepare("longmemeval_s", lme, start, embedder,
                     {q.qid: lme_folds[q.qid] for q in lme.questions})]
    if ora is not None:
        preps.append(prepare("longmemeval_oracle", ora, start, embedder,
                             {q.qid: lme_folds[q.qid] for q in ora.questions}))
    a.out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"command": "python -m mnemoflow.evaluation.calibrate " + " ".join(
        argv if argv is not None else __import__("sys").argv[1:]),
        "space": space, "start": knobs(start, space), "folds": FOLDS, "rounds": ROUNDS,
        "objective": "turn_recall@10 averaged within, then over benchmark families "
                     "(LoCoMo; LongMemEval) (tie: turn_recall@5)"}
    if not a.no_cv:
        report["cross_validation"] = cross_validate(preps, start, space, only=a.folds)
        if a.folds is not None:  # a piece of a split run: its own file, nothing overwritten
            name = "calibration-folds-" + "-".join(map(str, sorted(set(a.folds)))) + ".json"
            (a.out / name).write_text(json.dumps(report, indent=2))
            return 0
        (a.out / "calibration.json").write_text(json.dumps(report, indent=2))
    everything = [(p, list(p.folds)) for p in preps]
    final, trace = coordinate_search(everything, start, space)
    _, _, per_start = objective(everything, start)
    _, _, per_final = objective(everything, final)
    report.update({"final": knobs(final, space), "final_trace": trace,
                   "all_dev_at_start": per_start, "all_dev_final": per_final,
                   "index": asdict(final.index), "rank": asdict(final.rank)})
    (a.out / "calibration.json").write_text(json.dumps(report, indent=2))
    (a.out / "tuning.json").write_text(json.dumps(tuning_json(final, {
        "procedure": "evaluation/CALIBRATION.md", "command": report["command"]},
        Settings().embedding_model, space), indent=2) + "\n")
    print(json.dumps({"final": report["final"], "all_dev_final": per_final}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
