"""The lexical tier: BM25 against rank_bm25, visibility before scoring, aliases, determinism."""

from __future__ import annotations

import math

import pytest
from rank_bm25 import BM25Okapi

from mnemoflow.agents.lexical_index import ALIAS_PRIOR, LexicalDoc, LexicalIndex
from mnemoflow.agents.text import content_tokens

CORPUS = {
    "m1": "Caroline went to the LGBTQ support group and felt welcomed by everyone there",
    "m2": "Melanie painted a sunrise over the lake and plans to paint more landscapes",
    "m3": "Caroline is researching adoption agencies because she wants to adopt children",
    "m4": "The kids went camping at the lake; Melanie loves camping with her family",
    "m5": "Caroline gave a talk at the school about the transgender support group",
    "m6": "Melanie signed up for a pottery class and made a bowl for her kids",
    "m7": "Running a marathon in the mountains was exhausting but Melanie finished",
    "m8": "Caroline's friends threw her a surprise birthday party at the lake house",
}
USER = ("User", "u1")
QUERIES = ["support group", "camping lake", "Melanie kids pottery", "adoption agencies children",
           "painting landscapes sunrise", "birthday party lake", "marathon mountains",
           "Caroline support group talk school"]


def build(docs: dict[str, str] | None = None, scope: tuple[str, str] = USER) -> LexicalIndex:
    idx = LexicalIndex()
    for doc_id, text in (docs or CORPUS).items():
        idx.add(LexicalDoc(doc_id, text, *scope))
    return idx


class LuceneIdfBM25(BM25Okapi):
    """rank_bm25's Okapi scorer with the non-negative idf the index documents."""

    def _calc_idf(self, nd: dict[str, int]) -> None:
        for word, freq in nd.items():
            self.idf[word] = math.log(1 + (self.corpus_size - freq + 0.5) / (freq + 0.5))


def reference(cls: type[BM25Okapi], query: str) -> dict[str, float]:
    ids = list(CORPUS)
    ref = cls([content_tokens(CORPUS[i]) for i in ids], k1=1.2, b=0.75)
    return dict(zip(ids, ref.get_scores(content_tokens(query)), strict=True))


def ordering(scores: dict[str, float]) -> list[str]:
    return [d for d, s in sorted(scores.items(), key=lambda kv: (-kv[1], kv[0])) if s > 0]


@pytest.mark.parametrize("query", QUERIES)
def test_bm25_scores_equal_rank_bm25_with_same_idf(query: str) -> None:
    want = reference(LuceneIdfBM25, query)
    got = {d: s for d, s, _ in build().search(query, [], {USER}, k=100)}
    assert set(got) == {d for d, s in want.items() if s > 0}
    for d, s in got.items():
        assert s == pytest.approx(want[d], abs=1e-6)


@pytest.mark.parametrize("query", QUERIES)
def test_bm25_ordering_matches_bm25okapi(query: str) -> None:
    """Okapi's idf is zero for terms in half the corpus or more ("melanie", "caroline"), so
    docs matching only such terms drop out of its ranking; they may only trail in ours."""
    got = [d for d, _, _ in build().search(query, [], {USER}, k=100)]
    want = ordering(reference(BM25Okapi, query))
    assert want and got[: len(want)] == want
    docs = [set(content_tokens(t)) for t in CORPUS.values()]
    if all(2 * sum(t in d for d in docs) < len(docs) for t in content_tokens(query)):
        assert got == want  # every term rare: both idfs agree on the whole ranking


def test_stemming_and_stopwords_reach_the_index() -> None:
    idx = build()
    assert idx.search("paintings", [], {USER}, 5)[0][0] == "m2"  # painted/paint/paintings
    assert idx.search("the and of to", [], {USER}, 5) == []


def test_visibility_filters_before_scoring_and_never_leaks() -> None:
    idx = LexicalIndex()
    idx.add(LexicalDoc("mine", "hiking trip to the alps", "User", "alice"))
    idx.add(LexicalDoc("theirs", "hiking hiking hiking trip alps alps", "User", "bob"))
    idx.add(LexicalDoc("sess", "alps hiking notes", "Session", "s-bob", ("alps",)))
    idx.add_alias("mountains", "alps", "User", "bob")
    for visible in ({("User", "alice")}, lambda scope, owner: owner == "alice"):
        hits = idx.search("hiking alps mountains", ["alps"], visible, k=10)
        assert [d for d, _, _ in hits] == ["mine"]
    assert idx.search("hiking", [], set(), k=10) == []
    assert idx.search("hiking", [], lambda s, o: False, k=10) == []


def test_visibility_is_asked_per_partition_not_per_document() -> None:
    """Postings are kept per (scope, owner): a search asks visibility once per partition and
    never reads another owner's postings, however many of them hold the query's terms."""
    idx = LexicalIndex()
    for i in range(2000):
        idx.add(LexicalDoc(f"other{i:04}", f"the zeppelin note {i}", "User", f"u{2 + i % 50}"))
    for i in range(3):
        idx.add(LexicalDoc(f"hit{i}", "the zeppelin museum in friedrichshafen", *USER))
    calls: list[tuple[str, str]] = []

    def visible(scope: str, owner: str) -> bool:
        calls.append((scope, owner))
        return (scope, owner) == USER

    hits = idx.search("zeppelin", [], visible, k=10)
    assert [d for d, _, _ in hits] == ["hit0", "hit1", "hit2"]
    assert len(calls) == 51 and len(set(calls)) == 51
    assert idx.search("zeppelin", [], {USER}, k=10) == hits


def test_scores_use_index_wide_statistics_and_survive_removal() -> None:
    """Partitioning the postings must not change BM25: idf counts every partition, and a
    removed document leaves no trace in the counts."""
    idx = LexicalIndex()
    idx.add(LexicalDoc("a", "zeppelin museum", *USER))
    idx.add(LexicalDoc("b", "museum ticket", "User", "u2"))
    alone = LexicalIndex()
    alone.add(LexicalDoc("a", "zeppelin museum", *USER))
    assert idx.search("museum", [], {USER}, 5) != alone.search("museum", [], {USER}, 5)
    idx.remove("b")
    assert idx.search("museum", [], {USER}, 5) == alone.search("museum", [], {USER}, 5)
    idx.remove("a")
    assert len(idx) == 0 and idx.search("museum", [], {USER}, 5) == []


def test_add_is_idempotent_and_replaces() -> None:
    idx = build()
    idx.add(LexicalDoc("m2", CORPUS["m2"], *USER))
    assert len(idx) == len(CORPUS)
    assert idx.search("sunrise", [], {USER}, 5) == build().search("sunrise", [], {USER}, 5)
    idx.add(LexicalDoc("m2", "a quiet evening of chess", *USER, ("chess club",)))
    assert len(idx) == len(CORPUS)
    assert idx.search("sunrise", [], {USER}, 5) == []
    assert [d for d, _, _ in idx.search("chess", [], {USER}, 5)] == ["m2"]
    assert idx.search("x", ["chess club"], {USER}, 5)[0][:1] == ("m2",)


def test_remove_restores_corpus_statistics() -> None:
    extra = {**CORPUS, "tmp": "camping camping lake camping trip"}
    idx = build(extra)
    idx.remove("tmp")
    idx.remove("tmp")  # unknown ids are ignored
    idx.remove("never-added")
    assert len(idx) == len(CORPUS) and "tmp" not in idx
    for q in QUERIES:
        assert idx.search(q, [], {USER}, 100) == build().search(q, [], {USER}, 100)


def test_deterministic_tie_break_by_doc_id() -> None:
    idx = LexicalIndex()
    for doc_id in ("c", "a", "b"):
        idx.add(LexicalDoc(doc_id, "identical text about kayaks", *USER))
    hits = idx.search("kayaks", [], {USER}, 10)
    assert [d for d, _, _ in hits] == ["a", "b", "c"]
    assert len({s for _, s, _ in hits}) == 1
    assert idx.search("kayaks", [], {USER}, 2) == hits[:2]


def test_entity_overlap_bonus_and_via() -> None:
    idx = LexicalIndex()
    idx.add(LexicalDoc("e1", "we met at the conference", *USER, ("Melanie Smith",)))
    idx.add(LexicalDoc("e2", "we met at the conference", *USER, ()))
    idx.add(LexicalDoc("e3", "dinner plans", *USER, ("melanie smith",)))
    hits = idx.search("conference", ["MELANIE  smith"], {USER}, 10)
    assert hits[0][0] == "e1" and {d for d, _, _ in hits} == {"e1", "e2", "e3"}
    by_id = {d: (s, via) for d, s, via in hits}
    assert by_id["e1"][0] == pytest.approx(by_id["e2"][0] + by_id["e3"][0], abs=1e-5)
    assert by_id["e3"][1] == "entity" and by_id["e2"][1] == "bm25"


def test_rare_entities_weigh_more_than_ubiquitous_ones() -> None:
    idx = LexicalIndex()
    for i in range(10):
        ents = ("caroline", "paris") if i == 0 else ("caroline",)
        idx.add(LexicalDoc(f"d{i}", "filler", *USER, ents))
    hits = dict((d, s) for d, s, _ in idx.search("", ["caroline", "paris"], {USER}, 10))
    assert hits["d0"] > hits["d1"] > 0
    assert hits["d0"] - hits["d1"] > hits["d1"]


def test_alias_expands_with_low_prior_and_revokes() -> None:
    idx = build()
    direct = idx.search("pottery", [], {USER}, 5)
    assert idx.search("ceramics", [], {USER}, 5) == []
    idx.add_alias("ceramics", "pottery", *USER)
    idx.add_alias("ceramics", "pottery", *USER)  # twice is once
    hits = idx.search("ceramics", [], {USER}, 5)
    assert [(d, via) for d, _, via in hits] == [("m6", "alias")]
    assert hits[0][1] == pytest.approx(ALIAS_PRIOR * direct[0][1], abs=1e-5)
    assert idx.search("pottery", [], {USER}, 5) == direct  # aliases never change the docs
    idx.revoke_alias("ceramics", "pottery", *USER)
    assert idx.search("ceramics", [], {USER}, 5) == []
    idx.revoke_alias("ceramics", "pottery", *USER)  # unknown aliases are ignored


def test_alias_is_scoped() -> None:
    idx = build()
    idx.add_alias("mel", "Melanie", "Session", "s1")
    assert idx.search("mel", [], {USER}, 5) == []
    hits = idx.search("mel", [], {USER, ("Session", "s1")}, 10)
    assert {d for d, _, _ in hits} == {"m2", "m4", "m6", "m7"}
    assert {via for _, _, via in hits} == {"alias"}


def test_multiword_alias_and_entity_alias() -> None:
    idx = LexicalIndex()
    idx.add(LexicalDoc("ny", "moved to a flat in new york", *USER, ("new york",)))
    idx.add(LexicalDoc("apple", "an apple a day", *USER))
    idx.add_alias("big apple", "new york", *USER)
    hits = idx.search("life in the big apple", [], {USER}, 5)
    assert hits[0][0] == "ny" and hits[0][2] == "alias"
    assert [d for d, _, _ in idx.search("apple pie", [], {USER}, 5)] == ["apple"]  # no partial
    hits = idx.search("", ["Big Apple"], {USER}, 5)
    assert [(d, via) for d, _, via in hits] == [("ny", "alias")]


def test_direct_match_beats_alias_match() -> None:
    idx = build()
    idx.add_alias("hike", "marathon", *USER)
    hits = idx.search("hike marathon", [], {USER}, 5)
    assert hits[0][0] == "m7" and hits[0][2] == "bm25"  # target already in the query


def test_edge_cases() -> None:
    idx = LexicalIndex()
    assert len(idx) == 0 and idx.search("anything", ["x"], {USER}, 5) == []
    idx.add(LexicalDoc("only-stopwords", "yeah ok lol", *USER))
    idx.add(LexicalDoc("d", "lighthouse keeper", *USER))
    assert idx.search("lighthouse", [], {USER}, 0) == []
    assert idx.search("", [], {USER}, 5) == []
    assert [d for d, _, _ in idx.search("lighthouse", [], frozenset({USER}), 5)] == ["d"]


def test_context_terms_find_a_doc_at_a_discount() -> None:
    """An answer is found by the words of the turn it answers, below a doc that says them."""
    idx = LexicalIndex(context_weight=0.5)
    idx.add(LexicalDoc("q", "John: I just signed with a new basketball team!", *USER))
    idx.add(LexicalDoc("a", "John: The Minnesota Wolves! Can't wait.", *USER,
                       context="John: I just signed with a new basketball team!"))
    idx.add(LexicalDoc("x", "Tim: I read a fantasy novel this week.", *USER))
    hits = [d for d, _, _ in idx.search("which team did John sign with", [], {USER}, 10)]
    assert hits[:2] == ["q", "a"] and "x" not in hits
    plain = LexicalIndex()  # no context weight: the context is ignored entirely
    plain.add(LexicalDoc("a", "John: The Minnesota Wolves! Can't wait.", *USER,
                         context="John: I just signed with a new basketball team!"))
    assert plain.search("team sign", [], {USER}, 10) == []


def test_context_is_capped_and_counts_in_the_length() -> None:
    long_ctx = " ".join(f"word{i}" for i in range(100)) + " zebra"
    idx = LexicalIndex(context_weight=1.0, context_max_terms=10)
    idx.add(LexicalDoc("a", "alpha beta", *USER, context=long_ctx))
    idx.add(LexicalDoc("b", "alpha gamma", *USER))
    assert idx.search("zebra", [], {USER}, 5) == []  # beyond the first 10 context terms
    assert [d for d, _, _ in idx.search("word3", [], {USER}, 5)] == ["a"]
    # the 10 context terms make "a" longer: "alpha" scores lower there than in "b"
    scores = {d: s for d, s, _ in idx.search("alpha", [], {USER}, 5)}
    assert scores["b"] > scores["a"]


def test_k1_and_b_are_configurable() -> None:
    docs = {"short": "lake", "long": "lake " + " ".join(f"filler{i}" for i in range(30))}
    flat = LexicalIndex(b=0.0)
    norm = LexicalIndex(b=1.0)
    for d, t in docs.items():
        flat.add(LexicalDoc(d, t, *USER))
        norm.add(LexicalDoc(d, t, *USER))
    f = {d: s for d, s, _ in flat.search("lake", [], {USER}, 5)}
    n = {d: s for d, s, _ in norm.search("lake", [], {USER}, 5)}
    assert f["short"] == f["long"]  # b = 0: no length normalisation
    assert n["short"] > n["long"]
