"""An incremental lexical index: BM25 over content tokens, an entity index and scoped aliases.

The always-available first recall tier (M-05). Visibility is applied before scoring, so a
memory outside the caller's scope chain can never be returned. Aliases expand the query with a
low prior; they never change a memory's text and can be revoked.

Scoring: BM25 (k1=1.2, b=0.75 unless configured) with the non-negative Lucene idf
log(1 + (N - df + .5)/(df + .5)) over the statistics of the whole index (N, df, average length).
The term-frequency part equals rank_bm25's BM25Okapi; only the idf differs, because Okapi's idf
goes negative for terms in more than half the documents and its epsilon floor needs a
corpus-wide average that an incremental index cannot keep cheaply. Search touches only the
postings of the query's terms, entities and alias targets, and only in the caller's visible
(scope, owner) partitions: postings are kept per partition, with document frequencies counted
over the whole index, so scores are corpus-wide while a search costs what the caller can see,
not what the whole index holds.

A document may carry context (the turn before it): its first `context_max_terms` content terms
add `context_weight` each to the term frequencies and to the document length, like a
down-weighted second field (BM25F with one shared length). The doc's own text is unchanged.
"""

from __future__ import annotations

import heapq
import math
import unicodedata
from collections import Counter
from collections.abc import Callable, Collection
from dataclasses import dataclass

from mnemoflow.agents.text import content_tokens, tokens

K1 = 1.2
B = 0.75
ENTITY_BONUS = 1.5
ALIAS_PRIOR = 0.3
SCOPES = ("Turn", "Session", "Workspace", "User", "External")

Visible = Callable[[str, str], bool] | Collection[tuple[str, str]]
Hit = tuple[str, float, str]
Part = tuple[str, str]  # (scope, owner): the unit of visibility and of posting storage


@dataclass(frozen=True)
class LexicalDoc:
    doc_id: str
    text: str
    scope: str  # Turn | Session | Workspace | User | External
    owner: str  # id of the scope's owner
    entities: tuple[str, ...] = ()
    context: str = ""  # neighbouring text that helps find this doc; never returned


def normalize_entity(e: str) -> str:
    """The entity key: NFKC, casefolded, single spaces (as text.entities produces them)."""
    return " ".join(unicodedata.normalize("NFKC", e).casefold().split())


def _terms(phrase: str) -> tuple[str, ...]:
    """Index terms of an alias or target phrase; a stopword-only phrase keeps all its tokens."""
    return tuple(content_tokens(phrase)) or tuple(tokens(phrase))


@dataclass(frozen=True)
class _Alias:
    terms: tuple[str, ...]  # the alias as a token sequence
    key: str  # the alias as an entity key
    target_terms: tuple[str, ...]
    target_key: str


class LexicalIndex:
    """Per (scope, owner): posting lists term -> {doc_id: tf} and entity -> {doc_ids}; plus
    index-wide document frequencies. Updated in place."""

    def __init__(self, k1: float = K1, b: float = B, context_weight: float = 0.0,
                 context_max_terms: int = 64) -> None:
        self.k1, self.b = k1, b
        self.context_weight, self.context_max_terms = context_weight, context_max_terms
        self._docs: dict[str, LexicalDoc] = {}
        self._len: dict[str, float] = {}
        self._doc_terms: dict[str, tuple[str, ...]] = {}
        self._doc_entities: dict[str, tuple[str, ...]] = {}
        self._postings: dict[Part, dict[str, dict[str, float]]] = {}
        self._entity_docs: dict[Part, dict[str, set[str]]] = {}
        self._df: dict[str, int] = {}  # term -> docs holding it, over all partitions
        self._entity_df: dict[str, int] = {}
        # first alias term -> (scope, owner) -> aliases; lookups stay per query term
        self._aliases: dict[str, dict[tuple[str, str], set[_Alias]]] = {}
        self._total_len = 0.0

    def __len__(self) -> int:
        return len(self._docs)

    def __contains__(self, doc_id: object) -> bool:
        return doc_id in self._docs

    # ---------------------------------------------------------------- documents

    def add(self, doc: LexicalDoc) -> None:
        """Idempotent by doc_id: re-adding replaces the earlier version entirely."""
        self.remove(doc.doc_id)
        tf: dict[str, float] = dict(Counter(content_tokens(doc.text)))
        length = float(sum(tf.values()))
        if doc.context and self.context_weight > 0:
            ctx = content_tokens(doc.context)[: self.context_max_terms]
            for t in ctx:
                tf[t] = tf.get(t, 0) + self.context_weight
            length += self.context_weight * len(ctx)
        ents = tuple(dict.fromkeys(x for x in map(normalize_entity, doc.entities) if x))
        self._docs[doc.doc_id] = doc
        self._len[doc.doc_id] = length
        self._doc_terms[doc.doc_id] = tuple(tf)
        self._doc_entities[doc.doc_id] = ents
        self._total_len += length
        part = (doc.scope, doc.owner)
        postings = self._postings.setdefault(part, {})
        doc_id, df = doc.doc_id, self._df  # locals: this loop is most of a fold's time
        for t, n in tf.items():
            postings.setdefault(t, {})[doc_id] = n
            df[t] = df.get(t, 0) + 1
        entity_docs = self._entity_docs.setdefault(part, {})
        for e in ents:
            entity_docs.setdefault(e, set()).add(doc.doc_id)
            self._entity_df[e] = self._entity_df.get(e, 0) + 1

    def remove(self, doc_id: str) -> None:
        """Forget a document; unknown ids are ignored (removal is idempotent too)."""
        doc = self._docs.pop(doc_id, None)
        if doc is None:
            return
        self._total_len -= self._len.pop(doc_id)
        part = (doc.scope, doc.owner)
        postings = self._postings[part]
        for t in self._doc_terms.pop(doc_id):
            posting = postings[t]
            del posting[doc_id]
            if not posting:
                del postings[t]
            _decrement(self._df, t)
        entity_docs = self._entity_docs[part]
        for e in self._doc_entities.pop(doc_id):
            docs = entity_docs[e]
            docs.discard(doc_id)
            if not docs:
                del entity_docs[e]
            _decrement(self._entity_df, e)
        if not postings and not entity_docs:
            del self._postings[part], self._entity_docs[part]

    # ---------------------------------------------------------------- aliases

    def _alias(self, alias: str, target: str) -> _Alias | None:
        a = _Alias(_terms(alias), normalize_entity(alias), _terms(target), normalize_entity(target))
        return a if a.terms and a.key and (a.target_terms or a.target_key) else None

    def add_alias(self, alias: str, target: str, scope: str, owner: str) -> None:
        """`alias` in a query also matches docs holding `target`, for callers who can see
        (scope, owner). Adding the same alias twice is a no-op."""
        a = self._alias(alias, target)
        if a is not None:
            self._aliases.setdefault(a.terms[0], {}).setdefault((scope, owner), set()).add(a)

    def revoke_alias(self, alias: str, target: str, scope: str, owner: str) -> None:
        """Undo add_alias with the same arguments; unknown aliases are ignored."""
        a = self._alias(alias, target)
        if a is None:
            return
        by_scope = self._aliases.get(a.terms[0], {})
        group = by_scope.get((scope, owner))
        if group is None:
            return
        group.discard(a)
        if not group:
            del by_scope[(scope, owner)]
        if not by_scope:
            self._aliases.pop(a.terms[0], None)

    def _active_aliases(self, q: list[str], ents: list[str],
                        ok: Callable[[str, str], bool]) -> list[_Alias]:
        """Visible aliases whose token sequence occurs in the query or equals a query entity."""
        found: dict[_Alias, None] = {}
        ent_set = set(ents)
        heads = dict.fromkeys([*q, *(t for e in ents for t in _terms(e)[:1])])
        for head in heads:
            for (scope, owner), group in sorted(self._aliases.get(head, {}).items()):
                if not ok(scope, owner):
                    continue
                for a in sorted(group, key=lambda x: (x.key, x.target_key)):
                    n = len(a.terms)
                    in_query = any(tuple(q[i:i + n]) == a.terms for i in range(len(q) - n + 1))
                    if in_query or a.key in ent_set:
                        found[a] = None
        return list(found)

    # ---------------------------------------------------------------- search

    def _idf(self, term: str) -> float:
        n = len(self._docs)
        df = self._df.get(term, 0)
        return math.log(1 + (n - df + 0.5) / (df + 0.5))

    def _visible_parts(self, visible: Visible) -> list[Part]:
        """The partitions a search reads, in a fixed order (so float sums are reproducible)."""
        if callable(visible):
            return sorted(p for p in self._postings if visible(*p))
        return sorted(p for p in set(visible) if p in self._postings)

    def search(self, query: str, entities: list[str], visible: Visible,
               k: int) -> list[Hit]:
        """(doc_id, score, matched_via) best first, ties by doc_id; only visible docs.

        matched_via names the channel that contributed most to the doc's score: "bm25"
        (query terms), "entity" (entity overlap bonus) or "alias" (alias-expanded terms or
        entities, weighted by ALIAS_PRIOR). Scores are rounded to 1e-6 so float noise cannot
        reorder ties.
        """
        if k <= 0 or not self._docs:
            return []
        parts_seen = self._visible_parts(visible)
        ok: Callable[[str, str], bool]
        if callable(visible):
            ok = visible
        else:
            allowed = frozenset(visible)

            def ok(scope: str, owner: str) -> bool:
                return (scope, owner) in allowed

        q = content_tokens(query)
        ents = list(dict.fromkeys(x for x in map(normalize_entity, entities) if x))
        n_docs = len(self._docs)
        avg = self._total_len / n_docs or 1.0
        k1, b = self.k1, self.b
        lens = self._len
        postings = [self._postings[p] for p in parts_seen]
        entity_docs = [self._entity_docs[p] for p in parts_seen]
        # one accumulator per channel; summed in a fixed channel order, so the float result
        # does not depend on which channel reached a doc first
        parts: dict[str, dict[str, float]] = {"bm25": {}, "entity": {}, "alias": {}}

        def bm25(term: str, weight: float, how: str) -> None:
            df = self._df.get(term)
            if not df:
                return
            idf = self._idf(term)
            acc = parts[how]
            for part in postings:
                for doc_id, tf in part.get(term, {}).items():
                    norm = tf + k1 * (1 - b + b * lens[doc_id] / avg)
                    acc[doc_id] = acc.get(doc_id, 0.0) + weight * idf * tf * (k1 + 1) / norm

        def entity(key: str, weight: float, how: str) -> None:
            df = self._entity_df.get(key)
            if not df:
                return
            # rare entities count fully, ubiquitous ones barely
            bonus = ENTITY_BONUS * math.log(1 + n_docs / df) / math.log(1 + n_docs)
            acc = parts[how]
            for part in entity_docs:
                for doc_id in part.get(key, ()):
                    acc[doc_id] = acc.get(doc_id, 0.0) + weight * bonus

        for term in q:  # repeated query terms count again, as in rank_bm25
            bm25(term, 1.0, "bm25")
        for key in ents:
            entity(key, 1.0, "entity")
        q_set, e_set = set(q), set(ents)
        expanded_terms: set[str] = set()
        expanded_ents: set[str] = set()
        for a in self._active_aliases(q, ents, ok):
            for t in a.target_terms:
                if t not in q_set and t not in expanded_terms:
                    expanded_terms.add(t)
                    bm25(t, ALIAS_PRIOR, "alias")
            if a.target_key not in e_set and a.target_key not in expanded_ents:
                expanded_ents.add(a.target_key)
                entity(a.target_key, ALIAS_PRIOR, "alias")

        order = ("bm25", "entity", "alias")
        channels = [parts[h] for h in order]
        totals: dict[str, float] = {}
        for acc in channels:
            for doc_id, x in acc.items():
                totals[doc_id] = totals.get(doc_id, 0.0) + x
        best = heapq.nsmallest(k, ((-round(x, 6), doc_id) for doc_id, x in totals.items()))
        ranked = []
        for neg, doc_id in best:
            by = [acc.get(doc_id, 0.0) for acc in channels]
            via = order[max(range(len(order)), key=lambda i: (by[i], -i))]
            ranked.append((doc_id, -neg, via))
        return ranked


def _decrement(counts: dict[str, int], key: str) -> None:
    n = counts[key] - 1
    if n:
        counts[key] = n
    else:
        del counts[key]
