"""The cube every product describes: ``data (band, y, x)`` on one grid, and how its values are stored.

Shared by the writers (Zarr, COG), the reference builder and the readers, so every product of a
scene opens as the same dataset:

* :class:`CFEncoder` — the stored representation (float32, a source integer type, or integers with
  CF ``scale_factor``/``add_offset``/``_FillValue``), with ``encode``/``decode`` and ``to_dict``/``from_dict``.
* :class:`CubeSpec` — shape, bands (numbers, wavelengths, FWHM, names), grid and attributes.
* :func:`dataset_template` — the xarray Dataset of a spec's coordinates and metadata (xarray and dask
  are imported when it is called, not with this module).

Pure numpy at import; imports nothing of cubelake above the core.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

__all__ = ["BandLike", "CFEncoder", "CubeSpec", "dataset_template", "default_fill", "fill_json", "grid_coords"]


class BandLike(Protocol):
    """What a cube needs to know of a band (``ingest.sources.BandInfo`` is one)."""

    @property
    def number(self) -> int: ...
    @property
    def name(self) -> str | None: ...
    @property
    def wavelength_nm(self) -> float | None: ...
    @property
    def fwhm_nm(self) -> float | None: ...


def default_fill(dtype: str) -> float:
    """The fill value of an encoding: NaN for floats, the type's extreme for integers."""
    dt = np.dtype(dtype)
    if dt.kind == "f":
        return math.nan
    info = np.iinfo(dt)
    return float(info.min) if dt.kind == "i" else float(info.max)


@dataclass(frozen=True, slots=True)
class CFEncoder:
    """Stored representation: float32, a source integer type unchanged, or int with CF scale/offset."""

    dtype: str
    scale_factor: float = 1.0
    add_offset: float = 0.0
    fill_value: float | None = None

    @property
    def is_integer(self) -> bool:
        return np.dtype(self.dtype).kind in "iu"

    @property
    def is_scaled(self) -> bool:
        return self.scale_factor != 1.0 or self.add_offset != 0.0

    def valid_range(self) -> tuple[float, float]:
        """Stored values that are data (the fill value at an extreme is excluded)."""
        dt = np.dtype(self.dtype)
        if dt.kind == "f":
            return (-math.inf, math.inf)
        info = np.iinfo(dt)
        lo, hi = float(info.min), float(info.max)
        if self.fill_value == lo:
            lo += 1
        elif self.fill_value == hi:
            hi -= 1
        return lo, hi

    def encode(self, value: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Physical float64 (NaN = missing) -> stored array and the per-band count of clipped values."""
        clipped = np.zeros(value.shape[0], dtype=np.int64)
        if not self.is_integer:
            top = float(np.finfo(self.dtype).max)
            with np.errstate(invalid="ignore"):
                over = np.abs(value) > top
            over &= np.isfinite(value)
            if over.any():  # finite values float32 cannot hold would become inf: clip and count them
                clipped = over.sum(axis=(1, 2))
                value = np.clip(value, -top, top)
            return value.astype(self.dtype), clipped
        q = (value - self.add_offset) / self.scale_factor if self.is_scaled else value.copy()
        np.rint(q, out=q)
        missing = np.isnan(q)
        lo, hi = self.valid_range()
        with np.errstate(invalid="ignore"):
            over = (q < lo) | (q > hi)
        if over.any():
            clipped = over.sum(axis=(1, 2))
            np.clip(q, lo, hi, out=q)
        if missing.any():
            if self.fill_value is None:
                raise ValueError("missing values need a fill value to be encoded as integers")
            q[missing] = self.fill_value
        return q.astype(self.dtype), clipped

    def decode(self, stored: np.ndarray) -> np.ndarray:
        """Stored -> physical float64 with NaN where the fill value is."""
        v = stored.astype(np.float64)
        if self.fill_value is not None and not math.isnan(self.fill_value):
            v[stored == self.fill_value] = np.nan
        if self.is_scaled:
            v = v * self.scale_factor + self.add_offset
        return v

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"step": "cf_encode", "dtype": self.dtype}
        if self.is_scaled:
            d["formula"] = "stored = round((value - add_offset) / scale_factor)"
            d["scale_factor"] = self.scale_factor
            d["add_offset"] = self.add_offset
        d["_FillValue"] = None if self.fill_value is None else ("NaN" if math.isnan(self.fill_value) else self.fill_value)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CFEncoder:
        fv = d.get("_FillValue")
        fill = math.nan if fv == "NaN" else fv
        return cls(d["dtype"], d.get("scale_factor", 1.0), d.get("add_offset", 0.0), fill)


def grid_coords(
    transform: tuple[float, float, float, float, float, float] | None, height: int, width: int
) -> dict[str, np.ndarray] | None:
    """Cell-centre ``x``/``y`` from a north-up (or y-up) transform; pixel centres without one.

    Returns ``None`` for rotated/sheared transforms, which 1-D coordinates cannot express.
    """
    if transform is None:
        return {"x": np.arange(width) + 0.5, "y": np.arange(height) + 0.5}
    a, b, c, d, e, f = transform
    if b != 0 or d != 0:
        return None
    return {"x": c + a * (np.arange(width) + 0.5), "y": f + e * (np.arange(height) + 0.5)}


def fill_json(v: float | None) -> Any:
    """A fill value as zarr/xarray metadata takes it (NaN as a float NaN, not ``None``)."""
    if v is None:
        return None
    return float("nan") if math.isnan(v) else v


@dataclass(frozen=True, slots=True)
class CubeSpec:
    """What a ``data (band, y, x)`` cube product looks like: shape, grid, bands, encoding, attributes.

    One description serves the native Zarr writer and the reference builder, so both products
    open in xarray as the same dataset.
    """

    shape: tuple[int, int, int]
    encoding: CFEncoder
    band_numbers: list[int]
    wavelengths_nm: list[float | None]
    fwhm_nm: list[float | None]
    band_names: list[str | None]
    transform: tuple[float, float, float, float, float, float] | None
    crs_wkt: str | None
    attrs: dict[str, Any]
    data_attrs: dict[str, Any]

    @classmethod
    def from_bands(cls, bands: Sequence[BandLike], *, height: int, width: int, encoding: CFEncoder,
                   transform: tuple[float, float, float, float, float, float] | None, crs_wkt: str | None,
                   attrs: dict[str, Any], data_attrs: dict[str, Any]) -> CubeSpec:
        """The cube of ``bands`` (numbers, wavelengths, FWHM and names taken from each) on one grid."""
        return cls(
            shape=(len(bands), height, width),
            encoding=encoding,
            band_numbers=[b.number for b in bands],
            wavelengths_nm=[b.wavelength_nm for b in bands],
            fwhm_nm=[b.fwhm_nm for b in bands],
            band_names=[b.name for b in bands],
            transform=transform,
            crs_wkt=crs_wkt,
            attrs=attrs,
            data_attrs=data_attrs,
        )


def dataset_template(spec: CubeSpec, chunks: tuple[int, int, int], labels_dtype: str | None = None) -> tuple[Any, dict[str, Any]]:
    """An xarray Dataset of the cube's coordinates and a lazy placeholder ``data``, and its encoding.

    Written with ``compute=False`` it gives every array's metadata and the coordinates' values.
    """
    import dask.array as da
    import xarray as xr

    ny, nx = spec.shape[1:]
    data_attrs = dict(spec.data_attrs)
    encoding = spec.encoding
    coords: dict[str, Any] = {"band": ("band", np.asarray(spec.band_numbers, dtype=np.int32), {"long_name": "source band number (1-based)"})}
    if all(w is not None for w in spec.wavelengths_nm):
        coords["wavelength"] = ("band", np.asarray(spec.wavelengths_nm, dtype=np.float64), {"units": "nm", "long_name": "band centre wavelength"})
    if all(f is not None for f in spec.fwhm_nm):
        coords["fwhm"] = ("band", np.asarray(spec.fwhm_nm, dtype=np.float64), {"units": "nm", "long_name": "full width at half maximum"})
    if all(n for n in spec.band_names):
        # names go in an attribute: Zarr v3 has no specified fixed-length string type yet
        data_attrs["band_names"] = [str(n) for n in spec.band_names]
    transform = spec.transform
    xy = grid_coords(transform, ny, nx)
    georef = transform is not None
    if xy is not None:
        xattrs = {"standard_name": "projection_x_coordinate", "axis": "X"} if georef else {"long_name": "pixel column centre", "units": "pixel"}
        yattrs = {"standard_name": "projection_y_coordinate", "axis": "Y"} if georef else {"long_name": "pixel row centre", "units": "pixel"}
        coords["x"] = ("x", xy["x"], xattrs)
        coords["y"] = ("y", xy["y"], yattrs)
    if spec.crs_wkt is not None or transform is not None:
        gm: dict[str, Any] = {}
        if spec.crs_wkt is not None:
            gm["crs_wkt"] = spec.crs_wkt
            gm["spatial_ref"] = spec.crs_wkt
        if transform is not None:
            a, b, c, d, e, f = transform
            gm["GeoTransform"] = " ".join(repr(v) for v in (c, a, b, f, d, e))
        coords["spatial_ref"] = ((), np.int32(0), gm)
        data_attrs["grid_mapping"] = "spatial_ref"
    # the dask array is a placeholder (compute=False writes metadata only); one dask chunk keeps its
    # graph to one task (a 100k-chunk placeholder took 20 s to plan) and is aligned with any zarr chunking
    data = da.zeros(spec.shape, dtype=np.float32 if encoding.is_scaled else encoding.dtype, chunks=spec.shape)
    variables: dict[str, Any] = {"data": (("band", "y", "x"), data, data_attrs)}
    enc: dict[str, Any] = {"data": {"dtype": encoding.dtype, "chunks": chunks}}
    if encoding.fill_value is not None:
        enc["data"]["_FillValue"] = fill_json(encoding.fill_value)
    if encoding.is_scaled:
        enc["data"]["scale_factor"] = encoding.scale_factor
        enc["data"]["add_offset"] = encoding.add_offset
    if labels_dtype is not None:
        variables["labels"] = (("y", "x"), da.zeros((ny, nx), dtype=labels_dtype, chunks=(ny, nx)),
                               {"long_name": "class label per pixel (0 = unlabelled)", **({"grid_mapping": "spatial_ref"} if "spatial_ref" in coords else {})})
        enc["labels"] = {"chunks": chunks[1:]}
    return xr.Dataset(variables, coords=coords, attrs=spec.attrs), enc
