"""The ONNX Runtime MiniLM against the PyTorch reference fixture and against the numpy path.

Held to exactly the tolerance test_embedding.py holds the numpy path to (the fixture README's
bound for a faithful float32 reimplementation). Like those tests, these fail rather than skip
when the fixture is missing.
"""

from __future__ import annotations

import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mnemoflow.projections.embedding import (
    Embedder,
    EmbeddingIntegrityError,
    MiniLMEmbedder,
    _plan_batches,
)
from mnemoflow.projections.embedding_onnx import (
    DEFAULT_BACKEND,
    OnnxMiniLMEmbedder,
    build_minilm_graph,
    minilm_embedder,
)
from mnemoflow.streams.config import ConfigError, Settings

MAX_ABS_DIFF = 1e-5  # per component: the same bound as test_embedding.py's numpy path
MIN_COSINE = 0.999999  # float64 cosine divided by both norms, as there


@pytest.fixture(scope="module")
def reference(shared_dir: Path) -> dict[str, Any]:
    data = json.loads((shared_dir / "fixtures" / "minilm_reference.json").read_text(encoding="utf-8"))
    assert len(data["items"]) == 40
    return data


@pytest.fixture(scope="module")
def onnx_emb() -> OnnxMiniLMEmbedder:
    emb = OnnxMiniLMEmbedder()
    emb.load()
    return emb


@pytest.fixture(scope="module")
def numpy_emb() -> MiniLMEmbedder:
    emb = MiniLMEmbedder()
    emb.load()
    return emb


def _outside_tolerance(got: np.ndarray, want: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[int]]:
    got, want = got.astype(np.float64), want.astype(np.float64)
    max_abs = np.abs(got - want).max(axis=1)
    cosine = (got * want).sum(axis=1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
    bad = [i for i in range(len(got)) if not (max_abs[i] <= MAX_ABS_DIFF and cosine[i] >= MIN_COSINE)]
    return max_abs, cosine, bad


# ------------------------------------------------------------------ reference fixture


@pytest.mark.parametrize("batch_size", [1, 32])
def test_all_40_items_match_reference(reference: dict[str, Any], batch_size: int) -> None:
    items = reference["items"]
    got = OnnxMiniLMEmbedder(batch_size=batch_size).embed([it["text"] for it in items])
    want = np.array([it["embedding"] for it in items], dtype=np.float64)
    assert got.shape == want.shape == (40, 384)
    max_abs, cosine, bad = _outside_tolerance(got, want)
    assert not bad, ("items outside tolerance (index, max|diff|, cosine, text): "
                     f"{[(i, float(max_abs[i]), float(cosine[i]), items[i]['text'][:40]) for i in bad]}")
    print(f"onnx batch_size={batch_size}: max abs diff {max_abs.max():.3g}, "
          f"min cosine {cosine.min():.12f}")


def _mixed_texts(reference: dict[str, Any]) -> list[str]:
    """Short texts, the 152-token item, 256-token (truncated) texts, interleaved."""
    items = reference["items"]
    long = items[39]["text"]  # 425 word pieces, truncated to 256
    texts = []
    for i in range(12):
        texts += [items[i]["text"], f"{i} {long}", "ok" if i % 3 == 0 else f"kafka lag {i}"]
    texts.insert(5, items[28]["text"])
    return texts


def test_onnx_and_numpy_agree_on_a_mixed_batch(reference: dict[str, Any], onnx_emb: OnnxMiniLMEmbedder,
                                               numpy_emb: MiniLMEmbedder) -> None:
    texts = _mixed_texts(reference)
    counts = onnx_emb.token_counts(texts)
    assert min(counts) <= 4 and max(counts) == 256 and counts.count(256) == 12
    a, b = onnx_emb.embed(texts), numpy_emb.embed(texts)
    max_abs, cosine, bad = _outside_tolerance(a, b)
    assert not bad, [(i, float(max_abs[i]), float(cosine[i])) for i in bad]
    print(f"onnx vs numpy, {len(texts)} mixed texts: max abs diff {max_abs.max():.3g}, "
          f"min cosine {cosine.min():.12f}")


def test_padding_inside_one_batch_changes_nothing(reference: dict[str, Any],
                                                  onnx_emb: OnnxMiniLMEmbedder,
                                                  numpy_emb: MiniLMEmbedder) -> None:
    """One forward call over short texts padded to 256 tokens next to 256-token ones (embed()
    itself sorts by length and pads little), against the numpy path on each text unpadded."""
    texts = _mixed_texts(reference)[:9]
    ids = onnx_emb._encode(texts)
    width = max(map(len, ids))
    batch = np.zeros((len(ids), width), dtype=np.int64)
    mask = np.zeros((len(ids), width), dtype=np.float32)
    for r, row in enumerate(ids):
        batch[r, :len(row)] = row
        mask[r, :len(row)] = 1.0
    assert width == 256 and mask.sum(axis=1).min() < 10  # real padding in the batch
    padded = onnx_emb._ensure_loaded().forward(batch, mask)
    alone = np.concatenate([numpy_emb.embed([t]) for t in texts])
    max_abs, cosine, bad = _outside_tolerance(padded, alone)
    assert not bad, [(i, float(max_abs[i]), float(cosine[i])) for i in bad]
    print(f"onnx padded batch vs numpy one at a time: max abs diff {max_abs.max():.3g}")


# ------------------------------------------------------------------ contract


def test_output_contract_and_same_version_as_numpy(onnx_emb: OnnxMiniLMEmbedder,
                                                   numpy_emb: MiniLMEmbedder) -> None:
    assert isinstance(onnx_emb, Embedder)
    # interchangeable vectors: the same index meta, the same embedding cache folder
    assert (onnx_emb.name, onnx_emb.dim, onnx_emb.version) == (
        numpy_emb.name, numpy_emb.dim, numpy_emb.version)
    texts = ["a much longer sentence about kafka partitions and consumer lag", "ok", ""]
    out = onnx_emb.embed(texts)
    assert out.dtype == np.float32 and out.shape == (3, 384)
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-6)
    np.testing.assert_allclose(onnx_emb.embed(texts[::-1]), out[::-1], atol=1e-6)
    assert onnx_emb.embed([]).shape == (0, 384)
    with pytest.raises(TypeError):
        onnx_emb.embed("a bare string")  # type: ignore[arg-type]


def test_concurrent_calls_share_one_session(onnx_emb: OnnxMiniLMEmbedder) -> None:
    texts = [[f"thread {i} text {j}" for j in range(5)] for i in range(4)]
    with ThreadPoolExecutor(max_workers=4) as pool:
        together = list(pool.map(onnx_emb.embed, texts))
    for batch, got in zip(texts, together, strict=True):
        np.testing.assert_allclose(got, onnx_emb.embed(batch), atol=1e-6)


def test_wrong_expected_hash_is_refused() -> None:
    emb = OnnxMiniLMEmbedder(expected_sha256="0" * 64)  # lazy: constructing does not load
    with pytest.raises(EmbeddingIntegrityError, match="sha256"):
        emb.load()
    assert not emb.loaded


def test_graph_is_standard_onnx_with_dynamic_axes_and_external_weights(
        numpy_emb: MiniLMEmbedder) -> None:
    import onnx

    tensors, _ = numpy_emb._read_verified()
    model, external = build_minilm_graph(numpy_emb._prepare(tensors))
    assert {n.domain for n in model.graph.node} == {""}  # no contrib ops: ORT fuses on its own
    assert {o.version for o in model.opset_import} == {17}
    for vi in model.graph.input:
        assert [d.dim_param for d in vi.type.tensor_type.shape.dim] == ["batch", "seq"]
    # the weights stay in the numpy arrays: the protobuf itself is small
    assert sum(a.nbytes for a in external.values()) > 80_000_000
    assert model.ByteSize() < 200_000
    assert {i.name for i in model.graph.initializer} >= set(external)
    # with the weights put inline, the checker (op schemas, shape inference) accepts the graph
    inline = onnx.ModelProto()
    inline.CopyFrom(model)
    for init in inline.graph.initializer:
        if init.name in external:
            init.ClearField("external_data")
            init.data_location = onnx.TensorProto.DEFAULT
            init.raw_data = external[init.name].tobytes()
    onnx.checker.check_model(inline, full_check=True)


def test_long_texts_are_batched_by_tokens() -> None:
    """ONNX batches 256-token texts 8 at a time (activation memory); numpy plans as before."""
    lengths = [256] * 32
    assert [e - s for s, e in _plan_batches(lengths, 32, OnnxMiniLMEmbedder._MAX_BATCH_TOKENS)] == [8] * 4
    assert _plan_batches(lengths, 32, MiniLMEmbedder._MAX_BATCH_TOKENS) == _plan_batches(lengths, 32)
    assert _plan_batches([10] * 40, 32, OnnxMiniLMEmbedder._MAX_BATCH_TOKENS) == _plan_batches([10] * 40, 32)


# ------------------------------------------------------------------ selection


def test_backend_selection_and_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    assert type(minilm_embedder("onnx")) is OnnxMiniLMEmbedder
    assert type(minilm_embedder("numpy")) is MiniLMEmbedder
    assert minilm_embedder("numpy", batch_size=4).batch_size == 4
    with pytest.raises(ValueError, match="backend"):
        minilm_embedder("torch")
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # `import onnxruntime` now fails
    assert type(minilm_embedder("onnx")) is MiniLMEmbedder


def test_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MNEMOFLOW_EMBEDDER", raising=False)
    assert Settings().embedder == DEFAULT_BACKEND
    monkeypatch.setenv("MNEMOFLOW_EMBEDDER", "NumPy")
    assert Settings().embedder == "numpy"
    monkeypatch.setenv("MNEMOFLOW_EMBEDDER", "torch")
    with pytest.raises(ConfigError, match="MNEMOFLOW_EMBEDDER"):
        Settings()
