"""The valid-data footprint of a scene: gathered during the pixel pass, outlined in WGS84.

During the one pixel pass every block marks, on a coarse grid of at most ``max_side`` cells a
side, the cells holding at least one pixel with a valid value in any kept band. After the pass
the coarse mask is outlined (``rasterio.features.shapes``), simplified to at most
``MAX_VERTICES`` vertices, densified so long edges follow the reprojection, and reprojected to
WGS84 (``rasterio.warp.transform_geom``, cut at the antimeridian; a geographic grid past ±180°
is wrapped and split). Coarsening and simplification only ever grow the footprint (the outline
is buffered by the simplification tolerance first: together at most a cell and a half, and never
past the raster's edge), so a spatial query never misses valid pixels.
"""

from __future__ import annotations

import logging
import math
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
import shapely
import shapely.affinity
from affine import Affine
from rasterio.crs import CRS
from rasterio.features import shapes
from rasterio.warp import transform_geom
from shapely.geometry import mapping, shape
from shapely.geometry.base import BaseGeometry

from cubelake.grid import Window

__all__ = ["MAX_VERTICES", "Footprint", "ValidMask", "footprint_from_mask", "geometry_bbox"]

log = logging.getLogger(__name__)

MAX_VERTICES = 2000


class ValidMask:
    """A coarse ``(y, x)`` mask of where a scene has valid pixels; thread-safe ``add``."""

    def __init__(self, height: int, width: int, max_side: int = 1024) -> None:
        self.height, self.width = height, width
        self.factor = max(1, math.ceil(max(height, width) / max_side))
        self.mask = np.zeros((math.ceil(height / self.factor), math.ceil(width / self.factor)), dtype=bool)
        self._lock = threading.Lock()

    def add(self, window: Window, valid: np.ndarray | None) -> None:
        """Mark the valid pixels of ``window``; ``valid`` is its ``(y, x)`` bool mask, ``None`` = all valid."""
        f = self.factor
        r0, r1 = window.row_off // f, (window.row_end - 1) // f + 1
        c0, c1 = window.col_off // f, (window.col_end - 1) // f + 1
        if valid is None:
            coarse = np.ones((r1 - r0, c1 - c0), dtype=bool)
        elif f == 1:
            coarse = valid
        else:
            # reduce over the coarse cells this window touches, wherever the window starts
            rows = np.unique(np.clip(np.arange(r0, r1) * f - window.row_off, 0, None))
            cols = np.unique(np.clip(np.arange(c0, c1) * f - window.col_off, 0, None))
            coarse = np.logical_or.reduceat(np.logical_or.reduceat(valid, rows, axis=0), cols, axis=1)
        with self._lock:
            self.mask[r0:r1, c0:c1] |= coarse

    @property
    def valid_fraction(self) -> float:
        """Share of coarse cells with data (a footprint-area estimate, not a pixel count)."""
        return float(self.mask.mean()) if self.mask.size else 0.0


@dataclass(frozen=True, slots=True)
class Footprint:
    """A scene's valid-data outline: GeoJSON geometry and STAC bbox in WGS84 (degrees)."""

    geometry: dict[str, Any]
    bbox: tuple[float, float, float, float]  # west, south, east, north; west > east across the antimeridian
    native_bbox: tuple[float, float, float, float]  # in the scene CRS
    cell_size: float  # coarse cell side in scene CRS units

    def to_dict(self) -> dict[str, Any]:
        return {"geometry": self.geometry, "bbox": list(self.bbox), "native_bbox": list(self.native_bbox),
                "cell_size": self.cell_size}


def _outline(mask: np.ndarray, transform: Affine) -> BaseGeometry:
    polys = [shape(g) for g, v in shapes(mask.astype(np.uint8), mask=mask, transform=transform, connectivity=8) if v]
    return shapely.union_all(polys)


def _simplified(geom: BaseGeometry, cell: float) -> BaseGeometry:
    """At most ``MAX_VERTICES`` vertices, never losing area: grown by ``tol`` before a ``tol`` simplification."""
    tol = cell / 2
    while True:
        # Douglas-Peucker moves the outline by at most ``tol``; the buffer first moves it ``tol`` out
        out = geom.buffer(tol, join_style="mitre").simplify(tol, preserve_topology=True)
        if shapely.get_num_coordinates(out) <= MAX_VERTICES:
            return shapely.union(out, geom) if not out.contains(geom) else out
        tol *= 2


def _wrap_longitudes(geom: BaseGeometry) -> BaseGeometry:
    """Parts beyond ±180° moved back by 360° (a geographic grid that crosses the antimeridian)."""
    w, _, e, _ = geom.bounds
    if w >= -180.0 and e <= 180.0:
        return geom
    parts = [shapely.intersection(geom, shapely.box(-180.0, -90.0, 180.0, 90.0))]
    if e > 180.0:
        parts.append(shapely.affinity.translate(shapely.intersection(geom, shapely.box(180.0, -90.0, 540.0, 90.0)), -360.0))
    if w < -180.0:
        parts.append(shapely.affinity.translate(shapely.intersection(geom, shapely.box(-540.0, -90.0, -180.0, 90.0)), 360.0))
    polys = [p for part in parts for p in getattr(part, "geoms", [part]) if p.geom_type == "Polygon" and not p.is_empty]
    return shapely.MultiPolygon(polys) if len(polys) > 1 else polys[0]


def geometry_bbox(geom: dict[str, Any]) -> tuple[float, float, float, float]:
    """STAC bbox of a WGS84 GeoJSON geometry; across the antimeridian west > east."""
    g = shape(geom)
    parts = list(getattr(g, "geoms", [g]))
    bounds = [p.bounds for p in parts]
    south = min(b[1] for b in bounds)
    north = max(b[3] for b in bounds)
    east_side = [b for b in bounds if b[2] >= 180.0 - 1e-9 and b[0] > 0]
    west_side = [b for b in bounds if b[0] <= -180.0 + 1e-9 and b[2] < 0]
    if east_side and west_side:
        west = min(b[0] for b in bounds if b[0] > 0)
        east = max(b[2] for b in bounds if b[2] < 0)
        return (west, south, east, north)
    return (min(b[0] for b in bounds), south, max(b[2] for b in bounds), north)


def footprint_from_mask(vm: ValidMask, transform: tuple[float, ...] | None, crs_wkt: str | None) -> Footprint | None:
    """The WGS84 footprint of a georeferenced scene; ``None`` without CRS/transform or valid pixels."""
    if transform is None or not crs_wkt or not vm.mask.any():
        return None
    t = Affine(*transform[:6]) @ Affine.scale(vm.factor)
    cell = math.hypot(t.a, t.d)
    native = _outline(vm.mask, t)
    # clip to the raster: the last coarse row/column may reach past the edge
    full = Affine(*transform[:6])
    raster = shapely.geometry.box(*_bounds(full, vm.height, vm.width))
    native = shapely.intersection(native, raster)
    simple = shapely.intersection(_simplified(native, cell), raster)  # the growth never leaves the raster
    dense = shapely.segmentize(simple, max_segment_length=max(cell * 8, simple.length / 400 if simple.length else cell))
    crs = CRS.from_wkt(crs_wkt)
    if crs.is_geographic and crs.to_epsg() == 4326:
        geom = mapping(_wrap_longitudes(dense))
    else:
        geom = transform_geom(crs, "EPSG:4326", mapping(dense), antimeridian_cutting=True, precision=7)
        geom = mapping(_wrap_longitudes(shape(geom)))
    geom = _plain(geom)
    return Footprint(geom, geometry_bbox(geom), tuple(float(v) for v in native.bounds), float(cell))  # type: ignore[arg-type]


def _bounds(t: Affine, height: int, width: int) -> tuple[float, float, float, float]:
    xs, ys = zip(*(t @ (c, r) for r, c in ((0, 0), (0, width), (height, 0), (height, width))), strict=True)
    return min(xs), min(ys), max(xs), max(ys)


def _plain(obj: Any) -> Any:
    """GeoJSON with lists, not tuples (JSON round trips compare equal)."""
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_plain(v) for v in obj]
    return obj
