"""Memory off and on, for a user or for one of the user's sessions (G-02's "disable").

An operator's switch is a memory-log event (`memory_disabled` / `memory_enabled`, source
operator) keyed by the user, so it lives in the partition that holds the user's memories and
that the user's recall requests run on. A switch holds from its event time until the next
switch of the same key: a request or a memory is judged by its own event time, so a replay
judges every record as its first pass did. Memory is off when the user's switch or the
session's switch says so. Pure.
"""

from __future__ import annotations

from bisect import insort
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

CONTROL_OPS = frozenset({"memory_disabled", "memory_enabled"})
# what a switched-off user may not add: every op that creates a memory (removing one,
# a revoke, a user's correction, still works)
WRITE_OPS = frozenset({"segment_recorded", "episode_recorded", "fact_proposed", "fact_upserted",
                       "procedure_observed", "alias_added", "link_added"})
SWITCHED_SCOPES = frozenset({"User", "External"})  # the scopes whose owner is the user

Key = tuple[str, str]  # (user, session id or "" for the whole user)


def switch_key(ev: Mapping[str, Any]) -> Key:
    return str(ev["owner"]), str((ev.get("attributes") or {}).get("session", ""))


@dataclass
class Controls:
    """Every switch folded so far, by key, in (event time, event id) order."""

    switches: dict[Key, list[tuple[int, str, bool]]] = field(default_factory=dict)

    def apply(self, ev: Mapping[str, Any]) -> None:
        entry = (int(ev["eventTime"]), str(ev["eventId"]), ev["op"] == "memory_disabled")
        at = self.switches.setdefault(switch_key(ev), [])
        if entry not in at:
            insort(at, entry)

    def forget(self, user: str) -> None:
        """The user is forgotten: their switches go with the rest."""
        for key in [k for k in self.switches if k[0] == user]:
            del self.switches[key]

    def _off(self, key: Key, t: int) -> bool:
        off = False
        for when, _, is_off in self.switches.get(key, ()):
            if when > t:
                break
            off = is_off
        return off

    def off(self, user: str, session: str, t: int) -> bool:
        """Is memory off for this user's session at event time `t`?"""
        return self._off((user, ""), t) or bool(session and self._off((user, session), t))

    def drops(self, ev: Mapping[str, Any]) -> bool:
        """A memory written while its owner's memory was off: never stored."""
        return (ev["op"] in WRITE_OPS and ev["scope"] in SWITCHED_SCOPES
                and self.off(str(ev["owner"]), str(ev.get("sessionId") or ""),
                             int(ev["eventTime"])))

    def state(self, user: str) -> list[dict[str, Any]]:
        """The user's switches, for an operator: key, time, on or off."""
        return [{"session": s, "eventTime": t, "memory": "off" if off else "on"}
                for (u, s), at in sorted(self.switches.items()) if u == user
                for t, _, off in at]
