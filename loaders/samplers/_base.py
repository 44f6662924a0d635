"""The sampler protocol: what a sampling strategy sees of a scene and what it gives back. Pure, no I/O.

A sampler turns one scene into windows of one size (a :class:`~cubelake.loaders.plan.SampleTable`);
the dataset concatenates the scenes' tables and hands them to the planner. A strategy is a small class
behind :class:`Sampler`; a new one is a new module here, not an edit of the dataset.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from cubelake.grid import ChunkGrid

from ..plan import SampleTable

__all__ = ["Sampler", "SceneView", "pair"]


@dataclass(frozen=True, slots=True)
class SceneView:
    """One scene as a sampler sees it: its position in the dataset, its chunk grid, which chunks are stored
    (``(ny, nx)`` bool, ``None`` = all), its label raster ``(y, x)`` when the sampler needs one."""

    index: int
    grid: ChunkGrid
    valid_chunks: np.ndarray | None = None
    labels: np.ndarray | None = None


@runtime_checkable
class Sampler(Protocol):
    """A sampling strategy: every scene's windows of one ``size`` ``(h, w)`` for an epoch.

    ``needs_labels``: the dataset must load the scenes' label rasters (``SceneView.labels``).
    ``per_epoch``: the windows change with the epoch (drawn from ``seed`` and ``epoch``); when
    false the table is built once and reused.
    """

    @property
    def size(self) -> tuple[int, int]: ...

    @property
    def needs_labels(self) -> bool: ...

    @property
    def per_epoch(self) -> bool: ...

    def windows(self, scene: SceneView, epoch: int, seed: int) -> SampleTable: ...


def pair(v: int | tuple[int, int] | list[int], what: str) -> tuple[int, int]:
    """``(h, w)`` from an int or a pair, checked positive."""
    out = (int(v), int(v)) if isinstance(v, int | np.integer) else (int(v[0]), int(v[1]))
    if min(out) <= 0:
        raise ValueError(f"{what} must be positive, got {v}")
    return out
