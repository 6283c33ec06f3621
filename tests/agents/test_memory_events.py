"""Memory-log records: complete, deterministic, and every op documented in the schema."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from mnemoflow.agents import memory_events as M
from mnemoflow.agents.ids import stable_id
from mnemoflow.projections.memory_store import MemoryStore
from mnemoflow.schemas.codec import default_registry

ROOT = Path(__file__).resolve().parents[2]
T = 1_700_000_000_000


def _host_events() -> list[dict]:
    return [M.host_fact("u1", "", T, subject="Editor", predicate="is", obj="vim"),
            M.host_fact("ws1", "Deploys freeze on Fridays.", T, scope="Workspace"),
            M.host_revoke("u1", "fact:x", T), M.host_alias("u1", "SRE", "site reliability", T),
            M.host_alias("u1", "SRE", "site reliability", T, revoke=True),
            M.host_confirm("u1", "fact:x", T), M.host_approve_procedure("u1", "proc:y", T)]


def test_host_writes_are_complete_and_round_trip() -> None:
    reg = default_registry()
    fields = [f["name"] for f in reg.schema("io.mnemoflow.MemoryEvent").parsed["fields"]]
    for ev in _host_events():
        assert list(ev) == fields and ev["source"] == "host"
        assert reg.decode(reg.encode("io.mnemoflow.MemoryEvent", ev))[1] == ev


def test_host_writes_are_idempotent_and_merge_with_extracted_facts() -> None:
    a = M.host_fact("u1", "", T, subject="Editor", predicate="is", obj="vim")
    assert a == M.host_fact("u1", "", T, subject="Editor", predicate="is", obj="vim")
    # the id rule/extract.py gives "my editor is vim"
    assert a["memoryId"] == stable_id("fact", "u1", "editor", "is", "vim")
    assert a["text"] == "editor is vim" and a["attributes"]["correction"] == "1"


def test_ids_with_commas_are_refused() -> None:
    with pytest.raises(ValueError):
        M.host_revoke("u1", "a,b", T)
    with pytest.raises(ValueError):
        M.memory_event(event_id="e", op="x", memory_id="m", kind="fact", scope="Planet",
                       owner="u", event_time=T)


def test_a_host_fact_replaces_the_value_and_keeps_the_old_in_the_conflict_set() -> None:
    s = MemoryStore()
    s.apply(M.host_fact("u1", "", T, subject="editor", predicate="is", obj="vim"))
    s.apply(M.host_fact("u1", "", T + 1, subject="editor", predicate="is", obj="helix"))
    live = [r.text for r in s.records.values() if not r.revoked]
    assert live == ["editor is helix"]
    assert s.conflicts[("u1", "editor", "is")][-1]["status"] == "superseded-previous"
    note_a = M.host_fact("u1", "Parking is on level 3.", T)
    note_b = M.host_fact("u1", "The wifi is guest-5.", T)
    s.apply(note_a)
    s.apply(note_b)
    assert not s.records[note_a["memoryId"]].revoked  # free notes never conflict


def test_every_op_written_is_documented_in_the_schema() -> None:
    schema = json.loads((ROOT / "schemas" / "memory-log.avsc").read_text())
    doc = next(f["doc"] for f in schema["fields"] if f["name"] == "op")
    documented = set(re.findall(r"[a-z_]+", doc))
    written = set()
    for path in (ROOT / "agents").glob("*.py"):
        written |= set(re.findall(r'"((?:segment|episode|fact|procedure|alias|evidence|memory)'
                                  r'_[a-z_]+)"', path.read_text()))
    written = {w for w in written if not w.endswith("_")}
    assert written <= documented, written - documented
