"""A memory as the fold of its memory-log events leaves it, and whether recall may return it.

The fold rules (agents.facts, agents.revocation, agents.procedure_fold) read and return these
values; projections.memory_store keeps them by memory id and indexes them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mnemoflow.agents.candidate import Candidate, LoggedMemory
from mnemoflow.agents.text import digest, semantic_key

if TYPE_CHECKING:  # procedures imports episodes, which reads MemoryRecords
    from mnemoflow.agents.procedures import Procedure

# sources that speak for a person, never an inference (an operator acts for the user)
PEOPLE = frozenset({"user", "host", "operator"})


@dataclass(frozen=True)
class MemoryRecord(LoggedMemory):
    provenance: tuple[str, ...]
    entities: tuple[str, ...]
    digest: str
    semantic_key: str
    confidence: float = 0.5
    source: str = "user"
    revoked: bool = False
    ttl_ms: int | None = None
    risk_level: str | None = None
    frequency: int = 0
    attributes: dict[str, str] = field(default_factory=dict)
    disputed: bool = False  # a user said it is wrong: kept in the conflict set, not recalled
    evidence: tuple[str, ...] = ()  # G-01 outcome events, "+eventId" / "-eventId", newest last

    @property
    def expires_at(self) -> int | None:
        return None if self.ttl_ms is None else self.event_time + self.ttl_ms

    def candidate(self, relevance: float, follows: str | None = None) -> Candidate:
        return Candidate(
            memory_id=self.memory_id, kind=self.kind, text=self.text, scope=self.scope,
            owner=self.owner, session_id=self.session_id, event_seq=self.event_seq,
            event_time=self.event_time, provenance=",".join(self.provenance),
            digest=self.digest, semantic_key=self.semantic_key, relevance=relevance,
            confidence=self.confidence, salience=float(self.attributes.get("salience", 0) or 0),
            frequency=self.frequency, revoked=self.revoked, expires_at=self.expires_at,
            risk_level=self.risk_level, follows=follows)


@dataclass(frozen=True)
class AliasRecord:
    alias: str
    target: str
    scope: str
    owner: str
    revoked: bool = False


def record_of(ev: Mapping[str, Any]) -> MemoryRecord:
    """The record one memory event describes; a fact's subject, predicate and object become
    attributes."""
    text = ev.get("text") or ""
    return MemoryRecord(
        memory_id=ev["memoryId"], kind=ev["kind"], text=text, scope=ev["scope"],
        owner=ev["owner"], session_id=ev["sessionId"], event_seq=ev["eventSeq"],
        event_time=ev["eventTime"], provenance=tuple(ev.get("provenance") or ()),
        entities=tuple(ev.get("entities") or ()), digest=digest(text),
        semantic_key=semantic_key(text), confidence=float(ev.get("confidence", 0.5)),
        source=ev.get("source", "user"), ttl_ms=ev.get("ttlMs"), risk_level=ev.get("riskLevel"),
        attributes={**(ev.get("attributes") or {}),
                    **{k: ev[k] for k in ("subject", "predicate", "object") if ev.get(k)}})


def is_candidate(attributes: Mapping[str, str] | None) -> bool:
    """A fact consolidation guessed: listed, never recalled until someone confirms it."""
    return (attributes or {}).get("status") == "candidate"


def recallable(rec: MemoryRecord | None, procedure: Procedure | None) -> bool:
    """A live record that no user has disputed; of procedures only the validated and active
    stages; never a fact candidate. `procedure` is the record's procedure, if it is one."""
    if rec is None or rec.revoked or rec.disputed:
        return False
    if rec.kind == "procedure":
        return procedure is not None and procedure.recallable
    return not (rec.kind == "fact" and is_candidate(rec.attributes))
