"""M-03 facts and G-01 evidence: pure rules over MemoryRecords, which the store folds with.

A fact with a subject and a predicate fills a slot per (owner, subject, predicate): the value in
force and, once two values met, a conflict set that keeps every side with its provenance.

* User-stated beats inferred: an inference never overwrites a user's or the host's value (its
  side is kept as rejected-inference).
* An explicit correction, or a person's statement against an inference, supersedes the value in
  force, which is revoked.
* Two user statements that disagree both stay, the later one marked open, until one of them is
  confirmed (`fact_confirmed` revokes the other sides) or revoked.
* A consolidation guess (status candidate) is kept and listed, never recalled until confirmed.
* A user's dispute (`fact_conflicted`) adds a side, weakens the memory and hides it until it
  is confirmed.

Evidence: a tool outcome after a delivery is weak, correlational evidence, so it moves
confidence a little and never to certainty; a failure weighs twice a success (an amplified
wrong memory costs more than a missed right one).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, TypedDict

from mnemoflow.agents.memory_record import PEOPLE, MemoryRecord, record_of
from mnemoflow.agents.revocation import Revoke

REINFORCE_STEP = 0.05
WEAKEN_STEP = 0.1
CONFIDENCE_FLOOR = 0.05
CONFIDENCE_CEIL = 0.95
EVIDENCE_KEPT = 32

FactKey = tuple[str, str, str]  # (owner, subject, predicate)


class Side(TypedDict, total=False):
    """One value of a conflict set. The value first in force has no status; the others are
    rejected-inference, superseded-previous, open, disputed, or dismissed."""

    memoryId: str  # the fact; for a dispute, the dispute event
    object: str | None
    source: str
    provenance: list[str]
    status: str


Sides = tuple[Side, ...]


@dataclass(frozen=True)
class Upsert:
    """What one fact event does; the store carries it out in field order."""

    sides: Sides | None = None  # the slot's conflict set after the event (None: unchanged)
    revoke: Revoke | None = None  # the value in force before, superseded
    active: str | None = None  # the fact now in force for the slot
    record: MemoryRecord | None = None  # the record to write
    reindex: bool = True  # False: a restatement, same text; only provenance and frequency grow


def fact_key(ev: Mapping[str, Any]) -> FactKey | None:
    """The slot a fact event fills; None for a free note, which has no value to conflict with."""
    if not ev.get("subject") and not ev.get("predicate"):
        return None
    return (ev["owner"], ev["subject"] or "", ev["predicate"] or "")


def restated(rec: MemoryRecord, provenance: Iterable[str]) -> MemoryRecord:
    """The same memory stated again: its provenance grows, and so does how often it was said."""
    return replace(rec, provenance=tuple(dict.fromkeys((*rec.provenance, *provenance))),
                   frequency=rec.frequency + 1)


def side_of(rec: MemoryRecord) -> Side:
    return Side(memoryId=rec.memory_id, object=rec.text, source=rec.source,
                provenance=list(rec.provenance))


def with_side(sides: Sides | None, rec: MemoryRecord, side: Side) -> Sides:
    """`side` added to a slot's conflict set; a slot's first conflict opens it with `rec`."""
    return (*(sides if sides is not None else (side_of(rec),)), side)


def upsert(ev: Mapping[str, Any], cur: MemoryRecord | None, sides: Sides | None) -> Upsert:
    """A fact event (`fact_proposed`, `fact_upserted`) with a slot (see `fact_key`), against
    `cur`, the value in force for the slot, and `sides`, the slot's conflict set."""
    new = record_of(ev)
    if cur is not None and not cur.revoked and cur.memory_id == new.memory_id:
        return Upsert(record=restated(cur, new.provenance), reindex=False)
    if cur is None or cur.revoked:
        return Upsert(active=new.memory_id, record=new)
    side = Side(memoryId=new.memory_id, object=ev["object"], source=new.source,
                provenance=list(new.provenance))
    if new.source == "inference" and cur.source in PEOPLE:
        return Upsert(sides=with_side(sides, cur, Side(**side, status="rejected-inference")))
    if new.attributes.get("correction") == "1" or (
            new.source in PEOPLE and cur.source == "inference"):
        return Upsert(sides=with_side(sides, cur, Side(**side, status="superseded-previous")),
                      revoke=Revoke(cur.memory_id, f"superseded by {new.memory_id}"),
                      active=new.memory_id, record=new)
    return Upsert(sides=with_side(sides, cur, Side(**side, status="open")),
                  record=replace(new, attributes={**new.attributes, "conflict": "open"}))


# ------------------------------------------------------------------------- confirmation


def accepted(candidate: Mapping[str, Any]) -> dict[str, Any]:
    """A confirmed candidate's event, to be folded as a fact like any other."""
    return {**candidate, "attributes": {**candidate["attributes"], "status": "confirmed"}}


def vouched(ev: Mapping[str, Any]) -> bool:
    """A person confirmed it: the fact now stands on its own, whatever it was derived from."""
    return ev.get("source") in PEOPLE


def undisputed(rec: MemoryRecord) -> MemoryRecord:
    return replace(rec, disputed=False,
                   attributes={k: v for k, v in rec.attributes.items() if k != "conflict"})


def conflict_of(conflicts: Mapping[FactKey, Sides], mid: str) -> FactKey | None:
    """The first conflict set, in the order they opened, that holds `mid`."""
    return next((k for k, sides in conflicts.items() if any(s["memoryId"] == mid for s in sides)),
                None)


def settle(sides: Sides, mid: str) -> tuple[Sides, list[Revoke]]:
    """Confirming `mid` settles its conflict set: every other side is revoked, and a dispute
    side of `mid` itself is dismissed."""
    losers = [Revoke(s["memoryId"], f"conflict resolved for {mid}")
              for s in sides if s["memoryId"] != mid]
    kept = tuple(Side(**{**s, "status": "dismissed"})
                 if s["memoryId"] == mid and s.get("status") == "disputed" else s for s in sides)
    return kept, losers


# ------------------------------------------------------------------------- disputes (G-01)


def dispute_key(rec: MemoryRecord) -> FactKey:
    """The conflict set a dispute joins: the fact's slot, or the memory's own."""
    attrs = rec.attributes
    return (rec.owner, attrs.get("subject") or rec.memory_id, attrs.get("predicate") or "")


def dispute_side(ev: Mapping[str, Any]) -> Side:
    """The correction, with its own provenance, as a side of the disputed memory's set."""
    return Side(memoryId=ev["eventId"], object=ev.get("text") or "",
                source=ev.get("source", "user"), provenance=list(ev.get("provenance") or ()),
                status="disputed")


def disputed(rec: MemoryRecord) -> MemoryRecord:
    return replace(rec, disputed=True, confidence=weakened(rec.confidence),
                   attributes={**rec.attributes, "conflict": "disputed"})


# ------------------------------------------------------------------------- evidence (G-01)


def reinforced(confidence: float) -> float:
    return max(confidence, min(CONFIDENCE_CEIL, confidence + REINFORCE_STEP))


def weakened(confidence: float) -> float:
    return min(confidence, max(CONFIDENCE_FLOOR, confidence - WEAKEN_STEP))


def with_evidence(rec: MemoryRecord, ev: Mapping[str, Any], *, procedure: bool) -> MemoryRecord:
    """An `evidence_reinforce` / `evidence_weaken` event on the record's trail. A procedure's
    confidence is its evidence's success share and its frequency counts its runs (both come
    from the procedure itself), so for one only the trail moves."""
    up = ev["op"] == "evidence_reinforce"
    trail = (*rec.evidence, ("+" if up else "-") + ev["eventId"])[-EVIDENCE_KEPT:]
    if procedure:
        return replace(rec, evidence=trail)
    return replace(rec, confidence=reinforced(rec.confidence) if up else weakened(rec.confidence),
                   frequency=rec.frequency + 1, evidence=trail)
