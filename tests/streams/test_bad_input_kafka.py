"""Against the real broker and worker: hostile input is dead-lettered with a reason, or
processed whole; it never crashes a stage, is never cut silently and never vanishes."""

from __future__ import annotations

import os

import pytest

from mnemoflow.streams import topics as T
from mnemoflow.streams.producer import AvroProducer
from mnemoflow.streams.reader import TopicReader

from factories import T0, user_event
from support import isolated_settings, ready_worker

pytestmark = pytest.mark.kafka
BROKER_MAX = 1_048_588  # Kafka's default max.message.bytes


@pytest.fixture(scope="module")
async def worker(kafka_bootstrap, tmp_path_factory):
    s = isolated_settings(tmp_path_factory.mktemp("bad"), "bad").with_overrides(
        vector=False, graph=False)
    async with ready_worker(s, kafka_bootstrap) as w:
        yield w


async def _outcome(s, bs: str, sid: str, timeout: float = 60) -> tuple[list[dict], list[dict]]:
    """(dead letters, segments) of one session, once the valid message sent after the bad
    records has its segment: the stream went on past them."""
    names = [T.DEAD_LETTER.name(s), T.SEGMENTS.name(s)]
    async with TopicReader(s, bs, names) as r:
        def segs(rs):
            return [x.value for x in rs if x.topic == names[1] and x.value
                    and x.value["envelope"]["sessionId"] == sid]
        await r.wait_for(lambda rs: any(v["text"].endswith("after the bad ones")
                                        for v in segs(rs)), timeout)
        recs = await r.drain()
    dls = [x.value for x in recs if x.topic == names[0] and x.value
           and (x.value["key"] or b"")[:len(sid)] == sid.encode()]
    return dls, segs(recs)


async def _send_then_valid(s, bs: str, sid: str, bad: list[tuple[bytes, bytes | dict]]) -> None:
    async with AvroProducer(s, bs) as p:
        for key, value in bad:
            if isinstance(value, dict):
                await p.send_raw(T.SESSION_EVENTS.name(s), key, p.registry.encode(
                    "io.mnemoflow.SessionEvent", value))
            else:
                await p.send_raw(T.SESSION_EVENTS.name(s), key, value)
        await p.send(T.SESSION_EVENTS.name(s), "io.mnemoflow.SessionEvent", sid,
                     user_event(sid, 99, "a valid message after the bad ones", T0 + 99))


async def test_an_oversized_text_is_dead_lettered_not_cut(worker) -> None:
    """The observer used to cut the text to 4,000 characters before its size check, so a
    600 kB message was processed truncated and `oversized` never fired."""
    s, bs, sid = worker.settings, worker.bootstrap, "s-big-text"
    text = "Atlas rollout notes. " * (400_000 // 21)
    await _send_then_valid(s, bs, sid, [(sid.encode(), user_event(sid, 1, text))])
    dls, segs = await _outcome(s, bs, sid)
    assert [d["reason"] for d in dls] == ["oversized"]
    assert [v["text"] for v in segs] == ["a valid message after the bad ones"]


async def test_a_text_over_the_old_cap_is_processed_whole(worker) -> None:
    s, bs, sid = worker.settings, worker.bootstrap, "s-long-text"
    text = "We keep the Atlas rollout notes here. " * 300  # 11 kB, under the payload limit
    await _send_then_valid(s, bs, sid, [(sid.encode(), user_event(sid, 1, text))])
    dls, segs = await _outcome(s, bs, sid)
    assert dls == []
    assert segs[0]["text"] == text.strip()


async def test_records_near_a_megabyte_are_dead_lettered_and_the_stream_goes_on(worker) -> None:
    """A 1,000,000-byte value, a 600 kB key and a record whose segment would pass 1 MB
    crashed the observer with MessageSizeTooLargeError; its offset was committed anyway and
    the record was lost without a trace."""
    s, bs, sid = worker.settings, worker.bootstrap, "s-megabyte"
    huge_sid = sid + "-" + "x" * 600_000  # every output is keyed and stamped with it
    bad = [(sid.encode(), os.urandom(1_000_000)),
           (sid.encode() + b"k" * 600_000, user_event(sid, 1, "a message with a huge key")),
           (sid.encode(), user_event(huge_sid, 1, "a message whose outputs are too large"))]
    await _send_then_valid(s, bs, sid, bad)
    dls, segs = await _outcome(s, bs, sid, timeout=90)
    reasons = sorted(d["reason"] for d in dls)
    # the huge key itself is no fault of the record's value: it is processed
    assert "a message with a huge key" in [v["text"] for v in segs]
    # the 600 kB session id: refused up front (invalid) or when its outputs are (oversized)
    assert reasons[0] == "bad-magic" and reasons[1:] in (["invalid"], ["oversized"]), \
        [(d["reason"], d["detail"]) for d in dls]
    assert all(len(d["original"]) + len(d["key"] or b"") < BROKER_MAX for d in dls)


async def test_event_times_out_of_range_are_dead_lettered(worker) -> None:
    """An eventTime of 2**63-1 crashed the gate (`year 292278994 is out of range`)."""
    s, bs, sid = worker.settings, worker.bootstrap, "s-time"
    bad = [(sid.encode(), user_event(sid, 1, "from the end of time", 2**63 - 1)),
           (sid.encode(), user_event(sid, 2, "from before time", -(2**63)))]
    await _send_then_valid(s, bs, sid, bad)
    dls, segs = await _outcome(s, bs, sid)
    assert [d["reason"] for d in dls] == ["invalid", "invalid"]
    assert all("eventTime" in d["detail"] for d in dls)
    assert [v["text"] for v in segs] == ["a valid message after the bad ones"]
