"""The record of what a replay sent as host traffic, kept apart from the Kafka I/O that fills it.

The metrics read it, and the offline replay uses the metrics without a broker, so this module
imports no Kafka client.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mnemoflow.evaluation.datasets import TURN_GAP_MS, Benchmark


@dataclass
class ReplayLog:
    """What the host side did, keyed the way the metrics need it (ids only, no results)."""

    mode: str
    haystack_sessions: dict[str, str] = field(default_factory=dict)  # pipeline sid -> user
    question_sessions: dict[str, str] = field(default_factory=dict)  # pipeline sid -> qid
    haystack_events: int = 0
    wall_s: dict[str, float] = field(default_factory=dict)


async def send_haystack(bench: Benchmark, session: Callable[[str, str], Any], manifest: Any,
                        log: ReplayLog, on_turn: Callable[[], None] = lambda: None) -> None:
    """The haystack as host traffic, one host session per benchmark session, in the order
    every replay sends it (user, time, key); `session(sid, user)` makes a `HostSession`."""
    for sess in sorted(bench.sessions, key=lambda s: (s.user, s.time_ms, s.key)):
        sid = f"{sess.user}/{sess.key}"
        log.haystack_sessions[sid] = sess.user
        hs = session(sid, sess.user)
        await hs.lifecycle("start", sess.time_ms, manifest)
        for i, turn in enumerate(sess.turns):
            t = sess.time_ms + (i + 1) * TURN_GAP_MS
            if turn.role == "user":
                await hs.user_message(turn.text, t, provenance=turn.provenance)
            else:
                await hs.assistant_message(turn.text, t, provenance=turn.provenance)
            on_turn()
        log.haystack_events += len(sess.turns) + 1
