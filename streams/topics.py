"""The topic catalogue: one place that says which topics exist and how they are kept."""

from __future__ import annotations

from dataclasses import dataclass

from mnemoflow.streams.config import Settings

FOREVER = -1
WEEK_MS = 7 * 24 * 3600 * 1000


@dataclass(frozen=True)
class TopicSpec:
    """One topic: its base name, the Avro record of its values, the key and how long it is kept."""

    base: str
    value_schema: str
    key: str
    cleanup: str = "delete"
    retention_ms: int = WEEK_MS
    partitions: int | None = None  # None: the configured default
    doc: str = ""
    extra: tuple[tuple[str, str], ...] = ()  # more topic configs

    def name(self, settings: Settings) -> str:
        return settings.topic(self.base)

    def configs(self) -> dict[str, str]:
        return {"cleanup.policy": self.cleanup, "retention.ms": str(self.retention_ms),
                **dict(self.extra)}


SESSION_EVENTS = TopicSpec("session-events", "io.mnemoflow.SessionEvent", "sessionId",
                           doc="user messages, lifecycle, feedback from the host")
TOOL_RESULTS = TopicSpec("tool-results", "io.mnemoflow.ToolResult", "sessionId",
                         doc="frozen tool observations (ok/error/retry/cancel)")
AGENT_STEPS = TopicSpec("agent-steps", "io.mnemoflow.AgentStep", "sessionId",
                        doc="step boundaries and visible assistant output")
SEGMENTS = TopicSpec("segments", "io.mnemoflow.Segment", "sessionId",
                     doc="observer output: envelope + sliced text + entities")
RECALL_REQUESTS = TopicSpec("recall-requests", "io.mnemoflow.RecallRequest", "userId",
                            doc="gate decisions worth a recall (retrieve/prefetch), keyed by the "
                                "user so that recall runs where the user's memory-log partition is")
INBOX = TopicSpec("inbox", "io.mnemoflow.InboxOp", "sessionId", retention_ms=FOREVER,
                  doc="inject/steer/claim/remove/expire; pending = fold of the log")
INBOX_CHECKPOINTS = TopicSpec("inbox-checkpoints", "io.mnemoflow.InboxCheckpoint",
                              "inbox partition (record partition = inbox partition)",
                              cleanup="compact", retention_ms=FOREVER,
                              doc="host-written folds of inbox partitions; derived, deletable")
AUDIT = TopicSpec("audit", "io.mnemoflow.AuditRecord", "sessionId", retention_ms=30 * 24 * 3600 * 1000,
                  doc="every gate and injection decision, digests not raw text")
MEMORY_LOG = TopicSpec("memory-log", "io.mnemoflow.MemoryEvent", "scope owner (a user id)",
                       retention_ms=FOREVER,
                       doc="source of truth for users' long-term memory (scopes User, External), "
                           "keyed by the user: co-partitioned with recall-requests")
MEMORY_SHARED = TopicSpec("memory-shared", "io.mnemoflow.MemoryEvent", "scope owner",
                          retention_ms=FOREVER, partitions=1,
                          doc="source of truth for memories of the other scopes (Session, "
                              "Workspace, Turn); every worker folds all of it")
MEMORY_VECTORS = TopicSpec("memory-vectors", "io.mnemoflow.MemoryVector",
                           "memoryId (record partition = its memory-log partition)",
                           cleanup="compact", retention_ms=FOREVER,
                           doc="embeddings, written once by the partition's owner; derived, "
                               "deletable")
MEMORY_KEYS = TopicSpec("memory-keys", "io.mnemoflow.OwnerKey",
                        "epoch:proposalId:owner (a key) or epoch:forgotten:owner",
                        cleanup="compact", retention_ms=FOREVER, partitions=1,
                        # a shredded key's bytes leave the broker's disks at the next clean:
                        # segments roll hourly and any dirt makes a log cleanable
                        extra=(("segment.ms", str(3600 * 1000)),
                               ("min.cleanable.dirty.ratio", "0.01"),
                               ("delete.retention.ms", str(24 * 3600 * 1000))),
                        doc="per-owner data keys that seal memory text, wrapped by the "
                            "key-encryption key; a tombstone shreds a key (forget a user)")
DEAD_LETTER = TopicSpec("dead-letter", "io.mnemoflow.DeadLetter", "source key (raw)",
                        retention_ms=30 * 24 * 3600 * 1000,
                        doc="undecodable or invalid records, with reason and original bytes")

CATALOGUE: tuple[TopicSpec, ...] = (
    SESSION_EVENTS, TOOL_RESULTS, AGENT_STEPS, SEGMENTS, RECALL_REQUESTS,
    INBOX, INBOX_CHECKPOINTS, AUDIT, MEMORY_LOG, MEMORY_SHARED, MEMORY_VECTORS, MEMORY_KEYS,
    DEAD_LETTER,
)
# topics whose partition N holds the same keys: a user's requests, memories and vectors
CO_PARTITIONED = (RECALL_REQUESTS, MEMORY_LOG, MEMORY_VECTORS)
INPUT_TOPICS = (SESSION_EVENTS, TOOL_RESULTS, AGENT_STEPS)
# the Avro record of each topic's values, by base name
VALUE_SCHEMA: dict[str, str] = {spec.base: spec.value_schema for spec in CATALOGUE}
