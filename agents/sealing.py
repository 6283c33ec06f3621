"""Crypto-shredding of memory text: per-owner data keys, and memory events sealed with them.

A memory event's text fields are encrypted with its owner's data key before the event is
written; the memory-log keeps the ciphertext forever, and forgetting the owner shreds the key
(a tombstone on the compacted memory-keys topic), so that nothing can read them again.

The keys are a fold of memory-keys (`OwnerKeys`), one partition read whole by every process. A
writer that has no key for an owner proposes one and reads the topic back: of the proposals for
one (owner, epoch), the one at the lowest offset is the key, so every process agrees without
talking to the others. A forget ends the owner's epoch (a `forgotten` record) and tombstones
its keys; a later memory of the owner gets a key of the next epoch. The record and protocol code
only: the I/O is `streams.keyring`.
"""

from __future__ import annotations

import hashlib
import json
from base64 import b64decode, b64encode
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

FORGET_OP = "owner_forgotten"
# the fields that carry what a person said or what was derived from it; the rest (ids, scope,
# owner, times, op, kind, source, provenance) routes and orders the record and stays readable
SEALED_FIELDS: dict[str, Any] = {"text": "", "entities": [], "subject": None,
                                 "predicate": None, "object": None, "attributes": {}}
NONCE_LEN = 12
KEY_LEN = 32


class SealError(Exception):
    """A sealed record or a wrapped key that does not open: tampered, or the wrong KEK."""


def kek_id(kek: bytes) -> str:
    return hashlib.sha256(b"mnemoflow-kek-id" + kek).hexdigest()[:16]


def key_record_key(owner: str, epoch: int, proposal_id: str) -> str:
    return f"{epoch}:{proposal_id}:{owner}"


def wrap(kek: bytes, record_key: str, data_key: bytes, nonce: bytes) -> bytes:
    return nonce + AESGCM(kek).encrypt(nonce, data_key, record_key.encode())


def unwrap(kek: bytes, record_key: str, wrapped: bytes) -> bytes:
    try:
        return AESGCM(kek).decrypt(wrapped[:NONCE_LEN], wrapped[NONCE_LEN:], record_key.encode())
    except InvalidTag as exc:
        raise SealError(f"the key {record_key!r} does not unwrap with this KEK") from exc


def key_proposal(kek: bytes, owner: str, epoch: int, proposal_id: str, data_key: bytes,
                 nonce: bytes, now_ms: int) -> tuple[str, dict[str, Any]]:
    """(record key, OwnerKey value) of a proposal of `data_key` as the owner's key."""
    rk = key_record_key(owner, epoch, proposal_id)
    return rk, {"owner": owner, "epoch": epoch, "kind": "key", "proposalId": proposal_id,
                "kekId": kek_id(kek), "wrappedKey": wrap(kek, rk, data_key, nonce),
                "createdAt": now_ms}


def epoch_end(owner: str, epoch: int, kek: bytes, now_ms: int) -> tuple[str, dict[str, Any]]:
    """(record key, OwnerKey value) that ends the owner's epoch: the start of a forget."""
    return key_record_key(owner, epoch, "forgotten"), {
        "owner": owner, "epoch": epoch, "kind": "forgotten", "proposalId": "forgotten",
        "kekId": kek_id(kek), "wrappedKey": b"", "createdAt": now_ms}


@dataclass
class OwnerKeys:
    """The fold of memory-keys: every live key by record key, and each owner's epoch."""

    keys: dict[str, tuple[int, dict[str, Any]]] = field(default_factory=dict)
    by_owner: dict[str, set[str]] = field(default_factory=dict)
    ended: dict[str, int] = field(default_factory=dict)  # owner -> last forgotten epoch
    shredded: set[str] = field(default_factory=set)
    position: int = 0  # the next offset to fold

    def apply(self, offset: int, record_key: str, value: Mapping[str, Any] | None) -> None:
        self.position = max(self.position, offset + 1)
        if value is None:  # a tombstone: the key is shredded, whether or not it was seen
            gone = self.keys.pop(record_key, None)
            if gone is not None:
                self.by_owner.get(str(gone[1]["owner"]), set()).discard(record_key)
            self.shredded.add(record_key)
            return
        owner, epoch = str(value["owner"]), int(value["epoch"])
        if value["kind"] == "forgotten":
            self.ended[owner] = max(self.ended.get(owner, -1), epoch)
        elif record_key not in self.shredded:
            self.keys[record_key] = (offset, dict(value))
            self.by_owner.setdefault(owner, set()).add(record_key)

    def epoch(self, owner: str) -> int:
        return self.ended.get(owner, -1) + 1

    def current(self, owner: str) -> tuple[str, dict[str, Any]] | None:
        """The owner's key for new records: the lowest-offset proposal of the open epoch."""
        epoch = self.epoch(owner)
        live = [(self.keys[rk][0], rk) for rk in self.by_owner.get(owner, ())
                if int(self.keys[rk][1]["epoch"]) == epoch]
        if not live:
            return None
        _, rk = min(live)
        return rk, self.keys[rk][1]

    def of_owner(self, owner: str) -> list[str]:
        """Every live key of the owner, of any epoch: what a forget tombstones."""
        return sorted(self.by_owner.get(owner, ()))


# a packet item's text and exact digest (a digest of a short text gives it back to a
# dictionary); the item's ids, score and provenance stay readable
ITEM_FIELDS: dict[str, Any] = {"text": "", "digest": ""}


def _aad(ev: Mapping[str, Any]) -> bytes:
    return "\x00".join((str(ev["eventId"]), str(ev["memoryId"]), str(ev["owner"]))).encode()


def _item_aad(item: Mapping[str, Any]) -> bytes:
    return "\x00".join(("item", str(item["memoryId"]), str(item["owner"]))).encode()


def _empty(default: Any) -> Any:
    return list(default) if isinstance(default, list) else \
        dict(default) if isinstance(default, dict) else default


def _seal(rec: Mapping[str, Any], fields: Mapping[str, Any], aad: bytes, key_id: str,
          data_key: bytes, nonce: bytes) -> dict[str, Any]:
    plain = {f: rec.get(f, d) for f, d in fields.items()}
    body = json.dumps(plain, ensure_ascii=False, separators=(",", ":")).encode()
    return {**rec, **{f: _empty(d) for f, d in fields.items()},
            "sealed": {"keyId": key_id, "nonce": b64encode(nonce).decode(),
                       "ciphertext": b64encode(AESGCM(data_key).encrypt(nonce, body, aad)).decode()}}


def _open(rec: Mapping[str, Any], fields: Mapping[str, Any], aad: bytes,
          data_key: bytes) -> dict[str, Any]:
    s = rec["sealed"]
    try:
        body = AESGCM(data_key).decrypt(b64decode(s["nonce"]), b64decode(s["ciphertext"]), aad)
    except (InvalidTag, ValueError) as exc:
        raise SealError(f"a record of memory {rec.get('memoryId')!r} does not open with key "
                        f"{s['keyId']!r}") from exc
    plain = json.loads(body)
    return {**rec, **{f: plain.get(f, d) for f, d in fields.items()}, "sealed": None}


def seal(ev: Mapping[str, Any], key_id: str, data_key: bytes, nonce: bytes) -> dict[str, Any]:
    """The memory event with its text fields encrypted into `sealed` and emptied in the clear."""
    return _seal(ev, SEALED_FIELDS, _aad(ev), key_id, data_key, nonce)


def open_sealed(ev: Mapping[str, Any], data_key: bytes) -> dict[str, Any]:
    """The memory event with its sealed fields back in the clear."""
    return _open(ev, SEALED_FIELDS, _aad(ev), data_key)


def seal_item(item: Mapping[str, Any], key_id: str, data_key: bytes,
              nonce: bytes) -> dict[str, Any]:
    """A packet item with its text and digest sealed with its owner's key."""
    return _seal(item, ITEM_FIELDS, _item_aad(item), key_id, data_key, nonce)


def open_item(item: Mapping[str, Any], data_key: bytes) -> dict[str, Any]:
    return _open(item, ITEM_FIELDS, _item_aad(item), data_key)


def sealable(ev: Mapping[str, Any]) -> bool:
    """Everything but a forget, which must stay readable after the key is gone."""
    return ev["op"] != FORGET_OP and not ev.get("sealed")
