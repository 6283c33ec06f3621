"""The Candidate every recall tier returns, and the scope chain that decides what is visible."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any


@dataclass(frozen=True)
class LoggedMemory:
    """What every view of a memory carries (the fold's MemoryRecord, recall's Candidate): its
    id, kind and text, who may see it (scope, owner), and where the memory-log placed it."""

    memory_id: str
    kind: str  # segment | episode | fact | procedure
    text: str
    scope: str
    owner: str
    session_id: str
    event_seq: int
    event_time: int


@dataclass(frozen=True)
class Candidate(LoggedMemory):
    provenance: str
    digest: str
    semantic_key: str
    relevance: float
    confidence: float = 0.5
    salience: float = 0.0
    frequency: int = 0
    revoked: bool = False
    expires_at: int | None = None
    risk_level: str | None = None
    tiers: tuple[str, ...] = ()
    tier_scores: tuple[tuple[str, float], ...] = ()  # each tier's own score, before fusion
    follows: str | None = None  # memory id of the turn this segment answers (same session)

    def with_tier(self, tier: str, relevance: float | None = None,
                  score: float | None = None) -> Candidate:
        tiers = self.tiers if tier in self.tiers else (*self.tiers, tier)
        scores = self.tier_scores
        if score is not None and tier not in dict(scores):
            scores = (*scores, (tier, score))
        return replace(self, tiers=tiers, tier_scores=scores,
                       relevance=self.relevance if relevance is None else relevance)


def scope_chain(request: dict[str, Any]) -> frozenset[tuple[str, str]]:
    """(scope, owner) pairs a request may see: its session, its workspace, its user."""
    chain = {("Session", request["sessionId"]), ("User", request["userId"]),
             ("External", request["userId"])}
    if request.get("workspaceId"):
        chain.add(("Workspace", request["workspaceId"]))
    return frozenset(chain)
