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
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mnemoflow.agents.candidate import Candidate, scope_chain
from mnemoflow.agents.ids import digest_of
from mnemoflow.agents.tuning import IndexTuning, packaged_index_tuning
from mnemoflow.projections.embedding import AsyncEmbedder, as_passages, as_queries
from mnemoflow.projections.index_rows import IndexMeta, MemoryIndex
from mnemoflow.projections.memory_store import MemoryStore

EMBED_KINDS = ("segment", "episode", "fact", "procedure")


def _default_context_weight() -> float:
    return packaged_index_tuning().vector_context_weight


def _default_embed_max_chars() -> int:
    return packaged_index_tuning().embed_max_chars


def index_meta(embedder: AsyncEmbedder | Any, tuning: IndexTuning) -> IndexMeta:
    """What the index records it was built with: the model, and how vectors were made of it.

    The turn-context blend and the embedded head are part of what a vector means, so an index
    built with other values is refused (and rebuilt), never mixed.
    """
    return IndexMeta(embedder.name, embedder.dim,
                     f"{embedder.version}+ctx{tuning.vector_context_weight:g}"
                     f"+head{tuning.embed_max_chars}")


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
    index: MemoryIndex
    embedder: AsyncEmbedder
    embed_timeout_s: float = 2.0
    name: str = "vector"

    async def search(self, request: dict[str, Any], k: int,
                     seeds: Sequence[Candidate]) -> list[Candidate]:
        chain = scope_chain(request)
        if not any(self.store.by_owner.get(owner) for owner in chain):
            # the index holds rows of the store's memories only, and searches within the
            # chain: nothing to find, so no embedding and no query (the shared memory holds
            # no memory of most sessions)
            return []
        query = as_queries(self.embedder, [request["text"]])
        vec = (await self.embedder.embed(query, self.embed_timeout_s))[0]
        window = tuple(request["timeWindow"]) if request.get("timeWindow") else None
        searches = [self.index.search(vec, chain, request["eventTime"], k)]
        if window:
            searches.append(self.index.search(vec, chain, request["eventTime"], k // 2, window))
        hits = [h for part in await asyncio.gather(*searches) for h in part]
        out: dict[str, Candidate] = {}
        for mid, sim in hits:
            rec = self.store.records.get(mid)
            if rec is not None and self.store.recallable(mid) and mid not in out:
                out[mid] = self.store.candidate(rec, sim)
        return list(out.values())


@dataclass
class VectorSink:
    """Buffers memory-log records, embeds them in batches off the loop, writes the index
    (LanceDB's VectorIndex in the worker).

    The turn context comes from the MemoryStore's chain (`store.context_of`), the same one the
    lexical index uses, read when a row is written; when the store re-links a segment because
    the turn before it was revoked (`store.relinked`), a row already written is written again,
    which is what a rebuild from the log or from MEMORY.md (revoked rows absent) gives. The
    sink also follows every revocation the fold made (`store.revocations`), cascades included.
    Given no store, it folds the events into one of its own (tests, the offline replay).
    """

    index: MemoryIndex
    embedder: AsyncEmbedder
    batch: int = 64
    timeout_s: float = 600.0
    context_weight: float = field(default_factory=_default_context_weight)
    embed_max_chars: int = field(default_factory=_default_embed_max_chars)
    store: MemoryStore | None = None
    # memory id -> (input digest, vector) computed before, by this partition's earlier owner
    # (the memory-vectors topic): used instead of embedding when the inputs are the same
    known: dict[str, tuple[str, Any]] = field(default_factory=dict)
    # told of what was embedded here: (rows, input digests, vectors), to publish them
    on_embedded: Callable[[list[dict[str, Any]], list[str], Any], None] | None = None
    embedded: int = 0  # rows embedded here (not taken from `known`)
    pending: list[dict[str, Any]] = field(default_factory=list)
    revoked: list[str] = field(default_factory=list)
    written: int = 0
    _own_store: bool = False
    _seen_revocations: int = 0
    _seen_relinks: int = 0
    _seen_forgets: int = 0
    _redo: set[str] = field(default_factory=set)  # written rows whose context changed
    _pending_ids: set[str] = field(default_factory=set)
    # (scope, owner) -> rows buffered or being written: what a per-owner barrier waits for
    _unwritten: Counter[tuple[str, str]] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        if self.store is None:
            self.store, self._own_store = MemoryStore(), True

    def caught_up(self) -> None:
        """The store's revocations and re-links so far are already in the index."""
        assert self.store is not None
        self._seen_revocations = len(self.store.revocations)
        self._seen_relinks = len(self.store.relinked)
        self._seen_forgets = len(self.store.forgotten)

    def _follow_store(self) -> None:
        st = self.store
        assert st is not None
        for mid in st.revocations[self._seen_revocations:]:
            self.revoked.append(mid)
            self._redo.discard(mid)
            if mid in self._pending_ids:
                self._pending_ids.discard(mid)
                self._written([r for r in self.pending if r["memory_id"] == mid])
                self.pending = [r for r in self.pending if r["memory_id"] != mid]
        self._seen_revocations = len(st.revocations)
        for mid in st.relinked[self._seen_relinks:]:
            if mid in self.index.ids:  # pending rows read their context when written
                self._redo.add(mid)
        self._seen_relinks = len(st.relinked)

    def on_event(self, ev: dict[str, Any]) -> None:
        st = self.store
        assert st is not None
        if self._own_store:
            st.apply(ev)
        self._follow_store()
        mid = ev["memoryId"]
        rec = st.records.get(mid)
        if ev["kind"] not in EMBED_KINDS or not ev.get("text") or rec is None or rec.revoked:
            return  # nothing to embed, or revoked (a redelivered record must not come back)
        if mid in self.index.ids or mid in self._pending_ids:
            return  # already embedded (the index persists across restarts) or buffered
        ttl = ev.get("ttlMs")
        self._pending_ids.add(mid)
        self._unwritten[(ev["scope"], ev["owner"])] += 1
        self.pending.append({"memory_id": mid, "kind": ev["kind"], "text": ev["text"],
                             "scope": ev["scope"], "owner": ev["owner"],
                             "event_time": ev["eventTime"],
                             "expires_at": ev["eventTime"] + ttl if ttl else 0})

    def _context_text(self, row: dict[str, Any]) -> str | None:
        if self.context_weight <= 0 or row["kind"] != "segment" or self.store is None:
            return None
        prev = self.store.context_of(row["memory_id"])
        return prev.text if prev is not None and prev.text else None

    def input_digest(self, text: str, context: str | None) -> str:
        """What a vector was computed from: a known vector is reused only for the same."""
        return digest_of(head(text, self.embed_max_chars),
                         head(context, self.embed_max_chars) if context else "",
                         self.context_weight)[:32]

    async def _write(self, rows: list[dict[str, Any]]) -> None:
        # the contexts are read once, before the await: the fold goes on meanwhile
        ctx = [self._context_text(r) for r in rows]
        digests = [self.input_digest(r["text"], c) for r, c in zip(rows, ctx, strict=True)]
        reuse: dict[int, Any] = {}
        for i, (r, d) in enumerate(zip(rows, digests, strict=True)):
            hit = self.known.pop(r["memory_id"], None)
            if hit is not None and hit[0] == d:
                reuse[i] = hit[1]
        todo = [i for i in range(len(rows)) if i not in reuse]
        vecs: list[Any] = [reuse.get(i) for i in range(len(rows))]
        if todo:
            fresh = await self._embed([rows[i]["text"] for i in todo], [ctx[i] for i in todo])
            for i, v in zip(todo, fresh, strict=True):
                vecs[i] = v
            self.embedded += len(todo)
            if self.on_embedded is not None:
                self.on_embedded([rows[i] for i in todo], [digests[i] for i in todo], fresh)
        await self.index.add(rows, np.stack(vecs).astype(np.float32, copy=False))

    async def _embed(self, texts: list[str], ctx: list[str | None]) -> np.ndarray:
        heads = [head(t, self.embed_max_chars) for t in texts]
        extra = [head(c, self.embed_max_chars) for c in ctx if c]
        vecs = np.asarray(await self.embedder.embed(as_passages(self.embedder, heads + extra),
                                                   self.timeout_s))
        ctx_vecs = iter(vecs[len(texts):])
        return np.stack([blend(v, next(ctx_vecs) if c else None, self.context_weight)
                         for v, c in zip(vecs[: len(texts)], ctx, strict=True)])

    def _rewrite_rows(self, ids: set[str]) -> list[dict[str, Any]]:
        assert self.store is not None
        rows = []
        for mid in sorted(ids):
            rec = self.store.records.get(mid)
            if rec is not None and not rec.revoked:
                rows.append({"memory_id": mid, "kind": rec.kind, "text": rec.text,
                             "scope": rec.scope, "owner": rec.owner,
                             "event_time": rec.event_time, "expires_at": rec.expires_at or 0})
        return rows

    def _written(self, rows: list[dict[str, Any]]) -> None:
        """These buffered rows left the buffer (written, or revoked before they were)."""
        for r in rows:
            key = (r["scope"], r["owner"])
            left = self._unwritten[key] - 1
            if left > 0:
                self._unwritten[key] = left
            else:
                del self._unwritten[key]

    def unprojected(self, owners: Collection[tuple[str, str]]) -> bool:
        """Whether a row of these (scope, owner) pairs is not in the index yet: buffered, being
        written, or to be re-written with a new context. The projector's per-owner barrier."""
        if any(self._unwritten.get(o) for o in owners):
            return True
        st = self.store
        return bool(self._redo) and st is not None and any(
            (r.scope, r.owner) in owners for m in self._redo
            if (r := st.records.get(m)) is not None)

    async def flush(self) -> int:
        """Embed and write what was buffered when the flush began; returns rows written.

        Records that arrive meanwhile wait for the next flush, so a flush ends even on a busy
        stream (the projector keeps folding while it runs). What could not be written stays
        buffered for the next flush.
        """
        todo, self.pending = self.pending, []
        revoked, self.revoked = self.revoked, []
        redo, self._redo = self._redo, set()
        n = 0
        try:
            while todo:
                rows = todo[: self.batch]
                await self._write(rows)
                todo = todo[self.batch:]
                self._pending_ids.difference_update(r["memory_id"] for r in rows)
                self._written(rows)
                n += len(rows)
            while revoked:
                await self.index.revoke(revoked[0])
                revoked.pop(0)
            rows = self._rewrite_rows(redo)
            if rows:  # a revoked text stops being another vector's context
                await self._write(rows)
            redo = set()
            assert self.store is not None
            if len(self.store.forgotten) > self._seen_forgets and hasattr(self.index, "purge"):
                await self.index.purge()  # a forgotten owner's rows leave the files too
            self._seen_forgets = len(self.store.forgotten)
        except BaseException:
            self.pending = todo + self.pending
            self.revoked = revoked + self.revoked
            self._redo |= redo
            raise
        finally:
            self.written += n
        return n
