"""The vector sink's flush: a bounded batch, and nothing lost when embedding fails."""

from __future__ import annotations

import numpy as np

from mnemoflow.projections.vector_tier import VectorSink

from factories import memory_event


class _Index:
    def __init__(self) -> None:
        self.ids: set[str] = set()
        self.revoked: list[str] = []

    async def add(self, rows: list[dict], vectors: np.ndarray) -> None:
        assert len(rows) == len(vectors)
        self.ids.update(r["memory_id"] for r in rows)

    async def revoke(self, mid: str) -> None:
        self.revoked.append(mid)
        self.ids.discard(mid)


class _Embedder:
    """Fails the first `failures` calls, then gives zero vectors."""

    def __init__(self, failures: int = 0, during=None) -> None:
        self.failures, self.calls, self.during = failures, 0, during

    async def embed(self, texts: list[str], timeout: float) -> np.ndarray:
        self.calls += 1
        if self.during is not None:
            self.during()
        if self.calls <= self.failures:
            raise TimeoutError("embedding timed out")
        return np.zeros((len(texts), 4), dtype=np.float32)


async def test_a_failed_flush_keeps_what_it_did_not_write() -> None:
    index, emb = _Index(), _Embedder(failures=1)
    sink = VectorSink(index, emb, batch=2)  # type: ignore[arg-type]
    for i in range(3):
        sink.on_event(memory_event(f"m{i}", ["atlas"]))
    sink.on_event({**memory_event("m2", []), "eventId": "rv", "op": "memory_revoked"})
    try:
        await sink.flush()
    except TimeoutError:
        pass
    assert index.ids == set() and [r["memory_id"] for r in sink.pending] == ["m0", "m1"]
    assert sink.revoked == ["m2"]
    assert await sink.flush() == 2
    assert index.ids == {"m0", "m1"} and index.revoked == ["m2"] and sink.pending == []


async def test_a_flush_writes_only_what_was_buffered_when_it_began() -> None:
    index = _Index()
    sink: VectorSink
    late = iter(range(100, 103))

    def arrive() -> None:  # records keep arriving while the flush embeds
        for i in late:
            sink.on_event(memory_event(f"m{i}", ["atlas"]))
            break

    sink = VectorSink(index, _Embedder(during=arrive), batch=1)  # type: ignore[arg-type]
    sink.on_event(memory_event("m0", ["atlas"]))
    sink.on_event(memory_event("m1", ["atlas"]))
    assert await sink.flush() == 2  # ends although records arrived during it
    assert index.ids == {"m0", "m1"} and [r["memory_id"] for r in sink.pending] == ["m100",
                                                                                   "m101"]


async def test_unprojected_names_the_owners_whose_rows_are_not_written_yet() -> None:
    """The per-owner barrier: a row is unprojected from on_event until its batch is written,
    also while a failed flush keeps it; a row revoked before it was written no longer counts."""
    index = _Index()
    u1, u2, u3 = ("User", "u1"), ("User", "u2"), ("User", "u3")
    sink = VectorSink(index, _Embedder(failures=1), batch=1)  # type: ignore[arg-type]
    sink.on_event(memory_event("a", ["atlas"], owner="u1"))
    sink.on_event(memory_event("b", ["atlas"], owner="u2"))
    sink.on_event(memory_event("c", ["atlas"], owner="u3"))
    assert sink.unprojected({u1}) and sink.unprojected({u2, ("Session", "x")})
    assert not sink.unprojected({("User", "u9")})
    sink.on_event({**memory_event("c", [], owner="u3"), "eventId": "rv", "op": "memory_revoked"})
    assert not sink.unprojected({u3})
    try:
        await sink.flush()
    except TimeoutError:
        pass
    assert sink.unprojected({u1}) and sink.unprojected({u2})  # the failure kept both
    await sink.flush()
    assert index.ids == {"a", "b"} and not sink.unprojected({u1, u2, u3})
