"""Forget an owner (G-02's erasure): `owner_forgotten` on both memory topics, then the owner's
keys shredded on memory-keys, then this machine's audit store made again without them.

The order matters only for a crash halfway: the event first, so that every worker drops the
owner's projections even if the shredding has to be run again; running the whole forget
again is harmless (the event lands on the same id for the same time, and shredding what is
shredded already does nothing).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from mnemoflow.agents import memory_events as M
from mnemoflow.streams.config import Settings
from mnemoflow.streams.keyring import Keyring
from mnemoflow.streams.keyring_slot import KeyringSlot


@dataclass
class Forgotten:
    owner: str
    events: list[dict[str, Any]] = field(default_factory=list)
    shredded: list[str] = field(default_factory=list)
    audit_store_rebuilt: bool = False

    def summary(self) -> str:
        return (f"{self.owner} forgotten: {len(self.events)} owner_forgotten events, "
                f"{len(self.shredded)} keys shredded"
                + ("; the audit store was made again" if self.audit_store_rebuilt else ""))


async def forget_owner(settings: Settings, bootstrap: str, owner: str, reason: str, actor: str,
                       now_ms: int | None = None, host: Any = None,
                       keyring: Keyring | None = None) -> Forgotten:
    """`host`: a started HostClient to append with (one is made otherwise); `keyring`: the
    caller's (one is made otherwise)."""
    from mnemoflow.streams.host import HostClient

    t = int(time.time() * 1000) if now_ms is None else now_ms
    out = Forgotten(owner, [M.as_operator(M.owner_forget(owner, t, scope=scope), reason, actor)
                            for scope in ("User", "Workspace")])
    if host is None:
        async with HostClient(settings, bootstrap) as own:
            for ev in out.events:
                await own.append_memory(ev)
    else:
        for ev in out.events:
            await host.append_memory(ev)
    if settings.seal:
        slot = KeyringSlot(settings, bootstrap, keyring)
        try:
            out.shredded = await slot.get().shred(owner)
        finally:
            await slot.stop()
    out.audit_store_rebuilt = await _rebuild_audit_store(settings, bootstrap)
    return out


async def _rebuild_audit_store(settings: Settings, bootstrap: str) -> bool:
    """The audit store holds memory text (its candidates'): a file made anew from the topics,
    where the owner's records no longer open, holds none of the owner's. A store that was
    never made is left alone; one held by a running console is made again by that console."""
    from mnemoflow.projections.audit_store import StoreBusy
    from mnemoflow.streams.audit_sync import open_store, store_path, sync

    if not store_path(settings).exists():
        return False
    try:
        store = open_store(settings)
    except StoreBusy:
        return False
    try:
        await sync(store, settings, bootstrap, rebuild=True)
    finally:
        store.close()
    return True
