"""An on-disk embedding cache for offline evaluation: every text is embedded once per model.

The offline replay and the calibration runs embed the same benchmark turns again and again;
MiniLM on this machine does a few hundred short texts per second and about a dozen long ones,
so recomputing them would dominate every run. Vectors are keyed by the SHA-256 of the text
under a folder named after the model version, so a different model never reads them.
Shards are append-only files named by process and counter: concurrent runs never clobber
each other, and a torn write loses only its own shard.
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

import numpy as np

from mnemoflow.projections.embedding import Embedder

DEFAULT_DIR = Path(os.environ.get("MNEMOFLOW_EMB_CACHE", "/tmp/mnemo-emb-cache"))


def text_key(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()


class DiskCachedEmbedder:
    """Embedder protocol in front of `inner`, persisted as .npy shards under `root/<version>`."""

    def __init__(self, inner: Embedder, root: Path = DEFAULT_DIR, chunk: int = 256) -> None:
        self.inner = inner
        self.dir = root / inner.version.replace("/", "_")
        self.dir.mkdir(parents=True, exist_ok=True)
        self.chunk = chunk  # misses are embedded and written this many at a time
        self._vecs: dict[bytes, np.ndarray] = {}
        self._lock = threading.Lock()
        self._shard = 0
        self.hits = 0
        self.misses = 0
        self._load()

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def dim(self) -> int:
        return self.inner.dim

    @property
    def version(self) -> str:
        return self.inner.version

    def __len__(self) -> int:
        return len(self._vecs)

    def _load(self) -> None:
        for keys_file in sorted(self.dir.glob("*.keys.npy")):
            vec_file = keys_file.with_name(keys_file.name.replace(".keys.npy", ".vecs.npy"))
            try:
                keys = np.load(keys_file)
                vecs = np.load(vec_file)
            except (OSError, ValueError):
                continue  # a shard torn by a killed run: its texts are embedded again
            if len(keys) != len(vecs) or vecs.shape[1:] != (self.dim,):
                continue
            for k, v in zip(keys, vecs, strict=True):
                self._vecs[bytes(k)] = v

    def _write(self, keys: list[bytes], vecs: np.ndarray) -> None:
        self._shard += 1
        stem = f"{os.getpid()}-{threading.get_ident()}-{self._shard}-{len(self._vecs)}"
        # vectors first, keys last: a shard counts only once its keys file exists
        np.save(self.dir / f"{stem}.vecs.npy", vecs.astype(np.float32))
        tmp = self.dir / f"{stem}.keys.tmp.npy"
        np.save(tmp, np.frombuffer(b"".join(keys), dtype="S32"))
        tmp.replace(self.dir / f"{stem}.keys.npy")

    def embed(self, texts: list[str]) -> np.ndarray:
        keys = [text_key(t) for t in texts]
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        todo: dict[bytes, list[int]] = {}
        with self._lock:
            for i, k in enumerate(keys):
                v = self._vecs.get(k)
                if v is None:
                    todo.setdefault(k, []).append(i)
                else:
                    out[i] = v
        items = list(todo.items())
        for s in range(0, len(items), self.chunk):
            part = items[s:s + self.chunk]
            fresh = np.asarray(self.inner.embed([texts[rows[0]] for _, rows in part]),
                               dtype=np.float32)
            with self._lock:
                for (k, rows), v in zip(part, fresh, strict=True):
                    out[rows] = v
                    self._vecs[k] = v
                self._write([k for k, _ in part], fresh)
        self.misses += len(todo)
        self.hits += len(texts) - len(todo)
        return out
