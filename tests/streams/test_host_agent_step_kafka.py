"""HostSession.agent_step through the real broker: the steps reach the agent-steps topic, in
order, in the same partition as the rest of their session (the worker joins them there)."""

from __future__ import annotations

import pytest
from test_host_agent_step import SESSION, check_turn, play_turn

from mnemoflow.streams import topics as T
from mnemoflow.streams.host import HostClient
from mnemoflow.streams.reader import TopicReader

from support import isolated_settings, prepare_topics

pytestmark = pytest.mark.kafka


async def test_agent_steps_reach_their_topic_beside_the_rest_of_the_session(
        kafka_bootstrap, tmp_path) -> None:
    s = isolated_settings(tmp_path, "steps")
    await prepare_topics(s, kafka_bootstrap)
    async with HostClient(s, kafka_bootstrap) as host:
        await play_turn(host)

    bases = {spec.name(s): spec.base for spec in T.INPUT_TOPICS}
    async with TopicReader(s, kafka_bootstrap, list(bases)) as reader:
        await reader.wait_for(lambda got: len(got) >= 6, 30)
        got = await reader.drain()
    assert all(r.error is None for r in got), [r.error for r in got]
    assert {(r.partition, r.key) for r in got} == {(got[0].partition, SESSION.encode())}
    # one partition of each topic: offsets give the order they were written in
    check_turn([(bases[r.topic], r.value) for r in sorted(got, key=lambda r: (r.topic, r.offset))
                if r.value is not None])
