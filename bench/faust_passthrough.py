"""The faust floor: a bare faust agent that forwards raw bytes from one topic to another.

bench_topology runs it as a baseline in the same run, so the topology's throughput can be read
against what faust itself costs per event on this machine, not only against raw aiokafka.
Run by the bench as: python bench/faust_passthrough.py worker -l warn (env: BS, SRC, DST, APP).
"""

from __future__ import annotations

import os

import faust

from mnemoflow.streams.faust_app import WorkerApp

RAW = {"value_type": bytes, "value_serializer": "raw", "key_type": bytes, "key_serializer": "raw"}

app = WorkerApp(os.environ.get("APP", "faust-floor"), broker=f"kafka://{os.environ.get('BS', '')}",
                store="memory://", web_enabled=False, topic_replication_factor=1,
                consumer_auto_offset_reset="earliest", producer_acks=-1)
src = app.topic(os.environ.get("SRC", "src"), **RAW)
dst = app.topic(os.environ.get("DST", "dst"), **RAW)


@app.agent(src, concurrency=1)
async def forward(stream: faust.StreamT) -> None:
    async for ev in stream.events():
        await dst.send(key=ev.message.key, value=ev.message.value)


if __name__ == "__main__":
    app.main()
