"""Settings read from the environment: the recall barrier and the vector-tier timeout."""

from __future__ import annotations

import pytest

from mnemoflow.evaluation.run import REPLAY_WORKER_ENV
from mnemoflow.streams.config import Settings


def test_defaults_keep_recall_from_waiting_behind_embedding(monkeypatch) -> None:
    for name in ("MNEMOFLOW_RECALL_BARRIER", "MNEMOFLOW_BARRIER_TIMEOUT_S",
                 "MNEMOFLOW_VECTOR_TIMEOUT_S"):
        monkeypatch.delenv(name, raising=False)
    s = Settings()
    assert (s.recall_barrier, s.barrier_timeout_s, s.vector_timeout_s) == ("applied", 2.0, 3.0)


def test_the_replay_worker_waits_for_every_projection(monkeypatch) -> None:
    for name, value in REPLAY_WORKER_ENV.items():
        monkeypatch.setenv(name, value)
    s = Settings()
    assert s.recall_barrier == "projected"
    assert s.barrier_timeout_s >= 60 and s.vector_timeout_s >= 60


def test_an_unknown_barrier_is_refused(monkeypatch) -> None:
    monkeypatch.setenv("MNEMOFLOW_RECALL_BARRIER", "lexical")
    with pytest.raises(ValueError, match="applied or projected"):
        Settings()
