"""Single-object encoding, dead-letter reasons, and schema evolution in both directions."""

from __future__ import annotations

import copy
import struct

import pytest
from fastavro.schema import fingerprint

from mnemoflow.agents.observer import ObserverState, observe
from mnemoflow.schemas.codec import (
    MAGIC,
    DecodeError,
    SchemaRegistry,
    crc64_avro,
    default_registry,
    topic_schema,
)

from factories import user_event

EVENT = {"schemaVersion": 1, "sessionId": "s1", "agentId": "a", "userId": "u", "eventSeq": 7,
         "turn": 1, "step": 0, "eventTime": 1_700_000_000_000, "type": "user_message",
         "text": "héllo wörld"}


def test_crc64_matches_fastavro_and_spec_vector() -> None:
    # fastavro prints the 8 fingerprint bytes in little-endian order, as single-object uses them
    for canon in ['"int"', '"string"', '{"type":"record","name":"x","fields":[]}']:
        assert struct.pack("<Q", crc64_avro(canon.encode())).hex() == fingerprint(canon, "CRC-64-AVRO")


def test_roundtrip_has_single_object_header() -> None:
    reg = default_registry()
    data = reg.encode("io.mnemoflow.SessionEvent", EVENT)
    assert data[:2] == MAGIC
    (fp,) = struct.unpack("<Q", data[2:10])
    assert fp == reg.schema("io.mnemoflow.SessionEvent").fingerprint
    name, rec = reg.decode(data)
    assert name == "io.mnemoflow.SessionEvent"
    assert rec["text"] == "héllo wörld" and rec["eventSeq"] == 7 and rec["attributes"] == {}


def test_every_topic_schema_has_a_distinct_fingerprint() -> None:
    reg = default_registry()
    fps = [reg.schema(n).fingerprint for n in reg.names()]
    assert len(fps) == len(set(fps)) >= 13


def test_version_fields_exist() -> None:
    seg = topic_schema("segments.avsc")
    env = next(f for f in seg["fields"] if f["name"] == "envelope")["type"]
    assert "schemaVersion" in [f["name"] for f in env["fields"]]
    inbox = topic_schema("inbox.avsc")
    packet = next(f for f in inbox["fields"] if f["name"] == "packet")["type"][1]
    assert "packetSchemaVersion" in [f["name"] for f in packet["fields"]]


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"garbage!!", "bad-magic"),
        (b"", "bad-magic"),
        (MAGIC + b"\x00" * 8 + b"\x02", "unknown-fingerprint"),
    ],
)
def test_bad_bytes_have_reasons(data: bytes, reason: str) -> None:
    with pytest.raises(DecodeError) as err:
        default_registry().decode(data)
    assert err.value.reason == reason


def test_truncated_body_is_undecodable() -> None:
    reg = default_registry()
    data = reg.encode("io.mnemoflow.SessionEvent", EVENT)
    with pytest.raises(DecodeError) as err:
        reg.decode(data[:14])
    assert err.value.reason == "undecodable"
    with pytest.raises(DecodeError) as err:
        reg.decode(data + b"\x00")
    assert err.value.reason == "undecodable"


def test_expect_rejects_the_wrong_record_type() -> None:
    reg = default_registry()
    data = reg.encode("io.mnemoflow.SessionEvent", EVENT)
    with pytest.raises(DecodeError) as err:
        reg.decode(data, "io.mnemoflow.ToolResult")
    assert err.value.reason == "wrong-type"


def _v11() -> dict:
    s = copy.deepcopy(topic_schema("session-events.avsc"))
    s["fields"].append({"name": "locale", "type": ["null", "string"], "default": None})
    return s


def test_v1_writer_v11_reader() -> None:
    writer = SchemaRegistry()
    writer.register(topic_schema("session-events.avsc"))
    reader = SchemaRegistry()
    reader.register(topic_schema("session-events.avsc"), current=False)
    reader.register(_v11())
    _, rec = reader.decode(writer.encode("io.mnemoflow.SessionEvent", EVENT))
    assert rec["locale"] is None and rec["text"] == EVENT["text"]


def test_v11_writer_v1_reader() -> None:
    writer = SchemaRegistry()
    writer.register(_v11())
    reader = SchemaRegistry()
    reader.register(_v11(), current=False)
    reader.register(topic_schema("session-events.avsc"))
    _, rec = reader.decode(writer.encode("io.mnemoflow.SessionEvent", {**EVENT, "locale": "de"}))
    assert "locale" not in rec and rec["eventSeq"] == 7


def test_segments_written_before_attributes_existed_still_decode() -> None:
    """A rolling upgrade: segments already on the topic were written without `attributes`."""
    seg = observe(ObserverState(), "session-events", user_event("s1", 1, "hello"))[1].segment
    old = SchemaRegistry()
    old.register(topic_schema("history/segments.1.avsc"))
    legacy = {k: v for k, v in seg.items() if k != "attributes"}
    data = old.encode("io.mnemoflow.Segment", legacy)
    name, rec = default_registry().decode(data, "io.mnemoflow.Segment")
    assert name == "io.mnemoflow.Segment" and rec == {**legacy, "attributes": {}}
