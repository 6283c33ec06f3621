"""`mnemoflow memories` against the real broker and a real worker: a user states a fact; the
operator lists it, revokes it with a reason; the event is in the memory-log with source
operator, `show` gives its history, and the next question's packet no longer holds it. A
second user's memories are never listed or acted on through the first's name."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from test_topology_kafka import MANIFEST

from mnemoflow.agents.decisions import TIMEOUT
from mnemoflow.streams import memories_cli
from mnemoflow.streams.config import Settings
from mnemoflow.streams.decisions import DecisionWatcher, describe
from mnemoflow.streams.host import HostClient
from mnemoflow.streams.inbox import InboxClient
from mnemoflow.streams.step import StepAssembler

from factories import T0
from support import (
    broker_audits,
    collect,
    isolated_settings,
    prepare_topics,
    ready_worker,
    run_cli,
    worker_env,
)

pytestmark = pytest.mark.kafka
DAY = 86_400_000
FACT = "My locker code is zq417x."
QUESTION = "What is my locker code? I forgot it."


async def _cli(settings: Settings, capsys: pytest.CaptureFixture[str], *argv: str,
               rc: int = 0) -> str:
    return await run_cli(memories_cli, settings, capsys, "memories", *argv, rc=rc)


async def tell(host: HostClient, inbox: InboxClient, watcher: DecisionWatcher, sid: str,
               user: str, text: str, t: int) -> None:
    """A new session of `user` in which the user says `text`; waits for the pipeline's
    decision on it."""
    ses = host.session(sid, user)
    await ses.lifecycle("start", t, MANIFEST)
    await ses.user_message(text, t + 1000)
    told = await StepAssembler(ses, inbox, MANIFEST, decisions=watcher).wait_decision(60)
    assert told.outcome != TIMEOUT, describe(told)


async def ask(host: HostClient, inbox: InboxClient, watcher: DecisionWatcher, sid: str,
              t: int, user: str = "user-a", question: str = QUESTION) -> list[dict]:
    """A question in a new session of `user`; the items of the packets it claims."""
    ses = host.session(sid, user)
    step = StepAssembler(ses, inbox, MANIFEST, decisions=watcher)
    await ses.lifecycle("start", t, MANIFEST)
    await ses.user_message(question, t + 1000)
    result = await step.step_boundary(t + 1001, user_message=question, wait=60)
    assert result.decision is not None and result.decision.outcome != TIMEOUT, \
        describe(result.decision)
    return [i for p in result.claim.packets for i in p["items"]]


async def test_an_operator_revokes_a_memory_with_a_reason_and_it_is_gone_from_recall(
        kafka_bootstrap, tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    s = isolated_settings(tmp_path, "memories", consolidate_idle_s=3600.0)  # no episodes
    cli = s.with_overrides(bootstrap=kafka_bootstrap)
    async with ready_worker(s, kafka_bootstrap), HostClient(s, kafka_bootstrap) as host, \
            DecisionWatcher(s, kafka_bootstrap) as watcher:
        inbox = InboxClient(s, kafka_bootstrap, host.producer)
        await inbox.start()
        try:
            for user, text in (("user-a", FACT), ("user-b", "My locker code is bb222q.")):
                await tell(host, inbox, watcher, f"mem-{user}", user, text, T0)
            await collect(s, kafka_bootstrap, ["memory-log"], lambda r: sum(
                m["op"] == "fact_upserted" or m["op"] == "fact_proposed"
                for m in r["memory-log"]) >= 2, 60)

            listed = json.loads(await _cli(cli, capsys, "list", "--user", "user-a", "--json"))
            assert listed and all("bb222q" not in r["text"] for r in listed)
            held = [r for r in listed if "zq417x" in r["text"] and r["status"] == "recallable"]
            assert held, listed
            first = await ask(host, inbox, watcher, "ask-1", T0 + DAY)
            assert any("zq417x" in i["text"] for i in first)

            # another owner's id through user-a's name: refused, nothing written
            other = json.loads(await _cli(cli, capsys, "list", "--user", "user-b", "--json"))
            err = await _cli(cli, capsys, "revoke", other[0]["memoryId"], "--user", "user-a",
                             "--reason", "wrong owner", rc=1)
            assert "no memory" in err
            for r in held:
                out = await _cli(cli, capsys, "revoke", r["memoryId"], "--user", "user-a",
                                 "--reason", "user asked to forget the code", "--actor", "ops")
                assert "memory_revoked" in out
            again = await _cli(cli, capsys, "revoke", held[0]["memoryId"], "--user", "user-a",
                               "--reason", "twice", rc=1)
            assert "already" in again

            log = await collect(s, kafka_bootstrap, ["memory-log"], lambda r: sum(
                m["source"] == "operator" for m in r["memory-log"]) >= len(held), 30)
            ops = [m for m in log["memory-log"] if m["source"] == "operator"]
            assert {m["memoryId"] for m in ops} == {r["memoryId"] for r in held}
            assert all(m["attributes"]["reason"] == "user asked to forget the code"
                       and m["attributes"]["actor"] == "ops" and m["owner"] == "user-a"
                       for m in ops)
            shown = json.loads(await _cli(cli, capsys, "show", held[0]["memoryId"],
                                          "--user", "user-a"))
            assert shown["status"] == "revoked"
            assert shown["history"][-1]["op"] == "memory_revoked"
            assert shown["history"][-1]["reason"] == "user asked to forget the code"
            now = json.loads(await _cli(cli, capsys, "list", "--user", "user-a", "--json"))
            assert all("zq417x" not in r["text"] for r in now)
            assert any(r["status"] == "revoked" for r in json.loads(await _cli(
                cli, capsys, "list", "--user", "user-a", "--all", "--json")))
            # user-b's memory is untouched
            assert json.loads(await _cli(cli, capsys, "list", "--user", "user-b",
                                         "--json")) == other

            second = await ask(host, inbox, watcher, "ask-2", T0 + 2 * DAY)
            assert all("zq417x" not in i["text"] for i in second), second
        finally:
            await inbox.stop()


async def test_an_unknown_memory_is_refused(kafka_bootstrap, tmp_path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    s = isolated_settings(tmp_path, "memories-none")
    async with ready_worker(s, kafka_bootstrap):
        cli = s.with_overrides(bootstrap=kafka_bootstrap)
        err = await _cli(cli, capsys, "confirm", "fact:nope", "--user", "u", "--reason", "x",
                         rc=1)
        assert "no memory 'fact:nope'" in err
        assert json.loads(await _cli(cli, capsys, "list", "--user", "u", "--json")) == []


async def test_memory_switched_off_gives_no_packets_stores_nothing_and_survives_a_restart(
        kafka_bootstrap, tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    """Off from an event time: a question gets `suppress: disabled`, a fact told meanwhile is
    never stored; a new worker process (state from the log) still has it off; on again, the
    memory from before comes back and the one told while off never does; a replay decides
    every question as the first pass did."""
    s = isolated_settings(tmp_path, "switch", consolidate_idle_s=3600.0)
    cli = s.with_overrides(bootstrap=kafka_bootstrap)
    off_at, on_at = T0 + DAY, T0 + 3 * DAY

    async def broker_reason(sid: str) -> str:
        recs = await collect(s, kafka_bootstrap, ["audit"], lambda r: any(
            a["sessionId"] == sid and a["stage"] == "broker" for a in r["audit"]), 60)
        (a,) = [a for a in recs["audit"] if a["sessionId"] == sid and a["stage"] == "broker"]
        return f"{a['action']}: {a['reason']}"

    await prepare_topics(s, kafka_bootstrap)
    async with HostClient(s, kafka_bootstrap) as host:
        inbox = InboxClient(s, kafka_bootstrap, host.producer)
        async with ready_worker(s, kafka_bootstrap), DecisionWatcher(s, kafka_bootstrap) as w:
            await inbox.start()
            try:
                mem = host.session("mem-1", "user-a")
                await mem.lifecycle("start", T0, MANIFEST)
                await mem.user_message(FACT, T0 + 1000)
                assert (await StepAssembler(mem, inbox, MANIFEST, decisions=w)
                        .wait_decision(60)).outcome != TIMEOUT
                out = await _cli(cli, capsys, "disable", "--user", "user-a", "--at", str(off_at),
                                 "--reason", "user paused memory", "--actor", "ops")
                assert "memory off for user-a" in out
                assert await ask(host, inbox, w, "ask-off-1", off_at + 10) == []
                assert await broker_reason("ask-off-1") == "suppress: disabled"
                told = host.session("mem-2", "user-a")  # while off: never stored
                await told.lifecycle("start", off_at + 100, MANIFEST)
                await told.user_message("My bike lock code is dd444w.", off_at + 1100)
                await StepAssembler(told, inbox, MANIFEST, decisions=w).wait_decision(60)
            finally:
                await inbox.stop()
        inbox = InboxClient(s, kafka_bootstrap, host.producer)  # the host restarts too
        async with ready_worker(s, kafka_bootstrap), DecisionWatcher(s, kafka_bootstrap) as w:
            await inbox.start()
            try:
                assert await ask(host, inbox, w, "ask-off-2", off_at + DAY) == []
                assert await broker_reason("ask-off-2") == "suppress: disabled"
                status = json.loads(await _cli(cli, capsys, "status", "--user", "user-a"))
                assert [x["memory"] for x in status["switches"]] == ["off"]
                await _cli(cli, capsys, "enable", "--user", "user-a", "--at", str(on_at),
                           "--reason", "user resumed", "--actor", "ops")
                items = await ask(host, inbox, w, "ask-on", on_at + 10)
                assert any("zq417x" in i["text"] for i in items), items
                assert all("dd444w" not in i["text"] for i in items)
                listed = json.loads(await _cli(cli, capsys, "list", "--user", "user-a",
                                               "--json"))
                assert any("zq417x" in r["text"] for r in listed)
                assert all("dd444w" not in r["text"] for r in listed)
            finally:
                await inbox.stop()
    # a replay (offsets and state reset, every record again) decides every question the same
    asks = ("ask-off-1", "ask-off-2", "ask-on")
    out = subprocess.run([sys.executable, "-m", "mnemoflow.streams.cli", "replay",
                          "--to-earliest"], env=worker_env(s, kafka_bootstrap),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    async with ready_worker(s, kafka_bootstrap):
        both = await collect(s, kafka_bootstrap, ["audit"], lambda r: all(
            sum(a["sessionId"] == sid for a in broker_audits(r)) >= 2 for sid in asks), 120)
    decided = {sid: [(a["action"], a["reason"], a["packetId"]) for a in broker_audits(both)
                     if a["sessionId"] == sid] for sid in asks}
    assert all(len(d) == 2 and d[0] == d[1] for d in decided.values()), decided
    assert [decided[sid][0][:2] for sid in asks] == [
        ("suppress", "disabled"), ("suppress", "disabled"), ("inject", decided["ask-on"][0][1])]

    log = await collect(s, kafka_bootstrap, ["memory-log"], lambda r: True, 30)
    switches = [(m["op"], m["eventTime"], m["attributes"]["reason"]) for m in log["memory-log"]
                if m["kind"] == "control"]
    assert switches == [("memory_disabled", off_at, "user paused memory"),
                        ("memory_enabled", on_at, "user resumed")]
    # the log keeps what the observer wrote while memory was off; no projection takes it
    assert any("dd444w" in m["text"] for m in log["memory-log"])
