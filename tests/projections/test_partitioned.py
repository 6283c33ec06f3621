"""The partitioned memory: events land where Kafka's partitioner puts them, a request reads
its user's partition and the shared memory, and no placement lets a memory cross owners."""

from __future__ import annotations

import os

import pytest
from aiokafka.partitioner import murmur2 as kafka_murmur2

from mnemoflow.agents.partitioning import memory_topic, murmur2, partition_of, request_key
from mnemoflow.agents.tuning import load_tuning
from mnemoflow.projections.array_index import ArrayIndex
from mnemoflow.projections.embedding import AsyncEmbedder, CachedEmbedder
from mnemoflow.projections.partitioned import build_partitioned
from mnemoflow.projections.vector_tier import index_meta

from factories import T0, HashEmbedder, memory_event

PARTS = 4


def test_the_partitioner_is_kafkas() -> None:
    for n in range(0, 40):
        for _ in range(20):
            data = os.urandom(n)
            assert murmur2(data) == kafka_murmur2(data) & 0xFFFFFFFF
    assert partition_of("u1", 4) == (kafka_murmur2(b"u1") & 0x7FFFFFFF) % 4


def test_users_memories_go_to_the_log_and_the_rest_to_the_shared_topic() -> None:
    assert memory_topic(memory_event("a", [], scope="User")) == "memory-log"
    assert memory_topic(memory_event("a", [], scope="External")) == "memory-log"
    for scope in ("Session", "Workspace", "Turn"):
        assert memory_topic(memory_event("a", [], scope=scope)) == "memory-shared"
    assert request_key({"userId": "u7", "sessionId": "s"}) == "u7"


def _users(n_per_part: int) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {p: [] for p in range(PARTS)}
    i = 0
    while any(len(v) < n_per_part for v in out.values()):
        u = f"user{i}"
        if len(out[partition_of(u, PARTS)]) < n_per_part:
            out[partition_of(u, PARTS)].append(u)
        i += 1
    return out


@pytest.mark.parametrize("held", [range(PARTS), [0], [1, 3]])
async def test_no_memory_crosses_owners_wherever_partitions_are_held(held) -> None:
    mem = build_partitioned(load_tuning(), PARTS, graph=False)
    await mem.start()
    for p in held:
        await mem.assign(p)
    users = _users(2)
    everyone = [u for us in users.values() for u in us]
    for u in everyone:
        ev = memory_event(f"m-{u}", ["zebra", "locker"], owner=u, t=T0)
        part = mem.memory_for(memory_topic(ev), partition_of(u, PARTS))
        if part is not None:
            part.apply(ev)
    ws = memory_event("ws-1", ["zebra", "locker"], owner="w1", scope="Workspace", t=T0)
    mem.shared.apply(ws)
    tier = next(t.tier for t in mem.tiers if t.tier.name == "lexical")
    for u in everyone:
        for workspace in ("w1", "w2"):
            req = {"sessionId": f"s-{u}", "userId": u, "workspaceId": workspace,
                   "text": "zebra locker", "entities": [], "eventTime": T0 + 1,
                   "timeWindow": None}
            found = {c.memory_id for c in await tier.search(req, 10, ())}
            own = {f"m-{u}"} if partition_of(u, PARTS) in held else set()
            assert found == own | ({"ws-1"} if workspace == "w1" else set())


class _CountingHash(HashEmbedder):
    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def embed(self, texts: list[str]):
        self.calls.append(list(texts))
        return super().embed(texts)


async def test_waiting_queries_are_embedded_in_one_pass_and_found_by_the_tier() -> None:
    """Recall requests taken together (the worker's `MNEMOFLOW_RECALL_BATCH`) have their queries
    embedded in one forward pass; each one's vector tier then finds its query in the cache, and
    answers as it would alone. A request whose chain holds no memory is not embedded at all."""
    tuning = load_tuning()
    inner = _CountingHash()
    cache = CachedEmbedder(inner)
    emb = AsyncEmbedder(cache)
    meta = index_meta(emb, tuning.index)
    mem = build_partitioned(tuning, PARTS, index_for=lambda p, folder: ArrayIndex(meta),
                            embedder=emb, graph=False)
    await mem.hold_all()
    users = [u for us in _users(1).values() for u in us]
    for u in users:
        mem.apply(memory_event(f"m-{u}", ["zebra", "locker"], owner=u, t=T0))
    await mem.flush()

    def ask(u: str, text: str) -> dict:
        return {"sessionId": f"s-{u}", "userId": u, "workspaceId": "w9", "text": text,
                "entities": [], "eventTime": T0 + 1, "timeWindow": None}

    asks = [ask(u, f"where is the {u} locker") for u in users] + [ask("nobody", "zebra?")]
    alone = [{c.memory_id for c in await next(
        t.tier for t in mem.tiers if t.tier.name == "vector").search(r, 5, ())} for r in asks]
    cache.clear()
    inner.calls.clear()
    assert await mem.warm_queries(asks[::-1], timeout=5) == len(users)
    assert inner.calls == [[r["text"] for r in asks[::-1] if r["userId"] != "nobody"]]
    vector = next(t.tier for t in mem.tiers if t.tier.name == "vector")
    after = [{c.memory_id for c in await vector.search(r, 5, ())} for r in asks]
    assert inner.calls[1:] == []  # every query was found in the cache
    assert after == alone and after[-1] == set()
    assert await mem.warm_queries(asks[:1], timeout=5) == 0  # one alone: its step embeds it
