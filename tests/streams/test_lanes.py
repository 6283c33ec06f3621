"""Keyed lanes: one key's records in arrival order, other keys overlapping, bounded."""

from __future__ import annotations

import asyncio

from mnemoflow.streams.lanes import KeyedLanes


async def test_a_keys_records_run_in_order_and_other_keys_overlap() -> None:
    lanes = KeyedLanes(4)
    log: list[str] = []
    running = 0
    peak = 0

    def work(key: str, i: int, wait: float):
        async def go() -> None:
            nonlocal running, peak
            running += 1
            peak = max(peak, running)
            log.append(f"start {key}{i}")
            await asyncio.sleep(wait)
            log.append(f"end {key}{i}")
            running -= 1
        return go

    await lanes.run("a", work("a", 1, 0.05))
    await lanes.run("a", work("a", 2, 0.0))
    await lanes.run("b", work("b", 1, 0.0))
    await lanes.drain()
    assert log.index("end a1") < log.index("start a2")  # same key: one after the other
    assert log.index("end b1") < log.index("end a1")  # another key did not wait for a
    assert peak >= 2


async def test_the_limit_bounds_what_is_in_flight_and_one_means_one_at_a_time() -> None:
    for limit in (1, 3):
        lanes = KeyedLanes(limit)
        running = peak = 0

        async def go() -> None:
            nonlocal running, peak
            running += 1
            peak = max(peak, running)
            await asyncio.sleep(0.01)
            running -= 1

        for i in range(10):
            await lanes.run(f"k{i}", go)
        await lanes.drain()
        assert peak == limit
