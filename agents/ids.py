"""Deterministic ids: the same inputs always give the same id, so reprocessing is idempotent."""

from __future__ import annotations

import hashlib


def stable_id(kind: str, *parts: object, length: int = 24) -> str:
    """`kind:` + a sha256 prefix of the parts; readable kind, collision-safe body."""
    h = hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).hexdigest()[:length]
    return f"{kind}:{h}"


def digest_of(*parts: object) -> str:
    return hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).hexdigest()
