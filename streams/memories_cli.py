"""`mnemoflow memories list|show|status|revoke|confirm|resolve|approve|disable|enable|forget --user U`:
one owner's memories, and an operator's actions on them, without code.

Reading folds the owner's events of the memory-log and memory-shared topics with the worker's
own store (projections/owner_memories.py). Every action is a memory event with source
`operator`, the operator's reason and name (agents.memory_events.as_operator), appended to the
log like any host write: nothing edits a projection, so a replay or a rebuild gives the same
state, and `mnemoflow audit` and `memories show` show who did it and why.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import sys
import time
from typing import Any

from mnemoflow.streams.config import Settings

ACTIONS = ("revoke", "confirm", "resolve", "approve")


def add_parser(sub: argparse._SubParsersAction) -> None:
    m = sub.add_parser("memories", help="one owner's memories; revoke, confirm, resolve a "
                       "conflict, approve a procedure (each an operator event with a reason)")
    verbs = m.add_subparsers(dest="verb", required=True)
    ls = verbs.add_parser("list", help="the owner's memories and procedures, newest first")
    ls.add_argument("--all", action="store_true", help="revoked and deprecated ones too")
    show = verbs.add_parser("show", help="one memory: fields, status, conflict set, history")
    show.add_argument("memory_id")
    status = verbs.add_parser("status", help="the user's memory switches, and whether memory "
                              "is on now")
    for parser in (ls, show, status):
        parser.add_argument("--user", required=True, help="the scope owner (a user id)")
    # show and status always print JSON; only the list has a table
    ls.add_argument("--json", action="store_true", help="print JSON instead of a table")
    for verb, what in (("revoke", "hide a memory everywhere (derived ones go too)"),
                       ("confirm", "accept a candidate fact, or lift a dispute"),
                       ("resolve", "settle a conflict in favour of this side"),
                       ("approve", "approve a high-risk procedure")):
        a = verbs.add_parser(verb, help=what)
        a.add_argument("memory_id")
        a.add_argument("--user", required=True, help="the scope owner (a user id)")
        a.add_argument("--reason", required=True, help="why: kept in the event and the audit")
        a.add_argument("--actor", default=None, help="who (default: the login name)")
        if verb == "revoke":
            a.add_argument("--with-sources", action="store_true",
                           help="first revoke what it was taken from (a fact's segment)")
    for verb, what in (("disable", "memory off for the user (or one session): no packets, "
                        "nothing new stored, until enabled"),
                       ("enable", "memory on again for the user (or one session)")):
        a = verbs.add_parser(verb, help=what)
        a.add_argument("--user", required=True, help="the user id")
        a.add_argument("--session", default="", help="only this session of the user")
        a.add_argument("--at", type=int, default=None,
                       help="event time in ms from which it holds (default: now)")
        a.add_argument("--reason", required=True, help="why: kept in the event and the audit")
        a.add_argument("--actor", default=None, help="who (default: the login name)")
    f = verbs.add_parser("forget", help="forget an owner for good: every projection drops "
                         "them, and the keys that sealed their memory text are shredded")
    f.add_argument("--user", required=True, help="the owner (a user id; or a session or "
                   "workspace id for memories of those scopes)")
    f.add_argument("--reason", required=True, help="why: kept, in the clear, in the event")
    f.add_argument("--actor", default=None, help="who (default: the login name)")
    f.add_argument("--confirm", required=True, metavar="USER",
                   help="the owner again: there is no undo")
    m.set_defaults(func=run)


def run(args: argparse.Namespace, settings: Settings) -> int:
    """0 done, 1 no such memory of that owner (or the action does not apply), 2 broker or
    topics unavailable."""
    from mnemoflow.streams.kafka_local import resolve_bootstrap
    from mnemoflow.streams.producer import TopicsMissing

    bootstrap = resolve_bootstrap(settings)
    try:
        return asyncio.run(_run(args, settings, bootstrap))
    except (TopicsMissing, TimeoutError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


async def _run(args: argparse.Namespace, settings: Settings, bootstrap: str) -> int:
    if args.verb == "forget":
        return await _forget(args, settings, bootstrap)
    view = await read_owner(settings, bootstrap, args.user)
    if args.verb == "list":
        return _print_list(view.rows(everything=args.all), args)
    if args.verb == "status":
        now = int(time.time() * 1000)
        print(json.dumps({"user": args.user, "memory": "off" if view.store.controls.off(
            args.user, "", now) else "on", "switches": view.store.controls.state(args.user)},
            indent=2))
        return 0
    if args.verb in ("disable", "enable"):
        return await _switch(view, args, settings, bootstrap)
    if args.verb == "show":
        detail = view.detail(args.memory_id)
        if detail is None:
            print(f"error: no memory {args.memory_id!r} of {args.user!r}", file=sys.stderr)
            return 1
        print(json.dumps(detail, indent=2, ensure_ascii=False))
        return 0
    refused = refusal(view, args.verb, args.memory_id)
    if refused:
        print(f"error: {refused}", file=sys.stderr)
        return 1
    events = operator_events(view, args.verb, args.memory_id, args.reason,
                             args.actor or getpass.getuser(), int(time.time() * 1000),
                             with_sources=getattr(args, "with_sources", False))
    from mnemoflow.streams.host import HostClient

    async with HostClient(settings, bootstrap) as host:
        for ev in events:
            await host.append_memory(ev)
    for ev in events:
        print(f"{ev['op']} {ev['memoryId']} of {args.user} by {ev['attributes']['actor']}: "
              f"{args.reason} (event {ev['eventId']})")
    return 0


async def _forget(args: argparse.Namespace, settings: Settings, bootstrap: str) -> int:
    from mnemoflow.streams.forget import forget_owner

    if args.confirm != args.user:
        print(f"error: --confirm {args.confirm!r} is not --user {args.user!r}; nothing done",
              file=sys.stderr)
        return 1
    done = await forget_owner(settings, bootstrap, args.user, args.reason,
                              args.actor or getpass.getuser())
    print(done.summary())
    if not settings.seal:
        print("note: MNEMOFLOW_SEAL=0: memory text was written in the clear, so the log still "
              "holds it; only the projections dropped it", file=sys.stderr)
    return 0


async def _switch(view: Any, args: argparse.Namespace, settings: Settings,
                  bootstrap: str) -> int:
    from mnemoflow.streams.host import HostClient

    off = args.verb == "disable"
    ev = switch_event(view, args.session, off, args.reason, args.actor or getpass.getuser(),
                      int(time.time() * 1000), args.at)
    async with HostClient(settings, bootstrap) as host:
        await host.append_memory(ev)
    what = f"session {args.session} of {args.user}" if args.session else args.user
    print(f"memory {'off' if off else 'on'} for {what} from {ev['eventTime']} by "
          f"{ev['attributes']['actor']}: {args.reason} (event {ev['eventId']})")
    return 0


def switch_event(view: Any, session: str, off: bool, reason: str, actor: str, now_ms: int,
                 at: int | None = None) -> dict[str, Any]:
    """An operator's memory switch for the owner (or one session), from `at`; by default from
    now, and after the switch it follows (a replayed history can be ahead of the clock)."""
    from mnemoflow.agents import memory_events as M

    if at is None:
        switched = view.store.controls.switches.get((view.owner, session), [])
        at = max([now_ms] + [t + 1 for t, _, _ in switched])
    return M.as_operator(M.memory_switch(view.owner, off, at, session=session), reason, actor)


async def read_owner(settings: Settings, bootstrap: str, owner: str) -> Any:
    """The owner's memories, folded from the memory-log and memory-shared topics."""
    from mnemoflow.projections.owner_memories import fold_owner
    from mnemoflow.streams.reader import TopicReader

    topics = [settings.topic("memory-log"), settings.topic("memory-shared")]
    async with TopicReader(settings, bootstrap, topics) as reader:
        await reader.drain()
        events = [r.value for r in reader.records if r.value is not None]
    return fold_owner(events, owner)


def refusal(view: Any, verb: str, memory_id: str) -> str | None:
    """Why an action cannot apply (a typo, another owner's id, the wrong kind), or None."""
    status = view.status(memory_id)
    if status == "unknown":
        return f"no memory {memory_id!r} of {view.owner!r}"
    is_procedure = memory_id in view.store.procedures
    if verb == "approve" and not is_procedure:
        return f"{memory_id} is not a procedure"
    if verb in ("confirm", "resolve") and is_procedure:
        return f"{memory_id} is a procedure: approve it"
    if verb == "resolve" and view.conflict(memory_id) is None:
        return f"{memory_id} is in no conflict set"
    if verb == "revoke" and status in ("revoked", "deprecated"):
        return f"{memory_id} is {status} already"
    return None


def operator_event(view: Any, verb: str, memory_id: str, reason: str, actor: str,
                   now_ms: int) -> dict[str, Any]:
    """The memory event of an operator action. Its event time is now, or just after the
    memory's newest event if that is later (a replayed conversation can be in the future)."""
    from mnemoflow.agents import memory_events as M

    newest = max((e["eventTime"] for e in view.history.get(memory_id, ())), default=0)
    t = max(now_ms, newest + 1)
    scope = (view.store.procedures.get(memory_id) or view.store.records[memory_id]).scope
    if verb == "revoke":
        ev = M.host_revoke(view.owner, memory_id, t, scope=scope, reason=reason)
    elif verb == "approve":
        ev = M.host_approve_procedure(view.owner, memory_id, t, scope=scope)
    else:
        ev = M.host_confirm(view.owner, memory_id, t, scope=scope)
    return M.as_operator(ev, reason, actor)


def operator_events(view: Any, verb: str, memory_id: str, reason: str, actor: str,
                    now_ms: int, with_sources: bool = False) -> list[dict[str, Any]]:
    """The events of an action, in the order to append them. A revoke `with_sources` first
    revokes what the memory was taken from (the segment a fact was extracted from still
    holds its text and would be recalled in its place), each source's revoke cascading to
    what was derived only from it, then the memory itself unless a cascade took it already.
    `view` is advanced past every event (the caller's fold of the log, plus these)."""
    targets = sorted(view.store.sources.get(memory_id, ())) if with_sources else []
    out = []
    for mid in [*targets, memory_id]:
        if refusal(view, verb, mid) is not None:
            continue  # a source already revoked, or the memory gone with its sources
        ev = operator_event(view, verb, mid, reason, actor, now_ms)
        view.store.apply(ev)
        view.history.setdefault(mid, []).append(ev)
        out.append(ev)
    return out


def _print_list(rows: list[dict[str, Any]], args: argparse.Namespace) -> int:
    if args.json:
        print(json.dumps(rows, indent=2, ensure_ascii=False))
        return 0
    from rich.console import Console

    from mnemoflow.streams.audit_cli import short, table, when

    t = table(f"memories of {args.user} ({len(rows)})", "memory kind scope status source time "
               "text")
    for r in rows:
        t.add_row(r["memoryId"], r["kind"], r["scope"], r["status"], r["source"],
                  when(r["eventTime"]), short(r["text"]))
    Console(width=None if sys.stdout.isatty() else 200).print(t)
    return 0
