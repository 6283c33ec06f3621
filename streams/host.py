"""Host SDK, producing side (N-01): append session events, tool results and agent steps.

Each session numbers its events (eventSeq) in one sequence across the three topics, and all
three are keyed by sessionId, so the worker sees one session's events in order per topic.
The inbox side (claim / assemble / build_request) lives in `mnemoflow.streams.inbox`.
`HostClient.remember/revoke/alias/confirm/approve_procedure` write long-term memory directly
to the memory-log (source "host", keyed by the scope owner), for hosts that know better than
the rule-based extraction.

Starting checks that the topics the client writes exist (TopicsMissing otherwise, at once,
rather than every send waiting on metadata that never comes), and every call that waits on
the broker gives up after `timeout_s` with BrokerUnavailable.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mnemoflow.agents import memory_events as M
from mnemoflow.agents.partitioning import memory_topic
from mnemoflow.streams import topics as T
from mnemoflow.streams.config import Settings

if TYPE_CHECKING:
    from mnemoflow.streams.producer import AvroProducer

SCHEMA_VERSION = 1
OWED_CAP = 256  # events a step boundary's wait can ask about (agents.decisions.KEEP)


@dataclass(frozen=True)
class CapabilityManifest:
    """C-07, declared by the host's adapter; nothing is ever inferred from `model`."""

    provider: str = ""
    model: str = ""
    reasoning: str = "unknown"  # none | summary | full | unknown
    includeRuntimeContext: bool = True  # noqa: N815 - Avro field names
    complete: bool = False
    supportsPreStep: bool = False  # noqa: N815
    supportsUserMessage: bool = False  # noqa: N815
    abortAndResume: bool = False  # noqa: N815

    def to_record(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class HostSession:
    """One agent session's producer handle; `turn`/`step` follow the host's loop."""

    client: HostClient
    session_id: str
    user_id: str
    agent_id: str = "agent"
    workspace_id: str | None = None
    turn: int = 0
    step: int = 0
    _seq: itertools.count = field(default_factory=lambda: itertools.count(1))
    last_seq: int = 0
    # events written since the last `take_owed` that the gate may fire on (messages, tool
    # results, steps with text); lifecycle and feedback events are always suppressed
    owed: list[int] = field(default_factory=list)

    @property
    def decision_seq(self) -> int:
        """The eventSeq of the latest event the gate has to decide about (0: none yet)."""
        return self.owed[-1] if self.owed else 0

    def take_owed(self) -> tuple[int, ...]:
        """The events whose decision a step boundary waits for; the list starts again."""
        out, self.owed = tuple(self.owed), []
        return out

    def _header(self, event_time: int, event_seq: int | None, owed: bool = False) -> dict[str, Any]:
        seq = event_seq if event_seq is not None else next(self._seq)
        self.last_seq = max(self.last_seq, seq)
        if owed:
            # bounded: a host that never waits must not grow it (a wait asks the newest only)
            self.owed = [*self.owed[-OWED_CAP + 1:], seq]
        return {"schemaVersion": SCHEMA_VERSION, "sessionId": self.session_id,
                "agentId": self.agent_id, "userId": self.user_id,
                "workspaceId": self.workspace_id, "eventSeq": seq, "turn": self.turn,
                "step": self.step, "eventTime": int(event_time)}

    async def _session_event(self, event_time: int, etype: str, event_seq: int | None = None,
                             **fields: Any) -> dict[str, Any]:
        owed = etype in ("user_message", "assistant_message")
        rec = {**self._header(event_time, event_seq, owed), "type": etype, "text": None,
               "provenance": None, "lifecycle": None, "capability": None, "feedbackKind": None,
               "feedbackRef": None, "attributes": {}, **fields}
        await self.client.producer.send(T.SESSION_EVENTS.name(self.client.settings),
                                        "io.mnemoflow.SessionEvent", self.session_id, rec)
        return rec

    async def user_message(self, text: str, event_time: int, provenance: str | None = None,
                           event_seq: int | None = None, remember: bool = True) -> dict[str, Any]:
        """`remember=False` marks the message ephemeral: observed and recalled for, never stored."""
        self.turn += 1
        self.step = 0
        return await self._session_event(event_time, "user_message", event_seq, text=text,
                                         provenance=provenance,
                                         attributes={} if remember else {"memory": "off"})

    async def assistant_message(self, text: str, event_time: int,
                                provenance: str | None = None) -> dict[str, Any]:
        return await self._session_event(event_time, "assistant_message", text=text,
                                         provenance=provenance)

    async def lifecycle(self, action: str, event_time: int,
                        capability: CapabilityManifest | None = None) -> dict[str, Any]:
        return await self._session_event(
            event_time, "lifecycle", lifecycle=action,
            capability=capability.to_record() if capability else None)

    async def feedback(self, kind: str, ref: str, event_time: int,
                       memory_ids: Sequence[str] = ()) -> dict[str, Any]:
        """packet_delivered | packet_ignored | correction, about a packet id or digest.

        `memory_ids` (the packet's items, or the memories a correction disputes) travel in
        `attributes["memoryIds"]`, comma-joined: the evidence updater (G-01) credits tool
        outcomes to them and sends corrections to the conflict set."""
        attrs = {"memoryIds": ",".join(memory_ids)} if memory_ids else {}
        return await self._session_event(event_time, "feedback", feedbackKind=kind,
                                         feedbackRef=ref, attributes=attrs)

    async def tool_result(self, call_id: str, tool_name: str, status: str, event_time: int,
                          output: str | None = None, error: str | None = None,
                          root_call_id: str | None = None, parent_call_id: str | None = None,
                          attempt: int = 1, memory_refs: list[str] | None = None) -> dict[str, Any]:
        rec = {**self._header(event_time, None, owed=True), "callId": call_id, "rootCallId": root_call_id,
               "parentCallId": parent_call_id, "toolName": tool_name, "status": status,
               "attempt": attempt, "output": output, "error": error,
               "memoryRefs": memory_refs or []}
        await self.client.producer.send(T.TOOL_RESULTS.name(self.client.settings),
                                        "io.mnemoflow.ToolResult", self.session_id, rec)
        return rec

    async def agent_step(self, phase: str, event_time: int, text: str | None = None) -> dict[str, Any]:
        if phase == "start":
            self.step += 1
        # a step without text is no event for the observer: nothing is decided about it
        rec = {**self._header(event_time, None, owed=bool((text or "").strip())), "phase": phase,
               "text": text}
        await self.client.producer.send(T.AGENT_STEPS.name(self.client.settings),
                                        "io.mnemoflow.AgentStep", self.session_id, rec)
        return rec


class HostClient:
    """Owns one idempotent producer; hand out a HostSession per agent session.

    `timeout_s` bounds every wait on the broker (start, each send with its retries, the
    flush at exit); past it the call raises BrokerUnavailable."""

    def __init__(self, settings: Settings, bootstrap: str,
                 timeout_s: float | None = None) -> None:
        # the Kafka client is imported here, where one is made: CapabilityManifest and
        # HostSession also serve the offline replay, which runs without Kafka
        from mnemoflow.streams.producer import AvroProducer

        self.settings = settings
        self.bootstrap = bootstrap
        self.producer: AvroProducer = AvroProducer(settings, bootstrap, timeout_s=timeout_s)

    @property
    def topics(self) -> list[str]:
        """What this client writes: the three input topics and the memory-log."""
        return [spec.name(self.settings)
                for spec in (T.SESSION_EVENTS, T.TOOL_RESULTS, T.AGENT_STEPS, T.MEMORY_LOG,
                             T.MEMORY_SHARED)]

    async def start(self) -> None:
        """TopicsMissing (one line, with the fix) if a topic it writes does not exist."""
        from mnemoflow.streams.producer import require_topics

        try:
            await require_topics(self.settings, self.bootstrap, self.topics,
                                 self.producer.timeout_s)
            await self.producer.start()
        except BaseException:
            await self.producer.stop()  # no client left open behind a failed start
            raise

    async def stop(self) -> None:
        await self.producer.stop()

    async def __aenter__(self) -> HostClient:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def session(self, session_id: str, user_id: str, agent_id: str = "agent",
                workspace_id: str | None = None) -> HostSession:
        """A new session: its eventSeq starts at 1. For one written to before (by this or an
        earlier process), use `resume`: a reused eventSeq is taken for a redelivery."""
        return HostSession(self, session_id, user_id, agent_id, workspace_id)

    async def resume(self, session_id: str, user_id: str, agent_id: str = "agent",
                     workspace_id: str | None = None) -> HostSession:
        """A session that continues its numbering (eventSeq, turn, step) above its latest
        event in the input topics; a new one if they hold none (past their retention, the
        numbering starts again and the pipeline takes those events for redeliveries)."""
        from mnemoflow.streams.session_log import SessionLog

        log = SessionLog(self.settings, self.bootstrap, self.producer.registry,
                         self.producer.timeout_s)
        try:
            await log.start()
            seen = await log.last(session_id)
        finally:
            await log.stop()
        session = self.session(session_id, user_id, agent_id, workspace_id)
        if seen is not None:
            session._seq = itertools.count(seen.seq + 1)
            session.last_seq, session.turn, session.step = seen.seq, seen.turn, seen.step
        return session

    # ------------------------------------------------ direct long-term memory writes (M-03..05)

    async def append_memory(self, ev: dict[str, Any]) -> dict[str, Any]:
        """To the memory-log (a user's scopes) or memory-shared, keyed by the scope owner."""
        await self.producer.send(self.settings.topic(memory_topic(ev)),
                                 "io.mnemoflow.MemoryEvent", ev["owner"], ev)
        return ev

    async def remember(self, owner: str, text: str, event_time: int, *, scope: str = "User",
                       subject: str | None = None, predicate: str | None = None,
                       obj: str | None = None, memory_id: str | None = None,
                       ttl_ms: int | None = None) -> dict[str, Any]:
        """A fact (subject/predicate/object: replaces that subject's value) or a free note."""
        return await self.append_memory(M.host_fact(owner, text, event_time, scope=scope,
                                              subject=subject, predicate=predicate, obj=obj,
                                              memory_id=memory_id, ttl_ms=ttl_ms))

    async def revoke(self, owner: str, memory_id: str, event_time: int, *, scope: str = "User",
                     reason: str = "host") -> dict[str, Any]:
        """Hide a memory everywhere; facts and aliases extracted only from it go too."""
        return await self.append_memory(M.host_revoke(owner, memory_id, event_time, scope=scope,
                                                reason=reason))

    async def alias(self, owner: str, alias: str, target: str, event_time: int, *,
                    scope: str = "User", revoke: bool = False) -> dict[str, Any]:
        return await self.append_memory(M.host_alias(owner, alias, target, event_time, scope=scope,
                                               revoke=revoke))

    async def confirm(self, owner: str, memory_id: str, event_time: int, *,
                      scope: str = "User") -> dict[str, Any]:
        """Settle a conflict or a dispute in favour of this fact, or accept a fact candidate."""
        return await self.append_memory(M.host_confirm(owner, memory_id, event_time, scope=scope))

    async def approve_procedure(self, owner: str, procedure_id: str, event_time: int, *,
                                scope: str = "User") -> dict[str, Any]:
        """The user's approval a high-risk procedure needs before it can be validated."""
        return await self.append_memory(M.host_approve_procedure(owner, procedure_id, event_time,
                                                           scope=scope))
