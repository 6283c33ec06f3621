"""Compiled injection patterns and the per-text view they scan (pure, no rule knowledge).

Speed: about a hundred regexes cannot each scan every memory. A pattern whose rules-file entry
lists its `starts` compiles to `\\b(?:start|...)` + the rest, so every match begins a token with
the literal letters that open one of its starts (its anchors). Per text, one tokenisation and
one lookup per distinct token give the anchors that open some token; an anchored pattern runs
only if one of its own is among them, and then only `match()`es where a token opens with it.
Patterns without anchors scan the whole text.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

FLAGS = re.MULTILINE  # rules read casefolded text, so no IGNORECASE (3x slower on Unicode)

_WORD = re.compile(r"\w+")


@dataclass(frozen=True)
class AnchorIndex:
    """Every anchor of a rule set, keyed by its first three characters (or all of a shorter one)."""

    by_lead: Mapping[str, tuple[str, ...]]

    @classmethod
    def of(cls, anchors: Iterable[str]) -> AnchorIndex:
        by_lead: dict[str, list[str]] = {}
        for a in sorted(set(anchors)):
            by_lead.setdefault(a[:3], []).append(a)
        return cls(MappingProxyType({k: tuple(v) for k, v in by_lead.items()}))

    def opening(self, tokens: Mapping[str, list[int]]) -> dict[str, list[int]]:
        """Anchor -> where the tokens it opens start, for the anchors that open any token."""
        get, found = self.by_lead.get, {}
        for w, starts in tokens.items():
            for key in {w[:1], w[:2], w[:3]}:
                for a in get(key, ()):
                    if w.startswith(a):
                        found.setdefault(a, []).extend(starts)
        return found


class View:
    """One text view plus lazily built lookups; made per call, never shared between calls."""

    __slots__ = ("text", "index", "_at", "_present")

    def __init__(self, text: str, index: AnchorIndex) -> None:
        self.text = text
        self.index = index
        self._at: dict[str, list[int]] | None = None
        self._present: frozenset[str] | None = None

    def derive(self, text: str) -> View:
        """A view of other text (a sentence of this one) with the same anchors."""
        return View(text, self.index)

    def _anchor_starts(self) -> dict[str, list[int]]:
        """Anchor -> where the tokens it opens start (built once, on first use)."""
        if self._at is None:
            tokens: dict[str, list[int]] = {}
            for m in _WORD.finditer(self.text):
                tokens.setdefault(m.group(), []).append(m.start())
            self._at = self.index.opening(tokens)
        return self._at

    @property
    def present(self) -> frozenset[str]:
        """The anchors (of any pattern of the rule set) that open some token of this view."""
        if self._present is None:
            self._present = frozenset(self._anchor_starts())
        return self._present

    def starts(self, anchors: Iterable[str]) -> list[int]:
        """Sorted positions where a token opens with one of `anchors`."""
        at = self._anchor_starts()
        out: list[int] = []
        for a in anchors:
            out += at.get(a, ())
        return sorted(set(out))


@dataclass(frozen=True)
class Pattern:
    """A compiled rule regex, its anchor words, and the context that must precede a match."""

    rx: re.Pattern[str]
    anchors: frozenset[str] | None = None  # token prefixes a match opens with; None: any
    context: re.Pattern[str] | None = None  # must match right before the start (ends in \Z)
    window: int = 0  # how far back the context may reach

    @property
    def pattern(self) -> str:
        return self.rx.pattern

    def finditer(self, view: View) -> Iterator[re.Match[str]]:
        if self.anchors is None:
            return self.rx.finditer(view.text)  # the loader gives a context only with anchors
        if self.anchors.isdisjoint(view.present):
            return iter(())
        return self.scan(view.text, view.starts(self.anchors))

    def search(self, view: View) -> re.Match[str] | None:
        return next(self.finditer(view), None)

    def scan(self, text: str, starts: Iterable[int]) -> Iterator[re.Match[str]]:
        """Non-overlapping matches, left to right, that begin at one of the sorted `starts`
        and have their context right before them.

        A match whose context fails consumes nothing: a later start inside it may still count.
        """
        rx, context, window, end = self.rx, self.context, self.window, 0
        for pos in starts:
            if pos < end:
                continue
            m = rx.match(text, pos)
            if m and (context is None or context.search(text, max(0, pos - window), pos)):
                yield m
                end = max(m.end(), pos + 1)


def search_any(patterns: Sequence[Pattern], view: View) -> re.Match[str] | None:
    """The first match of the first pattern (in order) that matches."""
    for p in patterns:
        if m := p.search(view):
            return m
    return None
