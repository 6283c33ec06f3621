"""The gateway's service: the host SDK behind both its faces (HTTP in
`mnemoflow.streams.gateway`, MCP in `mnemoflow.streams.gateway_mcp`), and the API's models.

One process holds one HostClient, InboxClient and DecisionWatcher, and one HostSession (with
its StepAssembler) per session it serves, so eventSeq, turn and step are numbered as the SDK
numbers them. A session the process has not served yet (a new one, or any after a restart)
first reads what the input topics hold of it (`SessionLog`) and continues above its last
eventSeq, turn and step, with the user, agent and workspace it was written with.

Every method takes the caller's tenant and the ids as the tenant names them: namespacing
(`mnemoflow.agents.tenancy`) happens here and nowhere else, on the way in and on the way out.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from aiokafka.errors import KafkaError
from pydantic import BaseModel, Field

from mnemoflow.agents import tenancy as TN
from mnemoflow.streams import topics as T
from mnemoflow.streams.config import Settings
from mnemoflow.streams.decisions import DecisionWatcher, describe
from mnemoflow.streams.host import CapabilityManifest, HostClient, HostSession
from mnemoflow.streams.inbox import InboxClient
from mnemoflow.streams.producer import present_topics
from mnemoflow.streams.session_log import SessionLog
from mnemoflow.streams.step import StepAssembler, render_packet

log = logging.getLogger(__name__)

# The manifest of the gateway's StepAssemblers. The host's own manifest goes to the pipeline
# with its lifecycle event, and the broker alone decides shadow mode (then it writes no inbox
# op): a packet in the inbox is one the host can take, so the gateway never holds one back.
GATEWAY_MANIFEST = CapabilityManifest(provider="mnemoflow-gateway", supportsUserMessage=True,
                                      includeRuntimeContext=False)
LIVE_SESSIONS = 10_000  # HostSessions kept, the most recently used; a dropped one is recovered
MAX_WAIT_S = 120.0
HEALTH_TIMEOUT_S = 5.0
TOPICS = (T.SESSION_EVENTS, T.TOOL_RESULTS, T.AGENT_STEPS, T.MEMORY_LOG, T.MEMORY_SHARED, T.INBOX,
          T.AUDIT)


def wall_ms() -> int:
    return int(time.time() * 1000)


class SessionUnknown(LookupError):
    """A session neither served here nor found in the input topics."""


class SessionConflict(ValueError):
    """A request names the session with another user, agent or workspace than its events."""


class TooLarge(ValueError):
    """An event's free text over MNEMOFLOW_MAX_PAYLOAD_BYTES, which the pipeline would only
    dead-letter (and a record over the broker's limit would not be written at all)."""


# ------------------------------------------------------------------------------ API models


class Capability(BaseModel):
    """C-07 capability manifest, declared by the host (nothing is inferred from `model`)."""

    provider: str = ""
    model: str = ""
    reasoning: Literal["none", "summary", "full", "unknown"] = "unknown"
    includeRuntimeContext: bool = True  # noqa: N815 - the SDK's field names
    complete: bool = False
    supportsPreStep: bool = False  # noqa: N815
    supportsUserMessage: bool = False  # noqa: N815
    abortAndResume: bool = False  # noqa: N815


class _Event(BaseModel):
    userId: str = Field(description="the session's user; fixed by its first event")  # noqa: N815
    agentId: str | None = Field(None, description="default: the session's, else 'agent'")  # noqa: N815
    workspaceId: str | None = Field(None, description="default: the session's")  # noqa: N815
    eventTime: int | None = Field(None, ge=0, description="epoch ms; default: now")  # noqa: N815


class UserMessage(_Event):
    type: Literal["user_message"]
    text: str
    remember: bool = Field(True, description="false: observed and recalled for, never stored")
    provenance: str | None = None


class AssistantMessage(_Event):
    type: Literal["assistant_message"]
    text: str
    provenance: str | None = None


class ToolResult(_Event):
    type: Literal["tool_result"]
    callId: str  # noqa: N815
    toolName: str  # noqa: N815
    status: Literal["ok", "error", "retry", "cancel"]
    output: str | None = None
    error: str | None = None
    rootCallId: str | None = None  # noqa: N815
    parentCallId: str | None = None  # noqa: N815
    attempt: int = Field(1, ge=1)
    memoryRefs: list[str] = Field(default_factory=list, description="memory ids the call reused")  # noqa: N815


class AgentStep(_Event):
    type: Literal["agent_step"]
    phase: Literal["start", "end", "boundary"]
    text: str | None = Field(None, description="visible output of the step")


class Lifecycle(_Event):
    type: Literal["lifecycle"]
    action: Literal["start", "end", "cancel", "resume", "capability"]
    capability: Capability | None = None


class Feedback(_Event):
    type: Literal["feedback"]
    kind: Literal["packet_delivered", "packet_ignored", "correction"]
    ref: str = Field(description="the packet id or digest the feedback is about")
    memoryIds: list[str] = Field(default_factory=list)  # noqa: N815


Event = Annotated[UserMessage | AssistantMessage | ToolResult | AgentStep | Lifecycle | Feedback,
                  Field(discriminator="type")]


class Appended(BaseModel):
    sessionId: str  # noqa: N815
    eventSeq: int  # noqa: N815
    turn: int
    step: int
    decisionSeq: int = Field(description="latest event the gate has to decide about; 0: none")  # noqa: N815


class DecisionOut(BaseModel):
    outcome: Literal["suppress", "packet", "none", "timeout"]
    eventSeq: int  # noqa: N815
    gate: dict[str, Any] | None = None
    broker: dict[str, Any] | None = None
    packetIds: list[str] = []  # noqa: N815
    undecided: list[int] = []
    waitedMs: float = 0.0  # noqa: N815


class PacketMessage(BaseModel):
    role: Literal["user"] = "user"
    content: str
    kind: Literal["memory-packet"] = "memory-packet"
    packetId: str  # noqa: N815


class Claimed(BaseModel):
    sessionId: str  # noqa: N815
    messages: list[PacketMessage] = Field(description="append to the next model request")
    packets: list[dict[str, Any]] = Field(description="the packets behind the messages")
    expired: list[str] = []
    decision: DecisionOut | None = None


class ClaimRequest(BaseModel):
    wait: float | None = Field(None, ge=0, le=MAX_WAIT_S,
                               description="first wait up to this many seconds for the decision")
    eventSeq: list[int] = Field(default_factory=list, description="wait for these events too")  # noqa: N815


class WaitRequest(BaseModel):
    timeout: float = Field(10.0, ge=0, le=MAX_WAIT_S, description="seconds")
    eventSeq: list[int] = Field(  # noqa: N815
        default_factory=list, description="default: the events appended here since the last "
        "wait; name recent events after a gateway restart")


class RememberRequest(BaseModel):
    owner: str = Field(description="the scope's owner: a userId (User, External), a "
                       "workspaceId (Workspace) or a sessionId (Session, Turn)")
    text: str = ""
    scope: Literal["User", "External", "Workspace", "Session", "Turn"] = "User"
    subject: str | None = None
    predicate: str | None = None
    object: str | None = None
    memoryId: str | None = Field(None, description="your own id (no ':'); default: derived")  # noqa: N815
    ttlMs: int | None = Field(None, ge=1)  # noqa: N815
    eventTime: int | None = Field(None, ge=0)  # noqa: N815


class RevokeRequest(BaseModel):
    owner: str
    memoryId: str  # noqa: N815
    scope: Literal["User", "External", "Workspace", "Session", "Turn"] = "User"
    reason: str = "host"
    eventTime: int | None = Field(None, ge=0)  # noqa: N815


class MemoryWritten(BaseModel):
    memoryId: str  # noqa: N815
    owner: str
    scope: str
    op: str
    eventId: str  # noqa: N815


class UserForgotten(BaseModel):
    userId: str  # noqa: N815
    eventIds: list[str]  # noqa: N815
    keysShredded: int  # noqa: N815


# ------------------------------------------------------------------------------ the service


@dataclass
class _Kafka:
    """The clients, made in `Gateway.start`: aiokafka makes its clients inside the loop."""

    host: HostClient
    inbox: InboxClient
    decisions: DecisionWatcher
    log: SessionLog


@dataclass
class _Live:
    session: HostSession
    step: StepAssembler
    lock: asyncio.Lock


class Gateway:
    """The SDK behind both faces (HTTP, MCP). Every method takes the caller's tenant and the
    ids as the tenant names them; namespacing happens here, nowhere else."""

    def __init__(self, settings: Settings, bootstrap: str, tenants: Mapping[str, str],
                 timeout_s: float | None = None) -> None:
        """`tenants`: `{token: tenant}`, checked here; empty: the one local tenant."""
        self.settings = settings
        self.bootstrap = bootstrap
        self.timeout_s = timeout_s
        self.tokens = TN.token_table(tenants)  # by token digest
        self.topics = [spec.name(settings) for spec in TOPICS]
        self._kafka: _Kafka | None = None
        self._live: OrderedDict[str, _Live] = OrderedDict()
        self._opening = asyncio.Lock()

    @property
    def k(self) -> _Kafka:
        if self._kafka is None:
            raise RuntimeError("the gateway is not started")
        return self._kafka

    async def start(self) -> None:
        """TopicsMissing or BrokerUnavailable (one line each) when it cannot serve."""
        s, bs = self.settings, self.bootstrap
        host = HostClient(s, bs, timeout_s=self.timeout_s)
        parts: list[Any] = [host, InboxClient(s, bs, host.producer),
                            DecisionWatcher(s, bs, timeout_s=self.timeout_s),
                            SessionLog(s, bs, host.producer.registry, host.producer.timeout_s)]
        started: list[Any] = []
        try:
            for part in parts:
                await part.start()
                started.append(part)
        except BaseException:
            for part in reversed(started):
                await part.stop()
            raise
        self._kafka = _Kafka(*parts)

    async def stop(self) -> None:
        kafka, self._kafka = self._kafka, None
        self._live.clear()
        if kafka is None:
            return
        for part in (kafka.log, kafka.decisions, kafka.inbox, kafka.host):
            try:
                await part.stop()
            except Exception:  # the others are still closed
                log.exception("gateway: stopping %s", type(part).__name__)

    def tenant(self, authorization: str | None) -> str | None:
        return TN.tenant_for(self.tokens, authorization)

    # ------------------------------------------------------------------ sessions

    async def _open(self, tenant: str, session_id: str, event: _Event | None = None) -> _Live:
        """The session's live handle; from the input topics if not served yet. `event`: the
        ids a write names, checked against the session's (SessionConflict)."""
        sid = TN.scoped(tenant, session_id, "sessionId")
        user = TN.scoped(tenant, event.userId, "userId") if event else None
        agent = TN.scoped_opt(tenant, event.agentId, "agentId") if event else None
        ws = TN.scoped_opt(tenant, event.workspaceId, "workspaceId") if event else None
        async with self._opening:
            live = self._live.get(sid)
            if live is None:
                seen = await self.k.log.last(sid)
                if seen is None and user is None:
                    raise SessionUnknown(f"session {session_id!r} has no events: append one first")
                if seen is None:  # the SDK's default agent, namespaced like every other id
                    s = self.k.host.session(sid, user or "", agent or TN.scoped(tenant, "agent", ""), ws)
                else:  # numbering goes on above the last event written
                    s = HostSession(self.k.host, sid, seen.user_id, seen.agent_id, seen.workspace_id,
                                    turn=seen.turn, step=seen.step, last_seq=seen.seq,
                                    _seq=itertools.count(seen.seq + 1))
                live = self._live[sid] = _Live(s, StepAssembler(s, self.k.inbox, GATEWAY_MANIFEST,
                                                                decisions=self.k.decisions),
                                               asyncio.Lock())
                self._evict()
            self._live.move_to_end(sid)
        s = live.session
        for name, given, have in (("userId", user, s.user_id), ("agentId", agent, s.agent_id),
                                  ("workspaceId", ws, s.workspace_id)):
            if given is not None and given != have:
                raise SessionConflict(f"session {session_id!r} belongs to another {name} "
                                      f"({TN.unscoped(tenant, have)!r})")
        return live

    def _evict(self) -> None:
        for sid in list(self._live):
            if len(self._live) <= LIVE_SESSIONS:
                return
            if not self._live[sid].lock.locked():  # one in use keeps its numbering to itself
                del self._live[sid]

    # ------------------------------------------------------------------ writes

    async def append(self, tenant: str, session_id: str, ev: _Event) -> Appended:
        texts = [getattr(ev, f, None) or "" for f in ("text", "output", "error")]
        size = sum(len(t.encode("utf-8", "surrogatepass")) for t in texts)
        if size > self.settings.max_payload_bytes:
            raise TooLarge(f"the event's text is {size} bytes > {self.settings.max_payload_bytes} "
                           f"(MNEMOFLOW_MAX_PAYLOAD_BYTES)")
        live = await self._open(tenant, session_id, ev)
        t = wall_ms() if ev.eventTime is None else ev.eventTime
        named = ev.memoryRefs if isinstance(ev, ToolResult) else \
            ev.memoryIds if isinstance(ev, Feedback) else []
        refs = [TN.memory_ref(tenant, m) for m in named]
        async with live.lock:
            s = live.session
            if isinstance(ev, UserMessage):
                rec = await s.user_message(ev.text, t, ev.provenance, remember=ev.remember)
            elif isinstance(ev, AssistantMessage):
                rec = await s.assistant_message(ev.text, t, ev.provenance)
            elif isinstance(ev, ToolResult):
                rec = await s.tool_result(ev.callId, ev.toolName, ev.status, t, output=ev.output,
                                          error=ev.error, root_call_id=ev.rootCallId,
                                          parent_call_id=ev.parentCallId, attempt=ev.attempt,
                                          memory_refs=refs)
            elif isinstance(ev, AgentStep):
                rec = await s.agent_step(ev.phase, t, ev.text)
            elif isinstance(ev, Lifecycle):
                cap = CapabilityManifest(**ev.capability.model_dump()) if ev.capability else None
                rec = await s.lifecycle(ev.action, t, cap)
            elif isinstance(ev, Feedback):
                rec = await s.feedback(ev.kind, ev.ref, t, memory_ids=refs)
            else:
                raise TypeError(f"not an event: {type(ev).__name__}")
            return Appended(sessionId=session_id, eventSeq=rec["eventSeq"], turn=rec["turn"],
                            step=rec["step"], decisionSeq=s.decision_seq)

    async def remember(self, tenant: str, req: RememberRequest) -> MemoryWritten:
        ev = await self.k.host.remember(
            TN.scoped(tenant, req.owner, "owner"), req.text,
            wall_ms() if req.eventTime is None else req.eventTime, scope=req.scope,
            subject=req.subject, predicate=req.predicate, obj=req.object, ttl_ms=req.ttlMs,
            memory_id=TN.new_memory_id(tenant, req.memoryId) if req.memoryId else None)
        return self._written(tenant, req.owner, ev)

    async def revoke(self, tenant: str, req: RevokeRequest) -> MemoryWritten:
        ev = await self.k.host.revoke(TN.scoped(tenant, req.owner, "owner"),
                                    TN.memory_ref(tenant, req.memoryId),
                                    wall_ms() if req.eventTime is None else req.eventTime,
                                    scope=req.scope, reason=req.reason)
        return self._written(tenant, req.owner, ev)

    async def forget(self, tenant: str, user: str, reason: str) -> UserForgotten:
        """Forget one of the tenant's users (streams.forget): the user's memory is dropped
        everywhere and the keys that sealed its text are shredded."""
        from mnemoflow.streams.forget import forget_owner

        done = await forget_owner(self.settings, self.bootstrap, TN.scoped(tenant, user, "owner"),
                                  reason, f"gateway:{tenant}", wall_ms(), host=self.k.host,
                                  keyring=self.k.host.producer.keys())
        return UserForgotten(userId=user, eventIds=[e["eventId"] for e in done.events],
                             keysShredded=len(done.shredded))

    @staticmethod
    def _written(tenant: str, owner: str, ev: dict[str, Any]) -> MemoryWritten:
        return MemoryWritten(memoryId=TN.unscoped_memory_id(tenant, ev["memoryId"]) or "",
                             owner=owner, scope=ev["scope"], op=ev["op"], eventId=ev["eventId"])

    # ------------------------------------------------------------------ reads

    async def wait(self, tenant: str, session_id: str, timeout_s: float,
                   event_seqs: list[int] | tuple[int, ...] = ()) -> DecisionOut:
        """The pipeline's decision about the events appended here since the last wait, and
        `event_seqs`; never under the session's lock, so appends go on meanwhile."""
        live = await self._open(tenant, session_id)
        owed = live.session.owed
        owed.extend(s for s in dict.fromkeys(event_seqs) if s not in owed)
        decision = await live.step.wait_decision(timeout_s)
        return DecisionOut(**describe(decision))

    async def claim(self, tenant: str, session_id: str, wait_s: float | None = None,
                    event_seqs: list[int] | tuple[int, ...] = ()) -> Claimed:
        """A step boundary: claim every pending packet, report those handed out delivered (as
        StepAssembler does) and return them as the next request's user-role messages."""
        decision = (await self.wait(tenant, session_id, wait_s, event_seqs)
                    if wait_s is not None else None)
        live = await self._open(tenant, session_id)
        async with live.lock:
            res = await live.step.step_boundary(wall_ms())
            live.step.history.clear()  # the host keeps its own history: nothing grows here
        by_id = {p["packetId"]: p for p in res.claim.packets}
        messages, packets = [], []
        for pid in res.delivered:
            mine = TN.unscoped_packet(tenant, by_id[pid])
            if mine is None or len(mine["items"]) < len(by_id[pid]["items"]):
                log.error("gateway: packet %s of %s held items of another tenant: left out",
                          pid, live.session.session_id)
            if mine is not None:
                messages.append(PacketMessage(content=render_packet(mine), packetId=pid))
                packets.append(mine)
        return Claimed(sessionId=session_id, messages=messages, packets=packets,
                       expired=list(res.claim.expired), decision=decision)

    async def health(self) -> tuple[bool, dict[str, Any]]:
        try:
            have = await present_topics(self.settings, self.bootstrap, self.topics,
                                        HEALTH_TIMEOUT_S)
        except KafkaError as exc:
            return False, {"broker": "unreachable", "detail": str(exc)}
        missing = [t for t in self.topics if t not in have]
        return not missing, {"broker": "reachable", "topicsMissing": missing}
