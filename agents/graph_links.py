"""memory-log records for graph links, and link proposals from entity co-occurrence.

A link is appended with its evidence and can be revoked, so one bad link cannot spread
(C-04). Links are not facts: they only shape where the graph walk goes; no memory's
confidence is ever raised by one. All ids are derived from content (`stable_id`), so proposing
the same link from the same evidence twice gives the same event, which the folds skip.

`link_added` / `link_revoked` fill every field of `schemas/memory-log.avsc`:
  memoryId = the link id (`link:…`), kind = "link", scope/owner = the partition it lives in,
  sessionId/eventSeq/eventTime = the event that completed the evidence (or the revocation),
  subject/object = the two node ids (`entity:<name>` or a memory id), predicate = what kind
  of link, provenance = the evidence (memory ids or `session#turn.step` refs),
  text = "" (a link is not a memory: nothing for the lexical or vector index), entities =
  the entity names it joins, source = inference | host | user, confidence = how much the
  proposer trusts it (never copied onto a memory), ttlMs = optional expiry, riskLevel = null,
  attributes = {"basis", "weight", and for revocations "reason"}.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from itertools import combinations
from typing import Any

from mnemoflow.agents.graph import ENTITY, LINK_ADDED, LINK_REVOKED, GraphState, View, is_entity
from mnemoflow.agents.ids import stable_id

CO_OCCURS = "co-occurs-with"


def link_id(scope: str, owner: str, a: str, b: str) -> str:
    """One link per unordered node pair per (scope, owner)."""
    lo, hi = sorted((a, b))
    return stable_id("link", scope, owner, lo, hi)


def _names(*nodes: str) -> list[str]:
    return [n[len(ENTITY):] for n in nodes if is_entity(n)]


def link_added(scope: str, owner: str, subject: str, obj: str, evidence: Sequence[str], *,
               event_time: int, session_id: str, event_seq: int, predicate: str = "related-to",
               source: str = "host", confidence: float = 0.5, weight: float = 1.0,
               ttl_ms: int | None = None, basis: str = "explicit") -> dict[str, Any]:
    """A `link_added` record; evidence is required, a link without any is refused."""
    if not evidence:
        raise ValueError("a link needs evidence")
    if subject == obj:
        raise ValueError("a link needs two different nodes")
    lid = link_id(scope, owner, subject, obj)
    return {
        "eventId": stable_id("mem", LINK_ADDED, lid, *evidence), "op": LINK_ADDED,
        "memoryId": lid, "kind": "link", "scope": scope, "owner": owner,
        "sessionId": session_id, "eventSeq": event_seq, "eventTime": event_time, "text": "",
        "entities": _names(subject, obj), "provenance": list(evidence), "source": source,
        "confidence": confidence, "ttlMs": ttl_ms, "subject": subject, "predicate": predicate,
        "object": obj, "riskLevel": None,
        "attributes": {"basis": basis, "weight": f"{weight:g}"}, "sealed": None,
    }


def link_revoked(added: dict[str, Any], reason: str, evidence: Sequence[str], *,
                 event_time: int, session_id: str, event_seq: int,
                 source: str = "user") -> dict[str, Any]:
    """Revokes the link of a `link_added` record for good (re-proposals stay revoked)."""
    if not evidence:
        raise ValueError("a revocation needs evidence")
    lid = added["memoryId"]
    return {
        **added, "eventId": stable_id("mem", LINK_REVOKED, lid, *evidence), "op": LINK_REVOKED,
        "sessionId": session_id, "eventSeq": event_seq, "eventTime": event_time,
        "provenance": list(evidence), "source": source, "ttlMs": None,
        "attributes": {**added["attributes"], "reason": reason},
    }


def propose_links(state: GraphState, memory_ids: Iterable[str], min_count: int = 2,
                  max_entities: int = 8,
                  alive: Callable[[str], bool] | None = None) -> list[dict[str, Any]]:
    """`link_added` records for entity pairs of `memory_ids` that co-occur in ≥ min_count live
    memories of one (scope, owner). Pure: the same state and ids give the same records.

    Evidence is the first `min_count` co-occurring memories by (event time, id), and the link's
    event time is that of the last of them: the link exists from when its evidence did. Only
    the first `max_entities` entities of a memory are paired, which bounds the work per memory.
    A link already held with the same evidence, or revoked, is not proposed again. `alive`
    (the MemoryStore's view) keeps superseded facts out of the evidence, and a memory with a
    TTL is never evidence: a link must not outlive what grounds it.
    """
    out: dict[str, dict[str, Any]] = {}
    for mid in sorted(set(memory_ids)):
        m = state.memories.get(mid)
        if m is None or m.revoked:
            continue
        part = state.partitions[(m.scope, m.owner)]
        view = View(frozenset({(m.scope, m.owner)}), 2**63 - 1, alive)
        for a, b in combinations(sorted(m.entities[:max_entities]), 2):
            lid = link_id(m.scope, m.owner, a, b)
            if lid in out or lid in state.revoked_links:
                continue
            both = part.mentions.get(a, set()) & part.mentions.get(b, set())
            live = sorted((state.memories[x].event_time, x) for x in both if state.visible(x, view))
            if len(live) < min_count:
                continue
            evidence = [x for _, x in live[:min_count]]
            held = state.links.get(lid)
            if held is not None and list(held.evidence) == evidence:
                continue
            last = state.memories[evidence[-1]]
            out[lid] = link_added(
                m.scope, m.owner, a, b, evidence, event_time=last.event_time,
                session_id=last.session_id, event_seq=last.event_seq, predicate=CO_OCCURS,
                source="inference", confidence=0.5, basis="co-occurrence")
    return [out[k] for k in sorted(out)]
