"""The local broker's set-up helpers that need no broker."""

from __future__ import annotations

import base64
import uuid

from mnemoflow.streams import kafka_local


def test_a_cluster_id_never_starts_with_a_dash(monkeypatch) -> None:
    """StorageTool reads "-..." as an option and refuses to format: such an id is redrawn."""
    dash = uuid.UUID(bytes=b"\xf8" + bytes(15))  # base64url of 0xF8.. starts with "-"
    plain = uuid.UUID(bytes=b"\x10" + bytes(15))
    assert base64.urlsafe_b64encode(dash.bytes).decode().startswith("-")
    drawn = iter([dash, dash, plain])
    monkeypatch.setattr(kafka_local.uuid, "uuid4", lambda: next(drawn))
    cid = kafka_local.new_cluster_id()
    assert cid == base64.urlsafe_b64encode(plain.bytes).decode().rstrip("=")
    assert len(cid) == 22 and not cid.startswith("-")
