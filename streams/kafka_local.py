"""A real single-node Apache Kafka (KRaft, broker+controller) for development, tests and the demo.

The jars come from Maven Central through deploy/kafka/pom.xml; nothing here downloads a
binary distribution. State (config, data, pid, log) lives under $MNEMOFLOW_HOME/kafka.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from mnemoflow.streams.config import REPO_ROOT, Settings

DEPLOY_DIR = REPO_ROOT / "deploy" / "kafka"
LIB_DIR = DEPLOY_DIR / "lib"
MVN_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies"
# the heap grows with the partitions the broker holds: a test run makes thousands (every test
# its own topics), and a broker kept up for a day of them (about 15k) ran out of 512 MiB
HEAP = "-Xmx1g"
T = TypeVar("T")


class KafkaSetupError(RuntimeError):
    """A missing prerequisite, with a one-line message that names the fix."""


@dataclass(frozen=True)
class BrokerState:
    pid: int
    bootstrap: str
    controller_port: int
    log_file: str


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # as the JVM binds its listeners: a port whose old connections are in TIME_WAIT is free
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine to completion from sync code, also when the caller is itself inside
    an event loop (a bench or a test that starts the broker): then on a thread of its own."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def new_cluster_id() -> str:
    """A random KRaft cluster id (base64url of a uuid4). One starting with "-" is drawn
    again, as Kafka's own Uuid.randomUuid does: StorageTool would read it as an option and
    refuse to format, which failed about one start in 64."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


def _java_major() -> int | None:
    java = shutil.which("java")
    if not java:
        return None
    out = subprocess.run([java, "-version"], capture_output=True, text=True).stderr
    for token in out.replace('"', " ").split():
        if token[:1].isdigit():
            head = token.split(".")[0]
            return int(head) if head.isdigit() else None
    return None


def check_prerequisites(need_maven: bool) -> None:
    major = _java_major()
    if major is None or major < 17:
        raise KafkaSetupError("Java 17+ not found: install it (apt-get install openjdk-17-jre-headless)")
    if need_maven and not shutil.which("mvn"):
        raise KafkaSetupError("Maven not found: install it (apt-get install maven) to fetch the Kafka jars")


def ensure_jars() -> Path:
    """Resolve the Kafka jars into deploy/kafka/lib (git-ignored) once."""
    if any(LIB_DIR.glob("kafka_2.13-*.jar")):
        return LIB_DIR
    check_prerequisites(need_maven=True)
    cmd = ["mvn", "-B", "-q", "-f", str(DEPLOY_DIR / "pom.xml"), MVN_PLUGIN,
           f"-DoutputDirectory={LIB_DIR}", "-DincludeScope=runtime"]
    print("resolving Kafka jars from Maven Central:", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    return LIB_DIR


class LocalKafka:
    """Starts, stops and reports on the local broker; every call is idempotent."""

    def __init__(self, settings: Settings) -> None:
        self.dir = settings.kafka_dir
        self.state_file = self.dir / "broker.json"
        self.log_file = self.dir / "broker.log"

    def _read_state(self) -> BrokerState | None:
        try:
            return BrokerState(**json.loads(self.state_file.read_text()))
        except (OSError, ValueError, TypeError):
            return None

    @staticmethod
    def _alive(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except OSError:
            return False
        try:  # a zombie is not alive
            with open(f"/proc/{pid}/stat") as f:
                return f.read().split()[2] != "Z"
        except OSError:
            return True

    def status(self) -> BrokerState | None:
        st = self._read_state()
        if st and self._alive(st.pid):
            return st
        return None

    def _write_config(self, port: int, cport: int) -> Path:
        data = self.data_dir
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{cport}",
            "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{cport}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(data),
            "num.partitions": "1",
            "auto.create.topics.enable": "false",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "8",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            "log.segment.bytes": str(64 * 1024 * 1024),
        }
        path = self.dir / "server.properties"
        path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        (self.dir / "log4j2.properties").write_text(
            "status = warn\n"
            "appender.file.type = File\nappender.file.name = FILE\n"
            f"appender.file.fileName = {self.dir / 'server.log'}\n"
            "appender.file.layout.type = PatternLayout\n"
            "appender.file.layout.pattern = [%d] %p %m (%c)%n\n"
            "rootLogger.level = info\nrootLogger.appenderRef.file.ref = FILE\n"
            "logger.kafka.name = kafka\nlogger.kafka.level = info\n"
            "logger.apache.name = org.apache\nlogger.apache.level = warn\n"
        )
        return path

    def _java(self, main: str, *args: str) -> list[str]:
        return ["java", HEAP, "-Xms128m", "-XX:+UseG1GC",
                f"-Dlog4j2.configurationFile={self.dir / 'log4j2.properties'}",
                "-cp", f"{LIB_DIR}/*", main, *args]

    @property
    def data_dir(self) -> Path:
        return self.dir / "data"

    def _formatted(self) -> bool:
        return (self.data_dir / "meta.properties").exists()

    def _ports(self) -> tuple[int, int]:
        """The previous run's ports when they are free: a restarted broker keeps its address,
        so clients configured with it (and its own metadata) stay valid."""
        old = self._read_state()
        if old is not None:
            port = int(old.bootstrap.rpartition(":")[2])
            if _port_free(port) and _port_free(old.controller_port):
                return port, old.controller_port
        return _free_port(), _free_port()

    def up(self, timeout: float = 90.0) -> BrokerState:
        """Start the broker, or report the running one. Never deletes anything: a broker that
        was stopped comes back with every topic, record and committed offset it had."""
        existing = self.status()
        if existing:
            print(f"kafka already running (pid {existing.pid}) at {existing.bootstrap}")
            return existing
        check_prerequisites(need_maven=False)
        ensure_jars()
        self.dir.mkdir(parents=True, exist_ok=True)
        port, cport = self._ports()
        config = self._write_config(port, cport)
        if not self._formatted():
            subprocess.run(
                self._java("kafka.tools.StorageTool", "format", "-t", new_cluster_id(),
                           "-c", str(config)),
                check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            )
        log = open(self.log_file, "ab")
        proc = subprocess.Popen(
            self._java("kafka.Kafka", str(config)),
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        state = BrokerState(proc.pid, f"127.0.0.1:{port}", cport, str(self.log_file))
        self.state_file.write_text(json.dumps(state.__dict__))
        print(f"kafka starting (pid {proc.pid}) at {state.bootstrap}, log {self.log_file}", flush=True)
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                if proc.poll() is not None:
                    raise KafkaSetupError(f"kafka exited with {proc.returncode}; see {self.log_file}")
                if _run_sync(cluster_ready(state.bootstrap, {})):
                    print(f"kafka ready at {state.bootstrap}", flush=True)
                    return state
                time.sleep(0.5)
        except BaseException:  # Ctrl-C or an error while waiting: no broker left behind
            self.down()
            raise
        self.down()
        raise KafkaSetupError(f"kafka did not become ready in {timeout:.0f}s; see {self.log_file}")

    def reset(self) -> list[Path]:
        """Stop the broker and delete its data (every topic, record and offset). The only
        call here that deletes anything; `mnemoflow kafka reset --yes` asks for it."""
        self.down()
        gone = [p for p in (self.data_dir, self.state_file) if p.exists()]
        for p in gone:
            if p.is_dir():
                shutil.rmtree(p)
            else:
                p.unlink()
        return gone

    def down(self, timeout: float = 30.0) -> bool:
        st = self._read_state()
        if not st or not self._alive(st.pid):
            print("kafka not running")
            return False
        os.killpg(st.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self._alive(st.pid):
            time.sleep(0.2)
        if self._alive(st.pid):
            os.killpg(st.pid, signal.SIGKILL)
        print(f"kafka stopped (pid {st.pid})", flush=True)
        return True


async def cluster_ready(bootstrap: str, client_kwargs: dict[str, object]) -> bool:
    """Ready means an admin client's describe_cluster answers with a controller and a broker."""
    from aiokafka.admin import AIOKafkaAdminClient

    host, _, port = bootstrap.split(",")[0].rpartition(":")
    try:  # cheap probe first, so a starting broker does not flood the log with client errors
        with socket.create_connection((host, int(port)), timeout=1.0):
            pass
    except OSError:
        return False
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=3000,
                                **client_kwargs)
    try:
        await admin.start()
        info = await admin.describe_cluster()
        return bool(info.get("brokers"))
    except Exception:
        return False
    finally:
        try:
            await admin.close()
        except Exception:
            pass


def resolve_bootstrap(settings: Settings) -> str:
    """KAFKA_BOOTSTRAP wins; otherwise the local broker, which must be up."""
    if settings.bootstrap:
        return settings.bootstrap
    st = LocalKafka(settings).status()
    if st is None:
        print("no broker: run `mnemoflow kafka up` or set KAFKA_BOOTSTRAP", file=sys.stderr)
        raise SystemExit(2)
    return st.bootstrap
