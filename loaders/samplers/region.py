"""An area of interest as pixels of each scene: which chunks meet it, and which windows lie in it. Pure, no I/O.

The catalog finds the scenes whose footprint meets a query's geometry; this module limits each scene's
windows to the geometry itself, so an epoch over a small area reads only the chunks that meet it. The
area (WGS84 lon/lat) is densified, projected to the scene's CRS with pyproj and taken to pixel
coordinates through the inverse affine transform; chunk and window tests are shapely predicates on
those pixel polygons.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

import numpy as np
import shapely
from pyproj import CRS, Transformer
from shapely.geometry.base import BaseGeometry

from cubelake.grid import ChunkGrid

from ..plan import COL, ROW, SampleTable, windows_in_chunks

__all__ = ["Region", "WindowRule", "region_of", "restrict"]

WindowRule = Literal["center", "intersects", "within"]
_SEGMENT_DEG = 0.01  # the area's edges are densified to ~1 km before projecting (straight in lon/lat is curved in UTM)


@dataclass(frozen=True, slots=True)
class Region:
    """An area in one scene's pixels: ``shape`` in ``(col, row)`` pixel coordinates, ``chunks`` ``(ny, nx)``
    bool = the chunks whose pixels meet it."""

    shape: BaseGeometry
    chunks: np.ndarray

    @property
    def n_chunks(self) -> int:
        return int(self.chunks.sum())


@lru_cache(maxsize=64)
def _to_scene(crs_wkt: str) -> Transformer:
    return Transformer.from_crs(CRS.from_epsg(4326), CRS.from_user_input(crs_wkt), always_xy=True)


def region_of(area: BaseGeometry, grid: ChunkGrid, crs_wkt: str,
              transform: tuple[float, float, float, float, float, float]) -> Region:
    """``area`` (WGS84 lon/lat) in the pixels of a scene with this grid, CRS and affine transform (a..f)."""
    if not area.is_valid:  # before densifying: segmentize turns a self-crossing ring into one of its parts
        area = shapely.make_valid(area)
    dense = shapely.segmentize(area, _SEGMENT_DEG)
    to_scene = _to_scene(crs_wkt)
    a, b, c, d, e, f = transform
    inv = np.linalg.inv(np.array([[a, b], [d, e]], float))  # (col, row) = inv @ (x - c, y - f)

    def to_pixels(xy: np.ndarray) -> np.ndarray:
        x, y = to_scene.transform(xy[:, 0], xy[:, 1])
        return np.column_stack([np.asarray(x) - c, np.asarray(y) - f]) @ inv.T

    px = shapely.transform(dense, to_pixels)
    if not px.is_valid:
        px = shapely.make_valid(px)
    cy, cx = np.meshgrid(np.arange(grid.n_rows), np.arange(grid.n_cols), indexing="ij")
    boxes = shapely.box(cx * grid.chunk_x, cy * grid.chunk_y, np.minimum((cx + 1) * grid.chunk_x, grid.width),
                        np.minimum((cy + 1) * grid.chunk_y, grid.height))
    shapely.prepare(px)
    return Region(px, np.asarray(shapely.intersects(px, boxes), bool).reshape(grid.n_rows, grid.n_cols))


def restrict(table: SampleTable, grid: ChunkGrid, region: Region, rule: WindowRule = "center") -> SampleTable:
    """The windows of ``table`` (one scene) in ``region``, reading only chunks that meet it.

    ``rule``: ``"center"`` (the centre pixel's centre lies in the area), ``"intersects"`` (any part of the
    window) or ``"within"`` (the whole window). Whatever the rule, a window that needs a chunk not meeting
    the area is left out, so the chunks an epoch reads are exactly among :attr:`Region.chunks`.
    """
    if rule not in ("center", "intersects", "within"):
        raise ValueError(f"window rule must be 'center', 'intersects' or 'within', got {rule!r}")
    if len(table) == 0:
        return table
    h, w = table.size
    r, c = table.rows[:, ROW], table.rows[:, COL]
    if rule == "center":
        geoms = shapely.points(c + w // 2 + 0.5, r + h // 2 + 0.5)
        inside = shapely.contains_properly(region.shape, geoms) | shapely.touches(region.shape, geoms)
    else:
        geoms = shapely.box(c, r, c + w, r + h)
        inside = (shapely.intersects if rule == "intersects" else shapely.covers)(region.shape, geoms)
    keep = np.asarray(inside, bool) & windows_in_chunks(grid, table.rows, (h, w), region.chunks, every=True)
    return table.take(np.flatnonzero(keep))


