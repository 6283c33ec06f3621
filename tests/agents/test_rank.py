from __future__ import annotations

from dataclasses import replace

import pytest

from mnemoflow.agents.rank import fused_relevance, rank, structured_relevance
from mnemoflow.agents.tuning import load_tuning

from factories import T0, candidate, request

TUNING = load_tuning().rank


def test_every_drop_has_a_reason() -> None:
    cands = [
        candidate("m1", "Caroline went to the LGBTQ support group on 7 May", 5.0),
        candidate("m2", "Caroline went to the LGBTQ support group on 7 May!", 4.5),  # same words
        candidate("m3", "a secret of another user", 4.0, owner="u2"),
        candidate("m4", "expired note about parking", 3.0, expires_at=T0 - 1),
        candidate("m5", "where did I park?", 2.0),  # the question itself: visible
    ]
    res = rank(cands, request(), [], "lex/gen1", TUNING)
    outcome = {r.candidate.memory_id: r.outcome for r in res.ordered}
    assert outcome == {"m1": "kept", "m2": "duplicate", "m3": "scope", "m4": "expired",
                       "m5": "visible"}


def test_budget_is_utf8_bytes() -> None:
    t = replace(TUNING, budget_bytes=20)
    text = "ééééé ééééé"  # 11 characters, 21 bytes
    assert len(text) == 11 and len(text.encode()) == 21
    res = rank([candidate("a", text, 2.0), candidate("b", "ascii words here!!", 1.0)],
               request(), [], "v", t)
    outcome = {r.candidate.memory_id: r.outcome for r in res.ordered}
    assert outcome == {"a": "budget", "b": "kept"}


def test_budget_drops_with_reason_when_over() -> None:
    t = replace(TUNING, budget_bytes=30)
    res = rank([candidate("a", "x" * 25, 2.0), candidate("b", "y" * 10, 1.0)], request(), [], "v", t)
    outcome = {r.candidate.memory_id: r.outcome for r in res.ordered}
    assert outcome == {"a": "kept", "b": "budget"}
    assert sum(len(r.candidate.text.encode()) for r in res.kept) <= 30


def test_cross_packet_duplicates_are_dropped() -> None:
    c = candidate("a", "the wifi password is in the blue notebook", 1.0)
    res = rank([c], request(), [c.digest], "v", TUNING)
    assert res.ordered[0].outcome == "duplicate"


def test_recency_and_time_window_order_ties() -> None:
    # ids sort the old memory first, so only the recency term can put the new one ahead
    old = candidate("a-old", "went hiking with Dana", 1.0, t=T0 - 300 * 86400_000)
    new = candidate("b-new", "went hiking with Dana again", 1.0, t=T0 - 86400_000)
    t = replace(TUNING, recency=0.15, time_window_bonus=0.3)
    res = rank([old, new], request(), [], "v", t)
    assert [r.candidate.memory_id for r in res.ordered] == ["b-new", "a-old"]
    res = rank([old, new], request(), [], "v", replace(t, recency=0.0))
    assert [r.candidate.memory_id for r in res.ordered] == ["a-old", "b-new"]
    win = request(timeWindow=[T0 - 301 * 86400_000, T0 - 299 * 86400_000])
    res = rank([old, new], win, [], "v", t)
    assert res.ordered[0].candidate.memory_id == "a-old"


def test_rank_is_deterministic() -> None:
    cands = [candidate(f"m{i}", f"memory number {i}", 1.0) for i in range(10)]
    a = rank(cands, request(), [], "v", TUNING)
    b = rank(list(reversed(cands)), request(), [], "v", TUNING)
    assert a == b


def _fused(name: str, lex: float | None, vec: float | None):
    scores = tuple((t, s) for t, s in (("lexical", lex), ("vector", vec)) if s is not None)
    return replace(candidate(name, f"memory text {name}", 0.0), tier_scores=scores,
                   tiers=tuple(t for t, _ in scores))


def test_convex_fusion_min_max_scales_each_tier_and_weights_them() -> None:
    cands = [_fused("a", 10.0, 0.1), _fused("b", 2.0, 0.9), _fused("c", 1.0, None),
             _fused("d", None, 0.5)]
    # recall_k 2: both tiers returned full lists, so each scales from its weakest hit
    t = replace(TUNING, fusion="convex", tier_weights={"lexical": 0.6, "vector": 0.4},
                recall_k=2)
    got = fused_relevance(cands, t)
    assert got["a"] == pytest.approx(0.6 * 1.0 + 0.4 * 0.0)
    assert got["b"] == pytest.approx(0.6 * (1.0 / 9.0) + 0.4 * 1.0)
    assert got["c"] == pytest.approx(0.0)
    assert got["d"] == pytest.approx(0.4 * 0.5)
    lexical_only = replace(t, tier_weights={"lexical": 1.0, "vector": 0.0})
    res = rank(cands, request(), [], "v", replace(lexical_only, recency=0.0, salience=0.0))
    assert [r.candidate.memory_id for r in res.ordered][:3] == ["a", "b", "c"]


def test_a_short_vector_list_scales_from_the_model_s_unrelated_cosine() -> None:
    # e5-like scores: every hit above 0.7, the cosine of unrelated texts on that model
    cands = [_fused("a", None, 0.90), _fused("b", None, 0.75), _fused("c", None, 0.70)]
    t = replace(TUNING, fusion="convex", tier_weights={"vector": 1.0}, recall_k=50)
    from_zero = fused_relevance(cands, t)  # MiniLM's origin: the three look nearly alike
    assert from_zero["b"] / from_zero["a"] == pytest.approx(0.75 / 0.90)
    scaled = fused_relevance(cands, replace(t, vector_unrelated=0.70))
    assert scaled == pytest.approx({"a": 1.0, "b": 0.25, "c": 0.0})
    # a full list scales from its weakest hit whatever the model
    full = replace(t, recall_k=3)
    assert fused_relevance(cands, full) == fused_relevance(
        cands, replace(full, vector_unrelated=0.70))


def test_rrf_fusion_uses_recalls_relevance_and_unknown_fusion_is_refused() -> None:
    cands = [replace(_fused("a", 10.0, None), relevance=0.02),
             replace(_fused("b", None, 0.9), relevance=0.03)]
    assert fused_relevance(cands, TUNING if TUNING.fusion == "rrf"
                           else replace(TUNING, fusion="rrf")) == {"a": 0.02, "b": 0.03}
    with pytest.raises(ValueError):
        fused_relevance(cands, replace(TUNING, fusion="max"))


def _turn(name: str, rel: float, session: str = "s1", follows: str | None = None):
    return replace(candidate(name, f"turn {name}", rel, session_id=session), follows=follows)


def test_next_turn_bonus_lifts_the_turn_an_answer_follows() -> None:
    cands = [_turn("q", 0.4), _turn("a", 1.0, follows="q"), _turn("z", 0.5)]
    t = replace(TUNING, fusion="rrf", recency=0.0, salience=0.0, session_weight=0.0)
    plain = [r.candidate.memory_id for r in rank(cands, request(), [], "v",
                                                 replace(t, next_weight=0.0)).ordered]
    lifted = [r.candidate.memory_id for r in rank(cands, request(), [], "v",
                                                  replace(t, next_weight=0.3)).ordered]
    assert plain == ["a", "z", "q"] and lifted == ["a", "q", "z"]


def test_session_bonus_adds_the_sessions_two_best_relevances() -> None:
    cands = [_turn("a", 1.0, "s1"), _turn("b", 0.5, "s1"), _turn("c", 0.2, "s1"),
             _turn("d", 0.6, "s2")]
    t = replace(TUNING, fusion="rrf", next_weight=0.0, session_weight=0.5)
    got = structured_relevance(cands, fused_relevance(cands, t), t)
    assert got["b"] == pytest.approx(0.5 + 0.5 * 1.5)  # s1's best two: 1.0 + 0.5
    assert got["d"] == pytest.approx(0.6 + 0.5 * 0.6)
    res = rank(cands, request(), [], "v", replace(t, recency=0.0, salience=0.0))
    assert [r.candidate.memory_id for r in res.ordered][:2] == ["a", "b"]
    off = replace(t, session_weight=0.0)
    assert structured_relevance(cands, fused_relevance(cands, off), off) == \
        fused_relevance(cands, off)


def test_a_short_tier_list_scales_from_zero_and_the_message_itself_sets_no_scale() -> None:
    cands = [_fused("a", 5.0, 0.70), _fused("b", 4.9, 0.69)]
    t = replace(TUNING, fusion="convex", tier_weights={"lexical": 0.6, "vector": 0.4},
                recall_k=50, min_relevance=0.05, recency=0.0, salience=0.0, next_weight=0.0,
                session_weight=0.0)
    got = fused_relevance(cands, t)
    assert got["b"] == pytest.approx(0.6 * 4.9 / 5.0 + 0.4 * 0.69 / 0.70)  # not scaled to 0
    # a stored copy of the question is its own best match; if it set the scale, the real
    # memories would all fall under min_relevance and nothing would be kept
    q = request(text="what is my locker code?")
    echo = replace(_fused("q", 40.0, 1.0), digest=q["digest"])
    full_lists = replace(t, recall_k=3)  # every tier returned 3 = recall_k hits
    res = rank([echo, *cands], q, [], "v", full_lists)
    outcome = {r.candidate.memory_id: r.outcome for r in res.ordered}
    assert outcome == {"q": "visible", "a": "kept", "b": "low-relevance"}


def _vec(c, sim: float, lexical: float | None = None):
    """The candidate as the vector tier found it, with this cosine similarity (and as the
    lexical tier found it, with this BM25 score)."""
    scores = (("vector", sim),) if lexical is None else (("lexical", lexical), ("vector", sim))
    return replace(c, tiers=tuple(t for t, _ in scores), tier_scores=scores)


FLOORS = replace(TUNING, item_floor=0.35, packet_floor=0.5, packet_min_overlap=3, max_items=2)


def test_filler_never_takes_a_place_in_the_budget() -> None:
    """No shared word and a low similarity: low-relevance, and the next candidate is kept."""
    q = request("How should I roll out the new Atlas release?")
    # the filler ranks first: a lexical hit through the previous turn it is indexed with
    # (IndexTuning.context_weight), which the floor's word check, on its own text, does not see
    cands = [_vec(candidate("filler", "Assistant: Noted.", 3.0), 0.2, lexical=9.0),
             _vec(candidate("gate", "Atlas goes out blue-green with a manual gate", 2.0), 0.62),
             _vec(candidate("notes", "release notes as five bullets", 1.0), 0.3)]
    outcome = {r.candidate.memory_id: r.outcome for r in rank(cands, q, [], "v", FLOORS).ordered}
    assert outcome == {"filler": "low-relevance", "gate": "kept", "notes": "kept"}
    # without floors the filler, ranked first, fills a place
    outcome = {r.candidate.memory_id: r.outcome
               for r in rank(cands, q, [], "v", replace(FLOORS, item_floor=0.0,
                                                        packet_floor=0.0)).ordered}
    assert outcome["filler"] == "kept" and outcome["notes"] == "budget"


def test_a_packet_of_weak_items_is_not_made() -> None:
    """Kept items that neither reach the packet floor nor share enough words: all weak."""
    q = request("Who is the release manager for Atlas?")
    cands = [_vec(candidate("a", "Maya: the staging cluster is kestrel", 2.0), 0.4),
             _vec(candidate("b", "Maya: Atlas alerts go to Slack", 1.0), 0.45)]
    res = rank(cands, q, [], "v", FLOORS)
    assert [r.outcome for r in res.ordered] == ["weak", "weak"] and not res.kept
    # one strong item is enough for the packet, and keeps the weaker one beside it
    strong = [cands[0], _vec(candidate("c", "Maya: Priya is the release manager", 1.5), 0.71)]
    assert {r.outcome for r in rank(strong, q, [], "v", FLOORS).ordered} == {"kept"}


def test_a_long_message_needs_a_share_of_its_words_not_three() -> None:
    """A chatty message shares a few common words with almost any memory of its user; with
    `packet_min_coverage` the words shared must also be that share of the message's own."""
    q = request("I'm thinking of getting new hiking boots for the trip next month, could you "
                "recommend good brands that are comfortable, waterproof and not too expensive?")
    chatty = _vec(candidate("a", "I think you could recommend a good olive oil.", 2.0), 0.3)
    on_topic = _vec(candidate("b", "My hiking boots are waterproof, comfortable, not expensive. "
                                   "Good brands for the trip.", 1.0), 0.3)
    loose = replace(FLOORS, packet_min_coverage=0.0)
    tight = replace(FLOORS, packet_min_coverage=0.25)
    assert [r.outcome for r in rank([chatty], q, [], "v", loose).ordered] == ["kept"]
    assert [r.outcome for r in rank([chatty], q, [], "v", tight).ordered] == ["weak"]
    assert {r.outcome for r in rank([chatty, on_topic], q, [], "v", tight).ordered} == {"kept"}
    # a short question is judged as before: three shared words, or half of its own
    short = request("Which brands of hiking boots did I like?")
    assert [r.outcome for r in rank([on_topic], short, [], "v", tight).ordered] == ["kept"]


def test_a_speaker_label_is_not_a_shared_word() -> None:
    """'Maya:' opens the request and every memory of hers: it says nothing about either."""
    q = request("Maya: what did we say about deploys?")
    c = _vec(candidate("x", "Maya: I bought new running shoes", 1.0), 0.1)
    assert rank([c], q, [], "v", FLOORS).ordered[0].outcome == "low-relevance"
    shared = _vec(candidate("y", "Maya: deploys go out on Tuesdays", 1.0), 0.1)
    assert rank([shared], q, [], "v", replace(FLOORS, packet_floor=0.0)).ordered[0].outcome == "kept"


def test_the_floors_hold_only_when_the_vector_tier_answered() -> None:
    """Lexical hits alone (vector tier off or failed) have no similarity to judge by."""
    q = request("Who is the release manager for Atlas?")
    lexical_only = [candidate("a", "Maya: the staging cluster is kestrel", 2.0)]
    assert rank(lexical_only, q, [], "v", FLOORS).ordered[0].outcome == "kept"
