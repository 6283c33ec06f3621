"""The `mnemoflow` command: kafka, topics, worker, serve, console, audit, memories, health,
replay, rebuild, eval."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

from mnemoflow.streams import audit_cli, memories_cli
from mnemoflow.streams.config import Settings


def _kafka(args: argparse.Namespace, settings: Settings) -> int:
    from mnemoflow.streams.kafka_local import KafkaSetupError, LocalKafka

    k = LocalKafka(settings)
    try:
        if args.action == "up":
            k.up()
        elif args.action == "down":
            k.down()
        elif args.action == "reset":
            if not args.yes:
                print(f"error: `kafka reset` deletes every topic, record and committed offset "
                      f"of the local broker in {k.data_dir}; add --yes to do it", file=sys.stderr)
                return 2
            for path in k.reset():
                print(f"deleted {path}")
        else:
            st = k.status()
            if st is None:
                print("kafka not running")
                return 1
            print(f"kafka running (pid {st.pid}) at {st.bootstrap}")
    except KafkaSetupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def _topics(args: argparse.Namespace, settings: Settings) -> int:
    from mnemoflow.streams.admin import TopicMismatch, create_topics, describe_topics
    from mnemoflow.streams.kafka_local import resolve_bootstrap

    bootstrap = resolve_bootstrap(settings)
    if args.action == "create":
        try:
            for name, what in asyncio.run(create_topics(settings, bootstrap)).items():
                print(f"{what:8} {name}")
        except TopicMismatch as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 3
    else:
        print(f"{'topic':34} {'parts':>5} {'cleanup':8} retention.ms")
        for t in asyncio.run(describe_topics(settings, bootstrap)):
            if not t.exists:
                print(f"{t.name:34} {'-':>5} (missing)")
                continue
            print(f"{t.name:34} {t.partitions:>5} {t.configs.get('cleanup.policy', ''):8} "
                  f"{t.configs.get('retention.ms', '')}")
    return 0


def _worker(args: argparse.Namespace, settings: Settings) -> int:
    # one BLAS thread: embedding already runs beside the event loop, and oversubscribed BLAS
    # threads spin instead of working
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")
    from mnemoflow.streams.kafka_local import resolve_bootstrap
    from mnemoflow.streams.worker import run_worker

    return run_worker(settings, resolve_bootstrap(settings), loglevel=args.loglevel)


def _serve(args: argparse.Namespace, settings: Settings) -> int:
    """The gateway: the host SDK over HTTP and MCP, served by uvicorn until interrupted."""
    from pathlib import Path

    import uvicorn

    from mnemoflow.agents.tenancy import TenancyError, bind_refusal
    from mnemoflow.streams.config import env_opt
    from mnemoflow.streams.gateway import create_app, load_tenants
    from mnemoflow.streams.gateway_service import TOPICS
    from mnemoflow.streams.kafka_local import resolve_bootstrap
    from mnemoflow.streams.producer import TopicsMissing, require_topics

    path = args.tokens or env_opt("MNEMOFLOW_GATEWAY_TOKENS")
    try:
        tenants = load_tenants(Path(path)) if path else {}
    except (OSError, TenancyError) as exc:
        print(f"error: tokens: {exc}", file=sys.stderr)
        return 2
    refusal = bind_refusal(args.host, bool(tenants))
    if refusal:
        print(f"error: {refusal}", file=sys.stderr)
        return 2
    bootstrap = resolve_bootstrap(settings)
    try:  # here, for a one-line error: a failed start inside uvicorn is a traceback
        asyncio.run(require_topics(settings, bootstrap, [spec.name(settings) for spec in TOPICS],
                                   settings.connect_timeout_s))
    except TopicsMissing as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    names = sorted(set(tenants.values()))
    print(f"mnemoflow gateway on http://{args.host}:{args.port} (API docs /docs, MCP /mcp): "
          + (f"{len(names)} tenant(s): {', '.join(names)}" if names else
             "no tokens, one local tenant, loopback only"))
    level = {"crit": "critical", "warn": "warning"}.get(args.loglevel, args.loglevel)
    uvicorn.run(create_app(settings, bootstrap, tenants, host=args.host), host=args.host,
                port=args.port, log_level=level)
    return 0


def _console(args: argparse.Namespace, settings: Settings) -> int:
    """The operator's web console, served by uvicorn until interrupted."""
    import contextlib
    import getpass

    import uvicorn

    from mnemoflow.agents.tenancy import is_loopback
    from mnemoflow.projections.audit_store import StoreBusy
    from mnemoflow.streams.audit_sync import TOPICS, open_store, store_path
    from mnemoflow.streams.config import env_opt
    from mnemoflow.streams.console import KafkaSource, create_app
    from mnemoflow.streams.kafka_local import resolve_bootstrap
    from mnemoflow.streams.producer import TopicsMissing, require_topics

    token = args.token or env_opt("MNEMOFLOW_CONSOLE_TOKEN")
    if not token and not is_loopback(args.host):
        print(f"error: refusing to listen on {args.host} without a token: give --token (or "
              f"MNEMOFLOW_CONSOLE_TOKEN), or listen on 127.0.0.1", file=sys.stderr)
        return 2
    bootstrap = resolve_bootstrap(settings)
    try:
        asyncio.run(require_topics(settings, bootstrap, [settings.topic(t) for t in TOPICS],
                                   settings.connect_timeout_s))
        path = store_path(settings).with_name(f"{settings.app_id}.console.duckdb")
        store = open_store(settings, path)
    except (TopicsMissing, StoreBusy) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    source = KafkaSource(settings, bootstrap, store)

    @contextlib.asynccontextmanager
    async def lifecycle():  # type: ignore[no-untyped-def]
        await source.start()
        try:
            yield
        finally:
            await source.stop()

    print(f"mnemoflow console on http://{args.host}:{args.port}"
          + ("/login?token=... (a token is needed)" if token else " (loopback only)"))
    try:
        uvicorn.run(create_app(source, token=token, actor=args.actor or getpass.getuser(),
                               refresh_s=args.refresh, lifecycle=lifecycle),
                    host=args.host, port=args.port, log_level="warning")
    finally:
        store.close()
    return 0


def _health(args: argparse.Namespace, settings: Settings) -> int:
    """0 when a live worker of the app is ready and its health file is fresh."""
    import json

    from mnemoflow.streams.lifecycle import read_health

    workers = read_health(settings.home, settings.app_id)
    for h in workers:
        print(json.dumps(h) if args.json else
              f"worker pid {h['pid']}: {h['status']}{' (stale)' if not h['fresh'] else ''}"
              f"{': ' + h['detail'] if h.get('detail') else ''}")
    if not workers:
        print(f"no live worker of app {settings.app_id} under {settings.home}")
    return 0 if any(h["status"] == "ready" and h["fresh"] for h in workers) else 1


def _replay(args: argparse.Namespace, settings: Settings) -> int:
    from mnemoflow.streams import topics as T
    from mnemoflow.streams.kafka_local import resolve_bootstrap
    from mnemoflow.streams.replay import ReplayError, Target, reset_offsets, reset_state

    bootstrap = resolve_bootstrap(settings)
    if args.to_offset is not None:
        target = Target("offset", args.to_offset)
    elif args.to_time is not None:
        from mnemoflow.agents.temporal import parse_event_time

        ms = int(args.to_time) if args.to_time.isdigit() else parse_event_time(args.to_time)
        if ms is None:
            print(f"error: cannot read time {args.to_time!r}", file=sys.stderr)
            return 2
        target = Target("time", ms)
    else:
        target = Target("earliest")
    group = args.group or settings.app_id
    topics = args.topics or [spec.name(settings) for spec in T.INPUT_TOPICS]
    try:
        offsets = asyncio.run(reset_offsets(settings, bootstrap, group, topics, target))
    except ReplayError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    for tp, off in sorted(offsets.items()):
        print(f"{group} {tp.topic}[{tp.partition}] -> {off}")
    if group == settings.app_id and not args.keep_state:
        for t in asyncio.run(reset_state(settings, bootstrap)):
            print(f"deleted changelog {t}")
        print(f"removed local state {settings.home / 'faust' / settings.app_id}")
    return 0


def _eval(args: argparse.Namespace, settings: Settings) -> int:
    from pathlib import Path

    from mnemoflow.evaluation.run import load, run_eval

    ids = args.conversations or args.questions
    roles = tuple(args.roles.split(","))
    bench = load(args.benchmark, Path(args.file), args.limit, ids, roles)
    out = Path(args.out or f"bench/results/{args.benchmark}-{args.mode}")
    command = "mnemoflow " + " ".join(sys.argv[1:])
    res = run_eval(args.benchmark, bench, out, args.mode, command)
    o = res["summary"]["overall"]
    print({k: round(v, 3) for k, v in o.items() if v is not None and (
        k.endswith("@5") or k.endswith("@10") or k.startswith("packet") or k == "triggered")})
    return 0


def _rebuild(args: argparse.Namespace, settings: Settings) -> int:
    """Rebuild the LanceDB index and MEMORY.md from the memory-log, as the worker's projector
    would build them. `--from markdown` first appends to the memory-log what the MEMORY.md
    files hold and the log does not (after the log was lost): the worker recalls from the
    store it folds from the log, so memories only in an index would never come back."""
    from mnemoflow.agents.partitioning import partition_of
    from mnemoflow.agents.tuning import load_tuning
    from mnemoflow.projections import snapshot
    from mnemoflow.projections.partitioned import partition_dir
    from mnemoflow.projections.rebuild import MarkdownIncomplete, default_embedder, rebuild
    from mnemoflow.streams.admin import TopicMismatch, create_topics
    from mnemoflow.streams.kafka_local import resolve_bootstrap
    from mnemoflow.streams.lifecycle import read_health
    from mnemoflow.streams.restore import read_memory_log, restore_from_markdown
    from mnemoflow.streams.worker import memory_dir

    index_path = memory_dir(settings)
    md_root = settings.home / "markdown" / settings.app_id
    live = [h["pid"] for h in read_health(settings.home, settings.app_id)]
    if live:  # the worker owns the index while it runs, and would not see it replaced
        print(f"error: a worker of app {settings.app_id} is running (pid "
              f"{', '.join(map(str, live))}); stop it before `rebuild`", file=sys.stderr)
        return 3
    bootstrap = resolve_bootstrap(settings)
    topic = settings.topic("memory-log")

    async def run() -> tuple[int, int, int]:
        if args.source == "markdown":
            # a reset broker has no topics; the worker needs them all anyway (idempotent)
            for name, what in (await create_topics(settings, bootstrap)).items():
                if what == "created":
                    print(f"created  {name}")
            res = await restore_from_markdown(settings, bootstrap, md_root)
            print(f"restored {res.appended} of the {res.recovered} memory-log records in "
                  f"{md_root} to {topic} ({res.recovered - res.appended} already there, "
                  f"{res.log_records} records in the log before)")
            if not res.recovered:
                print(f"note: no MEMORY.md records under {md_root}; MNEMOFLOW_HOME and "
                      f"MNEMOFLOW_APP_ID say where they are")
        events = await read_memory_log(settings, bootstrap)
        by_part: dict[int, list[dict]] = {p: [] for p in range(settings.partitions)}
        for ev in events:  # each partition's index, as the worker folds it
            by_part[partition_of(ev["owner"], settings.partitions)].append(ev)
        memories = vectors = 0
        embedder = default_embedder(settings.embedder, settings.embedding_model)
        for p, evs in by_part.items():
            store, index = await rebuild(evs, index_path / partition_dir(p) / "vectors",
                                         embedder, md_root,
                                         load_tuning(settings.weights_file, settings.embedding_model).index)
            memories, vectors = memories + len(store), vectors + len(index)
        snapshot.drop_all(index_path)  # the worker folds the log again over the new indexes
        return len(events), memories, vectors

    try:
        n, memories, vectors = asyncio.run(run())
    except LookupError as exc:  # the memory-log topic is missing (the message names the fix)
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except TopicMismatch as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    except MarkdownIncomplete as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"rebuilt from {topic} ({n} records): {memories} memories, {vectors} vectors at "
          f"{index_path}; MEMORY.md under {md_root}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mnemoflow", description=__doc__)
    p.add_argument("--version", action="version", version=f"mnemoflow {_version()}")
    sub = p.add_subparsers(dest="cmd", required=True)
    k = sub.add_parser("kafka", help="the local single-node KRaft broker")
    k.add_argument("action", choices=["up", "down", "status", "reset"],
                   help="reset stops the broker and deletes its data (needs --yes)")
    k.add_argument("--yes", action="store_true", help="confirm `reset`")
    k.set_defaults(func=_kafka)
    h = sub.add_parser("health", help="is a worker of this app ready? (exit 0 if so)")
    h.add_argument("--json", action="store_true")
    h.set_defaults(func=_health)
    t = sub.add_parser("topics", help="the topic catalogue on the cluster")
    t.add_argument("action", choices=["create", "describe"])
    t.set_defaults(func=_topics)
    w = sub.add_parser("worker", help="run the stream worker (faust)")
    w.add_argument("--loglevel", default="warn", choices=["crit", "error", "warn", "info", "debug"])
    w.set_defaults(func=_worker)
    sv = sub.add_parser("serve", help="the gateway: the host SDK over HTTP (/docs) and MCP (/mcp)")
    sv.add_argument("--host", default="127.0.0.1",
                    help="address to listen on; other than loopback only with tokens")
    sv.add_argument("--port", type=int, default=8088)
    sv.add_argument("--tokens", help="JSON or TOML file {token: tenant} (default: "
                    "$MNEMOFLOW_GATEWAY_TOKENS; none: one local tenant, loopback only)")
    sv.add_argument("--loglevel", default="info", choices=["crit", "error", "warn", "info", "debug"])
    sv.set_defaults(func=_serve)
    co = sub.add_parser("console", help="the operator's web console: sessions, packets, "
                        "memories; revoke, confirm, resolve, approve, memory off and on")
    co.add_argument("--host", default="127.0.0.1",
                    help="address to listen on; other than loopback only with a token")
    co.add_argument("--port", type=int, default=8089)
    co.add_argument("--token", help="needed to open the console (default: "
                    "$MNEMOFLOW_CONSOLE_TOKEN; none: loopback only)")
    co.add_argument("--actor", help="the operator's name in every action (default: the login)")
    co.add_argument("--refresh", type=float, default=2.0,
                    help="seconds between folds of the topics' news (default 2)")
    co.set_defaults(func=_console)
    r = sub.add_parser("replay", help="reset a stopped consumer group's offsets (and its state)")
    r.add_argument("--group", help="consumer group (default: the worker's app id)")
    g = r.add_mutually_exclusive_group(required=True)
    g.add_argument("--to-earliest", action="store_true")
    g.add_argument("--to-offset", type=int)
    g.add_argument("--to-time", help="epoch ms or a timestamp")
    r.add_argument("--topics", nargs="*", help="default: the three input topics")
    r.add_argument("--keep-state", action="store_true",
                   help="do not delete the app's changelogs and local state")
    r.set_defaults(func=_replay)
    rb = sub.add_parser("rebuild", help="re-create the LanceDB index and MEMORY.md from the "
                        "memory-log (stop the worker first)")
    rb.add_argument("--from", dest="source", choices=["memory-log", "markdown"], required=True,
                    help="markdown: first append to the memory-log what MEMORY.md holds and "
                    "the log does not")
    rb.set_defaults(func=_rebuild)
    audit_cli.add_parser(sub)
    memories_cli.add_parser(sub)
    e = sub.add_parser("eval", help="replay a benchmark through the pipeline and measure it")
    e.add_argument("benchmark", choices=["locomo", "longmemeval"])
    e.add_argument("file")
    e.add_argument("--oracle", help="LongMemEval oracle file (evaluated as its own run)")
    e.add_argument("--limit", type=int, help="at most N questions")
    e.add_argument("--conversations", nargs="*", help="LoCoMo sample ids")
    e.add_argument("--questions", nargs="*", help="LongMemEval question ids")
    e.add_argument("--mode", choices=["soft", "shadow"], default="soft")
    e.add_argument("--roles", default="user,assistant", help="LongMemEval turn roles to replay")
    e.add_argument("--out", help="results folder (default bench/results/<benchmark>-<mode>)")
    e.set_defaults(func=_eval)
    return p


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("mnemoflow")
    except PackageNotFoundError:
        return "unknown"


def main(argv: list[str] | None = None) -> None:
    """Bad settings, an unreachable broker and missing topics are one line on stderr and
    exit code 2; the traceback is logged only with `--loglevel debug`."""
    from mnemoflow.streams.config import ConfigError
    from mnemoflow.streams.preflight import PreflightError

    args = build_parser().parse_args(argv)
    if getattr(args, "loglevel", "") != "debug":
        # the Kafka client logs every failed connection; a command says it once, below
        logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    try:
        settings = Settings()
        raise SystemExit(args.func(args, settings))
    except (ConfigError, PreflightError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    except Exception as exc:
        from aiokafka.errors import KafkaConnectionError, KafkaError

        from mnemoflow.streams.preflight import unreachable

        # ConnectionError, not OSError: a disk error is not the broker's
        if not isinstance(exc, KafkaError | ConnectionError) or \
                getattr(args, "loglevel", "") == "debug":
            raise
        if isinstance(exc, KafkaConnectionError | ConnectionError):
            print(f"error: {unreachable(_bootstrap_for_error(), exc)}", file=sys.stderr)
        else:
            print(f"error: Kafka at {_bootstrap_for_error()}: {type(exc).__name__}: {exc}",
                  file=sys.stderr)
        raise SystemExit(2) from None


def _bootstrap_for_error() -> str:
    import os

    return os.environ.get("KAFKA_BOOTSTRAP") or "the local broker"


if __name__ == "__main__":
    main()
