"""The durable inbox and the host SDK against the real broker (issue 4)."""

from __future__ import annotations

import asyncio
import hashlib

import pytest
from aiokafka import AIOKafkaProducer
from test_topology_kafka import MANIFEST, _ask, _start, _two_phase, _wait_gate

from mnemoflow.agents.ids import stable_id
from mnemoflow.projections.memory_store import MemoryStore
from mnemoflow.schemas.codec import default_registry
from mnemoflow.streams import topics as T
from mnemoflow.streams.host import CapabilityManifest, HostClient
from mnemoflow.streams.inbox import InboxClient
from mnemoflow.streams.producer import AvroProducer
from mnemoflow.streams.step import StepAssembler

from factories import T0
from support import broker_audits, collect, isolated_settings, prepare_topics

pytestmark = pytest.mark.kafka


def _packet(sid: str, n: int, expiry: int = T0 + 600_000, digest: str | None = None) -> dict:
    pid = stable_id("pkt", sid, n)
    item = {"memoryId": f"m{n}", "kind": "segment", "text": f"memory number {n}", "scope": "User",
            "owner": "u", "score": 1.0, "sourceSeq": n, "sourceSessionId": "old",
            "provenance": f"old#{n}.0", "eventTime": T0 - 1, "digest": f"d{n}", "tiers": ["lexical"]}
    return {"packetSchemaVersion": 1, "packetId": pid, "sessionId": sid, "requestId": f"r{n}",
            "contextCursor": n, "retrievalVersion": "lexical/gen1", "triggerReason": "test",
            "strength": "soft_hint", "items": [item], "exactDigest": digest or f"x-{sid}-{n}",
            "semanticDigest": "s", "sourceSeqs": [n], "budgetBytes": 16, "createdAt": T0,
            "expiry": expiry}


async def _inject(s, bs, packets: list[dict]) -> None:
    async with AvroProducer(s, bs) as p:
        for pk in packets:
            op = {"opId": stable_id("op", "inject", pk["packetId"]), "op": "inject",
                  "sessionId": pk["sessionId"], "eventTime": T0, "packet": pk,
                  "packetIds": [pk["packetId"]], "claimer": None, "reason": "test",
                  "authorisedBy": None}
            await p.send(T.INBOX.name(s), "io.mnemoflow.InboxOp", pk["sessionId"], op)


async def _client(s, bs, checkpoints: bool = True):
    prod = AvroProducer(s, bs)
    await prod.start()
    inbox = InboxClient(s, bs, prod, checkpoints=checkpoints)
    await inbox.start()
    return prod, inbox


async def _close(prod, inbox) -> None:
    await inbox.stop()
    await prod.stop()


@pytest.fixture
async def topics(kafka_bootstrap, tmp_path):
    s = isolated_settings(tmp_path, "inbox")
    await prepare_topics(s, kafka_bootstrap)
    return s


async def test_host_restart_rebuilds_pending_and_claims_exactly_once(topics, kafka_bootstrap):
    s, bs = topics, kafka_bootstrap
    await _inject(s, bs, [_packet("sA", n) for n in range(1, 4)])
    prod, inbox = await _client(s, bs)
    assert [p["contextCursor"] for p in await inbox.pending("sA", T0)] == [1, 2, 3]
    await _close(prod, inbox)  # the host process goes away between inject and claim
    prod, inbox = await _client(s, bs)  # a new one rebuilds from the log
    try:
        got = await inbox.claim_all("sA", T0 + 1)
        assert [p["contextCursor"] for p in got.packets] == [1, 2, 3]  # FIFO
        again = await inbox.claim_all("sA", T0 + 2)
        assert again.packets == ()
    finally:
        await _close(prod, inbox)
    prod, inbox = await _client(s, bs)
    try:
        assert (await inbox.claim_all("sA", T0 + 3)).packets == ()  # durable: claimed stays
    finally:
        await _close(prod, inbox)


async def test_concurrent_claimers_never_share_a_packet(topics, kafka_bootstrap):
    s, bs = topics, kafka_bootstrap
    await _inject(s, bs, [_packet("sC", n) for n in range(1, 21)])
    clients = [await _client(s, bs) for _ in range(3)]
    try:
        results = await asyncio.gather(*(c[1].claim_all("sC", T0 + 1) for c in clients))
        later = await asyncio.gather(*(c[1].claim_all("sC", T0 + 2) for c in clients))
    finally:
        for c in clients:
            await _close(*c)
    ids = [p["packetId"] for r in (*results, *later) for p in r.packets]
    assert len(ids) == len(set(ids)) == 20


async def test_claimed_or_visible_digest_is_not_injected_twice(topics, kafka_bootstrap):
    s, bs = topics, kafka_bootstrap
    await _inject(s, bs, [_packet("sD", 1, digest="SAME")])
    prod, inbox = await _client(s, bs)
    try:
        assert len((await inbox.claim_all("sD", T0)).packets) == 1
        await _inject(s, bs, [_packet("sD", 2, digest="SAME"), _packet("sD", 3, digest="SEEN")])
        res = await inbox.claim_all("sD", T0 + 1, visible_digests=frozenset({"SEEN"}))
        assert res.packets == () and res.already_visible == (stable_id("pkt", "sD", 3),)
    finally:
        await _close(prod, inbox)


async def test_expired_packet_is_never_delivered(topics, kafka_bootstrap):
    s, bs = topics, kafka_bootstrap
    await _inject(s, bs, [_packet("sE", 1, expiry=T0 + 10), _packet("sE", 2)])
    async with HostClient(s, bs) as host:
        prod, inbox = await _client(s, bs)
        try:
            step = StepAssembler(host.session("sE", "u"), inbox, MANIFEST)
            res = await step.step_boundary(T0 + 1000, user_message="hi")
            assert res.claim.expired == (stable_id("pkt", "sE", 1),)
            assert res.delivered == (stable_id("pkt", "sE", 2),)
            assert "memory number 1" not in str(res.request.messages)
        finally:
            await _close(prod, inbox)
    recs = await collect(s, bs, ["session-events", "inbox"], lambda r: r["session-events"], 20)
    feedback = [e for e in recs["session-events"] if e["type"] == "feedback"]
    assert [e["feedbackRef"] for e in feedback] == [stable_id("pkt", "sE", 2)]
    assert [e["attributes"] for e in feedback] == [{"memoryIds": "m2"}]  # for G-01 evidence
    assert any(op["op"] == "expire" for op in recs["inbox"])


async def test_host_writes_memory_directly(topics, kafka_bootstrap):
    s, bs = topics, kafka_bootstrap
    async with HostClient(s, bs) as host:
        fact = await host.remember("alice", "", T0, subject="editor", predicate="is", obj="vim")
        await host.alias("alice", "ed", "editor", T0 + 1)
        await host.revoke("alice", fact["memoryId"], T0 + 2)
    recs = await collect(s, bs, ["memory-log"], lambda r: len(r["memory-log"]) >= 3, 30)
    log = recs["memory-log"]
    assert [e["op"] for e in log] == ["fact_upserted", "alias_added", "memory_revoked"]
    assert all(e["source"] == "host" and e["owner"] == "alice" for e in log)
    store = MemoryStore()
    for e in log:
        store.apply(e)
    assert store.records[fact["memoryId"]].revoked


async def test_step_boundary_order_and_request_audit(topics, kafka_bootstrap):
    s, bs = topics, kafka_bootstrap
    await _inject(s, bs, [_packet("sF", 1)])
    calls: list[str] = []
    async with HostClient(s, bs) as host:
        prod, inbox = await _client(s, bs)
        try:
            snap = {"v": "branch: main"}
            step = StepAssembler(
                host.session("sF", "u"), inbox,
                CapabilityManifest(provider="p", model="m", reasoning="summary",
                                   supportsPreStep=True),
                sections=[lambda: calls.append("section") or "Stable rules."],
                context=[lambda: calls.append("context") or snap["v"]],
                listeners=[lambda ev: (calls.append("pre-step"), ("enter", ev.messages))[1]])
            r1 = await step.step_boundary(T0, user_message="first")
            assert calls == ["section", "context", "pre-step"]
            a = r1.request.audit
            assert (a.provider, a.model, a.reasoning) == ("p", "m", "summary")
            assert a.packetBytes > 0 and a.packetDigest and a.contextVersion == 1
            assert r1.request.system == "Stable rules."
            kinds = [m.get("kind") for m in r1.request.messages]
            assert kinds == ["memory-packet", "runtime-context", None]
            sent = r1.request.messages
            r2 = await step.step_boundary(T0 + 1, user_message="second")
            assert r1.request.messages == sent  # a sent request is never rewritten
            assert [m.get("kind") for m in r2.request.messages].count("runtime-context") == 1
            snap["v"] = "branch: feature"
            r3 = await step.step_boundary(T0 + 2, user_message="third")
            ctx = [m for m in r3.request.messages if m.get("kind") == "runtime-context"]
            assert [m["content"] for m in ctx] == ["branch: feature"]  # replaced, not added
            assert r3.request.audit.packetBytes == 0

            async def slow() -> str:
                return "x"

            bad = StepAssembler(host.session("sG", "u"), inbox, MANIFEST, sections=[slow])
            with pytest.raises(TypeError, match="synchronous"):
                await bad.step_boundary(T0)
            await _inject(s, bs, [_packet("sH", 1)])
            rej = StepAssembler(host.session("sH", "u"), inbox, MANIFEST,
                                listeners=[lambda ev: ("reject", "policy")])
            res = await rej.step_boundary(T0)
            assert res.rejected == "policy" and res.delivered == () and res.request is None
        finally:
            await _close(prod, inbox)


async def test_worker_sigkill_keeps_the_pending_set_and_shadow_mode(kafka_bootstrap, tmp_path):
    s = isolated_settings(tmp_path, "inbox-kill")
    w = await _start(s, kafka_bootstrap)
    try:
        sent = await _two_phase(s, kafka_bootstrap, 6)
        await collect(s, kafka_bootstrap, ["audit"], _wait_gate(sent["session-events"]), 60)
        await _ask(s, kafka_bootstrap, list(range(6)))
        await collect(s, kafka_bootstrap, ["inbox"], lambda r: len(r["inbox"]) >= 6, 60)
        prod, inbox = await _client(s, kafka_bootstrap)
        before = {u: [p["packetId"] for p in await inbox.pending(f"ask-{u}", T0)] for u in range(6)}
        await _close(prod, inbox)
        w.kill()
        w.start()
        await w.wait_ready()
        # shadow session: no packet surface declared
        async with HostClient(s, kafka_bootstrap) as host:
            sh = host.session("shadow-0", "user-0")
            await sh.lifecycle("start", T0 + 2 * 86_400_000,
                               CapabilityManifest(provider="p", model="m"))
            await sh.user_message("What is my locker code? I forgot it.", T0 + 2 * 86_400_000 + 1)
        recs = await collect(s, kafka_bootstrap, ["audit", "inbox"], lambda r: any(
            a["sessionId"] == "shadow-0" for a in broker_audits(r)), 60)
        prod, inbox = await _client(s, kafka_bootstrap)
        after = {u: [p["packetId"] for p in await inbox.pending(f"ask-{u}", T0)] for u in range(6)}
        claimed = await inbox.claim_all("ask-0", T0)
        await _close(prod, inbox)
    finally:
        w.stop()
    assert before == after and all(before.values())
    assert [p["packetId"] for p in claimed.packets] == before[0]
    shadow = [a for a in broker_audits(recs) if a["sessionId"] == "shadow-0"]
    assert shadow[0]["action"] == "shadow" and shadow[0]["packetId"]
    assert not [op for op in recs["inbox"] if op["sessionId"] == "shadow-0"]


async def _state(inbox: InboxClient, sid: str) -> tuple:
    st = await inbox.sync(sid)
    return (st.pending_ids(), [p["packetId"] for p in st.pending], list(st.claimed.items()),
            list(st.claimed_digests), list(st.applied), st.dropped, st.last_offset)


async def test_a_restarted_host_folds_only_the_log_after_the_newest_checkpoint(
        topics, kafka_bootstrap):
    s, bs = topics, kafka_bootstrap
    await _inject(s, bs, [_packet("sK", n) for n in range(1, 31)])
    prod, first = await _client(s, bs)
    first.checkpoint_every = 10  # the 30 injects it folds make it write one
    try:
        assert len((await first.claim_all("sK", T0)).packets) == 30
    finally:
        await _close(prod, first)
    await _inject(s, bs, [_packet("sK", n) for n in range(31, 36)])
    whole = await _client(s, bs, checkpoints=False)  # the reference: folds the whole log
    restarted = await _client(s, bs)
    try:
        assert await _state(restarted[1], "sK") == await _state(whole[1], "sK")
        assert whole[1].ops_folded("sK") == 36 and restarted[1].ops_folded("sK") == 6
        got = await restarted[1].claim_all("sK", T0 + 1)
        assert [p["contextCursor"] for p in got.packets] == [31, 32, 33, 34, 35]
    finally:
        await _close(*whole)
        await _close(*restarted)


async def test_a_checkpoint_that_does_not_fit_the_log_is_ignored(topics, kafka_bootstrap):
    s, bs = topics, kafka_bootstrap
    await _inject(s, bs, [_packet("sL", n) for n in range(1, 13)])
    prod, first = await _client(s, bs)
    first.checkpoint_every = 10
    try:
        await first.claim_all("sL", T0)
        p = first.partition_for("sL")
        reference = await _state(first, "sL")
        from mnemoflow.streams.reader import TopicReader

        async with TopicReader(s, bs, [first.checkpoint_topic]) as r:
            await r.drain()
            ck = [x.value for x in r.records if x.value][-1]
        assert ck["position"] == 12 and ck["sessions"][0]["sessionId"] == "sL"
        key = first._checkpoint_key(p)
        for bad in (b"not avro at all",  # unreadable
                    prod.registry.encode("io.mnemoflow.InboxCheckpoint",
                                         {**ck, "position": 10**9})):  # past the log's end
            await prod.send_raw(first.checkpoint_topic, key, bad, partition=p)
            c = await _client(s, bs)
            try:
                assert await _state(c[1], "sL") == reference
                assert c[1].ops_folded("sL") == 13  # the whole log: 12 injects and a claim
            finally:
                await _close(*c)
    finally:
        await _close(prod, first)


def _swapped_headers(op: dict, value: bytes) -> list[list[tuple[str, bytes]]]:
    """Fold headers another host's writer got wrong, kind and op id swapped: without a tag
    (the key that writer used), and with a tag computed right over the wrong fields."""
    fields = [op["opId"], op["op"], op["sessionId"], "", "", "0", *op["packetIds"]]
    text = "\x1f".join(fields).encode()
    h = hashlib.blake2b(text, digest_size=12)  # agents.inbox's tag, written from its description
    h.update(value)
    return [[("mf-fold", text)], [("mf-fold2", text + b"\x1f" + h.hexdigest().encode())]]


async def test_a_claim_op_with_a_swapped_header_still_takes_its_packet(topics, kafka_bootstrap):
    """The reported case: host A (not this SDK) claims a packet with a header whose kind and
    op id are swapped; a Python host's claim_all must not get that packet again."""
    s, bs = topics, kafka_bootstrap
    reg = default_registry()
    raw = AIOKafkaProducer(bootstrap_servers=bs, enable_idempotence=True, acks="all",
                           **s.client_kwargs())
    await raw.start()
    sessions = []
    try:
        for variant in range(2):
            sid = f"sW{variant}"
            pk = _packet(sid, 1)
            await _inject(s, bs, [pk])
            claim = {"opId": f"claim-by-A-{variant}", "op": "claim", "sessionId": sid,
                     "eventTime": T0, "packet": None, "packetIds": [pk["packetId"]],
                     "claimer": "host-A", "reason": None, "authorisedBy": None}
            value = reg.encode("io.mnemoflow.InboxOp", claim)
            await raw.send_and_wait(T.INBOX.name(s), value, key=sid.encode(),
                                    headers=_swapped_headers(claim, value)[variant])
            sessions.append((sid, pk["packetId"], claim["opId"]))
    finally:
        await raw.stop()
    prod, inbox = await _client(s, bs)
    try:
        for sid, pid, claim_id in sessions:
            got = await inbox.claim_all(sid, T0 + 1)
            assert [p["packetId"] for p in got.packets] == [], sid  # never a second claimer
            assert (await inbox.sync(sid)).winner(pid) == claim_id
    finally:
        await _close(prod, inbox)
