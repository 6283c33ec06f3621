"""C-04 tier 3 state: the memory–entity graph as a fold of the memory-log, cut per request.

Nodes are memories (their memory ids) and entities (`entity:<casefolded name>`). Edges are
mentions (a memory lists an entity), explicit links (`link_added`, revocable with
`link_revoked`) and scoped aliases (`alias_added` / `alias_revoked`). Everything is kept per
(scope, owner) partition; a request only ever sees the partitions of its scope chain, only
memories that existed before its event time, and never a revoked memory or link, so one
user's graph cannot reach another's and a replay walks the graph the first run walked.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from mnemoflow.agents.ids import RecentIds, stable_id
from mnemoflow.agents.memory_events import REVOKE_OPS
from mnemoflow.agents.sealing import FORGET_OP

ENTITY = "entity:"
MEMORY_KINDS = frozenset({"segment", "episode", "fact", "procedure"})
RECORD_OPS = frozenset({"segment_recorded", "episode_recorded", "fact_proposed", "fact_upserted",
                        "fact_conflicted", "procedure_observed", "procedure_staged",
                        "procedure_promoted"})
LINK_ADDED, LINK_REVOKED = "link_added", "link_revoked"

Chain = frozenset[tuple[str, str]]


def entity_node(name: str) -> str:
    """The node id of an entity; names are casefolded like `agents.text.entities` does."""
    return ENTITY + " ".join(name.split()).casefold()


def is_entity(node: str) -> bool:
    return node.startswith(ENTITY)


@dataclass
class MemoryNode:
    memory_id: str
    scope: str
    owner: str
    session_id: str
    event_seq: int
    event_time: int
    expires_at: int | None
    entities: tuple[str, ...]  # entity node ids
    revoked: bool = False


@dataclass
class Link:
    """An undirected, weighted edge between two nodes with its evidence (memory ids or refs)."""

    link_id: str
    scope: str
    owner: str
    subject: str
    object: str
    since: int  # event time from which the link exists
    weight: float = 1.0
    evidence: tuple[str, ...] = ()
    expires_at: int | None = None
    revoked: bool = False


@dataclass
class Partition:
    """One (scope, owner)'s share of the graph: who mentions what, and which links touch a node."""

    mentions: dict[str, set[str]] = field(default_factory=dict)  # entity node -> memory ids
    links: dict[str, set[str]] = field(default_factory=dict)  # node -> link ids
    memories: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class View:
    """What one request may walk: its scope chain, before its event time, not revoked.

    `alive` is asked about every memory too: the MemoryStore also revokes memories without a
    revocation event (a superseded fact), and it is the authority on that.
    """

    chain: Chain
    before_ms: int
    alive: Callable[[str], bool] | None = None


class GraphState:
    """The fold. `apply` is idempotent by eventId and ignores ops that are not about the graph."""

    def __init__(self, applied_window: int = 200_000) -> None:
        self.memories: dict[str, MemoryNode] = {}
        self.links: dict[str, Link] = {}
        self.partitions: dict[tuple[str, str], Partition] = {}
        self.revoked_memories: set[str] = set()  # tombstones: revoked before (or after) recorded
        self.revoked_links: set[str] = set()
        self._applied = RecentIds(applied_window)  # a redelivery guard, bounded

    def __len__(self) -> int:
        return len(self.memories)

    def apply(self, ev: Mapping[str, Any]) -> bool:
        """Fold one memory-log event; False when it was already applied or is not a graph op."""
        if ev["eventId"] in self._applied:
            return False
        op = ev["op"]
        if op in RECORD_OPS and ev["kind"] in MEMORY_KINDS:
            self._record(ev)
        elif op in REVOKE_OPS:
            self._revoke_memory(ev["memoryId"])
        elif op == LINK_ADDED:
            self._add_link(ev["memoryId"], ev, ev.get("subject") or "", ev.get("object") or "")
        elif op == LINK_REVOKED:
            self._revoke_link(ev["memoryId"])
        elif op == FORGET_OP:
            self.forget(str(ev["owner"]))
        elif op in ("alias_added", "alias_revoked"):
            alias, target = ev.get("subject") or "", ev.get("object") or ""
            lid = alias_link_id(ev["scope"], ev["owner"], alias, target)
            if op == "alias_revoked":
                self._revoke_link(lid)
            else:  # like the lexical index: an alias added again after a revoke is back
                self.revoked_links.discard(lid)
                self._add_link(lid, ev, entity_node(alias), entity_node(target))
        else:
            return False
        self._applied.add(ev["eventId"])
        return True

    def forget(self, owner: str) -> None:
        """Every node, mention and link of the owner, in any scope, dropped."""
        for key in [k for k in self.partitions if k[1] == owner]:
            del self.partitions[key]
        for mid in [m for m, n in self.memories.items() if n.owner == owner]:
            del self.memories[mid]
        for lid in [i for i, link in self.links.items() if link.owner == owner]:
            del self.links[lid]

    def _part(self, scope: str, owner: str) -> Partition:
        return self.partitions.setdefault((scope, owner), Partition())

    def _record(self, ev: Mapping[str, Any]) -> None:
        mid = ev["memoryId"]
        ents = tuple(dict.fromkeys(entity_node(e) for e in ev.get("entities") or () if e.strip()))
        old = self.memories.get(mid)
        if old is not None:  # a fact seen again (more provenance): keep its first time
            old.entities = tuple(dict.fromkeys(old.entities + ents))
            ents = old.entities
            node = old
        else:
            ttl = ev.get("ttlMs")
            node = MemoryNode(mid, ev["scope"], ev["owner"], ev["sessionId"], ev["eventSeq"],
                              ev["eventTime"], None if ttl is None else ev["eventTime"] + ttl,
                              ents, revoked=mid in self.revoked_memories)
            self.memories[mid] = node
        part = self._part(node.scope, node.owner)
        part.memories.add(mid)
        for e in ents:
            part.mentions.setdefault(e, set()).add(mid)

    def _revoke_memory(self, mid: str) -> None:
        self.revoked_memories.add(mid)
        node = self.memories.get(mid)
        if node is not None:
            node.revoked = True

    def _add_link(self, lid: str, ev: Mapping[str, Any], subject: str, obj: str) -> None:
        if not subject or not obj or subject == obj:
            return
        attrs = ev.get("attributes") or {}
        ttl = ev.get("ttlMs")
        old = self.links.get(lid)
        if old is not None:  # re-added with new evidence: the new add replaces the old one
            self._unindex_link(old)
        link = Link(lid, ev["scope"], ev["owner"], subject, obj, ev["eventTime"],
                    weight=_weight(attrs.get("weight")), evidence=tuple(ev.get("provenance") or ()),
                    expires_at=None if ttl is None else ev["eventTime"] + ttl,
                    revoked=lid in self.revoked_links)
        self.links[lid] = link
        part = self._part(link.scope, link.owner)
        part.links.setdefault(subject, set()).add(lid)
        part.links.setdefault(obj, set()).add(lid)

    def _unindex_link(self, link: Link) -> None:
        part = self._part(link.scope, link.owner)
        for n in (link.subject, link.object):
            part.links.get(n, set()).discard(link.link_id)

    def _revoke_link(self, lid: str) -> None:
        self.revoked_links.add(lid)
        link = self.links.get(lid)
        if link is not None:
            link.revoked = True

    # ------------------------------------------------------------------ per-request view

    def visible(self, mid: str, view: View) -> bool:
        m = self.memories.get(mid)
        return (m is not None and not m.revoked and (m.scope, m.owner) in view.chain
                and m.event_time < view.before_ms
                and (m.expires_at is None or m.expires_at > view.before_ms)
                and (view.alive is None or view.alive(mid)))

    def _node_ok(self, node: str, view: View) -> bool:
        return is_entity(node) or self.visible(node, view)

    def usable(self, link: Link, view: View) -> bool:
        """A link counts only if it, both its ends and every memory it cites are visible now."""
        if (link.revoked or (link.scope, link.owner) not in view.chain
                or link.since >= view.before_ms
                or (link.expires_at is not None and link.expires_at <= view.before_ms)):
            return False
        if any(e in self.memories and not self.visible(e, view) for e in link.evidence):
            return False  # evidence revoked (or not yet there): the link has no ground
        return self._node_ok(link.subject, view) and self._node_ok(link.object, view)

    def neighbours(self, node: str, view: View) -> list[tuple[str, float]]:
        """Weighted neighbours of `node` inside the view, merged and sorted by node id."""
        acc: dict[str, float] = {}
        parts = [self.partitions[p] for p in sorted(view.chain) if p in self.partitions]
        if is_entity(node):
            for part in parts:
                for mid in part.mentions.get(node, ()):
                    if self.visible(mid, view):
                        acc[mid] = acc.get(mid, 0.0) + 1.0
        elif self.visible(node, view):
            for e in self.memories[node].entities:
                acc[e] = acc.get(e, 0.0) + 1.0
        else:
            return []
        for part in parts:
            for lid in part.links.get(node, ()):
                link = self.links[lid]
                if self.usable(link, view):
                    other = link.object if link.subject == node else link.subject
                    acc[other] = acc.get(other, 0.0) + link.weight
        return sorted(acc.items())

    def degree(self, node: str, view: View) -> int:
        """Edges of `node` in the view's partitions before the visibility checks: an upper
        bound of its degree that costs a few dict lookups, even for a hub."""
        parts = [self.partitions[p] for p in view.chain if p in self.partitions]
        links = sum(len(part.links.get(node, ())) for part in parts)
        if is_entity(node):
            return links + sum(len(part.mentions.get(node, ())) for part in parts)
        m = self.memories.get(node)
        return links + (len(m.entities) if m is not None else 0)

    def subgraph(self, seeds: Iterable[str], view: View, max_nodes: int = 4000,
                 max_hops: int = 4) -> dict[str, list[tuple[str, float]]]:
        """The visible neighbourhood of the seeds as an adjacency dict (a snapshot), for the
        exact power iteration (`personalized_pagerank`) offline and in tests; recall uses the
        local push, which needs no snapshot.

        Breadth-first, frontier in sorted order, so the same state gives the same subgraph.
        `max_nodes` and `max_hops` bound the work; the snapshot is plain data.
        """
        start = sorted({s for s in seeds if self._node_ok(s, view)})
        nodes: dict[str, list[tuple[str, float]]] = {}
        frontier = start[:max_nodes]
        seen = set(frontier)
        for hop in range(max_hops + 1):
            nxt: list[str] = []
            for u in frontier:
                nbrs = self.neighbours(u, view)
                nodes[u] = nbrs
                if hop == max_hops:
                    continue
                for v, _w in nbrs:
                    if v not in seen and len(seen) < max_nodes:
                        seen.add(v)
                        nxt.append(v)
            frontier = sorted(nxt)
            if not frontier:
                break
        return {u: [(v, w) for v, w in nbrs if v in nodes] for u, nbrs in nodes.items()}


def alias_link_id(scope: str, owner: str, alias: str, target: str) -> str:
    """Aliases carry no memory id of their own: the (scope, owner, alias, target) names it."""
    return stable_id("alias", scope, owner, entity_node(alias), entity_node(target))


def _weight(raw: str | None) -> float:
    """Link weight from its attributes, clamped to (0, 1]: a link can never outweigh a mention."""
    try:
        w = float(raw) if raw is not None else 1.0
    except ValueError:
        return 1.0
    return min(1.0, max(0.0, w)) if w == w else 1.0
