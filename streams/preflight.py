"""What must hold before a worker or a host touches a stream: the broker answers, the
catalogue's topics exist, and the worker's own changelog topics exist with the partition
count of the topics they are co-partitioned with, visible in the cluster's metadata.

faust creates a table's changelog topic itself while its agents already run, and a table
write that happens before the consumer's metadata shows the new topic fails its partition
check ("has 0 partitions") and crashes the agent. Creating them here, before faust starts,
and waiting until they are described with their partitions, takes that race away.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from mnemoflow.streams.admin import (
    TopicLayout,
    TopicMismatch,
    admin_client,
    create_new,
    existing_partitions,
    wait_listed,
)
from mnemoflow.streams.config import Settings
from mnemoflow.streams.producer import TopicsMissing
from mnemoflow.streams.topics import CATALOGUE

MISSING_GRACE_S = 5.0  # how long a missing catalogue topic is looked for again


class PreflightError(RuntimeError):
    """Something a worker or host cannot run without; the message is one line with the fix."""


class InternalTopic(TopicLayout):
    """A topic the worker owns (a table's changelog): created here if it is missing."""


def unreachable(bootstrap: str, exc: BaseException | None = None) -> PreflightError:
    why = f" ({type(exc).__name__})" if exc is not None else ""
    return PreflightError(f"cannot reach Kafka at {bootstrap}{why}: start it with "
                          f"`mnemoflow kafka up` or set KAFKA_BOOTSTRAP to a reachable broker")


async def connect(settings: Settings, bootstrap: str, timeout: float) -> AIOKafkaAdminClient:
    """A started admin client, or PreflightError after `timeout` seconds of trying."""
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while time.monotonic() < deadline:
        admin = admin_client(settings, bootstrap)
        try:
            await asyncio.wait_for(admin.start(), max(0.5, deadline - time.monotonic()))
            return admin
        except Exception as exc:  # every client error here means "not reachable yet"
            last = exc
            await _close(admin)
            await asyncio.sleep(0.5)
    raise unreachable(bootstrap, last)


async def _close(admin: AIOKafkaAdminClient) -> None:
    try:
        await admin.close()
    except Exception:
        pass


async def check_catalogue(admin: AIOKafkaAdminClient, settings: Settings, bootstrap: str) -> None:
    names = {s.name(settings): s.partitions or settings.partitions for s in CATALOGUE}
    # a moment's grace: topics created just before (by `topics create`, or the demo) reach
    # the broker's metadata a little after the controller's answer
    have = await wait_listed(admin, list(names), MISSING_GRACE_S)
    missing = [n for n in names if n not in have]
    if missing:
        raise PreflightError(str(TopicsMissing(bootstrap, missing)))  # the host's words
    wrong = [f"{n} has {have[n]}" for n, want in names.items() if have[n] != want]
    if wrong:
        raise PreflightError(f"partition counts differ from MNEMOFLOW_PARTITIONS="
                             f"{settings.partitions}: {', '.join(wrong)}")


async def ensure_internal(admin: AIOKafkaAdminClient, topics: list[InternalTopic],
                          timeout: float) -> list[str]:
    """Create the missing ones and wait until all are described with their partitions.
    Returns the names created now (their tables have nothing to restore)."""
    want = {t.name: t for t in topics}
    have = await existing_partitions(admin, list(want))
    wrong = [f"{n} has {have[n]}, not {t.partitions}" for n, t in want.items()
             if n in have and have[n] != t.partitions]
    if wrong:
        raise PreflightError(f"changelog partition counts differ: {', '.join(wrong)}; "
                             f"delete those topics (`mnemoflow replay` does) or restore "
                             f"MNEMOFLOW_PARTITIONS")
    created = [n for n in want if n not in have]
    if created:
        try:  # one created meanwhile by another worker is as good as our own
            await create_new(admin, [want[n] for n in created])
        except TopicMismatch as exc:
            raise PreflightError(str(exc)) from exc
    deadline = time.monotonic() + timeout
    while True:
        have = await existing_partitions(admin, list(want))
        if all(have.get(n) == t.partitions for n, t in want.items()):
            return created
        if time.monotonic() > deadline:
            late = sorted(n for n, t in want.items() if have.get(n) != t.partitions)
            raise PreflightError(f"topics not visible in metadata after {timeout:.0f}s: "
                                 f"{', '.join(late)}")
        await asyncio.sleep(0.2)


@dataclass(frozen=True)
class ClusterView:
    cluster_id: str
    created: list[str]  # internal topics created by this preflight
    end_offsets: dict[tuple[str, int], int]  # of every internal topic's partitions


async def worker_preflight(settings: Settings, bootstrap: str, internal: list[InternalTopic],
                           timeout: float = 30.0) -> ClusterView:
    """Everything a worker checks before faust starts; PreflightError on the first failure
    (a broker that stops answering half way is one too)."""
    admin = await connect(settings, bootstrap, timeout)
    try:
        await check_catalogue(admin, settings, bootstrap)
        created = await ensure_internal(admin, internal, timeout)
        cluster = await admin.describe_cluster()
        ends = await asyncio.wait_for(end_offsets(settings, bootstrap, internal), timeout)
    except PreflightError:
        raise
    except (KafkaError, OSError, TimeoutError) as exc:
        raise unreachable(bootstrap, exc) from exc
    finally:
        await _close(admin)
    return ClusterView(str(cluster.get("cluster_id") or ""), created, ends)


async def end_offsets(settings: Settings, bootstrap: str,
                      topics: list[InternalTopic]) -> dict[tuple[str, int], int]:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    if not topics:
        return {}
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                **settings.client_kwargs())
    try:
        await consumer.start()
        tps = [TopicPartition(t.name, p) for t in topics for p in range(t.partitions)]
        ends = await consumer.end_offsets(tps)
        return {(tp.topic, tp.partition): int(off) for tp, off in ends.items()}
    finally:
        await consumer.stop()
