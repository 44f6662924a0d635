"""Random windows: ``count`` per scene at uniform positions, drawn anew every epoch from ``(seed, epoch, scene)``."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..plan import SampleTable, random_windows
from ._base import SceneView, pair

__all__ = ["RandomSampler"]


@dataclass(frozen=True, slots=True)
class RandomSampler:
    """``count`` windows of ``size`` per scene and epoch; those on chunks with no valid pixel are left out."""

    size: tuple[int, int]
    count: int
    needs_labels: bool = False
    per_epoch: bool = True

    @classmethod
    def of(cls, size: int | tuple[int, int], count: int) -> RandomSampler:
        if count < 0:
            raise ValueError(f"count is windows per scene (>= 0), got {count}")
        return cls(pair(size, "window size"), int(count))

    def windows(self, scene: SceneView, epoch: int, seed: int) -> SampleTable:
        rng = np.random.default_rng([seed, epoch, scene.index, 1])
        return random_windows(scene.index, scene.grid, self.size, self.count, rng, scene.valid_chunks)
