"""``zarr`` products: a native Zarr v3 store (``<id>.zarr``, local or ``s3://``), metadata read by zarr-python.

Chunks are decoded with the codecs' own libraries (numcodecs' blosc/zstd/gzip/crc32c); the loader only
decides which bytes to fetch, when, and where the result goes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from cubelake.grid import ChunkGrid
from cubelake.record import SceneRecord
from cubelake.storage import S3Options, open_store

from ._base import (
    ChunkSource,
    Decoder,
    ProductError,
    _cf,
    _fill,
    _georef,
    _stats_from_bands,
    _stored_chunks,
)

__all__ = ["open_zarr"]

def _v3_decoder(codecs: Sequence[Any], dtype: np.dtype[Any], shape: tuple[int, ...], product: str) -> Decoder:
    import numcodecs
    from zarr.codecs import BloscCodec, BytesCodec, Crc32cCodec, GzipCodec, ZstdCodec

    steps: list[Callable[[Any], Any]] = []
    endian = "little"
    nbytes = int(np.prod(shape)) * dtype.itemsize
    for c in codecs:
        if isinstance(c, BytesCodec):
            endian = c.endian.value if c.endian is not None else "little"
        elif isinstance(c, BloscCodec):
            steps.append(numcodecs.blosc.decompress)
        elif isinstance(c, ZstdCodec):
            steps.append(numcodecs.Zstd().decode)
        elif isinstance(c, GzipCodec):
            steps.append(numcodecs.GZip().decode)
        elif isinstance(c, Crc32cCodec):
            steps.append(numcodecs.CRC32C().decode)
        else:
            raise ProductError(f"{product}: codec {type(c).__name__} is not supported by the loader "
                               "(supported: bytes, blosc, zstd, gzip, crc32c; sharded stores are not); "
                               "re-ingest without --shard, or with the default codec")
    file_dtype = dtype.newbyteorder("<" if endian == "little" else ">")
    bb = steps[::-1]

    blosc_only = len(codecs) == 2 and isinstance(codecs[1], BloscCodec)

    def decode(raw: bytes | memoryview, out: np.ndarray | None = None) -> np.ndarray:
        if blosc_only:  # straight into a reused buffer: a fresh 16 MiB one costs its page faults every time
            buf: Any = numcodecs.blosc.decompress(raw, out if out is not None and out.nbytes == nbytes
                                                  else np.empty(nbytes, np.uint8))
        else:
            buf = raw
            for step in bb:
                buf = step(buf)
        a = np.frombuffer(buf, dtype=file_dtype).reshape(shape)
        return a if file_dtype.isnative else a.astype(dtype)

    return decode


def open_zarr(url: str, scene_id: str, options: S3Options | None, record: SceneRecord | None,
              array: str = "data") -> ChunkSource:
    """The store's ``array``: the cube ``data (band, y, x)``, or a layer on its grid (``aux_<name>``, ``(y, x)``
    or ``(band, y, x)``; a 2-D layer is read as one band)."""
    import zarr
    from zarr.codecs import ShardingCodec

    root = open_store(url, options)
    store = root.zarr_store()
    try:
        # zarr_format=3: the products are Zarr v3 (zarr.json); without it zarr also asks for v2's .zattrs, .zgroup
        # and .zmetadata, three more requests per open on an object store
        group: Any = zarr.open_group(store, mode="r", zarr_format=3)
        arr: Any = group["data"] if array == "data" else None
    except (FileNotFoundError, KeyError) as e:
        raise ProductError(f"{url}: not a cubelake Zarr store (no 'data' array: {e}); give a <id>.zarr folder") from None
    if arr is None:
        if array not in group:
            layers = sorted(k for k in group.array_keys() if k.startswith("aux_"))
            raise ProductError(f"{url}: no array {array!r} in the store (aux layers there: {layers or 'none'}); "
                               "ingest the scene with --aux, or ask for a layer it has")
        arr = group[array]
    md: Any = arr.metadata
    if any(isinstance(c, ShardingCodec) for c in md.codecs):
        raise ProductError(f"{url}: sharded Zarr stores are not supported by the loader yet; "
                           "ingest with the default (unsharded) chunking, or load the scene's COG or refs instead")
    if arr.ndim not in ((2, 3) if array != "data" else (3,)):
        raise ProductError(f"{url}: {array} has {arr.ndim} dimensions, expected (band, y, x)")
    flat = arr.ndim == 2
    nb, h, w = (1, *arr.shape) if flat else arr.shape
    cb, ch, cw = (1, *arr.chunks) if flat else arr.chunks
    dtype = np.dtype(arr.dtype).newbyteorder("=")
    attrs = dict(arr.attrs)
    scale, offset = _cf(attrs)
    fill = attrs.get("_FillValue", md.fill_value)
    fill_v = _fill(fill)
    if fill_v is None and md.fill_value is not None:  # xarray writes a NaN _FillValue base64-encoded: the array's own
        fill_v = float(md.fill_value)
    wl = np.asarray(group["wavelength"][:], float) if "wavelength" in group else None
    fw = np.asarray(group["fwhm"][:], float) if "fwhm" in group else None
    stats = _stats_from_bands(record.bands) if record is not None else None
    if stats is None and "cubelake:band_stats" in attrs:
        bs = json.loads(attrs["cubelake:band_stats"])
        stats = {"mean": np.array([np.nan if v is None else v for v in bs["mean"]], float),
                 "std": np.array([np.nan if v is None else v for v in bs["std"]], float)}
    version = str(dict(group.attrs).get("cubelake:content_hash") or "")
    if not version and root.is_local:
        version = str(root.local_path(f"{array}/zarr.json").stat().st_mtime_ns)
    elif array != "data":
        version = f"{version}/{array}"
    base = url.rstrip("/") + f"/{array}/"
    grid = ChunkGrid(h, w, ch, cw)

    stored: set[str] = set()
    listed = False

    def stored_keys() -> set[str]:
        # zarr writes no object for an all-fill chunk; one listing tells which exist
        nonlocal listed
        if not listed:
            stored.update(o.key.removeprefix(f"{array}/") for o in root.list(array))
            listed = True
        return stored

    def locate(b: int, cy: int, cx: int) -> tuple[str, int, int] | None:
        k = md.encode_chunk_key((cy, cx) if flat else (b, cy, cx))
        return (base + k, 0, -1) if k in stored_keys() else None

    def present() -> np.ndarray:
        return _stored_chunks(grid, -(-nb // cb), locate)

    def labels() -> np.ndarray | None:
        if "labels" not in group:
            return None
        return np.asarray(group["labels"][:])

    crs, transform = _georef(dict(group["spatial_ref"].attrs)) if "spatial_ref" in group else (None, None)
    return ChunkSource(scene_id, "zarr", url, grid, nb, cb, dtype, fill_v, scale, offset, wl, fw, stats, version,
                       locate, _v3_decoder(md.codecs, dtype, (cb, ch, cw), url), labels, options, present,
                       crs_wkt=crs, transform=transform)

