"""The worker's lifecycle parts that need no broker: local state, watchdog, crash limit,
health files, the repeat filter on logs, and the consumer's partition-count answer."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path

import pytest

from mnemoflow.streams import lifecycle as L
from mnemoflow.streams.faust_app import _ConsumerThread

KEY = b"__faust\0offset__"


def _store(path: Path, offset: int | None) -> Path:
    from rocksdict import Rdict

    db = Rdict(str(path))
    if offset is not None:
        db[KEY] = str(offset).encode()
    db.close()
    return path


def test_a_store_ahead_of_its_changelog_is_stale(tmp_path: Path) -> None:
    stores = {("app-gate-state-changelog", 0): _store(tmp_path / "gate-state-0.db", 12),
              ("app-gate-state-changelog", 1): _store(tmp_path / "gate-state-1.db", 4),
              ("app-gate-state-changelog", 2): _store(tmp_path / "gate-state-2.db", None),
              ("app-gate-state-changelog", 3): tmp_path / "never-written.db"}
    ends = {("app-gate-state-changelog", 0): 0, ("app-gate-state-changelog", 1): 5,
            ("app-gate-state-changelog", 2): 0, ("app-gate-state-changelog", 3): 0}
    # partition 0: offset 12 persisted, the changelog is empty (a reset broker): stale;
    # partition 1: offset 4 of a changelog whose last record is 4: in step
    assert L.stale_partitions(stores, ends, KEY) == ["app-gate-state-changelog[0] at 12 > -1"]
    ends[("app-gate-state-changelog", 0)] = 13
    assert L.stale_partitions(stores, ends, KEY) == []


def test_dropping_local_state_says_so_in_one_line(tmp_path: Path, caplog) -> None:
    tables = tmp_path / "tables"
    tables.mkdir()
    (tables / "gate-state-0.db").mkdir()
    with caplog.at_level(logging.WARNING):
        L.drop_local_state(tables, "gate[0] at 12 > -1")
    assert not tables.exists()
    assert len(caplog.records) == 1 and "ahead of the changelog" in caplog.records[0].getMessage()


def test_the_watchdog_ends_a_stop_that_takes_too_long() -> None:
    codes: list[int] = []
    fired = threading.Event()
    dog = L.Watchdog(0.05, exit=lambda code: (codes.append(code), fired.set()))
    dog.arm(1, "SIGTERM")
    dog.arm(0, "again")  # a second stop does not re-arm it
    assert fired.wait(30)
    time.sleep(0.1)
    assert codes == [1]


def test_a_disarmed_watchdog_does_nothing() -> None:
    codes: list[int] = []
    dog = L.Watchdog(0.1, exit=codes.append)
    dog.arm(1, "SIGTERM")
    dog.disarm()
    time.sleep(0.3)
    assert codes == []


def test_an_agent_past_its_limit_of_failures_in_a_row_is_fatal() -> None:
    limit = L.CrashLimit(2)
    assert not limit.failed("gate", RuntimeError("a"))
    assert not limit.failed("observer", RuntimeError("b"))
    assert not limit.failed("gate", RuntimeError("c"))
    limit.succeeded("gate")  # a success in between: the count starts again
    assert not limit.failed("gate", RuntimeError("c"))
    assert not limit.failed("gate", RuntimeError("c"))
    assert limit.failed("gate", RuntimeError("boom\nsecond line"))
    assert limit.fatal == ("agent gate failed 3 times in a row (limit "
                           "MNEMOFLOW_AGENT_MAX_RETRIES=2); last: RuntimeError: boom")
    assert not limit.failed("gate", RuntimeError("d"))  # said once


def test_health_files_of_live_workers_are_read_back(tmp_path: Path) -> None:
    h = L.Health(L.health_dir(tmp_path) / f"app.{os.getpid()}.json", "app")
    h.set("ready", partitions=4)
    (L.health_dir(tmp_path) / "app.999999999.json").write_text(json.dumps(
        {"pid": 999999999, "status": "ready", "updated": time.time()}))  # no such process
    (got,) = L.read_health(tmp_path, "app")
    assert (got["status"], got["partitions"], got["fresh"]) == ("ready", 4, True)
    (old,) = L.read_health(tmp_path, "app", now=time.time() + L.STALE_AFTER_S + 1)
    assert not old["fresh"]
    h.remove()
    assert L.read_health(tmp_path, "app") == []


def test_repeated_log_lines_are_held_back_and_counted() -> None:
    clock = [0.0]
    flt = L.RepeatFilter(every_s=30, clock=lambda: clock[0])
    logger = logging.getLogger("aiokafka.conn.test")

    def rec(msg: str, *args: object) -> logging.LogRecord:
        return logger.makeRecord(logger.name, logging.ERROR, __file__, 1, msg, args, None)

    passed = [flt.filter(rec("Unable connect to node with id %s: %s", 1, i)) for i in range(1000)]
    assert passed.count(True) == 1
    assert flt.filter(rec("another message"))
    clock[0] = 31.0
    again = rec("Unable connect to node with id %s: %s", 1, "x")
    assert flt.filter(again)
    assert "999 like this" in again.getMessage()


def test_a_topic_missing_from_the_metadata_snapshot_has_no_partition_count() -> None:
    """faust compares a table's changelog with its source topic and crashed the agent on
    "0 partitions" when the changelog was created after the group's metadata snapshot."""

    class Coordinator:
        _metadata_snapshot = {"app-gate-state-changelog": 4}

    class Consumer:
        _coordinator = Coordinator()

    thread = object.__new__(_ConsumerThread)
    thread._consumer = Consumer()
    assert thread.topic_partitions("app-gate-state-changelog") == 4
    assert thread.topic_partitions("app-evidence-state-changelog") is None


@pytest.mark.parametrize("value, expected", [("1", True), ("true", True), ("ON", True),
                                             ("yes", True), ("0", False), ("false", False),
                                             ("off", False), ("No", False)])
def test_booleans_accept_the_usual_words(monkeypatch, value: str, expected: bool) -> None:
    from mnemoflow.streams.config import Settings

    monkeypatch.setenv("MNEMOFLOW_VECTOR", value)
    assert Settings().vector is expected
