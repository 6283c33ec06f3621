"""The `mnemoflow` command: kafka up|down|status, topics create|describe, worker, replay, eval."""

from __future__ import annotations

import argparse
import asyncio
import sys

from mnemoflow.streams.config import Settings


def _kafka(args: argparse.Namespace, settings: Settings) -> int:
    from mnemoflow.streams.kafka_local import KafkaSetupError, LocalKafka

    k = LocalKafka(settings)
    try:
        if args.action == "up":
            k.up()
        elif args.action == "down":
            k.down()
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
    from mnemoflow.streams.kafka_local import resolve_bootstrap
    from mnemoflow.streams.worker import run_worker

    run_worker(settings, resolve_bootstrap(settings), loglevel=args.loglevel)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mnemoflow", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    k = sub.add_parser("kafka", help="the local single-node KRaft broker")
    k.add_argument("action", choices=["up", "down", "status"])
    k.set_defaults(func=_kafka)
    t = sub.add_parser("topics", help="the topic catalogue on the cluster")
    t.add_argument("action", choices=["create", "describe"])
    t.set_defaults(func=_topics)
    w = sub.add_parser("worker", help="run the stream worker (faust)")
    w.add_argument("--loglevel", default="warn", choices=["crit", "error", "warn", "info", "debug"])
    w.set_defaults(func=_worker)
    return p


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    raise SystemExit(args.func(args, Settings()))


if __name__ == "__main__":
    main()
