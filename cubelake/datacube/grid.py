"""The cube's target grid: given, or derived from the scenes. No I/O (PROJ coordinate transforms only).

A :class:`TargetGrid` is a north-up grid: CRS, affine transform ``(a, b, c, d, e, f)`` with
``b = d = 0`` and ``e < 0``, and a size in pixels. What the user leaves out is derived from the
scenes (:func:`derive_grid`):

* CRS: the CRS most scenes share; on a tie, the UTM zone of the centre of the scenes' lon/lat union.
* resolution: the finest scene pixel size, measured in the target CRS (a scene in another CRS is
  measured as GDAL's suggested warp output does), rounded to 6 significant digits; pixels are square.
* bounds: the union of the scenes' outlines in the target CRS, snapped outwards onto the
  resolution's lattice (multiples of the pixel size), so two cubes with the same CRS and
  resolution are pixel-aligned. Given bounds are kept: their top-left corner is the origin and the
  size is rounded up to whole pixels.

The chunk grid of the cube starts at the grid's top-left corner: every output block the build
warps is exactly one Zarr chunk (the last row and column may be partial).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from affine import Affine

from cubelake.grid import ChunkGrid, Window

from .errors import CubeSettingsError, DatacubeError

__all__ = ["MAX_SIDE", "Affine6", "Bounds", "GridRequest", "SceneExtent", "TargetGrid", "apply", "derive_grid", "edge_pixels",
           "extent_bounds_in", "grid_from_bounds", "kernel_scale", "outline_bounds", "parse_crs", "resolution_in",
           "utm_crs"]

Affine6 = tuple[float, float, float, float, float, float]
Bounds = tuple[float, float, float, float]  # minx, miny, maxx, maxy in the grid's CRS units
#: A side longer than this many pixels is taken for a unit mistake (metres given to a degree CRS ...).
MAX_SIDE = 1_000_000
_DENSIFY = 21  # points per edge when an outline is carried into another CRS (curved edges)


def _sig6(value: float) -> float:
    return float(f"{value:.6g}")


@dataclass(frozen=True, slots=True)
class SceneExtent:
    """Where a scene's pixels lie: its CRS (WKT), affine transform ``(a..f)`` and size ``height × width``."""

    crs_wkt: str
    transform: Affine6
    height: int
    width: int

    @property
    def affine(self) -> Affine:
        return Affine(*self.transform)


@dataclass(frozen=True, slots=True)
class GridRequest:
    """What the user fixed of the target grid (``None``: derive it from the scenes).

    ``crs``: anything PROJ reads (``EPSG:32633``, WKT, PROJ JSON); ``resolution``: pixel size in
    the CRS's units; ``bounds``: ``(minx, miny, maxx, maxy)`` in the CRS's units.
    """

    crs: str | None = None
    resolution: float | None = None
    bounds: Bounds | None = None


@dataclass(frozen=True, slots=True)
class TargetGrid:
    """A north-up grid: CRS (WKT, and its EPSG code when it has one), transform ``(a..f)``, ``height × width``."""

    crs_wkt: str
    transform: Affine6
    height: int
    width: int
    epsg: int | None = None

    @property
    def affine(self) -> Affine:
        return Affine(*self.transform)

    @property
    def res(self) -> tuple[float, float]:
        """Pixel size ``(x, y)``, both positive, in the CRS's units."""
        return self.transform[0], -self.transform[4]

    @property
    def bounds(self) -> Bounds:
        return self.window_bounds(Window(0, 0, self.height, self.width))

    def window_bounds(self, window: Window) -> Bounds:
        """The ``(minx, miny, maxx, maxy)`` a pixel window covers."""
        a, _, c, _, e, f = self.transform
        return (c + a * window.col_off, f + e * window.row_end, c + a * window.col_end, f + e * window.row_off)

    def window_transform(self, window: Window) -> Affine:
        return self.affine @ Affine.translation(window.col_off, window.row_off)

    def chunk_grid(self, chunk: int) -> ChunkGrid:
        return ChunkGrid.square(self.height, self.width, chunk)

    def to_dict(self) -> dict[str, Any]:
        return {"crs_wkt": self.crs_wkt, "epsg": self.epsg, "transform": list(self.transform),
                "height": self.height, "width": self.width}


def parse_crs(value: str, what: str = "--crs") -> Any:
    """A rasterio ``CRS`` from what a user typed; :class:`CubeSettingsError` naming ``what`` if PROJ cannot read it."""
    import rasterio
    from rasterio.crs import CRS
    from rasterio.errors import CRSError

    try:
        with rasterio.Env():  # GDAL's complaint goes to rasterio's logger, not straight to stderr
            crs = CRS.from_user_input(value)
    except (CRSError, ValueError, TypeError) as exc:
        raise CubeSettingsError(f"{what} {value!r}: not a coordinate reference system PROJ can read ({exc}); "
                                "give e.g. EPSG:32633 or a WKT string") from None
    if not (crs.is_projected or crs.is_geographic):
        raise CubeSettingsError(f"{what} {value!r}: neither a projected nor a geographic CRS; give e.g. EPSG:32633")
    return crs


def edge_pixels(height: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """``(cols, rows)`` of points along the four edges of a ``height × width`` pixel rectangle."""
    t = np.linspace(0.0, 1.0, _DENSIFY)
    cols = np.concatenate([t * width, np.full_like(t, width), t[::-1] * width, np.zeros_like(t)])
    rows = np.concatenate([np.zeros_like(t), t * height, np.full_like(t, height), t[::-1] * height])
    return cols, rows


def apply(affine: Affine, cols: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``affine * (cols, rows)`` for arrays of points."""
    a, b, c, d, e, f = affine[:6]
    return a * cols + b * rows + c, d * cols + e * rows + f


def outline_bounds(xs: np.ndarray, ys: np.ndarray, src_wkt: str, dst: Any) -> Bounds | None:
    """The bounds in ``dst`` of the outline ``xs, ys`` in the CRS ``src_wkt``; ``None`` when PROJ cannot carry it."""
    from rasterio.crs import CRS
    from rasterio.warp import transform

    src = CRS.from_wkt(src_wkt)
    if src == dst:
        tx, ty = np.asarray(xs), np.asarray(ys)
    else:
        tx, ty = (np.asarray(v) for v in transform(src, dst, list(xs), list(ys)))
    ok = np.isfinite(tx) & np.isfinite(ty)
    if not ok.all():  # an outline PROJ cannot carry whole into the other CRS (far outside its area of use)
        return None
    return float(tx.min()), float(ty.min()), float(tx.max()), float(ty.max())


def extent_bounds_in(extent: SceneExtent, crs: Any) -> Bounds | None:
    """A scene's outline (edges densified) in ``crs``; ``None`` when it cannot be expressed there."""
    cols, rows = edge_pixels(extent.height, extent.width)
    xs, ys = apply(extent.affine, cols, rows)
    return outline_bounds(np.asarray(xs), np.asarray(ys), extent.crs_wkt, crs)


def resolution_in(extent: SceneExtent, crs: Any) -> tuple[float, float]:
    """A scene's pixel size ``(x, y)`` in ``crs`` units: its own in its own CRS, else GDAL's suggested warp output."""
    from rasterio.crs import CRS
    from rasterio.warp import calculate_default_transform

    a, b, _, d, e, _ = extent.transform
    src = CRS.from_wkt(extent.crs_wkt)
    if src == crs:
        return math.hypot(a, d), math.hypot(b, e)
    left, bottom, right, top = _native_bounds(extent)
    tr, _, _ = calculate_default_transform(src, crs, extent.width, extent.height, left=left, bottom=bottom,
                                           right=right, top=top)
    return abs(tr.a), abs(tr.e)


def _native_bounds(extent: SceneExtent) -> Bounds:
    cols, rows = edge_pixels(extent.height, extent.width)
    xs, ys = apply(extent.affine, cols, rows)
    return float(np.min(xs)), float(np.min(ys)), float(np.max(xs)), float(np.max(ys))


def kernel_scale(extent: SceneExtent, grid: TargetGrid) -> tuple[float, float]:
    """GDAL's ``XSCALE``/``YSCALE`` for warping ``extent`` onto ``grid``: target pixels per scene pixel.

    Fixed per scene (GDAL otherwise estimates it per warped chunk, so blocks and a whole-scene warp
    would weigh a downsampling kernel differently); 6 significant digits.
    """
    from rasterio.crs import CRS

    sx, sy = resolution_in(extent, CRS.from_wkt(grid.crs_wkt))
    rx, ry = grid.res
    return _sig6(sx / rx), _sig6(sy / ry)


def utm_crs(lon: float, lat: float) -> Any:
    """The WGS 84 / UTM zone CRS holding a longitude/latitude (the Norway/Svalbard exceptions are ignored)."""
    from rasterio.crs import CRS

    zone = min(60, max(1, math.floor((lon + 180.0) / 6.0) + 1))
    return CRS.from_epsg((32600 if lat >= 0 else 32700) + zone)


def _majority_crs(extents: Sequence[SceneExtent], lonlat: Bounds | None) -> Any:
    from rasterio.crs import CRS

    crss = [CRS.from_wkt(e.crs_wkt) for e in extents]
    keys = [c.to_epsg() or c.to_wkt() for c in crss]
    counts = Counter(keys).most_common()
    tied = [k for k, n in counts if n == counts[0][1]]
    if len(tied) == 1 or lonlat is None:
        return crss[keys.index(tied[0])]
    return utm_crs((lonlat[0] + lonlat[2]) / 2, (lonlat[1] + lonlat[3]) / 2)


def _check_resolution(value: float) -> float:
    if not (math.isfinite(value) and value > 0):
        raise CubeSettingsError(f"--resolution {value!r}: the pixel size must be a positive number (in the CRS's "
                                "units: metres for UTM, degrees for EPSG:4326)")
    return float(value)


def _check_bounds(bounds: Bounds) -> Bounds:
    minx, miny, maxx, maxy = (float(v) for v in bounds)
    if not all(math.isfinite(v) for v in (minx, miny, maxx, maxy)) or minx >= maxx or miny >= maxy:
        raise CubeSettingsError(f"--bounds {list(bounds)}: expected MINX MINY MAXX MAXY in the target CRS with "
                                "MINX < MAXX and MINY < MAXY")
    return minx, miny, maxx, maxy


def _union(bounds: Sequence[Bounds]) -> Bounds:
    return (min(b[0] for b in bounds), min(b[1] for b in bounds), max(b[2] for b in bounds), max(b[3] for b in bounds))


def _snapped(bounds: Bounds, res: float) -> Bounds:
    """``bounds`` grown outwards onto multiples of ``res`` (1e-9 pixel slack for float noise)."""
    minx, miny, maxx, maxy = bounds
    return (math.floor(minx / res + 1e-9) * res, math.floor(miny / res + 1e-9) * res,
            math.ceil(maxx / res - 1e-9) * res, math.ceil(maxy / res - 1e-9) * res)


def grid_from_bounds(crs: Any, bounds: Bounds, res: float) -> TargetGrid:
    """The grid with origin at ``bounds``' top-left corner, ``res`` pixels, covering ``bounds`` (rounded up)."""
    minx, miny, maxx, maxy = bounds
    width = max(1, math.ceil((maxx - minx) / res - 1e-9))
    height = max(1, math.ceil((maxy - miny) / res - 1e-9))
    if width > MAX_SIDE or height > MAX_SIDE:
        raise CubeSettingsError(f"the grid would be {height} x {width} pixels ({res:g} units per pixel over "
                                f"{maxx - minx:g} x {maxy - miny:g} units); give a coarser --resolution or smaller "
                                "--bounds, in the units of the target CRS")
    return TargetGrid(crs.to_wkt(), (res, 0.0, minx, 0.0, -res, maxy), height, width, crs.to_epsg())


def derive_grid(extents: Sequence[SceneExtent], request: GridRequest, lonlat: Bounds | None = None) -> TargetGrid:
    """The target grid: ``request``'s fixed parts, the rest derived from the scenes (see the module docstring).

    ``lonlat``: the scenes' union in longitude/latitude (breaks a tie between CRSs).
    """
    if not extents:
        raise DatacubeError("no scenes to derive a grid from")
    crs = parse_crs(request.crs) if request.crs is not None else _majority_crs(extents, lonlat)
    outlines = [extent_bounds_in(e, crs) for e in extents]
    if request.resolution is not None:
        res = _check_resolution(request.resolution)
    else:
        res = _sig6(min(min(resolution_in(e, crs)) for e in extents))
    if request.bounds is not None:
        return grid_from_bounds(crs, _check_bounds(request.bounds), res)
    if any(b is None for b in outlines):
        raise DatacubeError(f"some scenes cannot be expressed in {crs.to_string()} (outside its area of use); "
                            "choose another --crs or give --bounds")
    return grid_from_bounds(crs, _snapped(_union([b for b in outlines if b is not None]), res), res)
