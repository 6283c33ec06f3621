"""Bench: what folding one memory-log record costs, against decoding it.

A restart folds the memory-log written after its checkpoint; `bench_partitions.py --only
restart` compares that with a raw consume + Avro decode of the same tail on the real broker.
This bench takes the broker out and times the two CPU costs alone, in one process:

- the baseline: Avro single-object decoding of the records (what the raw consume does per
  record besides the fetch);
- the fold: `PartitionedMemory.apply` of the decoded records into a fresh lexical store and
  graph, over 4 partitions, as the projector folds them in a restore, the garbage collector
  settled and frozen after every batch as there (no vector index: the vectors come from
  `memory-vectors` and are not embedded in a restart);
- the same fold with the tokenizer's memos switched off (`agents/text.py`: `_raw_tokens`,
  `_content_tokens`, `_stem_token` called unwrapped). That is close to the cost before the
  memos, a little above it: unwrapped, `semantic_key` tokenizes its text twice where the code
  before tokenized it once.

Two corpora: LoCoMo dev's turns (real text, one owner per conversation) and bench_partitions'
synthetic records (a small vocabulary, every kind of record). Rounds alternate the variants;
figures are medians over rounds, printed as microseconds per record and as ratios to the
decode, never asserted.

Run: .venv/bin/python bench/bench_fold.py [--rounds 5] [--synthetic 20000]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench_partitions import events as synthetic_events
from common import write_results

from mnemoflow.agents import text as T
from mnemoflow.agents.memory_events import memory_event
from mnemoflow.agents.tuning import load_tuning
from mnemoflow.evaluation.datasets import load_locomo
from mnemoflow.projections.heap import Freezer
from mnemoflow.projections.partitioned import build_partitioned
from mnemoflow.schemas.codec import default_registry
from mnemoflow.streams.projector import FOLD_BATCH

SCHEMA = "io.mnemoflow.MemoryEvent"
SHARED = Path(os.environ.get("MNEMOFLOW_SHARED", Path(__file__).resolve().parents[2] / "shared"))
LOCOMO = SHARED / "data" / "locomo" / "dev.json"
MEMOS = ("_raw_tokens", "_content_tokens", "_stem_token")


def locomo_events(path: Path) -> list[dict[str, Any]]:
    """Every LoCoMo dev turn as the segment memory the observer would record for it."""
    out = []
    for s in load_locomo(path).sessions:
        for i, turn in enumerate(s.turns):
            out.append(memory_event(
                event_id=f"e-{turn.provenance}", op="segment_recorded",
                memory_id=f"m-{turn.provenance}", kind="segment", scope="User", owner=s.user,
                session_id=s.key, event_seq=i, event_time=s.time_ms + i, text=turn.text,
                provenance=[turn.provenance]))
    return out


@contextmanager
def memos_off() -> Iterator[None]:
    """The tokenizer as it was before its memos: each function called unwrapped."""
    saved = {name: getattr(T, name) for name in MEMOS}
    try:
        for name, fn in saved.items():
            setattr(T, name, fn.__wrapped__)
        yield
    finally:
        for name, fn in saved.items():
            setattr(T, name, fn)


def clear_memos() -> None:
    """Each round starts cold, as a restarted worker does."""
    for name in MEMOS:
        fn = getattr(T, name)
        if hasattr(fn, "cache_clear"):
            fn.cache_clear()


def time_decode(blobs: list[bytes]) -> float:
    reg = default_registry()
    t = time.perf_counter()
    for b in blobs:
        reg.decode(b, SCHEMA)
    return time.perf_counter() - t


def time_fold(evs: list[dict[str, Any]]) -> float:
    memory = build_partitioned(load_tuning(), 4, graph=True)
    asyncio.run(memory.hold_all())
    clear_memos()
    freezer = Freezer()
    t = time.perf_counter()
    for i, ev in enumerate(evs, 1):
        memory.apply(ev)
        if i % FOLD_BATCH == 0:  # as the projector restores: young collections, then freeze
            freezer.settle()
    took = time.perf_counter() - t
    freezer.thaw()
    del memory
    gc.collect()
    return took


def measure(evs: list[dict[str, Any]], rounds: int) -> dict[str, Any]:
    reg = default_registry()
    blobs = [reg.encode(SCHEMA, ev) for ev in evs]
    decoded = [reg.decode(b, SCHEMA)[1] for b in blobs]
    runs: dict[str, list[float]] = {"decode": [], "fold": [], "fold_memos_off": []}
    variants: list[tuple[str, Callable[[], float]]] = [
        ("decode", lambda: time_decode(blobs)),
        ("fold", lambda: time_fold(decoded)),
        ("fold_memos_off", lambda: _off(decoded))]
    for r in range(rounds):
        for name, fn in variants if r % 2 == 0 else variants[::-1]:
            runs[name].append(fn())
    us = {k: 1e6 * statistics.median(v) / len(evs) for k, v in runs.items()}
    return {"records": len(evs), "us_per_record": us,
            "fold_over_decode": us["fold"] / us["decode"],
            "fold_memos_off_over_decode": us["fold_memos_off"] / us["decode"],
            "memos_gain": us["fold_memos_off"] / us["fold"]}


def _off(evs: list[dict[str, Any]]) -> float:
    with memos_off():
        return time_fold(evs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--synthetic", type=int, default=20_000)
    ap.add_argument("--locomo", type=Path, default=LOCOMO)
    a = ap.parse_args()
    out: dict[str, Any] = {"rounds": a.rounds}
    corpora = {"locomo_dev": locomo_events(a.locomo),
               "synthetic": synthetic_events(0, a.synthetic, 50)}
    for name, evs in corpora.items():
        r = measure(evs, a.rounds)
        out[name] = r
        us = r["us_per_record"]
        print(f"{name}: {r['records']} records; decode {us['decode']:.1f} us, fold "
              f"{us['fold']:.1f} us = {r['fold_over_decode']:.1f}x the decode; memos off "
              f"{us['fold_memos_off']:.1f} us = {r['fold_memos_off_over_decode']:.1f}x "
              f"(memos: {r['memos_gain']:.2f}x less fold time)", flush=True)
    write_results("bench_fold", out)


if __name__ == "__main__":
    main()
