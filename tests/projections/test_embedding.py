"""The numpy MiniLM against the PyTorch reference fixture, plus the cache and async wrappers.

The fixture (shared/fixtures/minilm_reference.json) is required: without it these tests fail,
they never skip, because a silently skipped reference check is how an index fills up with
vectors from a subtly wrong model.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mnemoflow.projections.embedding import (
    MAX_SHARDS,
    MINILM_SAFETENSORS_SHA256,
    AsyncEmbedder,
    CachedEmbedder,
    Embedder,
    EmbeddingIntegrityError,
    MiniLMEmbedder,
)

MAX_ABS_DIFF = 1e-5  # per component; the fixture README measured 3.6e-7 for float32 numpy
MIN_COSINE = 0.999999  # float64 cosine divided by both norms


def _shared_dir() -> Path:
    env = os.environ.get("MNEMOFLOW_SHARED")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2].parent / "shared"


FIXTURE = _shared_dir() / "fixtures" / "minilm_reference.json"


@pytest.fixture(scope="module")
def reference() -> dict[str, Any]:
    if not FIXTURE.is_file():
        pytest.fail(f"reference fixture missing: {FIXTURE} (set MNEMOFLOW_SHARED to the directory "
                    f"that contains fixtures/)")
    data = json.loads(FIXTURE.read_text(encoding="utf-8"))
    assert len(data["items"]) == 40
    return data


@pytest.fixture(scope="module")
def minilm() -> MiniLMEmbedder:
    emb = MiniLMEmbedder()
    emb.load()
    return emb


class CountingEmbedder:
    """A deterministic fake: records every batch it is asked to embed."""

    name = "fake/counting"
    dim = 4
    version = "test"

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def embed(self, texts: list[str]) -> np.ndarray:
        self.calls.append(list(texts))
        out = np.array([[len(t), t.count("a"), 1.0, 0.5] for t in texts], dtype=np.float32)
        return out / np.linalg.norm(out, axis=1, keepdims=True)


class BlockingEmbedder(CountingEmbedder):
    """Blocks in embed() until released: a model that is too slow for the deadline."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.started = threading.Event()

    def embed(self, texts: list[str]) -> np.ndarray:
        self.started.set()
        self.release.wait(10)
        return super().embed(texts)


# ------------------------------------------------------------------ reference fixture


def test_fixture_pins_the_same_weights(reference: dict[str, Any]) -> None:
    assert reference["weights_sha256"] == MINILM_SAFETENSORS_SHA256
    assert reference["dim"] == 384 and reference["max_seq_length"] == 256


@pytest.mark.parametrize("batch_size", [1, 32])
def test_all_40_items_match_reference(reference: dict[str, Any], batch_size: int) -> None:
    emb = MiniLMEmbedder(batch_size=batch_size)
    items = reference["items"]
    got = emb.embed([it["text"] for it in items]).astype(np.float64)
    want = np.array([it["embedding"] for it in items], dtype=np.float64)
    assert got.shape == want.shape == (40, 384)

    max_abs = np.abs(got - want).max(axis=1)
    cosine = (got * want).sum(axis=1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
    bad = [
        (i, float(max_abs[i]), float(cosine[i]), items[i]["text"][:40])
        for i in range(len(items))
        if not (max_abs[i] <= MAX_ABS_DIFF and cosine[i] >= MIN_COSINE)
    ]
    assert not bad, f"items outside tolerance (index, max|diff|, cosine, text): {bad}"
    print(f"batch_size={batch_size}: max abs diff {max_abs.max():.3g}, "
          f"min cosine {cosine.min():.12f}")


def test_token_counts_truncation(reference: dict[str, Any], minilm: MiniLMEmbedder) -> None:
    items = reference["items"]
    # item 28: 152 pieces, which the packaged tokenizer.json (max_length 128) would cut short
    assert minilm.token_counts([items[28]["text"]]) == [items[28]["n_tokens"]] == [152]
    # item 39: 425 pieces, truncated to 256 = [CLS] + 254 + [SEP]
    assert minilm.token_counts([items[39]["text"]]) == [items[39]["n_tokens"]] == [256]
    assert minilm.token_counts([it["text"] for it in items]) == [it["n_tokens"] for it in items]


def test_output_contract(minilm: MiniLMEmbedder) -> None:
    assert isinstance(minilm, Embedder)
    assert (minilm.name, minilm.dim) == ("sentence-transformers/all-MiniLM-L6-v2", 384)
    assert minilm.version
    texts = ["a much longer sentence about kafka partitions and consumer lag", "ok", ""]
    out = minilm.embed(texts)
    assert out.dtype == np.float32 and out.shape == (3, 384)
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-6)
    # order is the caller's, whatever the internal length sort does
    np.testing.assert_allclose(minilm.embed(texts[::-1]), out[::-1], atol=1e-6)
    assert minilm.embed([]).shape == (0, 384)
    with pytest.raises(TypeError):
        minilm.embed("a bare string")  # type: ignore[arg-type]


# ------------------------------------------------------------------ integrity


def test_wrong_expected_hash_is_refused() -> None:
    emb = MiniLMEmbedder(expected_sha256="0" * 64)  # lazy: constructing does not load
    assert not emb.loaded
    with pytest.raises(EmbeddingIntegrityError, match="sha256"):
        emb.embed(["hello"])
    assert not emb.loaded


def test_tampered_weights_are_refused(tmp_path: Path, minilm: MiniLMEmbedder) -> None:
    src = minilm.model_dir
    for name in ("config.json", "tokenizer.json"):
        shutil.copy(src / name, tmp_path / name)
    data = bytearray((src / "model.safetensors").read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit inside the tensor data: still parses fine
    (tmp_path / "model.safetensors").write_bytes(bytes(data))

    emb = MiniLMEmbedder(tmp_path)
    with pytest.raises(EmbeddingIntegrityError, match="does not match"):
        emb.load()
    assert not emb.loaded


# ------------------------------------------------------------------ cache


def test_cache_second_call_is_a_hit(minilm: MiniLMEmbedder) -> None:
    cached = CachedEmbedder(minilm, max_entries=100)
    assert isinstance(cached, Embedder) and cached.dim == 384
    first = cached.embed(["replayed memory text"])
    assert (cached.hits, cached.misses) == (0, 1)
    second = cached.embed(["replayed memory text"])
    assert (cached.hits, cached.misses) == (1, 1)
    np.testing.assert_array_equal(first, second)
    second[0, 0] = 42.0  # the caller's copy; the cache must not change
    np.testing.assert_array_equal(cached.embed(["replayed memory text"]), first)


def test_cache_dedupes_and_evicts_lru() -> None:
    inner = CountingEmbedder()
    cached = CachedEmbedder(inner, max_entries=2)
    out = cached.embed(["a", "bb", "a"])
    assert inner.calls == [["a", "bb"]]  # a repeat within one call is embedded once
    np.testing.assert_array_equal(out[0], out[2])
    assert (cached.hits, cached.misses) == (1, 2)

    cached.embed(["a"])  # touch "a": "bb" is now least recently used
    cached.embed(["ccc"])  # evicts "bb"
    assert len(cached) == 2
    cached.embed(["a", "bb"])
    assert inner.calls[-1] == ["bb"]


def test_disk_cache_embeds_each_text_once_across_instances(tmp_path: Path) -> None:
    inner = CountingEmbedder()
    a = CachedEmbedder(inner, disk_dir=tmp_path, chunk=2)
    first = a.embed(["x", "y", "x", "z"])
    assert inner.calls == [["x", "y"], ["z"]]  # misses go in chunks, each written to disk
    assert (a.hits, a.misses, a.on_disk) == (1, 3, 3)
    b = CachedEmbedder(CountingEmbedder(), disk_dir=tmp_path)
    again = b.embed(["z", "x", "y"])
    assert b.inner.calls == [] and (b.hits, b.misses) == (3, 0)  # type: ignore[attr-defined]
    np.testing.assert_array_equal(again, first[[3, 0, 1]])
    other = CountingEmbedder()
    other.version = "another"  # vectors of another model version are never read
    CachedEmbedder(other, disk_dir=tmp_path).embed(["x"])
    assert other.calls == [["x"]]


def test_disk_cache_serves_what_the_memory_lru_evicted(tmp_path: Path) -> None:
    inner = CountingEmbedder()
    cached = CachedEmbedder(inner, max_entries=1, disk_dir=tmp_path)
    first = cached.embed(["a", "bb"])
    assert len(cached) == 1 and cached.on_disk == 2
    np.testing.assert_array_equal(cached.embed(["a"]), first[:1])
    assert inner.calls == [["a", "bb"]]


def test_disk_cache_finds_keys_that_end_in_nul_bytes(tmp_path: Path) -> None:
    """numpy strips trailing NULs from the fixed-width keys it stores; they must still match."""
    text = next(t for i in range(10_000) if hashlib.sha256((t := f"t{i}").encode()).digest()[-1] == 0)
    CachedEmbedder(CountingEmbedder(), disk_dir=tmp_path).embed([text])
    inner = CountingEmbedder()
    CachedEmbedder(inner, disk_dir=tmp_path).embed([text])
    assert inner.calls == []


def test_many_disk_shards_are_merged_into_one_and_writes_hold_no_file_open(tmp_path: Path) -> None:
    writer = CachedEmbedder(CountingEmbedder(), disk_dir=tmp_path, chunk=1)
    fds = len(os.listdir("/proc/self/fd"))
    texts = [f"text {i}" for i in range(MAX_SHARDS + 8)]
    first = np.concatenate([writer.embed([t]) for t in texts])  # a shard per miss
    assert len(os.listdir("/proc/self/fd")) - fds < 8  # none of them held open
    folder = tmp_path / CountingEmbedder.version
    assert len(list(folder.glob("*.keys.npy"))) == len(texts)
    (folder / "torn.keys.npy").write_bytes(b"not a numpy file")  # dropped by the merge
    inner = CountingEmbedder()
    reader = CachedEmbedder(inner, disk_dir=tmp_path)
    assert len(list(folder.glob("*.keys.npy"))) == 1 == len(list(folder.glob("*.vecs.npy")))
    np.testing.assert_array_equal(reader.embed(texts), first)
    assert inner.calls == [] and reader.on_disk == len(texts)
    CachedEmbedder(CountingEmbedder(), disk_dir=tmp_path).embed(texts)  # a few: left as they are
    assert len(list(folder.glob("*.keys.npy"))) == 1


class FailingAfter(CountingEmbedder):
    def __init__(self, calls_ok: int) -> None:
        super().__init__()
        self.calls_ok = calls_ok

    def embed(self, texts: list[str]) -> np.ndarray:
        if len(self.calls) >= self.calls_ok:
            raise RuntimeError("killed")
        return super().embed(texts)


def test_a_failed_run_keeps_the_chunks_it_embedded_and_skips_torn_shards(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError):
        CachedEmbedder(FailingAfter(1), disk_dir=tmp_path, chunk=2).embed(["a", "b", "c", "d"])
    folder = tmp_path / CountingEmbedder.version
    (folder / "torn.keys.npy").write_bytes(b"not a numpy file")
    (folder / "torn.vecs.npy").write_bytes(b"")
    inner = CountingEmbedder()
    resumed = CachedEmbedder(inner, disk_dir=tmp_path)
    resumed.embed(["a", "b", "c", "d"])
    assert inner.calls == [["c", "d"]]


# ------------------------------------------------------------------ async


async def test_async_embed_returns_vectors(minilm: MiniLMEmbedder) -> None:
    async with AsyncEmbedder(CachedEmbedder(minilm)) as aemb:
        await aemb.warm_up()
        out = await aemb.embed(["the loop keeps running"], timeout=30.0)
    assert out.shape == (1, 384)
    np.testing.assert_allclose(out, minilm.embed(["the loop keeps running"]), atol=1e-6)


async def test_async_timeout_raises_so_callers_fall_back() -> None:
    slow = BlockingEmbedder()
    aemb = AsyncEmbedder(slow)
    try:
        t0 = time.monotonic()
        with pytest.raises(asyncio.TimeoutError):
            await aemb.embed(["too slow"], timeout=0.05)
        assert time.monotonic() - t0 < 2.0  # the deadline, not the model, decided
        assert slow.started.is_set()
    finally:
        slow.release.set()
        aemb.close(wait=True)


async def test_calls_waiting_for_a_running_pass_share_the_next_one() -> None:
    """Under load the waiting calls (queries, sink rows) go through one forward pass, and
    each caller gets exactly its own rows back."""
    slow = BlockingEmbedder()
    aemb = AsyncEmbedder(slow)
    try:
        first = asyncio.ensure_future(aemb.embed(["first"], timeout=30.0))
        while not slow.started.is_set():
            await asyncio.sleep(0.01)
        waiting = [asyncio.ensure_future(aemb.embed([f"q{i}", f"r{i}"][: 1 + i % 2], 30.0))
                   for i in range(5)]
        slow.release.set()
        out = await asyncio.gather(first, *waiting)
        assert aemb.passes == 2  # the running pass, then one for all five that waited
        assert [len(o) for o in out] == [1, 1, 2, 1, 2, 1]
        assert len(slow.calls) == 2 and len(slow.calls[1]) == 7
        np.testing.assert_allclose(out[2], CountingEmbedder().embed(["q1", "r1"]))
    finally:
        slow.release.set()
        aemb.close(wait=True)
