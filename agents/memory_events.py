"""One builder for memory-log records (`io.mnemoflow.MemoryEvent`), and the host's direct writes.

Every producer of memory events (observer extraction, evidence updater, consolidation, the
host SDK) goes through `memory_event`, so each record carries every schema field and a
deterministic `eventId`: a retried or replayed write lands on the same id and the folds drop it.
Pure: the SDK sends what these functions build.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from mnemoflow.agents.ids import stable_id
from mnemoflow.agents.text import entities as text_entities

SCOPES = ("Turn", "Session", "Workspace", "User", "External")
# the ops after which a memory is never recalled again (every projection honours them)
REVOKE_OPS = frozenset({"memory_revoked", "fact_revoked", "procedure_deprecated"})
HOST_CONFIDENCE = 0.9  # an explicit host write is as good as a user statement, never certain


def memory_event(*, event_id: str, op: str, memory_id: str, kind: str, scope: str, owner: str,
                 event_time: int, session_id: str = "", event_seq: int = 0, text: str = "",
                 entities: Iterable[str] = (), provenance: Iterable[str] = (),
                 source: str = "user", confidence: float = 0.5, ttl_ms: int | None = None,
                 subject: str | None = None, predicate: str | None = None,
                 object_: str | None = None, risk_level: str | None = None,
                 attributes: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A complete MemoryEvent record (every field of schemas/memory-log.avsc)."""
    if scope not in SCOPES:
        raise ValueError(f"unknown scope {scope!r}")
    return {
        "eventId": event_id, "op": op, "memoryId": memory_id, "kind": kind, "scope": scope,
        "owner": owner, "sessionId": session_id, "eventSeq": int(event_seq),
        "eventTime": int(event_time), "text": text, "entities": list(entities),
        "provenance": list(provenance), "source": source, "confidence": float(confidence),
        "ttlMs": ttl_ms, "subject": subject, "predicate": predicate, "object": object_,
        "riskLevel": risk_level, "attributes": {str(k): str(v) for k, v in (attributes or {}).items()},
        "sealed": None,  # a writer's keyring seals it (streams.keyring)
    }


def json_list(values: Iterable[str]) -> str:
    """Lists travel in the string map `attributes` as JSON arrays."""
    return json.dumps(list(values), ensure_ascii=False)


def parse_list(value: str | None) -> tuple[str, ...]:
    if not value:
        return ()
    try:
        data = json.loads(value)
    except ValueError:
        return ()
    return tuple(str(x) for x in data) if isinstance(data, list) else ()


def fact_id(owner: str, subject: str, predicate: str, obj: str) -> str:
    """The id extraction gives a fact, so a host restating it merges instead of conflicting."""
    return stable_id("fact", owner, subject.strip().casefold(), predicate.strip().casefold(),
                     obj.strip().casefold())


def alias_id(scope: str, owner: str, alias: str, target: str) -> str:
    return stable_id("alias", scope, owner, alias.casefold(), target.casefold())


def _check_id(memory_id: str) -> str:
    if not memory_id or "," in memory_id:
        raise ValueError("memory ids are non-empty and comma-free (feedback joins them with ',')")
    return memory_id


# ------------------------------------------------------------------ host direct writes (SDK)


def _host_write(verb: str, *, op: str, memory_id: str, kind: str, scope: str, owner: str,
                event_time: int, id_parts: tuple[str, ...] = (), **fields: Any) -> dict[str, Any]:
    """A write on the host's word: source host, the host as provenance, and an eventId made of
    the call's arguments (`id_parts`, by default the memory id), so a retried call lands on the
    same id."""
    return memory_event(
        event_id=stable_id("mem", "host", verb, scope, owner, *(id_parts or (memory_id,)),
                           event_time),
        op=op, memory_id=memory_id, kind=kind, scope=scope, owner=owner, event_time=event_time,
        provenance=[f"host:{owner}@{event_time}"], source="host", **fields)


def host_fact(owner: str, text: str, event_time: int, *, scope: str = "User",
              subject: str | None = None, predicate: str | None = None, obj: str | None = None,
              memory_id: str | None = None, ttl_ms: int | None = None,
              session_id: str = "") -> dict[str, Any]:
    """`fact_upserted` with source host. With subject/predicate/object it replaces the
    current value of that subject (the old one stays in the conflict set); without them it is
    a free note. A retried call (same arguments) gives the same eventId."""
    if subject and predicate and obj:
        mid = memory_id or fact_id(owner, subject, predicate, obj)
        subject, predicate = subject.strip().casefold(), predicate.strip().casefold()
        text = text or f"{subject} {predicate} {obj}"
    else:
        subject = predicate = obj = None
        mid = memory_id or stable_id("fact", owner, scope, "note", text)
    return _host_write(
        "fact", op="fact_upserted", memory_id=_check_id(mid), kind="fact", scope=scope,
        owner=owner, event_time=event_time, session_id=session_id, text=text,
        entities=text_entities(text), confidence=HOST_CONFIDENCE, ttl_ms=ttl_ms,
        subject=subject, predicate=predicate, object_=obj,
        attributes={"category": "host", "correction": "1" if subject else "0"})


def host_revoke(owner: str, memory_id: str, event_time: int, *, scope: str = "User",
                reason: str = "host") -> dict[str, Any]:
    """`memory_revoked`: hides the memory everywhere; derived memories cascade (see
    agents.revocation)."""
    return _host_write("revoke", op="memory_revoked", memory_id=_check_id(memory_id),
                       kind="revocation", scope=scope, owner=owner, event_time=event_time,
                       attributes={"reason": reason})


def host_alias(owner: str, alias: str, target: str, event_time: int, *, scope: str = "User",
               revoke: bool = False) -> dict[str, Any]:
    """`alias_added` / `alias_revoked` for a scope owner (M-05: low prior, revocable)."""
    op = "alias_revoked" if revoke else "alias_added"
    return _host_write(op, op=op, memory_id=alias_id(scope, owner, alias, target), kind="alias",
                       scope=scope, owner=owner, event_time=event_time, id_parts=(alias, target),
                       text=f"{alias} = {target}", confidence=0.3, subject=alias,
                       object_=target, attributes={"rule": "host"})


def host_confirm(owner: str, memory_id: str, event_time: int, *,
                 scope: str = "User") -> dict[str, Any]:
    """`fact_confirmed`: settles a conflict or a dispute for this fact, or accepts a candidate."""
    return _host_write("confirm", op="fact_confirmed", memory_id=_check_id(memory_id),
                       kind="fact", scope=scope, owner=owner, event_time=event_time,
                       confidence=HOST_CONFIDENCE)


def host_approve_procedure(owner: str, procedure_id: str, event_time: int, *,
                           scope: str = "User") -> dict[str, Any]:
    """`procedure_approved`: the user allowed a high-risk procedure to be promoted (M-04).
    It still only ever reaches the agent as a checklist, and the safety gate still asks."""
    return _host_write("approve", op="procedure_approved", memory_id=_check_id(procedure_id),
                       kind="procedure", scope=scope, owner=owner, event_time=event_time)


def as_operator(ev: Mapping[str, Any], reason: str, actor: str) -> dict[str, Any]:
    """An operator's action (`mnemoflow memories`): the host write it equals, with source
    operator, the operator as provenance, and the reason and actor kept in its attributes. Its
    eventId is made of the host write's and the reason, so a retried action lands on the same
    id while the same action with another reason is a new event."""
    if not reason.strip():
        raise ValueError("an operator action needs a reason")
    return {**ev, "eventId": stable_id("mem", "operator", ev["eventId"], reason, actor),
            "source": "operator", "provenance": [f"operator:{actor}@{ev['eventTime']}"],
            "attributes": {**ev["attributes"], "reason": reason, "actor": actor}}


def memory_switch(user: str, off: bool, event_time: int, *, session: str = "") -> dict[str, Any]:
    """`memory_disabled` / `memory_enabled` for a user, or for one of the user's sessions
    (agents.controls): keyed by the user, so it sits in the user's memory-log partition. An
    operator's action: pass it through `as_operator`."""
    op = "memory_disabled" if off else "memory_enabled"
    return memory_event(
        event_id=stable_id("mem", "switch", user, session, op, event_time), op=op,
        memory_id=stable_id("control", user, session), kind="control", scope="User",
        owner=user, event_time=event_time, session_id=session,
        attributes={"session": session} if session else {})


def owner_forget(owner: str, event_time: int, *, scope: str = "User") -> dict[str, Any]:
    """`owner_forgotten`: every projection drops the owner's memories, in every scope. Never
    sealed, so it still reads after the owner's keys are shredded. Written to the memory-log
    (scope User) and to memory-shared (scope Workspace): each store drops what it holds of the
    owner. An operator's action: pass it through `as_operator`."""
    return memory_event(
        event_id=stable_id("mem", "forget", owner, scope, event_time), op="owner_forgotten",
        memory_id=stable_id("control", owner, "forget"), kind="control", scope=scope,
        owner=owner, event_time=event_time)
