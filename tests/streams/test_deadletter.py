"""Dead-letter records stay writable whatever they carry, and every reason is documented."""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

from mnemoflow.schemas.codec import default_registry
from mnemoflow.streams.deadletter import KEY_KEEP_BYTES, VALUE_KEEP_BYTES, dead_letter

ROOT = Path(__file__).resolve().parents[2]
KAFKA_MAX_MESSAGE = 1_000_000  # message.max.bytes is 1048588; stay clear of it


def _letter(key: bytes | None, value: bytes | None, detail: str = "why") -> dict:
    return dead_letter("undecodable", detail, "mnemoflow.session-events", 3, 42, key, value,
                       "observer")


def test_small_records_are_kept_whole() -> None:
    rec = _letter(b"sess-1", b"\xc3\x01 body")
    assert rec["key"] == b"sess-1" and rec["original"] == b"\xc3\x01 body"
    assert rec["detail"] == "why"
    assert (rec["sourceTopic"], rec["partition"], rec["offset"], rec["stage"]) == (
        "mnemoflow.session-events", 3, 42, "observer")
    none = _letter(None, None)
    assert none["key"] is None and none["original"] == b""


def test_limits_are_inclusive() -> None:
    rec = _letter(b"k" * KEY_KEEP_BYTES, b"v" * VALUE_KEEP_BYTES)
    assert len(rec["key"]) == KEY_KEEP_BYTES and len(rec["original"]) == VALUE_KEEP_BYTES
    assert rec["detail"] == "why"


def test_a_record_near_one_megabyte_gives_a_writable_dead_letter() -> None:
    value, key = os.urandom(1_000_000), os.urandom(600_000)
    rec = _letter(key, value, detail="d" * 5000)
    assert rec["original"] == value[:VALUE_KEEP_BYTES] and rec["key"] == key[:KEY_KEEP_BYTES]
    detail = rec["detail"]
    assert f"original cut to {VALUE_KEEP_BYTES} of 1000000 bytes" in detail
    assert f"key cut to {KEY_KEEP_BYTES} of 600000 bytes" in detail
    assert hashlib.sha256(value).hexdigest() in detail
    assert hashlib.sha256(key).hexdigest() in detail
    body = default_registry().encode("io.mnemoflow.DeadLetter", rec)
    assert len(body) + len(rec["key"]) < KAFKA_MAX_MESSAGE // 3


def test_only_what_was_cut_is_noted() -> None:
    rec = _letter(b"short", b"v" * (VALUE_KEEP_BYTES + 1))
    assert rec["key"] == b"short" and "key cut" not in rec["detail"]
    assert rec["detail"].startswith("why; original cut to ")


def test_doc_change_kept_the_fingerprint() -> None:
    """Avro's canonical form drops docs: readers of older dead letters still resolve them."""
    reg = default_registry().schema("io.mnemoflow.DeadLetter")
    assert f"{reg.fingerprint:016x}" == "729a155f283e2589"


def test_every_reason_the_code_emits_is_documented() -> None:
    emitted = set(re.findall(r'DecodeError\("([a-z-]+)"', (ROOT / "schemas/codec.py").read_text()))
    emitted |= set(re.findall(r'to_dlq\(\w+, "([a-z-]+)"', (ROOT / "streams/faust_runner.py").read_text()))
    emitted |= set(re.findall(r'dead_letter=\(\s*"([a-z-]+)"', (ROOT / "agents/observer.py").read_text()))
    assert {"bad-magic", "wrong-type", "processing-error", "oversized", "invalid"} <= emitted
    schema = json.loads((ROOT / "schemas/dead-letter.avsc").read_text())
    doc = next(f["doc"] for f in schema["fields"] if f["name"] == "reason")
    documented = {item.split()[0] for item in doc.removeprefix("why: ").split(" | ")}
    assert emitted <= documented, emitted - documented
