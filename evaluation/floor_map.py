"""Carry a similarity floor from one embedding model to another by quantile, with no labels.

A floor such as `rank.item_floor` is a cosine on one model's scale. Another model puts the same
pairs elsewhere (e5's unrelated texts sit near 0.7, MiniLM's near 0.2). Over every (question,
turn of the same user) pair of a dev split, the share of pairs under the floor on the first
model is read off the second model's distribution of the same pairs: the floor that lets
through the same share of a user's memories. It uses no evidence labels, so it cannot fit the
answers; `floors_cv` then checks a packet floor against the issue's criterion by fold.

    python -m mnemoflow.evaluation.floor_map --to e5-small-v2 --floors 0.35 0.45 \\
        --locomo ../shared/data/locomo/dev.json --oracle ../shared/data/longmemeval/dev_oracle.json
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from mnemoflow.evaluation.datasets import Benchmark, load_locomo, load_longmemeval
from mnemoflow.projections.embedders import MODELS, build_embedder
from mnemoflow.projections.embedding import (
    DEFAULT_EMBED_CACHE_DIR,
    CachedEmbedder,
    Embedder,
    as_passages,
    as_queries,
)


def pair_similarities(bench: Benchmark, embedder: Embedder) -> np.ndarray:
    """Cosine of every question against every turn of its user, pooled."""
    turns = [(s.user, t.text) for s in bench.sessions for t in s.turns]
    owners = np.array([u for u, _ in turns])
    tv = embedder.embed(as_passages(embedder, [text for _, text in turns]))
    qv = embedder.embed(as_queries(embedder, [q.text for q in bench.questions]))
    return np.concatenate([tv[owners == q.user] @ qv[i] for i, q in enumerate(bench.questions)])


def carry(floor: float, source: np.ndarray, target: np.ndarray) -> tuple[float, float]:
    """(share of `source` under `floor`, the value at that quantile of `target`)."""
    share = float((source < floor).mean())
    return share, float(np.quantile(target, share))


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--source", default="minilm", choices=MODELS)
    ap.add_argument("--to", required=True, choices=MODELS)
    ap.add_argument("--floors", type=float, nargs="+", required=True)
    ap.add_argument("--locomo", type=Path)
    ap.add_argument("--oracle", type=Path, help="LongMemEval oracle (user and assistant turns)")
    a = ap.parse_args(argv)
    benches = ([load_locomo(a.locomo)] if a.locomo else []) + (
        [load_longmemeval(a.oracle)] if a.oracle else [])
    models = [CachedEmbedder(build_embedder(m), disk_dir=DEFAULT_EMBED_CACHE_DIR)
              for m in (a.source, a.to)]
    for bench in benches:
        source, target = (pair_similarities(bench, m) for m in models)
        for floor in a.floors:
            share, value = carry(floor, source, target)
            print(f"{bench.name}: {a.source} {floor:.2f} leaves {share:.1%} of {len(source)} "
                  f"pairs under it -> {a.to} {value:.3f}")


if __name__ == "__main__":
    main()
