from __future__ import annotations

from collections.abc import Callable

from mnemoflow.agents.inbox import (
    FOLD_HEADER,
    OpMeta,
    PendingState,
    _tag,
    apply,
    claim_pages,
    fold,
    meta_from_headers,
    meta_of,
    op_headers,
    op_record,
    split_expired,
)
from mnemoflow.schemas.codec import default_registry


def _packet(pid: str, digest: str | None = None, expiry: int = 10_000) -> dict:
    return {"packetId": pid, "exactDigest": digest or f"d-{pid}", "expiry": expiry,
            "contextCursor": 1, "items": [], "strength": "soft_hint"}


def _op(op: str, op_id: str, packet: dict | None = None, ids: list[str] | None = None) -> dict:
    return {"opId": op_id, "op": op, "sessionId": "s", "eventTime": 0, "packet": packet,
            "packetIds": ids or ([packet["packetId"]] if packet else []), "claimer": None}


def test_pending_is_the_fold_fifo_and_idempotent() -> None:
    ops = [(0, _op("inject", "i1", _packet("p1"))), (1, _op("inject", "i2", _packet("p2"))),
           (2, _op("inject", "i1", _packet("p1")))]  # a re-emitted op
    st = fold(ops)
    assert st.pending_ids() == ["p1", "p2"]
    again = fold(ops + ops)
    assert again.pending_ids() == st.pending_ids() and again.applied == st.applied


def test_first_claim_in_log_order_wins() -> None:
    st = fold([(0, _op("inject", "i1", _packet("p1"))), (1, _op("inject", "i2", _packet("p2"))),
               (2, _op("claim", "cA", ids=["p1", "p2"])), (3, _op("claim", "cB", ids=["p1"]))])
    assert st.pending == () and st.winner("p1") == "cA" and st.winner("p2") == "cA"


def test_claimed_or_visible_digest_is_not_pending_again() -> None:
    st = fold([(0, _op("inject", "i1", _packet("p1", "D"))), (1, _op("claim", "c", ids=["p1"])),
               (2, _op("inject", "i3", _packet("p3", "D")))])
    assert st.pending == () and ("p3", "already-claimed") in st.dropped
    st2 = apply(PendingState(), _op("inject", "i4", _packet("p4", "V")), 0, frozenset({"V"}))
    assert st2.pending == () and ("p4", "already-visible") in st2.dropped


def test_remove_expire_and_expiry_split() -> None:
    st = fold([(0, _op("inject", "i1", _packet("p1", expiry=5))),
               (1, _op("inject", "i2", _packet("p2", expiry=50))),
               (2, _op("inject", "i3", _packet("p3")))])
    live, dead = split_expired(st, 10)
    assert [p["packetId"] for p in dead] == ["p1"] and len(live) == 2
    st = apply(st, _op("expire", "e1", ids=["p1"]))
    st = apply(st, _op("remove", "r1", ids=["p3"]))
    assert st.pending_ids() == ["p2"]
    assert st.winner("p1") is None  # expired is never claimed, so never delivered


def test_steer_is_tracked_until_claimed() -> None:
    st = fold([(0, _op("steer", "s1", _packet("p1")))])
    assert st.steer == {"p1"}
    st = apply(st, _op("claim", "c", ids=["p1"]))
    assert st.steer == set()


def _full_packet(pid: str, digest: str | None = None, expiry: int = 10_000,
                 sid: str = "s") -> dict:
    """A packet the InboxOp schema can encode (the fold-only tests above need less)."""
    item = {"memoryId": f"m-{pid}", "kind": "segment", "text": f"memory {pid}", "scope": "User",
            "owner": "u", "score": 1.0, "sourceSeq": 1, "sourceSessionId": "old",
            "provenance": "old#1.0", "eventTime": 0, "digest": f"i-{pid}", "tiers": ["lexical"]}
    return {"packetSchemaVersion": 1, "packetId": pid, "sessionId": sid, "requestId": f"r-{pid}",
            "contextCursor": 1, "retrievalVersion": "lexical/gen1", "triggerReason": "test",
            "strength": "soft_hint", "items": [item], "exactDigest": digest or f"d-{pid}",
            "semanticDigest": "s", "sourceSeqs": [1], "budgetBytes": 16, "createdAt": 0,
            "expiry": expiry}


def _full_op(op: str, op_id: str, packet: dict | None = None, ids: list[str] | None = None,
             sid: str = "s") -> dict:
    return {**_op(op, op_id, packet, ids), "sessionId": sid, "reason": None, "authorisedBy": None}


def _every_kind() -> list[dict]:
    return [_full_op("inject", "i1", _full_packet("p1", "D", expiry=77)),
            _full_op("steer", "s1", _full_packet("p2")), _full_op("claim", "c", ids=["p1", "p2"]),
            _full_op("remove", "r", ids=["p3"]), _full_op("expire", "e", ids=[]),
            _full_op("claim", "c8", ids=[f"p{i}" for i in range(8)]),
            _full_op("inject", "i" * 70, _full_packet("p" * 70), sid="s" * 200)]  # long strings


def test_headers_carry_the_fold_metadata_of_every_op_kind() -> None:
    for op in _every_kind():
        value, headers = op_record(op)
        assert meta_from_headers(headers, value) == meta_of(op), op["op"]
        assert op_headers(op) == headers  # a writer that encodes the value itself
    value, headers = op_record(_every_kind()[0])
    assert meta_from_headers(None, value) is None and meta_from_headers(headers, None) is None
    assert meta_from_headers([("other", b"x")], value) is None


def test_a_claim_naming_many_packets_is_decoded_not_checked_id_by_id() -> None:
    op = _full_op("claim", "c", ids=[f"p{i}" for i in range(9)])
    assert meta_from_headers(op_record(op)[1], op_record(op)[0]) is None


# -- a header that disagrees with its body ------------------------------------------------------

_REG = default_registry()


def _body(value: bytes) -> OpMeta:
    return meta_of(_REG.decode(value, "io.mnemoflow.InboxOp")[1])


def _fold_records(records: list[tuple[bytes, list[tuple[str, bytes]]]],
                  read: Callable[[list[tuple[str, bytes]], bytes], OpMeta | None]) -> PendingState:
    """The host's fold of a partition: the header when `read` believes it, else the body."""
    st = PendingState()
    for off, (value, headers) in enumerate(records):
        m = read(headers, value) or _body(value)
        st.apply_meta(m, (lambda v=value: _REG.decode(v)[1]["packet"]) if m.packet_id else None,
                      off)
    return st


def _fields(headers: list[tuple[str, bytes]]) -> list[str]:
    return headers[0][1].decode().split("\x1f")[:-1]  # without the tag


def _tagged(fields: list[str], value: bytes) -> list[tuple[str, bytes]]:
    """What a writer that computes the tag right over fields it got wrong would write."""
    text = "\x1f".join(fields).encode()
    return [(FOLD_HEADER, text + b"\x1f" + _tag(text, value))]


def _swap(f: list[str]) -> list[str]:
    return [f[1], f[0], *f[2:]]


# each: what one buggy or foreign writer puts in the header of a record
BAD_HEADERS: dict[str, Callable[[list[tuple[str, bytes]], bytes], list[tuple[str, bytes]]]] = {
    "kind and op id swapped, tagged": lambda h, v: _tagged(_swap(_fields(h)), v),
    "kind and op id swapped, old tag kept": lambda h, v: [
        (FOLD_HEADER, "\x1f".join(_swap(_fields(h))).encode() + h[0][1][-25:])],
    "kind and op id swapped, untagged mf-fold": lambda h, v: [
        ("mf-fold", "\x1f".join(_swap(_fields(h))).encode())],
    "kind and op id swapped, untagged, under the tagged key": lambda h, v: [
        (FOLD_HEADER, "\x1f".join(_swap(_fields(h))).encode())],
    "truncated": lambda h, v: [(FOLD_HEADER, h[0][1][:len(h[0][1]) // 2])],
    "packet ids cut off, tagged": lambda h, v: _tagged(_fields(h)[:6], v),
    "kind says inject": lambda h, v: _tagged(["inject", *_fields(h)[1:]], v),
    "kind says claim": lambda h, v: _tagged(["claim", *_fields(h)[1:]], v),
    "another op id": lambda h, v: _tagged([_fields(h)[0], "op-x", *_fields(h)[2:]], v),
    "another session": lambda h, v: _tagged([*_fields(h)[:2], "s-other", *_fields(h)[3:]], v),
    "another packet id": lambda h, v: _tagged(
        [*_fields(h)[:3], "p9" if _fields(h)[3] else "", *_fields(h)[4:6], "p9"], v),
    "expiry and digest changed, old tag kept": lambda h, v: [(FOLD_HEADER, "\x1f".join(
        [*_fields(h)[:4], "X", "1", *_fields(h)[6:]]).encode() + h[0][1][-25:])],
}


def _log() -> list[dict]:
    """Two claimers and a late re-inject: which claim op names which packet decides it all."""
    return [_full_op("inject", "i1", _full_packet("p1")), _full_op("inject", "i2", _full_packet("p2")),
            _full_op("steer", "s3", _full_packet("p3")), _full_op("claim", "cA", ids=["p1"]),
            _full_op("claim", "cB", ids=["p1", "p2"]), _full_op("expire", "e", ids=["p3"]),
            _full_op("inject", "i4", _full_packet("p4", digest="d-p1")),  # p1's digest: claimed
            _full_op("inject", "i5", _full_packet("p5", expiry=5)),
            _full_op("remove", "r", ids=["p5"]), _full_op("inject", "i6", _full_packet("p6"))]


def _naive(headers: list[tuple[str, bytes]], value: bytes) -> OpMeta | None:
    """A reader that believes any header's fields (what the fold must never be)."""
    for key, raw in headers:
        if key in (FOLD_HEADER, "mf-fold"):
            f = raw.decode(errors="replace").split("\x1f")
            try:
                return OpMeta(f[1], f[0], f[2], f[3] or None, f[4] or None, int(f[5]),
                              tuple(f[6:]))
            except (IndexError, ValueError):
                return None
    return None


def test_a_header_that_disagrees_with_its_body_does_not_change_the_fold() -> None:
    """Swapped, truncated or lying headers on every record: the fold equals the fold of the
    bodies alone, field by field (and a reader that believed them would differ)."""
    good = [op_record(op) for op in _log()]
    body_only = _view(_fold_records(good, lambda h, v: None))
    assert _view(_fold_records(good, meta_from_headers)) == body_only
    for name, bad in BAD_HEADERS.items():
        records = [(v, bad(h, v)) for v, h in good]
        assert _view(_fold_records(records, meta_from_headers)) == body_only, name
        assert any(_naive(h, v) != _body(v) for v, h in records), name  # it does lie
        for v, h in records:  # believed only where the bad header happens to say the truth
            assert meta_from_headers(h, v) in (None, _body(v)), (name, _body(v))
    believed = [(v, BAD_HEADERS["kind and op id swapped, tagged"](h, v)) for v, h in good]
    assert _view(_fold_records(believed, _naive)) != body_only  # the test has teeth


def test_a_swapped_claim_header_cannot_give_one_packet_to_two_claimers() -> None:
    """The reported case: host A's claim op carries kind and op id swapped; the fold must
    still give the packet to A, so host B's claim finds nothing pending."""
    inject = op_record(_full_op("inject", "i1", _full_packet("p1")))
    value, headers = op_record(_full_op("claim", "claim-by-A", ids=["p1"]))
    for bad in (BAD_HEADERS["kind and op id swapped, untagged mf-fold"],
                BAD_HEADERS["kind and op id swapped, tagged"]):
        st = _fold_records([inject, (value, bad(headers, value))], meta_from_headers)
        assert st.pending_ids() == [] and st.winner("p1") == "claim-by-A"
        st.apply_meta(meta_of(_full_op("claim", "claim-by-B", ids=["p1"])), None, 2)
        assert st.winner("p1") == "claim-by-A"


def test_a_header_of_another_record_or_of_older_code_is_not_believed() -> None:
    (v1, h1), (v2, h2) = (op_record(op) for op in _log()[:2])
    assert meta_from_headers(h2, v1) is None and meta_from_headers(h1, v2) is None
    assert meta_from_headers(h1, v1[:-1]) is None  # the value truncated
    untagged = "\x1f".join(_fields(h1)).encode()  # true fields, but no tag: older code
    assert meta_from_headers([("mf-fold", untagged)], v1) is None
    assert meta_from_headers([(FOLD_HEADER, untagged)], v1) is None


def test_a_rebuild_decodes_only_the_packets_still_pending() -> None:
    loads: list[str] = []

    def loader(pid: str):
        return lambda: loads.append(pid) or _packet(pid)

    st = PendingState()
    for off, op in enumerate([_op("inject", "i1", _packet("p1")), _op("inject", "i2", _packet("p2")),
                              _op("claim", "c", ids=["p1"])]):
        st.apply_meta(meta_of(op), loader(op["packetIds"][0]), off)
    assert loads == [] and st.pending_ids() == ["p2"]
    assert [p["packetId"] for p in st.pending] == ["p2"] and loads == ["p2"]
    assert st.pending and loads == ["p2"]  # loaded once, then kept


def test_claims_are_paged_fifo() -> None:
    ids = [f"p{i}" for i in range(600)]
    pages = claim_pages(ids)
    assert [len(p) for p in pages] == [256, 256, 88] and sum(pages, []) == ids
    assert claim_pages([]) == []


def test_a_packet_whose_body_cannot_be_read_is_dropped_not_blocking() -> None:
    st = PendingState()
    for off, op in enumerate([_op("inject", "i1", _packet("p1")), _op("inject", "i2", _packet("p2"))]):
        st.apply_meta(meta_of(op), (lambda: None) if off == 0 else op["packet"], off)
    live, dead = split_expired(st, 0)
    assert [p["packetId"] for p in live] == ["p2"] and dead == []
    assert ("p1", "undecodable") in st.dropped and st.pending_ids() == ["p2"]


def _random_log(seed: int, n: int) -> list[tuple[int, dict]]:
    """Injects (some re-emitted, some with a repeated digest), steers, claims of what is
    pending, removes and expires, in a seeded random order."""
    import random

    rng = random.Random(seed)
    ops: list[tuple[int, dict]] = []
    live: list[str] = []
    for off in range(n):
        r = rng.random()
        if r < 0.45 or not live:
            k = rng.randrange(off + 1)  # a re-emit or a new packet
            pk = _packet(f"p{k}", digest=f"d{k % 37}", expiry=rng.randrange(1, 10_000))
            ops.append((off, _op("steer" if r < 0.05 else "inject", f"i{k}", pk)))
            live.append(pk["packetId"])
        elif r < 0.85:
            page = rng.sample(live, min(len(live), rng.randrange(1, 4)))
            ops.append((off, _op("claim", f"c{off}", ids=page)))
        else:
            ops.append((off, _op(rng.choice(["remove", "expire"]), f"r{off}",
                                 ids=[rng.choice(live)])))
    return ops


def _fold_meta(ops: list[tuple[int, dict]], st: PendingState | None = None,
               history: int = 16) -> PendingState:
    st = st or PendingState(history=history)
    for off, op in ops:
        st.apply_meta(meta_of(op), _loader(op.get("packet")), off)
    return st


def _loader(packet: dict | None):
    return lambda: packet


def _view(st: PendingState) -> tuple:
    return (st.pending_ids(), [e.meta for e in st.pending_by_id.values()], sorted(st.steer),
            list(st.claimed.items()), list(st.claimed_digests), sorted(st.pending_digests),
            list(st.applied), st.dropped, st.last_offset, [p["packetId"] for p in st.pending])


def test_a_restored_checkpoint_folds_on_exactly_like_the_full_log() -> None:
    """A rebuild from a checkpoint must not change a single decision: restore at many cut
    points (with a history small enough to be trimmed) and fold the rest of the log."""
    for seed in range(5):
        ops = _random_log(seed, 400)
        whole = _fold_meta(ops)
        assert len(whole.claimed) <= 2 * 16 and len(whole.applied) <= 2 * 16  # bounded
        for cut in (0, 1, 57, 200, 399, 400):
            head = _fold_meta(ops[:cut])
            raws = {id(e): repr(e.meta).encode() for e in head.pending_by_id.values()}
            snap = head.snapshot(lambda e, raws=raws: raws[id(e)])
            assert snap is not None
            packets = {repr(e.meta).encode(): e.packet() for e in head.pending_by_id.values()}
            restored = PendingState.from_snapshot(
                "s", snap, lambda raw, packets=packets: (lambda: packets[raw]), history=16)
            assert _view(_fold_meta(ops[cut:], restored)) == _view(whole), (seed, cut)


def test_no_checkpoint_without_the_original_op_bytes() -> None:
    st = fold([(0, _op("inject", "i1", _packet("p1")))])
    assert st.snapshot(lambda e: None) is None
