"""Weights and thresholds of the gate and the ranker, loaded from configuration (R-02).

Every number a decision depends on lives here, so a replay can calibrate it and an audit
record can be explained by it. Defaults are in `tuning.json`; MNEMOFLOW_WEIGHTS overrides.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from importlib import resources
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class GateTuning:
    """C-03: signal weights, HOT/WARM thresholds, hysteresis and cooldown (event time)."""

    weights: dict[str, float] = field(default_factory=dict)
    hot: float = 0.6
    warm: float = 0.35
    hysteresis: float = 0.1
    cooldown_ms: int = 30_000
    window_ms: int = 15 * 60_000
    window_cap: int = 32


@dataclass(frozen=True)
class RankTuning:
    """C-05/R-02: activation weights, byte budget and packet shape."""

    base: float = 0.1
    relevance: float = 1.0
    recency: float = 0.15
    frequency: float = 0.05
    salience: float = 0.1
    suppression: float = 0.5
    recency_half_life_ms: int = 30 * 24 * 3600 * 1000
    time_window_bonus: float = 0.3
    min_relevance: float = 0.05
    budget_bytes: int = 2048
    max_items: int = 6
    audit_candidates: int = 25
    packet_ttl_ms: int = 10 * 60_000
    recall_k: int = 50
    graph_when_fewer_than: int = 10  # C-04: graph expansion only when earlier tiers found few


@dataclass(frozen=True)
class Tuning:
    gate: GateTuning
    rank: RankTuning
    source: str = "defaults"

    def to_dict(self) -> dict[str, Any]:
        return {"gate": asdict(self.gate), "rank": asdict(self.rank), "source": self.source}


def _build(cls: type, data: dict[str, Any]) -> Any:
    known = {f.name for f in fields(cls)}
    unknown = set(data) - known
    if unknown:
        raise ValueError(f"unknown {cls.__name__} keys: {sorted(unknown)}")
    return cls(**data)


def load_tuning(path: str | Path | None = None) -> Tuning:
    """Defaults, overlaid by the JSON file at `path` when given (keys are checked)."""
    raw = json.loads(resources.files("mnemoflow.agents").joinpath("tuning.json").read_text())
    source = "defaults"
    if path:
        override = json.loads(Path(path).read_text())
        for section in ("gate", "rank"):
            merged = dict(raw.get(section, {}))
            merged.update(override.get(section, {}))
            raw[section] = merged
        source = str(path)
    return Tuning(_build(GateTuning, raw["gate"]), _build(RankTuning, raw["rank"]), source)
