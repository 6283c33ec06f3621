"""Personalized PageRank by power iteration over a plain adjacency dict (no numpy, no scipy).

Recall graphs are small per user (a bounded neighbourhood of the seeds), so a dict-based
iteration is fast enough and keeps the result exactly reproducible: nodes are visited in
sorted order, so every float sum happens in the same order on every run and machine.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

Adjacency = Mapping[str, Sequence[tuple[str, float]]]


def personalized_pagerank(adjacency: Adjacency, seeds: Mapping[str, float], alpha: float = 0.5,
                          iters: int = 30, tol: float = 1e-9) -> dict[str, float]:
    """Stationary visit probabilities of a walk that restarts at `seeds` with probability `alpha`.

    `adjacency[u]` lists `(v, weight)`; the walk leaves u along an edge in proportion to its
    weight. Seeds are normalised to sum 1; non-positive weights are ignored. A node with no
    out-edges (dangling) sends its mass back to the seeds, so the scores always sum to 1.
    `alpha` is the restart probability (HippoRAG's damping 0.5 is alpha = 0.5).
    Stops after `iters` rounds or when the L1 change drops below `tol`.
    """
    if not 0.0 < alpha <= 1.0:
        raise ValueError(f"alpha must be in (0, 1], got {alpha}")
    nodes = sorted(set(adjacency) | {v for out in adjacency.values() for v, _ in out} | set(seeds))
    total = sum(w for w in seeds.values() if w > 0)
    if total <= 0:
        return {}
    restart = {n: seeds[n] / total for n in sorted(seeds) if seeds[n] > 0}
    out: dict[str, tuple[tuple[str, float], ...]] = {}
    out_weight: dict[str, float] = {}
    for u in nodes:
        edges = tuple(sorted((v, float(w)) for v, w in adjacency.get(u, ()) if w > 0))
        if edges:
            out[u] = edges
            out_weight[u] = sum(w for _, w in edges)
    p = dict.fromkeys(nodes, 0.0)
    p.update(restart)
    for _ in range(iters):
        nxt = dict.fromkeys(nodes, 0.0)
        dangling = 0.0
        for u in nodes:
            mass = p[u]
            if mass == 0.0:
                continue
            edges = out.get(u)
            if edges is None:
                dangling += mass
                continue
            share = (1.0 - alpha) * mass / out_weight[u]
            for v, w in edges:
                nxt[v] += share * w
        back = alpha + (1.0 - alpha) * dangling  # every walker's restart + the dangling walks
        for n, r in restart.items():
            nxt[n] += back * r
        delta = sum(abs(nxt[n] - p[n]) for n in nodes)
        p = nxt
        if delta < tol:
            break
    return p


def top_nodes(scores: Mapping[str, float], k: int, keep: set[str] | None = None,
              skip: set[str] | None = None) -> list[tuple[str, float]]:
    """The k best-scoring nodes, ties broken by node id so the order never depends on hashing."""
    ranked = sorted(((n, s) for n, s in scores.items()
                     if s > 0 and (keep is None or n in keep) and not (skip and n in skip)),
                    key=lambda x: (-x[1], x[0]))
    return ranked[:k]
