"""The long-term memory a runner projects from the memory-log: the store, its sinks and the
recall tiers over them (C-04). Built here once, so every runner recalls through the same tiers
with the same timeouts and names the same index version."""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from mnemoflow.agents.graph import GraphState
from mnemoflow.agents.recall import FaultyTier, TierSpec
from mnemoflow.agents.tuning import Tuning
from mnemoflow.projections.embedding import AsyncEmbedder
from mnemoflow.projections.graph_tier import GraphSink, GraphTier
from mnemoflow.projections.markdown import MarkdownSink
from mnemoflow.projections.memory_store import LexicalTier, MemoryStore
from mnemoflow.projections.vector_tier import VectorSink, VectorTier

LEXICAL_TIMEOUT_S = 2.0
GRAPH_TIMEOUT_S = 1.0
log = logging.getLogger(__name__)


class ProjectionFailed(RuntimeError):
    """A sink of the memory projection could not write what it was given."""


async def flush_sinks(sinks: Sequence[Any]) -> bool:
    """Flush every sink; False if one failed (logged: the next flush retries it).

    The sinks recall reads (vectors, graph) are flushed in their order, and the readable
    copies (MEMORY.md) beside them, not before them: a copy's write (a file read, rendered
    and fsynced per owner) must not hold up the vectors that recall's projected barrier waits
    for (docs/decisions.md, "MEMORY.md beside the vectors")."""

    async def each(group: list[Any]) -> bool:
        ok = True
        for sink in group:
            try:
                res = sink.flush()
                if inspect.isawaitable(res):
                    await res
            except Exception:
                log.exception("projection %s failed; retrying with the next batch",
                              type(sink).__name__)
                ok = False
        return ok

    copies = [s for s in sinks if isinstance(s, MarkdownSink)]
    read = [s for s in sinks if not isinstance(s, MarkdownSink)]
    return all(await asyncio.gather(each(read), each(copies)))


@dataclass
class Memory:
    store: MemoryStore
    tiers: list[TierSpec]
    sinks: list[Any] = field(default_factory=list)
    embedder: AsyncEmbedder | None = None
    index: Any = None  # a VectorIndex or an ArrayIndex
    graph_sink: GraphSink | None = None
    tuning: Tuning | None = None
    vector_timeout_s: float = 3.0
    sink_batch: int | None = None
    fault_tiers: frozenset[str] = frozenset()
    opener: Callable[[], Awaitable[Any]] | None = None  # opens the vector index on start
    restored: bool = False  # the store came from a snapshot: the sinks have its past
    # vectors computed elsewhere (the memory-vectors topic), and where new ones are told
    known_vectors: dict[str, tuple[str, Any]] = field(default_factory=dict)
    on_embedded: Callable[[list[dict[str, Any]], list[str], Any], None] | None = None

    async def start(self) -> None:
        """Open what must be opened on the runner's loop (a LanceDB index); idempotent."""
        if self.opener is not None:
            opener, self.opener = self.opener, None
            self.add_vector(await opener())

    def faulty(self, spec: TierSpec) -> TierSpec:
        return replace(spec, tier=FaultyTier(spec.tier)) if spec.tier.name in self.fault_tiers \
            else spec

    def add_vector(self, index: Any) -> None:
        """The vector sink (before the graph's, which reads what the others hold) and tier
        (second, after the lexical one)."""
        assert self.embedder is not None and self.tuning is not None
        self.index = index
        t = self.tuning.index
        kw: dict[str, Any] = {"batch": self.sink_batch} if self.sink_batch else {}
        sink = VectorSink(index, self.embedder, store=self.store,
                          context_weight=t.vector_context_weight,
                          embed_max_chars=t.embed_max_chars, known=self.known_vectors,
                          on_embedded=self._embedded, **kw)
        if self.restored:  # its revocations and re-links are in the index already
            sink.caught_up()
        at = next((i for i, s in enumerate(self.sinks) if isinstance(s, GraphSink)),
                  len(self.sinks))
        self.sinks.insert(at, sink)
        embed_timeout = max(0.1, self.vector_timeout_s - 1)
        self.tiers.insert(1, self.faulty(TierSpec(
            VectorTier(self.store, index, self.embedder, embed_timeout_s=embed_timeout),
            timeout_s=self.vector_timeout_s)))

    def _embedded(self, rows: list[dict[str, Any]], digests: list[str], vectors: Any) -> None:
        if self.on_embedded is not None:
            self.on_embedded(rows, digests, vectors)

    def tier(self, name: str) -> Any:
        """The recall tier of this name, or None (a vector tier before `start`)."""
        return next((s.tier for s in self.tiers if s.tier.name == name), None)

    def link_proposals(self) -> list[dict[str, Any]]:
        return self.graph_sink.take_proposals() if self.graph_sink else []

    def apply(self, ev: dict[str, Any]) -> bool:
        """Fold one memory-log event into the store and offer it to every sink; False if the
        store had it already (a redelivery)."""
        if not self.store.apply(ev):
            return False
        for sink in self.sinks:
            sink.on_event(ev)
        return True

    async def flush(self) -> None:
        """Flush every sink; raise if one failed, after the others were flushed (a runner
        without a next batch to retry with must not go on with a stale projection)."""
        if not await flush_sinks(self.sinks):
            raise ProjectionFailed("a memory sink failed to flush (logged above)")


def build_memory(tuning: Tuning, *, embedder: AsyncEmbedder | None = None,
                 index: Any = None, graph: bool = True, vector_timeout_s: float = 3.0,
                 markdown_dir: Path | None = None, fault_tiers: Collection[str] = (),
                 sink_batch: int | None = None, store: MemoryStore | None = None,
                 graph_state: GraphState | None = None) -> Memory:
    """Lexical always; vector when an embedder and an index are given (the index, or a
    coroutine function that opens it: LanceDB's connection belongs to the loop that opened
    it, so the vector parts are then added by `await memory.start()` on the runner's loop);
    graph expansion only when the tiers before it found few hits (C-04 tier 3). `store` and
    `graph_state`: a fold restored from a snapshot, whose rows every sink already holds."""
    restored = store is not None
    store = store if store is not None else MemoryStore(index=tuning.index)
    mem = Memory(store, [TierSpec(LexicalTier(store), timeout_s=LEXICAL_TIMEOUT_S)],
                 embedder=embedder, tuning=tuning, vector_timeout_s=vector_timeout_s,
                 sink_batch=sink_batch, fault_tiers=frozenset(fault_tiers), restored=restored)
    if markdown_dir is not None:
        mem.sinks.append(MarkdownSink(markdown_dir, store))
    if embedder is not None and index is not None:
        store.name = f"lexical+vector:{embedder.version}"  # the retrievalVersion says which
        mem.opener = index if callable(index) else None
        if mem.opener is None:
            mem.add_vector(index)
    if graph:
        mem.graph_sink = GraphSink(graph_state or GraphState(), store=store)
        mem.sinks.append(mem.graph_sink)
        store.name += "+graph"
        mem.tiers.append(mem.faulty(TierSpec(GraphTier(store, mem.graph_sink.graph),
                                             timeout_s=GRAPH_TIMEOUT_S,
                                             only_when_fewer_than=tuning.rank.graph_when_fewer_than)))
    mem.tiers[0] = mem.faulty(mem.tiers[0])
    return mem
