"""Against the real broker: Avro round trip, topic catalogue, dead-letter and the stream going on."""

from __future__ import annotations

import pytest

from mnemoflow.streams import topics as T
from mnemoflow.streams.admin import TopicMismatch, create_topics, describe_topics
from mnemoflow.streams.producer import AvroProducer
from mnemoflow.streams.reader import TopicReader

from factories import T0, user_event
from support import isolated_settings, prepare_topics, ready_worker

pytestmark = pytest.mark.kafka


async def test_avro_event_round_trips_through_the_broker(kafka_bootstrap, tmp_path) -> None:
    s = isolated_settings(tmp_path, "rt")
    await prepare_topics(s, kafka_bootstrap)
    ev = user_event("s-rt", 1, "Kafka round trip — ünïcode ok")
    async with AvroProducer(s, kafka_bootstrap) as p:
        await p.send(T.SESSION_EVENTS.name(s), "io.mnemoflow.SessionEvent", "s-rt", ev)
    async with TopicReader(s, kafka_bootstrap, [T.SESSION_EVENTS.name(s)]) as r:
        recs = await r.wait_for(lambda rs: len(rs) >= 1, 20)
    assert recs[0].value == ev and recs[0].key == b"s-rt"


async def test_topics_create_is_idempotent_and_refuses_other_partition_counts(
        kafka_bootstrap, tmp_path) -> None:
    s = isolated_settings(tmp_path, "cat", partitions=2)
    first = await create_topics(s, kafka_bootstrap)
    assert set(first.values()) == {"created"} and len(first) == len(T.CATALOGUE)
    again = await create_topics(s, kafka_bootstrap)
    assert set(again.values()) == {"exists"}
    infos = {i.name: i for i in await describe_topics(s, kafka_bootstrap)}
    assert infos[T.INBOX.name(s)].configs["retention.ms"] == "-1"
    assert infos[T.MEMORY_LOG.name(s)].configs["retention.ms"] == "-1"
    assert all(infos[spec.name(s)].partitions == (spec.partitions or 2) for spec in T.CATALOGUE)
    with pytest.raises(TopicMismatch, match="partitions"):
        await create_topics(s.with_overrides(partitions=3), kafka_bootstrap)


@pytest.fixture(scope="module")
async def worker(kafka_bootstrap, tmp_path_factory):
    s = isolated_settings(tmp_path_factory.mktemp("w"), "dlq")
    async with ready_worker(s, kafka_bootstrap) as w:
        yield w


async def test_bad_input_on_every_topic_is_dead_lettered_and_stream_goes_on(worker) -> None:
    s, bs = worker.settings, worker.bootstrap
    async with AvroProducer(s, bs) as p:
        await p.send_raw(T.SESSION_EVENTS.name(s), b"s-bad", b"\x00garbage bytes")
        await p.send(T.SESSION_EVENTS.name(s), "io.mnemoflow.SessionEvent", "s-bad",
                     user_event("s-bad", 1, "from the future", schemaVersion=2))
        for spec in (T.TOOL_RESULTS, T.AGENT_STEPS, T.SEGMENTS, T.RECALL_REQUESTS):
            await p.send_raw(spec.name(s), b"s-bad", b"\xc3\x01" + b"\x01" * 8 + b"junk")
        await p.send(T.SESSION_EVENTS.name(s), "io.mnemoflow.SessionEvent", "s-bad",
                     user_event("s-bad", 2, "a valid message about Atlas after the junk", T0))
    async with TopicReader(s, bs, [T.DEAD_LETTER.name(s), T.SEGMENTS.name(s)]) as r:
        def done(rs):
            dl = [x for x in rs if x.topic == T.DEAD_LETTER.name(s)]
            segs = [x for x in rs if x.topic == T.SEGMENTS.name(s) and x.value]
            return len(dl) >= 6 and segs
        recs = await r.wait_for(done, 60)
    dls = [x.value for x in recs if x.topic == T.DEAD_LETTER.name(s)]
    by_topic = {d["sourceTopic"]: d for d in dls}
    se = [d for d in dls if d["sourceTopic"] == T.SESSION_EVENTS.name(s)]
    assert {d["reason"] for d in se} == {"bad-magic", "schema-version"}
    assert any(d["original"] == b"\x00garbage bytes" for d in se)
    for spec in (T.TOOL_RESULTS, T.AGENT_STEPS, T.SEGMENTS, T.RECALL_REQUESTS):
        assert by_topic[spec.name(s)]["reason"] == "unknown-fingerprint"
        assert by_topic[spec.name(s)]["offset"] >= 0
    segs = [x.value for x in recs if x.topic == T.SEGMENTS.name(s) and x.value]
    assert [g["envelope"]["eventSeq"] for g in segs] == [2]
