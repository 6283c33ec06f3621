"""Which embedding model a deployment runs: one name in its settings, one place that builds it.

The worker, a rebuild and the evaluation all get their embedder here, so a replay embeds with
the model the worker would. The index records the model's name, dimension and version, so
vectors of two models never meet: changing the model makes a new index.
"""

from __future__ import annotations

from mnemoflow.agents.tuning import DEFAULT_MODEL
from mnemoflow.projections.embedding import Embedder
from mnemoflow.projections.embedding_e5 import E5Embedder
from mnemoflow.projections.embedding_onnx import DEFAULT_BACKEND, minilm_embedder

__all__ = ["DEFAULT_MODEL", "MODELS", "build_embedder"]

MODELS = (DEFAULT_MODEL, "e5-small-v2")


def build_embedder(model: str = DEFAULT_MODEL, backend: str = DEFAULT_BACKEND) -> Embedder:
    """`model` from MODELS; `backend` ("onnx" or "numpy") is MiniLM's forward pass (e5 ships
    as an ONNX graph only)."""
    if model == DEFAULT_MODEL:
        return minilm_embedder(backend)
    if model == "e5-small-v2":
        return E5Embedder()
    raise ValueError(f"unknown embedding model {model!r}: expected one of {', '.join(MODELS)}")
