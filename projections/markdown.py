"""M-06 readable projection: one MEMORY.md per scope owner, and the way back from it.

Layout: `<root>/<scope>/<owner folder>/MEMORY.md`. Owner ids come from hosts and can be any
string (300 characters, `team/x`, `..`), so a folder is never named by the id itself: it is a
readable slug of the id (at most SLUG_MAX safe characters) followed by a hash of the exact id.
That keeps every name short, one level below its scope folder, never `.` or `..`, and apart
for ids that slug alike (`team/x`, `team_x`) or differ only in case. The exact id is inside
the file (the title and every record line). The catalogue's scopes keep their own name as a
folder; any other scope is named like an owner.

Files of the earlier layout (`<scope>/<id with unsafe characters replaced>/MEMORY.md`) are
still read back, and an owner's earlier file moves to the new place at its next write (with
a person's text in it) when it holds that owner's records only; where a memory is in both,
the file at its owner's current place wins over a stale copy.

Only the block between the mnemoflow markers is generated; anything a person writes outside
it is kept byte for byte. In the block a memory is one plain line (its text) in its section;
the full records follow at the end of the block, one HTML comment line each, so that the
memory-log records can be recovered from the Markdown files alone (`events_from_markdown`)
while a person reads only the text. Files of earlier versions, whose lines carry their record
inline, are still read.
`<` and `>` are escaped in every generated line, so no memory text or owner id can end the
block or pass for a record line. Writes are atomic (temp file, then rename), so a crash never
leaves half a file. One owner whose file cannot be written stays pending and is retried after
a back-off, with one warning per try; the other owners' files are written meanwhile.

What comes back from the files is each memory's latest state, not its history: how often a
fact was restated, the evidence trail behind a confidence, a procedure's stage (it comes back
observed and has to earn its stages again), aliases and graph links are not in MEMORY.md.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mnemoflow.agents.memory_events import SCOPES
from mnemoflow.agents.sealing import FORGET_OP
from mnemoflow.projections.memory_store import MemoryRecord, MemoryStore

log = logging.getLogger(__name__)

BEGIN = "<!-- mnemoflow:begin (generated from the memory-log; write outside this block) -->"
END = "<!-- mnemoflow:end -->"
MARK = "<!-- mf "
RECORDS = "<!-- mnemoflow:records (each memory in full, for a restore; not for reading) -->"
TITLE = "## mnemoflow memory: "
SECTIONS = (("fact", "Facts"), ("procedure", "Procedures"), ("episode", "Episodes"),
            ("segment", "Conversation log"))
OP_FOR_KIND = {"segment": "segment_recorded", "episode": "episode_recorded",
               "procedure": "procedure_observed"}  # facts: by their source, see _events_of
KIND_ORDER = {"segment": 0, "episode": 1, "fact": 2, "procedure": 3}  # the observer's order
SLUG_MAX = 40  # readable characters of a folder name; the hash makes it unique
HASH_HEX = 16
# a record line needs these; the rest default as an older file may not have them
REQUIRED = frozenset({"id", "kind", "scope", "owner", "t", "text"})
# attributes the fold adds to a record itself (conflict state); a restore must not carry them
# into the event, the fold derives them again from the events
DERIVED_CONFLICT = frozenset({"open", "disputed"})
RETRY_FIRST_S = 5.0
RETRY_MAX_S = 300.0
# JSON escapes for characters that could end the HTML comment or the line in some reader
_JSON_ESCAPES = (("<", "\\u003c"), (">", "\\u003e"), ("\u2028", "\\u2028"),
                 ("\u2029", "\\u2029"), ("\x85", "\\u0085"))


def folder_name(ident: str) -> str:
    """A folder name for an owner (or scope) id: `<slug>-<hash>`, at most 57 ASCII bytes.

    The slug keeps letters, digits, `.`, `_` and `-` (other runs become `_`), never starts
    or ends with a dot or dash, and is only for people; the hash of the exact id is what
    tells two ids apart."""
    h = hashlib.sha256(ident.encode("utf-8", "surrogatepass")).hexdigest()[:HASH_HEX]
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", ident)[:SLUG_MAX].strip("._-")
    return f"{slug}-{h}" if slug else h


def scope_folder(scope: str) -> str:
    # the catalogue's scopes have no dash, so they never equal a `<slug>-<hash>` name
    return scope if scope in SCOPES else folder_name(scope)


def path_for(root: Path, scope: str, owner: str) -> Path:
    return root / scope_folder(scope) / folder_name(owner) / "MEMORY.md"


def legacy_path_for(root: Path, scope: str, owner: str) -> Path | None:
    """Where the earlier layout put this owner's file, when that place is inside `root`."""
    path = root / scope / re.sub(r"[^\w.\-]", "_", owner) / "MEMORY.md"
    try:
        path.resolve().relative_to(root.resolve())
    except (ValueError, OSError):
        return None
    return path


def _safe(s: str) -> str:
    """`s` on one generated line: no line breaks or control characters, no `<` or `>`."""
    s = "".join(c if c.isprintable() else f"\\u{ord(c):04x}" for c in s)
    return s.replace("<", "&lt;").replace(">", "&gt;")


def _meta(r: MemoryRecord) -> dict[str, Any]:
    return {"id": r.memory_id, "kind": r.kind, "scope": r.scope, "owner": r.owner,
            "session": r.session_id, "seq": r.event_seq, "t": r.event_time,
            "prov": list(r.provenance), "ent": list(r.entities), "src": r.source,
            "conf": r.confidence, "ttl": r.ttl_ms, "risk": r.risk_level,
            "attrs": r.attributes, "text": r.text}


def _meta_json(meta: dict[str, Any]) -> str:
    s = json.dumps(meta, ensure_ascii=False)
    for ch, esc in _JSON_ESCAPES:  # only ever inside JSON strings, where the escape is valid
        s = s.replace(ch, esc)
    return s


def record_lines(r: MemoryRecord) -> tuple[str, str]:
    """A memory's two generated lines: the one a person reads, and its machine record."""
    return f"- {_safe(' '.join(r.text.split())[:200])}", f"{MARK}{_meta_json(_meta(r))} -->"


def render_block(records: list[MemoryRecord], title: str,
                 lines_of: Callable[[MemoryRecord], tuple[str, str]] = record_lines) -> str:
    """The generated block: a line a person reads per memory, by section; then, at the end,
    the machine records, one HTML comment per memory (hidden where Markdown is rendered)."""
    lines = [BEGIN, f"{TITLE}{_safe(title)}", ""]
    metas: list[str] = []
    for kind, heading in SECTIONS:
        rows = sorted((r for r in records if r.kind == kind and not r.revoked),
                      key=lambda r: (r.event_time, r.memory_id))
        if not rows:
            continue
        lines += [f"### {heading}", ""]
        for r in rows:
            shown, meta = lines_of(r)
            lines.append(shown)
            metas.append(meta)
        lines.append("")
    if metas:
        lines.append(RECORDS)
        lines += metas
        lines.append("")
    lines.append(END)
    return "\n".join(lines)


def merge_into(existing: str, block: str) -> str:
    """Replace our block, keep everything else (a person's structure and notes)."""
    if BEGIN in existing and END in existing:
        head, rest = existing.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        return head + block + tail
    sep = "" if not existing or existing.endswith("\n\n") else ("\n" if existing.endswith("\n")
                                                               else "\n\n")
    return existing + sep + block + "\n"


def atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".MEMORY.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _block(text: str) -> str | None:
    if BEGIN not in text:
        return None
    return text.split(BEGIN, 1)[1].split(END, 1)[0]


def _well_formed(d: Any) -> bool:
    return (isinstance(d, dict) and REQUIRED <= d.keys() and isinstance(d["t"], int)
            and all(isinstance(d[k], str) for k in ("id", "kind", "scope", "owner", "text")))


def _line_meta(line: str) -> dict[str, Any] | None:
    """The record of a generated line; None for a line that is not one; ValueError for a
    line that looks like one but does not parse (a hand edit). The first marker that parses
    wins: in files of earlier versions the shown text before the record was not escaped."""
    line = line.rstrip()
    start = line.find(MARK)
    if start < 0 or not line.endswith("-->"):
        return None
    while start >= 0:
        try:
            d = json.loads(line[start + len(MARK): -3])
        except ValueError:
            d = None
        if _well_formed(d):
            return d
        start = line.find(MARK, start + 1)
    raise ValueError("a record line that does not parse")


def _metas(text: str, path: Path) -> Iterator[dict[str, Any]]:
    block = _block(text)
    for n, line in enumerate((block or "").split("\n"), start=1):
        try:
            d = _line_meta(line)
        except ValueError:
            log.warning("MEMORY.md %s: line %d of the generated block does not parse; skipped",
                        path, n)
            continue
        if d is not None:
            yield d


def _belongs_to(text: str, path: Path, scope: str, owner: str) -> bool:
    """A file of the earlier layout holds this owner's records and no one else's."""
    block = _block(text)
    if block is None:
        return False
    owners = {(d["scope"], d["owner"]) for d in _metas(text, path)}
    if owners:
        return owners == {(scope, owner)}
    return f"{TITLE}{scope} {owner}" in block.split("\n")  # an empty block: its title says


def _adopt_legacy(root: Path, scope: str, owner: str, path: Path) -> None:
    """Move the owner's file of the earlier layout to `path`, keeping what a person wrote."""
    legacy = legacy_path_for(root, scope, owner)
    if legacy is None:
        return
    try:
        if legacy.resolve() == path.resolve():
            return
        text = legacy.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return  # none there (the usual case), or not ours to move
    if not _belongs_to(text, legacy, scope, owner):
        return  # another owner's (the earlier layout shared one folder between some ids)
    path.parent.mkdir(parents=True, exist_ok=True)
    os.replace(legacy, path)
    folder = legacy.parent
    if folder.name not in ("", ".", "..") and folder.resolve().parent == (root / scope).resolve():
        try:
            folder.rmdir()
        except OSError:
            pass  # not empty: other files of the person's stay where they are


def owner_records(store: MemoryStore, scope: str, owner: str) -> list[MemoryRecord]:
    return [store.records[m] for m in sorted(store.by_owner.get((scope, owner), ()))]


def write_records(root: Path, scope: str, owner: str, recs: list[MemoryRecord],
                  lines_of: Callable[[MemoryRecord], tuple[str, str]] = record_lines) -> Path:
    path = path_for(root, scope, owner)
    if not path.exists():
        _adopt_legacy(root, scope, owner, path)
    existing = path.read_text(encoding="utf-8") if path.exists() else ""
    atomic_write(path, merge_into(existing, render_block(recs, f"{scope} {owner}", lines_of)))
    return path


def write_owner(root: Path, store: MemoryStore, scope: str, owner: str) -> Path:
    return write_records(root, scope, owner, owner_records(store, scope, owner))


def _events_of(d: dict[str, Any]) -> list[dict[str, Any]]:
    """The memory-log record(s) a line describes: the memory as the log had written it (the
    fold's own additions taken out of its attributes), and, for a memory a user disputed, the
    dispute, so that it is still not recalled after a restore (its confidence then takes the
    dispute's step once more: MEMORY.md has only the confidence after it)."""
    attrs = {str(k): str(v) for k, v in (d.get("attrs") or {}).items()}
    # the fold copies subject, predicate and object into the attributes; the event has them
    # as fields of their own
    spo = {k: attrs.pop(k, None) for k in ("subject", "predicate", "object")}
    conflict = attrs.get("conflict")
    if conflict in DERIVED_CONFLICT:
        del attrs["conflict"]
    if d["kind"] == "procedure":
        # the rest is the fold's account of its stage and approval, which a restore does not
        # claim: the procedure comes back observed and earns its stages (and approval) again
        attrs = {k: v for k, v in attrs.items() if k == "steps"}
    base = {"memoryId": d["id"], "kind": d["kind"], "scope": d["scope"], "owner": d["owner"],
            "sessionId": d.get("session") or "", "eventSeq": int(d.get("seq") or 0),
            "eventTime": int(d["t"])}
    source = d.get("src") or "user"
    # the op its writer used: the host upserts facts, extraction and consolidation propose them
    op = ("fact_upserted" if source == "host" else "fact_proposed") if d["kind"] == "fact" \
        else OP_FOR_KIND.get(d["kind"], "segment_recorded")
    ttl, risk = d.get("ttl"), d.get("risk")
    ev = {"eventId": f"md:{d['id']}", "op": op,
          **base, "text": d["text"], "entities": [str(x) for x in d.get("ent") or []],
          "provenance": [str(x) for x in d.get("prov") or []], "source": str(source),
          "confidence": float(d["conf"]) if d.get("conf") is not None else 0.5,
          "ttlMs": int(ttl) if ttl is not None else None, **spo,
          "riskLevel": str(risk) if risk is not None else None, "attributes": attrs,
          "sealed": None}
    out = [ev]
    if conflict == "disputed":
        out.append({"eventId": f"md:{d['id']}:disputed", "op": "fact_conflicted", **base,
                    "kind": "evidence", "text": "", "entities": [], "provenance": [],
                    "source": "user", "confidence": 0.0, "ttlMs": None, "subject": None,
                    "predicate": None, "object": None, "riskLevel": None, "attributes": {},
                    "sealed": None})
    return out


def events_from_markdown(root: Path) -> list[dict[str, Any]]:
    """The memory-log records that the MEMORY.md files under `root` describe, in fold order
    (event time, then a session's order), one per memory (plus a dispute where there was one).
    Reads the current layout and the earlier one; a memory found in several files is taken
    from the one at its owner's current place."""
    chosen: dict[str, tuple[int, dict[str, Any]]] = {}
    for path in sorted(root.rglob("MEMORY.md")):
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            log.warning("MEMORY.md %s not readable (%s); skipped", path, exc)
            continue
        for d in _metas(text, path):
            rank = 0 if path == path_for(root, d["scope"], d["owner"]) else 1
            if d["id"] not in chosen or rank < chosen[d["id"]][0]:
                chosen[d["id"]] = (rank, d)
    out = [ev for _, d in chosen.values() for ev in _events_of(d)]
    out.sort(key=lambda e: (e["eventTime"], e["eventSeq"], KIND_ORDER.get(e["kind"], 9),
                            e["memoryId"], e["op"] == "fact_conflicted"))
    return out


@dataclass
class RenderedLines:
    """The generated lines of the owners written last, by memory id, so that rewriting an
    owner's file renders only the memories that changed since. The file is rewritten whole
    at every flush that touches its owner, and rendering every memory again made a busy
    owner's flushes quadratic in its history (README, "Known limits"). A record is
    immutable, so the same object is the same lines. Bounded: past `max_lines` memories,
    the owners written longest ago are dropped (the one written last is always kept)."""

    max_lines: int = 50_000
    owners: OrderedDict[tuple[str, str], dict[str, tuple[MemoryRecord, str, str]]] = field(
        default_factory=OrderedDict)
    size: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def write(self, root: Path, scope: str, owner: str, recs: list[MemoryRecord]) -> Path:
        with self._lock:
            key = (scope, owner)
            old = self.owners.pop(key, {})
            self.size -= len(old)
            new: dict[str, tuple[MemoryRecord, str, str]] = {}

            def lines_of(r: MemoryRecord) -> tuple[str, str]:
                hit = old.get(r.memory_id)
                if hit is None or hit[0] is not r:
                    hit = (r, *record_lines(r))
                new[r.memory_id] = hit
                return hit[1], hit[2]

            path = write_records(root, scope, owner, recs, lines_of)
            self.owners[key] = new
            self.size += len(new)
            while self.size > self.max_lines and len(self.owners) > 1:
                self.size -= len(self.owners.popitem(last=False)[1])
            return path

    def forget(self, owner: str) -> None:
        with self._lock:
            for key in [k for k in self.owners if k[1] == owner]:
                self.size -= len(self.owners.pop(key))


def forget_owner(root: Path, owner: str) -> list[Path]:
    """Delete the owner's folder in every scope (MEMORY.md and what a person wrote beside
    the generated block): a forget leaves no file of the owner."""
    gone = []
    for scope in SCOPES:
        folder = path_for(root, scope, owner).parent
        if folder.is_dir():
            shutil.rmtree(folder)
            gone.append(folder)
    return gone


@dataclass
class MarkdownSink:
    """Rewrites the MEMORY.md of every owner touched since the last flush.

    An owner whose file cannot be written stays dirty and is tried again after a back-off
    (RETRY_FIRST_S, doubling up to RETRY_MAX_S), with one warning per try: the projector
    flushes every 200 ms on a busy log, and one bad owner must neither hold up the others
    nor fill the log. Its failure is not the flush's: the flush returns, so the projector
    goes on committing and recall's projected barrier is not held up by a readable copy.
    """

    root: Path
    store: MemoryStore
    dirty: set[tuple[str, str]] = field(default_factory=set)
    clock: Callable[[], float] = time.monotonic
    # (scope, owner) -> (failed tries in a row, clock time of the next try)
    failing: dict[tuple[str, str], tuple[int, float]] = field(default_factory=dict)
    rendered: RenderedLines = field(default_factory=RenderedLines)

    forgotten: set[str] = field(default_factory=set)

    def on_event(self, ev: dict[str, Any]) -> None:
        if ev.get("op") == FORGET_OP:
            owner = str(ev["owner"])
            self.forgotten.add(owner)
            self.dirty = {k for k in self.dirty if k[1] != owner}
            self.rendered.forget(owner)
            return
        self.dirty.add((ev["scope"], ev["owner"]))

    async def flush(self) -> int:
        """Render and write in a thread: rendering a large owner and the fsync must not stall
        the worker's event loop (py-spy: ~7 % of its samples were these writes under load).
        The owners' record lists are taken on the loop; a record changed meanwhile is
        rewritten by the next flush. Returns the number of files written."""
        if self.forgotten:
            owners, self.forgotten = sorted(self.forgotten), set()
            for owner in owners:
                await asyncio.to_thread(forget_owner, self.root, owner)
        now = self.clock()
        due = sorted(o for o in self.dirty if self.failing.get(o, (0, now))[1] <= now)
        if not due:
            return 0
        self.dirty.difference_update(due)
        jobs = [(scope, owner, owner_records(self.store, scope, owner)) for scope, owner in due]
        try:
            errors = await asyncio.to_thread(self._write, jobs)
        except BaseException:  # cancelled: what was written is unknown, so all go again
            self.dirty.update(due)
            raise
        for key in due:
            if key in errors:
                self._failed(key, errors[key], now)
            elif self.failing.pop(key, None) is not None:
                log.warning("MEMORY.md of %s %s written again", key[0], _short(key[1]))
        return len(jobs) - len(errors)

    def _failed(self, key: tuple[str, str], exc: Exception, now: float) -> None:
        tries = self.failing.get(key, (0, now))[0] + 1
        wait = min(RETRY_MAX_S, RETRY_FIRST_S * 2 ** (tries - 1))
        self.failing[key] = (tries, now + wait)
        self.dirty.add(key)
        # an OSError (disk, permissions, a file in the way) says it all in one line; anything
        # else is a bug, whose traceback is worth having once
        log.warning("MEMORY.md of %s %s not written (%s: %s); try %d, next in %.0f s; the "
                    "other owners' files are written", key[0], _short(key[1]),
                    type(exc).__name__, exc, tries, wait,
                    exc_info=exc if tries == 1 and not isinstance(exc, OSError) else None)

    def _write(self, jobs: list[tuple[str, str, list[MemoryRecord]]]
               ) -> dict[tuple[str, str], Exception]:
        errors: dict[tuple[str, str], Exception] = {}
        for scope, owner, recs in jobs:
            try:
                self.rendered.write(self.root, scope, owner, recs)
            except Exception as exc:
                errors[(scope, owner)] = exc
        return errors


def _short(owner: str, n: int = 80) -> str:
    return repr(owner) if len(owner) <= n else repr(owner[:n]) + f"... ({len(owner)} chars)"
