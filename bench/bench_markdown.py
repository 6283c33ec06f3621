"""Bench: rewriting a busy owner's MEMORY.md, with the sink's rendered-lines cache and without.

The Markdown sink rewrites an owner's whole file at every flush that touches the owner. One
owner with --history memories gets one new memory per flush, --flushes times; each flush
writes the file as the sink does (`RenderedLines.write`) and, in the same run, as a full
render does (`write_records`: every line rendered again). Figures are per flush, printed,
never asserted; the full render is the baseline.

Run: .venv/bin/python bench/bench_markdown.py [--flushes 50]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from common import write_results

from mnemoflow.agents.memory_events import memory_event
from mnemoflow.projections.markdown import RenderedLines, owner_records, write_records
from mnemoflow.projections.memory_store import MemoryStore

T0 = 1_700_000_000_000


def note(i: int) -> dict:
    return memory_event(event_id=f"e{i}", op="segment_recorded", memory_id=f"m{i}",
                        kind="segment", scope="User", owner="alice", session_id=f"s{i // 50}",
                        event_seq=i % 50, event_time=T0 + i * 1000,
                        text=f"Turn {i}: the rollout of service {i % 17} goes blue-green, "
                             f"with the canary at {i % 9 + 1} percent first.",
                        provenance=[f"s{i // 50}#{i % 50}.0"])


def per_flush_ms(history: int, flushes: int) -> dict[str, float]:
    store = MemoryStore()
    for i in range(history):
        store.apply(note(i))
    cache = RenderedLines()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        cache.write(root / "cached", "User", "alice", owner_records(store, "User", "alice"))
        full = cached = 0.0
        for i in range(history, history + flushes):
            store.apply(note(i))
            recs = owner_records(store, "User", "alice")
            t = time.perf_counter()
            write_records(root / "full", "User", "alice", recs)
            full += time.perf_counter() - t
            t = time.perf_counter()
            cache.write(root / "cached", "User", "alice", recs)
            cached += time.perf_counter() - t
    return {"full_ms": 1000 * full / flushes, "cached_ms": 1000 * cached / flushes,
            "speedup": full / cached}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--flushes", type=int, default=50)
    args = ap.parse_args()
    out = {}
    for history in (100, 1_000, 10_000):
        r = per_flush_ms(history, args.flushes)
        out[str(history)] = r
        print(f"owner with {history:>6} memories: full render {r['full_ms']:.2f} ms per flush, "
              f"cached lines {r['cached_ms']:.2f} ms = {r['speedup']:.1f}x faster")
    write_results("bench_markdown", out)


if __name__ == "__main__":
    main()
