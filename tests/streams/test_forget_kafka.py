"""Forgetting a user holds (issue 18), against the real broker and real workers.

A user's memory holds a unique secret. Before the forget, the scan below finds it where it
should be (MEMORY.md, the LanceDB files, the audit store) and nowhere on the broker: the
memory-log holds it sealed. After `mnemoflow memories forget`, a worker restart (which folds
the memory-log again), `mnemoflow rebuild --from memory-log`, `mnemoflow replay
--to-earliest`, an audit-store sync and the console's pages, every
byte of every topic of the app and every file under MNEMOFLOW_HOME is scanned for the secret,
in the clear and as its common digests and encodings: nothing. A replay from the start runs
the first question's recall again without it; the user's next recall gives no packet that
holds it, and another user's memory is untouched.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest
from aiokafka import AIOKafkaConsumer
from test_memories_cli_kafka import ask

from mnemoflow.projections.audit_store import AuditStore
from mnemoflow.streams import memories_cli
from mnemoflow.streams.audit_sync import open_store, sync
from mnemoflow.streams.config import Settings
from mnemoflow.streams.console import KafkaSource, create_app
from mnemoflow.streams.decisions import DecisionWatcher
from mnemoflow.streams.host import HostClient
from mnemoflow.streams.inbox import InboxClient
from mnemoflow.streams.reader import topic_partitions

from factories import T0
from support import broker_audits, collect, isolated_settings, ready_worker, run_cli, worker_env

pytestmark = pytest.mark.kafka
DAY = 86_400_000


def digests_kept(s: Settings) -> set[str]:
    """Where a digest of a recalled memory's text stays after a forget (README, "Forgetting a
    user"): the audit topic (candidates' digests, 30 days) and the broker stage's state (the
    digests of a session's recent items, against repeats), never the text."""
    return {s.topic("audit"), f"{s.app_id}-broker-state-changelog"}


def kept_files(s: Settings) -> set[str]:
    """The audit stores, which fold the audit topic."""
    return {f"audit/{s.app_id}.duckdb", "console.duckdb"}


def forms(secret: str, text: str) -> list[bytes]:
    """The secret as bytes, and every digest or encoding of it (or of the memory's text) that a
    projection might keep."""
    out = [secret.encode(), secret.upper().encode(), base64.b64encode(secret.encode())]
    for s in (secret, text):
        for algo in ("sha256", "sha1", "md5"):
            d = hashlib.new(algo, s.encode())
            out += [d.hexdigest().encode(), d.digest()]
    return out


async def topic_bytes(s: Settings, bootstrap: str) -> dict[str, bytes]:
    """Every record (key, value, headers) of every topic of this app, raw, from offset 0."""
    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                         auto_offset_reset="earliest")
    await c.start()
    try:
        names = sorted(t for t in await c.topics()
                       if t.startswith(s.topic_prefix) or t.startswith(s.app_id))
        tps = [tp for t in names for tp in await topic_partitions(c, t)]
        c.assign(tps)
        await c.seek_to_beginning(*tps)
        ends = await c.end_offsets(tps)
        out: dict[str, bytearray] = {t: bytearray() for t in names}
        while any([await c.position(tp) < ends[tp] for tp in tps]):
            for tp, msgs in (await c.getmany(timeout_ms=500)).items():
                for m in msgs:
                    out[tp.topic] += (m.key or b"") + b"\0" + (m.value or b"") + b"\0"
                    for k, v in m.headers or ():
                        out[tp.topic] += k.encode() + (v or b"")
        return {t: bytes(b) for t, b in out.items()}
    finally:
        await c.stop()


def file_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def found(blobs: dict[str, bytes], needles: list[bytes]) -> list[str]:
    return sorted(name for name, b in blobs.items() if any(n in b for n in needles))


async def _cli(s: Settings, capsys: pytest.CaptureFixture[str], *argv: str, rc: int = 0) -> str:
    return await run_cli(memories_cli, s, capsys, "memories", *argv, rc=rc)


async def _until(check, timeout: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    """Until `check()` gives a falsy value; the last one it gave in the error past `timeout`."""
    deadline = time.monotonic() + timeout
    while last := await check():
        assert time.monotonic() < deadline, f"timed out: {last}"
        await asyncio.sleep(0.5)


def _cli_run(s: Settings, bootstrap: str, *args: str) -> str:
    """`mnemoflow <args>` in a child process, as an operator runs it."""
    res = subprocess.run([sys.executable, "-m", "mnemoflow.streams.cli", *args],
                         env=worker_env(s, bootstrap), capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout


async def test_a_forgotten_user_leaves_no_byte_of_their_memory_anywhere(
        kafka_bootstrap, tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    s = isolated_settings(tmp_path, "forget", consolidate_idle_s=3600.0)
    cli = s.with_overrides(bootstrap=kafka_bootstrap)
    secret, kept = f"quokka{uuid.uuid4().hex[:12]}", f"otter{uuid.uuid4().hex[:12]}"
    text = f"My vault phrase is {secret}."
    needles, clear = forms(secret, text), forms(secret, text)[:3]

    async def listed(user: str) -> str:
        return await _cli(cli, capsys, "list", "--user", user, "--json")

    question = "What is my vault phrase? I forgot it."
    async with ready_worker(s, kafka_bootstrap), HostClient(s, kafka_bootstrap) as host, \
            DecisionWatcher(s, kafka_bootstrap) as watcher:
        inbox = InboxClient(s, kafka_bootstrap, host.producer)
        await inbox.start()
        await host.remember("user-a", text, T0, subject="vault phrase", predicate="is",
                            obj=secret)
        await host.remember("user-b", f"My vault phrase is {kept}.", T0)

        async def unprojected() -> bool:
            return (secret not in await listed("user-a")
                    or found(file_bytes(s.home), needles) == [])
        await _until(unprojected)
        # recalled, injected, and claimed in the clear by the host
        items = await ask(host, inbox, watcher, "ask-1", T0 + DAY // 2, "user-a", question)
        await inbox.stop()
        assert any(secret in i["text"] for i in items), items
        store = open_store(s)
        try:
            await sync(store, s, kafka_bootstrap)
        finally:
            store.close()
        # the scan finds what the projections hold in the clear, and the broker holds none
        where = found(file_bytes(s.home), needles)
        assert any(w.endswith("MEMORY.md") for w in where), where
        assert any(w.endswith(".duckdb") for w in where), where
        assert any(".lance" in w for w in where), where
        assert found(await topic_bytes(s, kafka_bootstrap), clear) == []
        assert set(found(await topic_bytes(s, kafka_bootstrap), needles)) <= digests_kept(s)

        out = await _cli(cli, capsys, "forget", "--user", "user-a", "--reason",
                         "erasure request", "--confirm", "user-a")
        assert "keys shredded" in out and "audit store was made again" in out

        async def left() -> list[str]:
            files = file_bytes(s.home)
            return found(files, clear) + sorted(set(found(files, needles)) - kept_files(s))
        await _until(left)
        assert secret not in await listed("user-a")

    _cli_run(s, kafka_bootstrap, "rebuild", "--from", "memory-log")
    # a replay from the start: the first question's recall is run again, from the log as it is
    _cli_run(s, kafka_bootstrap, "replay", "--to-earliest")
    async with ready_worker(s, kafka_bootstrap), HostClient(s, kafka_bootstrap) as host, \
            DecisionWatcher(s, kafka_bootstrap) as watcher:
        inbox = InboxClient(s, kafka_bootstrap, host.producer)
        await inbox.start()
        try:
            replayed = await collect(s, kafka_bootstrap, ["audit"], lambda r: sum(
                a["sessionId"] == "ask-1" for a in broker_audits(r)) >= 2, 90)
            again = [a for a in broker_audits(replayed) if a["sessionId"] == "ask-1"][-1]
            assert again["action"] != "inject", again  # nothing of user-a is recalled now
            items = await ask(host, inbox, watcher, "ask-2", T0 + DAY, "user-a", question)
            assert all(secret not in i["text"] for i in items), items
            # the other user's memory is still recalled: the question is one recall answers
            items = await ask(host, inbox, watcher, "ask-3", T0 + DAY, "user-b", question)
            assert any(kept in i["text"] for i in items), items
        finally:
            await inbox.stop()
        assert kept in await listed("user-b")
        assert secret not in await listed("user-a")
        store = open_store(s)
        try:
            await sync(store, s, kafka_bootstrap)
        finally:
            store.close()
        # the console, on its own store folded from the topics: the user's pages hold none
        console = KafkaSource(s, kafka_bootstrap, AuditStore(s.home / "console.duckdb"))
        await console.start()
        try:
            app = create_app(console, refresh_s=0)
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                         base_url="http://127.0.0.1") as c:
                for path in ("/users/user-a", "/sessions/ask-1", "/find?q=user-a"):
                    r = await c.get(path, follow_redirects=True)
                    assert r.status_code == 200 and secret not in r.text, path
                assert kept in (await c.get("/users/user-b")).text
        finally:
            await console.stop()
            console.store.close()

    files = file_bytes(s.home)
    assert found(files, clear) == [] and set(found(files, needles)) <= kept_files(s)
    assert found(await topic_bytes(s, kafka_bootstrap), clear) == []
    assert set(found(await topic_bytes(s, kafka_bootstrap), needles)) <= digests_kept(s)


async def test_a_running_reader_stops_opening_a_forgotten_owners_records(
        kafka_bootstrap, tmp_path) -> None:
    """Two processes' keyrings: a proposal race settles on one key, and the one that did not
    shred sees the shredding within about a second without being told."""
    from mnemoflow.agents.memory_events import memory_event
    from mnemoflow.agents.sealing import FORGET_OP
    from mnemoflow.streams.keyring import FRESH_S, Keyring

    from support import prepare_topics

    s = isolated_settings(tmp_path, "keyring")
    await prepare_topics(s, kafka_bootstrap)
    a, b = Keyring(s, kafka_bootstrap), Keyring(s, kafka_bootstrap)
    try:
        ev = memory_event(event_id="e1", op="fact_upserted", memory_id="m1", kind="fact",
                          scope="User", owner="u1", event_time=T0, text="my pin is 4711")
        one, two = await asyncio.gather(a.seal(ev), b.seal({**ev, "eventId": "e2"}))
        assert one["sealed"]["keyId"] == two["sealed"]["keyId"]  # the first proposal won
        assert len(a.keys.of_owner("u1")) in (1, 2) and "4711" not in str(one)
        assert (await b.open(one))["text"] == "my pin is 4711"
        forget = {**ev, "eventId": "f1", "op": FORGET_OP}
        assert await a.seal(forget) is forget  # a forget is never sealed
        assert await a.shred("u1") and await a.open(one) is None
        await asyncio.sleep(FRESH_S + 0.2)
        assert await b.open(two) is None  # b read the tombstones on its own
        again = await b.seal({**ev, "eventId": "e3"})  # u1 comes back: a key of epoch 1
        assert again["sealed"]["keyId"].startswith("1:") and (await a.open(again))["text"]
    finally:
        await a.stop()
        await b.stop()
