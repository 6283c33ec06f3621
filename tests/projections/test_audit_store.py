"""The audit store and its queries, without Kafka: records the pipeline makes (the in-memory
runner runs the real topology), folded as the sync would fold them."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from audit_pipeline import ATTACK, DAY, FACT, QUESTION, log_records, pipeline_logs

from mnemoflow.agents.inbox import claim_op
from mnemoflow.projections import audit_queries as Q
from mnemoflow.projections.audit_store import AuditStore, LogRecord

from factories import T0

COUNTED = ("events", "segments", "audit", "candidates", "ops", "op_packets", "packets",
           "packet_items", "memory_events", "requests", "skipped")


def _counts(store: AuditStore) -> dict[str, int]:
    return {t: store.count(t) for t in COUNTED}


@pytest.fixture
async def records(tmp_path: Path) -> list[LogRecord]:
    return log_records(await pipeline_logs(tmp_path))


def _packet_of(store: AuditStore, session_id: str) -> str:
    rows = store.rows("SELECT packet_id FROM audit WHERE stage = 'broker' AND session_id = ?",
                      [session_id])
    assert len(rows) == 1 and rows[0]["packet_id"], rows
    return rows[0]["packet_id"]


def test_the_whole_chain_of_a_delivered_packet(records: list[LogRecord]) -> None:
    store = AuditStore(None)
    store.fold(records)
    pid = _packet_of(store, "ask-1")
    c = Q.packet_chain(store, pid)
    assert c is not None and c["sessionId"] == "ask-1" and c["userId"] == "user-1"
    # the event that triggered it
    assert c["trigger"]["text"] == QUESTION and c["trigger"]["type"] == "user_message"
    assert c["trigger"]["eventSeq"] == 2 and c["trigger"]["eventTime"] == T0 + DAY + 1000
    # the gate: fired, with its signals and score
    assert c["gate"]["action"] in Q.FIRED and c["gate"]["requestId"] == c["broker"]["requestId"]
    assert c["gate"]["signals"]["question"] == 1.0 and c["gate"]["score"] > 0
    assert c["tiers"]["lexical"] == "ok"
    # candidates in rank order, with outcomes from rank (duplicate) and safety (injection)
    outcomes = {x["text"]: x["outcome"] for x in c["candidates"]}
    assert outcomes[FACT] == "kept" and outcomes[ATTACK] == "injection"
    assert "duplicate" in outcomes.values()  # the fact extracted from the same sentence
    assert [x["rank"] for x in c["candidates"]] == list(range(len(c["candidates"])))
    assert c["safety"]["verdict"] == "allow-some"
    assert [b["outcome"] for b in c["safety"]["blocked"]] == ["injection"]
    # the packet with its items' provenance, the claim and the delivery
    pkt = c["packet"]
    assert c["broker"]["action"] == "inject" and pkt["strength"] in ("soft_hint", "direct_context")
    assert [i["text"] for i in pkt["items"]] == [FACT]
    assert pkt["items"][0]["sourceSessionId"] == "mem-1" and pkt["budgetBytes"] == len(FACT)
    assert c["claim"]["claimer"] == "memory-runner" and c["lostClaims"] == []
    assert [(f["kind"], f["ref"]) for f in c["feedback"]] == [("packet_delivered", pid)]
    assert c["feedback"][0]["memoryIds"] == [pkt["items"][0]["memoryId"]]


def test_a_shadow_packet_is_audited_never_claimed(records: list[LogRecord]) -> None:
    store = AuditStore(None)
    store.fold(records)
    c = Q.packet_chain(store, _packet_of(store, "ask-2"))
    assert c is not None and c["broker"]["action"] == "shadow"
    assert c["packet"] is None and c["claim"] is None and c["feedback"] == []
    assert c["safety"]["verdict"] == "allow-some" and c["trigger"]["text"] == QUESTION


def test_session_timeline_and_user_view(records: list[LogRecord]) -> None:
    store = AuditStore(None)
    store.fold(records)
    s = Q.session_timeline(store, "ask-1")
    assert s is not None and s["userIds"] == ["user-1"]
    assert [(e["what"], e["action"]) for e in s["timeline"]] == [
        ("lifecycle", None), ("gate", "suppress"), ("user", None),
        ("gate", s["timeline"][3]["action"]), ("broker", "inject"), ("inject", None),
        ("claim", None), ("feedback", None), ("gate", "suppress")]
    assert s["counts"] == {"events": 3, "fired": 1, "packets": 1, "claims": 1, "delivered": 1}
    u = Q.user_view(store, "user-1")
    assert u is not None and [x["sessionId"] for x in u["sessions"]] == ["mem-1", "ask-1"]
    [p] = u["packets"]
    assert p["delivered"] and p["claimedBy"] == "memory-runner" and p["firstItem"] == FACT
    assert Q.user_view(store, "user-2")["packets"][0]["action"] == "shadow"  # type: ignore[index]
    assert Q.session_timeline(store, "nobody") is None and Q.user_view(store, "nobody") is None
    assert Q.packet_chain(store, "pkt:nothing") is None


def test_refolding_is_idempotent(records: list[LogRecord]) -> None:
    store = AuditStore(None)
    store.fold(records)
    counts, pid = _counts(store), _packet_of(store, "ask-1")
    chain, offsets = Q.packet_chain(store, pid), store.offsets()
    # the same records again, in other batches and orders: nothing changes
    shuffled = list(records)
    random.Random(3).shuffle(shuffled)
    for i in range(0, len(shuffled), 7):
        assert not any(store.fold(shuffled[i:i + 7]).values())
    assert _counts(store) == counts and store.offsets() == offsets
    # redelivered at later offsets (a crashed stage writes its outputs again): same rows
    later = [r._replace(offset=r.offset + 1000) for r in records]
    store.fold(later)
    assert _counts(store) == counts and Q.packet_chain(store, pid) == chain
    assert all(o == offsets[k] + 1000 for k, o in store.offsets().items())


def test_offsets_are_kept_with_the_data_in_one_transaction(
        records: list[LogRecord], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "audit" / "app.duckdb"
    half = len(records) // 2
    with AuditStore(path, source="t.") as store:
        store.fold(records[:half])
        counts, offsets = _counts(store), store.offsets()
    assert offsets == _next(records[:half])
    with AuditStore(path, source="t.") as store:  # reopened: both survived
        assert _counts(store) == counts and store.offsets() == offsets
        real = AuditStore._insert

        def crash_on_ops(self: AuditStore, table: Any, rows: list[dict[str, Any]]) -> int:
            if table.name == "ops":
                raise OSError("disk full")
            return real(self, table, rows)

        monkeypatch.setattr(AuditStore, "_insert", crash_on_ops)
        with pytest.raises(OSError):
            store.fold(records[half:])  # its audit and segment rows went in before the crash
        assert _counts(store) == counts and store.offsets() == offsets
        monkeypatch.undo()
        store.fold(records[half:])
        assert store.offsets() == _next(records)
    with AuditStore(path, source="t.") as store:
        assert store.count("audit") == sum(r.topic == "audit" for r in records)


def _next(records: list[LogRecord]) -> dict[tuple[str, int], int]:
    out: dict[tuple[str, int], int] = {}
    for r in records:
        out[(r.topic, r.partition)] = max(out.get((r.topic, r.partition), 0), r.offset + 1)
    return out


def test_rebuild_drops_the_file_and_other_topics_start_empty(
        records: list[LogRecord], tmp_path: Path) -> None:
    path = tmp_path / "app.duckdb"
    with AuditStore(path, source="t.") as store:
        store.fold(records)
        assert store.count("audit") > 0
        store.rebuild()
        assert store.offsets() == {} and store.count("audit") == 0 and path.exists()
        store.fold(records)
    with AuditStore(path, source="other.") as store:  # another prefix: its offsets mean nothing
        assert store.offsets() == {} and store.count("audit") == 0


def test_the_first_claim_after_the_inject_wins(records: list[LogRecord]) -> None:
    store = AuditStore(None)
    store.fold(records)
    pid = _packet_of(store, "ask-1")
    inject = store.rows("SELECT part, log_offset FROM ops WHERE packet_id = ?", [pid])[0]
    ends = store.offsets()
    part, end = inject["part"], ends[("inbox", inject["part"])]
    early = claim_op("op:early", "ask-1", [pid], T0, "host-early")  # before the inject: no-op
    store.fold([LogRecord("inbox", part, end, claim_op("op:late", "ask-1", [pid], T0 + DAY + 5,
                                                       "host-late"))])
    # written with an offset below the inject's (a log that had it first)
    store.con.execute("INSERT INTO ops VALUES ('op:early', 'claim', 'ask-1', ?, NULL, "
                      "'host-early', NULL, NULL, ?, -1)", [early["eventTime"], part])
    store.con.execute("INSERT INTO op_packets VALUES ('op:early', ?, ?, -1)", [pid, part])
    c = Q.packet_chain(store, pid)
    assert c["claim"]["claimer"] == "memory-runner"  # type: ignore[index]
    assert [x["claimer"] for x in c["lostClaims"]] == ["host-late"]  # type: ignore[index]


def test_undecodable_records_are_counted_and_passed(records: list[LogRecord]) -> None:
    store = AuditStore(None)
    store.fold([LogRecord("audit", 1, 41, None, "bad-magic")])
    assert store.count("skipped") == 1 and store.offsets() == {("audit", 1): 42}
    with pytest.raises(ValueError, match="does not fold"):
        store.fold([LogRecord("dead-letter", 0, 0, {})])


def test_packets_are_found_by_the_start_of_their_id(records: list[LogRecord]) -> None:
    store = AuditStore(None)
    store.fold(records)
    pid = _packet_of(store, "ask-1")
    assert Q.resolve_packet(store, pid) == [pid]
    assert Q.resolve_packet(store, pid[:12]) == [pid]
    assert len(Q.resolve_packet(store, "pkt:")) == 2  # ask-1's and ask-2's (shadow)
    assert Q.resolve_packet(store, "pkt:zzz") == []


@pytest.mark.parametrize(("action", "reason", "verdict"), [
    ("inject", "warm", "allow"), ("shadow", "packet-patch-none", "allow"),
    ("suppress", "injection", "suppress"), ("suppress", "empty", "nothing-to-check"),
    ("suppress", "weak", "nothing-to-check"),
    ("ask", "high-risk-procedure", "ask"), ("drop", "stale-context", "not-checked")])
def test_safety_verdict(action: str, reason: str, verdict: str) -> None:
    kept = [{"memoryId": "m1", "outcome": "kept", "stage": "kept"}]
    assert Q.safety_verdict({"action": action, "reason": reason}, kept)["verdict"] == verdict  # type: ignore[index]
    assert Q.safety_verdict(None, kept) is None


def test_the_store_and_its_queries_import_no_kafka_client() -> None:
    """Testable and usable without a broker: Kafka is read only by streams/audit_sync.py."""
    probe = ("import json, sys; import mnemoflow.projections.audit_queries; "
             "print(json.dumps(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True).stdout
    loaded = json.loads(out.strip().splitlines()[-1])
    assert "mnemoflow.projections.audit_store" in loaded
    assert not [m for m in loaded if m.split(".")[0] in ("aiokafka", "kafka", "faust")]
