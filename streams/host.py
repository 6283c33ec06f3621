"""Host SDK, producing side (N-01): append session events, tool results and agent steps.

Each session numbers its events (eventSeq) in one sequence across the three topics, and all
three are keyed by sessionId, so the worker sees one session's events in order per topic.
The inbox side (claim / assemble / build_request) lives in `mnemoflow.streams.inbox`.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from mnemoflow.streams import topics as T
from mnemoflow.streams.config import Settings
from mnemoflow.streams.producer import AvroProducer

SCHEMA_VERSION = 1


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

    def _header(self, event_time: int, event_seq: int | None) -> dict[str, Any]:
        seq = event_seq if event_seq is not None else next(self._seq)
        self.last_seq = max(self.last_seq, seq)
        return {"schemaVersion": SCHEMA_VERSION, "sessionId": self.session_id,
                "agentId": self.agent_id, "userId": self.user_id,
                "workspaceId": self.workspace_id, "eventSeq": seq, "turn": self.turn,
                "step": self.step, "eventTime": int(event_time)}

    async def _session_event(self, event_time: int, etype: str, event_seq: int | None = None,
                             **fields: Any) -> dict[str, Any]:
        rec = {**self._header(event_time, event_seq), "type": etype, "text": None,
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

    async def feedback(self, kind: str, ref: str, event_time: int) -> dict[str, Any]:
        """packet_delivered | packet_ignored | correction, about a packet id or digest."""
        return await self._session_event(event_time, "feedback", feedbackKind=kind,
                                         feedbackRef=ref)

    async def tool_result(self, call_id: str, tool_name: str, status: str, event_time: int,
                          output: str | None = None, error: str | None = None,
                          root_call_id: str | None = None, parent_call_id: str | None = None,
                          attempt: int = 1, memory_refs: list[str] | None = None) -> dict[str, Any]:
        rec = {**self._header(event_time, None), "callId": call_id, "rootCallId": root_call_id,
               "parentCallId": parent_call_id, "toolName": tool_name, "status": status,
               "attempt": attempt, "output": output, "error": error,
               "memoryRefs": memory_refs or []}
        await self.client.producer.send(T.TOOL_RESULTS.name(self.client.settings),
                                        "io.mnemoflow.ToolResult", self.session_id, rec)
        return rec

    async def agent_step(self, phase: str, event_time: int, text: str | None = None) -> dict[str, Any]:
        if phase == "start":
            self.step += 1
        rec = {**self._header(event_time, None), "phase": phase, "text": text}
        await self.client.producer.send(T.AGENT_STEPS.name(self.client.settings),
                                        "io.mnemoflow.AgentStep", self.session_id, rec)
        return rec


class HostClient:
    """Owns one idempotent producer; hand out a HostSession per agent session."""

    def __init__(self, settings: Settings, bootstrap: str) -> None:
        self.settings = settings
        self.bootstrap = bootstrap
        self.producer = AvroProducer(settings, bootstrap)

    async def __aenter__(self) -> HostClient:
        await self.producer.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.producer.stop()

    def session(self, session_id: str, user_id: str, agent_id: str = "agent",
                workspace_id: str | None = None) -> HostSession:
        return HostSession(self, session_id, user_id, agent_id, workspace_id)
