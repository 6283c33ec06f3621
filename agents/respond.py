"""The recall stage's composition: recall (C-04) -> rank (C-05) -> safety (G-03) -> broker (C-06).

One function, called by every runner, so a request gives the same audit wherever it runs.
The runner has already waited for the memory projection and says what it found.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from mnemoflow.agents.broker import BrokerOutput, BrokerState, build
from mnemoflow.agents.injection_rules import RuleSet
from mnemoflow.agents.rank import RankResult, rank
from mnemoflow.agents.recall import RecallResult, TierSpec, recall
from mnemoflow.agents.safety import check
from mnemoflow.agents.tuning import RankTuning


@dataclass(frozen=True)
class Projection:
    """What the runner's wait for the memory projection found before a recall."""

    version: str  # the index version read before the wait
    caught_up: bool  # False: the wait timed out and recall answers from what is there
    lag: str = "lagging"  # why not caught up: lagging | restoring (the partition is moving)


async def respond(state: BrokerState, request: dict[str, Any], tiers: Sequence[TierSpec],
                  projection: Projection, index_version: Callable[[], str],
                  t: RankTuning, rules: RuleSet | None = None, memory_off: bool = False
                  ) -> tuple[BrokerState, BrokerOutput]:
    """The packet and audit for one request. A redelivered request re-emits exactly what its
    first pass emitted, without recalling again. With the memory switched off for the
    request's user or session (agents.controls) nothing is recalled: `suppress: disabled`.
    An operator's replay (`replayOf`: a past request re-run against today's memory) is
    answered as a shadow, against no recent injections, and changes no state but its own
    redelivery record (agents.broker.build)."""
    again = state.replayed(request["requestId"])
    if again is not None:
        return state, BrokerOutput(again[0], again[1], replayed=True)
    if memory_off:
        nothing = RankResult(())
        return build(state, request, RecallResult(()), nothing, check((), request, rules),
                     projection.version, index_version(), t, memory_off=True)
    result = await recall(request, tiers, t.recall_k)
    if not projection.caught_up:
        result.tiers["projection"] = projection.lag
    # a replay asks what recall gives now, not what this session has been given lately
    recent = () if request.get("replayOf") else state.recent_digests(request["eventTime"])
    ranked = rank(result.candidates, request, recent, projection.version, t)
    verdict = check(ranked.kept, request, rules)
    return build(state, request, result, ranked, verdict, projection.version, index_version(), t)
