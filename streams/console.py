"""`mnemoflow console`: the operator's web console (G-02), server-rendered, no JavaScript.

Pages: the newest sessions; a session's timeline (events, gate and broker decisions, packets
with their items, scores and provenance, claims, feedback); a packet's whole chain (the
trigger, the gate's signals, each tier's status, every candidate with its score and outcome,
the safety verdict, the claim, the feedback); a user's memories, conflict sets, procedures,
aliases, memory switches, the operator actions taken and MEMORY.md as the projection writes
it; a replay of one recall against today's memory, shown beside what was given then.
Actions (revoke, confirm, resolve, approve, memory off and on) are operator memory events
with a reason, the same ones `mnemoflow memories` appends: nothing edits a projection. A
replay is the past recall request sent again with `replayOf` (agents.broker: a shadow answer
that changes nothing the session sees). `/metrics` counts, from the same store, what hosts did
with the packets (claims, deliveries), which the worker does not see.

What it reads comes from a `ConsoleSource`: `KafkaSource` keeps its own audit store synced
with the topics and tails the memory-log; the pages only query what it holds. Access: a
loopback Host only, unless the console has a token (then a cookie set by /login?token=, or
`Authorization: Bearer`). Every form carries the app's CSRF secret, so another site cannot
post an action through an operator's browser.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, Metric
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route
from starlette.templating import Jinja2Templates

from mnemoflow.agents import tenancy as TN
from mnemoflow.agents.ids import stable_id
from mnemoflow.agents.partitioning import request_key
from mnemoflow.agents.sealing import FORGET_OP
from mnemoflow.projections import audit_queries as Q
from mnemoflow.projections import markdown as MD
from mnemoflow.projections.audit_store import AuditStore, LogRecord
from mnemoflow.projections.owner_memories import OwnerMemories, fold_owner
from mnemoflow.streams.audit_cli import short, when
from mnemoflow.streams.config import Settings
from mnemoflow.streams.memories_cli import ACTIONS, operator_events, refusal, switch_event
from mnemoflow.streams.topics import VALUE_SCHEMA

Row = dict[str, Any]
log = logging.getLogger(__name__)
TEMPLATES = Path(__file__).with_name("console_templates")
COOKIE = "mnemoflow_console"


class ConsoleSource(Protocol):
    """What the console reads and where its actions go."""

    store: AuditStore

    async def refresh(self) -> None:
        """Fold what the topics hold now into the store and the memory events."""

    def events_of(self, owner: str) -> list[Row]:
        """The owner's memory events, in log order."""

    async def append(self, event: Row) -> None:
        """Append an operator's memory event to the memory-log (acknowledged)."""

    async def send_request(self, request: Row) -> None:
        """Send a recall request to the worker (an operator's replay; acknowledged)."""

    async def forget(self, owner: str, reason: str, actor: str) -> str:
        """Forget the owner (streams.forget); a summary of what was done."""


class KafkaSource:
    """The console's own audit store (a file beside `mnemoflow audit`'s, which it would
    otherwise lock), synced with the topics, and the memory-log and memory-shared topics read
    from the start and tailed, indexed by owner."""

    def __init__(self, settings: Settings, bootstrap: str, store: AuditStore) -> None:
        self.settings = settings
        self.bootstrap = bootstrap
        self.store = store
        self._by_owner: dict[str, list[Row]] = {}
        self._lock = asyncio.Lock()
        self._stack = contextlib.AsyncExitStack()

    async def start(self) -> None:
        from mnemoflow.streams.host import HostClient
        from mnemoflow.streams.reader import TopicReader

        s = self.settings
        self._reader = await self._stack.enter_async_context(TopicReader(
            s, self.bootstrap, [s.topic("memory-log"), s.topic("memory-shared")]))
        self._host = await self._stack.enter_async_context(HostClient(s, self.bootstrap))
        await self.refresh()

    async def stop(self) -> None:
        await self._stack.aclose()

    async def refresh(self) -> None:
        from mnemoflow.streams.audit_sync import sync

        async with self._lock:
            await sync(self.store, self.settings, self.bootstrap)
            records = await self._reader.drain()
            for r in records:
                if r.value is not None:
                    _hold(self._by_owner, r.value)
            records.clear()  # the reader keeps what it read; here it is kept once, by owner

    def events_of(self, owner: str) -> list[Row]:
        return self._by_owner.get(owner, [])

    async def append(self, event: Row) -> None:
        await self._host.append_memory(event)

    async def send_request(self, request: Row) -> None:
        await self._host.producer.send(self.settings.topic("recall-requests"),
                                       VALUE_SCHEMA["recall-requests"], request_key(request),
                                       request)

    async def forget(self, owner: str, reason: str, actor: str) -> str:
        """`streams.forget` with this console's clients: its reader's keyring learns of the
        shredded keys at once, and the next sync makes the console's audit store anew."""
        from mnemoflow.streams.forget import forget_owner

        done = await forget_owner(self.settings, self.bootstrap, owner, reason, actor,
                                  host=self._host, keyring=self._reader.keys())
        return done.summary()


class HeldSource:
    """A source over records held in memory (tests and benches). What the console writes is
    folded into the store as a sync would fold it, with what `worker` answers to it: the
    records the pipeline writes in turn (a broker audit for a replayed request)."""

    def __init__(self, records: list[LogRecord],
                 worker: Callable[[str, Row], Awaitable[list[LogRecord]]] | None = None
                 ) -> None:
        self.worker = worker
        self.store = AuditStore(None)
        self.store.fold(records)
        self._by_owner: dict[str, list[Row]] = {}
        for r in records:
            if r.topic in ("memory-log", "memory-shared") and r.value is not None:
                self._by_owner.setdefault(r.value["owner"], []).append(r.value)
        self.appended: list[Row] = []
        self.refreshed = 0

    async def refresh(self) -> None:
        self.refreshed += 1

    def events_of(self, owner: str) -> list[Row]:
        return self._by_owner.get(owner, [])

    async def _write(self, topic: str, value: Row) -> None:
        self.appended.append(value)
        answered = await self.worker(topic, value) if self.worker else []
        self.store.fold([LogRecord(topic, -1, len(self.appended), value), *answered])

    async def append(self, event: Row) -> None:
        self._by_owner.setdefault(event["owner"], []).append(event)
        await self._write("memory-log", event)

    async def send_request(self, request: Row) -> None:
        await self._write("recall-requests", request)

    async def forget(self, owner: str, reason: str, actor: str) -> str:
        from mnemoflow.agents import memory_events as M

        now = int(time.time() * 1000)
        for scope in ("User", "Workspace"):
            ev = M.as_operator(M.owner_forget(owner, now, scope=scope), reason, actor)
            _hold(self._by_owner, ev)
            await self._write("memory-log", ev)
        return f"{owner} forgotten"


def _hold(by_owner: dict[str, list[Row]], ev: Row) -> None:
    """Keep a memory event under its owner; a forget leaves only itself of the owner's."""
    if ev.get("op") == FORGET_OP:
        by_owner[ev["owner"]] = [e for e in by_owner.get(ev["owner"], ())
                                 if e.get("op") == FORGET_OP]
    by_owner.setdefault(ev["owner"], []).append(ev)


def access_refusal(token: str | None, host: str | None, cookie: str | None,
                   authorization: str | None) -> str | None:
    """Why a request may not see the console, or None. Without a token only a request
    addressed to a loopback host is served (a DNS-rebinding page cannot reach it)."""
    if token is None:
        return None if TN.is_loopback(TN.host_of(host)) else "loopback hosts only"
    given = cookie or (authorization or "").removeprefix("Bearer ").strip()
    if given and hmac.compare_digest(given.encode(), token.encode()):
        return None
    return "open /login?token=<token> first, or send Authorization: Bearer <token>"


def _safe_next(target: str | None, default: str) -> str:
    """Only a path of this console: a form cannot redirect the operator elsewhere."""
    if target and target.startswith("/") and not target.startswith("//"):
        return target
    return default


def memory_actions(view: OwnerMemories, memory_id: str) -> list[str]:
    """The actions a memory offers: those `mnemoflow memories` would not refuse, confirm only
    where there is something to accept (a candidate, a dispute, a conflict), and approve only
    for a procedure that waits for it."""
    status = view.status(memory_id)
    proc = view.store.procedures.get(memory_id)
    wanted = {"revoke": True, "resolve": True,
              "confirm": status in ("candidate", "disputed", "conflict"),
              "approve": proc is not None and proc.requires_approval and not proc.approved
              and status != "deprecated"}
    return [v for v in ACTIONS if wanted[v] and refusal(view, v, memory_id) is None]


def user_page(view: OwnerMemories, actions: list[Row], now_ms: int) -> Row:
    """What the user page shows, from the owner's fold and the audit store's actions."""
    store = view.store
    rows = view.rows(everything=True)
    for r in rows:
        r["actions"] = memory_actions(view, r["memoryId"])
    conflicts = []
    for key, sides in store.conflicts.items():
        conflicts.append({"slot": " / ".join(key), "sides": [
            {**dict(s), "status": view.status(s["memoryId"]),
             "text": r.text if (r := store.records.get(s["memoryId"])) else ""}
            for s in sides]})
    procedures = [{"id": pid, "intent": p.intent, "stage": p.stage, "risk": p.risk_level,
                   "requiresApproval": p.requires_approval, "approved": p.approved,
                   "steps": list(p.steps),
                   "evidence": [{"kind": e.kind, "outcome": e.outcome, "session": e.session_id,
                                 "at": e.event_time} for e in p.evidence],
                   "actions": memory_actions(view, pid)}
                  for pid, p in sorted(store.procedures.items())]
    aliases = [{"id": mid, "alias": a.alias, "target": a.target, "revoked": a.revoked}
               for mid, a in sorted(store.aliases.items()) if a.owner == view.owner]
    block = MD.render_block(MD.owner_records(store, "User", view.owner), f"User {view.owner}")
    return {"owner": view.owner, "memories": rows, "conflicts": conflicts,
            "procedures": procedures, "aliases": aliases,
            "memoryOff": store.controls.off(view.owner, "", now_ms),
            "switches": store.controls.state(view.owner), "actions": actions,
            "markdown": block.split(MD.RECORDS, 1)[0].rstrip()}


def session_memory(source: ConsoleSource, users: list[str], items: dict[str, list[Row]]
                   ) -> tuple[dict[str, list[str]], dict[str, OwnerMemories]]:
    """What each packet item was taken from (a fact's segment), by memory id, and the fold
    of each owner involved (the session's users, the items' owners), each folded once."""
    owners = {*users, *(i["owner"] for its in items.values() for i in its)}
    views = {o: fold_owner(source.events_of(o), o) for o in sorted(owners)}
    sources = {i["memoryId"]: sorted(views[i["owner"]].store.sources.get(i["memoryId"], ()))
               for its in items.values() for i in its}
    return sources, views


class InboxCollector:
    """Prometheus metrics of the inbox as the console's store holds it: what hosts did with
    the packets (claims, deliveries), which the worker never sees. Counted from the log, so
    they only grow while the topics are kept, and start again if the store is rebuilt."""

    def __init__(self, store: AuditStore) -> None:
        self.store = store

    def describe(self) -> list[Metric]:
        return []  # the metrics are known once the store is read (no collection at register)

    def collect(self) -> Iterator[Metric]:
        counts = Q.inbox_counts(self.store)
        ops = CounterMetricFamily("mnemoflow_inbox_ops", "Inbox ops in the log, by op "
                                  "(inject: the broker wrote a packet; claim: a host took "
                                  "packets; expire, remove, steer)", labels=["op"])
        for op in ("inject", "claim", "expire", "remove", "steer"):
            ops.add_metric([op], counts["ops"].get(op, 0))
        yield ops
        yield CounterMetricFamily("mnemoflow_packets_claimed", "Packets a host claimed (the "
                                  "first claim op in the log wins each)",
                                  value=counts["packetsClaimed"])
        yield CounterMetricFamily("mnemoflow_packets_delivered", "Packets a host reported "
                                  "delivered (feedback packet_delivered)",
                                  value=counts["packetsDelivered"])


Handler = Callable[[Request], Awaitable[Response]]


def create_app(source: ConsoleSource, *, token: str | None = None, actor: str = "operator",
               refresh_s: float = 2.0, replay_wait_s: float = 30.0,
               lifecycle: Callable[[], contextlib.AbstractAsyncContextManager[None]]
               | None = None) -> Starlette:
    """The console over `source`. `refresh_s`: how often the source folds the topics' news
    (0: never in the background; every action still refreshes). `replay_wait_s`: how long a
    replay waits for the worker's answer before showing its page anyway. `lifecycle`: starts
    and stops the source around the app's life."""
    templates = Jinja2Templates(directory=str(TEMPLATES))
    env = templates.env
    env.filters.update(when=when, short=short, quote=lambda s: quote(str(s), safe=""))
    csrf = secrets.token_urlsafe(24)

    def page(request: Request, name: str, status: int = 200, **ctx: Any) -> Response:
        return templates.TemplateResponse(request, name, {
            "csrf": csrf, "msg": request.query_params.get("msg", ""), "path": _here(request),
            **ctx}, status_code=status)

    def missing(request: Request, what: str) -> Response:
        return page(request, "missing.html", 404, what=what)

    async def index(request: Request) -> Response:
        return page(request, "index.html", sessions=Q.recent_sessions(source.store),
                    users=Q.recent_users(source.store),
                    folded={t: source.store.count(t) for t in ("events", "audit", "packets")})

    async def find(request: Request) -> Response:
        q = request.query_params.get("q", "").strip()
        packets = Q.resolve_packet(source.store, q) if q else []
        if packets:
            return RedirectResponse(f"/packets/{quote(packets[0])}", 303)
        if q and Q.session_timeline(source.store, q) is not None:
            return RedirectResponse(f"/sessions/{quote(q)}", 303)
        if q and (Q.user_view(source.store, q) is not None or source.events_of(q)):
            return RedirectResponse(f"/users/{quote(q)}", 303)
        return missing(request, f"a session, user or packet {q!r}")

    async def session(request: Request) -> Response:
        sid = request.path_params["sid"]
        timeline = Q.session_timeline(source.store, sid)
        if timeline is None:
            return missing(request, f"session {sid!r}")
        items = Q.session_packet_items(source.store, sid)
        sources, views = session_memory(source, timeline["userIds"], items)
        now_ms = int(time.time() * 1000)
        off = {u: views[u].store.controls.off(u, sid, now_ms) for u in timeline["userIds"]}
        return page(request, "session.html", s=timeline, items=items, off=off,
                    sources=sources)

    def chain_of(request: Request) -> Row | None:
        ids = Q.resolve_packet(source.store, request.path_params["pid"])
        return Q.packet_chain(source.store, ids[0]) if len(ids) == 1 else None

    async def packet(request: Request) -> Response:
        chain = chain_of(request)
        if chain is None:
            return missing(request, f"packet {request.path_params['pid']!r}")
        rid = chain["broker"]["requestId"] if chain["broker"] else None
        return page(request, "packet.html", c=chain,
                    replays=Q.replays_of(source.store, rid) if rid else [],
                    replayable=rid is not None and Q.request_of(source.store, rid) is not None)

    async def replay(request: Request) -> Response:
        """Send the packet's request again, marked a replay: the worker answers it against
        today's memory with a shadow audit; then show what changed."""
        chain = chain_of(request)
        back = f"/packets/{quote(request.path_params['pid'])}"
        past = Q.request_of(source.store, chain["broker"]["requestId"]) \
            if chain and chain["broker"] else None
        if past is None:
            return page(request, "refused.html", 409, back=back, why="the recall request "
                        "behind this packet is not in the store (deleted by retention?)")
        first = past.get("replayOf") or past["requestId"]  # a replay of a replay: the first
        now_ms = int(time.time() * 1000)
        again = {**(Q.request_of(source.store, first) or past), "replayOf": first,
                 "replayBy": actor, "requestId": stable_id("req", "replay", first, str(now_ms))}
        await source.send_request(again)
        deadline = time.monotonic() + replay_wait_s
        while True:
            await source.refresh()
            if Q.recall_diff(source.store, first, again["requestId"]) is not None \
                    or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
        return RedirectResponse(f"/replays/{quote(again['requestId'])}", 303)

    async def replayed(request: Request) -> Response:
        rid = request.path_params["rid"]
        sent = Q.request_of(source.store, rid)
        if sent is None or not sent.get("replayOf"):
            return missing(request, f"replay {rid!r}")
        return page(request, "replay.html", rid=rid, first=sent["replayOf"],
                    by=sent.get("replayBy"), d=Q.recall_diff(source.store, sent["replayOf"], rid))

    async def user(request: Request) -> Response:
        uid = request.path_params["uid"]
        view = fold_owner(source.events_of(uid), uid)
        audit = Q.user_view(source.store, uid)
        if audit is None and not view.history:
            return missing(request, f"user {uid!r}")
        actions = audit["operatorActions"] if audit else Q.operator_actions(source.store, uid)
        return page(request, "user.html", u=user_page(view, actions, int(time.time() * 1000)),
                    a=audit)

    async def memory(request: Request) -> Response:
        uid, mid = request.path_params["uid"], request.path_params["mid"]
        view = fold_owner(source.events_of(uid), uid)
        detail = view.detail(mid)
        if detail is None:
            return missing(request, f"memory {mid!r} of {uid!r}")
        return page(request, "memory.html", m=detail, uid=uid,
                    actions=memory_actions(view, mid),
                    sources=sorted(view.store.sources.get(mid, ())))

    async def act(request: Request) -> Response:
        uid, mid, verb = (request.path_params[k] for k in ("uid", "mid", "verb"))
        form = await request.form()
        back = _safe_next(str(form.get("next") or ""), f"/users/{quote(uid)}")
        reason = str(form.get("reason") or "").strip()
        if verb not in ACTIONS:
            return missing(request, f"action {verb!r}")
        view = fold_owner(source.events_of(uid), uid)
        why = refusal(view, verb, mid) or ("" if reason else "a reason is needed")
        if why:
            return page(request, "refused.html", 409, why=why, back=back)
        events = operator_events(view, verb, mid, reason, actor, int(time.time() * 1000),
                                 with_sources=verb == "revoke" and form.get("sources") == "on")
        for ev in events:
            await source.append(ev)
        await source.refresh()
        return _done(back, "; ".join(f"{ev['op']} {ev['memoryId']} by {actor}: {reason}"
                                     for ev in events))

    async def switch(request: Request) -> Response:
        uid = request.path_params["uid"]
        form = await request.form()
        back = _safe_next(str(form.get("next") or ""), f"/users/{quote(uid)}")
        reason, ses = str(form.get("reason") or "").strip(), str(form.get("session") or "")
        off = form.get("memory") == "off"
        if not reason:
            return page(request, "refused.html", 409, why="a reason is needed", back=back)
        ev = switch_event(fold_owner(source.events_of(uid), uid), ses, off, reason, actor,
                          int(time.time() * 1000))
        await source.append(ev)
        await source.refresh()
        what = f"session {ses} of {uid}" if ses else uid
        return _done(back, f"memory {'off' if off else 'on'} for {what} by {actor}: {reason}")

    async def forget(request: Request) -> Response:
        uid = request.path_params["uid"]
        form = await request.form()
        back = f"/users/{quote(uid)}"
        reason, typed = str(form.get("reason") or "").strip(), str(form.get("confirm") or "")
        if not reason:
            return page(request, "refused.html", 409, why="a reason is needed", back=back)
        if typed != uid:
            return page(request, "refused.html", 409, back=back,
                        why="to forget a user, type the user id again: there is no undo")
        summary = await source.forget(uid, reason, actor)
        await source.refresh()
        return _done(back, f"{summary} by {actor}: {reason}")

    async def login(request: Request) -> Response:
        given = request.query_params.get("token", "")
        if token is None or not hmac.compare_digest(given.encode(), token.encode()):
            return JSONResponse({"detail": "unknown token"}, 401)
        out = RedirectResponse("/", 303)
        out.set_cookie(COOKIE, token, httponly=True, samesite="strict")
        return out

    async def healthz(_: Request) -> Response:
        return JSONResponse({"ok": True})

    registry = CollectorRegistry()
    registry.register(InboxCollector(source.store))

    async def metrics(_: Request) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    def guarded(handler: Handler, post: bool = False) -> Handler:
        async def run(request: Request) -> Response:
            why = access_refusal(token, request.headers.get("host"),
                                 request.cookies.get(COOKIE), request.headers.get("authorization"))
            if why is not None:
                return JSONResponse({"detail": why}, 403 if token is None else 401)
            if post:
                form = await request.form()
                if not hmac.compare_digest(str(form.get("csrf") or "").encode(), csrf.encode()):
                    return JSONResponse({"detail": "stale or missing form token: reload the "
                                         "page"}, 403)
            return await handler(request)
        return run

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            if lifecycle is not None:
                await stack.enter_async_context(lifecycle())
            stop = asyncio.Event()
            task = (asyncio.create_task(_keep_fresh(source, refresh_s, stop)) if refresh_s
                    else None)
            try:
                yield
            finally:
                if task is not None:
                    await _stop_task(task, stop)

    return Starlette(lifespan=lifespan, routes=[
        Route("/", guarded(index)),
        Route("/find", guarded(find)),
        Route("/sessions/{sid:path}", guarded(session)),
        Route("/packets/{pid}/replay", guarded(replay, post=True), methods=["POST"]),
        Route("/packets/{pid}", guarded(packet)),
        Route("/replays/{rid}", guarded(replayed)),
        Route("/users/{uid}/memories/{mid}/{verb}", guarded(act, post=True), methods=["POST"]),
        Route("/users/{uid}/memories/{mid}", guarded(memory)),
        Route("/users/{uid}/switch", guarded(switch, post=True), methods=["POST"]),
        Route("/users/{uid}/forget", guarded(forget, post=True), methods=["POST"]),
        Route("/users/{uid}", guarded(user)),
        Route("/login", login),
        Route("/healthz", healthz),
        Route("/metrics", guarded(metrics)),
    ])


def _here(request: Request) -> str:
    """This page's path and query without the message, to come back to after an action."""
    q = "&".join(f"{k}={quote(v, safe='')}" for k, v in request.query_params.items()
                 if k != "msg")
    return request.url.path + (f"?{q}" if q else "")


def _done(back: str, msg: str) -> Response:
    sep = "&" if "?" in back else "?"
    return RedirectResponse(f"{back}{sep}msg={quote(msg, safe='')}", 303)


async def _keep_fresh(source: ConsoleSource, every_s: float, stop: asyncio.Event) -> None:
    """Fold the topics' news every `every_s` until `stop` is set; a failed sync is logged and
    tried again."""
    while not stop.is_set():
        await asyncio.sleep(every_s)
        if stop.is_set():
            return
        try:
            await source.refresh()
        except Exception as exc:  # the broker away for a moment: the pages show what is held
            log.warning("console refresh failed: %s", exc)


async def _stop_task(task: asyncio.Task[None], stop: asyncio.Event) -> None:
    """Stop the refresh loop. The event ends it even if a cancellation is lost: before Python
    3.12, an `asyncio.wait_for` inside a client library can swallow one, and a loop that
    outlived the console once kept syncing into its closed store."""
    stop.set()
    task.cancel()
    while not task.done():
        await asyncio.wait({task}, timeout=1.0)
        task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
