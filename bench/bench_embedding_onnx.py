"""MiniLM on ONNX Runtime against the numpy forward pass, in the same run: texts/s and GFLOP/s.

Run: .venv/bin/python bench/bench_embedding_onnx.py   (about 2 minutes; plain printed figures)

Cases are the calls the pipeline makes: one text (a recall query) and 32 texts (the projector's
rows, MiniLMEmbedder's batch size), of short texts (~10 tokens) and of 256-token texts. Within
a case the two paths take turns call by call, so a neighbour's load on this shared 2-core
machine falls on both alike and the ratio stays comparable; the best call of each path is the
steadier figure, the whole-run rate the fairer one. Both are printed, with their ratio.

GFLOP/s counts the model's matmul FLOPs (see flops_per_token) for the 256-token cases, as a
share of the peak FP32 rate from /proc/cpuinfo (see peak_gflops).
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort
from bench_embedding import long_texts, short_texts
from common import write_results

from mnemoflow.projections.embedding import MiniLMEmbedder
from mnemoflow.projections.embedding_onnx import OnnxMiniLMEmbedder

LAYERS, HIDDEN, INTERMEDIATE = 6, 384, 1536


def flops_per_token(seq: int) -> float:
    """Multiply-adds x 2 per token of a `seq`-token text, summed over the 6 layers.

    Per layer: Q, K, V and output projections 4 * 2*H*H; FFN up and down 2 * 2*H*I;
    attention scores Q.K^T and context P.V, 2 * 2*seq*H (each token against `seq` keys, over
    all 12 heads of 32 dims). LayerNorm, softmax, GELU and pooling are O(H) per token and left
    out. For seq = 256: 3.93 MFLOP per layer, 23.6 MFLOP per token, 6.04 GFLOP per text.
    """
    per_layer = 4 * 2 * HIDDEN * HIDDEN + 2 * 2 * HIDDEN * INTERMEDIATE + 2 * 2 * seq * HIDDEN
    return float(LAYERS * per_layer)


def peak_gflops(cores: int) -> tuple[float, str]:
    """Peak FP32 GFLOP/s of `cores` cores, and how it was worked out.

    FLOP per cycle per core from the vector flags: AVX-512 (two 512-bit FMA units, as on the
    Xeon server cores that have it) 2 * 16 lanes * 2 = 64; AVX2 + FMA 2 * 8 * 2 = 32; AVX 16;
    else 8. The clock is /proc/cpuinfo's "cpu MHz" (under KVM the nominal clock; turbo, if the
    host grants it, makes the true peak higher and our share lower than printed).
    """
    flags: set[str] = set()
    mhz = 0.0
    model = "?"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "flags" and not flags:
            flags = set(value.split())
        elif key == "cpu MHz":
            mhz = max(mhz, float(value))
        elif key == "model name":
            model = value.strip()
    if "avx512f" in flags:
        per_cycle, isa = 64, "AVX-512 (2 FMA units x 16 lanes x 2)"
    elif "avx2" in flags and "fma" in flags:
        per_cycle, isa = 32, "AVX2+FMA (2 FMA units x 8 lanes x 2)"
    elif "avx" in flags:
        per_cycle, isa = 16, "AVX"
    else:
        per_cycle, isa = 8, "SSE"
    peak = cores * mhz * 1e6 * per_cycle / 1e9
    how = (f"{model}: {cores} cores x {mhz:.0f} MHz x {per_cycle} FP32 FLOP/cycle ({isa}) "
           f"= {peak:.1f} GFLOP/s")
    return peak, how


def compare(label: str, paths: dict[str, Callable[[list[str]], object]], texts: list[str],
            per_call: int, budget_s: float) -> dict[str, dict[str, float]]:
    """Alternate one call of each path until `budget_s` has passed (at least 3 calls each)."""
    for fn in paths.values():
        fn(texts[:per_call])  # warm-up: first-call costs are not throughput
    reps: dict[str, list[float]] = {name: [] for name in paths}
    pos, t_start = 0, time.perf_counter()
    while time.perf_counter() - t_start < budget_s or min(map(len, reps.values())) < 3:
        chunk = texts[pos:pos + per_call]
        if len(chunk) < per_call:
            pos, chunk = 0, texts[:per_call]
        pos += per_call
        for name, fn in paths.items():
            t0 = time.perf_counter()
            fn(chunk)
            reps[name].append(time.perf_counter() - t0)
    out = {}
    for name, times in reps.items():
        out[name] = {"texts_per_s": per_call * len(times) / sum(times),
                     "best_texts_per_s": per_call / min(times), "calls": len(times)}
    ratio = out["onnx"]["texts_per_s"] / out["numpy"]["texts_per_s"]
    ratio_best = out["onnx"]["best_texts_per_s"] / out["numpy"]["best_texts_per_s"]
    out["ratio"] = {"whole_run": ratio, "best": ratio_best}
    npy, onx = out["numpy"], out["onnx"]
    print(f"{label:<26} numpy {npy['texts_per_s']:8.1f} (best {npy['best_texts_per_s']:8.1f})"
          f"   onnx {onx['texts_per_s']:8.1f} (best {onx['best_texts_per_s']:8.1f}) texts/s"
          f"   onnx/numpy {ratio:4.2f}x (best {ratio_best:4.2f}x)   {len(reps['onnx'])} calls each",
          flush=True)
    return out


def main() -> None:
    cores = len(os.sched_getaffinity(0))
    peak, how = peak_gflops(cores)
    load0 = os.getloadavg()
    print(f"python {platform.python_version()}  numpy {np.__version__}  onnxruntime {ort.__version__}  "
          f"cpus {cores}  load {load0[0]:.2f}")
    print(f"peak: {how}")

    loads = {}
    numpy_emb = MiniLMEmbedder(batch_size=32)
    onnx_emb = OnnxMiniLMEmbedder(batch_size=32)
    for name, emb in (("numpy", numpy_emb), ("onnx", onnx_emb)):
        t0 = time.perf_counter()
        emb.load()
        loads[name] = time.perf_counter() - t0
    print(f"load + sha256 verify: numpy {loads['numpy']:.2f} s, onnx {loads['onnx']:.2f} s "
          f"(graph built and session made; intra-op threads {onnx_emb.intra_op_threads})")

    short = short_texts(2048, seed=1)
    long = long_texts(96, seed=2)
    s_tok = numpy_emb.token_counts(short[:256])
    l_tok = numpy_emb.token_counts(long)
    assert min(l_tok) == max(l_tok) == 256
    print(f"short texts: {np.mean(s_tok):.1f} tokens on average (incl. [CLS]/[SEP]); "
          f"long texts: 256 tokens")
    paths = {"numpy": numpy_emb.embed, "onnx": onnx_emb.embed}
    cases = {
        "short_batch1": compare("short (~10 tok), batch 1", paths, short, 1, budget_s=6),
        "short_batch32": compare("short (~10 tok), batch 32", paths, short, 32, budget_s=6),
        "long_batch1": compare("256 tok, batch 1", paths, long, 1, budget_s=10),
        "long_batch32": compare("256 tok, batch 32", paths, long, 32, budget_s=24),
    }

    per_text = flops_per_token(256) * 256
    print(f"model FLOPs: {flops_per_token(256) / 1e6:.2f} MFLOP/token at 256 tokens, "
          f"{per_text / 1e9:.2f} GFLOP per 256-token text")
    gflops: dict[str, dict[str, float]] = {}
    for case in ("long_batch1", "long_batch32"):
        for name in ("numpy", "onnx"):
            rate = cases[case][name]["texts_per_s"] * per_text / 1e9
            best = cases[case][name]["best_texts_per_s"] * per_text / 1e9
            gflops[f"{case}_{name}"] = {"gflops": rate, "best_gflops": best,
                                        "share_of_peak": rate / peak, "best_share_of_peak": best / peak}
            print(f"{case:<13} {name:<5} {rate:6.1f} GFLOP/s = {100 * rate / peak:4.1f} % of peak "
                  f"(best call {best:6.1f} = {100 * best / peak:4.1f} %)")
    load1 = os.getloadavg()
    print(f"load average at start / end: {load0[0]:.2f} / {load1[0]:.2f}")
    write_results("embedding_onnx", {
        "cpus": cores, "peak_gflops": peak, "peak_how": how, "onnxruntime": ort.__version__,
        "intra_op_threads": onnx_emb.intra_op_threads, "load_s": loads,
        "loadavg_start_end": [load0[0], load1[0]], "short_mean_tokens": float(np.mean(s_tok)),
        "flops_per_token_256": flops_per_token(256), "cases": cases, "gflops": gflops,
    })


if __name__ == "__main__":
    main()
