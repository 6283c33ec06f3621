"""The real broker for the whole test session: KAFKA_BOOTSTRAP, or a local KRaft node we start."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from mnemoflow.streams.config import Settings
from mnemoflow.streams.kafka_local import LocalKafka

SHARED = Path(os.environ.get("MNEMOFLOW_SHARED", Path(__file__).resolve().parents[2] / "shared"))


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if os.environ.get("KAFKA_BOOTSTRAP"):
        yield os.environ["KAFKA_BOOTSTRAP"]
        return
    settings = Settings(home=tmp_path_factory.mktemp("kafka-home"))
    broker = LocalKafka(settings)
    state = broker.up()
    try:
        yield state.bootstrap
    finally:
        broker.down()


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    if not SHARED.is_dir():
        raise FileNotFoundError(f"shared/ not found at {SHARED}; set MNEMOFLOW_SHARED")
    return SHARED
