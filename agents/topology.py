"""The pipeline, declared once: each stage's input topics, state key and codec, step function
and outputs. Runners (`streams.faust_runner`, `streams.memory_runner`) execute this
declaration; nothing here knows how records travel or where state is kept.

A step is `(ports, state, record) -> (state, outputs)`. Its only effects are the outputs and
the new state, so a runner may run it again on a redelivered record: every stage is
idempotent (the broker re-emits what a request produced the first time, memory-log events
carry ids derived from their inputs). `ports` hold what a step may read besides its state:
tuning, the recall tiers, the index version and a wall clock used for audit emit times only.

To add a stage: write its pure step function in `agents/`, add one `Stage` to `TOPOLOGY`,
and add one case to the contract suite (`tests/contract/`), which both runners must pass.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from mnemoflow.agents.broker import BrokerState
from mnemoflow.agents.consolidate import consolidate
from mnemoflow.agents.evidence import EvidenceState
from mnemoflow.agents.evidence import update as update_evidence
from mnemoflow.agents.gate import GateState, decide
from mnemoflow.agents.injection_rules import RuleSet
from mnemoflow.agents.observer import ObserverState, observe
from mnemoflow.agents.partitioning import memory_topic, request_key
from mnemoflow.agents.recall import TierSpec
from mnemoflow.agents.respond import Projection, respond
from mnemoflow.agents.tuning import Tuning

INPUT_TOPICS = ("session-events", "tool-results", "agent-steps")


@dataclass(frozen=True)
class Record:
    """One input record as a runner hands it to a step."""

    topic: str  # the catalogue's base name (`streams.topics`), not the prefixed topic
    value: dict[str, Any]
    ingest_ms: int = 0  # when the log took it (Kafka's record timestamp)
    projection: Projection | None = None  # for a `barrier` stage: what the runner's wait found


@dataclass(frozen=True)
class Emit:
    """An output record: its topic's base name, its key and its value (a schema's record)."""

    topic: str
    key: str
    value: dict[str, Any]


@dataclass(frozen=True)
class Reject:
    """The input record goes to the dead letters with this reason: its own fault."""

    reason: str
    detail: str


Output = Emit | Reject


@dataclass(frozen=True)
class Ports:
    """A step's explicit dependencies."""

    tuning: Tuning
    max_payload_bytes: int
    clock: Callable[[], int]  # wall-clock ms; stamps audit emit times, decides nothing
    tiers: Sequence[TierSpec] = ()
    index_version: Callable[[], str] = lambda: ""
    # the memory stores consolidation reads, one per partition held (`projections.memory_store`)
    stores: Callable[[], Sequence[Any]] = tuple
    link_proposals: Callable[[], list[dict[str, Any]]] = list  # from the graph projection
    rules: RuleSet | None = None  # the injection rules safety checks with (G-03)
    # seals a packet's item texts with their owners' keys (streams.keyring), so that neither
    # the inbox nor the broker's state keeps them in the clear; None: kept as they are
    seal_packet: Callable[[dict[str, Any]], Awaitable[dict[str, Any]]] | None = None


StepResult = tuple[Any, Sequence[Output]]
Step = Callable[[Ports, Any, Record], StepResult | Awaitable[StepResult]]


@dataclass(frozen=True)
class Stage:
    """One stage: it consumes `inputs`, keeps one state per `key(value)` in table `table`."""

    name: str
    inputs: tuple[str, ...]
    table: str
    key: Callable[[dict[str, Any]], str]
    load: Callable[[Ports, Any], Any]  # the stored form (JSON-able) -> the state
    dump: Callable[[Any], Any]
    step: Step
    # the runner waits, before the step, until the memory-log written so far is in the store
    # (and, if so configured, in every projection) for the request's scope owners
    barrier: bool = False
    doc: str = ""


@dataclass(frozen=True)
class Periodic:
    """A step that runs on a timer when the pipeline is idle; it reads the memory store."""

    name: str
    run: Callable[[Ports], list[Output]]
    doc: str = ""


async def run_step(stage: Stage, ports: Ports, state: Any,
                   record: Record) -> tuple[Any, Sequence[Output]]:
    """Run a step, synchronous or not."""
    out = stage.step(ports, state, record)
    if inspect.isawaitable(out):
        out = await out
    return out


def memory_emits(events: Sequence[dict[str, Any]]) -> list[Output]:
    """Memory events, keyed by their scope owner, to the memory-log (a user's) or to
    memory-shared (the other scopes)."""
    return [Emit(memory_topic(ev), ev["owner"], ev) for ev in events]


# ------------------------------------------------------------------------------ the steps


def _session(value: dict[str, Any]) -> str:
    return value["sessionId"]


def _segment_session(value: dict[str, Any]) -> str:
    return value["envelope"]["sessionId"]


def observer_step(ports: Ports, state: ObserverState,
                  record: Record) -> tuple[ObserverState, list[Output]]:
    """C-01/M-01/M-02: an input event becomes a segment and memory-log events."""
    new, obs = observe(state, record.topic, record.value, ports.max_payload_bytes,
                       record.ingest_ms)
    if obs.dead_letter:
        return state, [Reject(*obs.dead_letter)]
    out = memory_emits(obs.memory_events)
    if obs.segment is not None:
        out.append(Emit("segments", _session(record.value), obs.segment))
    return new, out


def gate_step(ports: Ports, state: GateState, record: Record) -> tuple[GateState, list[Output]]:
    """C-03: recall now, prefetch, or not; every decision is audited."""
    new, out = decide(state, record.value, ports.tuning.gate)
    if out.decision is None:
        return state, []
    sid = _segment_session(record.value)
    emits: list[Output] = [Emit("audit", sid, {**out.audit, "emitTime": ports.clock()})]
    if out.request is not None:
        # keyed by the user: recall runs on the partition that holds the user's memories
        emits.append(Emit("recall-requests", request_key(out.request), out.request))
    return new, emits


def evidence_step(ports: Ports, state: EvidenceState,
                  record: Record) -> tuple[EvidenceState, list[Output]]:
    """G-01: tool outcomes after a delivery reinforce or weaken the delivered memories."""
    new, events = update_evidence(state, record.value)
    return new, memory_emits(events)


async def recall_step(ports: Ports, state: BrokerState,
                      record: Record) -> tuple[BrokerState, list[Output]]:
    """C-04..C-06 and G-03: recall, rank, check and build a packet, or explain why not."""
    req = record.value
    projection = record.projection or Projection(ports.index_version(), True)
    # the user's switches are in the store of the user's partition, which this worker holds
    off = any(store.controls.off(req["userId"], req["sessionId"], int(req["eventTime"]))
              for store in ports.stores())
    new, out = await respond(state, req, ports.tiers, projection, ports.index_version,
                             ports.tuning.rank, ports.rules, memory_off=off)
    op = out.inbox_op
    if op is not None and op.get("packet") and ports.seal_packet is not None:
        op = {**op, "packet": await ports.seal_packet(op["packet"])}
        new = replace(new, done=tuple((rid, op if rid == req["requestId"] else o, a)
                                      for rid, o, a in new.done))
    emits: list[Output] = []
    if op is not None:
        emits.append(Emit("inbox", req["sessionId"], op))
    emits.append(Emit("audit", req["sessionId"],
                      {**out.audit, "emitTime": out.audit.get("emitTime") or ports.clock()}))
    return new, emits


def consolidation_run(ports: Ports) -> list[Output]:
    """M-02 -> M-03/M-04: repeated episodes become candidates, co-occurring entities links.
    What it writes depends on the memory-log alone, so a rerun adds nothing. Each partition's
    store is consolidated at its own event time (stream time is per partition)."""
    events = [ev for store in ports.stores() for ev in consolidate(store, store.latest_event_time)]
    return memory_emits([*events, *ports.link_proposals()])


@dataclass(frozen=True)
class Topology:
    stages: tuple[Stage, ...]
    periodic: tuple[Periodic, ...] = field(default=())

    def consumers(self, topic: str) -> list[Stage]:
        return [s for s in self.stages if topic in s.inputs]


TOPOLOGY = Topology(
    stages=(
        Stage("observer", INPUT_TOPICS, "observer-state", _session,
              lambda p, d: ObserverState.from_json(d, p.tuning.gate.window_cap,
                                                   p.tuning.gate.window_ms),
              ObserverState.to_json, observer_step, doc=observer_step.__doc__ or ""),
        Stage("gate", ("segments",), "gate-state", _segment_session,
              lambda p, d: GateState.from_json(d, p.tuning.gate), GateState.to_json, gate_step,
              doc=gate_step.__doc__ or ""),
        Stage("evidence", ("segments",), "evidence-state", _segment_session,
              lambda p, d: EvidenceState.from_json(d), EvidenceState.to_json, evidence_step,
              doc=evidence_step.__doc__ or ""),
        Stage("recall", ("recall-requests",), "broker-state", _session,
              lambda p, d: BrokerState.from_json(d), BrokerState.to_json, recall_step,
              barrier=True, doc=recall_step.__doc__ or ""),
    ),
    periodic=(Periodic("consolidation", consolidation_run, consolidation_run.__doc__ or ""),),
)
