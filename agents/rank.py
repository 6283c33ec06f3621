"""C-05/R-02 rank, dedupe and budget: turn "related" into a short, explainable, non-repeating list.

activation = base*confidence + relevance + recency + frequency + salience - suppression
(weights in tuning). Activation only orders candidates; it is not a truth score. Every
candidate that is not kept carries the reason it was dropped.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mnemoflow.agents.candidate import Candidate, scope_chain
from mnemoflow.agents.tuning import RankTuning


@dataclass(frozen=True)
class Ranked:
    candidate: Candidate
    activation: float
    outcome: str  # kept | duplicate | budget | scope | expired | visible | low-relevance


@dataclass(frozen=True)
class RankResult:
    ordered: tuple[Ranked, ...]  # every candidate, best first, with its outcome

    @property
    def kept(self) -> tuple[Ranked, ...]:
        return tuple(r for r in self.ordered if r.outcome == "kept")

    @property
    def dropped(self) -> tuple[Ranked, ...]:
        return tuple(r for r in self.ordered if r.outcome != "kept")


def recency(c: Candidate, now_ms: int, half_life_ms: int) -> float:
    age = max(0, now_ms - c.event_time)
    return math.pow(0.5, age / half_life_ms)


def activation(c: Candidate, request: dict[str, Any], max_rel: float, t: RankTuning,
               suppressed: bool) -> float:
    rel = c.relevance / max_rel if max_rel > 0 else 0.0
    window = request.get("timeWindow")
    in_window = bool(window) and window[0] <= c.event_time < window[1]
    return (t.base * c.confidence + t.relevance * rel
            + t.recency * recency(c, request["eventTime"], t.recency_half_life_ms)
            + t.frequency * math.log1p(c.frequency) / math.log(10)
            + t.salience * c.salience
            + (t.time_window_bonus if in_window else 0.0)
            - (t.suppression if suppressed else 0.0))


def rank(candidates: Sequence[Candidate], request: dict[str, Any], recent_digests: Sequence[str],
         index_version: str, t: RankTuning) -> RankResult:
    """Filter (scope, TTL, visible), score, then dedupe and fit the UTF-8 byte budget."""
    chain = scope_chain(request)
    now = request["eventTime"]
    visible = set(request.get("visibleDigests", ())) | {request["digest"]}
    ignored = set(request.get("ignoredDigests", ()))
    recent = set(recent_digests)
    max_rel = max((c.relevance for c in candidates), default=0.0)
    pre: list[Ranked] = []
    for c in candidates:
        a = round(activation(c, request, max_rel, t, c.digest in ignored), 6)
        if (c.scope, c.owner) not in chain:
            outcome = "scope"
        elif c.expires_at is not None and c.expires_at <= now:
            outcome = "expired"
        elif c.memory_id == request["segmentId"] or c.digest in visible:
            outcome = "visible"
        elif max_rel > 0 and c.relevance / max_rel < t.min_relevance:
            outcome = "low-relevance"
        else:
            outcome = ""
        pre.append(Ranked(c, a, outcome))
    pre.sort(key=lambda r: (-r.activation, r.candidate.memory_id))
    out: list[Ranked] = []
    seen: set[tuple[str, str]] = set()
    used = 0
    kept = 0
    for r in pre:
        if r.outcome:
            out.append(r)
            continue
        key = (r.candidate.semantic_key, index_version)  # session and cursor are fixed here
        size = len(r.candidate.text.encode("utf-8"))
        if key in seen or r.candidate.digest in recent:
            out.append(Ranked(r.candidate, r.activation, "duplicate"))
        elif kept >= t.max_items or used + size > t.budget_bytes:
            out.append(Ranked(r.candidate, r.activation, "budget"))
        else:
            seen.add(key)
            used += size
            kept += 1
            out.append(Ranked(r.candidate, r.activation, "kept"))
    return RankResult(tuple(out))
