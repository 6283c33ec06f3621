"""What the audit store can tell an operator: the whole chain behind one packet, a session's
timeline, a user's sessions and packets. Pure functions over an `AuditStore`; each returns
plain data (camelCase keys, as the protocol's records) ready for JSON or a table.

The chain follows the pipeline's ids: packet -> broker audit (packetId) -> its requestId ->
gate audit -> segmentId -> segment and session event (sessionId, eventSeq); the packet's claim
is the first claim op after its inject op in the session's inbox partition (the log order is
the arbiter, as in the fold), its feedback the session's feedback events whose feedbackRef is
the packet id, its exact digest or an item's digest.

Every statement filters on one indexed column (`col = ?` or `list_contains(?, col)`) and the
rest is done here: DuckDB looks a value up in an ART index only when that test is the whole
filter; `stage = 'broker' AND packet_id = ?` scans the table (3.0 ms against 0.85 ms at 100k
audit records, and it grows with the table).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from mnemoflow.projections.audit_store import AuditStore

Row = dict[str, Any]
# outcomes the safety gate gives (agents/safety.py via broker.audit_candidates); the others
# (duplicate, budget, scope, expired, visible, low-relevance) are rank's
SAFETY_OUTCOMES = ("revoked", "injection", "ask")
# a broker `suppress` for these reasons is the safety gate's (agents/safety.py); any other
# (empty, weak: rank kept nothing, or nothing strong enough) means it had nothing to check
SAFETY_REASONS = ("scope", "revoked", "injection")
FIRED = ("retrieve", "prefetch")
_OPS_ORDER = {"inject": 3, "steer": 3, "claim": 4, "expire": 5, "remove": 5}


def _camel(row: Row) -> Row:
    out = {}
    for k, v in row.items():
        head, *rest = k.split("_")
        out[head + "".join(w.title() for w in rest)] = v
    return out


def _pick(rows: Iterable[Row], **match: object) -> Row | None:
    """The first row whose columns equal `match` (rows come in a defined order)."""
    return next((r for r in rows if all(r[k] == v for k, v in match.items())), None)


def _where(store: AuditStore, table: str, column: str, value: object, columns: str = "*"
           ) -> list[Row]:
    return store.rows(f"SELECT {columns} FROM {table} WHERE {column} = ?", [value])


def _where_in(store: AuditStore, table: str, column: str, values: list[Any],
              columns: str = "*") -> list[Row]:
    if not values:
        return []
    return store.rows(f"SELECT {columns} FROM {table} WHERE list_contains(?, {column})",
                      [values])


def resolve_packet(store: AuditStore, ref: str) -> list[str]:
    """Packet ids that `ref` names: itself if the store knows it, else those it begins (at
    most 5, so the caller can say it is ambiguous)."""
    if _where(store, "packets", "packet_id", ref, "packet_id") or \
            _where(store, "audit", "packet_id", ref, "packet_id"):
        return [ref]
    return [r["packet_id"] for r in store.rows(
        """SELECT packet_id FROM (SELECT packet_id FROM packets UNION
                                  SELECT packet_id FROM audit WHERE packet_id IS NOT NULL)
           WHERE starts_with(packet_id, ?) ORDER BY 1 LIMIT 5""", [ref])]


def _candidates(store: AuditStore, audit_id: str) -> list[Row]:
    """A broker record's candidates with the memory's kind and latest text, if the memory
    topics hold it, and whether it has been revoked since."""
    rows = sorted(_where(store, "candidates", "audit_id", audit_id, "* EXCLUDE (audit_id)"),
                  key=lambda r: r["rank"])
    memories = {m["memory_id"]: m for m in store.rows("""
        SELECT memory_id, arg_min(kind, event_time) AS kind,
               arg_max(text, event_time) FILTER (WHERE text <> '') AS text,
               bool_or(op IN ('memory_revoked', 'fact_revoked')) AS revoked
        FROM memory_events WHERE list_contains(?, memory_id) GROUP BY memory_id""",
        [[r["memory_id"] for r in rows]])} if rows else {}
    for r in rows:
        m = memories.get(r["memory_id"], {})
        r.update(kind=m.get("kind"), text=m.get("text"), revoked_since=bool(m.get("revoked")),
                 stage="kept" if r["outcome"] == "kept" else
                 "safety" if r["outcome"] in SAFETY_OUTCOMES else "rank")
    return [_camel(r) for r in rows]


def safety_verdict(broker: Row | None, candidates: list[Row]) -> Row | None:
    """The safety gate's verdict as the broker record and the candidates' outcomes show it."""
    if broker is None:
        return None
    action, reason = broker["action"], broker["reason"]
    blocked = [{"memoryId": c["memoryId"], "outcome": c["outcome"]} for c in candidates
               if c["stage"] == "safety"]
    if action == "drop":  # stale or failed before the safety gate ran
        verdict = "not-checked"
    elif action == "ask":
        verdict = "ask"
    elif action == "suppress" and reason in SAFETY_REASONS:
        verdict = "suppress"  # every kept candidate was blocked
    elif action == "suppress":
        verdict = "nothing-to-check"
    else:
        verdict = "allow" if not blocked else "allow-some"
    return {"verdict": verdict, "reason": reason, "blocked": blocked}


def _retirements(store: AuditStore, packet_ids: list[str]) -> dict[str, list[Row]]:
    """Per packet, the claim, expire and remove ops naming it after its inject op, in log
    order (a session's ops share one inbox partition)."""
    named = _where_in(store, "op_packets", "packet_id", packet_ids, "op_id, packet_id")
    ops = {o["op_id"]: o for o in _where_in(
        store, "ops", "op_id", sorted({n["op_id"] for n in named}),
        "op_id, op, claimer, event_time, reason, part, log_offset")}
    out: dict[str, list[Row]] = {p: [] for p in packet_ids}
    injected: dict[str, int] = {}
    for n in named:
        o = ops[n["op_id"]]
        if o["op"] in ("inject", "steer"):
            injected[n["packet_id"]] = o["log_offset"]
        else:
            out[n["packet_id"]].append(o)
    for pid, found in out.items():
        after = [o for o in found if o["log_offset"] > injected.get(pid, -1)]
        out[pid] = [_camel(o) for o in sorted(after, key=lambda o: (o["part"], o["log_offset"]))]
    return out


def packet_chain(store: AuditStore, packet_id: str) -> Row | None:
    """Everything the topics say about one packet, from the event that triggered it to the
    host's feedback; None if the store knows no such packet. A shadow packet (audited, never
    written to the inbox) has `packet` None and no claim."""
    packet = _pick(_where(store, "packets", "packet_id", packet_id))
    broker = _pick(_where(store, "audit", "packet_id", packet_id), stage="broker")
    if packet is None and broker is None:
        return None
    request_id = broker["request_id"] if broker else packet["request_id"]  # type: ignore[index]
    decisions = sorted(_where(store, "audit", "request_id", request_id, "* EXCLUDE (source_seqs)"),
                       key=lambda a: a["audit_id"])
    gate = _pick(decisions, stage="gate")
    broker = broker or _pick(decisions, stage="broker")
    decided = gate or broker or {}
    session_id = decided.get("session_id") or packet["session_id"]  # type: ignore[index]
    segment = _pick(_where(store, "segments", "segment_id", decided.get("segment_id")))
    seq = decided.get("event_seq", segment["event_seq"] if segment else None)
    events = sorted(_where(store, "events", "session_id", session_id), key=lambda e: e["event_seq"])
    candidates = _candidates(store, broker["audit_id"]) if broker else []
    items = [_camel(r) for r in sorted(
        _where(store, "packet_items", "packet_id", packet_id, "* EXCLUDE (packet_id)"),
        key=lambda i: i["pos"])]
    ops = _retirements(store, [packet_id])[packet_id]
    claims = [o for o in ops if o["op"] == "claim"]
    refs = {packet_id, *([packet["exact_digest"]] if packet else []), *(i["digest"] for i in items)}
    latency = None
    if broker and segment and broker["emit_time"] and segment["ingest_time"]:
        latency = broker["emit_time"] - segment["ingest_time"]
    return {
        "packetId": packet_id, "sessionId": session_id, "userId": decided.get("user_id"),
        "trigger": _trigger(segment, _pick(events, event_seq=seq), session_id, seq),
        "gate": _camel({k: gate[k] for k in (
            "audit_id", "action", "reason", "score", "signals", "request_id", "context_version",
            "event_time")}) if gate else None,
        "broker": _camel({**{k: broker[k] for k in (
            "audit_id", "action", "reason", "request_id", "index_version", "bytes", "expiry")},
            "latency_ms": latency}) if broker else None,
        "tiers": broker["tiers"] if broker else {},
        "candidates": candidates,
        "safety": safety_verdict(broker, candidates),
        "packet": {**_camel({k: v for k, v in packet.items() if k != "n_items"}),
                   "items": items} if packet else None,
        "claim": claims[0] if claims else None,
        "lostClaims": claims[1:],
        "retired": [o for o in ops if o["op"] != "claim"],
        "feedback": [_camel({"event_seq": e["event_seq"], "event_time": e["event_time"],
                             "kind": e["feedback_kind"], "ref": e["feedback_ref"],
                             "memory_ids": e["memory_ids"]})
                     for e in events if e["type"] == "feedback" and e["feedback_ref"] in refs],
    }


def _trigger(segment: Row | None, event: Row | None, session_id: str, seq: int | None
             ) -> Row | None:
    if segment is None and event is None:
        return None
    s, e = segment or {}, event or {}
    return {"sessionId": session_id, "eventSeq": seq,
            "eventTime": e.get("event_time", s.get("event_time")),
            "type": e.get("type"), "kind": s.get("kind"),
            "text": s.get("text", e.get("text")), "segmentId": s.get("segment_id"),
            "provenance": s.get("provenance") or e.get("provenance"),
            "turn": s.get("turn", e.get("turn")), "step": s.get("step", e.get("step")),
            "toolName": s.get("tool_name")}


def _event_detail(s: Row, e: Row) -> str:
    kind = s.get("kind") or e.get("type")
    if kind == "lifecycle":
        return e.get("lifecycle") or ""
    if kind == "feedback":
        return f"{e.get('feedback_kind') or s.get('feedback_kind')} {e.get('feedback_ref') or ''}"
    if kind == "tool":
        return f"{s.get('tool_name')} {'ok' if s.get('ok') else 'error'}: {s.get('text') or ''}"
    return s.get("text") or e.get("text") or ""


def session_timeline(store: AuditStore, session_id: str) -> Row | None:
    """The session in order of event time: its events (each followed by the gate's decision
    and, if the gate fired, the broker's), the packets, claims and retirements of its inbox,
    and the host's feedback. None if the store knows nothing of the session."""
    segs = {r["event_seq"]: r for r in _where(store, "segments", "session_id", session_id)}
    evs = {r["event_seq"]: r for r in _where(store, "events", "session_id", session_id)}
    audits = _where(store, "audit", "session_id", session_id, "* EXCLUDE (signals)")
    ops = _where(store, "ops", "session_id", session_id)
    if not (segs or evs or audits or ops):
        return None
    packets = {p["op_id"]: p for p in _where(store, "packets", "session_id", session_id)}
    named: dict[str, list[str]] = {}
    for r in _where_in(store, "op_packets", "op_id", [o["op_id"] for o in ops]):
        named.setdefault(r["op_id"], []).append(r["packet_id"])
    ranked: dict[str, list[int]] = {}
    for c in _where_in(store, "candidates", "audit_id",
                       [a["audit_id"] for a in audits if a["stage"] == "broker"],
                       "audit_id, outcome"):
        n = ranked.setdefault(c["audit_id"], [0, 0])
        n[0] += 1
        n[1] += c["outcome"] == "kept"
    # sort key: (event time, group, eventSeq or log offset, stage); at one instant an event
    # comes with its gate and broker records, then its packet, then claims and retirements,
    # then feedback (the SDK writes it after the claim), each with its own gate record
    entries: list[tuple[tuple[int, int, int, int], Row]] = []
    for seq in sorted(set(segs) | set(evs)):
        s, e = segs.get(seq, {}), evs.get(seq, {})
        kind = s.get("kind") or e.get("type")
        at = e.get("event_time", s.get("event_time"))
        entries.append(((at, 6 if kind == "feedback" else 0, seq, 0), {
            "at": at, "eventSeq": seq, "what": kind, "ref": s.get("segment_id"),
            "action": None, "reason": None, "detail": _event_detail(s, e)}))
    for a in audits:
        if a["stage"] == "gate":
            ref, detail = a["request_id"], f"score {a['score']:.3f}"
        else:
            bad = {t: v for t, v in (a["tiers"] or {}).items() if v != "ok"}
            n, kept = ranked.get(a["audit_id"], (0, 0))
            ref = a["packet_id"]
            detail = f"{n} candidates, {kept} kept" + (f", tiers {bad}" if bad else "")
        group = 6 if a["stage"] == "gate" and a["reason"] == "feedback" else 0
        stage = 1 if a["stage"] == "gate" else 2
        entries.append(((a["event_time"], group, a["event_seq"], stage), {
            "at": a["event_time"], "eventSeq": a["event_seq"], "what": a["stage"], "ref": ref,
            "action": a["action"], "reason": a["reason"], "detail": detail}))
    for o in ops:
        p = packets.get(o["op_id"])
        if p is not None:
            ref, detail = p["packet_id"], f"{p['strength']}, {p['n_items']} items, {p['budget_bytes']} B"
        else:
            ref = ", ".join(sorted(named.get(o["op_id"], [])))
            detail = f"by {o['claimer']}" if o["claimer"] else ""
        entries.append(((o["event_time"], _OPS_ORDER.get(o["op"], 5), o["log_offset"], 0), {
            "at": o["event_time"], "eventSeq": None, "what": o["op"], "ref": ref,
            "action": None, "reason": o["reason"], "detail": detail}))
    entries.sort(key=lambda x: x[0])
    timeline = [e for _, e in entries]
    users = {r.get("user_id") for r in (*segs.values(), *evs.values(), *audits)} - {None}
    return {
        "sessionId": session_id, "userIds": sorted(users),
        "first": timeline[0]["at"], "last": timeline[-1]["at"],
        "counts": {
            "events": len(set(segs) | set(evs)),
            "fired": sum(a["stage"] == "gate" and a["action"] in FIRED for a in audits),
            "packets": sum(o["op"] == "inject" for o in ops),
            "claims": sum(o["op"] == "claim" for o in ops),
            "delivered": sum(e.get("feedback_kind") == "packet_delivered" for e in evs.values()),
        },
        "timeline": timeline,
    }


def user_view(store: AuditStore, user_id: str) -> Row | None:
    """A user's sessions (first and last event time, counts), packets (with claim and
    delivery) and the operators' actions on the user's memories; None if the store knows
    nothing of the user's sessions."""
    segs = _where(store, "segments", "user_id", user_id, "session_id, event_seq, event_time")
    evs = _where(store, "events", "user_id", user_id,
                 "session_id, event_seq, event_time, feedback_kind, feedback_ref")
    audits = _where(store, "audit", "user_id", user_id,
                    "session_id, stage, action, event_time, packet_id, bytes")
    if not (segs or evs or audits):
        return None
    sessions: dict[str, Row] = {}
    seen: set[tuple[str, int]] = set()
    for r in (*segs, *evs, *audits):
        s = sessions.setdefault(r["session_id"], {
            "session_id": r["session_id"], "first": r["event_time"], "last": r["event_time"],
            "events": 0, "fired": 0, "packets": 0, "delivered": 0})
        s["first"], s["last"] = min(s["first"], r["event_time"]), max(s["last"], r["event_time"])
        if "event_seq" in r and (r["session_id"], r["event_seq"]) not in seen:
            seen.add((r["session_id"], r["event_seq"]))
            s["events"] += 1
        s["fired"] += r.get("stage") == "gate" and r["action"] in FIRED
        s["packets"] += r.get("stage") == "broker" and r["action"] == "inject"
        s["delivered"] += r.get("feedback_kind") == "packet_delivered"
    brokers = sorted((a for a in audits if a["stage"] == "broker" and a["packet_id"]),
                     key=lambda a: (a["event_time"], a["packet_id"]))
    ids = [a["packet_id"] for a in brokers]
    packets = {p["packet_id"]: p for p in _where_in(store, "packets", "packet_id", ids)}
    first_items = {i["packet_id"]: i["text"] for i in _where_in(
        store, "packet_items", "packet_id", ids, "packet_id, pos, text") if i["pos"] == 0}
    retired = _retirements(store, ids)
    delivered = {e["feedback_ref"] for e in evs if e["feedback_kind"] == "packet_delivered"}
    out = []
    for a in brokers:
        pid, p = a["packet_id"], packets.get(a["packet_id"], {})
        claim = _pick(retired[pid], op="claim")
        out.append(_camel({
            "packet_id": pid, "session_id": a["session_id"], "event_time": a["event_time"],
            "action": a["action"], "bytes": a["bytes"], "strength": p.get("strength"),
            "n_items": p.get("n_items"), "expiry": p.get("expiry"),
            "first_item": first_items.get(pid), "claimed_by": claim and claim["claimer"],
            "claimed_at": claim and claim["eventTime"], "delivered": pid in delivered}))
    return {"userId": user_id,
            "sessions": [_camel(s) for s in sorted(sessions.values(),
                                                   key=lambda s: (s["first"], s["session_id"]))],
            "packets": out, "operatorActions": operator_actions(store, user_id)}


def recent_sessions(store: AuditStore, limit: int = 50) -> list[Row]:
    """The sessions with the newest events first (every input event has a segment): user,
    first and last event time, and the number of segments."""
    rows = store.rows("""
        SELECT session_id, any_value(user_id) AS user_id, min(event_time) AS first,
               max(event_time) AS last, count(*) AS events
        FROM segments GROUP BY session_id ORDER BY last DESC, session_id LIMIT ?""", [limit])
    return [_camel(r) for r in rows]


def recent_users(store: AuditStore, limit: int = 50) -> list[Row]:
    """The users with the newest events first: sessions, events, last event time."""
    rows = store.rows("""
        SELECT user_id, count(DISTINCT session_id) AS sessions, count(*) AS events,
               max(event_time) AS last
        FROM segments WHERE user_id IS NOT NULL
        GROUP BY user_id ORDER BY last DESC, user_id LIMIT ?""", [limit])
    return [_camel(r) for r in rows]


def operator_actions(store: AuditStore, owner: str) -> list[Row]:
    """What operators did to the owner's memories (source operator: the action, its reason
    and who), newest first."""
    rows = _where(store, "memory_events", "owner", owner,
                  "event_id, memory_id, op, event_time, source, reason, actor")
    return [_camel({k: v for k, v in r.items() if k != "source"})
            for r in sorted(rows, key=lambda r: (-r["event_time"], r["event_id"]))
            if r["source"] == "operator"]


def session_packet_items(store: AuditStore, session_id: str) -> dict[str, list[Row]]:
    """The items of every packet of the session, by packet id, in packet order."""
    ids = [p["packet_id"] for p in _where(store, "packets", "session_id", session_id,
                                          "packet_id")]
    out: dict[str, list[Row]] = {pid: [] for pid in ids}
    for i in sorted(_where_in(store, "packet_items", "packet_id", ids),
                    key=lambda i: (i["packet_id"], i["pos"])):
        out[i["packet_id"]].append(_camel({k: v for k, v in i.items() if k != "packet_id"}))
    return out


def request_of(store: AuditStore, request_id: str) -> Row | None:
    """A recall request as the gate wrote it (for a replay to send again), or None."""
    row = _pick(_where(store, "requests", "request_id", request_id, "value"))
    return None if row is None else json.loads(row["value"])


def replays_of(store: AuditStore, request_id: str) -> list[Row]:
    """The operators' replays of a request, each with who asked for it and its broker answer
    if there is one yet, in the order they were answered."""
    asked = {r["request_id"]: r["replay_by"] for r in _where(
        store, "requests", "replay_of", request_id, "request_id, replay_by")}
    answers = {a["request_id"]: a for a in _where_in(
        store, "audit", "request_id", list(asked), "request_id, stage, action, reason, emit_time")
        if a["stage"] == "broker"}
    out = [{"requestId": i, "by": by, "action": answers.get(i, {}).get("action"),
            "reason": answers.get(i, {}).get("reason"),
            "answeredAt": answers.get(i, {}).get("emit_time")} for i, by in asked.items()]
    return sorted(out, key=lambda r: (r["answeredAt"] is None, r["answeredAt"] or 0,
                                      r["requestId"]))


def recall_diff(store: AuditStore, request_id: str, replay_id: str) -> Row | None:
    """What recall gave a request then and gives it now (an operator's replay): both broker
    answers, and per memory its rank, score and outcome in each, with what changed (same,
    new, gone, or `then -> now` outcomes). None until both answers are in the store."""
    then = _pick(_where(store, "audit", "request_id", request_id), stage="broker")
    now = _pick(_where(store, "audit", "request_id", replay_id), stage="broker")
    if then is None or now is None:
        return None
    before = {c["memoryId"]: c for c in _candidates(store, then["audit_id"])}
    after = {c["memoryId"]: c for c in _candidates(store, now["audit_id"])}
    rows = []
    for mid in [*before, *(m for m in after if m not in before)]:
        b, a = before.get(mid), after.get(mid)
        change = ("new" if b is None else "gone" if a is None else
                  "same" if b["outcome"] == a["outcome"] else f"{b['outcome']} -> {a['outcome']}")
        rows.append({"memoryId": mid, "text": (a or b)["text"],  # type: ignore[index]
                     "revokedSince": (a or b)["revokedSince"],  # type: ignore[index]
                     "then": b and {k: b[k] for k in ("rank", "score", "outcome")},
                     "now": a and {k: a[k] for k in ("rank", "score", "outcome")},
                     "change": change})

    def answer(x: Row) -> Row:
        return _camel({k: x[k] for k in ("request_id", "action", "reason", "packet_id",
                                         "bytes", "tiers", "index_version", "emit_time")})

    return {"sessionId": then["session_id"], "userId": then["user_id"],
            "then": answer(then), "now": answer(now), "candidates": rows}


def inbox_counts(store: AuditStore) -> Row:
    """What the inbox and the hosts' feedback say so far, for metrics: ops by kind, packets
    claimed (the first claim in the log wins each) and packets reported delivered."""
    ops = {r["op"]: r["n"] for r in store.rows("SELECT op, count(*) AS n FROM ops GROUP BY op")}
    claimed = store.rows("""
        SELECT count(DISTINCT p.packet_id) AS n FROM op_packets p JOIN ops o USING (op_id)
        WHERE o.op = 'claim'""")[0]["n"]
    delivered = store.rows("""
        SELECT count(DISTINCT feedback_ref) AS n FROM events
        WHERE feedback_kind = 'packet_delivered'""")[0]["n"]
    return {"ops": ops, "packetsClaimed": claimed, "packetsDelivered": delivered}
