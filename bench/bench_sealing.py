"""What sealing memory text costs per record (agents/sealing.py), against the same record in the
clear, in the same run: the Avro decode a reader does anyway, the open it adds, the seal a
writer adds, and the bytes on the log. Pure: no Kafka.

    .venv/bin/python bench/bench_sealing.py [--records 20000]
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

from mnemoflow.agents import sealing
from mnemoflow.agents.memory_events import memory_event
from mnemoflow.schemas.codec import default_registry

SCHEMA = "io.mnemoflow.MemoryEvent"


def per_call_us(fn: Callable[[], object], n: int) -> float:
    """Best of three runs of n calls, in microseconds per call."""
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, time.perf_counter() - t)
    return best / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=20_000)
    n = ap.parse_args().records
    reg = default_registry()
    key = os.urandom(sealing.KEY_LEN)
    print(f"{'text chars':>10} {'bytes clear':>11} {'bytes sealed':>12} {'decode us':>9} "
          f"{'+open us':>8} {'read ratio':>10} {'seal us':>7}")
    for chars in (60, 300, 2000):
        ev = memory_event(event_id="ev-1", op="segment_recorded", memory_id="seg-1",
                          kind="segment", scope="User", owner="user-1", event_time=1,
                          text=("I moved to Lisbon last spring. " * 80)[:chars],
                          entities=["lisbon"], provenance=["sess-1#1.0"])
        sealed = sealing.seal(ev, "0:p:user-1", key, os.urandom(sealing.NONCE_LEN))
        clear_raw, sealed_raw = reg.encode(SCHEMA, ev), reg.encode(SCHEMA, sealed)
        decode = per_call_us(lambda r=clear_raw: reg.decode(r, SCHEMA), n)
        opened = per_call_us(
            lambda r=sealed_raw: sealing.open_sealed(reg.decode(r, SCHEMA)[1], key), n)
        seal = per_call_us(lambda e=ev: sealing.seal(e, "0:p:user-1", key,
                                                     os.urandom(sealing.NONCE_LEN)), n)
        print(f"{chars:>10} {len(clear_raw):>11} {len(sealed_raw):>12} {decode:>9.1f} "
              f"{opened - decode:>8.1f} {opened / decode:>9.2f}x {seal:>7.1f}")


if __name__ == "__main__":
    main()
