"""M-03 revocation and its cascade: what a revocation hides, planned over the provenance graph.

A revoked memory is never recalled again, and neither is what was derived only from revoked
memories: a fact or alias extracted from a revoked segment goes too, unless it has other live
provenance (another segment, a host write, a person's confirmation: it is then `anchored`); a
procedure loses the runs built on revoked episodes and is deprecated when no live run is left.

`plan` walks the graph depth first, in memory-id order, and returns the steps; the store carries
them out in that order (records, indexes, the revocation list the vector sink follows).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, replace
from typing import Any, Protocol

from mnemoflow.agents import procedures as P
from mnemoflow.agents.ids import stable_id
from mnemoflow.agents.memory_events import parse_list
from mnemoflow.agents.memory_record import AliasRecord, MemoryRecord

SOURCES_REVOKED = "cascade:sources-revoked"  # a memory whose sources were revoked before it came


@dataclass(frozen=True)
class Revoke:
    memory_id: str
    reason: str  # becomes the record's `revokedBy`


@dataclass(frozen=True)
class DropAlias:
    alias_id: str


@dataclass(frozen=True)
class PutProcedure:
    procedure: P.Procedure  # with the revoked runs marked, deprecated if none is left


Step = Revoke | DropAlias | PutProcedure


class Ledger(Protocol):
    """What the cascade reads (MemoryStore has it): the memories, and the provenance graph."""

    @property
    def records(self) -> Mapping[str, MemoryRecord]: ...

    @property
    def aliases(self) -> Mapping[str, AliasRecord]: ...

    @property
    def procedures(self) -> Mapping[str, P.Procedure]: ...

    @property
    def sources(self) -> Mapping[str, AbstractSet[str]]: ...  # derived id -> the ids it came from

    @property
    def derived(self) -> Mapping[str, AbstractSet[str]]: ...  # source id -> ids derived from it

    @property
    def anchored(self) -> AbstractSet[str]: ...  # derived ids that also stand on their own


def sources_of(ev: Mapping[str, Any]) -> tuple[str, ...] | None:
    """The memories an event was derived from, or None when it stands on its own (a host
    write, a user fact from before extraction named its segment)."""
    attrs = ev.get("attributes") or {}
    if attrs.get("sources"):
        return parse_list(attrs["sources"])
    if ev["kind"] == "fact" and attrs.get("rule") and ev.get("source") != "host":
        # extracted before facts named their segment: the segment id is derived the same way
        return (stable_id("seg", ev["sessionId"], "session-events", ev["eventSeq"]),)
    return None


def is_revoked(view: Ledger, mid: str) -> bool:
    rec = view.records.get(mid)
    if rec is not None:
        return rec.revoked
    al = view.aliases.get(mid)
    return al is not None and al.revoked


def orphaned(view: Ledger, mid: str, revoked: Callable[[str], bool] | None = None) -> bool:
    """Derived only from memories that are all revoked (and not written on its own)."""
    gone = revoked or (lambda m: is_revoked(view, m))
    srcs = view.sources.get(mid)
    return mid not in view.anchored and bool(srcs) and all(gone(s) for s in srcs)


def revoked_record(rec: MemoryRecord, reason: str) -> MemoryRecord:
    return replace(rec, revoked=True, attributes={**rec.attributes, "revokedBy": reason})


def plan(view: Ledger, mid: str, reason: str, now: int) -> list[Step]:
    """Revoke `mid`, then what was derived from it and has no other live provenance, at event
    time `now`. The walk goes on through memories revoked before: their steps change nothing
    that is already done."""
    steps: list[Step] = []
    changed: dict[str, bool] = {}  # revoked state as the steps planned so far leave it
    procs: dict[str, P.Procedure] = {}

    def gone(m: str) -> bool:
        return changed[m] if m in changed else is_revoked(view, m)

    def revoke(m: str, why: str) -> None:
        steps.append(Revoke(m, why))
        if m in view.records:
            changed[m] = True
        for dep in sorted(view.derived.get(m, ())):
            if dep in view.procedures:
                p = P.revoke_sources(procs.get(dep, view.procedures[dep]), m)
                if not P.has_live_runs(p):
                    p = P.deprecate(p, "", now, f"cascade:{m}")
                procs[dep] = p
                changed[dep] = p.stage == "deprecated"
                steps.append(PutProcedure(p))
            elif orphaned(view, dep, gone):
                if dep in view.aliases:
                    steps.append(DropAlias(dep))
                    if dep not in view.records:
                        changed[dep] = True
                else:
                    revoke(dep, f"cascade:{m}")

    revoke(mid, reason)
    return steps
