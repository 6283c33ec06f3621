"""Personalized PageRank by power iteration over a plain adjacency dict (no numpy, no scipy).

Recall graphs are small per user (a bounded neighbourhood of the seeds), so a dict-based
iteration is fast enough and keeps the result exactly reproducible: nodes are visited in
sorted order, so every float sum happens in the same order on every run and machine.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence

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


class LocalPush:
    """Approximate personalized PageRank by local push (Andersen, Chung & Lang 2006).

    Work is bounded by the residual threshold, not by the graph: a node u is pushed only while
    its residual r(u) >= eps * degree(u), and every push moves alpha * r(u) of the unit mass
    into the estimate, so the pushed degrees sum to at most 1 / (alpha * eps) whatever the
    graph's size; hubs are rarely pushed. Neighbours are asked for lazily, so only the part
    of the graph the walk reaches is ever looked at.

    `step(budget)` does at most `budget` pushes, so a caller on an event loop can yield
    between steps. Nodes are queued in first-seen order and neighbours come sorted, so the
    same graph and seeds always give the same scores. Same conventions as
    `personalized_pagerank`: alpha is the restart probability, dangling mass restarts.
    """

    def __init__(self, neighbours: Callable[[str], Sequence[tuple[str, float]]],
                 degree: Callable[[str], float], seeds: Mapping[str, float], alpha: float = 0.5,
                 eps: float = 1e-4, max_pushes: int = 20_000) -> None:
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        self.neighbours, self.degree = neighbours, degree
        self.alpha, self.eps, self.max_pushes = alpha, eps, max_pushes
        total = sum(w for w in seeds.values() if w > 0)
        self.restart = {n: seeds[n] / total for n in sorted(seeds) if seeds[n] > 0} if total else {}
        self.p: dict[str, float] = {}
        self.r: dict[str, float] = dict(self.restart)
        self.queue: deque[str] = deque(n for n in self.restart if self._due(n))
        self.queued = set(self.queue)
        self.pushes = 0

    def _due(self, n: str) -> bool:
        return self.r.get(n, 0.0) >= self.eps * max(1.0, self.degree(n))

    @property
    def done(self) -> bool:
        return not self.queue or self.pushes >= self.max_pushes

    def step(self, budget: int = 256) -> bool:
        """Push up to `budget` nodes; True when converged (or out of pushes)."""
        for _ in range(budget):
            if self.done:
                break
            u = self.queue.popleft()
            self.queued.discard(u)
            ru = self.r.pop(u, 0.0)
            self.pushes += 1
            self.p[u] = self.p.get(u, 0.0) + self.alpha * ru
            edges = [(v, w) for v, w in self.neighbours(u) if w > 0]
            spread = (1.0 - self.alpha) * ru
            if edges:
                total = sum(w for _, w in edges)
                targets = [(v, spread * w / total) for v, w in edges]
            else:  # dangling: the walker restarts
                targets = [(s, spread * w) for s, w in self.restart.items()]
            for v, add in targets:
                self.r[v] = self.r.get(v, 0.0) + add
                if v not in self.queued and self._due(v):
                    self.queue.append(v)
                    self.queued.add(v)
        return self.done

    def scores(self) -> dict[str, float]:
        """Estimate + alpha * residual: a lower bound of the true score, and the closer one."""
        out = dict(self.p)
        for n, rn in self.r.items():
            out[n] = out.get(n, 0.0) + self.alpha * rn
        return out

    def run(self) -> dict[str, float]:
        while not self.step(1 << 30):
            pass
        return self.scores()
