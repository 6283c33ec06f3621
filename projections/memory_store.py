"""The in-process projection of the memory-log that recall reads: records + the lexical index.

It is a fold: `apply(event)` for each memory-log record in log order, idempotent by eventId,
so it can be dropped and rebuilt from the topic at any time. Revocation removes a memory
from every index at once, so it can never be recalled again.

A conversational segment is indexed with its session's previous segment as lexical context
(IndexTuning.context_weight): an answer ("The Minnesota Wolves!") is found by the words of
the question it answers. The previous segment always precedes it in the log, so a rebuild
gives the same index; a revoked segment stops being anyone's context.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from mnemoflow.agents.candidate import Candidate, scope_chain
from mnemoflow.agents.lexical_index import LexicalDoc, LexicalIndex
from mnemoflow.agents.text import digest, semantic_key
from mnemoflow.agents.tuning import IndexTuning, packaged_index_tuning

REVOKE_OPS = {"memory_revoked", "fact_revoked", "procedure_deprecated"}


@dataclass(frozen=True)
class MemoryRecord:
    memory_id: str
    kind: str
    text: str
    scope: str
    owner: str
    session_id: str
    event_seq: int
    event_time: int
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

    @property
    def expires_at(self) -> int | None:
        return None if self.ttl_ms is None else self.event_time + self.ttl_ms

    def candidate(self, relevance: float) -> Candidate:
        return Candidate(
            memory_id=self.memory_id, kind=self.kind, text=self.text, scope=self.scope,
            owner=self.owner, session_id=self.session_id, event_seq=self.event_seq,
            event_time=self.event_time, provenance=",".join(self.provenance),
            digest=self.digest, semantic_key=self.semantic_key, relevance=relevance,
            confidence=self.confidence, salience=float(self.attributes.get("salience", 0) or 0),
            frequency=self.frequency, revoked=self.revoked, expires_at=self.expires_at,
            risk_level=self.risk_level)


class MemoryStore:
    """Records by memory id, the lexical index over the live ones, and the build generation."""

    def __init__(self, name: str = "lexical", generation: int = 1,
                 index: IndexTuning | None = None) -> None:
        self.index_tuning = index if index is not None else packaged_index_tuning()
        t = self.index_tuning
        self.records: dict[str, MemoryRecord] = {}
        self.lexical = LexicalIndex(t.bm25_k1, t.bm25_b, t.context_weight, t.context_max_terms)
        self._last_segment: dict[str, str] = {}  # session id -> its latest segment's memory id
        self._context_of: dict[str, str] = {}  # memory id -> the segment indexed as its context
        self._next_of: dict[str, str] = {}  # memory id -> the segment it is context for
        self._applied: set[str] = set()
        self.name = name
        self.generation = generation
        self.applied_count = 0
        self.by_owner: dict[tuple[str, str], set[str]] = {}  # (scope, owner) -> memory ids
        self.active_fact: dict[tuple[str, str, str], str] = {}  # (owner, subj, pred) -> id
        self.conflicts: dict[tuple[str, str, str], list[dict[str, Any]]] = {}

    @property
    def version(self) -> str:
        """Identifies the index build, not its content: a rebuild makes in-flight results stale."""
        return f"{self.name}/gen{self.generation}"

    def __len__(self) -> int:
        return len(self.records)

    def apply(self, ev: dict[str, Any]) -> bool:
        """Fold one memory-log event; returns False for an event already applied."""
        if ev["eventId"] in self._applied:
            return False
        self._applied.add(ev["eventId"])
        self.applied_count += 1
        op, mid = ev["op"], ev["memoryId"]
        if op == "alias_added":
            self.lexical.add_alias(ev["subject"] or "", ev["object"] or "", ev["scope"], ev["owner"])
            return True
        if op == "alias_revoked":
            self.lexical.revoke_alias(ev["subject"] or "", ev["object"] or "", ev["scope"],
                                      ev["owner"])
            return True
        old = self.records.get(mid)
        if op in REVOKE_OPS:
            self._revoke(mid, op)
            return True
        if op in ("fact_proposed", "fact_upserted"):
            return self._fact(ev)
        if op == "fact_confirmed":
            return self._confirm(mid)
        if op in ("evidence_reinforce", "evidence_weaken"):
            if old is not None:
                step = 0.1 if op == "evidence_reinforce" else -0.1
                conf = min(1.0, max(0.0, old.confidence + step))
                self.records[mid] = replace(old, confidence=conf, frequency=old.frequency + 1)
            return True
        if old is not None and old.revoked:
            return True  # a revoked memory stays revoked until a new id is written
        self._index(self._record(ev))
        return True

    def _index(self, rec: MemoryRecord) -> None:
        new = rec.memory_id not in self.records
        self.records[rec.memory_id] = rec
        self.by_owner.setdefault((rec.scope, rec.owner), set()).add(rec.memory_id)
        if rec.kind == "segment" and new:  # a re-recorded segment keeps its first context
            prev = self._live_segment(self._last_segment.get(rec.session_id))
            if prev is not None:
                self._context_of[rec.memory_id] = prev
                self._next_of[prev] = rec.memory_id
            self._last_segment[rec.session_id] = rec.memory_id
        self._add_doc(rec)

    def _live_segment(self, mid: str | None) -> str | None:
        """`mid`, or the nearest segment before it in its session that is not revoked."""
        while mid is not None and (rec := self.records.get(mid)) is not None and rec.revoked:
            mid = self._context_of.get(mid)
        return mid

    def _add_doc(self, rec: MemoryRecord) -> None:
        if not rec.text:
            return
        prev = self.context_of(rec.memory_id)
        self.lexical.add(LexicalDoc(rec.memory_id, rec.text, rec.scope, rec.owner, rec.entities,
                                    prev.text if prev is not None else ""))

    def candidate(self, rec: MemoryRecord, relevance: float) -> Candidate:
        """The record as a recall candidate, with the live segment it follows (rank uses it)."""
        c = rec.candidate(relevance)
        prev = self.context_of(rec.memory_id) if rec.kind == "segment" else None
        return replace(c, follows=prev.memory_id) if prev is not None else c

    def context_of(self, memory_id: str) -> MemoryRecord | None:
        """The segment a segment is indexed with as context: its session's previous live one."""
        prev = self.records.get(self._live_segment(self._context_of.get(memory_id)) or "")
        return prev if prev is not None and not prev.revoked else None

    def _revoke(self, mid: str, why: str) -> None:
        old = self.records.get(mid)
        if old is not None:
            self.records[mid] = replace(old, revoked=True,
                                        attributes={**old.attributes, "revokedBy": why})
            self.lexical.remove(mid)
            nxt = self.records.get(self._next_of.pop(mid, ""))
            if nxt is not None and not nxt.revoked and nxt.memory_id in self.lexical:
                # the next segment now follows the one before the revoked one (as a rebuild
                # from MEMORY.md, which omits revoked rows, would index it)
                prev = self._live_segment(self._context_of.get(mid))
                if prev is not None:
                    self._context_of[nxt.memory_id] = prev
                    self._next_of[prev] = nxt.memory_id
                else:
                    self._context_of.pop(nxt.memory_id, None)
                self._add_doc(nxt)

    def _record(self, ev: dict[str, Any]) -> MemoryRecord:
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

    def _fact(self, ev: dict[str, Any]) -> bool:
        """M-03: user-stated beats inferred, an inference never overwrites a user's fact, an
        explicit correction supersedes, and two user statements that disagree stay in a
        conflict set (both sides' provenance kept) until one is confirmed or revoked."""
        key = (ev["owner"], ev["subject"] or "", ev["predicate"] or "")
        new = self._record(ev)
        cur_id = self.active_fact.get(key)
        cur = self.records.get(cur_id) if cur_id else None
        if cur is not None and not cur.revoked and cur.memory_id == new.memory_id:
            merged = tuple(dict.fromkeys(cur.provenance + new.provenance))
            self.records[cur.memory_id] = replace(cur, provenance=merged,
                                                  frequency=cur.frequency + 1)
            return True
        if cur is None or cur.revoked:
            self.active_fact[key] = new.memory_id
            self._index(new)
            return True
        side = {"memoryId": new.memory_id, "object": ev["object"], "source": new.source,
                "provenance": list(new.provenance)}
        conflict = self.conflicts.setdefault(key, [
            {"memoryId": cur.memory_id, "object": cur.text, "source": cur.source,
             "provenance": list(cur.provenance)}])
        if new.source == "inference" and cur.source == "user":
            conflict.append({**side, "status": "rejected-inference"})
            return True
        if new.attributes.get("correction") == "1" or (
                new.source == "user" and cur.source == "inference"):
            conflict.append({**side, "status": "superseded-previous"})
            self._revoke(cur.memory_id, f"superseded by {new.memory_id}")
            self.active_fact[key] = new.memory_id
            self._index(new)
            return True
        conflict.append({**side, "status": "open"})
        self._index(replace(new, attributes={**new.attributes, "conflict": "open"}))
        return True

    def _confirm(self, mid: str) -> bool:
        for key, sides in self.conflicts.items():
            if any(s["memoryId"] == mid for s in sides):
                for s in sides:
                    if s["memoryId"] != mid:
                        self._revoke(s["memoryId"], f"conflict resolved for {mid}")
                self.active_fact[key] = mid
                return True
        return False

    def search_lexical(self, request: dict[str, Any], k: int) -> list[Candidate]:
        """Scope-filtered BM25/entity/alias hits that existed before the request (event time).

        The event-time cut makes a replay see what the first run saw, not later memories.
        """
        chain = scope_chain(request)
        now = request["eventTime"]
        hits = self.lexical.search(request["text"], list(request.get("entities", ())), chain,
                                   k * 2)
        out = []
        for doc_id, score, _via in hits:
            rec = self.records.get(doc_id)
            if rec is not None and not rec.revoked and rec.event_time < now:
                out.append(self.candidate(rec, score))
        return out[:k]


@dataclass
class LexicalTier:
    """C-04 tier 1 (M-05 + BM25): always available, synchronous, scope-filtered before scoring."""

    store: MemoryStore
    name: str = "lexical"

    async def search(self, request: dict[str, Any], k: int,
                     seeds: Sequence[Candidate]) -> list[Candidate]:
        return self.store.search_lexical(request, k)
