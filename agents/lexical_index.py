"""An incremental lexical index: BM25 over content tokens, an entity index and scoped aliases (M-05).

The always-available first recall tier. Visibility is applied before scoring, so a memory
outside the caller's scope chain can never be returned. Aliases expand the query with a low
prior; they never change a memory's text and can be revoked.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Collection
from dataclasses import dataclass

from mnemoflow.agents.text import content_tokens

K1 = 1.2
B = 0.75
ENTITY_BONUS = 1.5
ALIAS_PRIOR = 0.3

Visible = Callable[[str, str], bool] | Collection[tuple[str, str]]


@dataclass(frozen=True)
class LexicalDoc:
    doc_id: str
    text: str
    scope: str
    owner: str
    entities: tuple[str, ...] = ()


class LexicalIndex:
    def __init__(self) -> None:
        self._docs: dict[str, LexicalDoc] = {}
        self._len: dict[str, int] = {}
        self._tf: dict[str, dict[str, int]] = {}  # doc -> term -> tf
        self._postings: dict[str, dict[str, int]] = defaultdict(dict)  # term -> doc -> tf
        self._entities: dict[str, set[str]] = defaultdict(set)  # entity -> docs
        self._aliases: dict[tuple[str, str, str], set[str]] = defaultdict(set)  # (alias,scope,owner)
        self._total_len = 0

    def __len__(self) -> int:
        return len(self._docs)

    def add(self, doc: LexicalDoc) -> None:
        """Idempotent by doc_id: re-adding replaces the earlier version."""
        if doc.doc_id in self._docs:
            self.remove(doc.doc_id)
        toks = content_tokens(doc.text)
        tf: dict[str, int] = {}
        for t in toks:
            tf[t] = tf.get(t, 0) + 1
        self._docs[doc.doc_id] = doc
        self._len[doc.doc_id] = len(toks)
        self._tf[doc.doc_id] = tf
        self._total_len += len(toks)
        for t, n in tf.items():
            self._postings[t][doc.doc_id] = n
        for e in doc.entities:
            self._entities[e.casefold()].add(doc.doc_id)

    def remove(self, doc_id: str) -> None:
        doc = self._docs.pop(doc_id, None)
        if doc is None:
            return
        self._total_len -= self._len.pop(doc_id)
        for t in self._tf.pop(doc_id):
            posting = self._postings[t]
            posting.pop(doc_id, None)
            if not posting:
                del self._postings[t]
        for e in doc.entities:
            self._entities[e.casefold()].discard(doc_id)

    def add_alias(self, alias: str, target: str, scope: str, owner: str) -> None:
        for a in content_tokens(alias) or [alias.casefold()]:
            self._aliases[(a, scope, owner)].update(content_tokens(target) or [target.casefold()])

    def revoke_alias(self, alias: str, target: str, scope: str, owner: str) -> None:
        for a in content_tokens(alias) or [alias.casefold()]:
            key = (a, scope, owner)
            self._aliases[key].difference_update(content_tokens(target) or [target.casefold()])
            if not self._aliases[key]:
                del self._aliases[key]

    def _idf(self, term: str) -> float:
        n = len(self._docs)
        df = len(self._postings.get(term, ()))
        return math.log(1 + (n - df + 0.5) / (df + 0.5))

    def search(self, query: str, entities: list[str], visible: Visible,
               k: int) -> list[tuple[str, float, str]]:
        """(doc_id, score, matched_via) best first; ties broken by doc_id."""
        ok: Callable[[str, str], bool] = (
            visible if callable(visible) else (lambda s, o, v=visible: (s, o) in v))  # type: ignore[misc]
        q = content_tokens(query)
        if not self._docs or (not q and not entities):
            return []
        avg = self._total_len / max(1, len(self._docs))
        scores: dict[str, float] = defaultdict(float)
        via: dict[str, str] = {}
        cache: dict[str, bool] = {}

        def visible_doc(doc_id: str) -> bool:
            if doc_id not in cache:
                d = self._docs[doc_id]
                cache[doc_id] = ok(d.scope, d.owner)
            return cache[doc_id]

        def score_term(term: str, weight: float, how: str) -> None:
            posting = self._postings.get(term)
            if not posting:
                return
            idf = self._idf(term)
            for doc_id, tf in posting.items():
                if not visible_doc(doc_id):
                    continue
                dl = self._len[doc_id]
                scores[doc_id] += weight * idf * tf * (K1 + 1) / (tf + K1 * (1 - B + B * dl / avg))
                via.setdefault(doc_id, how)

        for term in q:
            score_term(term, 1.0, "bm25")
        for term in set(q):
            for (alias, scope, owner), targets in self._aliases.items():
                if alias == term and ok(scope, owner):
                    for t in targets:
                        if t not in q:
                            score_term(t, ALIAS_PRIOR, "alias")
        n_docs = len(self._docs)
        for e in entities:
            docs = self._entities.get(e.casefold(), ())
            if not docs:
                continue
            bonus = ENTITY_BONUS * math.log(1 + n_docs / len(docs)) / math.log(1 + n_docs)
            for doc_id in docs:
                if visible_doc(doc_id):
                    scores[doc_id] += bonus  # rare entities count, ubiquitous ones barely do
                    via.setdefault(doc_id, "entity")
        ranked = sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))[:k]
        return [(d, round(s, 6), via[d]) for d, s in ranked]
