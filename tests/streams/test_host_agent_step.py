"""HostSession.agent_step: the step records a host writes, numbered in its session's one sequence.

No broker here: the aiokafka producer inside AvroProducer is replaced by one that keeps what it
is given, so the records go through the real SDK path and are encoded with the real schemas.
"""

from __future__ import annotations

from typing import Any

from mnemoflow.schemas.codec import default_registry
from mnemoflow.streams.config import Settings
from mnemoflow.streams.host import HostClient

from factories import T0

SESSION = "s-steps"
USER = "alice"


class _Wire:
    """Stands in for aiokafka's producer inside AvroProducer: keeps every record it is sent."""

    def __init__(self) -> None:
        self.records: list[tuple[str, bytes | None, bytes]] = []

    async def send_and_wait(self, topic: str, value: bytes, key: bytes | None = None,
                            **kw: Any) -> None:
        self.records.append((topic, key, value))


async def play_turn(host: HostClient) -> None:
    """One user turn, then two agent steps; the first calls a tool."""
    hs = host.session(SESSION, USER)
    await hs.user_message("Deploy the Atlas service.", T0)
    await hs.agent_step("start", T0 + 1)
    await hs.tool_result("c1", "deploy", "ok", T0 + 2, output="deployed")
    await hs.agent_step("end", T0 + 3, text="Atlas is deployed.")
    await hs.agent_step("start", T0 + 4)
    await hs.agent_step("boundary", T0 + 5)


def check_turn(records: list[tuple[str, dict[str, Any]]]) -> None:
    """`records`: (topic base name, decoded value) of everything `play_turn` wrote."""
    steps = [v for base, v in records if base == "agent-steps"]
    assert [(v["phase"], v["turn"], v["step"], v["eventSeq"], v["text"]) for v in steps] == [
        ("start", 1, 1, 2, None), ("end", 1, 1, 4, "Atlas is deployed."),
        ("start", 1, 2, 5, None), ("boundary", 1, 2, 6, None)]
    assert [v["eventTime"] for v in steps] == [T0 + 1, T0 + 3, T0 + 4, T0 + 5]
    (tool,) = [v for base, v in records if base == "tool-results"]
    assert (tool["turn"], tool["step"], tool["eventSeq"]) == (1, 1, 3)  # inside the first step
    (message,) = [v for base, v in records if base == "session-events"]
    assert (message["turn"], message["step"], message["eventSeq"]) == (1, 0, 1)
    assert {(v["sessionId"], v["userId"]) for _, v in records} == {(SESSION, USER)}


async def test_agent_steps_are_numbered_in_the_sessions_one_sequence() -> None:
    settings = Settings()
    host = HostClient(settings, "127.0.0.1:9", timeout_s=5.0)
    await host.producer._producer.stop()  # never started: nothing to flush
    host.producer._producer = wire = _Wire()  # type: ignore[assignment]
    await play_turn(host)

    registry = default_registry()
    records = []
    for topic, key, value in wire.records:
        assert key == SESSION.encode()  # every input topic is keyed by session
        schema, record = registry.decode(value)
        base = topic.removeprefix(settings.topic_prefix)
        if base == "agent-steps":
            assert schema == "io.mnemoflow.AgentStep"
        records.append((base, record))
    check_turn(records)
