"""VectorSink: a segment's vector carries its session's previous live turn as context; VectorTier
returns the recallable records the index finds."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from mnemoflow.projections.array_index import ArrayIndex
from mnemoflow.projections.embedding import AsyncEmbedder
from mnemoflow.projections.memory_store import MemoryStore
from mnemoflow.projections.vector_index import IndexMeta
from mnemoflow.projections.vector_tier import VectorSink, VectorTier, blend, head

from factories import HashEmbedder

T0 = 1_700_000_000_000


EMB = HashEmbedder()
META = IndexMeta(EMB.name, EMB.dim, EMB.version)


def seg(mid: str, sid: str, text: str, seq: int) -> dict[str, Any]:
    return {"eventId": f"e:{mid}", "op": "segment_recorded", "memoryId": mid, "kind": "segment",
            "text": text, "scope": "User", "owner": "u", "sessionId": sid, "eventSeq": seq,
            "eventTime": T0 + seq, "ttlMs": None, "entities": [], "provenance": [],
            "attributes": {}}


def own(text: str) -> np.ndarray:
    return EMB.embed([text])[0]


async def run(events: list[dict[str, Any]], weight: float = 0.5,
              index: ArrayIndex | None = None) -> ArrayIndex:
    index = index or ArrayIndex(META)
    async with AsyncEmbedder(EMB) as emb:
        sink = VectorSink(index, emb, batch=2, context_weight=weight)
        for ev in events:
            sink.on_event(ev)
        await sink.flush()
    return index


LOG = [seg("a", "s1", "Which team did you sign with?", 1), seg("b", "s1", "The Wolves!", 2),
       seg("c", "s1", "Congrats, when do you start?", 3), seg("x", "s2", "Unrelated chat", 1)]


def test_blend_is_normalised_and_own_without_context() -> None:
    v = blend(own("a"), own("b"), 0.5)
    assert np.linalg.norm(v) == pytest.approx(1.0, abs=1e-6)
    assert np.allclose(v, (own("a") + 0.5 * own("b")) / np.linalg.norm(own("a") + 0.5 * own("b")))
    assert np.array_equal(blend(own("a"), None, 0.5), own("a"))
    assert np.array_equal(blend(own("a"), own("b"), 0.0), own("a"))


async def test_each_segment_is_blended_with_the_previous_turn_of_its_session() -> None:
    idx = await run(LOG)
    assert np.allclose(await idx.vector("a"), own(LOG[0]["text"]))  # first of its session
    assert np.allclose(await idx.vector("b"),
                       blend(own(LOG[1]["text"]), own(LOG[0]["text"]), 0.5))
    assert np.allclose(await idx.vector("c"),
                       blend(own(LOG[2]["text"]), own(LOG[1]["text"]), 0.5))
    assert np.allclose(await idx.vector("x"), own(LOG[3]["text"]))  # sessions never share context
    plain = await run(LOG, weight=0.0)
    for e in LOG:
        assert np.allclose(await plain.vector(e["memoryId"]), own(e["text"]))


async def test_revoking_a_turn_re_embeds_the_next_with_the_turn_before() -> None:
    revoke = {**LOG[1], "op": "memory_revoked", "eventId": "rv:b"}
    idx = await run(LOG + [revoke])
    assert await idx.vector("b") is None
    assert np.allclose(await idx.vector("c"),
                       blend(own(LOG[2]["text"]), own(LOG[0]["text"]), 0.5))
    # the same as a rebuild that never saw the revoked turn
    rebuilt = await run([LOG[0], LOG[2], LOG[3]])
    assert np.allclose(await rebuilt.vector("c"), await idx.vector("c"))


async def test_a_restarted_sink_rebuilds_the_context_from_the_replayed_log() -> None:
    idx = await run(LOG[:2])  # first run: a and b written
    await run(LOG, index=idx)  # restart: the whole log again, only c and x are new
    assert np.allclose(await idx.vector("c"),
                       blend(own(LOG[2]["text"]), own(LOG[1]["text"]), 0.5))
    assert len(idx) == 4


async def test_only_the_head_of_a_long_memory_is_embedded() -> None:
    assert head("short text", 0) == "short text"
    assert head("alpha beta gamma delta", 14) == "alpha beta"  # cut at the last space
    assert head("x" * 40, 10) == "x" * 10  # no space: a hard cut
    long = "word " * 200
    idx = ArrayIndex(META)
    async with AsyncEmbedder(EMB) as emb:
        sink = VectorSink(idx, emb, context_weight=0.0, embed_max_chars=50)
        sink.on_event(seg("l", "s9", long, 1))
        await sink.flush()
    assert np.allclose(await idx.vector("l"), own(head(long, 50)))


class FlakyEmbedder(HashEmbedder):
    def __init__(self) -> None:
        self.fail = True

    def embed(self, texts: list[str]) -> np.ndarray:
        if self.fail:
            self.fail = False
            raise RuntimeError("embedder down")
        return super().embed(texts)


async def test_rows_of_a_failed_flush_are_written_by_the_next() -> None:
    idx = ArrayIndex(META)
    async with AsyncEmbedder(FlakyEmbedder()) as emb:
        sink = VectorSink(idx, emb, context_weight=0.5)
        for ev in LOG:
            sink.on_event(ev)
        with pytest.raises(RuntimeError):
            await sink.flush()
        assert len(idx) == 0
        assert await sink.flush() == len(LOG)
    assert np.allclose(await idx.vector("b"),
                       blend(own(LOG[1]["text"]), own(LOG[0]["text"]), 0.5))


async def test_revoking_a_turn_after_its_successor_was_written_rewrites_the_successor() -> None:
    idx = ArrayIndex(META)
    async with AsyncEmbedder(EMB) as emb:
        sink = VectorSink(idx, emb, context_weight=0.5)
        for ev in LOG:
            sink.on_event(ev)
        await sink.flush()
        assert np.allclose(await idx.vector("c"),
                           blend(own(LOG[2]["text"]), own(LOG[1]["text"]), 0.5))
        sink.on_event({**LOG[1], "op": "memory_revoked", "eventId": "rv:b"})
        await sink.flush()
    assert await idx.vector("b") is None
    assert np.allclose(await idx.vector("c"),
                       blend(own(LOG[2]["text"]), own(LOG[0]["text"]), 0.5))


async def tier_over(events: list[dict[str, Any]], emb: AsyncEmbedder) -> VectorTier:
    store = MemoryStore()
    idx = ArrayIndex(META)
    sink = VectorSink(idx, emb, store=store, context_weight=0.0)
    for ev in events:
        store.apply(ev)
        sink.on_event(ev)
    await sink.flush()
    return VectorTier(store, idx, emb)


REQ = {"sessionId": "q", "userId": "u", "workspaceId": None, "text": LOG[2]["text"],
       "eventTime": T0 + 10, "timeWindow": None}


async def test_the_tier_returns_only_recallable_records_nearest_first() -> None:
    async with AsyncEmbedder(EMB) as emb:
        tier = await tier_over(LOG, emb)
        tier.store.apply({**LOG[0], "op": "memory_revoked", "eventId": "rv:a"})  # index not told
        assert "a" in tier.index.ids
        found = await tier.search(REQ, 10, ())
    assert [c.memory_id for c in found][0] == "c"  # its own text is nearest
    assert found[0].relevance == pytest.approx(1.0, abs=1e-5)
    assert {c.memory_id for c in found} == {"b", "c", "x"}  # revoked a is not recalled


async def test_a_time_window_adds_its_own_nearest_after_the_k_nearest() -> None:
    async with AsyncEmbedder(EMB) as emb:
        tier = await tier_over(LOG[1:], emb)  # b (T0+2), c (T0+3), x (T0+1)
        plain = await tier.search(REQ, 2, ())
        windowed = await tier.search({**REQ, "timeWindow": [T0 + 2, T0 + 3]}, 2, ())
    assert [c.memory_id for c in plain] == ["c", "x"]  # with HashEmbedder, x is nearer than b
    assert [c.memory_id for c in windowed] == ["c", "x", "b"]


async def test_no_memory_of_the_request_s_owners_means_no_embedding_and_no_query() -> None:
    class Counting(HashEmbedder):
        texts: list[str] = []

        def embed(self, texts):  # type: ignore[no-untyped-def]
            Counting.texts += list(texts)
            return super().embed(texts)

    async with AsyncEmbedder(Counting()) as emb:
        tier = await tier_over(LOG, emb)  # every memory is user u's
        queries: list[Any] = []
        search = tier.index.search

        async def counted(*a: Any, **kw: Any) -> Any:
            queries.append(a)
            return await search(*a, **kw)

        tier.index.search = counted  # type: ignore[method-assign]
        Counting.texts.clear()
        stranger = {**REQ, "sessionId": "q2", "userId": "v"}
        assert await tier.search(stranger, 10, ()) == []
        assert Counting.texts == [] and queries == []
        assert {c.memory_id for c in await tier.search(REQ, 10, ())} == {"a", "b", "c", "x"}
        assert Counting.texts == [REQ["text"]] and len(queries) == 1


async def test_a_model_with_roles_gets_queries_and_passages_marked() -> None:
    class Roles(HashEmbedder):
        query_prefix, passage_prefix = "query: ", "passage: "
        texts: list[str] = []

        def embed(self, texts):  # type: ignore[no-untyped-def]
            Roles.texts += list(texts)
            return super().embed(texts)

    async with AsyncEmbedder(Roles()) as emb:
        tier = await tier_over(LOG, emb)
        written = list(Roles.texts)
        Roles.texts.clear()
        found = await tier.search(REQ, 10, ())
    assert Roles.texts == ["query: " + REQ["text"]]
    assert written and all(t.startswith("passage: ") for t in written)
    assert {"passage: " + e["text"] for e in LOG} <= set(written)
    # the memory is stored as written by the host; only what is embedded carries the role
    assert tier.store.records["c"].text == LOG[2]["text"] and found
