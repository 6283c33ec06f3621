"""M-06/M-07: MEMORY.md keeps a person's writing; the index rebuilds from the log or from
Markdown alone (after being corrupted) with the same search results."""

from __future__ import annotations

import json

import numpy as np
import pytest

from mnemoflow.agents.candidate import scope_chain
from mnemoflow.agents.observer import ObserverState, observe
from mnemoflow.projections.markdown import events_from_markdown, path_for, write_owner
from mnemoflow.projections.memory_store import MemoryStore
from mnemoflow.projections.rebuild import (
    default_embedder,
    from_markdown,
    missing_from_log,
    rebuild,
)
from mnemoflow.projections.vector_index import IndexMeta, IndexMismatch, open_index

from factories import T0, user_event

TEXTS = {
    "alice": ["My dog is called Rex and he loves the beach.", "I prefer aisle seats on flights.",
              "We visited Lisbon in May and ate pastel de nata.", "My sister works at CERN.",
              "Remember that the storage unit code is 7731."],
    "bob": ["My favourite band is Wilco.", "I went hiking near Zermatt last summer."],
}
QUERIES = [("alice", "what is my dog's name"), ("alice", "where did we travel"),
           ("bob", "which music do I like"), ("alice", "storage code")]


def _events() -> list[dict]:
    out = []
    for user, texts in TEXTS.items():
        st = ObserverState()
        for i, t in enumerate(texts, start=1):
            st, obs = observe(st, "session-events", user_event(f"{user}-s", i, t, T0 + i, user=user))
            out += obs.memory_events
    out.append({**out[0], "eventId": "revoke-1", "op": "memory_revoked"})  # Rex's turn revoked
    return out


async def _search(store: MemoryStore, index, emb) -> list:
    res = []
    for user, q in QUERIES:
        req = {"sessionId": "q", "userId": user, "workspaceId": None, "text": q, "entities": [],
               "eventTime": T0 + 10**6}
        lex = [(c.memory_id, round(c.relevance, 4)) for c in store.search_lexical(req, 5)]
        vec = (await emb.embed([q], 30))[0]
        vs = [(m, round(s, 4)) for m, s in await index.search(vec, scope_chain(req), T0 + 10**6, 5)]
        res.append((lex, vs))
    return res


@pytest.fixture(scope="module")
def emb():
    return default_embedder()


async def test_rebuild_from_log_and_from_markdown_give_the_same_results(tmp_path, emb) -> None:
    md = tmp_path / "md"
    note = path_for(md, "User", "alice")
    note.parent.mkdir(parents=True)
    note.write_text("# Alice's notes\n\nWritten by hand: call back on Tuesday.\n")
    store, index = await rebuild(_events(), tmp_path / "idx", emb, md)
    first = await _search(store, index, emb)
    assert any(first[0][1]) and all(lex or vs for lex, vs in first)
    assert all(m != _events()[0]["memoryId"] for lex, vs in first for m, _ in lex + vs)
    text = note.read_text()
    assert text.startswith("# Alice's notes\n\nWritten by hand: call back on Tuesday.\n")
    assert "storage unit code is 7731" in text and TEXTS["alice"][0] not in text
    # a second projection pass leaves the hand-written part as it was
    write_owner(md, store, "User", "alice")
    assert note.read_text() == text

    for f in [p for p in (tmp_path / "idx").rglob("*.lance") if p.is_file()]:  # truncate data
        f.write_bytes(f.read_bytes()[: max(1, f.stat().st_size // 3)])
    with pytest.raises(Exception):  # noqa: B017 - lance raises its own error types
        broken = await open_index(tmp_path / "idx", IndexMeta(emb.name, emb.dim, emb.version))
        await _search(store, broken, emb)

    store2, index2 = await from_markdown(md, tmp_path / "idx", emb)
    assert await _search(store2, index2, emb) == first


async def test_an_index_of_another_model_is_refused(tmp_path) -> None:
    await open_index(tmp_path / "i", IndexMeta("model-a", 4, "1"))
    with pytest.raises(IndexMismatch):
        await open_index(tmp_path / "i", IndexMeta("model-b", 8, "1"))
    idx = await open_index(tmp_path / "i", IndexMeta("model-b", 8, "1"), rebuild=True)
    assert len(idx) == 0
    await idx.add([{"memory_id": "m", "kind": "segment", "text": "t", "scope": "User", "owner": "u",
              "event_time": 1}], np.ones((1, 8), dtype=np.float32))
    assert len(idx) == 1


def test_only_memories_the_log_never_mentions_are_restored(tmp_path) -> None:
    events = _events()
    revoke = events[-1]
    before = MemoryStore()  # MEMORY.md as written before the revocation reached the log
    for ev in events[:-1]:
        before.apply(ev)
    for user in TEXTS:
        write_owner(tmp_path, before, "User", user)
    recovered = events_from_markdown(tmp_path)
    ids = [ev["memoryId"] for ev in recovered]
    assert revoke["memoryId"] in ids
    assert missing_from_log(recovered, []) == recovered  # the whole log lost
    kept = events[:3]  # part of the log survived, with the revocation
    todo = missing_from_log(recovered, [*kept, revoke])
    assert {ev["memoryId"] for ev in todo} == set(ids) - {ev["memoryId"] for ev in [*kept, revoke]}
    assert revoke["memoryId"] not in {ev["memoryId"] for ev in todo}  # stays revoked
    assert missing_from_log(recovered, [*kept, revoke, *todo]) == []  # a second run adds nothing


async def test_the_worker_opens_a_rebuilt_index_made_with_its_weights_file(tmp_path, emb) -> None:
    from mnemoflow.agents.tuning import load_tuning
    from mnemoflow.streams.config import Settings
    from mnemoflow.streams.worker import build_pipeline, memory_dir

    weights = tmp_path / "weights.json"  # an index section of its own, as calibration writes
    weights.write_text(json.dumps({"index": {"vector_context_weight": 0.123}}))
    s = Settings(home=tmp_path / "home", app_id="app", store="memory://", bootstrap=None,
                 weights_file=str(weights))
    tuning = load_tuning(s.weights_file).index
    _, index = await rebuild(_events(), memory_dir(s) / "p0" / "vectors", emb, tuning=tuning)
    rows = len(index)
    runner = build_pipeline(s, "127.0.0.1:9")
    # taking partition 0 opens its index: the same index meta, else IndexMismatch
    part = await runner.memory.assign(0)
    assert len(part.index) == rows > 0


async def test_the_worker_replaces_an_index_of_an_older_layout(tmp_path, emb) -> None:
    from mnemoflow.agents.tuning import load_tuning
    from mnemoflow.projections.vector_tier import index_meta
    from mnemoflow.streams.worker import open_or_replace

    path = tmp_path / "lancedb"
    meta = index_meta(emb, load_tuning().index)
    path.mkdir()
    (path / "index_meta.json").write_text(json.dumps({**meta.to_json(), "layout": "per-kind/2"}))
    with pytest.raises(IndexMismatch):
        await open_index(path, meta)
    index = await open_or_replace(path, meta)
    assert len(index) == 0 and index.near is not None  # vectors held by default
    assert json.loads((path / "index_meta.json").read_text())["layout"] != "per-kind/2"
    assert (await open_or_replace(path, meta, held_vectors=False)).near is None
