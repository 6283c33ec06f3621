"""The Kafka-free replay: same host records, same vector filters, same pipeline steps."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path
from typing import Any

import numpy as np

from mnemoflow.agents.tuning import load_tuning
from mnemoflow.evaluation import offline
from mnemoflow.evaluation.array_index import ArrayIndex
from mnemoflow.evaluation.embed_cache import DiskCachedEmbedder
from mnemoflow.projections.vector_index import IndexMeta, open_index
from mnemoflow.streams.config import Settings
from mnemoflow.streams.host import HostSession

from factories import tiny_bench

DAY = 86_400_000
T0 = 1_680_000_000_000


class _Producer:
    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    async def send(self, topic: str, schema: str, key: str, rec: dict[str, Any]) -> None:
        self.sent.append(rec)


class _Client:
    def __init__(self) -> None:
        self.producer = _Producer()
        self.settings = Settings()


def test_host_records_equal_what_the_host_sdk_sends() -> None:
    client = _Client()
    hs = HostSession(client, "u/D1", "u")  # type: ignore[arg-type]
    mine = offline.HostSessionRecords("u/D1", "u")

    async def go() -> None:
        await hs.lifecycle("start", T0, offline_manifest())
        await hs.user_message("I adopted a cat named Miso.", T0 + 1, provenance="D1:1")
        await hs.assistant_message("Lovely name!", T0 + 2, provenance="D1:2")
        await hs.user_message("What is my cat called?", T0 + 3, remember=False)

    asyncio.run(go())
    expected = [mine.lifecycle("start", T0, "soft"),
                mine.user_message("I adopted a cat named Miso.", T0 + 1, provenance="D1:1"),
                mine.assistant_message("Lovely name!", T0 + 2, provenance="D1:2"),
                mine.user_message("What is my cat called?", T0 + 3, remember=False)]
    assert client.producer.sent == expected


def offline_manifest() -> Any:
    from mnemoflow.evaluation.replay import manifest

    return manifest("soft")


def _rows(n: int, rng: np.random.Generator) -> tuple[list[dict[str, Any]], np.ndarray]:
    rows = [{"memory_id": f"m{i:03d}", "kind": "segment", "text": f"t{i}",
             "scope": "User", "owner": f"u{i % 3}", "event_time": T0 + i * DAY,
             "expires_at": T0 + 30 * DAY if i % 7 == 0 else 0} for i in range(n)]
    vecs = rng.normal(size=(n, 8)).astype(np.float32)
    return rows, vecs / np.linalg.norm(vecs, axis=1, keepdims=True)


def test_array_index_returns_what_the_lancedb_index_returns(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    rows, vecs = _rows(60, rng)
    lance = open_index(tmp_path / "idx", IndexMeta("fake", 8, "1"))
    arr = ArrayIndex()
    for idx in (lance, arr):
        idx.add(rows, vecs)
        idx.revoke("m005")
    chain = frozenset({("User", "u1"), ("Session", "s"), ("External", "u1")})
    for j in range(5):
        q = rng.normal(size=8).astype(np.float32)
        q /= np.linalg.norm(q)
        before = T0 + (20 + 8 * j) * DAY
        window = (T0 + 5 * DAY, T0 + 25 * DAY) if j % 2 else None
        a = arr.search(q, chain, before, 10, window)
        b = lance.search(q, chain, before, 10, window)
        assert [m for m, _ in a] == [m for m, _ in b]
        assert np.allclose([s for _, s in a], [s for _, s in b], atol=2e-6)
        assert all(int(m[1:]) % 3 == 1 for m, _ in a) and "m005" not in {m for m, _ in a}


class _CountingEmbedder:
    name, dim, version = "fake", 4, "v-test"

    def __init__(self) -> None:
        self.calls: list[str] = []

    def embed(self, texts: list[str]) -> np.ndarray:
        self.calls += texts
        out = np.array([[b / 255 for b in hashlib.sha256(t.encode()).digest()[:4]]
                        for t in texts], dtype=np.float32)
        return out.reshape(len(texts), 4)


def test_disk_cache_embeds_each_text_once_across_instances(tmp_path: Path) -> None:
    inner = _CountingEmbedder()
    a = DiskCachedEmbedder(inner, tmp_path, chunk=2)
    first = a.embed(["x", "y", "x", "z"])
    assert inner.calls == ["x", "y", "z"]
    b = DiskCachedEmbedder(_CountingEmbedder(), tmp_path)
    again = b.embed(["z", "x", "y"])
    assert b.inner.calls == []  # type: ignore[attr-defined]
    assert np.array_equal(again, first[[3, 0, 1]])


def test_lexical_replay_finds_the_evidence_and_never_another_users_memory() -> None:
    bench = tiny_bench()
    world = offline.build_world(bench, load_tuning(), vector=False)
    asked = offline.ask_all(world)
    assert {a.gate_action for a in asked.values()} <= {"retrieve", "prefetch"}
    assert asked["u/q0"].ranked_turns[0] == "D1:1"
    assert asked["u/q1"].ranked_turns[0] == "D2:1"
    owners = {c["owner"] for a in asked.values() for c in a.audit["candidates"]}
    assert owners == {"u"}
    df = offline.score_rows(bench, asked)
    assert df["turn_recall@1"].to_list() == [1.0, 1.0]
    # deterministic: a second world gives the same audited lists
    again = offline.ask_all(offline.build_world(bench, load_tuning(), vector=False))
    assert [a.audit for a in again.values()] == [a.audit for a in asked.values()]
