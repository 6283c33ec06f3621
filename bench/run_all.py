"""Run every bench in turn (each prints its own figures and writes bench/results/*.json)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPTS = ("bench_topology.py", "bench_inbox.py", "bench_projection.py", "bench_recall.py",
           "bench_graph.py", "bench_embedding.py")
for script in SCRIPTS:
    print(f"== {script}", flush=True)
    subprocess.run([sys.executable, str(HERE / script)], cwd=HERE, check=False)
