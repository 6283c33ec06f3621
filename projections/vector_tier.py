"""C-04 tier 2 (vector + time filter) and the projector sink that keeps its index current.

Embedding runs off the event loop (AsyncEmbedder) and is cached by text digest. When the
query cannot be embedded in time, the tier raises and recall keeps the lexical answer (G-05).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mnemoflow.agents.candidate import Candidate, scope_chain
from mnemoflow.projections.embedding import AsyncEmbedder
from mnemoflow.projections.memory_store import MemoryStore
from mnemoflow.projections.vector_index import VectorIndex

EMBED_KINDS = ("segment", "episode", "fact", "procedure")


@dataclass
class VectorTier:
    store: MemoryStore
    index: VectorIndex
    embedder: AsyncEmbedder
    embed_timeout_s: float = 2.0
    name: str = "vector"

    async def search(self, request: dict[str, Any], k: int,
                     seeds: Sequence[Candidate]) -> list[Candidate]:
        vec = (await self.embedder.embed([request["text"]], self.embed_timeout_s))[0]
        chain = scope_chain(request)
        window = tuple(request["timeWindow"]) if request.get("timeWindow") else None
        loop = asyncio.get_running_loop()
        hits = await loop.run_in_executor(
            None, self.index.search, vec, chain, request["eventTime"], k, None)
        if window:
            hits += await loop.run_in_executor(
                None, self.index.search, vec, chain, request["eventTime"], k // 2, window)
        out: dict[str, Candidate] = {}
        for mid, sim in hits:
            rec = self.store.records.get(mid)
            if rec is not None and self.store.recallable(mid) and mid not in out:
                out[mid] = rec.candidate(sim)
        return list(out.values())


@dataclass
class VectorSink:
    """Buffers memory-log records, embeds them in batches off the loop, writes LanceDB.

    With `store` (the MemoryStore folded just before each event) it also drops what the fold
    revoked without an event of its own: facts cascading from a revoked segment, procedures
    whose evidence was revoked."""

    index: VectorIndex
    embedder: AsyncEmbedder
    batch: int = 64
    timeout_s: float = 600.0
    pending: list[dict[str, Any]] = field(default_factory=list)
    revoked: list[str] = field(default_factory=list)
    written: int = 0
    store: MemoryStore | None = None
    _seen_revocations: int = 0
    _pending_ids: set[str] = field(default_factory=set)

    def _drop(self, mid: str) -> None:
        self.revoked.append(mid)
        if mid in self._pending_ids:
            self._pending_ids.discard(mid)
            self.pending = [r for r in self.pending if r["memory_id"] != mid]

    def on_event(self, ev: dict[str, Any]) -> None:
        if self.store is not None:
            for mid in self.store.revocations[self._seen_revocations:]:
                self._drop(mid)
            self._seen_revocations = len(self.store.revocations)
        if ev["op"] in ("memory_revoked", "fact_revoked", "procedure_deprecated"):
            self._drop(ev["memoryId"])
        elif ev["memoryId"] in self.index.ids or ev["memoryId"] in self._pending_ids:
            return  # already embedded (the index persists across restarts) or buffered
        elif ev["kind"] in EMBED_KINDS and ev.get("text"):
            ttl = ev.get("ttlMs")
            self._pending_ids.add(ev["memoryId"])
            self.pending.append({"memory_id": ev["memoryId"], "kind": ev["kind"],
                                 "text": ev["text"], "scope": ev["scope"], "owner": ev["owner"],
                                 "event_time": ev["eventTime"],
                                 "expires_at": ev["eventTime"] + ttl if ttl else 0})

    async def flush(self) -> int:
        """Embed and write what was buffered when the flush began; returns rows written.

        Records that arrive meanwhile wait for the next flush, so a flush ends even on a busy
        stream (the projector keeps folding while it runs). What could not be written stays
        buffered for the next flush.
        """
        loop = asyncio.get_running_loop()
        todo, self.pending = self.pending, []
        revoked, self.revoked = self.revoked, []
        n = 0
        try:
            while todo:
                rows = todo[: self.batch]
                vecs = await self.embedder.embed([r["text"] for r in rows], self.timeout_s)
                await loop.run_in_executor(None, self.index.add, rows, np.asarray(vecs))
                todo = todo[self.batch:]
                self._pending_ids.difference_update(r["memory_id"] for r in rows)
                n += len(rows)
            while revoked:
                await loop.run_in_executor(None, self.index.revoke, revoked[0])
                revoked.pop(0)
        except BaseException:
            self.pending = todo + self.pending
            self.revoked = revoked + self.revoked
            raise
        finally:
            self.written += n
        return n
