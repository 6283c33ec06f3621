"""Topic administration from the catalogue: idempotent create, describe, and a guard on partitions."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from mnemoflow.streams.config import Settings
from mnemoflow.streams.topics import CATALOGUE, TopicSpec

VISIBLE_TIMEOUT_S = 15.0  # longest wait for a topic the controller knows to be listed
TOPIC_ALREADY_EXISTS = 36  # Kafka's error code


class TopicMismatch(RuntimeError):
    """An existing topic disagrees with the catalogue in a way we must not paper over."""


@dataclass(frozen=True)
class TopicLayout:
    """A topic's name, partition count and configs: what is wanted, or what a cluster holds."""

    name: str
    partitions: int
    configs: dict[str, str]  # topic-level: cleanup.policy, retention.ms


@dataclass(frozen=True)
class TopicInfo(TopicLayout):
    """A catalogue topic as the cluster describes it (0 partitions when it does not exist)."""

    exists: bool


def admin_client(settings: Settings, bootstrap: str) -> AIOKafkaAdminClient:
    return AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=15000,
                               **settings.client_kwargs())


async def existing_partitions(admin: AIOKafkaAdminClient, names: list[str]) -> dict[str, int]:
    """Partition counts of those of `names` that exist. Only topics the cluster lists are
    described by name: a metadata request naming a missing topic makes a cluster with
    auto-create on create it, with the broker's default partition count."""
    listed = set(await admin.list_topics())
    names = [n for n in names if n in listed]
    if not names:
        return {}
    meta = await admin.describe_topics(names)
    out = {}
    for t in meta:
        if t.get("error_code", 0) == 0 and t.get("partitions"):
            out[t["topic"]] = len(t["partitions"])
    return out


async def create_topics(
    settings: Settings, bootstrap: str, specs: tuple[TopicSpec, ...] = CATALOGUE
) -> dict[str, str]:
    """Create what is missing; refuse an existing topic whose partition count differs."""
    admin = admin_client(settings, bootstrap)
    await admin.start()
    try:
        names = [s.name(settings) for s in specs]
        have = await existing_partitions(admin, names)
        result: dict[str, str] = {}
        missing = []
        for spec in specs:
            name = spec.name(settings)
            want = spec.partitions or settings.partitions
            if name in have:
                if have[name] != want:
                    raise TopicMismatch(
                        f"topic {name} exists with {have[name]} partitions, the catalogue says "
                        f"{want}; refusing (sessionId routing would change). Delete it or set "
                        f"MNEMOFLOW_PARTITIONS={have[name]}."
                    )
                result[name] = "exists"
            else:
                missing.append(TopicLayout(name, want, spec.configs()))
                result[name] = "created"
        if missing:
            result.update(dict.fromkeys(await create_new(admin, missing), "exists"))
            await wait_listed(admin, [t.name for t in missing])
        return result
    finally:
        await admin.close()


async def create_new(admin: AIOKafkaAdminClient, topics: list[TopicLayout]) -> list[str]:
    """Create `topics` (replication factor 1); the names that another client created first.
    TopicMismatch when the cluster refuses one for any other reason."""
    resp = await admin.create_topics(
        [NewTopic(t.name, t.partitions, 1, topic_configs=t.configs) for t in topics])
    raced = []
    for name, code, *_ in getattr(resp, "topic_errors", []):
        if code == TOPIC_ALREADY_EXISTS:
            raced.append(name)
        elif code != 0:
            raise TopicMismatch(f"creating {name} failed with Kafka error code {code}")
    return raced


async def wait_listed(admin: AIOKafkaAdminClient, names: list[str],
                      timeout: float = VISIBLE_TIMEOUT_S) -> dict[str, int]:
    """Wait until the broker lists and describes `names` (their partition counts then).

    A created topic is known to the controller at once but to a broker only when its metadata
    has caught up, which takes a moment more on a broker that has just started: a worker
    started right after `topics create` would otherwise find its topics missing."""
    deadline = time.monotonic() + timeout
    while True:
        have = await existing_partitions(admin, names)
        if len(have) == len(set(names)) or time.monotonic() > deadline:
            return have
        await asyncio.sleep(0.2)


async def describe_topics(settings: Settings, bootstrap: str) -> list[TopicInfo]:
    admin = admin_client(settings, bootstrap)
    await admin.start()
    try:
        names = [s.name(settings) for s in CATALOGUE]
        have = await existing_partitions(admin, names)
        from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

        infos = []
        for name in names:
            configs: dict[str, str] = {}
            if name in have:
                res = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, name)])
                for r in res:
                    for entry in r.resources[0][4]:
                        if entry[0] in ("cleanup.policy", "retention.ms"):
                            configs[entry[0]] = entry[1]
            infos.append(TopicInfo(name, have.get(name, 0), configs, name in have))
        return infos
    finally:
        await admin.close()


async def describe_group(settings: Settings, bootstrap: str, group: str) -> tuple[str, int]:
    """(state, member count) of a consumer group; ("Unknown", 0) while no coordinator answers
    (a fresh cluster has none until the offsets topic exists)."""
    from aiokafka.errors import KafkaError

    admin = admin_client(settings, bootstrap)
    try:
        await admin.start()
        for resp in await admin.describe_consumer_groups([group]):
            for g in getattr(resp, "groups", []):
                # (error_code, group, state, protocol_type, protocol, members)
                return str(g[2]), len(g[5])
        return "Unknown", 0
    except KafkaError:
        return "Unknown", 0
    finally:
        await admin.close()


async def group_stable(settings: Settings, bootstrap: str, group: str) -> bool:
    """True when the consumer group is Stable with at least one member."""
    state, members = await describe_group(settings, bootstrap, group)
    return state == "Stable" and members > 0
