"""C-04 recall: lexical/entity tier first (always there), then pluggable vector+time and graph tiers.

Each optional tier runs behind a timeout; an error or timeout is recorded and the lexical
answer stands (G-05). The result says which tiers answered, for the audit.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from mnemoflow.agents.candidate import Candidate


class RecallTier(Protocol):
    """A source of candidates. `search` must only return memories in the request's scope chain.

    A tier whose search reads `seeds` (the earlier tiers' hits) says so with a true
    `uses_seeds` attribute; tiers without it may run side by side."""

    name: str

    async def search(self, request: dict[str, Any], k: int,
                     seeds: Sequence[Candidate]) -> list[Candidate]: ...


@dataclass(frozen=True)
class TierSpec:
    tier: RecallTier
    timeout_s: float = 3.0
    only_when_fewer_than: int | None = None  # graph expansion runs only when hits are few
    weight: float = 1.0  # its share in the rank fusion


@dataclass(frozen=True)
class RecallResult:
    candidates: tuple[Candidate, ...]
    tiers: dict[str, str] = field(default_factory=dict)  # name -> ok | error | timeout | skipped

    @property
    def failed(self) -> bool:
        """Every tier that ran failed: no packet may come of it (invariant 2)."""
        ran = [s for s in self.tiers.values() if s != "skipped"]
        return bool(ran) and all(s in ("error", "timeout") for s in ran)


RRF_K = 60


def merge(found: dict[str, Candidate], new: Sequence[Candidate], tier: str,
          weight: float = 1.0) -> None:
    """Reciprocal-rank fusion: tiers score on different scales (BM25, cosine, PageRank),
    so each contributes weight / (60 + rank) and a memory found by several tiers adds up.
    Each tier's own score is kept on the candidate, so rank can fuse by score instead."""
    ordered = sorted(new, key=lambda c: (-c.relevance, c.memory_id))
    for rank, c in enumerate(ordered, start=1):
        gain = weight / (RRF_K + rank)
        old = found.get(c.memory_id)
        if old is None:
            found[c.memory_id] = c.with_tier(tier, gain, c.relevance)
        else:
            found[c.memory_id] = old.with_tier(tier, old.relevance + gain, c.relevance)


async def recall(request: dict[str, Any], tiers: Sequence[TierSpec], k: int) -> RecallResult:
    """Run the tiers; later tiers see the earlier hits as seeds.

    Leading tiers that need no seeds (lexical, vector) run side by side: the vector tier's
    embedding and LanceDB query run off the loop while the lexical tier scores on it. Their
    hits are merged in tier order afterwards, so the result is the same as one after another.
    """
    found: dict[str, Candidate] = {}
    status: dict[str, str] = {}
    free = 0  # how many leading tiers are independent of the others' hits
    while free < len(tiers) and _independent(tiers[free]):
        free += 1
    if free > 1:
        # started last first: off-loop tiers begin their I/O before an on-loop tier runs
        tasks = {i: asyncio.ensure_future(_run(tiers[i], request, k, ()))
                 for i in reversed(range(free))}
        done = [await tasks[i] for i in range(free)]
    else:
        done = []
    for i, spec in enumerate(tiers):
        name = spec.tier.name
        if i < len(done):
            outcome = done[i]
        elif spec.only_when_fewer_than is not None and len(found) >= spec.only_when_fewer_than:
            status[name] = "skipped"
            continue
        else:
            outcome = await _run(spec, request, k, tuple(found.values()))
        if isinstance(outcome, str):
            status[name] = outcome
            continue
        merge(found, outcome, name, spec.weight)
        status[name] = "ok"
    ordered = sorted(found.values(), key=lambda c: (-c.relevance, c.memory_id))
    return RecallResult(tuple(ordered), status)


def _independent(spec: TierSpec) -> bool:
    return spec.only_when_fewer_than is None and not getattr(spec.tier, "uses_seeds", False)


async def _run(spec: TierSpec, request: dict[str, Any], k: int,
               seeds: Sequence[Candidate]) -> list[Candidate] | str:
    """The tier's hits, or why there are none (timeout, error)."""
    try:
        return await asyncio.wait_for(spec.tier.search(request, k, seeds), spec.timeout_s)
    except TimeoutError:
        return "timeout"
    except Exception:  # a broken optional tier must never break recall
        return "error"


@dataclass(frozen=True)
class FaultyTier:
    """Wraps a tier so that it raises: used by resilience drills (MNEMOFLOW_FAULT_TIERS)."""

    inner: RecallTier

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def uses_seeds(self) -> bool:
        return bool(getattr(self.inner, "uses_seeds", False))

    async def search(self, request: dict[str, Any], k: int,
                     seeds: Sequence[Candidate]) -> list[Candidate]:
        raise RuntimeError(f"fault injected into tier {self.inner.name}")
