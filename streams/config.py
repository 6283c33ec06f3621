"""Settings from the environment: one frozen object passed around, never read globally."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def _env(name: str, default: str) -> str:
    return os.environ.get(name, default)


@dataclass(frozen=True)
class Settings:
    """Everything configurable. Each field names the environment variable that sets it."""

    home: Path = field(default_factory=lambda: Path(_env("MNEMOFLOW_HOME", str(REPO_ROOT / ".mnemoflow"))))
    bootstrap: str | None = field(default_factory=lambda: os.environ.get("KAFKA_BOOTSTRAP") or None)
    topic_prefix: str = field(default_factory=lambda: _env("MNEMOFLOW_TOPIC_PREFIX", "mnemoflow."))
    partitions: int = field(default_factory=lambda: int(_env("MNEMOFLOW_PARTITIONS", "4")))
    app_id: str = field(default_factory=lambda: _env("MNEMOFLOW_APP_ID", "mnemoflow"))
    store: str = field(default_factory=lambda: _env("MNEMOFLOW_STORE", "rocksdb://"))
    security_protocol: str = field(default_factory=lambda: _env("KAFKA_SECURITY_PROTOCOL", "PLAINTEXT"))
    sasl_mechanism: str | None = field(default_factory=lambda: os.environ.get("KAFKA_SASL_MECHANISM"))
    sasl_username: str | None = field(default_factory=lambda: os.environ.get("KAFKA_SASL_USERNAME"))
    sasl_password: str | None = field(default_factory=lambda: os.environ.get("KAFKA_SASL_PASSWORD"))
    ssl_cafile: str | None = field(default_factory=lambda: os.environ.get("KAFKA_SSL_CAFILE"))
    max_payload_bytes: int = field(default_factory=lambda: int(_env("MNEMOFLOW_MAX_PAYLOAD_BYTES", "262144")))
    weights_file: str | None = field(default_factory=lambda: os.environ.get("MNEMOFLOW_WEIGHTS"))
    session_timeout_s: float = field(
        default_factory=lambda: float(_env("MNEMOFLOW_SESSION_TIMEOUT_S", "10")))
    consolidate_interval_s: float = field(
        default_factory=lambda: float(_env("MNEMOFLOW_CONSOLIDATE_INTERVAL_S", "5")))
    consolidate_idle_s: float = field(
        default_factory=lambda: float(_env("MNEMOFLOW_CONSOLIDATE_IDLE_S", "3")))
    graph: bool = field(default_factory=lambda: _env("MNEMOFLOW_GRAPH", "1") not in ("0", "off"))
    vector: bool = field(default_factory=lambda: _env("MNEMOFLOW_VECTOR", "1") not in ("0", "off"))
    # what recall waits for before it searches: "applied" (the lexical store; never waits
    # behind embedding) or "projected" (also every vector row of the request's scope owners:
    # a replay then gives the same packets whatever the embedding speed; the evaluation
    # harness uses it)
    recall_barrier: str = field(
        default_factory=lambda: _env("MNEMOFLOW_RECALL_BARRIER", "applied"))
    barrier_timeout_s: float = field(
        default_factory=lambda: float(_env("MNEMOFLOW_BARRIER_TIMEOUT_S", "2")))
    # past this the vector tier (query embedding + LanceDB) is given up and recall answers
    # lexically (G-05); the query embedding itself gets one second less
    vector_timeout_s: float = field(
        default_factory=lambda: float(_env("MNEMOFLOW_VECTOR_TIMEOUT_S", "3")))
    # fault injection for resilience drills: these recall tiers raise instead of answering
    fault_tiers: tuple[str, ...] = field(default_factory=lambda: tuple(
        t for t in os.environ.get("MNEMOFLOW_FAULT_TIERS", "").split(",") if t))

    def __post_init__(self) -> None:
        if self.recall_barrier not in ("applied", "projected"):
            raise ValueError(f"MNEMOFLOW_RECALL_BARRIER must be applied or projected, "
                             f"not {self.recall_barrier!r}")

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
        from dataclasses import replace

        return replace(self, **kw)  # type: ignore[arg-type]
