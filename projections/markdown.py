"""M-06 readable projection: one MEMORY.md per scope owner, and the way back from it.

Only the block between the mnemoflow markers is generated; anything a person writes
outside it is kept byte for byte. Each generated line carries its full record in an HTML
comment, so the index can be rebuilt from the Markdown files alone. Writes are atomic
(temp file, then rename), so a crash never leaves half a file.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mnemoflow.projections.memory_store import MemoryRecord, MemoryStore

BEGIN = "<!-- mnemoflow:begin (generated from the memory-log; write outside this block) -->"
END = "<!-- mnemoflow:end -->"
_LINE = re.compile(r"<!-- mf (\{.*\}) -->\s*$")
SECTIONS = (("fact", "Facts"), ("procedure", "Procedures"), ("episode", "Episodes"),
            ("segment", "Conversation log"))
OP_FOR_KIND = {"segment": "segment_recorded", "episode": "episode_recorded",
               "fact": "fact_upserted", "procedure": "procedure_observed"}


def path_for(root: Path, scope: str, owner: str) -> Path:
    safe = re.sub(r"[^\w.\-]", "_", owner)
    return root / scope / safe / "MEMORY.md"


def _meta(r: MemoryRecord) -> dict[str, Any]:
    return {"id": r.memory_id, "kind": r.kind, "scope": r.scope, "owner": r.owner,
            "session": r.session_id, "seq": r.event_seq, "t": r.event_time,
            "prov": list(r.provenance), "ent": list(r.entities), "src": r.source,
            "conf": r.confidence, "ttl": r.ttl_ms, "risk": r.risk_level,
            "attrs": r.attributes, "text": r.text}


def render_block(records: list[MemoryRecord], title: str) -> str:
    lines = [BEGIN, f"## mnemoflow memory: {title}", ""]
    for kind, heading in SECTIONS:
        rows = sorted((r for r in records if r.kind == kind and not r.revoked),
                      key=lambda r: (r.event_time, r.memory_id))
        if not rows:
            continue
        lines += [f"### {heading}", ""]
        for r in rows:
            shown = " ".join(r.text.split())[:200]
            lines.append(f"- {shown} <!-- mf {json.dumps(_meta(r), ensure_ascii=False)} -->")
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
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def owner_records(store: MemoryStore, scope: str, owner: str) -> list[MemoryRecord]:
    return [store.records[m] for m in sorted(store.by_owner.get((scope, owner), ()))]


def write_records(root: Path, scope: str, owner: str, recs: list[MemoryRecord]) -> Path:
    path = path_for(root, scope, owner)
    existing = path.read_text(encoding="utf-8") if path.exists() else ""
    atomic_write(path, merge_into(existing, render_block(recs, f"{scope} {owner}")))
    return path


def write_owner(root: Path, store: MemoryStore, scope: str, owner: str) -> Path:
    return write_records(root, scope, owner, owner_records(store, scope, owner))


def events_from_markdown(root: Path) -> list[dict[str, Any]]:
    """The memory-log records that the MEMORY.md files under `root` describe."""
    out = []
    for path in sorted(root.rglob("MEMORY.md")):
        text = path.read_text(encoding="utf-8")
        if BEGIN not in text:
            continue
        block = text.split(BEGIN, 1)[1].split(END, 1)[0]
        for line in block.splitlines():
            m = _LINE.search(line)
            if not m:
                continue
            d = json.loads(m.group(1))
            attrs = d.get("attrs") or {}
            out.append({
                "eventId": f"md:{d['id']}", "op": OP_FOR_KIND.get(d["kind"], "segment_recorded"),
                "memoryId": d["id"], "kind": d["kind"], "scope": d["scope"], "owner": d["owner"],
                "sessionId": d["session"], "eventSeq": d["seq"], "eventTime": d["t"],
                "text": d["text"], "entities": d["ent"], "provenance": d["prov"],
                "source": d["src"], "confidence": d["conf"], "ttlMs": d["ttl"],
                "subject": attrs.get("subject"), "predicate": attrs.get("predicate"),
                "object": attrs.get("object"), "riskLevel": d["risk"],
                "attributes": attrs})
    out.sort(key=lambda e: (e["eventTime"], e["memoryId"]))
    return out


@dataclass
class MarkdownSink:
    """Rewrites the MEMORY.md of every owner touched since the last flush."""

    root: Path
    store: MemoryStore
    dirty: set[tuple[str, str]] = field(default_factory=set)

    def on_event(self, ev: dict[str, Any]) -> None:
        self.dirty.add((ev["scope"], ev["owner"]))

    async def flush(self) -> int:
        """Render and write in a thread: rendering a large owner and the fsync must not stall
        the worker's event loop (py-spy: ~7 % of its samples were these writes under load).
        The owners' record lists are taken on the loop; a record changed meanwhile is
        rewritten by the next flush. On failure the owners stay dirty for the next one."""
        owners = sorted(self.dirty)
        self.dirty.clear()
        jobs = [(scope, owner, owner_records(self.store, scope, owner)) for scope, owner in owners]
        try:
            await asyncio.to_thread(self._write, jobs)
        except BaseException:
            self.dirty.update(owners)
            raise
        return len(jobs)

    def _write(self, jobs: list[tuple[str, str, list[MemoryRecord]]]) -> None:
        for scope, owner, recs in jobs:
            write_records(self.root, scope, owner, recs)
