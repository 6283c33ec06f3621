"""The in-process projection of the memory-log that recall reads: records + the lexical index.

It is a fold: `apply(event)` for each memory-log record in log order, idempotent by eventId,
so it can be dropped and rebuilt from the topic at any time. The rules of what an event does
are pure functions in agents: facts and conflict sets, disputes and evidence (agents.facts),
revocation and its cascade (agents.revocation), procedure stages (agents.procedure_fold), what
is recallable (agents.memory_record). This module keeps the records, the tables those rules
read (fact slots, conflict sets, fact candidates, the provenance graph) and the indexes, and
applies the rules' results to them.

Revocation removes a memory from every index at once, so it can never be recalled again.
The lexical index holds exactly the recallable records.

A conversational segment is indexed with its session's previous segment as lexical context
(IndexTuning.context_weight): an answer ("The Minnesota Wolves!") is found by the words of
the question it answers. The previous segment always precedes it in the log, so a rebuild
gives the same index; a revoked segment stops being anyone's context.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from mnemoflow.agents import facts as F
from mnemoflow.agents import procedure_fold as PF
from mnemoflow.agents import procedures as P
from mnemoflow.agents import revocation as R
from mnemoflow.agents.candidate import Candidate, scope_chain
from mnemoflow.agents.consolidate import episode_of
from mnemoflow.agents.controls import CONTROL_OPS, Controls
from mnemoflow.agents.ids import RecentIds
from mnemoflow.agents.lexical_index import LexicalDoc, LexicalIndex
from mnemoflow.agents.memory_events import REVOKE_OPS
from mnemoflow.agents.memory_record import AliasRecord, MemoryRecord, is_candidate, record_of
from mnemoflow.agents.memory_record import recallable as record_recallable
from mnemoflow.agents.sealing import FORGET_OP
from mnemoflow.agents.tuning import IndexTuning, packaged_index_tuning

APPLIED_WINDOW = 200_000  # recent event ids kept per store for the redelivery guard


# ops that change a memory already there (not one that the event itself writes)
ACTS_ON_EXISTING = REVOKE_OPS | {"fact_confirmed", "fact_conflicted", "evidence_reinforce",
                                 "evidence_weaken"}


class MemoryStore:
    """Records by memory id, the lexical index over the recallable ones, and the build
    generation; plus the read API consolidation uses (`records_of`, `session_records`,
    `procedures`, `has_event`, `latest_event_time`)."""

    def __init__(self, name: str = "lexical", generation: int = 1,
                 index: IndexTuning | None = None, applied_window: int = APPLIED_WINDOW) -> None:
        self.index_tuning = index if index is not None else packaged_index_tuning()
        t = self.index_tuning
        self.records: dict[str, MemoryRecord] = {}
        self.lexical = LexicalIndex(t.bm25_k1, t.bm25_b, t.context_weight, t.context_max_terms)
        self._last_segment: dict[str, str] = {}  # session id -> its latest segment's memory id
        self._context_of: dict[str, str] = {}  # memory id -> the segment indexed as its context
        self._next_of: dict[str, str] = {}  # memory id -> the segment it is context for
        # redelivered events are dropped by id: recent ones (a window, so the guard does not
        # grow with history), and every inference (consolidation's) event, which are few and
        # which consolidation checks to propose nothing twice
        self._recent = RecentIds(applied_window)
        self._inferred: set[str] = set()
        self.name = name
        self.generation = generation
        self.applied_count = 0
        self.latest_event_time = 0  # newest event time folded: consolidation's clock
        self.by_owner: dict[tuple[str, str], set[str]] = {}  # (scope, owner) -> memory ids
        self.by_kind: dict[str, set[str]] = {}
        self.by_session: dict[str, set[str]] = {}
        self.active_fact: dict[F.FactKey, str] = {}  # slot -> the fact in force
        self.conflicts: dict[F.FactKey, F.Sides] = {}
        self.procedures: dict[str, P.Procedure] = {}
        self.aliases: dict[str, AliasRecord] = {}
        self.fact_candidates: dict[str, dict[str, Any]] = {}  # id -> the proposing event
        self.sources: dict[str, set[str]] = {}  # derived id -> the ids it came from
        self.derived: dict[str, set[str]] = {}  # source id -> ids derived from it
        self.anchored: set[str] = set()  # derived ids that also stand on their own
        # every id that became unrecallable for good, in fold order (direct, cascaded,
        # deprecated): lets projections such as the vector index follow the cascade
        self.revocations: list[str] = []
        # segments whose context changed because the turn before them was revoked, in fold
        # order: the vector projection re-embeds them
        self.relinked: list[str] = []
        # memory off and on, per user and per session (operator switches, by event time)
        self.controls = Controls()
        # owners forgotten (`owner_forgotten`), in fold order: the sinks drop what they hold
        self.forgotten: list[str] = []

    @property
    def version(self) -> str:
        """Identifies the index build, not its content: a rebuild makes in-flight results stale."""
        return f"{self.name}/gen{self.generation}"

    def __len__(self) -> int:
        return len(self.records)

    # ------------------------------------------------------------------------- the fold

    def _owns(self, ev: dict[str, Any]) -> bool:
        """Whether the event's scope owner is the owner of the memory it acts on: a store holds
        many owners (a partition's users, every tenant of a gateway), and one owner's host
        must not revoke, confirm or dispute another's memory by naming its id."""
        target = self.procedures.get(ev["memoryId"]) or self.records.get(ev["memoryId"])
        return target is None or target.owner == ev["owner"]

    def apply(self, ev: dict[str, Any]) -> bool:
        """Fold one memory-log event; returns False for an event already applied, or one
        written while its owner's memory was off (agents.controls): the sinks (vectors,
        graph, MEMORY.md) are offered neither."""
        eid = ev["eventId"]
        if self.has_event(eid):
            return False
        if ev.get("source") == "inference":
            self._inferred.add(eid)
        else:
            self._recent.add(eid)
        self.applied_count += 1
        self.latest_event_time = max(self.latest_event_time, int(ev["eventTime"]))
        op, mid = ev["op"], ev["memoryId"]
        if op == FORGET_OP:
            self._forget(str(ev["owner"]))
            return True
        if op in CONTROL_OPS:
            self.controls.apply(ev)
            return True
        if self.controls.drops(ev):
            return False  # written while its owner's memory was off: no projection takes it
        if op in ACTS_ON_EXISTING and not self._owns(ev):
            return True  # another owner's memory: applied, and it changes nothing
        if op in ("link_added", "link_revoked"):
            return True  # graph edges, not memories: the graph projection folds them
        if op in ("alias_added", "alias_revoked"):
            self._alias(ev)
        elif op in PF.PROCEDURE_OPS or (op in REVOKE_OPS and mid in self.procedures):
            self._procedure(ev)
        elif op in REVOKE_OPS:
            self._revoke(mid, op)
        elif op in ("fact_proposed", "fact_upserted"):
            self._propose(ev)
        elif op == "fact_confirmed":
            return self._confirm(ev)
        elif op == "fact_conflicted":
            self._dispute(ev)
        elif op in ("evidence_reinforce", "evidence_weaken"):
            self._evidence(ev)
        elif (old := self.records.get(mid)) is None or not old.revoked:
            # (a revoked memory stays revoked until a new id is written)
            self._index(record_of(ev))
        return True

    # ------------------------------------------------------------------------- indexes

    def _index(self, rec: MemoryRecord) -> None:
        new = rec.memory_id not in self.records
        self.records[rec.memory_id] = rec
        self.by_owner.setdefault((rec.scope, rec.owner), set()).add(rec.memory_id)
        self.by_kind.setdefault(rec.kind, set()).add(rec.memory_id)
        if rec.session_id:
            self.by_session.setdefault(rec.session_id, set()).add(rec.memory_id)
        if rec.kind == "segment" and new:  # a re-recorded segment keeps its first context
            prev = self._live_segment(self._last_segment.get(rec.session_id))
            if prev is not None:
                self._context_of[rec.memory_id] = prev
                self._next_of[prev] = rec.memory_id
            self._last_segment[rec.session_id] = rec.memory_id
        self._sync(rec.memory_id)

    def _unindex(self, rec: MemoryRecord) -> None:
        """Out of the read indices (a record dropped without a trace, never a revocation)."""
        self.by_owner.get((rec.scope, rec.owner), set()).discard(rec.memory_id)
        self.by_kind.get(rec.kind, set()).discard(rec.memory_id)
        self.by_session.get(rec.session_id, set()).discard(rec.memory_id)

    def _sync(self, mid: str) -> None:
        """The lexical index holds exactly the recallable records."""
        rec = self.records.get(mid)
        if rec is not None and rec.text and self.recallable(mid):
            prev = self.context_of(mid)
            self.lexical.add(LexicalDoc(rec.memory_id, rec.text, rec.scope, rec.owner,
                                        rec.entities, prev.text if prev is not None else ""))
        else:
            self.lexical.remove(mid)

    def _live_segment(self, mid: str | None) -> str | None:
        """`mid`, or the nearest segment before it in its session that is not revoked."""
        while mid is not None and (rec := self.records.get(mid)) is not None and rec.revoked:
            mid = self._context_of.get(mid)
        return mid

    def candidate(self, rec: MemoryRecord, relevance: float) -> Candidate:
        """The record as a recall candidate, with the live segment it follows (rank uses it)."""
        prev = self.context_of(rec.memory_id) if rec.kind == "segment" else None
        return rec.candidate(relevance, prev.memory_id if prev is not None else None)

    def context_of(self, memory_id: str) -> MemoryRecord | None:
        """The segment a segment is indexed with as context: its session's previous live one."""
        prev = self.records.get(self._live_segment(self._context_of.get(memory_id)) or "")
        return prev if prev is not None and not prev.revoked else None

    # ------------------------------------------------------------------------- revocation

    def _link(self, mid: str, ev: dict[str, Any]) -> None:
        srcs = R.sources_of(ev)
        if srcs is None:
            self.anchored.add(mid)
        else:
            self._derive(mid, srcs)

    def _derive(self, mid: str, srcs: Iterable[str]) -> None:
        for src in srcs:
            self.sources.setdefault(mid, set()).add(src)
            self.derived.setdefault(src, set()).add(mid)

    def _revoke(self, mid: str, why: str) -> None:
        for step in R.plan(self, mid, why, self.latest_event_time):
            if isinstance(step, R.Revoke):
                self._hide(step.memory_id, step.reason)
            elif isinstance(step, R.DropAlias):
                self._drop_alias(step.alias_id)
            else:
                self._put_procedure(step.procedure)

    def _hide(self, mid: str, why: str) -> None:
        old = self.records.get(mid)
        if old is not None and not old.revoked:
            self.records[mid] = R.revoked_record(old, why)
            self.lexical.remove(mid)
            self.revocations.append(mid)
            nxt = self.records.get(self._next_of.pop(mid, ""))
            if nxt is not None and not nxt.revoked:
                # the next segment now follows the one before the revoked one (as a rebuild
                # from MEMORY.md, which omits revoked rows, would index it)
                prev = self._live_segment(self._context_of.get(mid))
                if prev is not None:
                    self._context_of[nxt.memory_id] = prev
                    self._next_of[prev] = nxt.memory_id
                else:
                    self._context_of.pop(nxt.memory_id, None)
                self._sync(nxt.memory_id)
                self.relinked.append(nxt.memory_id)
        self.fact_candidates.pop(mid, None)

    def _revoke_if_orphaned(self, mid: str) -> None:
        if R.orphaned(self, mid):
            self._revoke(mid, R.SOURCES_REVOKED)

    # ------------------------------------------------------------------------- forget (G-02)

    def _forget(self, owner: str) -> None:
        """Drop every trace of the owner's memories, in every scope: records, text, facts,
        aliases, procedures, switches. The ids go to `forgotten` (and `revocations`, so that the
        sinks delete their rows); nothing of the owner is left to checkpoint."""
        gone = self.ids_of(owner)
        for mid in sorted(gone):
            self.lexical.remove(mid)
            al = self.aliases.pop(mid, None)
            if al is not None and not al.revoked:
                self.lexical.revoke_alias(al.alias, al.target, al.scope, al.owner)
            rec = self.records.pop(mid, None)
            if rec is not None:
                self._unindex(rec)
            for table in (self.procedures, self.fact_candidates, self.sources, self.derived,
                          self._context_of, self._next_of):
                table.pop(mid, None)
            self.anchored.discard(mid)
            self.revocations.append(mid)
        for key in [k for k in self.by_owner if k[1] == owner]:
            del self.by_owner[key]
        for src in list(self.derived):
            self.derived[src] -= gone
        for table in (self._context_of, self._next_of, self._last_segment):
            for k in [k for k, v in table.items() if v in gone]:
                del table[k]
        for key in [k for k in self.active_fact if k[0] == owner]:
            del self.active_fact[key]
        for key in [k for k in self.conflicts if k[0] == owner]:
            del self.conflicts[key]
        self.controls.forget(owner)
        self.forgotten.append(owner)

    def ids_of(self, owner: str) -> set[str]:
        """Every memory, procedure and alias id of the owner, in any scope."""
        gone = {m for (_, o), ids in self.by_owner.items() if o == owner for m in ids}
        gone |= {m for m, p in self.procedures.items() if p.owner == owner}
        return gone | {m for m, a in self.aliases.items() if a.owner == owner}

    # ------------------------------------------------------------------------- aliases (M-05)

    def _alias(self, ev: dict[str, Any]) -> None:
        """Aliases only expand queries (low prior); they never touch a record or its confidence."""
        mid = ev["memoryId"]
        alias, target = ev["subject"] or "", ev["object"] or ""
        if ev["op"] == "alias_revoked":
            self.aliases.setdefault(mid, AliasRecord(alias, target, ev["scope"], ev["owner"]))
            self._drop_alias(mid, alias, target, ev["scope"], ev["owner"])
            return
        self._link(mid, ev)
        self.aliases[mid] = AliasRecord(alias, target, ev["scope"], ev["owner"])
        if R.orphaned(self, mid):
            self._drop_alias(mid)
        else:
            self.lexical.add_alias(alias, target, ev["scope"], ev["owner"])

    def _drop_alias(self, mid: str, *spec: str) -> None:
        al = self.aliases[mid]
        alias, target, scope, owner = spec or (al.alias, al.target, al.scope, al.owner)
        self.lexical.revoke_alias(alias, target, scope, owner)
        self.aliases[mid] = replace(al, revoked=True)

    # ------------------------------------------------------------------------- facts (M-03)

    def _propose(self, ev: dict[str, Any]) -> None:
        mid = ev["memoryId"]
        self._link(mid, ev)
        if not is_candidate(ev.get("attributes")):
            self.fact_candidates.pop(mid, None)
            self._fact(ev)
        elif (cur := self.records.get(mid)) is None:
            self._index(record_of(ev))
            self.fact_candidates[mid] = ev
        elif is_candidate(cur.attributes):
            self.records[mid] = F.restated(cur, ev.get("provenance") or ())
        else:
            return  # already a real fact (or revoked): a guess changes nothing
        self._revoke_if_orphaned(mid)

    def _fact(self, ev: dict[str, Any]) -> None:
        key = F.fact_key(ev)
        if key is None:
            self._index(record_of(ev))  # a free note: no slot, nothing to conflict with
            return
        cur_id = self.active_fact.get(key)
        up = F.upsert(ev, self.records.get(cur_id) if cur_id else None, self.conflicts.get(key))
        if up.sides is not None:
            self.conflicts[key] = up.sides
        if up.revoke is not None:
            self._revoke(up.revoke.memory_id, up.revoke.reason)
        if up.active is not None:
            self.active_fact[key] = up.active
        if up.record is not None and up.reindex:
            self._index(up.record)
        elif up.record is not None:
            self.records[up.record.memory_id] = up.record

    def _confirm(self, ev: dict[str, Any]) -> bool:
        """Settles a conflict for this fact, lifts a user's dispute, or accepts a candidate."""
        mid = ev["memoryId"]
        found = False
        if mid in self.fact_candidates:
            cand = self.fact_candidates.pop(mid)
            old = self.records.pop(mid, None)
            self._fact(F.accepted(cand))
            if mid not in self.records and old is not None:
                self._unindex(old)  # refused (an inference against a user's fact)
            if F.vouched(ev):
                self.anchored.add(mid)
            found = True
        rec = self.records.get(mid)
        if rec is not None and rec.disputed and not rec.revoked:
            self.records[mid] = F.undisputed(rec)
            self._sync(mid)
            found = True
        key = F.conflict_of(self.conflicts, mid)
        if key is None:
            return found
        self.conflicts[key], losers = F.settle(self.conflicts[key], mid)
        for loser in losers:
            self._revoke(loser.memory_id, loser.reason)
        self.active_fact[key] = mid
        return True

    def _dispute(self, ev: dict[str, Any]) -> None:
        """G-01: a user's correction joins the memory's conflict set and hides the memory until
        someone confirms it."""
        mid = ev["memoryId"]
        rec = self.records.get(mid)
        if rec is None or rec.revoked:
            return
        key = F.dispute_key(rec)
        self.conflicts[key] = F.with_side(self.conflicts.get(key), rec, F.dispute_side(ev))
        if mid in self.procedures:
            self._put_procedure(PF.outcome(self.procedures[mid], ev))
            rec = self.records[mid]
        self.records[mid] = F.disputed(rec)
        self._sync(mid)

    def _evidence(self, ev: dict[str, Any]) -> None:
        mid = ev["memoryId"]
        rec = self.records.get(mid)
        if rec is None or rec.revoked:
            return
        procedure = mid in self.procedures
        if procedure:
            self._put_procedure(PF.outcome(self.procedures[mid], ev))
            rec = self.records[mid]
        self.records[mid] = F.with_evidence(rec, ev, procedure=procedure)

    # ------------------------------------------------------------------------- procedures (M-04)

    def _procedure(self, ev: dict[str, Any]) -> None:
        mid = ev["memoryId"]
        p = PF.step(self.procedures.get(mid), ev, lambda m: R.is_revoked(self, m))
        if p is None:
            return
        if ev["op"] == "procedure_observed":
            self._derive(mid, episode_of(ev).episode_ids)
        self._put_procedure(p, ev)

    def _put_procedure(self, p: P.Procedure, ev: dict[str, Any] | None = None) -> None:
        old = self.records.get(p.procedure_id)
        rec = PF.procedure_record(p, old, ev)
        self.procedures[p.procedure_id] = p
        if rec.revoked and (old is None or not old.revoked):
            self.revocations.append(p.procedure_id)
        self._index(rec)

    # ------------------------------------------------------------------------- reads

    def recallable(self, mid: str) -> bool:
        """May recall return this memory? (the lexical index and the vector tier both ask)"""
        return record_recallable(self.records.get(mid), self.procedures.get(mid))

    def has_event(self, event_id: str) -> bool:
        return event_id in self._recent or event_id in self._inferred

    def records_of(self, kind: str) -> list[MemoryRecord]:
        """Every record of a kind (revoked ones too), in memory-id order."""
        return [self.records[m] for m in sorted(self.by_kind.get(kind, ()))]

    def session_records(self, session_id: str) -> list[MemoryRecord]:
        return sorted((self.records[m] for m in self.by_session.get(session_id, ())),
                      key=lambda r: (r.event_seq, r.memory_id))

    def procedure(self, mid: str) -> P.Procedure | None:
        return self.procedures.get(mid)

    def all_procedures(self) -> list[P.Procedure]:
        return [self.procedures[m] for m in sorted(self.procedures)]

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
            if rec is not None and self.recallable(doc_id) and rec.event_time < now:
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
