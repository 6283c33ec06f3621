"""Sealing memory events with per-owner keys, and the fold of memory-keys (agents/sealing.py)."""

from __future__ import annotations

import os

import pytest

from mnemoflow.agents import sealing
from mnemoflow.agents.memory_events import memory_event

KEK = bytes(range(32))


def _event(text: str = "my locker code is 4711", owner: str = "u1") -> dict:
    return memory_event(event_id="e1", op="segment_recorded", memory_id="m1", kind="segment",
                        scope="User", owner=owner, event_time=1, text=text,
                        entities=["locker"], subject="locker", predicate="code", object_="4711",
                        attributes={"status": "active"})


def _proposal(keys: sealing.OwnerKeys, offset: int, owner: str, pid: str) -> str:
    rk, value = sealing.key_proposal(KEK, owner, keys.epoch(owner), pid, os.urandom(32),
                                     os.urandom(12), 0)
    keys.apply(offset, rk, value)
    return rk


def test_a_sealed_event_holds_none_of_its_text_and_opens_to_the_original() -> None:
    ev, key = _event(), os.urandom(32)
    sealed = sealing.seal(ev, "0:p:u1", key, os.urandom(12))
    assert sealed["text"] == "" and sealed["entities"] == [] and sealed["attributes"] == {}
    assert sealed["subject"] is sealed["object"] is None
    assert "4711" not in sealed["sealed"]["ciphertext"]
    assert sealing.open_sealed(sealed, key) == {**ev, "sealed": None}


def test_a_sealed_event_opens_only_with_its_key_and_only_as_itself() -> None:
    key = os.urandom(32)
    sealed = sealing.seal(_event(), "0:p:u1", key, os.urandom(12))
    with pytest.raises(sealing.SealError):
        sealing.open_sealed(sealed, os.urandom(32))
    moved = {**sealed, "owner": "u2"}  # the ciphertext put on another owner's record
    with pytest.raises(sealing.SealError):
        sealing.open_sealed(moved, key)


def test_a_forget_is_never_sealed() -> None:
    forget = {**_event(""), "op": sealing.FORGET_OP}
    assert not sealing.sealable(forget) and sealing.sealable(_event())


def test_a_wrapped_key_unwraps_only_under_its_kek_and_record_key() -> None:
    data_key = os.urandom(32)
    wrapped = sealing.wrap(KEK, "0:p:u1", data_key, os.urandom(12))
    assert sealing.unwrap(KEK, "0:p:u1", wrapped) == data_key
    with pytest.raises(sealing.SealError):
        sealing.unwrap(os.urandom(32), "0:p:u1", wrapped)
    with pytest.raises(sealing.SealError):
        sealing.unwrap(KEK, "0:p:u2", wrapped)


def test_the_first_proposal_on_the_topic_is_the_owners_key() -> None:
    keys = sealing.OwnerKeys()
    first = _proposal(keys, 3, "u1", "a")
    _proposal(keys, 5, "u1", "b")
    _proposal(keys, 4, "u2", "c")
    assert keys.current("u1")[0] == first  # type: ignore[index]
    assert keys.current("nobody") is None


def test_a_forget_ends_the_epoch_and_shreds_every_key_of_the_owner() -> None:
    keys = sealing.OwnerKeys()
    old = [_proposal(keys, 0, "u1", "a"), _proposal(keys, 1, "u1", "b")]
    other = _proposal(keys, 2, "u2", "c")
    rk, end = sealing.epoch_end("u1", keys.epoch("u1"), KEK, 0)
    keys.apply(3, rk, end)
    # a proposal of the ended epoch, made before the writer saw the end, is never the key
    late = sealing.key_record_key("u1", 0, "late")
    keys.apply(4, late, {**keys.keys[old[0]][1], "proposalId": "late"})
    assert keys.epoch("u1") == 1 and keys.current("u1") is None
    assert keys.of_owner("u1") == sorted([*old, late])
    for i, k in enumerate(keys.of_owner("u1")):
        keys.apply(5 + i, k, None)
    assert keys.of_owner("u1") == [] and set(old) <= keys.shredded
    assert keys.current("u2")[0] == other  # type: ignore[index]
    new = _proposal(keys, 9, "u1", "d")  # the owner comes back: a key of the next epoch
    assert new.startswith("1:") and keys.current("u1")[0] == new  # type: ignore[index]


def test_a_tombstone_of_a_key_never_seen_still_counts_as_shredded() -> None:
    keys = sealing.OwnerKeys()  # the key record itself was compacted away
    keys.apply(7, "0:a:u1", None)
    assert "0:a:u1" in keys.shredded and keys.position == 8
