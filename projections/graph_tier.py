"""C-04 tier 3 (graph expansion) and the projector sink that keeps its graph current.

The sink folds memory-log records into a GraphState (cheap dict updates, nothing buffered).
The tier seeds a personalized PageRank (local push) with the request's entities and the
entities of the earlier tiers' hits, walks only what the request may see, and returns the
memories the walk reaches most, as Candidates built from MemoryStore records with their own
confidence: co-occurrence is not a fact, so the graph never raises a memory's confidence.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from mnemoflow.agents.candidate import Candidate, scope_chain
from mnemoflow.agents.graph import MEMORY_KINDS, RECORD_OPS, GraphState, View, entity_node, is_entity
from mnemoflow.agents.graph_links import propose_links
from mnemoflow.agents.ppr import LocalPush, top_nodes
from mnemoflow.projections.memory_store import MemoryStore


@dataclass(frozen=True)
class GraphConfig:
    alpha: float = 0.5  # restart probability (HippoRAG's damping 0.5)
    eps: float = 1e-4  # push threshold: at most 1/(alpha*eps) edge visits per request
    max_pushes: int = 20_000  # a hard stop on top of that bound
    step_pushes: int = 32  # pushes between two yields to the event loop
    hit_weight: float = 0.5  # an earlier hit's entities seed at half a request entity's weight


def _alive(store: MemoryStore) -> Callable[[str], bool]:
    """The store is the authority on revocation (it also revokes superseded facts)."""
    def alive(mid: str) -> bool:
        rec = store.records.get(mid)
        return rec is not None and not rec.revoked
    return alive


@dataclass
class GraphTier:
    """`RecallTier` over the graph; use with `TierSpec(..., only_when_fewer_than=k)`.

    The walk is a local push: its work is bounded by `GraphConfig.eps` however large the
    user's graph is, it reads the live graph lazily, and it yields to the event loop every
    `step_pushes` pushes, so it never blocks the loop for long and a tier timeout cancels it
    (a thread could not be cancelled, and would race the fold).
    """

    store: MemoryStore
    graph: GraphState
    config: GraphConfig = field(default_factory=GraphConfig)
    name: str = "graph"
    uses_seeds: bool = True  # seeded by the earlier tiers' hits: never runs beside them

    def personalization(self, request: dict[str, Any], seeds: Sequence[Candidate],
                        view: View) -> dict[str, float]:
        """Seed weights: entity specificity 1/|memories mentioning it| (HippoRAG)."""
        weights: dict[str, float] = {}

        def add(node: str, w: float) -> None:
            n = self.graph.degree(node, view)
            if n:
                weights[node] = weights.get(node, 0.0) + w / n

        for e in dict.fromkeys(entity_node(e) for e in request.get("entities") or () if e.strip()):
            add(e, 1.0)
        for c in sorted(seeds, key=lambda c: c.memory_id):
            node = self.graph.memories.get(c.memory_id)
            if node is not None and self.graph.visible(c.memory_id, view):
                for e in node.entities:
                    add(e, self.config.hit_weight)
        return weights

    async def scores(self, request: dict[str, Any], seeds: Sequence[Candidate]) -> dict[str, float]:
        """PPR scores of the nodes the walk reached (entities included)."""
        view = View(scope_chain(request), int(request["eventTime"]), _alive(self.store))
        personal = self.personalization(request, seeds, view)
        if not personal:
            return {}
        seen: dict[str, list[tuple[str, float]]] = {}

        def neighbours(node: str) -> list[tuple[str, float]]:
            if node not in seen:
                seen[node] = self.graph.neighbours(node, view)
            return seen[node]

        cfg = self.config
        push = LocalPush(neighbours, lambda n: self.graph.degree(n, view), personal, cfg.alpha,
                         cfg.eps, cfg.max_pushes)
        while not push.step(cfg.step_pushes):
            await asyncio.sleep(0)  # let the loop run between bounded steps
        return push.scores()

    async def search(self, request: dict[str, Any], k: int,
                     seeds: Sequence[Candidate]) -> list[Candidate]:
        chain = scope_chain(request)
        before = int(request["eventTime"])
        scores = await self.scores(request, seeds)
        already = {c.memory_id for c in seeds}
        out: list[Candidate] = []
        for mid, score in top_nodes(scores, len(scores), skip=already):
            if is_entity(mid):
                continue
            rec = self.store.records.get(mid)
            if (rec is None or not self.store.recallable(mid) or rec.kind not in MEMORY_KINDS
                    or (rec.scope, rec.owner) not in chain or rec.event_time >= before):
                continue  # recallable: not revoked, disputed, a candidate or an early procedure
            out.append(self.store.candidate(rec, round(score, 12)))
            if len(out) >= k:
                break
        return out


@dataclass
class GraphSink:
    """Projector sink: folds each memory-log record into the graph as it arrives.

    It also remembers which memories arrived, so `take_proposals` can offer co-occurrence
    links for them; the worker appends those to the memory-log (key = owner), and they come
    back through this same fold. Proposals are computed when taken, against the graph as it
    is then, so links already in the log are not proposed twice.
    """

    graph: GraphState
    store: MemoryStore | None = None  # its revocations (superseded facts) keep evidence honest
    min_count: int = 2
    # memories not yet offered for links, oldest first; bounded, because only the leader's
    # idle timer takes them (other workers fold the same log and would only accumulate)
    touched: dict[str, None] = field(default_factory=dict)
    max_touched: int = 100_000

    def on_event(self, ev: dict[str, Any]) -> None:
        if self.graph.apply(ev) and ev["op"] in RECORD_OPS:
            self.touched[ev["memoryId"]] = None
            if len(self.touched) > self.max_touched:
                del self.touched[next(iter(self.touched))]

    def flush(self) -> int:
        """Nothing is buffered: the graph is current after every on_event."""
        return 0

    def take_proposals(self, limit: int = 2000) -> list[dict[str, Any]]:
        """`link_added` records for up to `limit` arrived memories, in id order."""
        batch = sorted(self.touched)[:limit]
        for mid in batch:
            del self.touched[mid]
        alive = _alive(self.store) if self.store is not None else None
        return propose_links(self.graph, batch, self.min_count, alive=alive)
