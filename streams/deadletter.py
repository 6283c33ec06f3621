"""Dead-letter records: what could not be taken, why, from where, and the original bytes."""

from __future__ import annotations

from typing import Any


def dead_letter(reason: str, detail: str, topic: str, partition: int, offset: int,
                key: bytes | None, original: bytes | None, stage: str) -> dict[str, Any]:
    return {"reason": reason, "detail": detail[:1000], "sourceTopic": topic,
            "partition": partition, "offset": offset, "key": key,
            "original": original or b"", "stage": stage}
