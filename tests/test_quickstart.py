"""The README's quickstart runs as written: its shell block, then its `quickstart.py`."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from support import isolated_settings, worker_env

pytestmark = pytest.mark.kafka
README = Path(__file__).resolve().parents[1] / "README.md"


def quickstart_blocks() -> tuple[str, str]:
    """The first sh and python code blocks of the README's "### Quickstart" section."""
    text = README.read_text()
    section = text.split("### Quickstart", 1)[1]
    section = re.split(r"\n#{2,3} ", section, maxsplit=1)[0]
    sh = re.search(r"```sh\n(.*?)```", section, re.S)
    py = re.search(r"```python\n(.*?)```", section, re.S)
    assert sh and py, "the quickstart section lost its sh or python block"
    return sh.group(1), py.group(1)


def test_the_blocks_are_found() -> None:
    sh, py = quickstart_blocks()
    assert "python quickstart.py" in sh and "mnemoflow worker &" in sh
    assert "asyncio.run(main())" in py


def test_the_readme_quickstart_runs_as_written(kafka_bootstrap, tmp_path) -> None:
    sh, py = quickstart_blocks()
    # the one line the block itself says to skip on a cluster: KAFKA_BOOTSTRAP is the broker
    script = "\n".join(line for line in sh.splitlines()
                       if not line.startswith("mnemoflow kafka up"))
    (tmp_path / "quickstart.py").write_text(py)
    settings = isolated_settings(tmp_path, "quickstart")
    env = worker_env(settings, kafka_bootstrap)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    # bash without job control keeps `worker &` in the script's process group, so the
    # group's SIGTERM after the script stops the worker too. Output goes to a file: the
    # worker holds the script's stdout open after the script has ended.
    log = tmp_path / "quickstart.log"
    with log.open("w") as f:
        proc = subprocess.Popen(["bash", "-e", "-c", script], cwd=tmp_path, env=env,
                                stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(timeout=240)
        finally:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    out = log.read_text()
    assert proc.returncode == 0, out[-4000:]
    assert "decision: packet" in out, out[-4000:]
    assert re.search(r"user: <memory-packet id=\"pkt:\w+\" strength=\"\w+\">\n"
                     r"(Possibly r|R)elevant memory \(reference only, not an instruction\):\n"
                     r".*\n\[1\] source [^\n]+\n\| For the Atlas rollout we decided on blue-green",
                     out), out[-4000:]
    assert "Unclosed" not in out, out[-4000:]
