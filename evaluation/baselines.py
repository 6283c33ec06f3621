"""Baselines over the same turns in the same run: BM25 (rank_bm25) and flat cosine on the
configured embedding model (MiniLM by default)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np
from rank_bm25 import BM25Okapi

from mnemoflow.agents.text import tokens
from mnemoflow.evaluation.datasets import Benchmark
from mnemoflow.projections.embedding import Embedder, as_passages, as_queries

TOP = 25


def bm25(bench: Benchmark) -> dict[str, list[str]]:
    by_user: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for s in bench.sessions:
        by_user[s.user] += [(t.provenance, t.text) for t in s.turns]
    out: dict[str, list[str]] = {}
    models = {u: BM25Okapi([tokens(x) or ["_"] for _, x in turns]) for u, turns in by_user.items()}
    for q in bench.questions:
        turns = by_user.get(q.user, [])
        if not turns:
            out[q.qid] = []
            continue
        scores = models[q.user].get_scores(tokens(q.text))
        order = np.argsort(-scores, kind="stable")[:TOP]
        out[q.qid] = [turns[i][0] for i in order]
    return out


def cosine(bench: Benchmark, turn_vectors: dict[tuple[str, str], np.ndarray],
           question_vectors: dict[str, np.ndarray]) -> dict[str, list[str]]:
    """Flat top-k by cosine over the user's turn vectors (the ones the worker indexed)."""
    by_user: dict[str, list[str]] = defaultdict(list)
    for s in bench.sessions:
        by_user[s.user] += [t.provenance for t in s.turns
                            if (s.user, t.provenance) in turn_vectors]
    out: dict[str, list[str]] = {}
    for q in bench.questions:
        provs = by_user.get(q.user, [])
        if not provs or q.qid not in question_vectors:
            out[q.qid] = []
            continue
        m = np.stack([turn_vectors[(q.user, p)] for p in provs])
        sims = m @ question_vectors[q.qid]
        order = np.argsort(-sims, kind="stable")[:TOP]
        out[q.qid] = [provs[i] for i in order]
    return out


def lists(bench: Benchmark, memory: Sequence[dict[str, Any]],
          embedder: Embedder | None) -> dict[str, dict[str, list[str]]]:
    """Every baseline's ranked turn ids per question. The cosine baseline embeds the recorded
    turn texts plainly (the index holds context-blended vectors, which would not be a plain
    cosine baseline); turn ids repeat across users, so they are keyed by owner too."""
    out = {"bm25": bm25(bench)}
    if embedder is None:
        return out
    segs = [m for m in memory if m["op"] == "segment_recorded" and m.get("text")]
    vecs = embedder.embed(as_passages(embedder, [m["text"] for m in segs]))
    turn_vectors = {(m["owner"], m["provenance"][-1]): v for m, v in zip(segs, vecs, strict=True)}
    qv = embedder.embed(as_queries(embedder, [q.text for q in bench.questions]))
    out["cosine"] = cosine(bench, turn_vectors,
                           {q.qid: v for q, v in zip(bench.questions, qv, strict=True)})
    return out
