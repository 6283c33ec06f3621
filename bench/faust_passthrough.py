"""The faust floor: bare faust agents that forward raw bytes from topic to topic.

bench_topology runs it as a baseline in the same run, so the topology can be read against
what faust itself costs per event on this machine, not only against raw aiokafka:
- one hop (SRC -> DST) for throughput;
- a chain of hops (CHAIN="t0,t1,t2,t3": three agents, as observer -> gate -> recall) for the
  event -> packet latency floor, with no stage work at all.
Run by the bench as: python bench/faust_passthrough.py (env: BS, SRC, DST or CHAIN, APP, RESET),
with the same faust Worker set-up as the real worker.
"""

from __future__ import annotations

import os
import tempfile

import faust

from mnemoflow.streams.faust_app import WorkerApp
from mnemoflow.streams.worker import PRODUCER_BATCH_BYTES

RAW = {"value_type": bytes, "value_serializer": "raw", "key_type": bytes, "key_serializer": "raw"}

app = WorkerApp(os.environ.get("APP", "faust-floor"), broker=f"kafka://{os.environ.get('BS', '')}",
                store="memory://", web_enabled=False,
                # faust's default datadir is "<app>-data" in the working directory
                datadir=os.path.join(tempfile.gettempdir(), "mnemoflow-bench-{conf.name}-data"),
                topic_replication_factor=1,
                consumer_auto_offset_reset=os.environ.get("RESET", "earliest"), producer_acks=-1,
                producer_max_batch_size=PRODUCER_BATCH_BYTES)
chain = os.environ.get("CHAIN") or f"{os.environ.get('SRC', 'src')},{os.environ.get('DST', 'dst')}"
topics = [app.topic(name, **RAW) for name in chain.split(",")]


def forwarder(i: int) -> None:
    """One bare agent: topics[i] -> topics[i + 1], concurrency 1 like the worker's agents."""
    src, dst = topics[i], topics[i + 1]

    @app.agent(src, concurrency=1, name=f"forward{i}")
    async def forward(stream: faust.StreamT) -> None:
        async for ev in stream.events():
            await dst.send(key=ev.message.key, value=ev.message.value)


for hop in range(len(topics) - 1):
    forwarder(hop)

if __name__ == "__main__":
    from faust.worker import Worker

    worker = Worker(app, loglevel="warn", quiet=True, redirect_stdouts=False)
    worker.spinner = None  # as in streams.worker.run_worker: keeps the root logger at WARN
    worker.execute_from_commandline()
