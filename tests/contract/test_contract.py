"""One contract, two runners: every case runs in memory and against the real broker.

The invariants of DESIGN.md (numbered in each docstring), shadow mode, claim-once and the
revoke cascade. Each case uses its own users and sessions, so the cases of one module share a
pipeline per configuration; add a case here when you add a stage.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from typing import Any

import pytest
from runners import Harness, MemoryHarness, open_harness

from mnemoflow.agents import memory_events as M
from mnemoflow.streams.host import CapabilityManifest

from factories import T0, user_event

MANIFEST = CapabilityManifest(provider="test", model="m", supportsPreStep=True)
SHADOW = CapabilityManifest(provider="test", model="m")  # no packet surface
DAY = 86_400_000
KINDS = ["memory", pytest.param("kafka", marks=pytest.mark.kafka)]
_ids = itertools.count()


async def _open(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
                config: str) -> AsyncIterator[Harness]:
    kind = request.param
    bootstrap = request.getfixturevalue("kafka_bootstrap") if kind == "kafka" else None
    h = await open_harness(kind, config, tmp_path_factory.mktemp(f"{kind}-{config}"), bootstrap)
    try:
        yield h
    finally:
        if hasattr(h, "stop"):
            await h.stop()


@pytest.fixture(scope="module", params=KINDS)
async def pipe(request, tmp_path_factory) -> AsyncIterator[Harness]:
    async for h in _open(request, tmp_path_factory, "default"):
        yield h


@pytest.fixture(scope="module", params=KINDS)
async def lexical(request, tmp_path_factory) -> AsyncIterator[Harness]:
    async for h in _open(request, tmp_path_factory, "lexical"):
        yield h


@pytest.fixture(scope="module", params=KINDS)
async def faulty(request, tmp_path_factory) -> AsyncIterator[Harness]:
    async for h in _open(request, tmp_path_factory, "faulty"):
        yield h


def _tag(name: str) -> str:
    return f"{name}{next(_ids)}"


async def _tell(h: Harness, user: str, secret: str, t: int = T0,
                manifest: CapabilityManifest = MANIFEST) -> str:
    sid = f"{user}/tell"
    s = h.session(sid, user)
    await s.lifecycle("start", t, manifest)
    await s.user_message(f"My locker code is {secret} and my favourite colour is teal.", t + 1000)
    return sid


async def _ask(h: Harness, user: str, n: int = 1, t: int = T0 + DAY,
               manifest: CapabilityManifest = MANIFEST) -> str:
    sid = f"{user}/ask{n}"
    s = h.session(sid, user)
    await s.lifecycle("start", t, manifest)
    await s.user_message("What is my locker code? I forgot it.", t + 1000)
    return sid


def _mine(recs: list[dict[str, Any]], sid: str) -> list[dict[str, Any]]:
    return [r for r in recs if r.get("sessionId") == sid]


async def _broker(h: Harness, sid: str) -> list[dict[str, Any]]:
    return [a for a in _mine(await h.records("audit"), sid) if a["stage"] == "broker"]


async def test_a_question_gets_a_traceable_packet_claimed_once(pipe: Harness) -> None:
    """8: every injection traces back to its source events and index version; 4: claimed once."""
    user = _tag("trace")
    await _tell(pipe, user, "zq417x")
    sid = await _ask(pipe, user)
    await pipe.settle()
    [audit] = [a for a in await _broker(pipe, sid) if a["action"] == "inject"]
    [op] = [o for o in _mine(await pipe.records("inbox"), sid) if o["op"] == "inject"]
    packet = op["packet"]
    assert audit["packetId"] == packet["packetId"]
    assert audit["indexVersion"] == packet["retrievalVersion"]
    assert any("zq417x" in it["text"] for it in packet["items"])
    assert audit["sourceSeqs"] == packet["sourceSeqs"]
    logged = {ev["memoryId"] for ev in await pipe.records("memory-log")}
    assert {it["memoryId"] for it in packet["items"]} <= logged
    assert [c["memoryId"] for c in audit["candidates"] if c["outcome"] == "kept"][:1] == \
        [packet["items"][0]["memoryId"]]
    got = await pipe.claim(sid, T0 + DAY + 2000)
    assert [p["packetId"] for p in got] == [packet["packetId"]]
    assert await pipe.claim(sid, T0 + DAY + 3000) == []


async def test_sessions_never_see_each_others_memories(pipe: Harness) -> None:
    """6: interleaved users each get only their own memories."""
    users = [_tag("leak") for _ in range(6)]
    for i, u in enumerate(users):
        await _tell(pipe, u, f"zq{i:03d}k", T0 + i)
    asks = {u: await _ask(pipe, u) for u in reversed(users)}
    await pipe.settle()
    injects = [o for o in await pipe.records("inbox") if o["op"] == "inject"]
    for i, u in enumerate(users):
        items = [it for o in injects if o["sessionId"] == asks[u] for it in o["packet"]["items"]]
        assert items, u
        assert {it["owner"] for it in items} == {u}
        assert any(f"zq{i:03d}k" in it["text"] for it in items)


async def test_retrieval_never_writes_session_topics_and_a_replay_observes_the_same(
        pipe: Harness, tmp_path) -> None:
    """1: the session topic holds exactly what the host sent; replaying it gives the same
    segments."""
    user = _tag("replay")
    tell = await _tell(pipe, user, "zq1r")
    ask = await _ask(pipe, user)
    await pipe.settle()
    sent = [r for r in await pipe.records("session-events") if r["sessionId"] in (tell, ask)]
    assert len(sent) == 4 and sorted(r["eventSeq"] for r in sent if r["sessionId"] == ask) == [1, 2]

    def fingerprint(segs: list[dict[str, Any]]) -> list[tuple]:
        return sorted((g["envelope"]["sessionId"], g["envelope"]["eventSeq"],
                       g["contextVersion"], g["digest"], g["kind"]) for g in segs
                      if g["envelope"]["sessionId"] in (tell, ask))

    first = fingerprint(await pipe.records("segments"))
    again = MemoryHarness(pipe.settings)
    for r in sent:
        await again.send("session-events", r["sessionId"], r)
    assert first and fingerprint(await again.records("segments")) == first


async def test_pending_packets_survive_a_restart(pipe: Harness) -> None:
    """3: kill the pipeline, start it again: the same pending set is claimed."""
    user = _tag("restart")
    await _tell(pipe, user, "zq3s")
    sid = await _ask(pipe, user)
    await pipe.settle()
    pending = [o["packet"]["packetId"] for o in _mine(await pipe.records("inbox"), sid)
               if o["op"] == "inject"]
    assert pending
    await pipe.restart()
    assert [p["packetId"] for p in await pipe.claim(sid, T0 + DAY + 2000)] == pending


async def test_a_claimed_digest_is_not_injected_again(pipe: Harness) -> None:
    """4: the same question again in the session brings no packet with a claimed digest."""
    user = _tag("once")
    await _tell(pipe, user, "zq4o")
    sid = await _ask(pipe, user)
    await pipe.settle()
    first = await pipe.claim(sid, T0 + DAY + 2000)
    assert first
    s = pipe.session(sid, user)
    s.turn = 1
    for seq in (3, 4):  # the session's first two events were the ask
        await s.user_message("What is my locker code? I forgot it.", T0 + DAY + 5000 * seq,
                             event_seq=seq)
    await pipe.settle()
    later = await pipe.claim(sid, T0 + DAY + 9000)
    seen = {it["digest"] for p in first for it in p["items"]}
    assert not any(it["digest"] in seen for p in later for it in p["items"])


async def test_an_expired_packet_is_never_delivered(pipe: Harness) -> None:
    """5: claimed after its expiry, a packet is expired, not delivered."""
    user = _tag("expiry")
    await _tell(pipe, user, "zq5e")
    sid = await _ask(pipe, user)
    await pipe.settle()
    [op] = [o for o in _mine(await pipe.records("inbox"), sid) if o["op"] == "inject"]
    assert await pipe.claim(sid, op["packet"]["expiry"] + 1) == []
    ops = [o["op"] for o in _mine(await pipe.records("inbox"), sid)]
    assert "expire" in ops and "claim" not in ops


async def test_a_stale_request_is_dropped_and_audited(pipe: Harness) -> None:
    """7: a request older than the session's latest contextVersion is dropped."""
    user = _tag("stale")
    sid = await _ask(pipe, user)
    await pipe.settle()
    [req] = _mine(await pipe.records("recall-requests"), sid)
    assert req["contextVersion"] > 0
    probe = {**req, "requestId": f"req:{sid}:probe", "contextVersion": 0,
             "segmentId": f"seg:{sid}:probe"}
    await pipe.send("recall-requests", sid, probe)
    await pipe.settle()
    [a] = [a for a in await _broker(pipe, sid) if a["requestId"] == probe["requestId"]]
    assert (a["action"], a["reason"], a["packetId"]) == ("drop", "stale-context", None)


async def test_shadow_mode_records_and_never_injects(pipe: Harness) -> None:
    """C-07: a host without a packet surface gets audits, never packets."""
    user = _tag("shadow")
    await _tell(pipe, user, "zq6h", manifest=SHADOW)
    sid = await _ask(pipe, user, manifest=SHADOW)
    await pipe.settle()
    actions = {a["action"] for a in await _broker(pipe, sid)}
    assert actions == {"shadow"}
    assert _mine(await pipe.records("inbox"), sid) == []


async def test_a_revoked_memory_and_what_came_from_it_are_never_recalled(pipe: Harness) -> None:
    """G-03/M-03: revoking a message hides it and the facts extracted from it."""
    user = _tag("revoke")
    tell = await _tell(pipe, user, "zq7v")
    first = await _ask(pipe, user, 1)
    await pipe.settle()
    assert any("zq7v" in it["text"] for o in _mine(await pipe.records("inbox"), first)
               if o["op"] == "inject" for it in o["packet"]["items"])
    log = await pipe.records("memory-log")
    [seg] = [e["memoryId"] for e in log if e["op"] == "segment_recorded"
             and e["sessionId"] == tell and "zq7v" in (e["text"] or "")]
    derived = {e["memoryId"] for e in log if e["owner"] == user and e["op"] != "segment_recorded"}
    assert derived  # the rule-based extraction made a fact of it
    await pipe.send("memory-log", user, M.host_revoke(user, seg, T0 + DAY + 5000))
    second = await _ask(pipe, user, 2, T0 + 2 * DAY)
    await pipe.settle()
    [audit] = await _broker(pipe, second)
    kept = {c["memoryId"] for c in audit["candidates"] if c["outcome"] == "kept"}
    assert not kept & {seg, *derived}
    injects = [o for o in _mine(await pipe.records("inbox"), second) if o["op"] == "inject"]
    assert not any("zq7v" in it["text"] for o in injects for it in o["packet"]["items"])


async def test_bad_input_is_dead_lettered_and_the_stream_goes_on(pipe: Harness) -> None:
    """10: undecodable bytes, a future schema version, an oversized payload: dead letters with
    a reason; the next good record is observed."""
    sid = _tag("bad")
    await pipe.send_bytes("session-events", sid.encode(), b"\x00garbage bytes")
    await pipe.send("session-events", sid, user_event(sid, 1, "from the future", schemaVersion=2))
    big = "x" * (pipe.settings.max_payload_bytes + 10)
    await pipe.send("session-events", sid, user_event(sid, 2, big))
    await pipe.send("session-events", sid, user_event(sid, 3, "a valid message about Atlas"))
    await pipe.settle()
    dls = [d for d in await pipe.records("dead-letter") if d["key"] == sid.encode()]
    assert sorted(d["reason"] for d in dls) == ["bad-magic", "oversized", "schema-version"]
    segs = [g for g in await pipe.records("segments") if g["envelope"]["sessionId"] == sid]
    assert [g["envelope"]["eventSeq"] for g in segs] == [3]


async def test_recall_answers_lexically_with_every_optional_layer_off(lexical: Harness) -> None:
    """9: no embeddings, no graph: recall still answers."""
    user = _tag("lex")
    await _tell(lexical, user, "zq9l")
    sid = await _ask(lexical, user)
    await lexical.settle()
    [audit] = await _broker(lexical, sid)
    assert audit["action"] == "inject" and audit["tiers"] == {"lexical": "ok"}


async def test_a_failed_retrieval_gives_no_packet_and_no_session_event(faulty: Harness) -> None:
    """2: every tier failing gives an audited drop, no packet and nothing in the session log."""
    user = _tag("fail")
    tell = await _tell(faulty, user, "zq2f")
    sid = await _ask(faulty, user)
    await faulty.settle()
    [audit] = await _broker(faulty, sid)
    assert (audit["action"], audit["reason"]) == ("drop", "recall-failed")
    assert set(audit["tiers"].values()) == {"error"}
    assert _mine(await faulty.records("inbox"), sid) == []
    mine = [r for r in await faulty.records("session-events") if r["sessionId"] in (tell, sid)]
    assert len(mine) == 4
