"""all-MiniLM-L6-v2 on ONNX Runtime: the numpy forward pass as a graph, built at load time.

`OnnxMiniLMEmbedder` is a `MiniLMEmbedder` whose forward pass runs in ONNX Runtime; everything
else (the verified weights and tokenizer, truncation, length-sorted batching, the caller's
order) is the numpy embedder's own code. The graph is written with `onnx.helper` from the same
prepared weights every time the model loads (under a second): no exported .onnx file, nothing
downloaded, nothing cached on disk, so no second artefact can drift from the pinned safetensors.
The weights go to ORT as in-memory external initializers that point at the numpy arrays, so
they are held once, not once in a protobuf and again in the session.

The graph is standard ONNX (opset 17): Gather, Add, LayerNormalization, MatMul, Reshape and
Transpose for the heads, Softmax, exact GELU through Erf, mask-weighted mean pooling and a
division by the L2 norm. At ORT_ENABLE_ALL, ORT fuses each MatMul + bias into a Gemm (the
hidden states are kept 2-D, (tokens, 384), for that) and the Erf pattern into Gelu. It does
not fuse attention or skip-LayerNorm here: its in-session fusions of those need a fixed
sequence length, and the Python fusion tool would add sympy for little more.

The vectors match the PyTorch reference within the tolerance the numpy path is held to
(tests/projections/test_embedding_onnx.py), and the numpy path within float32 noise, so the
two are interchangeable: same `version`, same index, same embedding cache.
`minilm_embedder(backend)` is where the worker, rebuild and evaluation get their embedder.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mnemoflow.projections.embedding import (
    MINILM_SAFETENSORS_SHA256,
    MINILM_TOKENIZER_SHA256,
    MiniLMEmbedder,
    _Loaded,
    _Weights,
)

__all__ = ["BACKENDS", "DEFAULT_BACKEND", "OnnxMiniLMEmbedder", "build_minilm_graph", "minilm_embedder",
           "session_options"]

log = logging.getLogger(__name__)

BACKENDS = ("onnx", "numpy")
# ONNX Runtime did 2.5-4.3x the numpy path's texts/s on 256-token texts and 4-12x on short ones
# (batch 32, 5 runs on the shared 2-core box; bench/bench_embedding_onnx.py), within the same
# tolerance; numpy stays as the fallback.
DEFAULT_BACKEND = "onnx"

_OPSET = 17  # LayerNormalization is standard from 17
_IR_VERSION = 8  # the lowest that opset 17 needs: any ORT that runs opset 17 reads it
_INPUT_IDS, _MASK, _OUTPUT = "input_ids", "attention_mask", "embedding"
_INLINE_MAX = 64  # elements: shapes and scalars stay in the protobuf, weights are external


@dataclass
class _Graph:
    """Nodes and initializers as they are added; names are unique by construction."""

    nodes: list[Any] = field(default_factory=list)
    initializers: list[Any] = field(default_factory=list)
    external: dict[str, np.ndarray] = field(default_factory=dict)  # name -> the array ORT reads

    def const(self, name: str, value: np.ndarray | np.generic) -> str:
        from onnx import TensorProto, helper, numpy_helper

        arr = np.asarray(value, order="C")  # asarray keeps 0-d scalars 0-d (Gather needs that)
        if arr.size <= _INLINE_MAX:
            self.initializers.append(numpy_helper.from_array(arr, name))
            return name
        # A placeholder the session fills from `external` (SessionOptions.add_external_initializers)
        t = TensorProto(name=name, data_type=helper.np_dtype_to_tensor_dtype(arr.dtype), dims=arr.shape)
        t.data_location = TensorProto.EXTERNAL
        entry = t.external_data.add()
        entry.key, entry.value = "location", "in-memory"
        self.initializers.append(t)
        self.external[name] = arr
        return name

    def op(self, op_type: str, inputs: list[str], name: str | None = None, **attrs: Any) -> str:
        from onnx import helper

        out = name or f"{op_type.lower()}_{len(self.nodes)}"
        self.nodes.append(helper.make_node(op_type, inputs, [out], **attrs))
        return out


def _i64(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def build_minilm_graph(w: _Weights, *, layer_norm_eps: float = MiniLMEmbedder._LN_EPS,
                       mask_fill: float = float(MiniLMEmbedder._MASK_FILL)
                       ) -> tuple[Any, dict[str, np.ndarray]]:
    """(onnx.ModelProto, external initializers) computing what MiniLMEmbedder._forward does.

    Inputs `input_ids` int64 (batch, seq) and `attention_mask` float32 (batch, seq), padded on
    the right; output `embedding` float32 (batch, 384), mean-pooled and L2-normalised. Batch
    and sequence axes are dynamic. The query third of `w.layers[i].wqkv` is pre-scaled by
    1/sqrt(head_dim) (MiniLMEmbedder._prepare), so no scale node appears.
    """
    from onnx import TensorProto, helper

    hid, heads, head_dim = MiniLMEmbedder._HIDDEN, MiniLMEmbedder._HEADS, MiniLMEmbedder._HEAD_DIM
    g = _Graph()
    ids, mask = _INPUT_IDS, _MASK

    def layer_norm(x: str, gamma: str, beta: str) -> str:
        return g.op("LayerNormalization", [x, gamma, beta], axis=-1, epsilon=layer_norm_eps)

    # embeddings: word + position + token type 0, then LayerNorm
    batch_seq = g.op("Shape", [ids])
    seq = g.op("Shape", [ids], start=1, end=2)
    zero = g.const("zero", _i64(0))
    pos = g.op("Slice", [g.const("pos_table", w.pos), zero, seq, zero])
    x = g.op("Gather", [g.const("word_table", w.word), ids])
    x = g.op("Add", [x, pos])
    x = g.op("Add", [x, g.const("type0", w.type0)])
    x = layer_norm(x, g.const("emb_ln_g", w.ln_g), g.const("emb_ln_b", w.ln_b))
    # (tokens, hidden) from here on: a 2-D MatMul + bias is what ORT fuses into one Gemm
    flat = g.const("flat_shape", _i64(-1, hid))
    x = g.op("Reshape", [x, flat])

    # additive bias on padding keys, (batch, 1, 1, seq): 0 where mask is 1, mask_fill where 0
    bias = g.op("Sub", [g.const("one", np.float32(1.0)), mask])
    bias = g.op("Mul", [bias, g.const("mask_fill", np.float32(mask_fill))])
    bias = g.op("Unsqueeze", [bias, g.const("axes_1_2", _i64(1, 2))])
    qkv_shape = g.op("Concat", [batch_seq, g.const("qkv_tail", _i64(3, heads, head_dim))], axis=0)
    half, inv_sqrt2 = g.const("half", np.float32(0.5)), g.const("sqrt2", np.float32(math.sqrt(2.0)))
    pick = [g.const(f"pick{i}", np.array(i, dtype=np.int64)) for i in range(3)]

    for i, lw in enumerate(w.layers):
        p = f"l{i}_"
        qkv = g.op("MatMul", [x, g.const(p + "wqkv", lw.wqkv)])
        qkv = g.op("Add", [qkv, g.const(p + "bqkv", lw.bqkv)])
        qkv = g.op("Reshape", [qkv, qkv_shape])  # (batch, seq, 3, heads, head_dim)
        qkv = g.op("Transpose", [qkv], perm=[2, 0, 3, 1, 4])  # (3, batch, heads, seq, head_dim)
        q, k, v = (g.op("Gather", [qkv, pick[j]], axis=0) for j in range(3))
        k_t = g.op("Transpose", [k], perm=[0, 1, 3, 2])
        scores = g.op("MatMul", [q, k_t])
        scores = g.op("Add", [scores, bias])
        probs = g.op("Softmax", [scores], axis=-1)
        ctx = g.op("MatMul", [probs, v])
        ctx = g.op("Transpose", [ctx], perm=[0, 2, 1, 3])  # (batch, seq, heads, head_dim)
        ctx = g.op("Reshape", [ctx, flat])
        attn = g.op("MatMul", [ctx, g.const(p + "wo", lw.wo)])
        attn = g.op("Add", [attn, g.const(p + "bo", lw.bo)])
        attn = g.op("Add", [attn, x])
        x = layer_norm(attn, g.const(p + "ln1_g", lw.ln1_g), g.const(p + "ln1_b", lw.ln1_b))

        mid = g.op("MatMul", [x, g.const(p + "w1", lw.w1)])
        mid = g.op("Add", [mid, g.const(p + "b1", lw.b1)])
        # exact GELU, x * 0.5 * (1 + erf(x / sqrt 2)): the pattern ORT fuses into Gelu
        erf = g.op("Erf", [g.op("Div", [mid, inv_sqrt2])])
        act = g.op("Mul", [g.op("Mul", [mid, g.op("Add", [erf, g.const(p + "one", np.float32(1.0))])]),
                           half])
        ffn = g.op("MatMul", [act, g.const(p + "w2", lw.w2)])
        ffn = g.op("Add", [ffn, g.const(p + "b2", lw.b2)])
        ffn = g.op("Add", [ffn, x])
        x = layer_norm(ffn, g.const(p + "ln2_g", lw.ln2_g), g.const(p + "ln2_b", lw.ln2_b))

    # mean over the tokens whose mask is 1 (incl. [CLS]/[SEP]), then divide by the L2 norm
    x = g.op("Reshape", [x, g.op("Concat", [batch_seq, g.const("hid_tail", _i64(hid))], axis=0)])
    weighted = g.op("Mul", [x, g.op("Unsqueeze", [mask, g.const("axis_2", _i64(2))])])
    axis_1 = g.const("axis_1", _i64(1))
    summed = g.op("ReduceSum", [weighted, axis_1], keepdims=0)
    pooled = g.op("Div", [summed, g.op("ReduceSum", [mask, axis_1], keepdims=1)])
    norm = g.op("ReduceL2", [pooled], axes=[-1], keepdims=1)  # axes: an attribute until opset 18
    norm = g.op("Max", [norm, g.const("norm_floor", np.float32(1e-12))])
    g.op("Div", [pooled, norm], name=_OUTPUT)

    graph = helper.make_graph(
        g.nodes, "all-MiniLM-L6-v2",
        [helper.make_tensor_value_info(ids, TensorProto.INT64, ["batch", "seq"]),
         helper.make_tensor_value_info(mask, TensorProto.FLOAT, ["batch", "seq"])],
        [helper.make_tensor_value_info(_OUTPUT, TensorProto.FLOAT, ["batch", hid])],
        g.initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", _OPSET)],
                              producer_name="mnemoflow")
    model.ir_version = _IR_VERSION
    return model, g.external


def _default_threads() -> int:
    """The CPUs this process may run on (a container or taskset may allow fewer than exist)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not on Linux
        return max(1, os.cpu_count() or 1)


class _OrtForward:
    """The session, and the arrays its external initializers point into (kept alive here: ORT
    reads them in place and does not own them)."""

    def __init__(self, session: Any, keep_alive: list[Any]) -> None:
        self._session = session
        self._keep_alive = keep_alive

    def __call__(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        (out,) = self._session.run([_OUTPUT], {_INPUT_IDS: ids, _MASK: mask})
        return out


def session_options(intra_op_threads: int) -> Any:
    """ORT options for an encoder on a box that the event loop and the broker share."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.intra_op_num_threads = intra_op_threads
    # the graph is a single chain: nothing for an inter-op pool to run in parallel
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.inter_op_num_threads = 1
    # Idle pool threads spinning for the next call steal the cores that the event loop and
    # the broker share with us (and slowed the embedding itself on the loaded 2-core box).
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    # Without the arena, a batch's activations go back when the call ends instead of the
    # process keeping its largest batch's worth for good; no slower in the bench.
    opts.enable_cpu_mem_arena = False
    return opts


class OnnxMiniLMEmbedder(MiniLMEmbedder):
    """all-MiniLM-L6-v2 through ONNX Runtime, on a graph built from the verified weights.

    Same constructor as MiniLMEmbedder, plus `intra_op_threads` (default: every CPU this process
    may use, 2 here; ORT splits each Gemm and attention across them, as OpenBLAS does for the
    numpy path). Loading is lazy and thread-safe; `embed` may be called from several threads.
    """

    # A (32, 256) batch makes about 900 MB of activations (three (32, 12, 256, 256) attention
    # tensors among them); 8 x 256 is as fast per text and needs a quarter of that. Short texts
    # are still batched 32 at a time.
    _MAX_BATCH_TOKENS = 2048

    def __init__(
        self,
        model_dir: str | Path | None = None,
        *,
        batch_size: int = 32,
        max_seq_length: int = 256,
        expected_sha256: str = MINILM_SAFETENSORS_SHA256,
        expected_tokenizer_sha256: str | None = MINILM_TOKENIZER_SHA256,
        intra_op_threads: int | None = None,
    ) -> None:
        super().__init__(model_dir, batch_size=batch_size, max_seq_length=max_seq_length,
                         expected_sha256=expected_sha256,
                         expected_tokenizer_sha256=expected_tokenizer_sha256)
        if intra_op_threads is not None and intra_op_threads < 1:
            raise ValueError("intra_op_threads must be >= 1")
        self.intra_op_threads = intra_op_threads or _default_threads()

    def _load(self) -> _Loaded:
        import onnxruntime as ort

        tensors, tokenizer = self._read_verified()
        model, external = build_minilm_graph(self._prepare(tensors))
        del tensors  # the prepared copies are what ORT reads
        opts = session_options(self.intra_op_threads)
        values = [ort.OrtValue.ortvalue_from_numpy(a) for a in external.values()]
        opts.add_external_initializers(list(external), values)
        session = ort.InferenceSession(model.SerializeToString(), opts,
                                       providers=["CPUExecutionProvider"])
        return _Loaded(forward=_OrtForward(session, [values, external]), tokenizer=tokenizer)


def minilm_embedder(backend: str = DEFAULT_BACKEND, **kwargs: Any) -> MiniLMEmbedder:
    """The MiniLM embedder for `backend` ("onnx" or "numpy", Settings.embedder).

    "onnx" falls back to numpy, with a warning, when onnxruntime or onnx cannot be imported:
    the vectors are interchangeable, so the index and caches stay valid either way.
    `kwargs` go to the constructor (batch_size, model_dir, ...).
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown embedding backend {backend!r}: expected one of {', '.join(BACKENDS)}")
    if backend == "onnx":
        try:
            import onnx  # noqa: F401  (checked here so a broken install falls back now, not at load)
            import onnxruntime  # noqa: F401
        except ImportError as exc:
            log.warning("onnx backend unavailable (%s); embedding with the numpy forward pass", exc)
        else:
            return OnnxMiniLMEmbedder(**kwargs)
    return MiniLMEmbedder(**kwargs)
