"""Native Zarr v3 product: a group holding ``data (band, y, x)`` and its coordinates.

Metadata is written by xarray (so xarray/rioxarray read the store with the conventions they
expect: dimension names, CF ``scale_factor``/``add_offset``/``_FillValue``, coordinates, a CF
grid mapping with ``crs_wkt`` and ``GeoTransform``); pixels are then written chunk by chunk
(or shard by shard) with zarr-python, so memory never holds more than a few units.

xarray, dask and zarr are imported when a store is written, not with the module: together
they add about a second to every ``cubelake`` start, including runs that write no Zarr.
"""

from __future__ import annotations

import os
import threading
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
    """Writes stored ``(band, y, x)`` units into the ``data`` array. Thread-safe for disjoint units.

    Each whole chunk of an unsharded Blosc array is encoded here and written as its file: the bytes
    zarr-python writes (little-endian bytes, the array's Blosc; a chunk of nothing but the fill value
    is left out, as zarr's ``write_empty_chunks=False``), without zarr's per-chunk async machinery
    (about 15 ms of CPU per 16 MiB chunk, measured with py-spy: the Zarr conversion ran behind
    ``xarray.to_zarr`` on 2 cores) and with a copy of the source's layout only when it is not the chunk's. Each file's size and
    BLAKE3 are kept in ``hashes`` (path relative to the store), so the store's tree hash need not read
    them back. Other arrays and windows go through zarr-python.
    """

    def __init__(self, path: Path, name: str = "data") -> None:
        import zarr

        self.array = zarr.open_array(str(path), path=name, mode="r+")
        self.hashes: dict[str, tuple[int, str]] = {}  # "data/c/0/3/5" -> (bytes, BLAKE3 hex) of files written here
        self._name = name
        self._root = Path(path) / name
        self._codec = _direct_codec(self.array)
        self._chunks: tuple[int, ...] = tuple(self.array.chunks)
        self._fill = self.array.metadata.fill_value
        self._lock = threading.Lock()
        self._local = threading.local()

    def write(self, window: Window, data: np.ndarray) -> None:
        coords = self._chunk_coords(window, data) if self._codec is not None else None
        if coords is None:
            if data.ndim == 2:
                self.array[window.row_off : window.row_end, window.col_off : window.col_end] = data
            else:
                self.array[:, window.row_off : window.row_end, window.col_off : window.col_end] = data
            return
        chunk = self._chunk_array(data)
        key = "c/" + "/".join(str(c) for c in coords)
        target = self._root / key
        if _all_fill(chunk, self._fill):
            target.unlink(missing_ok=True)
            with self._lock:
                self.hashes.pop(f"{self._name}/{key}", None)
            return
        assert self._codec is not None
        encoded = self._codec.encode(chunk.reshape(-1).view(np.uint8))
        _write_atomic(target, encoded)
        from blake3 import blake3

        digest = blake3(encoded).hexdigest()
        with self._lock:
            self.hashes[f"{self._name}/{key}"] = (len(encoded), digest)

    def _chunk_coords(self, window: Window, data: np.ndarray) -> tuple[int, ...] | None:
        """The chunk ``window`` is exactly (edge chunks end at the array's edge), or ``None``."""
        shape, chunks = self.array.shape, self._chunks
        cy, cx = chunks[-2], chunks[-1]
        if data.ndim != len(shape) or (data.ndim == 3 and (data.shape[0] != shape[0] or chunks[0] != shape[0])):
            return None
        if window.row_off % cy or window.col_off % cx:
            return None
        if window.row_end != min(window.row_off + cy, shape[-2]) or window.col_end != min(window.col_off + cx, shape[-1]):
            return None
        yx = (window.row_off // cy, window.col_off // cx)
        return (0, *yx) if data.ndim == 3 else yx

    def _chunk_array(self, data: np.ndarray) -> np.ndarray:
        """``data`` as the C-contiguous full chunk: itself when it is one, else copied into this thread's buffer."""
        full = data.shape[-2:] == self._chunks[-2:]
        if full and data.flags.c_contiguous and data.dtype == self.array.dtype:
            return data
        buf: np.ndarray | None = getattr(self._local, "buf", None)
        if buf is None:
            buf = np.empty(self._chunks, dtype=self.array.dtype)
            self._local.buf = buf
        if not full:
            buf.fill(self._fill)
        h, w = data.shape[-2:]
        if data.ndim == 3 and data.strides[0] == data.itemsize and full:
            to_band_major(data.transpose(1, 2, 0), buf)
        else:
            buf[..., :h, :w] = data
        return buf


def _direct_codec(array: Any) -> Any:
    """The numcodecs Blosc that zarr-python encodes ``array``'s chunks with, when the sink can write them
    itself (zarr v3, no shards, bytes + Blosc, default "/" chunk keys, empty chunks left out); else ``None``."""
    import sys

    from numcodecs import Blosc
    from zarr.codecs import BloscCodec, BytesCodec
    from zarr.core.chunk_key_encodings import DefaultChunkKeyEncoding

    meta = array.metadata
    if meta.zarr_format != 3 or array.shards is not None or sys.byteorder != "little":
        return None
    codecs = meta.codecs
    if (len(codecs) != 2 or not isinstance(codecs[0], BytesCodec) or not isinstance(codecs[1], BloscCodec)
            or (codecs[0].endian is not None and codecs[0].endian.value != "little")):
        return None
    key_enc = meta.chunk_key_encoding
    if not isinstance(key_enc, DefaultChunkKeyEncoding) or key_enc.separator != "/":
        return None
    if array.async_array.config.write_empty_chunks or array.dtype.kind not in "biuf":
        return None
    blosc = codecs[1]
    shuffle = {"noshuffle": 0, "shuffle": 1, "bitshuffle": 2}[blosc.shuffle.value]
    return Blosc.from_config({"cname": blosc.cname.name, "clevel": blosc.clevel, "shuffle": shuffle,
                              "blocksize": blosc.blocksize, "typesize": blosc.typesize or array.dtype.itemsize})


def _all_fill(chunk: np.ndarray, fill: Any) -> bool:
    """zarr-python's test for a chunk it leaves out (``NDBuffer.all_equal``: NaN equals NaN, +0.0 is not -0.0),
    with a quick answer from the first value, which almost always differs."""
    fill_arr = np.asarray(fill, dtype=chunk.dtype)
    first = chunk.reshape(-1)[:1]
    if chunk.dtype.kind == "f":
        bits = f"u{chunk.dtype.itemsize}"
        if float(fill) == 0.0:
            return bool(np.array_equal(chunk.view(bits), np.broadcast_to(fill_arr.view(bits), chunk.shape)))
        if not np.array_equal(first, fill_arr.reshape(1), equal_nan=True):
            return False
        return bool(np.array_equal(chunk, np.broadcast_to(fill_arr, chunk.shape), equal_nan=True))
    if first.size and first[0] != fill_arr:
        return False
    return bool((chunk == fill_arr).all())


def to_band_major(pixels: np.ndarray, out: np.ndarray, pixel_step: int = 1024, band_step: int = 64) -> np.ndarray:
    """``(y, x, band)`` -> ``(band, y, x)`` into C-contiguous ``out``, transposed in cache-sized blocks (numpy's
    plain transposed copy strides a whole band apart for every element)."""
    h, w, nb = pixels.shape
    src = pixels.reshape(h * w, nb)
    dst = out.reshape(nb, h * w)
    for p0 in range(0, h * w, pixel_step):
        for b0 in range(0, nb, band_step):
            dst[b0 : b0 + band_step, p0 : p0 + pixel_step] = src[p0 : p0 + pixel_step, b0 : b0 + band_step].T
    return out


def _write_atomic(path: Path, data: bytes) -> None:
    """Write a chunk file as zarr's LocalStore does: beside it, then renamed over it."""
    import uuid

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{uuid.uuid4().hex}.partial")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


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
