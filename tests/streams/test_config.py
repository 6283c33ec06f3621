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


def test_held_vectors_are_on_unless_switched_off(monkeypatch) -> None:
    assert Settings().held_vectors
    monkeypatch.setenv("MNEMOFLOW_HELD_VECTORS", "0")
    assert not Settings().held_vectors


def test_recall_takes_waiting_requests_together_unless_set_to_one(monkeypatch, tmp_path) -> None:
    from mnemoflow.streams.process import worker_env

    monkeypatch.delenv("MNEMOFLOW_RECALL_BATCH", raising=False)
    assert Settings().recall_batch == 16
    monkeypatch.setenv("MNEMOFLOW_RECALL_BATCH", "1")
    one = Settings()
    assert one.recall_batch == 1
    # a child worker gets the parent's value, not the default
    monkeypatch.delenv("MNEMOFLOW_RECALL_BATCH")
    assert worker_env(one, "127.0.0.1:9")["MNEMOFLOW_RECALL_BATCH"] == "1"


def test_an_unknown_barrier_is_refused(monkeypatch) -> None:
    monkeypatch.setenv("MNEMOFLOW_RECALL_BARRIER", "lexical")
    with pytest.raises(ValueError, match="applied, projected"):
        Settings()


@pytest.mark.parametrize("name, value, words", [
    ("MNEMOFLOW_PARTITIONS", "abc", "an integer >= 1"),
    ("MNEMOFLOW_PARTITIONS", "0", "an integer >= 1"),
    ("MNEMOFLOW_VECTOR", "false-ish", "1/true/on/yes/0/false/off/no"),
    ("MNEMOFLOW_SESSION_TIMEOUT_S", "soon", "a number >= 1"),
    ("MNEMOFLOW_RECALL_BATCH", "0", "an integer >= 1"),
    ("KAFKA_SECURITY_PROTOCOL", "TLS", "PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL"),
    ("MNEMOFLOW_STORE", "redis://", "rocksdb://, memory://"),
])
def test_a_bad_value_is_one_line_naming_the_variable(monkeypatch, name, value, words) -> None:
    from mnemoflow.streams.config import ConfigError

    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as err:
        Settings()
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"{name}={value!r}") and words in msg


def test_false_turns_the_vector_tier_off(monkeypatch) -> None:
    """MNEMOFLOW_VECTOR=false used to leave the tier on: only "0" and "off" were read."""
    monkeypatch.setenv("MNEMOFLOW_VECTOR", "false")
    monkeypatch.setenv("MNEMOFLOW_GRAPH", "no")
    s = Settings()
    assert (s.vector, s.graph) == (False, False)


def test_the_cli_reports_a_bad_variable_in_one_line(monkeypatch, capsys) -> None:
    from mnemoflow.streams.cli import main

    monkeypatch.setenv("MNEMOFLOW_PARTITIONS", "abc")
    with pytest.raises(SystemExit) as done:
        main(["kafka", "status"])
    assert done.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: MNEMOFLOW_PARTITIONS='abc' is not valid: expected an integer >= 1"]


def test_the_cli_has_a_version(capsys) -> None:
    from mnemoflow.streams.cli import main

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith("mnemoflow 0.")


def test_an_unreachable_broker_is_one_line_with_the_address(monkeypatch, capsys) -> None:
    import socket

    from mnemoflow.streams.cli import main

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("KAFKA_BOOTSTRAP", f"127.0.0.1:{port}")
    with pytest.raises(SystemExit) as done:
        main(["topics", "create"])
    assert done.value.code == 2
    captured = capsys.readouterr()
    lines = (captured.out + captured.err).strip().splitlines()
    assert len(lines) == 1 and f"cannot reach Kafka at 127.0.0.1:{port}" in lines[0]
    assert "mnemoflow kafka up" in lines[0]


def test_reset_needs_yes(monkeypatch, tmp_path, capsys) -> None:
    from mnemoflow.streams.cli import main

    monkeypatch.setenv("MNEMOFLOW_HOME", str(tmp_path))
    (tmp_path / "kafka" / "data").mkdir(parents=True)
    with pytest.raises(SystemExit) as done:
        main(["kafka", "reset"])
    assert done.value.code == 2
    assert "add --yes" in capsys.readouterr().err
    assert (tmp_path / "kafka" / "data").is_dir()
