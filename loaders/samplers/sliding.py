"""Sliding windows: every ``stride`` pixels over the scene's stored chunks."""

from __future__ import annotations

from dataclasses import dataclass

from ..plan import Edge, SampleTable, sliding_windows
from ._base import SceneView, pair

__all__ = ["SlidingSampler"]


@dataclass(frozen=True, slots=True)
class SlidingSampler:
    """Windows of ``size`` every ``stride`` pixels (default: ``size``, no overlap); ``edge="pad"`` adds the
    windows reaching past the raster (padded when cut). Windows on chunks that hold no valid pixel are left out."""

    size: tuple[int, int]
    stride: tuple[int, int]
    edge: Edge = "drop"
    needs_labels: bool = False
    per_epoch: bool = False

    @classmethod
    def of(cls, size: int | tuple[int, int], stride: int | tuple[int, int] | None = None,
           edge: Edge = "drop") -> SlidingSampler:
        return cls(pair(size, "window size"), pair(stride if stride is not None else size, "stride"), edge)

    def windows(self, scene: SceneView, epoch: int, seed: int) -> SampleTable:
        return sliding_windows(scene.index, scene.grid, self.size, self.stride, self.edge, scene.valid_chunks)
