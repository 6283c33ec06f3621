"""Rebuild the projections (lexical store, LanceDB index, MEMORY.md) from the memory-log or
from the Markdown files alone. Stop the worker first: it owns the index while it runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mnemoflow.projections.embedding import AsyncEmbedder, CachedEmbedder, MiniLMEmbedder
from mnemoflow.projections.markdown import MarkdownSink, events_from_markdown
from mnemoflow.projections.memory_store import MemoryStore
from mnemoflow.projections.vector_index import VectorIndex, open_index
from mnemoflow.projections.vector_tier import VectorSink, index_meta


def default_embedder() -> AsyncEmbedder:
    return AsyncEmbedder(CachedEmbedder(MiniLMEmbedder()))


async def rebuild(events: list[dict[str, Any]], index_path: Path, embedder: AsyncEmbedder,
                  markdown_root: Path | None = None) -> tuple[MemoryStore, VectorIndex]:
    """Fold `events` into a fresh store, re-embed into a fresh index, optionally rewrite Markdown."""
    store = MemoryStore()
    index = open_index(index_path, index_meta(embedder, store.index_tuning), rebuild=True)
    sink = VectorSink(index, embedder, store=store)
    md = MarkdownSink(markdown_root, store) if markdown_root else None
    for ev in events:
        store.apply(ev)
        sink.on_event(ev)
        if md:
            md.on_event(ev)
    await sink.flush()
    if md:
        await md.flush()
    return store, index


async def from_markdown(root: Path, index_path: Path,
                        embedder: AsyncEmbedder) -> tuple[MemoryStore, VectorIndex]:
    return await rebuild(events_from_markdown(root), index_path, embedder)
