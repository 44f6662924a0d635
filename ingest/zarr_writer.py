"""Native Zarr v3 product: a group holding ``data (band, y, x)`` and its coordinates.

Metadata is written by xarray (so xarray/rioxarray read the store with the conventions they
expect: dimension names, CF ``scale_factor``/``add_offset``/``_FillValue``, coordinates, a CF
grid mapping with ``crs_wkt`` and ``GeoTransform``); pixels are then written chunk by chunk
(or shard by shard) with zarr-python, so memory never holds more than a few units.

xarray, dask and zarr are imported when a store is written, not with the module: together
they add about a second to every ``cubelake`` start, including runs that write no Zarr.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from cubelake.grid import Window

from .calibrate import CFEncoder
from .sources import BandInfo

__all__ = ["CubeSpec", "ZarrCodecSpec", "ZarrSink", "create_zarr", "dataset_template", "finish_zarr", "grid_coords"]


@dataclass(frozen=True, slots=True)
class ZarrCodecSpec:
    """Blosc settings of the ``data`` array.

    The default is what ``bench/zarr_codecs.py`` picked on the real cubes (BENCHMARKS.md): zstd
    level 3 with byte shuffle and 1 MiB blosc blocks decodes 1.4x faster than blosc's automatic
    128 KiB blocks at the same ratio and encode speed.
    """

    cname: Literal["zstd", "lz4", "lz4hc", "zlib"] = "zstd"
    clevel: int = 3
    shuffle: Literal["shuffle", "bitshuffle", "noshuffle"] = "shuffle"
    blocksize: int = 1024 * 1024  # bytes; 0 lets blosc choose

    def codec(self) -> Any:
        from zarr.codecs import BloscCodec

        return BloscCodec(cname=self.cname, clevel=self.clevel, shuffle=self.shuffle, blocksize=self.blocksize)


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


def _fill_json(v: float | None) -> Any:
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
    def from_bands(cls, bands: Sequence[BandInfo], *, height: int, width: int, encoding: CFEncoder,
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
        enc["data"]["_FillValue"] = _fill_json(encoding.fill_value)
    if encoding.is_scaled:
        enc["data"]["scale_factor"] = encoding.scale_factor
        enc["data"]["add_offset"] = encoding.add_offset
    if labels_dtype is not None:
        variables["labels"] = (("y", "x"), da.zeros((ny, nx), dtype=labels_dtype, chunks=(ny, nx)),
                               {"long_name": "class label per pixel (0 = unlabelled)", **({"grid_mapping": "spatial_ref"} if "spatial_ref" in coords else {})})
        enc["labels"] = {"chunks": chunks[1:]}
    return xr.Dataset(variables, coords=coords, attrs=spec.attrs), enc


def create_zarr(
    path: Path,
    spec: CubeSpec,
    *,
    chunk: int,
    codec: ZarrCodecSpec,
    shard: int | None = None,
    labels_dtype: str | None = None,
) -> None:
    """Write the store's metadata and coordinates; ``data`` (and ``labels``) chunks come later."""
    nb, ny, nx = spec.shape
    ds, enc = dataset_template(spec, (nb, chunk, chunk), labels_dtype)
    enc["data"].update(chunks=(nb, chunk, chunk), compressors=[codec.codec()])
    if spec.encoding.fill_value is not None:
        enc["data"]["fill_value"] = _fill_json(spec.encoding.fill_value)
    if shard:
        enc["data"]["shards"] = (nb, min(ny, chunk * shard), min(nx, chunk * shard))
    if "labels" in enc:
        enc["labels"].update(chunks=(chunk, chunk), compressors=[codec.codec()])
    ds.to_zarr(str(path), mode="w-", zarr_format=3, compute=False, encoding=enc, consolidated=False)


class ZarrSink:
    """Writes stored ``(band, y, x)`` units into the ``data`` array. Thread-safe for disjoint units."""

    def __init__(self, path: Path, name: str = "data") -> None:
        import zarr

        self.array = zarr.open_array(str(path), path=name, mode="r+")

    def write(self, window: Window, data: np.ndarray) -> None:
        if data.ndim == 2:
            self.array[window.row_off : window.row_end, window.col_off : window.col_end] = data
        else:
            self.array[:, window.row_off : window.row_end, window.col_off : window.col_end] = data


def finish_zarr(path: Path, data_attrs: dict[str, Any], group_attrs: dict[str, Any] | None = None) -> None:
    """Add the attributes known only after the pixel pass, then consolidate the metadata.

    Consolidated metadata is a zarr-python extension to v3 (readers without it ignore the
    extra key); it lets xarray open the store with one read instead of one per array.
    """
    import zarr

    group = zarr.open_group(str(path), mode="r+")
    group["data"].attrs.update(data_attrs)
    if group_attrs:
        group.attrs.update(group_attrs)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Consolidated metadata is currently not part")
        zarr.consolidate_metadata(str(path))
