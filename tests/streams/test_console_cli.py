"""`mnemoflow console` as a user starts it: refused on a public address without a token; on
loopback it serves the pages and the metrics to a loopback Host only; with a token, only to
a client that has it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest

from support import isolated_settings, prepare_topics, worker_env

pytestmark = pytest.mark.kafka
CLI = [sys.executable, "-m", "mnemoflow.streams.cli", "console"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def running(env: dict[str, str], *args: str) -> Iterator[str]:
    port = _free_port()
    proc = subprocess.Popen([*CLI, "--port", str(port), *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.communicate()[0]
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the console did not come up in 60 s"
            time.sleep(0.2)
        yield url
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()


async def test_the_console_command(kafka_bootstrap, tmp_path) -> None:
    s = isolated_settings(tmp_path, "console-cli")
    env = worker_env(s, kafka_bootstrap)
    env.pop("MNEMOFLOW_CONSOLE_TOKEN", None)
    out = subprocess.run([*CLI, "--host", "0.0.0.0"], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2 and "without a token" in out.stderr
    await prepare_topics(s, kafka_bootstrap)
    with running(env) as url:
        assert "Sessions" in httpx.get(f"{url}/").text
        assert httpx.get(f"{url}/", headers={"Host": "evil.example"}).status_code == 403
        assert "mnemoflow_packets_claimed_total 0.0" in httpx.get(f"{url}/metrics").text
    with running(env, "--token", "t0ken-for-the-test") as url:
        assert httpx.get(f"{url}/").status_code == 401
        assert httpx.get(f"{url}/", headers={
            "Authorization": "Bearer t0ken-for-the-test"}).status_code == 200
