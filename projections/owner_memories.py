"""One owner's memories as an operator sees them (`mnemoflow memories list|show`).

The owner's memory-log events are folded by the same `MemoryStore` the worker folds, so what
is listed as recallable is what recall can find, and a memory's status (revoked, disputed, in
a conflict, a candidate) is the store's own. Pure: the CLI reads the topics and passes the
events in.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from mnemoflow.agents import facts as F
from mnemoflow.projections.memory_store import MemoryStore

Row = dict[str, Any]


@dataclass
class OwnerMemories:
    owner: str
    store: MemoryStore = field(default_factory=MemoryStore)
    history: dict[str, list[Row]] = field(default_factory=dict)  # memory id -> its events

    def status(self, memory_id: str) -> str:
        """recallable | revoked | disputed | conflict | candidate | <a procedure's stage>."""
        proc = self.store.procedures.get(memory_id)
        if proc is not None:
            return proc.stage
        rec = self.store.records.get(memory_id)
        if rec is None:
            return "unknown"
        if rec.revoked:
            return "revoked"
        if rec.disputed:
            return "disputed"
        if memory_id in self.store.fact_candidates:
            return "candidate"
        if self._in_open_conflict(memory_id):
            return "conflict"
        return "recallable" if self.store.recallable(memory_id) else "hidden"

    def conflict(self, memory_id: str) -> tuple[F.FactKey, F.Sides] | None:
        """The conflict set that holds the memory (the store's own lookup), if any."""
        key = F.conflict_of(self.store.conflicts, memory_id)
        return None if key is None else (key, self.store.conflicts[key])

    def _in_open_conflict(self, memory_id: str) -> bool:
        """In a conflict set where another side is still live: nobody has settled it."""
        found = self.conflict(memory_id)
        return found is not None and any(
            (r := self.store.records.get(s["memoryId"])) is not None and not r.revoked
            for s in found[1] if s["memoryId"] != memory_id)

    def rows(self, everything: bool = False) -> list[Row]:
        """A line per memory, procedures included (the store keeps a record of each), newest
        first; revoked memories and deprecated procedures only with `everything`."""
        out: list[Row] = []
        for mid, rec in self.store.records.items():
            status = self.status(mid)
            if status in ("revoked", "deprecated") and not everything:
                continue
            out.append({"memoryId": mid, "kind": rec.kind, "scope": rec.scope, "status": status,
                        "source": rec.source, "eventTime": rec.event_time, "text": rec.text})
        return sorted(out, key=lambda r: (-r["eventTime"], r["memoryId"]))

    def detail(self, memory_id: str) -> Row | None:
        """One memory: its fields, status, conflict set and every event that touched it."""
        rec = self.store.records.get(memory_id)
        proc = self.store.procedures.get(memory_id)
        if rec is None and proc is None:
            return None
        out: Row = {"memoryId": memory_id, "owner": self.owner, "status": self.status(memory_id),
                    "history": [_event_line(e) for e in self.history.get(memory_id, ())]}
        if rec is not None:
            out.update(kind=rec.kind, scope=rec.scope, text=rec.text, source=rec.source,
                       eventTime=rec.event_time, sessionId=rec.session_id,
                       provenance=list(rec.provenance), confidence=rec.confidence)
            stated = [e for e in self.history.get(memory_id, ()) if e.get("subject")]
            if stated:
                out.update({k: stated[-1].get(k) for k in ("subject", "predicate", "object")})
            found = self.conflict(memory_id)
            if found is not None:
                out["conflict"] = {"slot": list(found[0]), "sides": [dict(s) for s in found[1]]}
        if proc is not None:
            out.update(kind="procedure", scope=proc.scope, text=proc.intent,
                       steps=list(proc.steps), risk=proc.risk_level,
                       requiresApproval=proc.requires_approval, approved=proc.approved)
        return out


def _event_line(ev: Row) -> Row:
    attrs = ev.get("attributes") or {}
    return {"eventTime": ev["eventTime"], "op": ev["op"], "source": ev.get("source", "user"),
            "reason": attrs.get("reason", ""), "actor": attrs.get("actor", ""),
            "eventId": ev["eventId"]}


def fold_owner(events: Iterable[Row], owner: str) -> OwnerMemories:
    """Fold the events of `owner` (others are passed over), in the order given (log order)."""
    view = OwnerMemories(owner)
    for ev in events:
        if ev.get("owner") != owner:
            continue
        view.store.apply(ev)
        view.history.setdefault(ev["memoryId"], []).append(ev)
    return view
