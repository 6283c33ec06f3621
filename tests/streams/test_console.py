"""The console's pages and actions without Kafka: an in-memory source over the records the
real topology makes (tests/audit_pipeline.py). What the browser test does against the broker,
here request by request: what each page shows, that an action is an operator event with its
reason, and what is refused (no reason, another owner's memory, a forged form, a stranger)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from audit_pipeline import FACT, QUESTION, log_records, pipeline, pipeline_logs
from starlette.testclient import TestClient

from mnemoflow.agents import memory_events as M
from mnemoflow.projections.audit_store import TOPICS, LogRecord
from mnemoflow.projections.owner_memories import fold_owner
from mnemoflow.streams.console import (
    HeldSource,
    _keep_fresh,
    _stop_task,
    access_refusal,
    create_app,
    memory_actions,
)

from factories import T0, locker_code

LOCAL = "http://127.0.0.1"
Row = dict[str, Any]


@pytest.fixture
async def source(tmp_path: Path) -> HeldSource:
    return HeldSource(log_records(await pipeline_logs(tmp_path)))


def _client(source: HeldSource, **kw: Any) -> TestClient:
    return TestClient(create_app(source, refresh_s=0, actor="ops", **kw), base_url=LOCAL)


def _csrf(html: str) -> str:
    return html.split('name="csrf" value="', 1)[1].split('"', 1)[0]


def _fact_segment(source: HeldSource) -> str:
    (mid,) = {e["memoryId"] for e in source.events_of("user-1")
              if e["op"] == "segment_recorded" and e["text"] == FACT}
    return mid


def test_the_pages_show_the_chain_and_the_memories(source: HeldSource) -> None:
    with _client(source) as c:
        index = c.get("/").text
        assert "/sessions/ask-1" in index and "/users/user-1" in index
        users = index.split('id="users"', 1)[1]
        assert "/users/user-1" in users and "/users/user-2" in users
        session = c.get("/sessions/ask-1").text
        assert FACT in session and "Revoke" in session and QUESTION in session
        assert "inject" in session  # the inbox op that carried the packet
        pid = session.split('href="/packets/', 1)[1].split('"', 1)[0]
        packet = c.get(f"/packets/{pid}").text
        assert "injection" in packet and "kept" in packet  # the candidates' outcomes
        assert "allow-some" in packet and "memory-runner" in packet  # safety verdict, claim
        user = c.get("/users/user-1").text
        assert "zq001x" in user and "zq002x" not in user  # never another user's memory
        assert "Memory is <b class=\"good\">on</b>" in user and "MEMORY.md" in user
        memory = c.get(f"/users/user-1/memories/{_fact_segment(source)}").text
        assert "segment_recorded" in memory and "recallable" in memory
        assert c.get("/find", params={"q": "ask-1"}).url.path == "/sessions/ask-1"
        assert c.get("/find", params={"q": "user-2"}).url.path == "/users/user-2"
        assert c.get("/sessions/nobody").status_code == 404
        assert c.get("/users/user-1/memories/seg:nope").status_code == 404


def test_a_revoke_is_an_operator_event_with_its_reason(source: HeldSource) -> None:
    mid = _fact_segment(source)
    with _client(source) as c:
        page = c.get("/sessions/ask-1").text
        r = c.post(f"/users/user-1/memories/{mid}/revoke", data={
            "csrf": _csrf(page), "reason": "user asked to forget the code",
            "next": "/sessions/ask-1"})
        assert r.status_code == 200 and r.url.path == "/sessions/ask-1"
        assert f"memory_revoked {mid} by ops: user asked to forget the code" in r.text
        (ev,) = source.appended
        assert ev["op"] == "memory_revoked" and ev["source"] == "operator"
        assert ev["attributes"]["reason"] == "user asked to forget the code"
        assert ev["attributes"]["actor"] == "ops" and ev["owner"] == "user-1"
        assert source.refreshed == 1  # the page after the action shows it
        user = c.get("/users/user-1").text
        actions = user.split('id="actions"', 1)[1]
        assert "memory_revoked" in actions and "user asked to forget the code" in actions
        memory = c.get(f"/users/user-1/memories/{mid}").text
        assert '<b id="status">revoked</b>' in memory
        # a second revoke of the same memory is refused, and nothing more is written
        again = c.post(f"/users/user-1/memories/{mid}/revoke",
                       data={"csrf": _csrf(page), "reason": "twice"})
        assert again.status_code == 409 and "revoked already" in again.text
        assert len(source.appended) == 1


def test_actions_that_must_not_be_done_are_refused(source: HeldSource) -> None:
    mid = _fact_segment(source)
    with _client(source) as c:
        csrf = _csrf(c.get("/users/user-1").text)
        url = f"/users/user-1/memories/{mid}/revoke"
        assert c.post(url, data={"reason": "no form token"}).status_code == 403
        assert c.post(url, data={"csrf": "forged", "reason": "x"}).status_code == 403
        assert c.post(url, data={"csrf": csrf, "reason": "  "}).status_code == 409
        # user-1's memory through user-2's name: not user-2's, refused
        other = c.post(f"/users/user-2/memories/{mid}/revoke", data={"csrf": csrf,
                                                                     "reason": "x"})
        assert other.status_code == 409 and "no memory" in other.text
        assert c.post(f"/users/user-1/memories/{mid}/erase",
                      data={"csrf": csrf, "reason": "x"}).status_code == 404
        # a redirect only within the console
        r = c.post(url, data={"csrf": csrf, "reason": "ok", "next": "//evil.example/x"},
                   follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"].startswith("/users/user-1?msg=")
    assert [e["op"] for e in source.appended] == ["memory_revoked"]


def test_memory_off_and_on_from_the_user_page(source: HeldSource) -> None:
    with _client(source) as c:
        csrf = _csrf(c.get("/users/user-1").text)
        off = c.post("/users/user-1/switch", data={"csrf": csrf, "memory": "off",
                                                   "reason": "user paused memory"})
        assert "memory off for user-1 by ops: user paused memory" in off.text
        assert "Memory is <b class=\"bad\">off</b>" in off.text
        c.post("/users/user-1/switch", data={"csrf": csrf, "memory": "on", "reason": "back"})
        page = c.get("/sessions/ask-1").text
        assert "Memory off for this session" in page
        session_off = c.post("/users/user-1/switch", data={
            "csrf": csrf, "memory": "off", "session": "ask-1", "reason": "this chat only",
            "next": "/sessions/ask-1"})
        assert "memory off for session ask-1 of user-1 by ops: this chat only" in session_off.text
        assert "Memory on for this session" in session_off.text  # the button turns it back on
    first, second, third = source.appended
    assert third["op"] == "memory_disabled" and third["attributes"]["session"] == "ask-1"
    assert (first["op"], second["op"]) == ("memory_disabled", "memory_enabled")
    assert second["eventTime"] > first["eventTime"]
    assert first["attributes"]["reason"] == "user paused memory"


def test_memory_text_is_shown_as_text_never_as_markup(source: HeldSource) -> None:
    hostile = M.host_fact("user-1", "<script>alert('x')</script> my note", T0 + 5)
    source.events_of("user-1").append(hostile)
    with _client(source) as c:
        page = c.get("/users/user-1").text
    assert "<script>alert" not in page and "&lt;script&gt;alert" in page


def test_who_may_open_the_console(source: HeldSource) -> None:
    assert access_refusal(None, "127.0.0.1:8089", None, None) is None
    assert access_refusal(None, "evil.example:8089", None, None) is not None  # rebinding
    assert access_refusal("s3cret-token", "10.0.0.5:8089", None, None) is not None
    assert access_refusal("s3cret-token", "10.0.0.5", None, "Bearer s3cret-token") is None
    with TestClient(create_app(source, refresh_s=0), base_url="http://evil.example") as c:
        assert c.get("/").status_code == 403
    with _client(source, token="s3cret-token") as c:
        assert c.get("/").status_code == 401
        assert c.get("/login", params={"token": "wrong"}).status_code == 401
        assert c.get("/login", params={"token": "s3cret-token"}).status_code == 200
        assert "Sessions" in c.get("/").text  # the cookie


def test_actions_offered_follow_the_memory_status(source: HeldSource) -> None:
    view = fold_owner(source.events_of("user-1"), "user-1")
    assert memory_actions(view, _fact_segment(source)) == ["revoke"]
    old = M.host_fact("user-1", "x", T0)
    view = fold_owner([*source.events_of("user-1"), old,
                       M.host_revoke("user-1", old["memoryId"], T0 + 1)], "user-1")
    assert memory_actions(view, old["memoryId"]) == []


def test_a_revoke_with_sources_takes_what_the_fact_was_extracted_from(
        source: HeldSource) -> None:
    """A fact's segment still holds its text and would be recalled in its place: revoked
    first, its cascade takes the fact; without the box only the fact goes."""
    view = fold_owner(source.events_of("user-1"), "user-1")
    fact, (seg,) = next((m, s) for m, s in sorted(view.store.sources.items())
                        if m.startswith("fact:") and len(s) == 1)
    with _client(source) as c:
        page = c.get(f"/users/user-1/memories/{fact}").text
        assert "and what it was taken from" in page and seg in page
        r = c.post(f"/users/user-1/memories/{fact}/revoke", data={
            "csrf": _csrf(page), "reason": "forget it all", "sources": "on"})
        assert f"memory_revoked {seg} by ops: forget it all" in r.text
    assert [e["memoryId"] for e in source.appended][0] == seg
    view = fold_owner(source.events_of("user-1"), "user-1")
    assert view.status(seg) == view.status(fact) == "revoked"


def test_a_revoke_without_sources_leaves_the_segment(source: HeldSource) -> None:
    view = fold_owner(source.events_of("user-1"), "user-1")
    fact, (seg,) = next((m, s) for m, s in sorted(view.store.sources.items())
                        if m.startswith("fact:") and len(s) == 1)
    with _client(source) as c:
        csrf = _csrf(c.get("/users/user-1").text)
        c.post(f"/users/user-1/memories/{fact}/revoke", data={"csrf": csrf, "reason": "x"})
    assert [e["memoryId"] for e in source.appended] == [fact]
    view = fold_owner(source.events_of("user-1"), "user-1")
    assert view.status(fact) == "revoked" and view.status(seg) == "recallable"


async def test_a_replay_shows_what_recall_gives_now(tmp_path: Path) -> None:
    """Revoke the memory a packet held, then replay that packet's recall from its page: the
    real stages (in memory) answer the replayed request with a shadow audit, the session's
    inbox gets nothing, and the replay page shows the memory gone, revoked since."""
    h = await pipeline(tmp_path)

    async def worker(topic: str, value: Row) -> list[LogRecord]:
        before = {t: len(v) for t, v in h.runner.logs.items()}
        await h.send(topic, value["owner"] if topic == "memory-log" else value["userId"], value)
        return [LogRecord(t, -2, 100_000 + i, v) for t, kvs in h.runner.logs.items()
                for i, (_, v) in enumerate(kvs[before.get(t, 0):]) if t in TOPICS]

    source = HeldSource(log_records(h.runner.logs), worker)
    inbox_before = len(h.runner.logs["inbox"])
    with TestClient(create_app(source, refresh_s=0, actor="ops", replay_wait_s=5),
                    base_url=LOCAL) as c:
        session = c.get("/sessions/ask-1").text
        pid = session.split('href="/packets/', 1)[1].split('"', 1)[0]
        mid = _fact_segment(source)
        c.post(f"/users/user-1/memories/{mid}/revoke", data={"csrf": _csrf(session),
                                                            "reason": "gone"})
        packet = c.get(f"/packets/{pid}").text
        assert "Replay in shadow mode" in packet
        r = c.post(f"/packets/{pid}/replay", data={"csrf": _csrf(packet)})
        assert r.url.path.startswith("/replays/req:"), r.url
        page = r.text
        assert "at the request of <b>ops</b>" in page
        # then injected; now the only candidate left is the instruction-like text, which
        # the safety gate holds back: nothing would be injected today
        assert "<td><b>then</b></td><td>inject: warm</td>" in page
        assert "<td><b>now</b></td><td>suppress: injection</td>" in page
        diff = page.split('id="diff"', 1)[1]
        gone = diff.split(mid, 1)[1].split("</tr>", 1)[0]
        assert "(revoked since)" in gone and "<b>gone</b>" in gone
        assert "<b>same</b>" in diff  # the instruction-like text: flagged then and now
        # listed on the packet's page, and nothing reached the session's inbox
        assert r.url.path.rsplit("/", 1)[1] in c.get(f"/packets/{pid}").text.replace("%3A", ":")
    assert len(h.runner.logs["inbox"]) == inbox_before
    (sent,) = [v for v in source.appended if "replayOf" in v]
    assert sent["replayOf"] and sent["sessionId"] == "ask-1" and sent["replayBy"] == "ops"


async def test_the_metrics_count_what_the_inbox_and_the_feedback_hold(tmp_path: Path) -> None:
    logs = await pipeline_logs(tmp_path)
    ops = [v for _, v in logs["inbox"]]
    delivered = {v["feedbackRef"] for _, v in logs["session-events"]
                 if v["feedbackKind"] == "packet_delivered"}
    claimed = {p for o in ops if o["op"] == "claim" for p in o["packetIds"]}
    assert claimed and delivered  # user-1 claims and reports its packet
    with _client(HeldSource(log_records(logs))) as c:
        text = c.get("/metrics").text
    for op in ("inject", "claim", "expire", "remove", "steer"):
        n = sum(o["op"] == op for o in ops)
        assert f'mnemoflow_inbox_ops_total{{op="{op}"}} {float(n)}' in text
    assert f"mnemoflow_packets_claimed_total {float(len(claimed))}" in text
    assert f"mnemoflow_packets_delivered_total {float(len(delivered))}" in text


def test_a_conflict_is_shown_with_both_sides_and_resolved_from_the_page() -> None:
    old, new = locker_code("alice", "zq417x", T0), locker_code("alice", "kk555m", T0 + 10)
    source = HeldSource([LogRecord("memory-log", 0, i, ev) for i, ev in enumerate((old, new))])
    with _client(source) as c:
        page = c.get("/users/alice").text
        sets = page.split("<h2>Conflict sets</h2>", 1)[1].split("<h2>", 1)[0]
        assert "locker code is zq417x" in sets and "locker code is kk555m" in sets
        assert sets.count("/resolve") == 2  # a resolve per side
        r = c.post(f"/users/alice/memories/{new['memoryId']}/resolve",
                   data={"csrf": _csrf(page), "reason": "the user confirmed the new code"})
        assert f"fact_confirmed {new['memoryId']} by ops" in r.text
    view = fold_owner(source.events_of("alice"), "alice")
    assert view.status(new["memoryId"]) == "recallable"
    assert view.status(old["memoryId"]) != "recallable"


class _SwallowsOneCancel:
    """A source whose refresh loses a cancellation, as `asyncio.wait_for` inside a client
    library can before Python 3.12."""

    def __init__(self) -> None:
        self.calls = 0
        self.inside = asyncio.Event()

    async def refresh(self) -> None:
        self.calls += 1
        self.inside.set()
        try:
            await asyncio.sleep(0.3)
        except asyncio.CancelledError:
            pass


async def test_the_refresh_loop_stops_even_when_a_cancellation_is_lost() -> None:
    source = _SwallowsOneCancel()
    stop = asyncio.Event()
    task = asyncio.create_task(_keep_fresh(source, 0.01, stop))  # type: ignore[arg-type]
    await asyncio.wait_for(source.inside.wait(), 5)
    await asyncio.wait_for(_stop_task(task, stop), 5)
    calls = source.calls
    await asyncio.sleep(0.1)
    assert task.done() and source.calls == calls == 1


def test_forgetting_a_user_asks_for_the_id_typed_again(source: HeldSource) -> None:
    with _client(source) as c:
        page = c.get("/users/user-1").text
        assert "Forget this user" in page and FACT in page
        csrf = _csrf(page)
        for data in ({"reason": "erasure"}, {"reason": "erasure", "confirm": "user-2"},
                     {"confirm": "user-1"}):
            assert c.post("/users/user-1/forget", data={"csrf": csrf, **data}).status_code == 409
        assert c.post("/users/user-1/forget", data={"reason": "x", "confirm": "user-1"}
                      ).status_code == 403  # no form secret
        assert source.appended == []
        done = c.post("/users/user-1/forget", data={"csrf": csrf, "reason": "erasure request",
                                                    "confirm": "user-1"})
        assert "user-1 forgotten by ops: erasure request" in done.text
        memories = done.text.split('id="memories"', 1)[1].split("</table>", 1)[0]
        assert FACT not in memories
        assert c.get("/users/user-2").status_code == 200  # another user is untouched
    assert [(e["op"], e["scope"], e["owner"]) for e in source.appended] == [
        ("owner_forgotten", "User", "user-1"), ("owner_forgotten", "Workspace", "user-1")]
    assert all(e["source"] == "operator" and e["attributes"]["reason"] == "erasure request"
               and e["attributes"]["actor"] == "ops" for e in source.appended)
