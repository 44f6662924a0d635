"""A budget that holds just what each batch needs still decodes each chunk once: prefetch leaves room for the
chunks a batch first needs, and when something must go it is the chunk needed last."""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np
import pytest

from cubelake.loaders import CubeDataset, LoaderMetrics, PlanSpec, ReaderConfig, Sampling, Spectral
from cubelake.loaders.buffers import root
from cubelake.loaders.feed import ChunkFeed
from cubelake.loaders.plan import EpochPlan
from cubelake.loaders.reader import ChunkReader
from cubelake.loaders.sources import open_sources

from .test_dataset import check_values

CHUNK = 24 * 64 * 64 * 2  # the synth lake's decoded chunk (int16)


@pytest.mark.parametrize("threads", [1, 2])
def test_random_windows_with_a_budget_of_one_batch_s_chunks_decode_each_chunk_once(
        synth_lake: dict[str, Any], threads: int) -> None:
    def dataset(budget_chunks: int) -> CubeDataset:
        return CubeDataset(synth_lake["scenes"], sampling=Sampling(mode="random", size=16, count=600, labels="none"),
                           spectral=Spectral(normalize="none"), plan=PlanSpec(seed=3, batch_size=32, chunks_per_round=8),
                           reader=ReaderConfig(cache_bytes=budget_chunks * CHUNK, threads=threads), prefetch=8)

    need = max(batch_residency(dataset(100).plan(0), 32))
    ds = dataset(need)
    batches = list(ds)
    check_values(batches, {"scene_a": synth_lake["a"], "scene_b": synth_lake["b"]})
    m = ds.metrics()
    chunks = ds.plan(0).chunks.shape[0]  # one of them, all nodata, has no stored bytes and is no decode
    assert m.chunks_decoded - m.redecodes >= chunks - 1
    # prefetching 8 chunks ahead into a full budget, then evicting the least recently used, decoded 40 % again
    assert m.redecodes <= 0.05 * chunks, f"{m.chunks_decoded} decodes for {chunks} chunks (budget {need})"


def batch_residency(plan: EpochPlan, batch: int) -> list[int]:
    """Per batch, the chunks it keeps resident: those first used before its end and last used from its start."""
    n = len(plan)
    return [int(((plan.first_use < min(lo + batch, n)) & (plan.last_use >= lo)).sum()) for lo in range(0, n, batch)]


class _Asked(ChunkReader):
    """A reader that remembers every chunk asked of it."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.asked: list[tuple[int, int]] = []

    def request(self, keys: Any, due: Any = None) -> None:
        self.asked.extend(keys)
        super().request(keys, due)


def test_prefetch_takes_the_room_the_plan_leaves_and_never_more(synth_lake: dict[str, Any]) -> None:
    """Sliding windows, a budget of 3 chunks more than the most any batch holds, prefetch as deep as the epoch.
    Before the first batch the feed asks for that batch's chunks, then for chunks ahead while they fit in the
    budget, and never more. The chunks one call had taken did not count against the budget, so a depth beyond
    it overfilled the budget (the reader then evicts chunks still needed, to decode them again); and room for
    the most chunks a batch first needs, kept back always, left none to prefetch into here. An epoch with that
    budget, and with just the most chunks any batch holds, decodes each chunk once."""
    scene = synth_lake["scenes"][1]  # scene b: no nodata, every chunk stored

    def dataset(budget_chunks: int) -> CubeDataset:
        return CubeDataset([scene], sampling=Sampling(mode="sliding", size=16, stride=16, labels="none"),
                           spectral=Spectral(normalize="none"), plan=PlanSpec(seed=5, batch_size=32, chunks_per_round=4),
                           reader=ReaderConfig(cache_bytes=budget_chunks * CHUNK, threads=1),
                           prefetch=10_000, prefer=("zarr",))

    plan = dataset(1).plan(0)
    held = batch_residency(plan, 32)
    budget = max(held) + 3
    src = open_sources([scene], prefer=("zarr",))[0]
    reader = _Asked([src], ReaderConfig(cache_bytes=budget * CHUNK, threads=1), LoaderMetrics())
    try:
        ChunkFeed(plan, 32, 0, CHUNK, 1, 0).before(0, 32, reader, len(plan.chunks))
    finally:
        reader.close()
    assert len(set(reader.asked)) == len(reader.asked)
    assert held[0] < len(reader.asked) <= budget, f"asked {len(reader.asked)}: batch 0 holds {held[0]}, budget {budget}"
    for chunks in (budget, max(held)):  # with room to spare, and just the most any batch holds
        ds = dataset(chunks)
        check_values(list(ds), {"scene_b": synth_lake["b"]})
        m = ds.metrics()
        assert (m.redecodes, m.chunks_decoded) == (0, plan.chunks.shape[0]), f"budget {chunks} chunks"


def test_an_evicted_chunk_s_memory_is_decoded_into_again_and_holds_the_new_chunk(synth_lake: dict[str, Any]) -> None:
    """Once the budget is full, a decode reuses an evicted chunk's buffer instead of new memory (whose
    page faults cost as much as the decode on the benchmark VM), and the reused buffer holds exactly the
    new chunk's pixels. The reuse check counted one reference too many and never passed before."""
    src = open_sources([synth_lake["scenes"][1]], prefer=("zarr",))[0]  # scene b: no nodata, every chunk stored
    reader = ChunkReader([src], ReaderConfig(cache_bytes=src.chunk_nbytes, threads=1), LoaderMetrics())
    cube = synth_lake["b"]
    roots: list[weakref.ref[np.ndarray]] = []
    try:
        for chunk in range(6):
            key = (0, chunk)
            reader.request([key])
            arr = reader.get(key)
            assert arr is not None
            cy, cx = divmod(chunk, src.grid.n_cols)
            want = cube[:, cy * 64:(cy + 1) * 64, cx * 64:(cx + 1) * 64]
            np.testing.assert_array_equal(arr[:, :want.shape[1], :want.shape[2]], want)
            roots.append(weakref.ref(root(arr)))
            del arr
            reader.release(key)
    finally:
        reader.close()
    # chunk 1's decode evicts chunk 0; chunk 2 is decoded into chunk 0's buffer, chunk 3 into chunk 1's, ...
    alive = [r() for r in roots]
    assert alive[2] is not None
    assert alive[2] is alive[0]
    assert len({id(a) for a in alive if a is not None}) <= 3, "each decode took new memory"


def test_a_view_of_an_evicted_chunk_keeps_its_pixels_until_it_is_dropped(synth_lake: dict[str, Any]) -> None:
    """A caller holding a slice of a chunk the cache has since evicted still reads that chunk's pixels: its buffer
    is not decoded into again while any view of it lives (NumPy makes a view of a view refer to the buffer, not
    to the chunk array, so a check on the chunk array alone let the buffer be overwritten under the slice)."""
    src = open_sources([synth_lake["scenes"][1]], prefer=("zarr",))[0]
    reader = ChunkReader([src], ReaderConfig(cache_bytes=src.chunk_nbytes, threads=1), LoaderMetrics())
    cube = synth_lake["b"]

    def load(chunk: int) -> np.ndarray:
        reader.request([(0, chunk)])
        arr = reader.get((0, chunk))
        assert arr is not None
        reader.release((0, chunk))
        return arr

    try:
        held = load(0)[2:5]  # a view of chunk 0; the chunk array itself is dropped
        want = cube[2:5, :64, :64].copy()
        for chunk in range(1, 6):  # each decode evicts the one before
            load(chunk)
            np.testing.assert_array_equal(held[:, :want.shape[1], :want.shape[2]], want)
        buf = weakref.ref(root(held))
        del held
        roots = {id(root(load(chunk))) for chunk in range(6, 10)}
        assert buf() is not None
        assert id(buf()) in roots, "the dropped view's buffer was not reused"
    finally:
        reader.close()


def test_chunk_buffers_reuse_returned_memory_and_ignore_foreign_arrays() -> None:
    from cubelake.loaders.buffers import ChunkBuffers

    pool = ChunkBuffers(keep=4)
    n = 3 * 2**20
    for _ in range(50):  # decode, evict, decode again: one block, however many rounds
        a = pool.take(n).view(np.uint16).reshape(96, 128, 128)
        a[:] = 7
        pool.give(a)
        del a
    assert pool.allocated == 5 * n  # one block of 16 MiB // 3 MiB buffers
    foreign = np.zeros(n, np.uint8)
    pool.give(foreign)  # NumPy's own memory: never handed out by the pool
    taken = [pool.take(n) for _ in range(6)]
    assert all(t is not foreign and t.base is not foreign for t in taken)
    assert len({id(t) for t in taken}) == 6
    assert pool.allocated == 10 * n
    odd = pool.take(40 * 2**20)  # a chunk larger than a block gets a block of its own
    assert odd.nbytes == 40 * 2**20
    assert odd.flags.c_contiguous
    assert odd.flags.writeable
