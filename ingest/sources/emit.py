"""NASA EMIT L1B radiance and L2A reflectance granules (NetCDF-4), orthorectified through their GLT.

An EMIT granule holds the cube as a swath ``(downtrack, crosstrack, bands)`` (``radiance`` or
``reflectance``, float32, ``_FillValue`` -9999), the band centres, FWHM and (L2A) the
``good_wavelengths`` flags in the group ``sensor_band_parameters``, and in the group ``location``
the geometry lookup table (GLT): ``glt_x``/``glt_y`` ``(ortho_y, ortho_x)`` give, for every pixel
of the map grid, the 1-based crosstrack/downtrack index of the swath pixel seen there (0: none).
The map grid's ``geotransform`` (GDAL order) and ``spatial_ref`` (WKT) are global attributes.

Reading follows the documented EMIT procedure (EMIT Data Product User Guide; the LP DAAC's
EMIT-Data-Resources ``apply_glt``): nearest neighbour through the GLT, fill (-9999) where the
GLT is 0. It streams: a window of the map grid reads its window of the GLT, then only the
swath rows x columns those GLT entries reach, so memory stays near the window's size whatever
the granule's. Where a window's GLT reaches a swath slab over :data:`SLAB_BUDGET_BYTES` the
window is split (a map window can see a long diagonal stretch of the swath).

Why our own lookup: GDAL's netCDF driver in rasterio's wheels (GDAL 3.10) opens an EMIT granule
as the raw swath (checked on the test granules: ``EMIT_ORTHORECTIFICATION=YES`` gives the
``downtrack x crosstrack`` grid), and a whole-array ``apply_glt`` (the LP DAAC recipe) holds the
full 1.8 GB granule in memory.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from cubelake.errors import SceneReadError, UnsupportedFormatError
from cubelake.grid import Window

from ._base import BandInfo, LockedSource, SceneMetadata, display_name
from .hdf import attr, attr_floats, attr_text, dataset, epsg_of_wkt, iso_utc

__all__ = ["EMIT_PRODUCTS", "SLAB_BUDGET_BYTES", "emit_product", "glt_lookup", "open_emit"]

log = logging.getLogger(__name__)

#: root variable -> (cubelake product tag, what it is)
EMIT_PRODUCTS = {
    "reflectance": ("emit-l2a", "EMIT L2A surface reflectance"),
    "radiance": ("emit-l1b", "EMIT L1B at-sensor radiance"),
}
#: The largest swath slab one read may load (bytes); a window whose GLT reaches more is split.
SLAB_BUDGET_BYTES = 64 * 1024 * 1024
GLT_FILL = 0


def emit_product(h5: Any) -> str | None:
    """The cube variable of an EMIT granule (``reflectance`` / ``radiance``), or ``None`` when the file is
    no EMIT cube granule; raises for an EMIT file cubelake does not read (mask, uncertainty)."""
    instrument = h5.attrs.get("instrument", b"")
    title = h5.attrs.get("title", b"")
    text = " ".join(v.decode(errors="replace") if isinstance(v, bytes) else str(v) for v in (instrument, title))
    if "EMIT" not in text:
        return None
    for name in EMIT_PRODUCTS:
        if name in h5:
            return name
    raise UnsupportedFormatError(
        f"{h5.filename}: an EMIT granule ({title!r}) without a 'reflectance' or 'radiance' cube; cubelake ingests "
        "the L1B RAD and L2A RFL granules (masks and uncertainties are not scenes)")


def _bands(h5: Any, path: str, n: int) -> tuple[BandInfo, ...]:
    product = "EMIT"
    wl_ds = dataset(h5, "sensor_band_parameters/wavelengths", path, product=product, ndim=1)
    fw_ds = dataset(h5, "sensor_band_parameters/fwhm", path, product=product, ndim=1)
    for ds in (wl_ds, fw_ds):
        if ds.shape[0] != n:
            raise SceneReadError(f"{display_name(path)}: '{ds.name.lstrip('/')}' has {ds.shape[0]} values for "
                                 f"{n} bands; the granule is inconsistent")
    wl, fw = np.asarray(wl_ds[()], dtype=float), np.asarray(fw_ds[()], dtype=float)
    good = np.ones(n, dtype=bool)
    if "good_wavelengths" in h5["sensor_band_parameters"]:  # L2A only
        g = dataset(h5, "sensor_band_parameters/good_wavelengths", path, product=product, ndim=1)
        if g.shape[0] != n:
            raise SceneReadError(f"{display_name(path)}: 'sensor_band_parameters/good_wavelengths' has {g.shape[0]} "
                                 f"values for {n} bands")
        good = np.asarray(g[()]) != 0
    return tuple(BandInfo(i + 1, f"band {i + 1}", float(wl[i]), float(fw[i]), not bool(good[i])) for i in range(n))


def _grid(h5: Any, path: str, glt_x: Any, glt_y: Any) -> tuple[tuple[float, ...], str]:
    if glt_x.shape != glt_y.shape:
        raise SceneReadError(f"{display_name(path)}: location/glt_x {glt_x.shape} and location/glt_y {glt_y.shape} "
                             "differ in shape; the GLT is damaged")
    for ds in (glt_x, glt_y):
        if ds.dtype.kind not in "iu":
            raise SceneReadError(f"{display_name(path)}: '{ds.name.lstrip('/')}' is {ds.dtype}; a GLT holds integer "
                                 "swath indices")
    gt = attr_floats(h5, "geotransform", path, product="EMIT", n=6)
    assert gt is not None
    if gt[2] != 0 or gt[4] != 0 or gt[1] <= 0 or gt[5] >= 0 or not all(np.isfinite(gt)):
        raise SceneReadError(f"{display_name(path)}: geotransform {gt} is not a north-up grid with positive pixel "
                             "size; EMIT map grids are")
    wkt = attr_text(h5, "spatial_ref", path, product="EMIT")
    assert wkt is not None
    return tuple(gt), wkt


def open_emit(path: str | os.PathLike[str], h5: Any, variable: str) -> LockedSource:
    """An EMIT granule's cube on its map grid (``h5`` is the open file; it is closed with the source)."""
    name = display_name(path)
    product, what = EMIT_PRODUCTS[variable]
    cube = dataset(h5, variable, str(path), product=what, ndim=3)
    glt_x = dataset(h5, "location/glt_x", str(path), product=what, ndim=2)
    glt_y = dataset(h5, "location/glt_y", str(path), product=what, ndim=2)
    n_down, n_cross, n_bands = cube.shape
    bands = _bands(h5, str(path), n_bands)
    gt, wkt = _grid(h5, str(path), glt_x, glt_y)
    fill = attr(cube, "_FillValue", str(path), product=what, required=False)
    height, width = glt_x.shape
    tags = {
        "cubelake:product": product,
        "emit:variable": variable,
        "emit:orthorectification": "GLT nearest neighbour: location/glt_x, location/glt_y (1-based, 0 = fill)",
        "emit:swath_shape": f"{n_down}x{n_cross}",
        "emit:ortho_shape": f"{height}x{width}",
    }
    for key in ("title", "product_version", "flight_line", "platform", "instrument", "time_coverage_end",
                "software_build_version", "identifier_product_doi"):
        value = attr_text(h5, key, str(path), product=what, required=False)
        if value:
            tags[f"emit:{key}"] = value[:500]
    units = attr_text(cube, "units", str(path), product=what, required=False)
    if units:
        tags["units"] = units
    meta = SceneMetadata(
        path=str(path), files=(str(path),), format=f"EMIT-{product.split('-')[1].upper()}", count=n_bands, height=height,
        width=width, dtype=cube.dtype.name, crs_wkt=wkt, crs_epsg=epsg_of_wkt(wkt),
        transform=(gt[1], gt[2], gt[0], gt[4], gt[5], gt[3]),
        nodata=float(np.asarray(fill).ravel()[0]) if fill is not None else -9999.0, bands=bands,
        # the map grid has no native blocks (each window is gathered from the swath through the GLT): one
        # block, so a failure is reported by its rows and columns, not by swath-chunk numbers it does not have
        block_shape=(height, width),
        interleave="bip",
        datetime=iso_utc(attr_text(h5, "time_coverage_start", str(path), product=what, required=False),
                         "time_coverage_start"),
        tags=tags,
    )
    nodata = meta.nodata if meta.nodata is not None else -9999.0

    def get(window: Window) -> np.ndarray:
        return read_ortho(cube, glt_x, glt_y, window, nodata, name)

    return LockedSource(meta, get, h5.close)


def glt_lookup(gx: np.ndarray, gy: np.ndarray, n_down: int, n_cross: int, where: str) -> tuple[np.ndarray, ...]:
    """The valid map pixels of a GLT window and their 0-based swath (row, col). Pure.

    0 is "no swath pixel"; any other entry must lie in ``1..size``, else the GLT is damaged.
    """
    valid = (gx != GLT_FILL) & (gy != GLT_FILL)
    rows, cols = gy[valid].astype(np.int64) - 1, gx[valid].astype(np.int64) - 1
    for idx, size, axis in ((rows, n_down, "glt_y"), (cols, n_cross, "glt_x")):
        if idx.size and (idx.min() < 0 or idx.max() >= size):
            bad = int(idx.min() + 1) if idx.min() < 0 else int(idx.max() + 1)
            raise SceneReadError(f"{where}: location/{axis} holds {bad}, outside the swath's 1..{size}; the GLT is "
                                 "damaged (0 is the only fill value)")
    return valid, rows, cols


def read_ortho(cube: Any, glt_x: Any, glt_y: Any, window: Window, fill: float, where: str,
               budget: int = SLAB_BUDGET_BYTES) -> np.ndarray:
    """The map-grid window ``(band, y, x)`` of a swath cube ``(downtrack, crosstrack, band)`` through its GLT."""
    rs, cs = slice(window.row_off, window.row_end), slice(window.col_off, window.col_end)
    gx, gy = np.asarray(glt_x[rs, cs]), np.asarray(glt_y[rs, cs])
    out = np.empty((window.height, window.width, cube.shape[2]), dtype=cube.dtype)
    _fill_window(cube, gx, gy, window, fill, where, budget, out)
    # filled pixel by pixel (each a contiguous run of bands, as the swath stores them); one transpose at the end
    return np.ascontiguousarray(out.transpose(2, 0, 1))


def _fill_window(cube: Any, gx: np.ndarray, gy: np.ndarray, window: Window, fill: float, where: str,
                 budget: int, out: np.ndarray) -> None:
    """Fill ``out`` ``(y, x, band)`` for ``window`` from the swath slab its GLT entries reach."""
    n_down, n_cross, n_bands = cube.shape
    valid, rows, cols = glt_lookup(gx, gy, n_down, n_cross, where)
    if rows.size == 0:
        out[...] = fill
        return
    r0, r1, c0, c1 = int(rows.min()), int(rows.max()) + 1, int(cols.min()), int(cols.max()) + 1
    slab_bytes = (r1 - r0) * (c1 - c0) * n_bands * cube.dtype.itemsize
    if slab_bytes > budget and window.height * window.width > 1:
        for part, (ys, xs) in _halves(window):
            _fill_window(cube, gx[ys, xs], gy[ys, xs], part, fill, where, budget, out[ys, xs])
        return
    slab = cube[r0:r1, c0:c1, :]  # the swath pixels this window sees, all bands
    if not valid.all():
        out[~valid] = fill
    out[valid] = slab[rows - r0, cols - c0, :]


def _halves(window: Window) -> Sequence[tuple[Window, tuple[slice, slice]]]:
    """``window`` cut in two across its longer side, with each half's slices relative to it."""
    h, w = window.height, window.width
    if h >= w:
        m = h // 2
        return [(Window(window.row_off, window.col_off, m, w), (slice(0, m), slice(0, w))),
                (Window(window.row_off + m, window.col_off, h - m, w), (slice(m, h), slice(0, w)))]
    m = w // 2
    return [(Window(window.row_off, window.col_off, h, m), (slice(0, h), slice(0, m))),
            (Window(window.row_off, window.col_off + m, h, w - m), (slice(0, h), slice(m, w)))]
