"""Where memory lives: which topic and key each memory event goes to, and which partition a
key lands on.

A user's private memories (scopes User and External, owner = the user id) are written to the
memory-log keyed by the user, and recall requests are keyed by the user too, so Kafka's
default partitioner puts a user's requests and memories on the same partition number and the
worker that recalls for a user holds exactly that user's memories. Memories of the other scopes
(Session, Workspace, Turn) are not one user's: they go to `memory-shared`, which every worker
folds whole, like a global table. Visibility is still decided by each recall tier's scope
filter; placement only decides which worker holds what.
"""

from __future__ import annotations

from typing import Any

PARTITIONED_SCOPES = frozenset({"User", "External"})
MEMORY_LOG = "memory-log"
MEMORY_SHARED = "memory-shared"
SHARED = -1  # the partition number of the shared store


def memory_topic(ev: dict[str, Any]) -> str:
    """The topic (base name) a memory event belongs in; its key is always the scope owner."""
    return MEMORY_LOG if ev["scope"] in PARTITIONED_SCOPES else MEMORY_SHARED


def request_key(request: dict[str, Any]) -> str:
    """A recall request's key: its user, the owner of the memories it reads."""
    return str(request["userId"])


def murmur2(data: bytes) -> int:
    """The Java client's murmur2 (`org.apache.kafka.common.utils.Utils.murmur2`), which
    Kafka's default partitioner hashes keys with, in every client."""
    m, r = 0x5BD1E995, 24
    length = len(data)
    h = (0x9747B28C ^ length) & 0xFFFFFFFF
    for i in range(0, length - length % 4, 4):
        k = int.from_bytes(data[i:i + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = ((h * m) & 0xFFFFFFFF) ^ k
    tail = data[length - length % 4:]
    if len(tail) >= 3:
        h ^= tail[2] << 16
    if len(tail) >= 2:
        h ^= tail[1] << 8
    if len(tail) >= 1:
        h ^= tail[0]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h


def partition_of(key: str, partitions: int) -> int:
    """The partition Kafka's default partitioner gives a record with this key."""
    return (murmur2(key.encode("utf-8")) & 0x7FFFFFFF) % partitions
