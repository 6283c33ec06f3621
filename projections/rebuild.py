"""Rebuild the projections (lexical store, LanceDB index, MEMORY.md) from memory-log records,
and work out what MEMORY.md can give back to a memory-log that lost records.

The worker's recall reads the MemoryStore it folds from the memory-log, plus the LanceDB index
at $MNEMOFLOW_HOME/lancedb/<app>, whose rows it returns only for memories that store holds.
An index rebuilt from MEMORY.md while the log is empty therefore recalls nothing. So
`mnemoflow rebuild --from markdown` first appends to the memory-log the records MEMORY.md holds
and the log does not (`missing_from_log`; the Kafka side is streams/restore.py), then rebuilds
from the log exactly as `--from memory-log` does.

`rebuild` folds as the worker's projector does: the same IndexTuning (so the same index meta,
and a worker started afterwards opens the index instead of refusing it), an event reaches the
sinks only when the store applied it, and the vector rows are made by the same VectorSink. A
worker started afterwards finds every row it would have written itself and embeds nothing
again. Stop the worker first: it owns the index while it runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mnemoflow.agents.tuning import IndexTuning, packaged_index_tuning
from mnemoflow.projections.embedders import DEFAULT_MODEL, build_embedder
from mnemoflow.projections.embedding import AsyncEmbedder, CachedEmbedder
from mnemoflow.projections.embedding_onnx import DEFAULT_BACKEND
from mnemoflow.projections.markdown import MarkdownSink, events_from_markdown
from mnemoflow.projections.memory_store import MemoryStore
from mnemoflow.projections.vector_index import VectorIndex, open_index
from mnemoflow.projections.vector_tier import VectorSink, index_meta


class MarkdownIncomplete(RuntimeError):
    """The store and the index were rebuilt, but some owners' MEMORY.md could not be written."""


def default_embedder(backend: str = DEFAULT_BACKEND, model: str = DEFAULT_MODEL) -> AsyncEmbedder:
    """`model`: Settings.embedding_model; `backend`: Settings.embedder (MiniLM's forward pass,
    onnx or numpy; the vectors are the same)."""
    return AsyncEmbedder(CachedEmbedder(build_embedder(model, backend)))


async def rebuild(events: list[dict[str, Any]], index_path: Path, embedder: AsyncEmbedder,
                  markdown_root: Path | None = None, tuning: IndexTuning | None = None
                  ) -> tuple[MemoryStore, VectorIndex]:
    """Fold `events` (memory-log records in log order) into a fresh store, re-embed them into a
    fresh index at `index_path`, and rewrite the owners' MEMORY.md under `markdown_root`.

    `tuning`: the index section the worker runs with (`load_tuning(MNEMOFLOW_WEIGHTS).index`);
    the packaged one by default, as in the worker without MNEMOFLOW_WEIGHTS. Raises
    MarkdownIncomplete, after everything else is built, when an owner's file was not written.
    """
    tuning = tuning if tuning is not None else packaged_index_tuning()
    store = MemoryStore(index=tuning)
    index = await open_index(index_path, index_meta(embedder, tuning), rebuild=True)
    vectors = VectorSink(index, embedder, store=store,
                         context_weight=tuning.vector_context_weight,
                         embed_max_chars=tuning.embed_max_chars)
    md = MarkdownSink(markdown_root, store) if markdown_root else None
    sinks: list[VectorSink | MarkdownSink] = [vectors] + ([md] if md else [])
    for ev in events:
        if store.apply(ev):  # False: a record written twice (at-least-once), already folded
            for sink in sinks:
                sink.on_event(ev)
    await vectors.flush()
    if md:
        await md.flush()
        if md.dirty:
            raise MarkdownIncomplete(
                f"MEMORY.md of {len(md.dirty)} owner(s) not written under {markdown_root} "
                f"(see the warnings above); the index and the memory-log are complete")
    return store, index


def missing_from_log(recovered: list[dict[str, Any]],
                     log_events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records recovered from MEMORY.md (`events_from_markdown`) for memories the log never
    mentions. A memory the log mentions at all is the log's to say: it may have been revoked
    after MEMORY.md was written, and must not come back. Appending the result and asking
    again gives nothing: the appended records mention their memories."""
    held = {ev["memoryId"] for ev in log_events}
    return [ev for ev in recovered if ev["memoryId"] not in held]


async def from_markdown(root: Path, index_path: Path, embedder: AsyncEmbedder,
                        tuning: IndexTuning | None = None) -> tuple[MemoryStore, VectorIndex]:
    """The projections of the MEMORY.md files alone, without Kafka (tests, inspection). The
    worker does not recall from such an index unless its memory-log holds the same memories:
    `mnemoflow rebuild --from markdown` puts them back there first."""
    return await rebuild(events_from_markdown(root), index_path, embedder, tuning=tuning)
