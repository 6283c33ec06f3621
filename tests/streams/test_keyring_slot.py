"""A keyring slot makes its keyring once, on first use, and stops only a keyring it made: a
lent one belongs to its caller."""

from __future__ import annotations

from pathlib import Path

import pytest

from mnemoflow.streams.keyring import Keyring
from mnemoflow.streams.keyring_slot import KeyringSlot

from support import isolated_settings


@pytest.fixture
def stopped(monkeypatch: pytest.MonkeyPatch) -> list[Keyring]:
    seen: list[Keyring] = []

    async def stop(self: Keyring) -> None:
        seen.append(self)

    monkeypatch.setattr(Keyring, "stop", stop)
    return seen


async def test_a_made_keyring_is_made_once_and_stopped(tmp_path: Path,
                                                       stopped: list[Keyring]) -> None:
    slot = KeyringSlot(isolated_settings(tmp_path, "slot"), "127.0.0.1:1")
    await slot.stop()  # nothing made yet: nothing to stop
    assert stopped == []
    ring = slot.get()
    assert slot.get() is ring
    await slot.stop()
    assert stopped == [ring]


async def test_a_lent_keyring_is_handed_out_and_left_running(tmp_path: Path,
                                                            stopped: list[Keyring]) -> None:
    s = isolated_settings(tmp_path, "slot")
    lent = Keyring(s, "127.0.0.1:1")
    slot = KeyringSlot(s, "127.0.0.1:1", lent)
    assert slot.get() is lent
    await slot.stop()
    assert stopped == []
