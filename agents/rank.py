"""C-05/R-02 rank, dedupe and budget: turn "related" into a short, explainable, non-repeating list.

activation = base*confidence + relevance + recency + frequency + salience - suppression
(weights in tuning). Activation only orders candidates; it is not a truth score. Every
candidate that is not kept carries the reason it was dropped.

Relevance is the tiers' fused score scaled to [0, 1] by the best usable candidate (not the
message itself, another scope or an expired memory). With `fusion = "rrf"` it is recall's
reciprocal-rank fusion; with `"convex"` each tier's own score (BM25, cosine) is min-max scaled
over that tier's hits (from 0 when the tier returned fewer than `recall_k` hits) and weighted
by `tier_weights`: rank positions throw away how far ahead a strong match is, scores keep it. Two structure
bonuses then use the conversation's shape: a turn gains `next_weight` times the relevance of
the candidate that follows it in its session (the answer to a question points back at the
question), and `session_weight` times the sum of its session's two best relevances (a session
about the topic holds more than one hit).

Floors (absolute, so a packet can be empty when nothing is good enough; relevance above is
relative to the best candidate and cannot say so): an item that shares no content word with
the request and whose vector similarity is under `item_floor` is `low-relevance`, so filler
("Noted.", "ok") never takes a place in the budget; and when no kept item reaches
`packet_floor` in similarity or shares `packet_min_overlap` content words with the request
(or half of them, when it has fewer than twice that many) and at least `packet_min_coverage`
of the request's content words (a long message shares three common words with almost any
memory of its user: on LongMemEval_S, 82 % of the ordinary-turn packets had no other backing),
every kept item becomes `weak` and no packet is made (the broker audits `suppress: weak`).
Both floors hold only when the vector tier answered the request.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mnemoflow.agents.candidate import Candidate, scope_chain
from mnemoflow.agents.text import content_tokens
from mnemoflow.agents.tuning import RankTuning


@dataclass(frozen=True)
class Ranked:
    candidate: Candidate
    activation: float
    outcome: str  # kept | duplicate | budget | scope | expired | visible | low-relevance | weak


@dataclass(frozen=True)
class RankResult:
    ordered: tuple[Ranked, ...]  # every candidate, best first, with its outcome

    @property
    def kept(self) -> tuple[Ranked, ...]:
        return tuple(r for r in self.ordered if r.outcome == "kept")

    @property
    def dropped(self) -> tuple[Ranked, ...]:
        return tuple(r for r in self.ordered if r.outcome != "kept")


@dataclass(frozen=True)
class Support:
    """What the request itself says for a candidate: shared content words, vector similarity."""

    overlap: int
    similarity: float


# a transcript's speaker label ("Caroline: ..."): every turn of that speaker shares it with
# the request, so it is no evidence that one turn is about the request
_SPEAKER = re.compile(r"^[^:\n]{1,40}:\s")


def terms_of(text: str) -> frozenset[str]:
    return frozenset(content_tokens(_SPEAKER.sub("", text, count=1)))


def support(c: Candidate, query_terms: frozenset[str]) -> Support:
    return Support(len(query_terms & terms_of(c.text)), dict(c.tier_scores).get("vector", 0.0))


def recency(c: Candidate, now_ms: int, half_life_ms: int) -> float:
    age = max(0, now_ms - c.event_time)
    return math.pow(0.5, age / half_life_ms)


def tier_floors(candidates: Sequence[Candidate], t: RankTuning) -> dict[str, float | None]:
    """tier -> the score its scale starts from: None (its lowest hit) when the tier returned
    a full list of `recall_k` hits, else the score of no match at all (BM25: 0) or of an
    unrelated text (cosine: `vector_unrelated`, which depends on the model). A short list
    holds every match there was, so its weakest hit may still be a good one and must not be
    scaled to nothing."""
    hits: dict[str, int] = {}
    for c in candidates:
        for tier, _ in c.tier_scores or (("", c.relevance),):
            hits[tier] = hits.get(tier, 0) + 1
    return {tier: None if n >= t.recall_k else (t.vector_unrelated if tier == "vector" else 0.0)
            for tier, n in hits.items()}


def fused_relevance(candidates: Sequence[Candidate], t: RankTuning,
                    floors: dict[str, float | None] | None = None) -> dict[str, float]:
    """memory id -> fused relevance, per `t.fusion` (see the module docstring)."""
    if t.fusion == "rrf":
        return {c.memory_id: c.relevance for c in candidates}
    if t.fusion != "convex":
        raise ValueError(f"unknown fusion {t.fusion!r}")
    floors = tier_floors(candidates, t) if floors is None else floors
    per = [dict(c.tier_scores) or {"": c.relevance} for c in candidates]
    span: dict[str, tuple[float, float]] = {}
    for scores in per:
        for tier, x in scores.items():
            lo, hi = span.get(tier, (x, x))
            span[tier] = (min(lo, x), max(hi, x))
    for tier, (lo, hi) in span.items():
        floor = floors.get(tier)
        if floor is not None:
            span[tier] = (min(lo, floor), hi)
    out: dict[str, float] = {}
    for c, scores in zip(candidates, per, strict=True):
        total = 0.0
        for tier, x in scores.items():
            lo, hi = span[tier]
            total += t.tier_weights.get(tier, 1.0) * ((x - lo) / (hi - lo) if hi > lo else 1.0)
        out[c.memory_id] = round(total, 9)
    return out


SESSION_TOP = 2  # a session's score: the sum of its best SESSION_TOP scaled relevances


def structured_relevance(candidates: Sequence[Candidate], fused: dict[str, float],
                         t: RankTuning) -> dict[str, float]:
    """Fused relevance scaled to [0, 1], plus the next-turn and session bonuses of `t`."""
    top = max(fused.values(), default=0.0)
    if top <= 0 or (t.next_weight == 0 and t.session_weight == 0):
        return fused
    rel = {m: v / top for m, v in fused.items()}
    out = dict(rel)
    if t.next_weight:
        for c in candidates:
            if c.follows is not None and c.follows in rel:
                out[c.follows] += t.next_weight * rel[c.memory_id]
    if t.session_weight:
        best: dict[str, list[float]] = {}
        for c in candidates:
            if c.session_id:  # host writes have no session: they are not one pseudo-session
                best.setdefault(c.session_id, []).append(rel[c.memory_id])
        score = {s: sum(sorted(v, reverse=True)[:SESSION_TOP]) for s, v in best.items()}
        for c in candidates:
            if c.session_id:
                out[c.memory_id] += t.session_weight * score[c.session_id]
    return {m: round(v, 9) for m, v in out.items()}


def activation(c: Candidate, request: dict[str, Any], max_rel: float, t: RankTuning,
               suppressed: bool, relevance: float | None = None) -> float:
    """`relevance` is the fused score (rrf: the candidate's own), scaled here by `max_rel`."""
    rel_raw = c.relevance if relevance is None else relevance
    rel = rel_raw / max_rel if max_rel > 0 else 0.0
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

    def unusable(c: Candidate) -> str:
        if (c.scope, c.owner) not in chain:
            return "scope"
        if c.expires_at is not None and c.expires_at <= now:
            return "expired"
        if c.memory_id == request["segmentId"] or c.digest in visible:
            return "visible"
        return ""

    why = {c.memory_id: unusable(c) for c in candidates}
    # only usable candidates set the scale: the message itself (visible) is always its own
    # best match and would push every real memory under min_relevance
    usable = [c for c in candidates if not why[c.memory_id]]
    fused = structured_relevance(
        usable, fused_relevance(usable, t, tier_floors(candidates, t)), t)
    max_rel = max(fused.values(), default=0.0)
    # the floors judge by vector similarity: without an answer of the vector tier (turned off,
    # failed, timed out) they would drop what only the lexical or graph tier could find
    floors = (t.item_floor > 0 or t.packet_floor > 0) and any(
        "vector" in dict(c.tier_scores) for c in usable)
    terms = terms_of(request["text"]) if floors else frozenset()
    backing = {c.memory_id: support(c, terms) for c in usable} if floors else {}
    pre: list[Ranked] = []
    for c in candidates:
        rel = fused.get(c.memory_id, 0.0)
        a = round(activation(c, request, max_rel, t, c.digest in ignored, rel), 6)
        outcome = why[c.memory_id]
        if not outcome and max_rel > 0 and rel / max_rel < t.min_relevance:
            outcome = "low-relevance"
        if not outcome and floors and t.item_floor > 0:
            b = backing[c.memory_id]
            if b.overlap == 0 and b.similarity < t.item_floor:
                outcome = "low-relevance"
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
    # a short request ("what is my locker code?") cannot share many words with anything, and
    # a long one shares a few with anything
    enough = max(min(t.packet_min_overlap, max(1, math.ceil(len(terms) / 2))),
                 math.ceil(t.packet_min_coverage * len(terms)))
    if floors and t.packet_floor > 0 and not any(
            backing[r.candidate.memory_id].similarity >= t.packet_floor
            or backing[r.candidate.memory_id].overlap >= enough
            for r in out if r.outcome == "kept"):
        out = [Ranked(r.candidate, r.activation, "weak") if r.outcome == "kept" else r
               for r in out]
    return RankResult(tuple(out))
