"""The audit store: the audit, inbox, segment, session-event, memory and recall-request topics
folded into one embedded DuckDB file, for `mnemoflow audit` and the console (queries in
`projections/audit_queries.py`).

The file is derived data, rebuilt from the topics at will. Each table's primary key is the
record's own id (auditId, opId, segmentId, (sessionId, eventSeq), eventId, requestId), and
every insert ignores a key it already holds, so folding a record twice (a redelivery, a sync
that re-reads) changes nothing. The next offset to read of every topic partition is kept in
the same file and written in the same transaction as the rows of the records below it: a
crash rolls back both, so the store never holds a record it would read again as new, nor an
offset past a lost row.

Nothing here reads Kafka: `fold` takes decoded records (`LogRecord`); `streams/audit_sync.py`
is the I/O. Rows go in through Arrow, one INSERT per table per batch: DuckDB's row-by-row
`executemany` is two orders of magnitude slower.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import duckdb
import pyarrow as pa

from mnemoflow.agents.sealing import FORGET_OP

# bumped whenever a table changes: a file of another layout is emptied and folded again
LAYOUT = "4"
# the topics folded, by base name (memory-shared holds the Session and Workspace memories)
TOPICS = ("session-events", "segments", "audit", "inbox", "memory-log", "memory-shared",
          "recall-requests")

_S = ("VARCHAR", pa.string())
_I = ("INTEGER", pa.int32())
_L = ("BIGINT", pa.int64())
_F = ("DOUBLE", pa.float64())
_B = ("BOOLEAN", pa.bool_())
_LS = ("VARCHAR[]", pa.list_(pa.string()))
_LL = ("BIGINT[]", pa.list_(pa.int64()))
_MF = ("MAP(VARCHAR, DOUBLE)", pa.map_(pa.string(), pa.float64()))
_MS = ("MAP(VARCHAR, VARCHAR)", pa.map_(pa.string(), pa.string()))


@dataclass(frozen=True)
class Table:
    name: str
    columns: tuple[tuple[str, tuple[str, pa.DataType]], ...]
    key: tuple[str, ...]

    def ddl(self) -> str:
        cols = ", ".join(f"{n} {t[0]}" for n, t in self.columns)
        return f"CREATE TABLE IF NOT EXISTS {self.name} ({cols}, PRIMARY KEY ({', '.join(self.key)}))"

    def arrow(self, rows: list[dict[str, Any]]) -> pa.Table:
        return pa.Table.from_pylist(rows, schema=pa.schema([(n, t[1]) for n, t in self.columns]))


TABLES = (
    Table("events", (  # session-events: what the host wrote
        ("session_id", _S), ("event_seq", _L), ("user_id", _S), ("agent_id", _S),
        ("workspace_id", _S), ("type", _S), ("turn", _I), ("step", _I), ("event_time", _L),
        ("text", _S), ("provenance", _S), ("lifecycle", _S), ("feedback_kind", _S),
        ("feedback_ref", _S), ("memory_ids", _LS)), ("session_id", "event_seq")),
    Table("segments", (  # the observer's slice of every input event (tool results and steps too)
        ("segment_id", _S), ("session_id", _S), ("user_id", _S), ("event_seq", _L), ("turn", _I),
        ("step", _I), ("source_kind", _S), ("kind", _S), ("text", _S), ("digest", _S),
        ("event_time", _L), ("context_version", _L), ("provenance", _S), ("tool_name", _S),
        ("ok", _B), ("feedback_kind", _S), ("feedback_ref", _S), ("ingest_time", _L)),
     ("segment_id",)),
    Table("audit", (  # one row per gate or broker decision
        ("audit_id", _S), ("session_id", _S), ("user_id", _S), ("stage", _S), ("action", _S),
        ("reason", _S), ("event_time", _L), ("event_seq", _L), ("context_version", _L),
        ("segment_id", _S), ("segment_digest", _S), ("request_id", _S), ("packet_id", _S),
        ("score", _F), ("signals", _MF), ("source_seqs", _LL), ("bytes", _I), ("expiry", _L),
        ("tiers", _MS), ("index_version", _S), ("ingest_time", _L), ("emit_time", _L)),
     ("audit_id",)),
    Table("candidates", (  # a broker record's ranked candidates, in rank order
        ("audit_id", _S), ("rank", _I), ("memory_id", _S), ("score", _F), ("outcome", _S),
        ("digest", _S), ("provenance", _S), ("scope", _S), ("owner", _S), ("tiers", _LS)),
     ("audit_id", "rank")),
    Table("ops", (  # inbox ops, with their log position: the first claim in the log wins
        ("op_id", _S), ("op", _S), ("session_id", _S), ("event_time", _L), ("packet_id", _S),
        ("claimer", _S), ("reason", _S), ("authorised_by", _S), ("part", _I),
        ("log_offset", _L)), ("op_id",)),
    Table("op_packets", (  # the packet ids each op names (claim, expire, remove, inject, steer)
        ("op_id", _S), ("packet_id", _S), ("part", _I), ("log_offset", _L)),
     ("op_id", "packet_id")),
    Table("packets", (  # the MemoryPacket of every inject or steer op
        ("packet_id", _S), ("op_id", _S), ("session_id", _S), ("request_id", _S),
        ("strength", _S), ("trigger_reason", _S), ("context_cursor", _L),
        ("retrieval_version", _S), ("exact_digest", _S), ("semantic_digest", _S),
        ("budget_bytes", _I), ("created_at", _L), ("expiry", _L), ("n_items", _I)),
     ("packet_id",)),
    Table("packet_items", (
        ("packet_id", _S), ("pos", _I), ("memory_id", _S), ("kind", _S), ("text", _S),
        ("scope", _S), ("owner", _S), ("score", _F), ("source_seq", _L),
        ("source_session_id", _S), ("provenance", _S), ("event_time", _L), ("digest", _S),
        ("tiers", _LS)), ("packet_id", "pos")),
    Table("memory_events", (  # memory-log and memory-shared: candidates' text and revocations
        ("event_id", _S), ("memory_id", _S), ("op", _S), ("kind", _S), ("scope", _S),
        ("owner", _S), ("session_id", _S), ("event_seq", _L), ("event_time", _L), ("text", _S),
        ("source", _S), ("reason", _S), ("actor", _S)), ("event_id",)),
    Table("requests", (  # recall-requests: the gate's requests whole (a replay re-sends one)
        ("request_id", _S), ("session_id", _S), ("user_id", _S), ("event_time", _L),
        ("event_seq", _L), ("replay_of", _S), ("replay_by", _S), ("value", _S)),
     ("request_id",)),
    Table("skipped", (  # records that did not decode: counted, never retried
        ("topic", _S), ("part", _I), ("log_offset", _L), ("error", _S)),
     ("topic", "part", "log_offset")),
)
BY_NAME = {t.name: t for t in TABLES}
# the single-column lookups the queries make. DuckDB uses an ART index for `col = ?` and
# `list_contains(?, col)` at run time (EXPLAIN still says Seq Scan): at 1M rows a lookup takes
# ~1 ms with one, ~9 ms without
INDEXES = (("audit", "packet_id"), ("audit", "request_id"), ("audit", "session_id"),
           ("audit", "user_id"), ("candidates", "audit_id"), ("events", "session_id"),
           ("events", "user_id"), ("segments", "session_id"), ("segments", "user_id"),
           ("ops", "session_id"), ("op_packets", "packet_id"), ("op_packets", "op_id"),
           ("packets", "session_id"), ("packet_items", "packet_id"),
           ("memory_events", "memory_id"), ("memory_events", "owner"),
           ("requests", "replay_of"))


class LogRecord(NamedTuple):
    """One record of a topic (by base name), decoded, or with why it was not."""

    topic: str
    partition: int
    offset: int
    value: dict[str, Any] | None
    error: str | None = None


class StoreBusy(RuntimeError):
    """Another process holds the store's file (DuckDB allows one writer)."""


def _event_rows(v: dict[str, Any], out: dict[str, list[dict[str, Any]]]) -> None:
    ids = (v.get("attributes") or {}).get("memoryIds") or ""
    out["events"].append({
        "session_id": v["sessionId"], "event_seq": v["eventSeq"], "user_id": v["userId"],
        "agent_id": v["agentId"], "workspace_id": v.get("workspaceId"), "type": v["type"],
        "turn": v["turn"], "step": v["step"], "event_time": v["eventTime"],
        "text": v.get("text"), "provenance": v.get("provenance"), "lifecycle": v.get("lifecycle"),
        "feedback_kind": v.get("feedbackKind"), "feedback_ref": v.get("feedbackRef"),
        "memory_ids": [i for i in ids.split(",") if i]})


def _segment_rows(v: dict[str, Any], out: dict[str, list[dict[str, Any]]]) -> None:
    env = v["envelope"]
    out["segments"].append({
        "segment_id": v["segmentId"], "session_id": env["sessionId"], "user_id": v["userId"],
        "event_seq": env["eventSeq"], "turn": env["turn"], "step": env["step"],
        "source_kind": env["sourceKind"], "kind": v["kind"], "text": v["text"],
        "digest": v["digest"], "event_time": v["eventTime"],
        "context_version": v["contextVersion"], "provenance": v["provenance"],
        "tool_name": v.get("toolName"), "ok": v.get("ok"), "feedback_kind": v.get("feedbackKind"),
        "feedback_ref": v.get("feedbackRef"), "ingest_time": v.get("ingestTime", 0)})


def _audit_rows(v: dict[str, Any], out: dict[str, list[dict[str, Any]]]) -> None:
    out["audit"].append({
        "audit_id": v["auditId"], "session_id": v["sessionId"], "user_id": v["userId"],
        "stage": v["stage"], "action": v["action"], "reason": v["reason"],
        "event_time": v["eventTime"], "event_seq": v["eventSeq"],
        "context_version": v["contextVersion"], "segment_id": v.get("segmentId"),
        "segment_digest": v.get("segmentDigest"), "request_id": v.get("requestId"),
        "packet_id": v.get("packetId"), "score": v.get("score", 0.0),
        "signals": list((v.get("signals") or {}).items()), "source_seqs": v.get("sourceSeqs") or [],
        "bytes": v.get("bytes", 0), "expiry": v.get("expiry", 0),
        "tiers": list((v.get("tiers") or {}).items()), "index_version": v.get("indexVersion"),
        "ingest_time": v.get("ingestTime", 0), "emit_time": v.get("emitTime", 0)})
    for rank, c in enumerate(v.get("candidates") or []):
        out["candidates"].append({
            "audit_id": v["auditId"], "rank": rank, "memory_id": c["memoryId"],
            "score": c["score"], "outcome": c["outcome"], "digest": c["digest"],
            "provenance": c["provenance"], "scope": c["scope"], "owner": c["owner"],
            "tiers": c.get("tiers") or []})


def _op_rows(v: dict[str, Any], part: int, offset: int,
             out: dict[str, list[dict[str, Any]]]) -> None:
    p = v.get("packet")
    pid = p["packetId"] if p else None
    out["ops"].append({
        "op_id": v["opId"], "op": v["op"], "session_id": v["sessionId"],
        "event_time": v["eventTime"], "packet_id": pid, "claimer": v.get("claimer"),
        "reason": v.get("reason"), "authorised_by": v.get("authorisedBy"), "part": part,
        "log_offset": offset})
    for named in dict.fromkeys([*(v.get("packetIds") or []), *([pid] if pid else [])]):
        out["op_packets"].append({"op_id": v["opId"], "packet_id": named, "part": part,
                                  "log_offset": offset})
    if p is None:
        return
    out["packets"].append({
        "packet_id": pid, "op_id": v["opId"], "session_id": p["sessionId"],
        "request_id": p["requestId"], "strength": p["strength"],
        "trigger_reason": p["triggerReason"], "context_cursor": p["contextCursor"],
        "retrieval_version": p["retrievalVersion"], "exact_digest": p["exactDigest"],
        "semantic_digest": p["semanticDigest"], "budget_bytes": p["budgetBytes"],
        "created_at": p["createdAt"], "expiry": p["expiry"], "n_items": len(p["items"])})
    for pos, i in enumerate(p["items"]):
        out["packet_items"].append({
            "packet_id": pid, "pos": pos, "memory_id": i["memoryId"], "kind": i["kind"],
            "text": i["text"], "scope": i["scope"], "owner": i["owner"], "score": i["score"],
            "source_seq": i["sourceSeq"], "source_session_id": i["sourceSessionId"],
            "provenance": i["provenance"], "event_time": i["eventTime"], "digest": i["digest"],
            "tiers": i.get("tiers") or []})


def _memory_rows(v: dict[str, Any], out: dict[str, list[dict[str, Any]]]) -> None:
    attrs = v.get("attributes") or {}  # an operator's action carries its reason and name
    out["memory_events"].append({
        "event_id": v["eventId"], "memory_id": v["memoryId"], "op": v["op"], "kind": v["kind"],
        "scope": v["scope"], "owner": v["owner"], "session_id": v["sessionId"],
        "event_seq": v["eventSeq"], "event_time": v["eventTime"], "text": v.get("text") or "",
        "source": v.get("source", "user"), "reason": attrs.get("reason", ""),
        "actor": attrs.get("actor", "")})


def _request_rows(v: dict[str, Any], out: dict[str, list[dict[str, Any]]]) -> None:
    out["requests"].append({
        "request_id": v["requestId"], "session_id": v["sessionId"], "user_id": v["userId"],
        "event_time": v["eventTime"], "event_seq": v["eventSeq"],
        "replay_of": v.get("replayOf"), "replay_by": v.get("replayBy"),
        "value": json.dumps(v, sort_keys=True)})


def rows_of(records: Iterable[LogRecord]) -> dict[str, list[dict[str, Any]]]:
    """The table rows of some records, by table name (pure; exposed for tests and benches)."""
    out: dict[str, list[dict[str, Any]]] = {t.name: [] for t in TABLES}
    for r in records:
        v = r.value
        if v is None:
            out["skipped"].append({"topic": r.topic, "part": r.partition, "log_offset": r.offset,
                                   "error": r.error or "undecodable"})
        elif r.topic == "session-events":
            _event_rows(v, out)
        elif r.topic == "segments":
            _segment_rows(v, out)
        elif r.topic == "audit":
            _audit_rows(v, out)
        elif r.topic == "inbox":
            _op_rows(v, r.partition, r.offset, out)
        elif r.topic in ("memory-log", "memory-shared"):
            _memory_rows(v, out)
        elif r.topic == "recall-requests":
            _request_rows(v, out)
        else:
            raise ValueError(f"the audit store does not fold topic {r.topic!r}")
    return out


def forgotten_owners(records: Iterable[LogRecord]) -> list[str]:
    """The owners these records forget (`owner_forgotten` on a memory topic)."""
    return sorted({str(r.value["owner"]) for r in records
                   if r.value is not None and r.topic in ("memory-log", "memory-shared")
                   and r.value.get("op") == FORGET_OP})


def next_offsets(records: Iterable[LogRecord]) -> dict[tuple[str, int], int]:
    """(topic, partition) -> the offset after the last of these records."""
    nxt: dict[tuple[str, int], int] = {}
    for r in records:
        k = (r.topic, r.partition)
        if r.offset + 1 > nxt.get(k, -1):
            nxt[k] = r.offset + 1
    return nxt


class AuditStore:
    """One DuckDB connection over the store's file (or memory, with `path=None`).

    `source` names where the offsets point (the topic prefix): a file folded from other
    topics, or of another layout, is emptied when opened, since its offsets mean nothing here.
    """

    def __init__(self, path: Path | None, source: str = "") -> None:
        self.path = path
        self.source = source
        self.forgets_seen = 0  # owner_forgotten events folded by this object
        self.con = self._connect()
        self._prepare()

    def _connect(self) -> duckdb.DuckDBPyConnection:
        if self.path is None:
            return duckdb.connect(":memory:")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            return duckdb.connect(str(self.path))
        except duckdb.IOException as exc:
            if "lock" in str(exc).lower():
                raise StoreBusy(f"{self.path} is open in another process (an audit sync "
                                f"running?): try again when it is done") from None
            raise

    def _prepare(self) -> None:
        con = self.con
        con.execute("CREATE TABLE IF NOT EXISTS meta (key VARCHAR PRIMARY KEY, value VARCHAR)")
        got = dict(con.execute("SELECT key, value FROM meta").fetchall())
        if got and (got.get("layout") != LAYOUT or got.get("source") != self.source):
            self._drop_tables()
        con.execute("CREATE TABLE IF NOT EXISTS offsets (topic VARCHAR, part INTEGER, "
                    "next_offset BIGINT NOT NULL, PRIMARY KEY (topic, part))")
        for t in TABLES:
            con.execute(t.ddl())
        for table, col in INDEXES:
            con.execute(f"CREATE INDEX IF NOT EXISTS {table}_{col} ON {table} ({col})")
        con.execute("INSERT OR REPLACE INTO meta VALUES ('layout', ?), ('source', ?)",
                    [LAYOUT, self.source])

    def _drop_tables(self) -> None:
        for name in ("offsets", *BY_NAME):
            self.con.execute(f"DROP TABLE IF EXISTS {name} CASCADE")
        self.con.execute("DELETE FROM meta")

    def close(self) -> None:
        self.con.close()

    def __enter__(self) -> AuditStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def rebuild(self) -> None:
        """Start over empty: the file (and its write-ahead log) is deleted and made anew."""
        if self.path is None:
            self._drop_tables()
            self._prepare()
            return
        self.con.close()
        for f in (self.path, self.path.with_name(self.path.name + ".wal")):
            f.unlink(missing_ok=True)
        self.con = self._connect()
        self._prepare()

    def offsets(self) -> dict[tuple[str, int], int]:
        """(topic, partition) -> the next offset to read."""
        return {(t, p): o for t, p, o in
                self.con.execute("SELECT topic, part, next_offset FROM offsets").fetchall()}

    def fold(self, records: Sequence[LogRecord]) -> dict[str, int]:
        """Add these records and move their partitions' offsets past them, in one
        transaction. Returns the rows added per table (rows already there are not counted)."""
        if not records:
            return {}
        tables = rows_of(records)
        nxt = next_offsets(records)
        con = self.con
        added: dict[str, int] = {}
        con.begin()
        try:
            for name, rows in tables.items():
                if rows:
                    added[name] = self._insert(BY_NAME[name], rows)
            # a forgotten owner's memory events go (their text among them); a rebuild of the
            # file, which `streams.audit_sync` then makes, leaves none of their bytes either
            for owner in forgotten_owners(records):
                con.execute("DELETE FROM memory_events WHERE owner = ? AND op <> ?",
                            [owner, FORGET_OP])
                self.forgets_seen += 1
            # an offset never moves back: records folded again from below it leave it be
            con.executemany(
                "INSERT INTO offsets VALUES (?, ?, ?) ON CONFLICT (topic, part) DO UPDATE "
                "SET next_offset = greatest(offsets.next_offset, excluded.next_offset)",
                [[t, p, o] for (t, p), o in sorted(nxt.items())])
            con.commit()
        except BaseException:
            con.rollback()
            raise
        return added

    def _insert(self, table: Table, rows: list[dict[str, Any]]) -> int:
        before = self.count(table.name)
        cols = ", ".join(n for n, _ in table.columns)
        self.con.register("fold_batch", table.arrow(rows))
        try:
            self.con.execute(
                f"INSERT OR IGNORE INTO {table.name} ({cols}) SELECT {cols} FROM fold_batch")
        finally:
            self.con.unregister("fold_batch")
        return self.count(table.name) - before

    def count(self, table: str) -> int:
        if table not in BY_NAME and table != "offsets":
            raise ValueError(f"no table {table!r}")
        # fetchall: DuckDB 2 refuses other work on a connection with a result not read to the end
        return int(self.con.execute(f"SELECT count(*) FROM {table}").fetchall()[0][0])

    def rows(self, sql: str, params: Sequence[object] = ()) -> list[dict[str, Any]]:
        """The result of a query as dicts (DuckDB gives MAP columns as dicts, lists as lists)."""
        cur = self.con.execute(sql, list(params))
        cols = [d[0] for d in cur.description or ()]
        return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]
