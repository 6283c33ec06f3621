"""The in-process projection of the memory-log that recall reads: records + the lexical index.

It is a fold: `apply(event)` for each memory-log record in log order, idempotent by eventId,
so it can be dropped and rebuilt from the topic at any time. Revocation removes a memory
from every index at once, so it can never be recalled again, and it cascades: a fact or
alias extracted from a revoked segment, or a procedure whose every run was built on revoked
episodes, goes too, unless it has other live provenance (another segment, a host write).

What is recallable (`recallable`): a live record that no user has disputed; for procedures
only the validated and active stages; never a fact candidate (consolidation's guesses wait
for `fact_confirmed`). The lexical index holds exactly the recallable records.

A conversational segment is indexed with its session's previous segment as lexical context
(IndexTuning.context_weight): an answer ("The Minnesota Wolves!") is found by the words of
the question it answers. The previous segment always precedes it in the log, so a rebuild
gives the same index; a revoked segment stops being anyone's context.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from mnemoflow.agents import procedures as P
from mnemoflow.agents.candidate import Candidate, scope_chain
from mnemoflow.agents.episodes import Episode
from mnemoflow.agents.ids import stable_id
from mnemoflow.agents.lexical_index import LexicalDoc, LexicalIndex
from mnemoflow.agents.memory_events import REVOKE_OPS, json_list, parse_list
from mnemoflow.agents.text import digest, semantic_key
from mnemoflow.agents.tuning import IndexTuning, packaged_index_tuning

PROCEDURE_OPS = {"procedure_observed", "procedure_staged", "procedure_promoted",
                 "procedure_deprecated", "procedure_approved"}

# G-01 bounds: a tool outcome after a delivery is weak, correlational evidence, so it moves
# confidence a little and never to certainty; a failure weighs twice a success (an amplified
# wrong memory costs more than a missed right one).
REINFORCE_STEP = 0.05
WEAKEN_STEP = 0.1
CONFIDENCE_FLOOR = 0.05
CONFIDENCE_CEIL = 0.95
EVIDENCE_KEPT = 32


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
    disputed: bool = False  # a user said it is wrong: kept in the conflict set, not recalled
    evidence: tuple[str, ...] = ()  # G-01 outcome events, "+eventId" / "-eventId", newest last

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


@dataclass(frozen=True)
class AliasRecord:
    alias: str
    target: str
    scope: str
    owner: str
    revoked: bool = False


def _sources(ev: dict[str, Any]) -> tuple[str, ...] | None:
    """The memories an event was derived from, or None when it stands on its own (a host
    write, a user fact from before extraction named its segment)."""
    attrs = ev.get("attributes") or {}
    if attrs.get("sources"):
        return parse_list(attrs["sources"])
    if ev["kind"] == "fact" and attrs.get("rule") and ev.get("source") != "host":
        # extracted before facts named their segment: the segment id is derived the same way
        return (stable_id("seg", ev["sessionId"], "session-events", ev["eventSeq"]),)
    return None


def _episode(ev: dict[str, Any]) -> Episode:
    """The run a `procedure_observed` event carries (see agents.consolidate)."""
    a = ev.get("attributes") or {}
    steps = parse_list(a.get("steps"))
    return Episode(
        key=a.get("runKey") or ev["eventId"], owner=ev["owner"], scope=ev["scope"],
        session_id=ev["sessionId"], turn=int(a.get("turn") or 0), intent=a.get("intent", ""),
        actions=steps, entities=tuple(ev.get("entities") or ()), unresolved=(),
        outcome=a.get("outcome", "success"), provenance=tuple(ev.get("provenance") or ()),
        start_time=ev["eventTime"], event_time=ev["eventTime"], event_seq=ev["eventSeq"],
        episode_ids=parse_list(a.get("sources")),
        failures=tuple((t, "") for t in parse_list(a.get("failedSteps"))))


class MemoryStore:
    """Records by memory id, the lexical index over the recallable ones, and the build
    generation; plus the read API consolidation uses (`records_of`, `session_records`,
    `procedures`, `has_event`, `latest_event_time`)."""

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
        self.latest_event_time = 0  # newest event time folded: consolidation's clock
        self.by_owner: dict[tuple[str, str], set[str]] = {}  # (scope, owner) -> memory ids
        self.by_kind: dict[str, set[str]] = {}
        self.by_session: dict[str, set[str]] = {}
        self.active_fact: dict[tuple[str, str, str], str] = {}  # (owner, subj, pred) -> id
        self.conflicts: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
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

    @property
    def version(self) -> str:
        """Identifies the index build, not its content: a rebuild makes in-flight results stale."""
        return f"{self.name}/gen{self.generation}"

    def __len__(self) -> int:
        return len(self.records)

    # ------------------------------------------------------------------------- the fold

    def apply(self, ev: dict[str, Any]) -> bool:
        """Fold one memory-log event; returns False for an event already applied."""
        if ev["eventId"] in self._applied:
            return False
        self._applied.add(ev["eventId"])
        self.applied_count += 1
        self.latest_event_time = max(self.latest_event_time, int(ev["eventTime"]))
        op, mid = ev["op"], ev["memoryId"]
        if op in ("link_added", "link_revoked"):
            return True  # graph edges, not memories: the graph projection folds them
        if op in ("alias_added", "alias_revoked"):
            return self._alias(ev)
        if op in PROCEDURE_OPS or (op in REVOKE_OPS and mid in self.procedures):
            return self._procedure(ev)
        old = self.records.get(mid)
        if op in REVOKE_OPS:
            self._revoke(mid, op)
            return True
        if op in ("fact_proposed", "fact_upserted"):
            return self._propose(ev)
        if op == "fact_confirmed":
            return self._confirm(ev)
        if op == "fact_conflicted":
            return self._dispute(ev)
        if op in ("evidence_reinforce", "evidence_weaken"):
            return self._evidence(ev)
        if old is not None and old.revoked:
            return True  # a revoked memory stays revoked until a new id is written
        self._index(self._record(ev))
        return True

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

    def _sync(self, mid: str) -> None:
        """The lexical index holds exactly the recallable records."""
        rec = self.records.get(mid)
        if rec is not None and rec.text and self.recallable(mid):
            prev = self.context_of(mid)
            self.lexical.add(LexicalDoc(rec.memory_id, rec.text, rec.scope, rec.owner,
                                        rec.entities, prev.text if prev is not None else ""))
        else:
            self.lexical.remove(mid)

    def _is_revoked(self, mid: str) -> bool:
        rec = self.records.get(mid)
        if rec is not None:
            return rec.revoked
        al = self.aliases.get(mid)
        return al is not None and al.revoked

    def _link(self, mid: str, ev: dict[str, Any]) -> None:
        srcs = _sources(ev)
        if srcs is None:
            self.anchored.add(mid)
            return
        for src in srcs:
            self.sources.setdefault(mid, set()).add(src)
            self.derived.setdefault(src, set()).add(mid)

    def _orphaned(self, mid: str) -> bool:
        """Derived only from memories that are all revoked (and not written on its own)."""
        srcs = self.sources.get(mid)
        return (mid not in self.anchored and bool(srcs)
                and all(self._is_revoked(s) for s in srcs))

    def _live_segment(self, mid: str | None) -> str | None:
        """`mid`, or the nearest segment before it in its session that is not revoked."""
        while mid is not None and (rec := self.records.get(mid)) is not None and rec.revoked:
            mid = self._context_of.get(mid)
        return mid

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
        if old is not None and not old.revoked:
            self.records[mid] = replace(old, revoked=True,
                                        attributes={**old.attributes, "revokedBy": why})
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
        self._cascade(mid)

    def _cascade(self, mid: str) -> None:
        """Revoke what was derived from `mid` and has no other live provenance."""
        for dep in sorted(self.derived.get(mid, ())):
            if dep in self.procedures:
                p = P.revoke_sources(self.procedures[dep], mid)
                if not P.has_live_runs(p):
                    p = P.apply_transition(p, P.Transition(p.stage, "deprecated", "",
                                                           self.latest_event_time,
                                                           f"cascade:{mid}"))
                self._put_procedure(p)
            elif self._orphaned(dep):
                if dep in self.aliases:
                    self._drop_alias(dep)
                else:
                    self._revoke(dep, f"cascade:{mid}")

    # ------------------------------------------------------------------------- aliases (M-05)

    def _alias(self, ev: dict[str, Any]) -> bool:
        """Aliases only expand queries (low prior); they never touch a record or its confidence."""
        mid = ev["memoryId"]
        alias, target = ev["subject"] or "", ev["object"] or ""
        if ev["op"] == "alias_revoked":
            self.aliases.setdefault(mid, AliasRecord(alias, target, ev["scope"], ev["owner"]))
            self._drop_alias(mid, alias, target, ev["scope"], ev["owner"])
            return True
        self._link(mid, ev)
        self.aliases[mid] = AliasRecord(alias, target, ev["scope"], ev["owner"])
        if self._orphaned(mid):
            self._drop_alias(mid)
        else:
            self.lexical.add_alias(alias, target, ev["scope"], ev["owner"])
        return True

    def _drop_alias(self, mid: str, *spec: str) -> None:
        al = self.aliases[mid]
        alias, target, scope, owner = spec or (al.alias, al.target, al.scope, al.owner)
        self.lexical.revoke_alias(alias, target, scope, owner)
        self.aliases[mid] = replace(al, revoked=True)

    # ------------------------------------------------------------------------- facts (M-03)

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

    def _propose(self, ev: dict[str, Any]) -> bool:
        mid = ev["memoryId"]
        self._link(mid, ev)
        if (ev.get("attributes") or {}).get("status") == "candidate":
            return self._candidate(ev)
        self.fact_candidates.pop(mid, None)
        self._fact(ev)
        if self._orphaned(mid):
            self._revoke(mid, "cascade:sources-revoked")
        return True

    def _candidate(self, ev: dict[str, Any]) -> bool:
        """A fact guessed by consolidation: kept and listed, never recalled until confirmed."""
        mid = ev["memoryId"]
        cur = self.records.get(mid)
        if cur is not None and cur.attributes.get("status") != "candidate":
            return True  # already a real fact (or revoked): a guess changes nothing
        if cur is not None:
            prov = tuple(dict.fromkeys(cur.provenance + tuple(ev.get("provenance") or ())))
            self.records[mid] = replace(cur, provenance=prov, frequency=cur.frequency + 1)
        else:
            self._index(self._record(ev))
            self.fact_candidates[mid] = ev
        if self._orphaned(mid):
            self._revoke(mid, "cascade:sources-revoked")
        return True

    def _fact(self, ev: dict[str, Any]) -> bool:
        """M-03: user-stated beats inferred, an inference never overwrites a user's fact, an
        explicit correction supersedes, and two user statements that disagree stay in a
        conflict set (both sides' provenance kept) until one is confirmed or revoked."""
        if not ev.get("subject") and not ev.get("predicate"):
            self._index(self._record(ev))  # a free note has no value to conflict with
            return True
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
        if new.source == "inference" and cur.source in ("user", "host"):
            conflict.append({**side, "status": "rejected-inference"})
            return True
        if new.attributes.get("correction") == "1" or (
                new.source in ("user", "host") and cur.source == "inference"):
            conflict.append({**side, "status": "superseded-previous"})
            self._revoke(cur.memory_id, f"superseded by {new.memory_id}")
            self.active_fact[key] = new.memory_id
            self._index(new)
            return True
        conflict.append({**side, "status": "open"})
        self._index(replace(new, attributes={**new.attributes, "conflict": "open"}))
        return True

    def _confirm(self, ev: dict[str, Any]) -> bool:
        """Settles a conflict for this fact, lifts a user's dispute, or accepts a candidate."""
        mid = ev["memoryId"]
        found = False
        if mid in self.fact_candidates:
            cand = self.fact_candidates.pop(mid)
            attrs = {**cand["attributes"], "status": "confirmed"}
            old = self.records.pop(mid, None)
            self._fact({**cand, "attributes": attrs})
            if mid not in self.records and old is not None:
                # refused (an inference against a user's fact): it leaves the read indices too
                self.by_owner.get((old.scope, old.owner), set()).discard(mid)
                self.by_kind.get(old.kind, set()).discard(mid)
                self.by_session.get(old.session_id, set()).discard(mid)
            if ev.get("source") in ("user", "host"):
                self.anchored.add(mid)  # a person vouched for it: it now stands on its own
            found = True
        rec = self.records.get(mid)
        if rec is not None and rec.disputed and not rec.revoked:
            self.records[mid] = replace(rec, disputed=False, attributes={
                k: v for k, v in rec.attributes.items() if k != "conflict"})
            self._sync(mid)
            found = True
        for key, sides in self.conflicts.items():
            if any(s["memoryId"] == mid for s in sides):
                for s in sides:
                    if s["memoryId"] != mid:
                        self._revoke(s["memoryId"], f"conflict resolved for {mid}")
                    elif s.get("status") == "disputed":
                        s["status"] = "dismissed"
                self.active_fact[key] = mid
                return True
        return found

    def _dispute(self, ev: dict[str, Any]) -> bool:
        """G-01: a user's correction puts the memory into the conflict set with the
        correction's provenance and stops recalling it until someone confirms it."""
        mid = ev["memoryId"]
        rec = self.records.get(mid)
        if rec is None or rec.revoked:
            return True
        attrs = rec.attributes
        key = (rec.owner, attrs.get("subject") or mid, attrs.get("predicate") or "")
        sides = self.conflicts.setdefault(key, [
            {"memoryId": mid, "object": rec.text, "source": rec.source,
             "provenance": list(rec.provenance)}])
        sides.append({"memoryId": ev["eventId"], "object": ev.get("text") or "",
                      "source": ev.get("source", "user"),
                      "provenance": list(ev.get("provenance") or ()), "status": "disputed"})
        if mid in self.procedures:
            self._put_procedure(P.add_outcome(self.procedures[mid], ev["eventId"], "dispute",
                                              ev["sessionId"], "failure", ev["eventTime"]))
            rec = self.records[mid]
        conf = min(rec.confidence, max(CONFIDENCE_FLOOR, rec.confidence - WEAKEN_STEP))
        self.records[mid] = replace(rec, disputed=True, confidence=conf,
                                    attributes={**rec.attributes, "conflict": "disputed"})
        self._sync(mid)
        return True

    # ------------------------------------------------------------------------- evidence (G-01)

    def _evidence(self, ev: dict[str, Any]) -> bool:
        """Reinforce/weaken: bounded confidence steps and an evidence list on the record; for a
        procedure the outcome becomes reuse evidence that the promotion rules read."""
        mid = ev["memoryId"]
        rec = self.records.get(mid)
        if rec is None or rec.revoked:
            return True
        up = ev["op"] == "evidence_reinforce"
        if mid in self.procedures:
            self._put_procedure(P.add_outcome(self.procedures[mid], ev["eventId"], "reuse",
                                              ev["sessionId"], "success" if up else "failure",
                                              ev["eventTime"]))
            rec = self.records[mid]
            conf = rec.confidence  # a procedure's confidence is its evidence's success share
        elif up:
            conf = max(rec.confidence, min(CONFIDENCE_CEIL, rec.confidence + REINFORCE_STEP))
        else:
            conf = min(rec.confidence, max(CONFIDENCE_FLOOR, rec.confidence - WEAKEN_STEP))
        trail = (*rec.evidence, ("+" if up else "-") + ev["eventId"])[-EVIDENCE_KEPT:]
        bump = 0 if mid in self.procedures else 1  # a procedure's frequency counts its runs
        self.records[mid] = replace(rec, confidence=conf, frequency=rec.frequency + bump,
                                    evidence=trail)
        return True

    # ------------------------------------------------------------------------- procedures (M-04)

    def _procedure(self, ev: dict[str, Any]) -> bool:
        op, mid = ev["op"], ev["memoryId"]
        p = self.procedures.get(mid)
        if op == "procedure_observed":
            if p is not None and p.stage == "deprecated":
                return True  # terminal: a deprecated procedure is never revived
            run = _episode(ev)
            if not run.actions:
                return True  # malformed: a procedure is its steps
            for src in run.episode_ids:
                self.sources.setdefault(mid, set()).add(src)
                self.derived.setdefault(src, set()).add(mid)
            revoked = frozenset(s for s in run.episode_ids if self._is_revoked(s))
            p = P.observe_episode(p or replace(P.new_procedure(run), procedure_id=mid), run,
                                  revoked)
            if not P.has_live_runs(p):
                p = P.apply_transition(p, P.Transition(p.stage, "deprecated", ev["eventId"],
                                                       ev["eventTime"], "no-live-evidence"))
        elif p is None:
            return True  # a stage event for a procedure never observed: nothing to move
        elif op == "procedure_approved":
            if ev.get("source") not in ("user", "host"):
                return True  # only a person (through the host) can approve
            p = replace(p, approved=True)
        elif op in REVOKE_OPS and op != "procedure_deprecated":
            p = P.apply_transition(p, P.Transition(p.stage, "deprecated", ev["eventId"],
                                                   ev["eventTime"], "revoked"))
        else:
            a = ev.get("attributes") or {}
            if a.get("decision") == "ask":
                p = replace(p, approval_requested=True)
            else:
                to = "deprecated" if op == "procedure_deprecated" else a.get("stage", "")
                frm = p.stage if to == "deprecated" else a.get("fromStage", "")
                if to not in P.RANK:
                    return True
                p = P.apply_transition(p, P.Transition(
                    frm, to, ev["eventId"], ev["eventTime"], a.get("reason", ""),
                    parse_list(a.get("evidence"))))
        self._put_procedure(p, ev)
        return True

    def _put_procedure(self, p: P.Procedure, ev: dict[str, Any] | None = None) -> None:
        """The procedure's record: rendered checklist text, confidence from its evidence, and
        the time it entered its current stage (recall's event-time cut applies to that)."""
        self.procedures[p.procedure_id] = p
        old = self.records.get(p.procedure_id)
        runs = [e for e in P.live(p) if e.kind == "run"]
        entered = p.history[-1].event_time if p.history else (
            old.event_time if old is not None else (ev or {}).get("eventTime", 0))
        attrs = {"stage": p.stage, "steps": json_list(p.steps),
                 "requiresApproval": "1" if p.requires_approval else "0",
                 "approved": "1" if p.approved else "0",
                 "approvalRequested": "1" if p.approval_requested else "0"}
        if old is not None and "conflict" in old.attributes:
            attrs["conflict"] = old.attributes["conflict"]
        text = P.render(p)
        rec = MemoryRecord(
            memory_id=p.procedure_id, kind="procedure", text=text, scope=p.scope, owner=p.owner,
            session_id=runs[0].session_id if runs else (old.session_id if old else ""),
            event_seq=old.event_seq if old is not None else int((ev or {}).get("eventSeq", 0)),
            event_time=int(entered),
            provenance=tuple(dict.fromkeys(f"{e.key}" for e in runs))[-16:],
            entities=tuple(dict.fromkeys(x for e in runs for x in e.entities))[:16],
            digest=digest(text), semantic_key=semantic_key(text), confidence=P.confidence(p),
            source="inference", revoked=p.stage == "deprecated", risk_level=p.risk_level,
            frequency=len(runs), attributes=attrs,
            disputed=old.disputed if old is not None else False,
            evidence=old.evidence if old is not None else ())
        if rec.revoked and (old is None or not old.revoked):
            rec = replace(rec, attributes={**attrs, "revokedBy": p.history[-1].reason
                                           if p.history else "deprecated"})
            self.revocations.append(p.procedure_id)
        self._index(rec)

    # ------------------------------------------------------------------------- reads

    def recallable(self, mid: str) -> bool:
        """May recall return this memory? (the lexical index and the vector tier both ask)"""
        rec = self.records.get(mid)
        if rec is None or rec.revoked or rec.disputed:
            return False
        if rec.kind == "procedure":
            p = self.procedures.get(mid)
            return p is not None and p.recallable
        return not (rec.kind == "fact" and rec.attributes.get("status") == "candidate")

    def has_event(self, event_id: str) -> bool:
        return event_id in self._applied

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

    def conflict_sets(self, owner: str) -> dict[tuple[str, str, str], list[dict[str, Any]]]:
        return {k: v for k, v in self.conflicts.items() if k[0] == owner}

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
