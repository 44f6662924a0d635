"""``refs`` products: kerchunk references (``<id>.refs.json`` / ``.refs.parq``) whose chunks are byte ranges of
TIFF tiles; metadata through :mod:`cubelake.refs` (which checks the targets are allowed and unchanged), tiles
decoded by imagecodecs through the registered numcodecs codecs.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cubelake.errors import CubelakeError
from cubelake.grid import ChunkGrid
from cubelake.record import SceneRecord
from cubelake.storage import S3Options

from ._base import (
    ChunkSource,
    Decoder,
    ProductError,
    _cf,
    _fill,
    _georef,
    _labels_tif,
    _stats_from_bands,
    _stored_chunks,
)

__all__ = ["open_refs"]

def _v2_decoder(zarray: dict[str, Any], shape: tuple[int, ...]) -> Decoder:
    import numcodecs

    import cubelake.refs  # noqa: F401  (registers the TIFF tile and imagecodecs codecs)

    comp = numcodecs.get_codec(zarray["compressor"]) if zarray.get("compressor") else None
    filters = [numcodecs.get_codec(f) for f in zarray.get("filters") or []][::-1]
    dtype = np.dtype(zarray["dtype"])
    order = zarray.get("order", "C")

    def decode(raw: bytes | memoryview, out: np.ndarray | None = None) -> np.ndarray:
        buf: Any = comp.decode(raw) if comp is not None else raw
        for f in filters:
            buf = f.decode(buf)
        a = buf if isinstance(buf, np.ndarray) and buf.dtype == dtype.newbyteorder("=") else np.frombuffer(buf, dtype=dtype)
        a = a.reshape(shape, order=order)
        return a if a.dtype.isnative else a.astype(a.dtype.newbyteorder("="))

    return decode


def open_refs(url: str, scene_id: str, options: S3Options | None, record: SceneRecord | None,
               allowed_roots: Sequence[str], kind: str = "refs", labels_path: Path | None = None,
               lake: str | Path | None = None) -> ChunkSource:
    import zarr

    from cubelake.refs.api import open_store

    try:  # trusted: the set's own folder, the caller's lake and roots (never a lake.json found beside it)
        store = open_store(url, lake=lake, allowed_roots=allowed_roots, storage_options=options)
    except CubelakeError:  # already names the file and the fix (stale or disallowed target ...)
        raise
    except (OSError, ValueError) as e:
        raise ProductError(f"{url}: cannot open the references: {e}") from e
    refs = store.refs
    if "data/.zarray" not in refs.meta or len(json.loads(refs.meta["data/.zarray"])["shape"]) != 3:
        raise ProductError(f"{url}: the references hold no 'data' array (band, y, x); give a scene's "
                           "<id>.refs.json (a stacked cube is not a loader product)")
    zarray = json.loads(refs.meta["data/.zarray"])
    zattrs = json.loads(refs.meta.get("data/.zattrs", b"{}"))
    group: Any = zarr.open_group(store, mode="r", zarr_format=2)
    nb, h, w = zarray["shape"]
    cb, ch, cw = zarray["chunks"]
    sep = zarray.get("dimension_separator", ".")
    dtype = np.dtype(zarray["dtype"]).newbyteorder("=")
    try:  # attributes and inline coordinates come from an untrusted set: bad values name the product
        scale, offset = _cf(zattrs)
        fill_v = _fill(zattrs.get("_FillValue", zarray.get("fill_value")))
        wl = np.asarray(group["wavelength"][:], float) if "wavelength" in group else None
        fw = np.asarray(group["fwhm"][:], float) if "fwhm" in group else None
    except (ValueError, TypeError, RuntimeError) as e:
        raise ProductError(f"{url}: unreadable attributes or coordinates in the references ({e}); "
                           "re-create them with cubelake") from None
    stats = _stats_from_bands(record.bands) if record is not None else None
    # what the targets hold, not where they are or when they were copied (a moved lake keeps its cache)
    version = "|".join(t.content_key for t in refs.targets)
    grid = ChunkGrid(h, w, ch, cw)

    def locate(b: int, cy: int, cx: int) -> tuple[str, int, int] | None:
        v = refs.get(f"data/{b}{sep}{cy}{sep}{cx}")
        if v is None:
            return None
        if isinstance(v, bytes):
            raise ProductError(f"{url}: chunk {b}.{cy}.{cx} is inlined in the references; the loader reads byte ranges only")
        return v

    def present() -> np.ndarray:
        return _stored_chunks(grid, -(-nb // cb), locate)

    labels = _labels_tif(labels_path, (h, w)) if labels_path is not None and labels_path.exists() else (lambda: None)
    try:
        crs, transform = _georef(json.loads(refs.meta.get("spatial_ref/.zattrs", b"{}")))
    except (ValueError, TypeError):
        crs, transform = None, None  # an unreadable grid mapping: the scene is used without geography
    return ChunkSource(scene_id, kind, url, grid, nb, cb, dtype, fill_v, scale, offset, wl, fw, stats, version,
                       locate, _v2_decoder(zarray, (cb, ch, cw)), labels, options, present,
                       crs_wkt=crs, transform=transform)

