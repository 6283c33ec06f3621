"""`mnemoflow audit --packet P | --session S | --user U [--json] [--rebuild]`: sync the audit
store with the topics, then show why a packet was (or was not) delivered, a session's
timeline, or a user's sessions and packets.

Wired into `mnemoflow` by `add_parser`; also runs alone: `python -m mnemoflow.streams.audit_cli
--packet P`. The sync summary goes to stderr, so `--json` output is JSON alone.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from mnemoflow.streams.config import Settings

if TYPE_CHECKING:  # rich is imported when something is drawn: `mnemoflow` starts no slower
    from rich.console import Console
    from rich.table import Table

Row = dict[str, Any]


def add_parser(sub: argparse._SubParsersAction) -> None:
    a = sub.add_parser("audit", help="the decision chain behind a packet, a session or a user, "
                       "from the audit store (synced with the topics first)")
    what = a.add_mutually_exclusive_group(required=True)
    what.add_argument("--packet", help="a packet id (or the start of one)")
    what.add_argument("--session", help="a session id: its timeline")
    what.add_argument("--user", help="a user id: their sessions and packets")
    a.add_argument("--json", action="store_true", help="print JSON instead of tables")
    a.add_argument("--rebuild", action="store_true",
                   help="delete the store and fold the topics again from offset 0")
    a.set_defaults(func=run)


def run(args: argparse.Namespace, settings: Settings) -> int:
    """0 found, 1 not in the store, 2 broker or topics unavailable, 3 store busy."""
    from mnemoflow.projections.audit_store import StoreBusy
    from mnemoflow.streams.audit_sync import open_store, store_path, sync
    from mnemoflow.streams.kafka_local import resolve_bootstrap
    from mnemoflow.streams.producer import TopicsMissing

    bootstrap = resolve_bootstrap(settings)
    try:
        with open_store(settings) as store:
            report = asyncio.run(sync(store, settings, bootstrap, rebuild=args.rebuild))
            print(f"audit store {store_path(settings)}: {report.summary()}", file=sys.stderr)
            data, missing = _query(store, args)
    except StoreBusy as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    except (TopicsMissing, TimeoutError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if data is None:
        print(f"error: {missing}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(data, indent=2, ensure_ascii=False))
        return 0
    from rich.console import Console

    # piped or redirected: wide enough that no id column is cut, unless COLUMNS says otherwise
    wide = sys.stdout.isatty() or "COLUMNS" in os.environ
    console = Console(width=None if wide else 160)
    if args.packet:
        render_packet(console, data)
    elif args.session:
        render_session(console, data)
    else:
        render_user(console, data)
    return 0


def _query(store: Any, args: argparse.Namespace) -> tuple[Row | None, str]:
    from mnemoflow.projections import audit_queries as Q

    if args.packet:
        ids = Q.resolve_packet(store, args.packet)
        if len(ids) > 1:
            return None, f"{args.packet!r} begins {len(ids)}+ packet ids: {', '.join(ids)}"
        chain = Q.packet_chain(store, ids[0]) if ids else None
        return chain, f"no packet {args.packet!r} in the audit, inbox or segment topics"
    if args.session:
        return Q.session_timeline(store, args.session), f"no session {args.session!r}"
    return Q.user_view(store, args.user), f"no user {args.user!r}"


def when(ms: int | None) -> str:
    if not ms:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def short(text: str | None, n: int = 90) -> str:
    t = " ".join((text or "").split())
    return t if len(t) <= n else t[:n - 1] + "…"


def _facts(title: str, rows: list[tuple[str, str]]) -> Table:
    from rich.table import Table

    t = Table(title=title, show_header=False, title_justify="left", box=None, padding=(0, 2))
    t.add_column(style="bold", no_wrap=True)
    t.add_column(overflow="fold")
    for k, v in rows:
        t.add_row(k, v)
    return t


def table(title: str, columns: str, text_last: bool = True) -> Table:
    """A table whose columns are named in `columns`, space-separated; ids, times and codes
    never wrap (a wrapped id cannot be copied); a last column of text folds."""
    from rich.table import Table

    t = Table(title=title, title_justify="left")
    names = columns.split(" ")
    for i, name in enumerate(names):
        text = text_last and i == len(names) - 1
        t.add_column(name.replace("_", " "), no_wrap=not text, min_width=20 if text else None,
                     overflow="fold" if text else "ellipsis")
    return t


def render_packet(console: Console, c: Row) -> None:
    trig, gate, broker, pkt = c["trigger"], c["gate"], c["broker"], c["packet"]
    rows = []
    if trig:
        rows.append(("trigger", f"{trig['sessionId']} #{trig['eventSeq']} "
                     f"{trig['type'] or trig['kind']} at {when(trig['eventTime'])}: "
                     f"{short(trig['text'], 200)!r}"))
    else:
        rows.append(("trigger", "(event not in the store: segments and session-events keep 7 days)"))
    if gate:
        sig = ", ".join(f"{k} {v:.2f}" for k, v in sorted(gate["signals"].items()) if v)
        rows.append(("gate", f"{gate['action']} ({gate['reason']}), score {gate['score']:.3f}"
                     + (f"; signals: {sig}" if sig else "")))
    if broker:
        lat = f", decided {broker['latencyMs']} ms after ingest" if broker["latencyMs"] else ""
        rows.append(("broker", f"{broker['action']} ({broker['reason']}), "
                     f"index {broker['indexVersion']}{lat}"))
    rows.append(("recall tiers", ", ".join(f"{k} {v}" for k, v in sorted(c["tiers"].items()))
                 or "-"))
    s = c["safety"]
    if s:
        blocked = ", ".join(f"{b['memoryId']} ({b['outcome']})" for b in s["blocked"])
        rows.append(("safety", f"{s['verdict']}" + (f"; blocked {blocked}" if blocked else "")))
    if pkt:
        rows.append(("packet", f"{pkt['strength']}, {len(pkt['items'])} item(s), "
                     f"{pkt['budgetBytes']} B, created {when(pkt['createdAt'])}, "
                     f"expires {when(pkt['expiry'])}"))
    elif broker:
        rows.append(("packet", f"not in the inbox (broker action {broker['action']})"))
    cl = c["claim"]
    rows.append(("claim", f"{cl['claimer']} at {when(cl['eventTime'])} (op {cl['opId']}, "
                 f"inbox[{cl['part']}]@{cl['logOffset']})" if cl else "not claimed"))
    for lost in c["lostClaims"]:
        rows.append(("lost claim", f"{lost['claimer']} at {when(lost['eventTime'])}"))
    for r in c["retired"]:
        rows.append((r["op"], f"at {when(r['eventTime'])} ({r['reason']})"))
    rows.append(("feedback", "; ".join(f"{f['kind']} at {when(f['eventTime'])} (#{f['eventSeq']})"
                                       for f in c["feedback"]) or "none"))
    console.print(_facts(f"packet {c['packetId']}  session {c['sessionId']}  user {c['userId']}",
                         rows))
    if c["candidates"]:
        t = table("candidates (rank order)", "# memory score outcome scope/owner tiers text")
        for x in c["candidates"]:
            t.add_row(str(x["rank"]), x["memoryId"], f"{x['score']:.3f}",
                      x["outcome"] + (" (revoked since)" if x["revokedSince"] else ""),
                      f"{x['scope']}/{x['owner']}", ",".join(x["tiers"]), short(x["text"], 60))
        console.print(t)
    if pkt and pkt["items"]:
        t = table("packet items", "memory kind score from text")
        for i in pkt["items"]:
            t.add_row(i["memoryId"], i["kind"], f"{i['score']:.3f}",
                      f"{i['sourceSessionId']} #{i['sourceSeq']}",
                      short(i["text"], 70))
        console.print(t)


def render_session(console: Console, s: Row) -> None:
    n = s["counts"]
    console.print(f"[bold]session {s['sessionId']}[/bold] (user {', '.join(s['userIds'])}): "
                  f"{when(s['first'])} → {when(s['last'])}; {n['events']} events, gate fired "
                  f"{n['fired']}, {n['packets']} packets, {n['claims']} claims, "
                  f"{n['delivered']} delivered")
    t = table("timeline", "time seq what decision ref detail")
    for e in s["timeline"]:
        decision = f"{e['action']} ({e['reason']})" if e["action"] else (e["reason"] or "")
        t.add_row(when(e["at"]), "" if e["eventSeq"] is None else str(e["eventSeq"]), e["what"],
                  decision, e["ref"] or "", short(e["detail"], 70))
    console.print(t)


def render_user(console: Console, u: Row) -> None:
    t = table(f"user {u['userId']}: sessions", "session first last events fired packets delivered",
               text_last=False)
    for s in u["sessions"]:
        t.add_row(s["sessionId"], when(s["first"]), when(s["last"]), str(s["events"]),
                  str(s["fired"]), str(s["packets"]), str(s["delivered"]))
    console.print(t)
    t = table("packets", "packet session at broker items claimed_by delivered first_item")
    for p in u["packets"]:
        t.add_row(p["packetId"], p["sessionId"], when(p["eventTime"]), p["action"],
                  "" if p["nItems"] is None else str(p["nItems"]), p["claimedBy"] or "-",
                  "yes" if p["delivered"] else "no", short(p["firstItem"], 50))
    console.print(t)
    if u["operatorActions"]:
        t = table("operator actions", "at action memory by reason")
        for x in u["operatorActions"]:
            t.add_row(when(x["eventTime"]), x["op"], x["memoryId"], x["actor"], x["reason"])
        console.print(t)


def main(argv: list[str] | None = None) -> None:
    """`python -m mnemoflow.streams.audit_cli ...`: the subcommand alone, with the one-line
    errors `mnemoflow`'s own main gives (bad settings, the broker unreachable)."""
    from aiokafka.errors import KafkaError

    from mnemoflow.streams.config import ConfigError

    parser = argparse.ArgumentParser(prog="mnemoflow")
    add_parser(parser.add_subparsers(dest="cmd", required=True))
    args = parser.parse_args(["audit", *(sys.argv[1:] if argv is None else argv)])
    # the Kafka client logs every failed connection; the error below says it once
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    try:
        raise SystemExit(args.func(args, Settings()))
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    except (KafkaError, ConnectionError) as exc:
        print(f"error: {exc}", file=sys.stderr)  # names the bootstrap and what waited
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
