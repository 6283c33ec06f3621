"""The memory a runner holds, partition by partition, like a Kafka Streams state store.

One `Memory` (store, sinks, tiers) per memory-log partition the runner is assigned, built when
the partition is assigned and dropped when it moves away, plus one for `memory-shared`, which
every runner holds whole. A recall runs on the partition of its user (`agents.partitioning`)
and reads that partition's memory and the shared one; each tier filters by the request's scope
chain as before, so placement never widens what a request may see. Each partition's memory
keeps its own statistics (BM25 document frequencies, event-time clock), so what a user's
recall finds does not depend on which runner holds the partition or what else it holds.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from mnemoflow.agents.candidate import Candidate, scope_chain
from mnemoflow.agents.partitioning import SHARED, memory_topic, partition_of, request_key
from mnemoflow.agents.recall import TierSpec
from mnemoflow.agents.tuning import Tuning
from mnemoflow.projections.embedding import as_queries
from mnemoflow.projections.memory import Memory, build_memory

log = logging.getLogger(__name__)


@dataclass
class RoutedTier:
    """A tier of the partitioned memory: the same-named tier of the request's partition and of
    the shared memory, their hits together (recall fuses them by score). When one of them
    finds nothing, the other's hits are returned as that tier gave them."""

    name: str
    memory: PartitionedMemory = field(repr=False)
    uses_seeds: bool = False

    async def search(self, request: dict[str, Any], k: int,
                     seeds: Sequence[Candidate]) -> list[Candidate]:
        tiers = [t for m in self.memory.serving(request) if (t := m.tier(self.name)) is not None]
        found = [hits for hits in await asyncio.gather(*(t.search(request, k, seeds)
                                                          for t in tiers)) if hits]
        if len(found) <= 1:
            return found[0] if found else []
        return sorted((c for hits in found for c in hits), key=lambda c: (-c.relevance, c.memory_id))


@dataclass
class PartitionedMemory:
    """Per-partition memories (`parts`), the shared one, and routed tiers over them."""

    partitions: int
    # builds the memory of a partition (or SHARED): its folder (vector index files, or None:
    # in memory) and the fold restored from a checkpoint (store, graph), if any
    make: Callable[[int, Path | None, tuple[Any, Any] | None], Memory]
    shared: Memory = field(init=False)
    parts: dict[int, Memory] = field(default_factory=dict)
    tiers: list[TierSpec] = field(default_factory=list)  # routed; filled in place by start()

    def __post_init__(self) -> None:
        self.shared = self.make(SHARED, None, None)
        self._route()

    def _route(self) -> None:
        # mutated in place: ports built before `start()` hold this list
        self.tiers[:] = [replace(spec, tier=RoutedTier(
            spec.tier.name, self, bool(getattr(spec.tier, "uses_seeds", False))))
            for spec in self.shared.tiers]

    @property
    def version(self) -> str:
        """The index version: the same build everywhere (every partition is built alike)."""
        return self.shared.store.version

    @property
    def embedder(self) -> Any:
        return self.shared.embedder

    def partition_of(self, owner: str) -> int:
        return partition_of(owner, self.partitions)

    def partition_for(self, request: dict[str, Any]) -> int:
        return self.partition_of(request_key(request))

    def serving(self, request: dict[str, Any]) -> list[Memory]:
        """The memories a request reads: its partition's, if held here, and the shared one."""
        part = self.parts.get(self.partition_for(request))
        return [part, self.shared] if part is not None else [self.shared]

    def searches_vectors(self, request: dict[str, Any]) -> bool:
        """Whether a vector tier will embed this request's query: one that holds a memory of
        its scope chain (`VectorTier.search` embeds nothing otherwise)."""
        chain = scope_chain(request)
        return any(m.tier("vector") is not None and any(m.store.by_owner.get(o) for o in chain)
                   for m in self.serving(request))

    async def warm_queries(self, requests: Sequence[dict[str, Any]], timeout: float) -> int:
        """Embed the queries of several waiting recall requests in one forward pass, ahead of
        their steps, which then find them in the embedder's cache. Best effort: on a failure
        or a timeout each step embeds its own query, as without it. Returns the number sent."""
        emb = self.embedder
        texts = [r["text"] for r in requests if self.searches_vectors(r)]
        if emb is None or len(texts) < 2:
            return 0
        try:
            await emb.embed(as_queries(emb, texts), timeout)
        except Exception as exc:  # each step embeds its own query then
            log.debug("warming %d recall queries failed: %r", len(texts), exc)
        return len(texts)

    def memories(self) -> list[Memory]:
        return [*(self.parts[p] for p in sorted(self.parts)), self.shared]

    def consolidated(self) -> list[Memory]:
        """The memories this runner consolidates: its partitions', and the shared one if it
        holds partition 0 (every runner holds the shared memory; one consolidates it)."""
        return [self.parts[p] for p in sorted(self.parts)] + ([self.shared] if 0 in self.parts
                                                               else [])

    def stores(self) -> list[Any]:
        """The stores the periodic steps read (consolidation runs per partition)."""
        return [m.store for m in self.consolidated()]

    async def start(self) -> None:
        await self.shared.start()
        self._route()
        for m in self.parts.values():
            await m.start()

    async def assign(self, partition: int, memory: Memory | None = None) -> Memory:
        """Hold this partition from now on (a memory restored from a snapshot, or empty)."""
        if partition not in self.parts:
            mem = memory or self.make(partition, None, None)
            await mem.start()
            self.parts[partition] = mem
        return self.parts[partition]

    def drop(self, partition: int) -> Memory | None:
        """The partition moved away: its memory is no longer held (nor read)."""
        return self.parts.pop(partition, None)

    def memory_for(self, topic: str, partition: int) -> Memory | None:
        """The memory a record of this topic and partition folds into, if held here."""
        return self.shared if topic == "memory-shared" else self.parts.get(partition)

    async def hold_all(self) -> None:
        """Hold every partition (a runner that is the whole cluster)."""
        await self.start()
        for p in range(self.partitions):
            await self.assign(p)

    def apply(self, ev: dict[str, Any]) -> bool:
        """Fold an event where the partitioner puts it (into a held partition, see `hold_all`).
        False if already applied there."""
        if memory_topic(ev) == "memory-shared":
            return self.shared.apply(ev)
        return self.parts[self.partition_of(ev["owner"])].apply(ev)

    def link_proposals(self) -> list[dict[str, Any]]:
        return [ev for m in self.consolidated() for ev in m.link_proposals()]

    async def flush(self) -> None:
        for m in self.memories():
            await m.flush()

    def __len__(self) -> int:
        return sum(len(m.store) for m in self.memories())


def partition_dir(partition: int) -> str:
    """The folder of a partition's files (its vector index) under a runner's folder."""
    return "shared" if partition == SHARED else f"p{partition}"


def build_partitioned(tuning: Tuning, partitions: int, *,
                      index_for: Callable[[int, Path | None], Any] | None = None,
                      markdown_dir: Path | None = None, **kw: Any) -> PartitionedMemory:
    """`build_memory` per partition (and for the shared memory): `index_for(p, folder)`
    gives the partition's vector index or its opener; every other option is the same."""
    def make(p: int, folder: Path | None, restored: tuple[Any, Any] | None) -> Memory:
        store, graph = restored if restored is not None else (None, None)
        return build_memory(tuning, index=index_for(p, folder) if index_for else None,
                            markdown_dir=markdown_dir, store=store, graph_state=graph, **kw)

    return PartitionedMemory(partitions, make)
