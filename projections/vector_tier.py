"""C-04 tier 2 (vector + time filter) and the projector sink that keeps its index current.

Embedding runs off the event loop (AsyncEmbedder) and is cached by text digest. When the
query cannot be embedded in time, the tier raises and recall keeps the lexical answer (G-05).

A segment's vector is normalise(own + w * previous segment of its session), w being
IndexTuning.vector_context_weight: a reply is found by what it replies to, at no extra
embedding (the previous turn's text was just embedded, so the cache answers). The stored text
stays the segment's own. The sink sees the memory-log from the start on every worker start, so
its previous-turn map is rebuilt before any new row is written.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mnemoflow.agents.candidate import Candidate, scope_chain
from mnemoflow.agents.tuning import packaged_index_tuning
from mnemoflow.projections.embedding import AsyncEmbedder
from mnemoflow.projections.memory_store import MemoryStore
from mnemoflow.projections.vector_index import VectorIndex

EMBED_KINDS = ("segment", "episode", "fact", "procedure")
REVOKE_OPS = ("memory_revoked", "fact_revoked", "procedure_deprecated")
CONTEXT_CAP = 100_000  # sessions (and rows) whose latest segment the sink remembers


def _default_context_weight() -> float:
    return packaged_index_tuning().vector_context_weight


def _default_embed_max_chars() -> int:
    return packaged_index_tuning().embed_max_chars


def head(text: str, max_chars: int) -> str:
    """The text MiniLM embeds: at most `max_chars` characters (0: all), cut at a space."""
    if max_chars <= 0 or len(text) <= max_chars:
        return text
    cut = text[:max_chars]
    space = cut.rfind(" ")
    return cut[:space] if space > max_chars // 2 else cut


def blend(own: np.ndarray, context: np.ndarray | None, weight: float) -> np.ndarray:
    """normalise(own + weight * context); the own vector alone when there is no context."""
    if context is None or weight <= 0:
        return own
    v = own.astype(np.float32) + np.float32(weight) * context.astype(np.float32)
    n = float(np.linalg.norm(v))
    return v / n if n > 0 else own


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
                out[mid] = self.store.candidate(rec, sim)
        return list(out.values())


@dataclass
class VectorSink:
    """Buffers memory-log records, embeds them in batches off the loop, writes LanceDB.

    Segments get the previous live segment of their session as context (module docstring).
    When that segment is revoked, the next one is re-embedded with the segment before it,
    which is what a rebuild from the log or from MEMORY.md (revoked rows absent) gives.

    With `store` (the MemoryStore folded just before each event) it also drops what the fold
    revoked without an event of its own: facts cascading from a revoked segment, procedures
    whose evidence was revoked.
    """

    index: VectorIndex
    embedder: AsyncEmbedder
    batch: int = 64
    timeout_s: float = 600.0
    context_weight: float = field(default_factory=_default_context_weight)
    embed_max_chars: int = field(default_factory=_default_embed_max_chars)
    pending: list[dict[str, Any]] = field(default_factory=list)
    revoked: list[str] = field(default_factory=list)
    written: int = 0
    store: MemoryStore | None = None
    _seen_revocations: int = 0
    # bounded maps of recent segments: memory id -> row, session -> latest segment,
    # memory id -> the segment whose context it is; ids of revoked memories
    _rows: OrderedDict[str, dict[str, Any]] = field(default_factory=OrderedDict)
    _last: OrderedDict[str, str] = field(default_factory=OrderedDict)
    _next: dict[str, str] = field(default_factory=dict)
    _gone: set[str] = field(default_factory=set)
    _redo: dict[str, dict[str, Any]] = field(default_factory=dict)
    _pending_ids: set[str] = field(default_factory=set)

    def _live(self, mid: str | None) -> dict[str, Any] | None:
        """The row of `mid`, or of the nearest live segment before it in its session."""
        while mid is not None and mid in self._gone:
            row = self._rows.get(mid)
            mid = row["context_id"] if row else None
        return self._rows.get(mid) if mid is not None else None

    def _remember(self, row: dict[str, Any], session_id: str) -> None:
        mid = row["memory_id"]
        if mid in self._rows:
            return  # a redelivered or re-recorded segment keeps its first context
        prev = self._live(self._last.get(session_id))
        row["context_id"] = prev["memory_id"] if prev else None
        row["context_text"] = prev["text"] if prev else None
        if prev:
            self._next[prev["memory_id"]] = mid
        self._rows[mid] = row
        self._last[session_id] = mid
        self._last.move_to_end(session_id)
        for m in (self._rows, self._last):
            while len(m) > CONTEXT_CAP:
                gone, _ = m.popitem(last=False)
                self._next.pop(gone, None)

    def on_event(self, ev: dict[str, Any]) -> None:
        if self.store is not None:
            for mid in self.store.revocations[self._seen_revocations:]:
                if mid not in self._gone:
                    self._revoke(mid)
            self._seen_revocations = len(self.store.revocations)
        if ev["op"] in REVOKE_OPS:
            if ev["memoryId"] not in self._gone:
                self._revoke(ev["memoryId"])
            return
        if ev["kind"] not in EMBED_KINDS or not ev.get("text"):
            return
        ttl = ev.get("ttlMs")
        row = {"memory_id": ev["memoryId"], "kind": ev["kind"], "text": ev["text"],
               "scope": ev["scope"], "owner": ev["owner"], "event_time": ev["eventTime"],
               "expires_at": ev["eventTime"] + ttl if ttl else 0,
               "context_id": None, "context_text": None}
        if ev["kind"] == "segment":
            self._remember(row, ev["sessionId"])
            row = self._rows.get(ev["memoryId"], row)
        if ev["memoryId"] in self.index.ids:
            return  # already embedded by an earlier run: the index persists across restarts
        if row["memory_id"] not in self._pending_ids:
            self._pending_ids.add(row["memory_id"])
            self.pending.append(row)

    def _revoke(self, mid: str) -> None:
        self.revoked.append(mid)
        self._gone.add(mid)
        self.pending = [r for r in self.pending if r["memory_id"] != mid]
        self._pending_ids.discard(mid)
        nxt = self._rows.get(self._next.pop(mid, ""))
        if nxt is None or nxt["memory_id"] in self._gone:
            return
        prev = self._live(mid)
        nxt["context_id"] = prev["memory_id"] if prev else None
        nxt["context_text"] = prev["text"] if prev else None
        if prev:
            self._next[prev["memory_id"]] = nxt["memory_id"]
        if nxt["memory_id"] in self.index.ids:  # written already: write it again
            self._redo[nxt["memory_id"]] = nxt

    async def _write(self, rows: list[dict[str, Any]]) -> None:
        use = self.context_weight > 0
        texts = [head(r["text"], self.embed_max_chars) for r in rows]
        ctx = [head(r["context_text"], self.embed_max_chars)
               for r in rows if use and r.get("context_text")]
        vecs = np.asarray(await self.embedder.embed(texts + ctx, self.timeout_s))
        ctx_vecs = iter(vecs[len(rows):])
        out = np.stack([blend(v, next(ctx_vecs) if use and r.get("context_text") else None,
                              self.context_weight) for v, r in zip(vecs[: len(rows)], rows,
                                                                   strict=True)])
        clean = [{k: v for k, v in r.items() if k not in ("context_id", "context_text")}
                 for r in rows]
        await asyncio.get_running_loop().run_in_executor(None, self.index.add, clean, out)

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
                await self._write(rows)
                todo = todo[self.batch:]
                self._pending_ids.difference_update(r["memory_id"] for r in rows)
                n += len(rows)
            while revoked:
                await loop.run_in_executor(None, self.index.revoke, revoked[0])
                revoked.pop(0)
            redo = [r for m, r in sorted(self._redo.items()) if m not in self._gone]
            if redo:  # a revoked text stops being another vector's context
                await self._write(redo)
                self._redo.clear()
        except BaseException:
            self.pending = todo + self.pending
            self.revoked = revoked + self.revoked
            raise
        finally:
            self.written += n
        return n
