"""Weights and thresholds of the gate, the ranker and the indexes, loaded from configuration (R-02).

Every number a decision depends on lives here, so a replay can calibrate it and an audit
record can be explained by it. Defaults are in `tuning.json`; MNEMOFLOW_WEIGHTS overrides the
sections the worker passes on (gate, rank). The `index` section shapes what the projections
write (lexical terms, vectors); a projection built without an explicit IndexTuning reads the
packaged `tuning.json`, so changing it means rebuilding the indexes. Dataclass defaults keep
the behaviour from before each knob existed; `tuning.json` holds the calibrated values (see
evaluation/CALIBRATION.md).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
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
    # absolute floors (see agents/rank.py); 0 turns each off
    item_floor: float = 0.0
    packet_floor: float = 0.0
    packet_min_overlap: int = 2
    packet_min_coverage: float = 0.0  # share of the request's content words (0: off)
    # the cosine an unrelated text gets on the embedding model's scale, where convex fusion
    # starts the vector tier's scale when the tier returned a short list (MiniLM: about 0;
    # e5 puts unrelated texts near 0.7, so from 0 its scores would all look alike)
    vector_unrelated: float = 0.0
    budget_bytes: int = 2048
    max_items: int = 6
    audit_candidates: int = 25
    packet_ttl_ms: int = 10 * 60_000
    recall_k: int = 50
    graph_when_fewer_than: int = 10  # C-04: graph expansion only when earlier tiers found few
    # how the tiers' lists become one relevance: "rrf" keeps recall's reciprocal-rank fusion;
    # "convex" sums tier_weights[tier] * the tier's own score min-max scaled over its hits
    fusion: str = "rrf"
    tier_weights: dict[str, float] = field(default_factory=dict)  # missing tier: weight 1
    # structure bonuses on the scaled relevance: a turn gains next_weight * the relevance of
    # the turn that follows it (a question is found through its answer), and
    # session_weight * the summed relevance of its session's two best candidates
    next_weight: float = 0.0
    session_weight: float = 0.0


@dataclass(frozen=True)
class IndexTuning:
    """What the projections index for a memory: BM25 shape and the neighbouring-turn context.

    A conversational turn often only makes sense after the turn before it (an answer to a
    question), so a segment is indexed with its session's previous segment as context:
    lexically its first `context_max_terms` content terms count with `context_weight` each;
    its vector is normalise(own + vector_context_weight * previous turn's vector).
    """

    bm25_k1: float = 1.2
    bm25_b: float = 0.75
    context_weight: float = 0.0
    context_max_terms: int = 64
    vector_context_weight: float = 0.0
    # embed only the first this-many characters of a memory (0: all; MiniLM stops at 256
    # word pieces anyway): long assistant turns cost ~20x a short turn to embed, and the
    # model was trained on 128-piece inputs, so the head carries most of what it can use
    embed_max_chars: int = 0


# what a report prints when no override file was given: the packaged file is the calibrated one
PACKAGED = "agents/tuning.json (packaged, calibrated: evaluation/CALIBRATION.md)"
# the embedding model the top-level sections are for; others have values in "models"
DEFAULT_MODEL = "minilm"


@dataclass(frozen=True)
class Tuning:
    gate: GateTuning
    rank: RankTuning
    source: str = PACKAGED
    index: IndexTuning = field(default_factory=IndexTuning)

    def to_dict(self) -> dict[str, Any]:
        return {"gate": asdict(self.gate), "rank": asdict(self.rank),
                "index": asdict(self.index), "source": self.source}


def _build(cls: type, data: dict[str, Any]) -> Any:
    known = {f.name for f in fields(cls)}
    unknown = set(data) - known
    if unknown:
        raise ValueError(f"unknown {cls.__name__} keys: {sorted(unknown)}")
    return cls(**data)


def _packaged() -> dict[str, Any]:
    return json.loads(resources.files("mnemoflow.agents").joinpath("tuning.json").read_text())


def _overlay(raw: dict[str, Any], values: dict[str, Any]) -> None:
    for section in ("gate", "rank", "index"):
        raw[section] = {**raw.get(section, {}), **values.get(section, {})}


def load_tuning(path: str | Path | None = None, model: str = DEFAULT_MODEL) -> Tuning:
    """Defaults, overlaid by the packaged values for the embedding `model` (its similarity
    floors, as each model has its own score scale, and what was calibrated for it), then by
    the JSON file at `path` when given, then by that file's own values for `model` (keys are
    checked). A model other than MiniLM without values of its own is refused: MiniLM's floors
    would pass everything on its scale."""
    raw = _packaged()
    source = PACKAGED
    if model != DEFAULT_MODEL and model not in raw.get("models", {}):
        raise ValueError(f"no tuning for embedding model {model!r} in tuning.json 'models'")
    _overlay(raw, raw.get("models", {}).get(model, {}))
    if path:
        override = json.loads(Path(path).read_text())
        _overlay(raw, override)
        _overlay(raw, override.get("models", {}).get(model, {}))
        source = str(path)
    return Tuning(_build(GateTuning, raw["gate"]), _build(RankTuning, raw["rank"]), source,
                  _build(IndexTuning, raw.get("index", {})))


def models_json(t: Tuning, model: str, own: Iterable[str] = ()) -> dict[str, Any]:
    """`t` (tuned with `model`) as a tuning.json that serves every model (the calibration
    writes it, and it may be copied over agents/tuning.json). For a model other than MiniLM,
    these go under `models`: the knobs it has values of its own for, the knobs named in `own`
    ("section.name": what a search fitted to it, kept even where it equals MiniLM's, so that
    a later change of MiniLM's leaves it be) and every knob `t` moved from MiniLM's. The
    top-level sections keep MiniLM's."""
    raw = _packaged()
    d = t.to_dict()
    d.pop("source", None)
    models = raw.get("models", {})
    if model != DEFAULT_MODEL:
        base = load_tuning().to_dict()
        had = models.get(model, {})
        named = {tuple(k.split(".", 1)) for k in own}
        fitted: dict[str, dict[str, Any]] = {}
        for section in ("gate", "rank", "index"):
            keys = [k for k in d[section] if k in had.get(section, {}) or (section, k) in named
                    or d[section][k] != base[section][k]]
            if keys:
                fitted[section] = {k: d[section][k] for k in keys}
                d[section].update({k: base[section][k] for k in keys})
        models = {**models, model: fitted}
    d["models"] = models
    return d


def packaged_index_tuning() -> IndexTuning:
    """The index section of the packaged tuning.json: what a projection uses by default."""
    return load_tuning().index
