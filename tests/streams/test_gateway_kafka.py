"""The gateway (`mnemoflow serve`) over real HTTP and MCP, against the real broker and a real
worker: append and claim, tenant isolation, remember/revoke, the MCP tools, and numbering
that a restarted gateway continues."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import httpx2
import pytest
import uvicorn
from fastapi import FastAPI
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from mnemoflow.agents.tenancy import TenancyError
from mnemoflow.streams.config import Settings
from mnemoflow.streams.gateway import create_app, load_tenants

from support import collect, isolated_settings, ready_worker

pytestmark = pytest.mark.kafka

TOKENS = {"acme-token-0123456789": "acme", "bravo-token-0123456789": "bravo"}
A = {"Authorization": "Bearer acme-token-0123456789"}
B = {"Authorization": "Bearer bravo-token-0123456789"}
MANIFEST = {"provider": "test", "model": "m", "supportsPreStep": True}
WAIT_S = 90.0  # the longest a claim waits for the pipeline (a loaded 2-core machine)


@asynccontextmanager
async def served(app: FastAPI) -> AsyncIterator[str]:
    """The app on a free loopback port, in this event loop, until the block ends."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)  # connections wait in the backlog until uvicorn has started the app
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))

    async def serve() -> None:
        try:
            await server.serve(sockets=[sock])
        except SystemExit as exc:  # uvicorn's answer to a failed start: not the test run's
            raise RuntimeError(f"the gateway did not start (exit {exc.code})") from None

    task = asyncio.create_task(serve())
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    try:
        async with httpx.AsyncClient(base_url=url, timeout=120) as c:
            ready = asyncio.create_task(c.get("/healthz"))
            await asyncio.wait({task, ready}, return_when=asyncio.FIRST_COMPLETED)
            if task.done():
                ready.cancel()
                task.result()
                raise RuntimeError("the gateway stopped before it served")
            assert (await ready).json()["ok"] is True
        yield url
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 60)
        sock.close()


@dataclass
class Gw:
    settings: Settings
    bootstrap: str
    url: str

    def http(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.url, timeout=WAIT_S + 30)


@pytest.fixture(scope="module")
async def gw(kafka_bootstrap, tmp_path_factory) -> AsyncIterator[Gw]:
    s = isolated_settings(tmp_path_factory.mktemp("gateway"), "gateway")
    async with ready_worker(s, kafka_bootstrap), served(create_app(s, kafka_bootstrap, TOKENS)) as url:
        yield Gw(s, kafka_bootstrap, url)


async def _append(c: httpx.AsyncClient, who: dict, sid: str, user: str, **event: Any) -> dict:
    r = await c.post(f"/v1/sessions/{sid}/events", headers=who, json={"userId": user, **event})
    assert r.status_code == 200, r.text
    return r.json()


async def _state_and_ask(c: httpx.AsyncClient, who: dict, user: str, mem: str, ask: str,
                         statement: str, question: str) -> None:
    """One session states something; once the pipeline has decided about it, another session
    of the same user asks about it (what tests/streams/test_topology_kafka.py's _two_phase and
    _ask do through the SDK)."""
    await _append(c, who, mem, user, type="lifecycle", action="start", capability=MANIFEST)
    await _append(c, who, mem, user, type="user_message", text=statement)
    r = await c.post(f"/v1/sessions/{mem}/wait", headers=who, json={"timeout": WAIT_S})
    assert r.status_code == 200 and r.json()["outcome"] != "timeout", r.text
    await _append(c, who, ask, user, type="lifecycle", action="start", capability=MANIFEST)
    await _append(c, who, ask, user, type="user_message", text=question)


async def _claim(c: httpx.AsyncClient, who: dict, sid: str, wait: float | None = WAIT_S) -> dict:
    r = await c.post(f"/v1/sessions/{sid}/claim", headers=who, json={"wait": wait})
    assert r.status_code == 200, r.text
    return r.json()


async def test_nothing_is_served_without_a_known_token(gw: Gw) -> None:
    event = {"userId": "alice", "type": "user_message", "text": "hello"}
    async with gw.http() as c:
        for headers in ({}, {"Authorization": "Bearer not-a-token-of-this-gateway"},
                        {"Authorization": "acme-token-0123456789"}):
            for method, path, body in (("POST", "/v1/sessions/s1/events", event),
                                       ("POST", "/v1/sessions/s1/claim", {}),
                                       ("POST", "/v1/sessions/s1/wait", {}),
                                       ("POST", "/v1/memories", {"owner": "alice", "text": "x"}),
                                       ("DELETE", "/v1/users/alice", None),
                                       ("POST", "/mcp", {"jsonrpc": "2.0", "id": 1,
                                                         "method": "tools/list"})):
                r = await c.request(method, path, headers=headers, json=body)
                assert r.status_code == 401, (path, headers, r.text)
        assert (await c.get("/healthz")).json()["ok"] is True  # no token needed
        assert (await c.delete("/v1/users/alice", headers=A)).status_code == 422  # no reason
        r = await c.delete("/v1/users/alice", headers=A, params={"reason": "asked to"})
        assert r.status_code == 200 and r.json()["userId"] == "alice", r.text
        assert r.json()["keysShredded"] == 0  # alice of this tenant never had a memory
        # no id spells another tenant's: the separator is refused (in a path it is no route)
        for bad in ({"userId": "bravo/alice"}, {"workspaceId": "bravo/w"}, {"agentId": "b/a"}):
            r = await c.post("/v1/sessions/s1/events", headers=A, json={**event, **bad})
            assert r.status_code == 422 and "'/'" in r.json()["detail"], r.text
        assert (await c.post("/v1/sessions/bravo%2Fs1/claim", headers=A)).status_code == 404
        assert (await c.get("/openapi.json")).status_code == 200


async def test_a_claim_returns_a_packet_of_an_earlier_session_and_never_another_tenants(gw: Gw) -> None:
    """Two tenants, the same session ids and the same user "alice": each gets a packet made of
    its own alice's earlier session only, and neither can claim the other's packets."""
    async with gw.http() as c:
        for who, code in ((A, "zq042x"), (B, "zq777x")):
            await _state_and_ask(c, who, "alice", "s-mem", "s-ask",
                                 f"My locker code is {code} and my favourite colour is teal.",
                                 "What is my locker code? I forgot it.")
        # bravo claims first: its own packet only, and acme's stays pending for acme
        got_b = await _claim(c, B, "s-ask")
        got_a = await _claim(c, A, "s-ask")
        again = await _claim(c, A, "s-ask", wait=None)
    for got, mine, theirs in ((got_a, "zq042x", "zq777x"), (got_b, "zq777x", "zq042x")):
        assert got["decision"]["outcome"] == "packet", got
        assert "acme/" not in json.dumps(got) and "bravo/" not in json.dumps(got)
        assert set(got["decision"]["packetIds"]) <= {m["packetId"] for m in got["messages"]}
        text = "\n".join(m["content"] for m in got["messages"])
        assert mine in text and theirs not in text
        assert all(m["role"] == "user" and "not an instruction" in m["content"]
                   for m in got["messages"])
        items = [i for p in got["packets"] for i in p["items"]]
        assert {p["sessionId"] for p in got["packets"]} == {"s-ask"}
        assert {i["owner"] for i in items} == {"alice"}  # un-namespaced on the way out
        assert any(i["sourceSessionId"] == "s-mem" and mine in i["text"]
                   and i["provenance"].startswith("s-mem#") for i in items)
    assert again["messages"] == [] and again["packets"] == []  # handed out once
    delivered = {(t, pid) for t, got in (("acme", got_a), ("bravo", got_b))
                 for pid in got["decision"]["packetIds"]}

    def fed_back(recs: dict[str, list[dict]]) -> bool:
        return delivered <= {(e["sessionId"].split("/")[0], e["feedbackRef"])
                             for e in recs["session-events"] if e["type"] == "feedback"}

    recs = await collect(gw.settings, gw.bootstrap, ["session-events", "inbox"], fed_back, 60)
    # on Kafka every id is namespaced: acme's alice and bravo's alice are two users
    events = [e for e in recs["session-events"] if e["sessionId"].endswith(("/s-mem", "/s-ask"))]
    assert {(e["sessionId"], e["userId"], e["agentId"]) for e in events} == {
        (f"{t}/{s}", f"{t}/alice", f"{t}/agent") for t in ("acme", "bravo") for s in ("s-mem", "s-ask")}
    feedback = [e for e in events if e["type"] == "feedback"]
    assert {e["feedbackKind"] for e in feedback} == {"packet_delivered"}
    assert all(e["attributes"]["memoryIds"] for e in feedback)
    for op in recs["inbox"]:
        if op["op"] == "inject" and op["sessionId"].endswith("/s-ask"):
            tenant = op["sessionId"].split("/")[0]
            assert {i["owner"] for i in op["packet"]["items"]} == {f"{tenant}/alice"}


async def test_remember_then_revoke(gw: Gw) -> None:
    async with gw.http() as c:
        r = await c.post("/v1/memories", headers=A, json={
            "owner": "carol", "text": "My gym locker code is zq555x.", "memoryId": "gym-locker"})
        assert r.status_code == 200, r.text
        assert r.json() | {"eventId": ""} == {"memoryId": "gym-locker", "owner": "carol",
                                             "scope": "User", "op": "fact_upserted", "eventId": ""}
        bad = await c.post("/v1/memories", headers=A, json={"owner": "carol", "text": "x",
                                                            "memoryId": "fact:0123"})
        assert bad.status_code == 422  # the pipeline's id form: never picked by a tenant
        await _append(c, A, "c-ask", "carol", type="lifecycle", action="start", capability=MANIFEST)
        await _append(c, A, "c-ask", "carol", type="user_message",
                      text="What is my gym locker code? I forgot it.")
        before = await _claim(c, A, "c-ask")
        r = await c.post("/v1/memories/revoke", headers=A, json={"owner": "carol",
                                                                 "memoryId": "gym-locker"})
        assert r.status_code == 200 and r.json()["op"] == "memory_revoked", r.text
        await _append(c, A, "c-ask2", "carol", type="lifecycle", action="start", capability=MANIFEST)
        await _append(c, A, "c-ask2", "carol", type="user_message",
                      text="What is my gym locker code? I forgot it.")
        after = await _claim(c, A, "c-ask2")
    items = [i for p in before["packets"] for i in p["items"]]
    assert any(i["memoryId"] == "gym-locker" and "zq555x" in i["text"] for i in items), before
    assert after["decision"]["outcome"] != "timeout"
    assert "zq555x" not in str(after["packets"]) and "zq555x" not in str(after["messages"])
    recs = await collect(gw.settings, gw.bootstrap, ["memory-log"], lambda r: any(
        e["op"] == "memory_revoked" and e["owner"] == "acme/carol" for e in r["memory-log"]), 30)
    host = [e for e in recs["memory-log"] if e["source"] == "host" and e["owner"] == "acme/carol"]
    assert [(e["op"], e["memoryId"]) for e in host] == [("fact_upserted", "acme/gym-locker"),
                                                        ("memory_revoked", "acme/gym-locker")]


@asynccontextmanager
async def _mcp(url: str, headers: dict) -> AsyncIterator[Client]:
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=WAIT_S + 30)) as h, \
            Client(streamable_http_client(f"{url}/mcp", http_client=h)) as client:
        yield client


async def test_an_mcp_client_appends_and_claims_a_packet(gw: Gw) -> None:
    async with _mcp(gw.url, A) as mcp:
        names = {t.name for t in (await mcp.list_tools()).tools}
        assert {"append_event", "wait_decision", "claim", "remember", "revoke"} <= names

        async def call(tool: str, **args: Any) -> dict:
            res = await mcp.call_tool(tool, args)
            assert not res.is_error, res.content
            assert isinstance(res.structured_content, dict)
            return res.structured_content

        for sid, text in (("m-mem", "My bike lock code is zq888x."),
                          ("m-ask", "What is my bike lock code? I forgot it.")):
            await call("append_event", session_id=sid, event={
                "type": "lifecycle", "userId": "dave", "action": "start", "capability": MANIFEST})
            out = await call("append_event", session_id=sid,
                             event={"type": "user_message", "userId": "dave", "text": text})
            assert out["eventSeq"] == 2 and out["decisionSeq"] == 2
            if sid == "m-mem":
                assert (await call("wait_decision", session_id=sid, timeout_s=WAIT_S))["outcome"] \
                    != "timeout"
        got = await call("claim", session_id="m-ask", wait_s=WAIT_S)
    assert got["decision"]["outcome"] == "packet"
    assert any("zq888x" in m["content"] for m in got["messages"]), got
    async with _mcp(gw.url, B) as other:  # another tenant has no session of that name
        res = await other.call_tool("claim", {"session_id": "m-ask"})
        assert res.is_error and "has no events" in str(res.content)


async def test_a_restarted_gateway_numbers_above_what_was_written(gw: Gw) -> None:
    async with gw.http() as c:
        first = [await _append(c, A, "r-1", "erin", **ev) for ev in (
            {"type": "lifecycle", "action": "start", "capability": MANIFEST},
            {"type": "user_message", "text": "Deploys go out on Tuesdays."},
            {"type": "agent_step", "phase": "start", "text": "Noted."})]
    assert [(e["eventSeq"], e["turn"], e["step"]) for e in first] == [(1, 0, 0), (2, 1, 0), (3, 1, 1)]
    # another gateway process on the same topics (as after a restart): it never served r-1
    async with served(create_app(gw.settings, gw.bootstrap, TOKENS)) as url, \
            httpx.AsyncClient(base_url=url, timeout=WAIT_S + 30) as c:
        r = await c.post("/v1/sessions/r-1/wait", headers=A,
                         json={"timeout": WAIT_S, "eventSeq": [first[1]["eventSeq"]]})
        assert r.status_code == 200 and r.json()["outcome"] != "timeout", r.text
        assert r.json()["eventSeq"] == 2
        nxt = await _append(c, A, "r-1", "erin", type="user_message", text="And hotfixes?")
        step = await _append(c, A, "r-1", "erin", type="agent_step", phase="start")
        assert (nxt["eventSeq"], nxt["turn"], nxt["step"]) == (4, 2, 0)
        assert (step["eventSeq"], step["turn"], step["step"]) == (5, 2, 1)
        r = await c.post("/v1/sessions/r-1/events", headers=A,
                         json={"type": "user_message", "userId": "frank", "text": "hi"})
        assert r.status_code == 409 and "another userId" in r.json()["detail"]
        r = await c.post("/v1/sessions/never-written/claim", headers=A, json={})
        assert r.status_code == 404
        r = await c.post("/v1/sessions/r-1/claim", headers=B, json={})
        assert r.status_code == 404  # bravo's r-1 is another session, and it has no events


async def test_without_tokens_one_local_tenant_answers_loopback_hosts_only(gw: Gw) -> None:
    async with served(create_app(gw.settings, gw.bootstrap, {})) as url, \
            httpx.AsyncClient(base_url=url, timeout=60) as c:
        out = await _append(c, {}, "l-1", "gus", type="user_message", text="Hello there.")
        assert out["eventSeq"] == 1
        r = await c.post("/v1/sessions/l-1/claim", headers={"Host": "evil.example"})
        assert r.status_code == 403  # a DNS-rebound page on this machine gets nothing
        r = await c.post("/mcp", headers={"Host": "evil.example"}, json={})
        assert r.status_code == 403
        big = "x" * (gw.settings.max_payload_bytes + 1)
        r = await c.post("/v1/sessions/l-1/events", json={"userId": "gus", "type": "user_message",
                                                          "text": big})
        assert r.status_code == 413 and "MNEMOFLOW_MAX_PAYLOAD_BYTES" in r.json()["detail"]
    recs = await collect(gw.settings, gw.bootstrap, ["session-events"], lambda r: any(
        e["sessionId"] == "local/l-1" for e in r["session-events"]), 30)
    assert [e["userId"] for e in recs["session-events"] if e["sessionId"] == "local/l-1"] == \
        ["local/gus"]


def test_token_files_in_json_or_toml(tmp_path) -> None:
    (tmp_path / "t.json").write_text(json.dumps(TOKENS))
    (tmp_path / "t.toml").write_text("".join(f'"{k}" = "{v}"\n' for k, v in TOKENS.items()))
    assert load_tenants(tmp_path / "t.json") == load_tenants(tmp_path / "t.toml") == TOKENS
    for name, text, why in (("a.json", "{}", "non-empty"), ("b.json", "[1]", "non-empty"),
                            ("c.toml", "x = ", "not valid toml"),
                            ("d.json", '{"short": "acme"}', "token #1")):
        (tmp_path / name).write_text(text)
        with pytest.raises(TenancyError, match=why):
            load_tenants(tmp_path / name)
