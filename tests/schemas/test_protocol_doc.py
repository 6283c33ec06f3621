"""docs/PROTOCOL.md cannot drift from the code: every test vector, fingerprint, canonical form
and example byte string in it is computed again here with the project's own functions.

The document marks each checked block with `<!-- check:NAME -->` ... `<!-- /check -->`. Pure:
no Kafka.
"""

from __future__ import annotations

import ast
import json
import re
import struct
from pathlib import Path
from typing import Any

import pytest

from mnemoflow.agents.ids import stable_id
from mnemoflow.agents.inbox import FOLD_HEADER, claim_op, op_record
from mnemoflow.agents.partitioning import murmur2, partition_of
from mnemoflow.schemas.codec import MAGIC, crc64_avro, default_registry
from mnemoflow.streams import topics as T
from mnemoflow.streams.config import Settings

DOC = Path(__file__).resolve().parents[2] / "docs" / "PROTOCOL.md"
TEXT = DOC.read_text(encoding="utf-8")
REG = default_registry()

SESSION_EVENT = {
    "schemaVersion": 1, "sessionId": "sess-42", "agentId": "agent", "userId": "alice",
    "workspaceId": None, "eventSeq": 1, "turn": 1, "step": 0, "eventTime": 1767225600000,
    "type": "user_message", "text": "Deploy Atlas?", "provenance": None, "lifecycle": None,
    "capability": None, "feedbackKind": None, "feedbackRef": None, "attributes": {},
}
CLAIMER = "host-java-1"
PACKET_ID = stable_id("pkt", "example")
CLAIM = claim_op(stable_id("op", "claim", CLAIMER, "example"), "sess-42", [PACKET_ID],
                 1767225605000, CLAIMER)
# every schema a host writes or reads: Appendix B gives the canonical form of each
HOST_SCHEMAS = ("SessionEvent", "ToolResult", "AgentStep", "InboxOp", "InboxCheckpoint",
                "AuditRecord", "MemoryEvent", "DeadLetter", "OwnerKey")
# every reason the code can dead-letter with (codec, observer, faust runner)
DEAD_LETTER_REASONS = ("bad-magic", "unknown-fingerprint", "wrong-type", "undecodable",
                       "schema-version", "oversized", "invalid", "processing-error")


def _section(name: str) -> str:
    m = re.search(rf"<!-- check:{re.escape(name)} -->\n(.*?)<!-- /check -->", TEXT, re.S)
    assert m is not None, f"no block check:{name} in {DOC}"
    return m.group(1)


def _code(name: str) -> str:
    m = re.search(r"```[a-z]*\n(.*?)\n```", _section(name), re.S)
    assert m is not None, f"no fenced block in check:{name}"
    return m.group(1)


def _table(name: str) -> tuple[list[str], list[list[str]]]:
    """(header cells, body rows) of the table in a block, backticks stripped."""
    rows = [[c.strip().strip("`") for c in line.strip().strip("|").split("|")]
            for line in _section(name).splitlines() if line.startswith("|")]
    assert len(rows) > 2, f"no table in check:{name}"
    return rows[0], rows[2:]


def _signed(h: int) -> int:
    return h - (1 << 32) if h >= 1 << 31 else h


def test_partition_vectors_are_partition_of() -> None:
    head, rows = _table("partition-vectors")
    counts = [int(c.removeprefix("N=")) for c in head[4:]]
    assert counts and len(rows) >= 5
    for key, key_hex, signed, masked, *parts in rows:
        assert key.encode("utf-8").hex() == key_hex
        assert _signed(murmur2(key.encode("utf-8"))) == int(signed)
        assert murmur2(key.encode("utf-8")) & 0x7FFFFFFF == int(masked)
        assert [partition_of(key, n) for n in counts] == [int(p) for p in parts], key


def test_murmur2_vectors_are_kafkas() -> None:
    _, rows = _table("murmur2-vectors")
    assert len(rows) == 6
    for text, signed in rows:
        assert _signed(murmur2(text.encode("ascii"))) == int(signed), text


def test_crc64_vectors() -> None:
    _, rows = _table("crc64-vectors")
    for pcf, fp, header in rows:
        assert crc64_avro(pcf.encode()) == int(fp, 16)
        assert struct.pack("<Q", int(fp, 16)).hex() == header


def test_fingerprint_table_lists_every_known_schema() -> None:
    _, rows = _table("fingerprints")
    documented = {(name, status.split(" ")[0], int(fp, 16), header)
                  for name, status, fp, header in rows}
    current = set(REG.names())
    known = {(r.name, "current" if REG.schema(r.name) is r else "history", fp,
              struct.pack("<Q", fp).hex())
             for fp, r in REG._by_fp.items()}  # the registry's whole set, history included
    assert documented == known
    assert {name for name, status, _, _ in documented if status == "current"} == current


@pytest.mark.parametrize("name", HOST_SCHEMAS)
def test_canonical_forms(name: str) -> None:
    full = f"io.mnemoflow.{name}"
    pcf = _code(f"pcf:{full}")
    reg = REG.schema(full)
    assert pcf == reg.canonical
    assert crc64_avro(pcf.encode()) == reg.fingerprint


def _check_example(prefix: str, schema: str, record: dict[str, Any], topic: T.TopicSpec,
                   monkeypatch: pytest.MonkeyPatch) -> bytes:
    assert json.loads(_code(f"{prefix}-json")) == record
    value = REG.encode(schema, record)
    assert _code(f"{prefix}-hex").strip() == value.hex()
    assert REG.decode(value, schema) == (schema, record)
    # the labelled table: its byte column is the whole value, one row per field in order
    _, rows = _table(f"{prefix}-fields")
    assert "".join(r[0] for r in rows) == value.hex()
    assert rows[0][:2] == [MAGIC.hex(), "marker"]
    assert rows[1][:2] == [value[2:10].hex(), "fingerprint"]
    assert f"0x{REG.schema(schema).fingerprint:016x}" in rows[1][2]
    fields = [f["name"] for f in json.loads(REG.schema(schema).canonical)["fields"]]
    assert [r[1] for r in rows[2:]] == fields
    # the Kafka key and its partition
    monkeypatch.delenv("MNEMOFLOW_TOPIC_PREFIX", raising=False)
    _, [[name, key, key_hex, partitions, partition]] = _table(f"{prefix}-key")
    assert name == topic.name(Settings())
    assert key == record["sessionId"] and key.encode("utf-8").hex() == key_hex
    assert partition_of(key, int(partitions)) == int(partition)
    return value


def test_session_event_example(monkeypatch: pytest.MonkeyPatch) -> None:
    _check_example("session-event", "io.mnemoflow.SessionEvent", SESSION_EVENT,
                   T.SESSION_EVENTS, monkeypatch)


def test_claim_example(monkeypatch: pytest.MonkeyPatch) -> None:
    value = _check_example("claim", "io.mnemoflow.InboxOp", CLAIM, T.INBOX, monkeypatch)
    assert CLAIM["opId"] == "op:f8fc440bbdb2469e85395c2c" and PACKET_ID in TEXT
    written, headers = op_record(CLAIM, REG)
    assert written == value
    lines = {k: v.strip() for k, v in (line.split(":", 1) for line in
                                        _code("claim-header").splitlines())}
    assert headers == [(lines["key"], lines["value"].replace("␟", "\x1f").encode())]
    assert headers[0][0] == FOLD_HEADER and headers[0][1].hex() == lines["hex"]


def test_stable_id_examples() -> None:
    _, rows = _table("stable-id")
    assert rows
    for call, result in rows:
        args = ast.literal_eval(call.removeprefix("stable_id"))
        assert stable_id(*args) == result, call


def test_every_dead_letter_reason_is_documented() -> None:
    schema = json.loads((DOC.parents[1] / "schemas" / "dead-letter.avsc").read_text())
    reason_doc = next(f["doc"] for f in schema["fields"] if f["name"] == "reason")
    for reason in DEAD_LETTER_REASONS:
        assert f"| `{reason}` |" in TEXT, reason
        assert f"{reason} (" in reason_doc, reason


def test_doc_strings_leave_the_dead_letter_fingerprint() -> None:
    """A doc string is not part of the canonical form: the documented fingerprint holds."""
    assert REG.schema("io.mnemoflow.DeadLetter").fingerprint == 0x729A155F283E2589
    assert "`0x729a155f283e2589`" in TEXT
