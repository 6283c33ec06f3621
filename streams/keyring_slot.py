"""Where a reader, a producer or a command gets its keyring: the one its caller lent it, or
one it makes on first use. Only a keyring made here is stopped here; a lent one belongs to
the caller, who may still be using it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mnemoflow.schemas.codec import SchemaRegistry
from mnemoflow.streams.config import Settings

if TYPE_CHECKING:
    from mnemoflow.streams.keyring import Keyring


class KeyringSlot:
    def __init__(self, settings: Settings, bootstrap: str, lent: Keyring | None = None,
                 registry: SchemaRegistry | None = None) -> None:
        self.settings, self.bootstrap, self.registry = settings, bootstrap, registry
        self._keyring, self._made = lent, False

    def get(self) -> Keyring:
        if self._keyring is None:
            # imported here: the keyring reads and writes through streams.reader and
            # streams.producer, which hold a slot
            from mnemoflow.streams.keyring import Keyring

            self._keyring = Keyring(self.settings, self.bootstrap, self.registry)
            self._made = True
        return self._keyring

    async def stop(self) -> None:
        """Stop the keyring if it was made here (a lent one is left running)."""
        if self._made and self._keyring is not None:
            await self._keyring.stop()
