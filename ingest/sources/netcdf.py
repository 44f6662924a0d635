"""Generic NetCDF (classic and NetCDF-4) and HDF5 cubes: research cubes and the missions without a reader.

The file is opened lazily with xarray (h5netcdf for HDF5/NetCDF-4, scipy for classic NetCDF), raw
(no mask/scale: CF ``scale_factor``/``add_offset`` become the file's calibration and ``_FillValue``
its nodata, as for GeoTIFFs). What xarray's CF conventions give is taken from the file:

* the cube: ``--variable NAME`` (``group/NAME`` inside a group), else the largest 3-D numeric variable;
* its axes: ``--axes`` (``byx``, ``yxb``, ``ybx`` ...), else from dimension names (band/wavelength/
  channel; y/lat/row/line; x/lon/col/sample) or the dimension of the wavelength variable;
* wavelengths: ``--wavelength-variable NAME``, else the band dimension's coordinate or a variable named
  ``wavelength(s)``/``wl``/``center_wavelength`` on it, else a ``wavelength`` attribute; its ``units``
  attribute (nm, um ...), else nm or um assumed from the values with a warning;
* the grid: the CF ``grid_mapping`` variable (``crs_wkt``/``spatial_ref``, else its CF parameters,
  through pyproj) and the regularly spaced 1-D coordinates of the y/x dimensions (``GeoTransform`` when
  GDAL wrote one); latitude/longitude coordinates without a grid mapping are EPSG:4326. A grid whose y
  coordinate increases is read flipped, so the product is north-up;
* the time: a one-element ``time`` coordinate (CF units), else ``time_coverage_start``.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from cubelake.errors import NoCubeError, SceneReadError
from cubelake.grid import Window

from ..report import Code, Issue, warning
from ..spectral import unit_factor_to_nm
from ._base import BandInfo, FileCalibration, LockedSource, SceneMetadata, display_name
from .hdf import epsg_of_wkt, hdf5_signature_at, is_netcdf3

__all__ = ["CubeAxes", "open_netcdf"]

log = logging.getLogger(__name__)

_BAND = re.compile(r"^(bands?|wavelengths?|wl|channels?|spectral|lambda|wavenumber)$", re.I)
_Y = re.compile(r"^(y|lat|latitude|rows?|northing|lines?|downtrack|along_track)$", re.I)
_X = re.compile(r"^(x|lon|longitude|cols?|columns?|easting|samples?|crosstrack|across_track)$", re.I)
_WL_NAMES = ("wavelength", "wavelengths", "wl", "center_wavelength", "band_center", "wavelength_nm")
_FWHM_NAMES = ("fwhm", "bandwidth", "band_width", "fwhm_nm")
_LETTER = {"b": "band", "y": "y", "x": "x"}


@dataclass(frozen=True, slots=True)
class CubeAxes:
    """The dimension names of the cube's band, y and x axes."""

    band: str
    y: str
    x: str


def _engine(head: bytes) -> str:
    return "h5netcdf" if hdf5_signature_at(head) is not None else "scipy" if is_netcdf3(head) else "netcdf4"


def _open(path: str, head: bytes, group: str | None) -> tuple[Any, Any]:
    """(xarray Dataset, file handle or None) for ``path`` (a ``/vsis3/`` name is read by ranges)."""
    import xarray as xr

    from cubelake.storage import object_at, url_of_gdal_path

    url = url_of_gdal_path(path)
    handle = None
    if url is not None:
        store, key = object_at(url)
        handle = store.open_reader(key)
    try:
        engine = _engine(head)
        extra: dict[str, Any] = {"phony_dims": "sort"} if engine == "h5netcdf" else {}  # plain HDF5: no dim scales
        ds = xr.open_dataset(handle if handle is not None else path, engine=engine, group=group,
                             mask_and_scale=False, decode_times=False, cache=False, **extra)
    except (OSError, ValueError, KeyError, RuntimeError, TypeError) as exc:
        if handle is not None:
            handle.close()
        where = f" group {group!r}" if group else ""
        raise SceneReadError(f"{display_name(path)}: cannot open it as NetCDF/HDF5{where} ({exc}); the file is "
                             "damaged, truncated or not NetCDF/HDF5") from exc
    return ds, handle


def _pick(ds: Any, name: str | None, path: str) -> Any:
    numeric = {k: v for k, v in ds.data_vars.items() if v.dtype.kind in "uif"}
    if name is not None:
        if name not in ds.variables:
            raise SceneReadError(f"{path}: no variable {name!r}; the file has {sorted(map(str, ds.variables))} "
                                 "(choose one with --variable, group/name inside a group)")
        return ds[name]
    cubes = [v for v in numeric.values() if sum(s > 1 for s in v.shape) == 3]
    if not cubes:
        have = [f"{k} {dict(v.sizes)}" for k, v in numeric.items()]
        raise NoCubeError(f"{path}: no 3-D numeric variable (have {have or 'none'}); name the cube with --variable "
                          "(group/name inside a group)")
    return max(cubes, key=lambda v: int(np.prod(v.shape, dtype=np.int64)))


def _axes(var: Any, ds: Any, axes: str | None, wl_name: str | None, path: str) -> CubeAxes:
    dims = [d for d in var.dims if var.sizes[d] > 1]
    if len(dims) != 3:
        raise NoCubeError(f"{path}: variable {var.name!r} has dimensions {dict(var.sizes)}; a cube has three "
                          "(band, y, x) of size > 1")
    if axes is not None:
        if sorted(axes) != ["b", "x", "y"]:
            raise SceneReadError(f"{path}: --axes {axes!r} must order the letters b, y and x (e.g. byx, yxb, ybx)")
        named = {_LETTER[c]: d for c, d in zip(axes, dims, strict=True)}
        return CubeAxes(named["band"], named["y"], named["x"])
    found = {k: [d for d in dims if rx.match(str(d))] for k, rx in (("band", _BAND), ("y", _Y), ("x", _X))}
    if wl_name and wl_name in ds.variables and len(ds[wl_name].dims) == 1 and ds[wl_name].dims[0] in dims:
        found["band"] = [ds[wl_name].dims[0]]
    if all(len(v) == 1 for v in found.values()) and len({v[0] for v in found.values()}) == 3:
        return CubeAxes(found["band"][0], found["y"][0], found["x"][0])
    if len(found["band"]) == 1:  # the other two, in the variable's order, are y then x
        y, x = (d for d in dims if d != found["band"][0])
        return CubeAxes(found["band"][0], y, x)
    raise SceneReadError(f"{path}: cannot tell which of {dims} of {var.name!r} is the band axis; give --axes "
                         f"(the order of b, y, x in {dims}, e.g. --axes byx)")


def _per_band(ds: Any, var: Any, band: str, names: Sequence[str], given: str | None, path: str,
              *, coordinate: bool = False) -> Any:
    """The variable (or attribute values) that gives one number per band, by name (or, with ``coordinate``,
    the band dimension's own coordinate); ``None`` if there is none."""
    n = var.sizes[band]
    found = [k for k in map(str, ds.variables) if k.lower() in names]
    cands = [given] if given else [*([band] if coordinate else []), *names, *found]
    for name in cands:
        if name in ds.variables and ds[name].dims == (band,) and ds[name].dtype.kind in "uif":
            return ds[name]
        if given:
            raise SceneReadError(f"{path}: --wavelength-variable {given!r} is not a numeric variable along the band "
                                 f"dimension {band!r} ({n} values)")
    for name in names:
        if name in var.attrs and np.asarray(var.attrs[name]).size == n:
            return np.asarray(var.attrs[name], dtype=float)
    return None


def _to_nm(values: Any, path: str, issues: list[Issue]) -> list[float]:
    arr = np.asarray(values, dtype=float).ravel()
    unit = getattr(values, "attrs", {}).get("units")
    factor = unit_factor_to_nm(str(unit)) if unit is not None else None
    if factor is None:
        factor = 1000.0 if arr.size and np.nanmax(arr) < 30 else 1.0
        issues.append(warning(Code.WAVELENGTH_UNITS_ASSUMED,
                              f"the wavelengths have units {unit!r}; assumed "
                              f"{'micrometres' if factor == 1000.0 else 'nanometres'} from the values. Set the "
                              "variable's units attribute (nm or um) to be explicit", where=path))
    return [float(v) * factor for v in arr]


def _crs(ds: Any, var: Any, axes: CubeAxes) -> str | None:
    """The cube's CRS as WKT: its CF grid mapping, else EPSG:4326 for latitude/longitude axes."""
    from pyproj import CRS
    from pyproj.exceptions import CRSError

    gm = var.attrs.get("grid_mapping")
    if isinstance(gm, str) and gm.split(":")[0].strip() in ds.variables:
        attrs = dict(ds[gm.split(":")[0].strip()].attrs)
        for key in ("crs_wkt", "spatial_ref"):
            if isinstance(attrs.get(key), str):
                return str(attrs[key])
        try:
            return str(CRS.from_cf(attrs).to_wkt())
        except CRSError as exc:
            log.warning("grid mapping %r is not a CRS pyproj knows (%s); the cube is not georeferenced", gm, exc)
            return None
    if axes.y.lower() in ("lat", "latitude") and axes.x.lower() in ("lon", "longitude"):
        return str(CRS.from_epsg(4326).to_wkt())
    return None


def _axis_step(ds: Any, dim: str) -> tuple[float, float] | None:
    """(first centre, step) of a regularly spaced 1-D coordinate, else ``None``."""
    if dim not in ds.variables or ds[dim].ndim != 1 or ds[dim].dtype.kind not in "uif":
        return None
    c = np.asarray(ds[dim].values, dtype=float)
    if c.size < 2:
        return None
    steps = np.diff(c)
    if not np.allclose(steps, steps[0], rtol=1e-6, atol=abs(steps[0]) * 1e-6) or steps[0] == 0:
        return None
    return float(c[0]), float(steps[0])


def _transform(ds: Any, var: Any, axes: CubeAxes) -> tuple[tuple[float, ...] | None, bool]:
    """GDAL-order affine of the north-up grid, and whether rows must be flipped to make it north-up."""
    gm = var.attrs.get("grid_mapping")
    gm_var = ds[gm.split(":")[0].strip()] if isinstance(gm, str) and gm.split(":")[0].strip() in ds.variables else None
    gt = gm_var.attrs.get("GeoTransform") if gm_var is not None else None
    if isinstance(gt, str) and len(gt.split()) == 6:
        c, a, b, f, d, e = (float(v) for v in gt.split())
        return (a, b, c, d, e, f), False
    ys, xs = _axis_step(ds, axes.y), _axis_step(ds, axes.x)
    if ys is None or xs is None:
        return None, False
    (y0, dy), (x0, dx) = ys, xs
    flip = dy > 0
    if flip:  # south-up storage: row 0 of the product is the last row of the file
        y0, dy = y0 + dy * (var.sizes[axes.y] - 1), -dy
    return (dx, 0.0, x0 - dx / 2, 0.0, dy, y0 - dy / 2), flip


def _time(ds: Any) -> str | None:
    import xarray as xr

    if "time" in ds.variables and ds["time"].size == 1:
        try:
            t = xr.decode_cf(ds[["time"]])["time"].values.ravel()[0]
            return str(np.datetime_as_string(np.datetime64(t, "s"))) + "Z"
        except (ValueError, TypeError, OverflowError) as exc:
            log.warning("the time coordinate cannot be decoded (%s); ignored", exc)
    value = ds.attrs.get("time_coverage_start")
    return str(value) if value else None


def _reader(var: Any, axes: CubeAxes, height: int, flip: bool) -> Callable[[Window], np.ndarray]:
    """``(band, y, x)`` windows of ``var`` (rows flipped for a south-up file)."""
    def get(w: Window) -> np.ndarray:
        rows = slice(height - w.row_end, height - w.row_off) if flip else slice(w.row_off, w.row_end)
        block = var.isel({axes.y: rows, axes.x: slice(w.col_off, w.col_end)})
        data = block.transpose(axes.band, axes.y, axes.x, ...).values
        data = data.reshape(data.shape[:3])  # singleton extra dimensions (time = 1)
        return data[:, ::-1] if flip else data

    return get

def open_netcdf(path: str | os.PathLike[str], head: bytes, *, variable: str | None = None, axes: str | None = None,
                wavelength_variable: str | None = None) -> LockedSource:
    """Open a NetCDF/HDF5 cube (see the module docstring for what is read from where)."""
    group, _, var_name = (variable or "").rpartition("/")
    ds, handle = _open(str(path), head, group or None)
    try:
        fmt = "NetCDF3" if is_netcdf3(head) else "NetCDF4/HDF5"
        return _source(ds, handle, str(path), fmt, var_name or None, axes, wavelength_variable)
    except BaseException:
        ds.close()
        if handle is not None:
            handle.close()
        raise


def _source(ds: Any, handle: Any, name: str, fmt: str, variable: str | None, axes: str | None,
            wavelength_variable: str | None) -> LockedSource:
    issues: list[Issue] = []
    path, name = name, display_name(name)  # the record keeps GDAL's name of an object, messages its URL
    var = _pick(ds, variable, name)
    ax = _axes(var, ds, axes, wavelength_variable, name)
    extra = [d for d in var.dims if d not in (ax.band, ax.y, ax.x)]
    var = var.isel({d: 0 for d in extra})  # size-1 dimensions (time = 1)
    n = var.sizes[ax.band]
    wl = _per_band(ds, var, ax.band, _WL_NAMES, wavelength_variable, name, coordinate=True)
    fw = _per_band(ds, var, ax.band, _FWHM_NAMES, None, name)
    wl_nm = _to_nm(wl, name, issues) if wl is not None else [None] * n
    fw_nm = _to_nm(fw, name, []) if fw is not None else [None] * n
    bands = tuple(BandInfo(i + 1, None, wl_nm[i], fw_nm[i]) for i in range(n))
    crs = _crs(ds, var, ax)
    transform, flip = _transform(ds, var, ax)
    fill = var.attrs.get("_FillValue", var.attrs.get("missing_value"))
    scale, offset = var.attrs.get("scale_factor"), var.attrs.get("add_offset")
    cals: tuple[FileCalibration, ...] = ()
    if scale is not None or offset is not None:
        s, o = float(np.asarray(scale if scale is not None else 1.0)), float(np.asarray(offset or 0.0))
        cals = (FileCalibration("cf_scale_offset", (s,) * n, (o,) * n, unit=var.attrs.get("units")),)
    georef = crs is not None and transform is not None
    if not georef:
        issues.append(warning(Code.NOT_GEOREFERENCED, f"{name}: no CF grid mapping or regular x/y coordinates on "
                              f"{var.name!r}; the product uses a pixel grid"))
    meta = SceneMetadata(
        path=path, files=(path,), format=fmt, count=n,
        height=var.sizes[ax.y], width=var.sizes[ax.x], dtype=var.dtype.name, crs_wkt=crs, crs_epsg=epsg_of_wkt(crs),
        transform=transform if georef else None,  # type: ignore[arg-type]
        nodata=float(np.asarray(fill).ravel()[0]) if fill is not None else None, bands=bands,
        block_shape=(var.sizes[ax.y], var.sizes[ax.x]), datetime=_time(ds),
        tags={"variable": str(var.name), "axes": f"{ax.band},{ax.y},{ax.x}"}, calibrations=cals,
        georeferenced=georef, issues=tuple(issues))
    def close() -> None:
        ds.close()
        if handle is not None:
            handle.close()

    return LockedSource(meta, _reader(var, ax, meta.height, flip), close)

