"""Native Zarr v3 product: a group holding ``data (band, y, x)`` and its coordinates.

Metadata is written by xarray (so xarray/rioxarray read the store with the conventions they
expect: dimension names, CF ``scale_factor``/``add_offset``/``_FillValue``, coordinates, a CF
grid mapping with ``crs_wkt`` and ``GeoTransform``); pixels are then written chunk by chunk
(or shard by shard) with zarr-python, so memory never holds more than a few units.

xarray, dask and zarr are imported when a store is written, not with the module: together
they add about a second to every ``cubelake`` start, including runs that write no Zarr.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from cubelake.cube import CubeSpec, dataset_template, fill_json
from cubelake.grid import Window

__all__ = ["ZarrCodecSpec", "ZarrSink", "add_layer", "create_zarr", "finish_zarr", "remove_layer", "update_layer_attrs"]


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
        enc["data"]["fill_value"] = fill_json(spec.encoding.fill_value)
    if shard:
        enc["data"]["shards"] = (nb, min(ny, chunk * shard), min(nx, chunk * shard))
    if "labels" in enc:
        enc["labels"].update(chunks=(chunk, chunk), compressors=[codec.codec()])
    ds.to_zarr(str(path), mode="w-", zarr_format=3, compute=False, encoding=enc, consolidated=False)


def add_layer(path: Path, name: str, *, dims: tuple[str, ...], shape: tuple[int, ...], chunks: tuple[int, ...],
              dtype: str, fill: float, attrs: dict[str, Any], codec: ZarrCodecSpec) -> None:
    """Add the (empty) array ``name`` to a store :func:`create_zarr` wrote, as xarray writes a data variable:
    dimension names, CF ``_FillValue`` (also the array's fill value) and ``attrs``. Pixels come later."""
    import dask.array as da
    import xarray as xr

    fill_value = int(fill) if np.dtype(dtype).kind in "iu" else fill_json(fill)
    ds = xr.Dataset({name: (dims, da.zeros(shape, dtype=dtype, chunks=shape), attrs)})
    enc = {name: {"dtype": dtype, "chunks": chunks, "_FillValue": fill_value, "fill_value": fill_value,
                  "compressors": [codec.codec()]}}
    ds.to_zarr(str(path), mode="a", zarr_format=3, compute=False, encoding=enc, consolidated=False)


def update_layer_attrs(path: Path, name: str, attrs: dict[str, Any]) -> None:
    """Add attributes known after an array's pixels were written."""
    import zarr

    zarr.open_array(str(path), path=name, mode="r+").attrs.update(attrs)


def remove_layer(path: Path, name: str) -> None:
    """Delete the array ``name`` (metadata and chunks) from the store, if it is there."""
    import zarr

    group = zarr.open_group(str(path), mode="r+")
    if name in group:
        del group[name]


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
