"""A budget that holds just what each batch needs still decodes each chunk once: prefetch leaves room for the
chunks a batch first needs, and when something must go it is the chunk needed last."""

from __future__ import annotations

from typing import Any

import pytest

from cubelake.loaders import CubeDataset, PlanSpec, ReaderConfig, Sampling, Spectral
from cubelake.loaders.plan import EpochPlan

from .test_dataset import check_values

CHUNK = 24 * 64 * 64 * 2  # the synth lake's decoded chunk (int16)


def batch_residency(plan: EpochPlan, batch: int) -> int:
    """The most chunks one batch keeps resident: those first used before its end and last used from its start."""
    n = len(plan)
    return max(int(((plan.first_use < min(lo + batch, n)) & (plan.last_use >= lo)).sum()) for lo in range(0, n, batch))


@pytest.mark.parametrize("threads", [1, 2])
def test_random_windows_with_a_budget_of_one_batch_s_chunks_decode_each_chunk_once(
        synth_lake: dict[str, Any], threads: int) -> None:
    def dataset(budget_chunks: int) -> CubeDataset:
        return CubeDataset(synth_lake["scenes"], sampling=Sampling(mode="random", size=16, count=600, labels="none"),
                           spectral=Spectral(normalize="none"), plan=PlanSpec(seed=3, batch_size=32, chunks_per_round=8),
                           reader=ReaderConfig(cache_bytes=budget_chunks * CHUNK, threads=threads), prefetch=8)

    need = batch_residency(dataset(100).plan(0), 32)
    ds = dataset(need)
    batches = list(ds)
    check_values(batches, {"scene_a": synth_lake["a"], "scene_b": synth_lake["b"]})
    m = ds.metrics()
    chunks = ds.plan(0).chunks.shape[0]  # one of them, all nodata, has no stored bytes and is no decode
    assert m.chunks_decoded - m.redecodes >= chunks - 1
    # prefetching 8 chunks ahead into a full budget, then evicting the least recently used, decoded 40 % again
    assert m.redecodes <= 0.05 * chunks, f"{m.chunks_decoded} decodes for {chunks} chunks (budget {need})"
