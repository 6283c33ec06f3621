"""Replay = resetting a stopped consumer group's offsets, with the app's table state reset too.

aiokafka's admin client cannot alter group offsets, so we commit them from a consumer that
is assigned the partitions while the group has no members. State is reset by deleting the
app's changelog topics and its local table files (not by bumping the app version), so the
replayed events are applied to empty state exactly once and the ids come out the same.
"""

from __future__ import annotations

import asyncio
import shutil
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.structs import OffsetAndMetadata

from mnemoflow.streams.admin import admin_client, describe_group
from mnemoflow.streams.config import Settings
from mnemoflow.streams.reader import topic_partitions


class ReplayError(RuntimeError):
    pass


@dataclass(frozen=True)
class Target:
    kind: str  # earliest | offset | time
    value: int = 0


async def group_members(settings: Settings, bootstrap: str, group: str) -> int:
    return (await describe_group(settings, bootstrap, group))[1]


async def reset_offsets(settings: Settings, bootstrap: str, group: str, topics: list[str],
                        target: Target) -> dict[TopicPartition, int]:
    """Commit the target offsets for every partition of `topics` on behalf of `group`."""
    if await group_members(settings, bootstrap, group):
        raise ReplayError(f"group {group} has active members: stop its workers first")
    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False,
                         **settings.client_kwargs())
    await c.start()
    try:
        tps = []
        for t in topics:
            try:
                tps += await topic_partitions(c, t, attempts=10)
            except LookupError as exc:
                raise ReplayError(str(exc)) from exc
        c.assign(tps)
        begin = await c.beginning_offsets(tps)
        end = await c.end_offsets(tps)
        if target.kind == "earliest":
            offsets = dict(begin)
        elif target.kind == "offset":
            offsets = {tp: min(max(target.value, begin[tp]), end[tp]) for tp in tps}
        else:
            found = await c.offsets_for_times({tp: target.value for tp in tps})
            offsets = {tp: (found[tp].offset if found.get(tp) else end[tp]) for tp in tps}
        await c.commit({tp: OffsetAndMetadata(off, "mnemoflow replay") for tp, off in offsets.items()})
        return offsets
    finally:
        await c.stop()


async def reset_state(settings: Settings, bootstrap: str) -> list[str]:
    """Delete the app's table changelogs and local state; faust recreates them empty."""
    admin = admin_client(settings, bootstrap)
    await admin.start()
    try:
        changelogs = [t for t in await admin.list_topics()
                      if t.startswith(f"{settings.app_id}-") and t.endswith("-changelog")]
        if changelogs:
            await admin.delete_topics(changelogs)
            for _ in range(100):  # deletion is asynchronous on the broker
                if not set(changelogs) & set(await admin.list_topics()):
                    break
                await asyncio.sleep(0.2)
    finally:
        await admin.close()
    shutil.rmtree(settings.home / "faust" / settings.app_id, ignore_errors=True)
    return changelogs
