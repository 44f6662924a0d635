"""Batches from DataLoader workers travel in reused shared-memory buffers, and a buffer is never reused while
the training process still holds a view of it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from cubelake.loaders import CubeDataset, PlanSpec, Sampling, Spectral
from cubelake.loaders.shared import SLOTS

from .conftest import expected_window

RAW = Spectral(normalize="none")


def _dataset(synth_lake: dict[str, Any]) -> CubeDataset:
    return CubeDataset(synth_lake["scenes"], sampling=Sampling(size=16, stride=16, labels="none"), spectral=RAW,
                       plan=PlanSpec(seed=2, batch_size=6))


def _cubes(synth_lake: dict[str, Any]) -> dict[str, np.ndarray]:
    return {"scene_a": synth_lake["a"], "scene_b": synth_lake["b"]}


def _segment(image: torch.Tensor) -> int:
    """The shared-memory segment (its inode) a batch arrived in: the mapping of this process that holds it."""
    ptr = image.data_ptr()
    with open("/proc/self/maps") as f:
        for line in f:
            span, _, _, _, inode = line.split()[:5]
            lo, hi = (int(x, 16) for x in span.split("-"))
            if lo <= ptr < hi:
                assert int(inode) != 0, f"batch memory is not a shared segment: {line}"
                return int(inode)
    raise AssertionError("batch memory not found in /proc/self/maps")


def _check(image: torch.Tensor, scenes: list[str], windows: torch.Tensor, cubes: dict[str, np.ndarray]) -> None:
    for img, sid, (r, c, h, w) in zip(image, scenes, windows.tolist(), strict=True):
        np.testing.assert_array_equal(img.numpy(), expected_window(cubes[sid], r, c, h, w))


@pytest.mark.integration
def test_worker_batches_arrive_in_a_few_reused_buffers(synth_lake: dict[str, Any]) -> None:
    ds = _dataset(synth_lake)
    loader = DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=True)
    cubes = _cubes(synth_lake)
    segments, batches = set(), 0
    for _ in range(2):
        for b in loader:  # each batch dropped before the next, as a training loop does
            _check(b["image"], b["scene"], b["window"], cubes)
            segments.add(_segment(b["image"]))
            batches += 1
    assert batches > 4 * SLOTS
    # PyTorch's own path makes a new segment for every batch; here each worker keeps a few
    assert len(segments) <= 2 * SLOTS


@pytest.mark.integration
def test_a_view_kept_past_later_batches_keeps_its_pixels(synth_lake: dict[str, Any]) -> None:
    ds = _dataset(synth_lake)
    loader = DataLoader(ds, batch_size=None, num_workers=2)
    cubes = _cubes(synth_lake)
    kept = []
    for i, b in enumerate(loader):
        if i % 3 == 0:  # a view (not a copy) of the batch, the batch itself dropped
            kept.append((b["image"][1:4], b["scene"][1:4], b["window"][1:4].clone()))
    assert len(kept) >= 4
    for view, scenes, win in kept:  # every later batch was cut while these were held: none into their buffers
        _check(view, scenes, win, cubes)


@pytest.mark.integration
def test_a_collate_fn_that_rebuilds_the_batch_still_gets_correct_batches(synth_lake: dict[str, Any]) -> None:
    ds = _dataset(synth_lake)
    # the rebuilt dict cannot hand its buffer back: the worker runs out of free buffers and falls back to copies
    loader = DataLoader(ds, batch_size=None, num_workers=2, collate_fn=dict)
    cubes = _cubes(synth_lake)
    batches = list(loader)
    assert len(batches) > 2 * SLOTS
    for b in batches:
        _check(b["image"], b["scene"], b["window"], cubes)


@pytest.mark.integration
def test_the_training_process_maps_each_buffer_once_and_unmaps_exited_workers(synth_lake: dict[str, Any]) -> None:
    """Batches after a buffer's first name it instead of passing it again, small tensors travel in the pickle,
    and the buffers of workers that have exited (a DataLoader without persistent workers ends them every
    epoch) are unmapped."""
    from cubelake.loaders import shared

    ds = _dataset(synth_lake)
    loader = DataLoader(ds, batch_size=None, num_workers=2)  # new worker processes each epoch
    cubes = _cubes(synth_lake)
    shared._RECEIVED.clear()
    for _ in range(3):
        for b in loader:
            _check(b["image"], b["scene"], b["window"], cubes)
            assert b["window"].dtype == torch.int64
            with pytest.raises(AssertionError, match="not a shared segment"):
                _segment(b["window"])  # inline: ordinary memory of this process
            assert _segment(b["image"]) > 0
        assert len(shared._RECEIVED) <= 2  # this epoch's two workers; earlier epochs' pools were dropped
        held = sum(len(p.buffers) for p in shared._RECEIVED.values())
        assert held <= 2 * shared.SLOTS
    assert all(p.mapped.sum() > 0 for p in shared._RECEIVED.values())
