"""The cube's native Zarr v3 store: ``data (time, band, y, x)`` and its coordinates, CF-encoded.

As for a scene's Zarr (``ingest/zarr_writer.py``), xarray writes the metadata (dimension names,
CF ``scale_factor``/``add_offset``/``_FillValue``, coordinates ``time``, ``band``, ``wavelength``,
``fwhm``, ``y``, ``x`` and the grid mapping ``spatial_ref`` with ``crs_wkt`` and ``GeoTransform``,
which rioxarray reads), then zarr-python writes the pixels chunk by chunk, so memory holds a few
blocks at most. Chunks are ``(1, band_chunk, chunk, chunk)``; a block no scene covers is never
written and reads as the fill value (NaN once decoded).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from cubelake.cube import CFEncoder, fill_json, grid_coords
from cubelake.grid import Window

from .grid import TargetGrid

__all__ = ["CubeLayout", "CubeSink", "create_cube_zarr", "finish_cube_zarr"]


@dataclass(frozen=True, slots=True)
class CubeLayout:
    """What the store holds: grid, time axis (UTC), bands, stored encoding, chunking and attributes."""

    grid: TargetGrid
    times: tuple[datetime, ...]
    band_numbers: tuple[int, ...]
    wavelengths_nm: tuple[float | None, ...]
    fwhm_nm: tuple[float | None, ...]
    band_names: tuple[str | None, ...]
    encoding: CFEncoder
    chunk: int
    band_chunk: int
    attrs: dict[str, Any] = field(default_factory=dict)
    data_attrs: dict[str, Any] = field(default_factory=dict)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return len(self.times), len(self.band_numbers), self.grid.height, self.grid.width

    @property
    def chunks(self) -> tuple[int, int, int, int]:
        return 1, min(self.band_chunk, len(self.band_numbers)), self.chunk, self.chunk


def _codec() -> Any:
    # the blosc settings ingest's ZarrCodecSpec picked on the real cubes (BENCHMARKS.md): zstd 3, byte shuffle, 1 MiB blocks
    from zarr.codecs import BloscCodec

    return BloscCodec(cname="zstd", clevel=3, shuffle="shuffle", blocksize=1024 * 1024)


def _time_encoding(times: tuple[datetime, ...]) -> dict[str, Any]:
    """CF time units that hold every time exactly as int64 (seconds, or microseconds for sub-second times)."""
    unit = "seconds" if all(t.microsecond == 0 for t in times) else "microseconds"
    return {"units": f"{unit} since 1970-01-01T00:00:00", "calendar": "proleptic_gregorian", "dtype": "int64"}


def _coords(layout: CubeLayout) -> dict[str, Any]:
    grid = layout.grid
    times = np.array([t.replace(tzinfo=None) for t in layout.times], dtype="datetime64[ns]")
    coords: dict[str, Any] = {
        "time": ("time", times, {"standard_name": "time", "long_name": "acquisition time (UTC)"}),
        "band": ("band", np.asarray(layout.band_numbers, dtype=np.int32), {"long_name": "source band number (1-based)"}),
    }
    if all(w is not None for w in layout.wavelengths_nm):
        coords["wavelength"] = ("band", np.asarray(layout.wavelengths_nm, dtype=np.float64),
                                {"units": "nm", "long_name": "band centre wavelength"})
    if all(f is not None for f in layout.fwhm_nm):
        coords["fwhm"] = ("band", np.asarray(layout.fwhm_nm, dtype=np.float64),
                          {"units": "nm", "long_name": "full width at half maximum"})
    xy = grid_coords(grid.transform, grid.height, grid.width)
    assert xy is not None  # a target grid is north-up by construction
    coords["x"] = ("x", xy["x"], {"standard_name": "projection_x_coordinate", "axis": "X"})
    coords["y"] = ("y", xy["y"], {"standard_name": "projection_y_coordinate", "axis": "Y"})
    a, b, c, d, e, f = grid.transform
    coords["spatial_ref"] = ((), np.int32(0), {"crs_wkt": grid.crs_wkt, "spatial_ref": grid.crs_wkt,
                                               "GeoTransform": " ".join(repr(v) for v in (c, a, b, f, d, e))})
    return coords


def create_cube_zarr(path: Path, layout: CubeLayout) -> None:
    """Write the store's metadata and coordinates; ``data`` chunks come later (:class:`CubeSink`)."""
    import dask.array as da
    import xarray as xr

    enc = layout.encoding
    data_attrs = {**layout.data_attrs, "grid_mapping": "spatial_ref"}
    if all(n for n in layout.band_names):
        data_attrs["band_names"] = [str(n) for n in layout.band_names]  # Zarr v3 has no fixed-length string type yet
    # a one-chunk dask placeholder: compute=False writes metadata only, and its graph stays one task
    placeholder = da.zeros(layout.shape, dtype=np.float32 if enc.is_scaled else enc.dtype, chunks=layout.shape)
    ds = xr.Dataset({"data": (("time", "band", "y", "x"), placeholder, data_attrs)}, coords=_coords(layout),
                    attrs=layout.attrs)
    data_enc: dict[str, Any] = {"dtype": enc.dtype, "chunks": layout.chunks, "compressors": [_codec()]}
    if enc.fill_value is not None:
        data_enc["_FillValue"] = fill_json(enc.fill_value)
        data_enc["fill_value"] = fill_json(enc.fill_value)
    if enc.is_scaled:
        data_enc.update(scale_factor=enc.scale_factor, add_offset=enc.add_offset)
    ds.to_zarr(str(path), mode="w-", zarr_format=3, compute=False, consolidated=False,
               encoding={"data": data_enc, "time": _time_encoding(layout.times)})


class CubeSink:
    """Writes stored ``(band, y, x)`` blocks of one time step into ``data``. Thread-safe for disjoint blocks."""

    def __init__(self, path: Path) -> None:
        import zarr

        self.array = zarr.open_array(str(path), path="data", mode="r+")

    def write(self, t: int, window: Window, block: np.ndarray) -> None:
        self.array[t, :, window.row_off:window.row_end, window.col_off:window.col_end] = block


def finish_cube_zarr(path: Path) -> None:
    """Consolidate the metadata (xarray then opens the store with one read)."""
    import zarr

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Consolidated metadata is currently not part")
        zarr.consolidate_metadata(str(path))
