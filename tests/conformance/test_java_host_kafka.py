"""Conformance: a Java host written from docs/PROTOCOL.md alone, against a real worker.

The host (tests/conformance/java, kafka-clients + avro, no generated code) writes two sessions
of one user, waits for the pipeline's decision on the audit topic, folds the inbox and claims
its packet; then it loses a claim race to the Python SDK. It prints one JSON object per line;
this module checks those lines against what the Python side reads from the same topics.

Nothing here is skipped: without Maven or a JDK the tests fail.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from mnemoflow.schemas.codec import default_registry
from mnemoflow.streams.host import CapabilityManifest, HostClient
from mnemoflow.streams.inbox import InboxClient
from mnemoflow.streams.producer import AvroProducer
from mnemoflow.streams.step import render_packet

from support import broker_audits, collect, gate_audits, isolated_settings, ready_worker

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(600)]

JAVA_DIR = Path(__file__).resolve().parent / "java"
MAIN = "io.mnemoflow.conformance.JavaHost"
DAY = 86_400_000
QUESTION = "What is my locker code? I forgot it."
INPUT_TOPICS = {"session-events": "io.mnemoflow.SessionEvent", "tool-results": "io.mnemoflow.ToolResult",
                "agent-steps": "io.mnemoflow.AgentStep"}
AUDIT_FIELDS = ("auditId", "sessionId", "userId", "stage", "action", "reason", "eventTime", "eventSeq",
                "contextVersion", "segmentId", "segmentDigest", "requestId", "packetId")
RUN_TIMEOUT = 450.0  # the host bounds each of its waits at 120 s


@pytest.fixture(scope="session")
def java_host() -> list[str]:
    """`mvn -q -B package` once per test session; the command line that runs the host."""
    missing = [tool for tool in ("mvn", "java") if shutil.which(tool) is None]
    if missing:
        pytest.fail(f"the Java conformance host needs {' and '.join(missing)} on PATH "
                    "(JDK 17+ and Maven 3.8+); it is part of the suite and is never skipped",
                    pytrace=False)
    target = JAVA_DIR / "target"
    target.mkdir(exist_ok=True)
    with open(target / ".build.lock", "w") as lock:  # concurrent test runs share this tree
        fcntl.flock(lock, fcntl.LOCK_EX)
        build = subprocess.run(["mvn", "-q", "-B", "package"], cwd=JAVA_DIR, capture_output=True,
                               text=True, timeout=540)
    if build.returncode != 0:
        pytest.fail(f"mvn package failed ({build.returncode}):\n{build.stdout[-4000:]}\n"
                    f"{build.stderr[-4000:]}", pytrace=False)
    classpath = os.pathsep.join([str(target / "classes"), str(target / "lib" / "*")])
    return [shutil.which("java") or "java", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
            "-cp", classpath, MAIN]


@pytest.fixture(scope="module")
async def worker(kafka_bootstrap, tmp_path_factory):
    s = isolated_settings(tmp_path_factory.mktemp("conformance"), "java")
    async with ready_worker(s, kafka_bootstrap) as w:
        yield w


def _env(s) -> dict[str, str]:  # type: ignore[no-untyped-def]
    """The deployment's key-encryption key, with which the host opens packet items (§13)."""
    return {**os.environ, "MNEMOFLOW_KEK_FILE": str(s.kek_path)}


def _parse(out: bytes) -> list[dict]:
    return [json.loads(line) for line in out.decode().splitlines() if line.strip()]


def _ok(proc: asyncio.subprocess.Process, lines: list[dict], err: bytes) -> None:
    assert proc.returncode == 0 and lines and lines[-1]["event"] == "done", (
        f"java host failed (rc {proc.returncode}):\n"
        + "\n".join(json.dumps(x) for x in lines[-20:]) + "\n" + err.decode()[-4000:])


def _one(lines: list[dict], event: str, **match) -> dict:
    got = [x for x in lines if x["event"] == event and all(x.get(k) == v for k, v in match.items())]
    assert len(got) == 1, f"expected one {event} {match}, got {got}"
    return got[0]


@pytest.fixture(scope="module")
async def java_run(java_host, worker) -> dict:
    """The host's scenario: sessions A (states the code) and B (a day later, asks for it)."""
    s, bs = worker.settings, worker.bootstrap
    tag = uuid.uuid4().hex[:10]
    proc = await asyncio.create_subprocess_exec(
        *java_host, bs, s.topic_prefix, tag, "scenario", env=_env(s),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), RUN_TIMEOUT)
    lines = _parse(out)
    _ok(proc, lines, err)
    return {"tag": tag, "lines": lines, "user": f"juser-{tag}", "a": f"jA-{tag}", "b": f"jB-{tag}"}


async def test_java_host_writes_waits_and_claims_from_the_document_alone(java_run, worker):
    s, bs = worker.settings, worker.bootstrap
    lines, a, b = java_run["lines"], java_run["a"], java_run["b"]
    assert _one(lines, "selftest")["ok"] is True  # every vector of the document, in Java

    # 1. what it wrote: one eventSeq sequence per session over the three topics, turn/step
    # rules, the default partitioner's choice = the document's murmur2 partition
    produced = [x for x in lines if x["event"] == "produced"]
    assert all(x["partition"] == x["expectedPartition"] for x in produced)
    shape = {sid: [(x["topic"].removeprefix(s.topic_prefix), x["kind"], x["eventSeq"], x["turn"], x["step"])
                   for x in produced if x["sessionId"] == sid] for sid in (a, b)}
    assert shape[a] == [("session-events", "lifecycle:start", 1, 0, 0),
                        ("session-events", "user_message", 2, 1, 0),
                        ("agent-steps", "agent_step:start", 3, 1, 1),
                        ("tool-results", "tool_result:ok", 4, 1, 1),
                        ("agent-steps", "agent_step:end", 5, 1, 1),
                        ("session-events", "assistant_message", 6, 1, 1)]
    assert shape[b] == [("session-events", "lifecycle:start", 1, 0, 0),
                        ("session-events", "user_message", 2, 1, 0),
                        ("session-events", "feedback:packet_delivered", 3, 1, 0)]
    start = {x["sessionId"]: x["eventTime"] for x in produced if x["kind"] == "lifecycle:start"}
    assert start[b] == start[a] + DAY  # B is a day after A, in event time

    # the Python codec reads every value it wrote, and writes the same record to the same bytes
    reg = default_registry()
    for x in produced:
        value = bytes.fromhex(x["valueHex"])
        name, rec = reg.decode(value, INPUT_TOPICS[x["topic"].removeprefix(s.topic_prefix)])
        assert reg.encode(name, rec) == value
        assert (rec["sessionId"], rec["eventSeq"], rec["turn"], rec["step"], rec["eventTime"]) == (
            x["sessionId"], x["eventSeq"], x["turn"], x["step"], x["eventTime"])

    # accepted: the gate decided every event with a segment (all but the text-less step start)
    # and no dead letter is about them; the probe it wrote with schemaVersion 2 is, and both
    # sides find that one dead letter (so the look-up of §10 is not vacuous)
    probe = _one(lines, "produced", kind="probe:schema-version")
    ours = [x for x in produced if x["sessionId"] in (a, b)]
    expect_gate = {(x["sessionId"], x["eventSeq"]) for x in ours if x["kind"] != "agent_step:start"}
    recs = await collect(s, bs, ["audit", "session-events", "inbox"], lambda r: expect_gate <= {
        (g["sessionId"], g["eventSeq"]) for g in gate_audits(r)}, 120)
    dead = (await collect(s, bs, ["dead-letter"], lambda r: True, 30))["dead-letter"]
    written = {(x["topic"], x["partition"], x["offset"]) for x in produced}
    about_us = [(d["sourceTopic"], d["partition"], d["offset"], d["reason"], d["stage"], d["key"])
                for d in dead if (d["sourceTopic"], d["partition"], d["offset"]) in written
                or d["key"] in (a.encode(), b.encode())]
    assert about_us == [(probe["topic"], probe["partition"], probe["offset"], "schema-version", "observer",
                         probe["sessionId"].encode())]
    java_dead = _one(lines, "dead-letters")["matched"]
    assert [(m["sourceTopic"], m["partition"], m["offset"], m["reason"], m["stage"]) for m in java_dead] == [
        x[:5] for x in about_us]
    assert not {x["sessionId"] for x in produced} - {a, b, probe["sessionId"]}

    # 2. the decisions it waited for are the records the Python reader sees
    by_id = {r["auditId"]: r for r in recs["audit"]}
    decisions = {x["sessionId"]: x for x in lines if x["event"] == "decision"}
    assert set(decisions) == {a, b}
    for d in decisions.values():
        assert d["undecided"] == [] and d["gate"]
        for seen in d["gate"] + d["broker"]:
            assert {k: by_id[seen["auditId"]][k] for k in AUDIT_FIELDS} == seen
    db = decisions[b]
    assert db["outcome"] == "packet" and db["eventSeqs"] == [2]
    gate_b = db["gate"][0]
    assert gate_b["action"] in ("retrieve", "prefetch") and gate_b["eventSeq"] == 2
    assert [x["action"] for x in db["broker"]] == ["inject"]
    assert db["broker"][0]["requestId"] == gate_b["requestId"]
    pid = db["broker"][0]["packetId"]
    assert db["packetIds"] == [pid]
    python_broker = [r for r in broker_audits(recs) if r["sessionId"] == b]
    assert [(r["action"], r["packetId"]) for r in python_broker] == [("inject", pid)]

    # 3. it claimed the packet (its op won on read-back), with the code, and reported delivery
    claims = [x for x in lines if x["event"] == "claim" and x["sessionId"] == b]
    assert [c["result"] for c in claims] == ["won", "none"]
    won = claims[0]
    assert won["named"] == [pid] and won["lost"] == {} and len(won["opIds"]) == 1
    (packet,) = won["won"]
    assert packet["packetId"] == pid and packet["sessionId"] == b
    assert any("zq417x" in item["text"] for item in packet["items"])
    # rendered from PROTOCOL.md section 7 alone: byte for byte what the Python SDK renders
    (injected,) = [op["packet"] for op in recs["inbox"]
                   if op["op"] == "inject" and op["packet"]["packetId"] == pid]
    assert _one(lines, "rendered", sessionId=b)["text"] == render_packet(injected)
    claim_op = _one(lines, "op", opId=won["opIds"][0])
    assert claim_op["op"] == "claim" and claim_op["offset"] == won["offsets"][0]
    feedback = [e for e in recs["session-events"] if e["sessionId"] == b and e["type"] == "feedback"]
    assert [(e["feedbackKind"], e["feedbackRef"]) for e in feedback] == [("packet_delivered", pid)]
    assert feedback[0]["attributes"] == {"memoryIds": ",".join(i["memoryId"] for i in packet["items"])}
    assert [o["op"] for o in lines if o["event"] == "op"] == ["claim"]  # nothing expired or visible

    # the Python SDK's fold agrees: claimed by the Java host's op, not pending
    prod = AvroProducer(s, bs)
    await prod.start()
    inbox = InboxClient(s, bs, prod)
    await inbox.start()
    try:
        state = await inbox.sync(b)
        assert state.claimed.get(pid) == won["opIds"][0]
        assert pid not in state.pending_ids()
        assert (await inbox.claim_all(b, packet["createdAt"] + 3_000)).packets == ()
    finally:
        await inbox.stop()
        await prod.stop()
    java_ops = [o for o in recs["inbox"] if o["sessionId"] == b and o["op"] == "claim"]
    assert [(o["opId"], o["claimer"], o["packetIds"]) for o in java_ops] == [
        (won["opIds"][0], f"java-host-{java_run['tag']}", [pid])]


async def test_java_host_loses_a_claim_race_to_the_python_sdk(java_host, java_run, worker):
    """The Python SDK claims between the Java host's fold and its claim write: Java's op lands
    second in the partition, so on read-back it has won nothing and must say so."""
    s, bs = worker.settings, worker.bootstrap
    tag, user = java_run["tag"], java_run["user"]
    t_b = max(x["eventTime"] for x in java_run["lines"]
              if x["event"] == "produced" and x["sessionId"] == java_run["b"])
    c, t_c = f"pyC-{tag}", t_b + DAY
    async with HostClient(s, bs) as host:
        sess = host.session(c, user)
        await sess.lifecycle("start", t_c, CapabilityManifest(provider="py", model="m", supportsPreStep=True))
        await sess.user_message(QUESTION, t_c + 1_000)
    recs = await collect(s, bs, ["audit"], lambda r: any(
        x["sessionId"] == c for x in broker_audits(r)), 150)
    (inject,) = [x for x in broker_audits(recs) if x["sessionId"] == c]
    assert inject["action"] == "inject", inject
    pid, now = inject["packetId"], t_c + 2_000

    proc = await asyncio.create_subprocess_exec(
        *java_host, bs, s.topic_prefix, tag, "claim-after", c, str(now), env=_env(s),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    stderr = asyncio.ensure_future(proc.stderr.read())
    prod = AvroProducer(s, bs)
    await prod.start()
    inbox = InboxClient(s, bs, prod)
    await inbox.start()
    try:
        before: list[dict] = []

        async def until_ready() -> dict:  # the host has folded and holds the packet as pending
            while True:
                raw = await proc.stdout.readline()
                assert raw, f"java host ended before 'ready': {before}\n{(await stderr).decode()[-4000:]}"
                before.append(json.loads(raw))
                if before[-1]["event"] in ("ready", "error"):
                    return before[-1]

        ready = await asyncio.wait_for(until_ready(), RUN_TIMEOUT)
        assert ready["event"] == "ready" and ready["pending"] == [pid], before
        py = await inbox.claim_all(c, now)  # acknowledged: Python's claim op is in the log first
        assert [p["packetId"] for p in py.packets] == [pid]
        assert any("zq417x" in i["text"] for i in py.packets[0]["items"])
        proc.stdin.write(b"go\n")
        await proc.stdin.drain()
        proc.stdin.close()
        out = await asyncio.wait_for(proc.stdout.read(), RUN_TIMEOUT)
        await asyncio.wait_for(proc.wait(), 30)
        lines = before + _parse(out)
        _ok(proc, lines, await stderr)
        state = await inbox.sync(c)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await inbox.stop()
        await prod.stop()

    claim = _one(lines, "claim", sessionId=c)
    assert claim["named"] == [pid] and len(claim["opIds"]) == 1  # it did write a claim for it
    assert claim["result"] == "lost" and claim["won"] == []
    winner = state.claimed[pid]
    assert claim["lost"] == {pid: winner} and winner != claim["opIds"][0]
    assert not any(x["event"] == "rendered" for x in lines)  # never handed out
    log = (await collect(s, bs, ["inbox"], lambda r: any(
        o["opId"] == claim["opIds"][0] for o in r["inbox"]), 30))["inbox"]
    claims = [(o["opId"], o["claimer"]) for o in log if o["sessionId"] == c and o["op"] == "claim"]
    assert [op for op, _ in claims] == [winner, claim["opIds"][0]]  # Python's op first, then Java's
    assert claims[1][1] == f"java-host-{tag}"
