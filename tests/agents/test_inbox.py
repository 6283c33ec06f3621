from __future__ import annotations

from mnemoflow.agents.inbox import (
    PendingState,
    apply,
    claim_pages,
    fold,
    meta_from_headers,
    meta_of,
    op_headers,
    split_expired,
)


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


def test_headers_carry_the_fold_metadata_of_every_op_kind() -> None:
    for op in (_op("inject", "i1", _packet("p1", "D", expiry=77)), _op("steer", "s1", _packet("p2")),
               _op("claim", "c", ids=["p1", "p2"]), _op("remove", "r", ids=["p3"]),
               _op("expire", "e", ids=[])):
        assert meta_from_headers(op_headers(op)) == meta_of(op)
    assert meta_from_headers(None) is None and meta_from_headers([("other", b"x")]) is None


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
