"""Dead-letter records: what could not be taken, why, from where, and the original bytes.

A dead letter must always be writable, and Kafka refuses records over 1 MB (key and value
together, `message.max.bytes`). The record that failed may itself be close to that, so a dead
letter keeps at most KEY_KEEP_BYTES of the original key and VALUE_KEEP_BYTES of the original
value; when it keeps less than the whole, `detail` says so, with the full size and the
sha256 of the whole, so the original can still be found and matched in the source topic
(`sourceTopic`, `partition`, `offset`). A dead letter therefore stays under 300 kB.

Send the dead letter under its kept key (`record["key"]`), not the original one: the original
key alone may be close to the limit.
"""

from __future__ import annotations

import hashlib
from typing import Any

VALUE_KEEP_BYTES = 256 * 1024
KEY_KEEP_BYTES = 16 * 1024
DETAIL_CHARS = 1000  # of the reason's own detail; the note on what was cut comes after it


def _keep(name: str, data: bytes, limit: int) -> tuple[bytes, str | None]:
    """`data` if it fits in `limit`, else its first `limit` bytes and a note saying so."""
    if len(data) <= limit:
        return data, None
    note = (f"{name} cut to {limit} of {len(data)} bytes, "
            f"sha256 of the whole {hashlib.sha256(data).hexdigest()}")
    return data[:limit], note


def dead_letter(reason: str, detail: str, topic: str, partition: int, offset: int,
                key: bytes | None, original: bytes | None, stage: str) -> dict[str, Any]:
    kept_key, key_note = (None, None) if key is None else _keep("key", key, KEY_KEEP_BYTES)
    kept_value, value_note = _keep("original", original or b"", VALUE_KEEP_BYTES)
    notes = [n for n in (key_note, value_note) if n]
    return {"reason": reason, "detail": "; ".join([detail[:DETAIL_CHARS], *notes]),
            "sourceTopic": topic, "partition": partition, "offset": offset, "key": kept_key,
            "original": kept_value, "stage": stage}
