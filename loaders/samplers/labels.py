"""Label-centred windows: one per pixel whose class is not ``ignore_label``."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..plan import Edge, SampleTable, label_windows
from ._base import SceneView, pair

__all__ = ["LabelSampler"]


@dataclass(frozen=True, slots=True)
class LabelSampler:
    """A window of ``size`` centred on each labelled pixel (odd size: the pixel is the centre); the
    sample's label is the pixel's class. ``edge="drop"`` leaves out windows reaching past the raster."""

    size: tuple[int, int]
    ignore_label: int = 0
    edge: Edge = "pad"
    needs_labels: bool = True
    per_epoch: bool = False

    @classmethod
    def of(cls, size: int | tuple[int, int], ignore_label: int = 0, edge: Edge = "pad") -> LabelSampler:
        return cls(pair(size, "window size"), int(ignore_label), edge)

    def windows(self, scene: SceneView, epoch: int, seed: int) -> SampleTable:
        lab = scene.labels
        if lab is None:
            raise ValueError(f"scene {scene.index} has no label raster; label sampling needs one")
        r, c = np.nonzero(lab != self.ignore_label)
        return label_windows(scene.index, scene.grid, self.size, r, c, lab[r, c], self.edge)
