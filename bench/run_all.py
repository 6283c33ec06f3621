"""Run every bench in turn (each prints its own figures and writes bench/results/*.json).

The benches that need Kafka share one broker: KAFKA_BOOTSTRAP, the running local broker, or
one started here and stopped again before the offline benches (so no idle JVM runs beside
them) and on any way out, Ctrl-C and SIGTERM included. A broker that was already running is
left running.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from types import FrameType

from common import kafka_broker

from mnemoflow.streams.config import Settings

HERE = Path(__file__).resolve().parent
KAFKA_SCRIPTS = ("bench_topology.py", "bench_inbox.py", "bench_projection.py", "bench_step_wait.py")
OFFLINE_SCRIPTS = ("bench_recall.py", "bench_graph.py", "bench_embedding.py", "bench_embedding_onnx.py",
                   "bench_query_embedding.py", "bench_fold.py",
                   "bench_audit_store.py", "bench_console.py")


class Terminated(Exception):
    """SIGTERM, raised where run_all is, so its `with` and finally blocks run."""


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise Terminated


def run(script: str, env: dict[str, str]) -> int:
    print(f"== {script}", flush=True)
    proc = subprocess.Popen([sys.executable, str(HERE / script)], cwd=HERE, env=env)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        # Ctrl-C reached the bench too (same process group): let it stop what it started
        # (subprocess.run would SIGKILL it a quarter second later)
        proc.wait(120)
        raise
    except Terminated:
        # only run_all got it: pass it on as the Ctrl-C every bench cleans up after
        proc.send_signal(signal.SIGINT)
        proc.wait(120)
        raise


def main() -> None:
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        with kafka_broker(Settings()) as bootstrap:
            env = dict(os.environ, KAFKA_BOOTSTRAP=bootstrap)  # no bench starts a broker of its own
            for script in KAFKA_SCRIPTS:
                run(script, env)
        for script in OFFLINE_SCRIPTS:
            run(script, dict(os.environ))
    except Terminated:
        sys.exit(128 + signal.SIGTERM)


if __name__ == "__main__":
    main()
