"""Tuning: sections load from the packaged file, overrides merge per key, typos are refused."""

from __future__ import annotations

import json

import pytest

from mnemoflow.agents.tuning import IndexTuning, load_tuning


def test_index_section_overrides_merge_with_the_packaged_values(tmp_path) -> None:
    base = load_tuning()
    f = tmp_path / "w.json"
    f.write_text(json.dumps({"index": {"bm25_b": 0.3}, "rank": {"fusion": "rrf"}}))
    t = load_tuning(f)
    assert t.index.bm25_b == 0.3
    assert t.index.context_weight == base.index.context_weight  # untouched key kept
    assert t.rank.fusion == "rrf" and t.gate == base.gate
    assert t.to_dict()["index"]["bm25_b"] == 0.3


def test_unknown_keys_are_refused(tmp_path) -> None:
    f = tmp_path / "w.json"
    f.write_text(json.dumps({"index": {"context_wieght": 0.5}}))
    with pytest.raises(ValueError, match="context_wieght"):
        load_tuning(f)


def test_dataclass_defaults_are_the_behaviour_before_the_knobs() -> None:
    d = IndexTuning()
    assert (d.bm25_k1, d.bm25_b, d.context_weight, d.vector_context_weight) == (1.2, 0.75, 0, 0)
