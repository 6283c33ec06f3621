"""OpenAI Agents SDK adapter: a run's hooks become session events, and packets enter model calls.

`MnemoflowMemory` binds one host session (and its inbox) to runs of the SDK's `Runner`. Its
`hooks` (a `RunHooks`) write what the run does, in the session's one eventSeq order:

- the first agent start of a run: `lifecycle` "start" with the capability manifest (once per
  session), then the run's new user input as one `user_message`;
- each model call: `agent_step` "start" (the previous step "end"s first); a step ends at the
  next call or at the agent's final output, so a call's tool results fall inside its step;
- each model response with text: `assistant_message`;
- each local tool's end: `tool_result` (ok, or error with the error text when the tool uses
  `memory.tool_error` as its failure_error_function, or the SDK's default error message).

Its input filter (`run_config()` sets it as `call_model_input_filter`) runs right before each
model call and is a `StepAssembler.step_boundary` (`memory.step`): optionally wait for the
pipeline's decision about the events since the last boundary, claim the session's pending
packets, and write `packet_delivered` for those that entered; the same rules hold (an expired
packet is never delivered, one whose exactDigest was already claimed or shown is dropped, a
pre-step listener may reject). Each packet that entered becomes a user-role input item
(`render_packet`: reference only, never an instruction) after the input the model has seen so
far, and stays at that place in every later model call of the run, so a sent request is never
rewritten (it is a prefix of the next); a new run starts from the input the host passes.

The SDK's package is `agents` (PyPI openai-agents), not `mnemoflow.agents`. Run from the source
checkout's root with the working directory on sys.path (`python -c`, `python -m`), the
checkout's own `agents/` directory shadows it; the import below then says so.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from mnemoflow.streams.decisions import DecisionWatcher
from mnemoflow.streams.host import CapabilityManifest, HostSession
from mnemoflow.streams.inbox import InboxClient
from mnemoflow.streams.step import StepAssembler, StepResult

# (ruff's isort counts `agents` as first-party here, for the checkout's agents/ directory)
try:
    from agents.run_config import CallModelData, ModelInputData

    from agents import (
        Agent,
        ItemHelpers,
        ModelResponse,
        RunConfig,
        RunContextWrapper,
        RunHooks,
        Runner,
        RunResult,
        Tool,
        default_tool_error_function,
    )
except ImportError as exc:  # not installed, or shadowed by a directory named agents
    raise ImportError(
        "mnemoflow.streams.openai_agents needs the OpenAI Agents SDK (pip install "
        f"'mnemoflow[agents]'); importing `agents` failed: {exc} (a directory named agents on "
        "sys.path, such as the mnemoflow checkout's root, shadows the SDK)") from exc

# The observer dead-letters a record whose free text is over its payload bound (256 kB); a
# tool's output is cut well below it: the pipeline needs its gist, not all of it.
MAX_TOOL_TEXT = 16_000
DEFAULT_MANIFEST = CapabilityManifest(provider="openai-agents", supportsUserMessage=True)


def wall_ms() -> int:
    return int(time.time() * 1000)


def _message_text(item: Any) -> str | None:
    """The text of a user-role message input item (a string or input_text parts), else None."""
    if not isinstance(item, dict) or item.get("role") != "user":
        return None
    if item.get("type", "message") != "message":
        return None
    content = item.get("content")
    if isinstance(content, str):
        return content
    parts = [p.get("text") or "" for p in content or () if isinstance(p, dict)
             and p.get("type") == "input_text"]
    return "\n".join(parts)


def new_user_text(items: Sequence[Any]) -> str | None:
    """The run's new user input: the user messages at the end of its input (what comes before
    the last other item is history the host reported in earlier runs)."""
    texts: list[str] = []
    for item in reversed(items):
        text = _message_text(item)
        if text is None:
            break
        texts.append(text)
    joined = "\n\n".join(t for t in reversed(texts) if t)
    return joined or None


def _cut(text: str) -> str:
    return text if len(text) <= MAX_TOOL_TEXT else text[:MAX_TOOL_TEXT] + " [cut]"


class MnemoflowMemory:
    """One per host session; its runs go one after the other.

    `watcher` and `decision_wait_s` > 0: each boundary first waits, up to that long, for the
    pipeline's decision about the session's messages and tool results since the last one
    (`StepAssembler.wait_decision`); a timeout only means the claim takes what is there.
    `clock` gives event times (ms). `keep_packets=False` when the server holds the conversation
    (conversation_id, previous_response_id): the model input is then only what is new, so a
    packet is sent once. `memory.step` is the session's StepAssembler (listeners, digests).
    """

    def __init__(self, session: HostSession, inbox: InboxClient,
                 manifest: CapabilityManifest = DEFAULT_MANIFEST, *,
                 watcher: DecisionWatcher | None = None, decision_wait_s: float = 0.0,
                 clock: Callable[[], int] = wall_ms, keep_packets: bool = True) -> None:
        self.session = session
        self.manifest = manifest
        self.step = StepAssembler(session, inbox, manifest, decisions=watcher)
        self.decision_wait_s = decision_wait_s
        self.clock = clock
        self.keep_packets = keep_packets
        self.hooks = MemoryHooks(self)
        self.delivered: list[str] = []  # packet ids that entered a model call, in order
        self.last_step: StepResult | None = None  # the last boundary's claim and decision
        # this run's packets in the model input: (index in the SDK's input, input items)
        self._inserts: list[tuple[int, list[dict[str, Any]]]] = []
        self._started = False  # lifecycle "start" written
        self._step_open = False
        self._handing_off = False
        self._tool_errors: dict[str, str] = {}  # call id -> error text, from tool_error

    # ------------------------------------------------------------------ public entry points

    def run_config(self, base: RunConfig | None = None, **kwargs: Any) -> RunConfig:
        """`base` (or a new RunConfig) with `kwargs` replaced, and a model input filter that
        adds packets; a `call_model_input_filter` it already has runs first."""
        config = replace(base, **kwargs) if base is not None else RunConfig(**kwargs)
        theirs = config.call_model_input_filter
        if theirs is None:
            return replace(config, call_model_input_filter=self.input_filter)

        async def both(data: CallModelData[Any]) -> ModelInputData:
            out = theirs(data)
            out = await out if inspect.isawaitable(out) else out
            return await self.input_filter(CallModelData(out, data.agent, data.context))

        return replace(config, call_model_input_filter=both)

    async def run(self, agent: Agent[Any], input: str | list[Any],
                  run_config: RunConfig | None = None, **kwargs: Any) -> RunResult:
        """`Runner.run` with this memory's hooks and input filter (added to `run_config`)."""
        return await Runner.run(agent, input, hooks=self.hooks,
                                run_config=self.run_config(run_config), **kwargs)

    def tool_error(self, ctx: RunContextWrapper[Any], error: Exception) -> str:
        """A function tool's `failure_error_function`: the tool_result then carries the error's
        text, while the model gets the SDK's default message (no details leak to it)."""
        call_id = getattr(ctx, "tool_call_id", None)
        if call_id:
            self._tool_errors[call_id] = f"{type(error).__name__}: {error}"
        return default_tool_error_function(ctx, error)

    # ------------------------------------------------------------------ the model input

    async def input_filter(self, data: CallModelData[Any]) -> ModelInputData:
        """A step boundary; the packets that entered go after the input so far."""
        base = list(data.model_data.input)
        waits = self.step.decisions is not None and self.decision_wait_s > 0
        wait = self.decision_wait_s if waits else None
        result = self.last_step = await self.step.step_boundary(self.clock(), wait=wait)
        self.delivered.extend(result.delivered)
        ids = set(result.delivered)
        # the boundary's messages as the pre-step listeners left them
        entered = [{"type": "message", "role": "user", "content": m["content"]}
                   for m in (result.request.messages if result.request else ())
                   if m.get("packetId") in ids]
        if entered:
            self._inserts.append((len(base), entered))
        out, at = [], 0
        for anchor, items in self._inserts:
            out.extend(base[at:anchor])
            out.extend(dict(i) for i in items)  # a copy: the SDK may keep what it was given
            at = anchor
        out.extend(base[at:])
        if not self.keep_packets:
            self._inserts.clear()
        return ModelInputData(input=out, instructions=data.model_data.instructions)

    # ------------------------------------------------------------------ events from hooks

    async def agent_start(self, turn_input: Sequence[Any]) -> None:
        """A run's first agent start begins the run; one after a handoff goes on with it."""
        if self._handing_off:
            self._handing_off = False
            return
        await self._end_step()  # a run that raised leaves its last step open
        self._inserts = []
        if not self._started:
            self._started = True
            await self.session.lifecycle("start", self.clock(), self.manifest)
        text = new_user_text(turn_input)
        if text is not None:
            await self.session.user_message(text, self.clock())

    def handoff(self) -> None:
        self._handing_off = True

    async def llm_start(self) -> None:
        await self._end_step()
        self._step_open = True
        await self.session.agent_step("start", self.clock())

    async def llm_end(self, response: ModelResponse) -> None:
        text = "\n".join(t for t in (ItemHelpers.extract_text(o) for o in response.output) if t)
        if text:
            await self.session.assistant_message(text, self.clock())

    async def tool_end(self, context: RunContextWrapper[Any], tool: Tool, result: object) -> None:
        call_id = getattr(context, "tool_call_id", None) or f"{tool.name}-{self.session.step}"
        error = self._tool_errors.pop(call_id, None)
        if error is None and isinstance(result, str) and result == default_tool_error_function(
                context, Exception()):
            error = result  # the SDK's default failure message: no details to report
        now = self.clock()
        if error is not None:
            await self.session.tool_result(call_id, tool.name, "error", now, error=_cut(error))
        else:
            await self.session.tool_result(call_id, tool.name, "ok", now, output=_cut(str(result)))

    async def agent_end(self) -> None:
        await self._end_step()

    async def _end_step(self) -> None:
        if self._step_open:
            self._step_open = False
            await self.session.agent_step("end", self.clock())


class MemoryHooks(RunHooks[Any]):
    """The SDK's run hooks, forwarded to a MnemoflowMemory."""

    def __init__(self, memory: MnemoflowMemory) -> None:
        self.memory = memory

    async def on_agent_start(self, context: RunContextWrapper[Any], agent: Agent[Any]) -> None:
        await self.memory.agent_start(getattr(context, "turn_input", None) or [])

    async def on_handoff(self, context: RunContextWrapper[Any], from_agent: Agent[Any],
                         to_agent: Agent[Any]) -> None:
        self.memory.handoff()

    async def on_llm_start(self, context: RunContextWrapper[Any], agent: Agent[Any],
                           system_prompt: str | None, input_items: list[Any]) -> None:
        await self.memory.llm_start()

    async def on_llm_end(self, context: RunContextWrapper[Any], agent: Agent[Any],
                         response: ModelResponse) -> None:
        await self.memory.llm_end(response)

    async def on_tool_end(self, context: RunContextWrapper[Any], agent: Agent[Any], tool: Tool,
                          result: object) -> None:
        await self.memory.tool_end(context, tool, result)

    async def on_agent_end(self, context: RunContextWrapper[Any], agent: Agent[Any],
                           output: Any) -> None:
        await self.memory.agent_end()
