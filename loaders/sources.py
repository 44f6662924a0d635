"""A product as the loader sees it: a chunk grid, where each chunk's bytes are, and how to decode them.

Three kinds, one interface (:class:`ChunkSource`):

* ``zarr`` — a native Zarr v3 store (``<id>.zarr``, local or ``s3://``); metadata read by zarr-python.
* ``refs`` — kerchunk references (``<id>.refs.json`` / ``.refs.parq``): chunks are byte ranges of TIFF
  tiles; metadata through :mod:`cubelake.refs` (which checks the targets are allowed and unchanged).
* ``cog`` — a tiled GeoTIFF: its references are built from the header (``cubelake.refs.build_refs``).

Decoding uses the codecs' own libraries (numcodecs' blosc/zstd/gzip/crc32c, imagecodecs for TIFF
tiles); the loader only decides which bytes to fetch, when, and where the result goes.
"""

from __future__ import annotations

import json
import logging
import random
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from cubelake.errors import CubelakeError
from cubelake.products import scene_product
from cubelake.record import SCENE_RECORD_FILE, Band, SceneRecord, read_scene_record
from cubelake.storage import (
    S3Options,
    error_line,
    is_transient,
    is_url,
    join_url,
    open_store,
    parent_url,
)

from .plan import ChunkGrid

__all__ = ["ChunkSource", "Piece", "ProductError", "ProductLike", "open_source", "open_sources"]

log = logging.getLogger(__name__)

ProductLike = Any  # str | Path | catalog SearchHit | STAC item dict
PRODUCT_PREFERENCE = ("zarr", "refs", "cog")


class ProductError(CubelakeError, ValueError):
    """A product the loader cannot read (names the product, what is wrong, and what to do)."""


@dataclass(frozen=True, slots=True)
class Piece:
    """Stored bytes of bands ``[band_start, band_stop)`` of one spatial chunk: ``length < 0`` = whole object."""

    url: str
    offset: int
    length: int
    band_start: int
    band_stop: int


Decoder = Callable[[bytes | memoryview, "np.ndarray | None"], np.ndarray]  # (stored bytes, reusable output buffer)


@dataclass(slots=True)
class ChunkSource:
    """One scene's product: its grid, bands, encoding, and how to find and decode a chunk's bytes."""

    scene_id: str
    kind: str
    url: str
    grid: ChunkGrid
    n_bands: int
    band_chunk: int  # bands per stored chunk
    dtype: np.dtype[Any]  # decoded (native byte order)
    fill_value: float | None
    scale: float
    add_offset: float
    wavelengths_nm: np.ndarray | None
    fwhm_nm: np.ndarray | None
    stats: dict[str, np.ndarray] | None  # physical per-band mean/std recorded at ingest
    version: str  # changes when the product changes (disk-cache key)
    locate: Callable[[int, int, int], tuple[str, int, int] | None] = field(repr=False)  # (band chunk, cy, cx)
    decoder: Decoder = field(repr=False)
    labels_loader: Callable[[], np.ndarray | None] = field(repr=False, default=lambda: None)
    storage_options: S3Options | None = field(repr=False, default=None)
    present: Callable[[], np.ndarray | None] = field(repr=False, default=lambda: None)
    open_args: dict[str, Any] | None = field(repr=False, default=None)

    def __reduce__(self) -> tuple[Any, ...]:
        # the locate/decode closures do not pickle; a spawned DataLoader worker reopens the product
        if self.open_args is None:
            raise TypeError(f"{self.url}: this ChunkSource was not made by open_source and cannot be sent to a worker")
        return (_reopen, (self.open_args, self.stats))

    @property
    def chunk_shape(self) -> tuple[int, int, int]:
        return (self.n_bands, self.grid.chunk_y, self.grid.chunk_x)

    @property
    def chunk_nbytes(self) -> int:
        return self.n_bands * self.grid.chunk_y * self.grid.chunk_x * self.dtype.itemsize

    def pieces(self, cy: int, cx: int) -> list[Piece]:
        """Where the chunk's bytes are; empty when no band chunk is stored (all fill)."""
        out = []
        for b in range(-(-self.n_bands // self.band_chunk)):
            loc = self.locate(b, cy, cx)
            if loc is not None:
                out.append(Piece(loc[0], loc[1], loc[2], b * self.band_chunk, min(self.n_bands, (b + 1) * self.band_chunk)))
        return out

    def empty_chunk(self) -> np.ndarray:
        fill = 0 if self.fill_value is None or (np.isnan(self.fill_value) and self.dtype.kind in "iu") else self.fill_value
        return np.full(self.chunk_shape, fill, dtype=self.dtype)

    def valid_chunks(self) -> np.ndarray | None:
        """``(ny, nx)``: which chunks are stored (an absent chunk is all fill, so it holds no valid pixel)."""
        return self.present()

    def labels(self) -> np.ndarray | None:
        return self.labels_loader()


# -- codecs -------------------------------------------------------------------------------------------


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


# -- helpers ------------------------------------------------------------------------------------------


def _scene_record(folder: Path) -> SceneRecord | None:
    """The folder's scene record, ``None`` if it has none; an unreadable one raises (naming the file)."""
    try:
        return read_scene_record(folder / SCENE_RECORD_FILE)
    except FileNotFoundError:
        return None


def _stats_from_bands(bands: Sequence[Band]) -> dict[str, np.ndarray] | None:
    """Physical per-band mean/std recorded at ingest (NaN where a band has none)."""
    mean = np.array([np.nan if b.mean is None else b.mean for b in bands], float)
    std = np.array([np.nan if b.std is None else b.std for b in bands], float)
    return {"mean": mean, "std": std} if mean.size else None


def _fill(v: Any) -> float | None:
    if v is None or (isinstance(v, str) and v not in ("NaN", "Infinity", "-Infinity")):
        return None
    return float(v)


def _cf(attrs: dict[str, Any]) -> tuple[float, float]:
    return float(attrs.get("scale_factor", 1.0)), float(attrs.get("add_offset", 0.0))


def _labels_tif(path: Path, shape: tuple[int, int]) -> Callable[[], np.ndarray | None]:
    def load() -> np.ndarray | None:
        import rasterio

        with rasterio.open(path) as src:
            if (src.height, src.width) != shape:
                raise ProductError(f"{path}: label raster is {src.height}x{src.width}, the scene is "
                                   f"{shape[0]}x{shape[1]}; give a label raster on the scene's grid")
            return np.asarray(src.read(1))
    return load


def _stored_chunks(grid: ChunkGrid, band_chunks: int, locate: Callable[[int, int, int], Any]) -> np.ndarray:
    """``(ny, nx)``: whether any band chunk of each spatial chunk is stored."""
    m = np.zeros((grid.n_rows, grid.n_cols), bool)
    for cy in range(grid.n_rows):
        for cx in range(grid.n_cols):
            m[cy, cx] = any(locate(b, cy, cx) is not None for b in range(band_chunks))
    return m


# -- openers ------------------------------------------------------------------------------------------


def _open_zarr(url: str, scene_id: str, options: S3Options | None, record: SceneRecord | None) -> ChunkSource:
    import zarr
    from zarr.codecs import ShardingCodec

    root = open_store(url, options)
    store = root.zarr_store()
    try:
        group: Any = zarr.open_group(store, mode="r")
        arr: Any = group["data"]
    except (FileNotFoundError, KeyError) as e:
        raise ProductError(f"{url}: not a cubelake Zarr store (no 'data' array: {e}); give a <id>.zarr folder") from None
    md: Any = arr.metadata
    if any(isinstance(c, ShardingCodec) for c in md.codecs):
        raise ProductError(f"{url}: sharded Zarr stores are not supported by the loader yet; "
                           "ingest with the default (unsharded) chunking, or load the scene's COG or refs instead")
    if arr.ndim != 3:
        raise ProductError(f"{url}: data has {arr.ndim} dimensions, expected (band, y, x)")
    nb, h, w = arr.shape
    cb, ch, cw = arr.chunks
    dtype = np.dtype(arr.dtype).newbyteorder("=")
    attrs = dict(arr.attrs)
    scale, offset = _cf(attrs)
    fill = attrs.get("_FillValue", md.fill_value)
    fill_v = _fill(fill)
    wl = np.asarray(group["wavelength"][:], float) if "wavelength" in group else None
    fw = np.asarray(group["fwhm"][:], float) if "fwhm" in group else None
    stats = _stats_from_bands(record.bands) if record is not None else None
    if stats is None and "cubelake:band_stats" in attrs:
        bs = json.loads(attrs["cubelake:band_stats"])
        stats = {"mean": np.array([np.nan if v is None else v for v in bs["mean"]], float),
                 "std": np.array([np.nan if v is None else v for v in bs["std"]], float)}
    version = str(dict(group.attrs).get("cubelake:content_hash") or "")
    if not version and root.is_local:
        version = str(root.local_path("data/zarr.json").stat().st_mtime_ns)
    base = url.rstrip("/") + "/data/"
    grid = ChunkGrid(h, w, ch, cw)

    stored: set[str] = set()
    listed = False

    def stored_keys() -> set[str]:
        # zarr writes no object for an all-fill chunk; one listing tells which exist
        nonlocal listed
        if not listed:
            stored.update(o.key.removeprefix("data/") for o in root.list("data"))
            listed = True
        return stored

    def locate(b: int, cy: int, cx: int) -> tuple[str, int, int] | None:
        k = md.encode_chunk_key((b, cy, cx))
        return (base + k, 0, -1) if k in stored_keys() else None

    def present() -> np.ndarray:
        return _stored_chunks(grid, -(-nb // cb), locate)

    def labels() -> np.ndarray | None:
        if "labels" not in group:
            return None
        return np.asarray(group["labels"][:])

    return ChunkSource(scene_id, "zarr", url, grid, nb, cb, dtype, fill_v, scale, offset, wl, fw, stats, version,
                       locate, _v3_decoder(md.codecs, dtype, (cb, ch, cw), url), labels, options, present)


def _open_refs(url: str, scene_id: str, options: S3Options | None, record: SceneRecord | None,
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
    return ChunkSource(scene_id, kind, url, grid, nb, cb, dtype, fill_v, scale, offset, wl, fw, stats, version,
                       locate, _v2_decoder(zarray, (cb, ch, cw)), labels, options, present)


def _open_cog(url: str, scene_id: str, options: S3Options | None, record: SceneRecord | None,
              labels_path: Path | None) -> ChunkSource:
    from cubelake.refs.api import build_refs
    from cubelake.refs.formats import write_refs

    refs = build_refs(url, storage_options=options)
    tmp = Path(tempfile.mkdtemp(prefix="cubelake-cogrefs-"))
    try:  # the references are read into memory on opening; the file is only their way in
        path = write_refs(refs, tmp / f"{scene_id}.refs.json", "json")
        root = parent_url(url)
        return _open_refs(str(path), scene_id, options, record, [root], kind="cog", labels_path=labels_path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _scene_dir_source(folder: Path, prefer: Sequence[str], options: S3Options | None,
                      lake: str | Path | None = None) -> ChunkSource:
    record = _scene_record(folder)
    if record is None:
        raise ProductError(f"{folder}: no scene.json; give a lake scene folder, a .zarr store, refs or a COG")
    sid = record.scene_id
    products = record.products
    labels = folder / (record.labels.cog if record.labels is not None and record.labels.cog else f"{sid}.labels.tif")
    found = scene_product(folder, products, prefer)
    if found is not None:
        kind, p = found[0], str(found[1])
        if kind == "zarr":
            return _open_zarr(p, sid, options, record)
        if kind == "refs":
            return _open_refs(p, sid, options, record, [], labels_path=labels, lake=lake)
        return _open_cog(p, sid, options, record, labels)
    raise ProductError(f"{folder}: scene {sid} has none of the products {list(prefer)} (it has {sorted(products)}); "
                       "re-ingest with --products " + ",".join(prefer))


def _object_scene_source(url: str, prefer: Sequence[str], options: S3Options | None,
                         lake: str | Path | None) -> ChunkSource:
    """A scene of an object-store lake, resolved through its commit object to its published version."""
    from cubelake.object_lake import ObjectLake

    root, sep, sid = url.rstrip("/").rpartition("/scenes/")
    if not sep or "/" in sid:
        raise ProductError(f"{url}: not a lake scene (expected <lake>/scenes/<id>), a .zarr store, refs or a COG")
    try:
        lk = ObjectLake(root, create=False, options=options)
        record, location = lk.scene_record(sid), lk.scene_location(sid)
    except CubelakeError as exc:
        raise ProductError(f"{url}: {exc}") from None
    if record is None or location is None:
        raise ProductError(f"{url}: scene {sid} is not published in the lake {root}")
    products = record.products
    for kind in prefer:
        info = products.get(kind)
        if not info:
            continue
        p = join_url(location, info.path)
        if kind == "zarr":
            return _open_zarr(p, sid, options, record)
        if kind == "refs":
            return _open_refs(p, sid, options, record, [], lake=lake or root)
        return _open_cog(p, sid, options, record, None)
    raise ProductError(f"{url}: scene {sid} has none of the products {list(prefer)} (it has {sorted(products)})")


def open_source(product: ProductLike, *, prefer: Sequence[str] = PRODUCT_PREFERENCE, storage_options: S3Options | None = None,
                allowed_roots: Sequence[str] = (), labels: str | Path | None = None,
                lake: str | Path | None = None) -> ChunkSource:
    """A :class:`ChunkSource` for a lake scene folder, catalog hit or STAC item, ``.zarr`` store, refs or COG.

    ``prefer``: product kinds to try, in order, for scenes that have several. ``labels``: a
    label raster on the scene's grid (overrides the scene's own). ``lake``: the lake a catalog
    hit came from (hits name their item relative to it); reference sets of its scenes may also
    point into its allowed roots (a lake found on disk next to the product is not trusted).
    """
    args = {"product": product, "prefer": tuple(prefer), "storage_options": storage_options,
            "allowed_roots": tuple(allowed_roots), "labels": labels, "lake": lake}
    href = getattr(product, "href", None)
    if href is not None and not Path(href).is_absolute():
        if lake is None:
            raise ProductError(f"catalog hit {getattr(product, 'id', href)}: its item path {href} is relative to its lake; "
                               "pass lake=<the lake folder> too")
        product = join_url(str(lake), href) if is_url(str(lake)) else Path(lake) / href
    src = _open_retrying(product, lambda: _open_source(product, prefer, storage_options, allowed_roots, labels, lake))
    src.open_args = args
    return src


OPEN_ATTEMPTS = 4  # tries to open a product whose store fails in a way that may pass
_OPEN_BACKOFF_S = (0.2, 5.0)  # full-jitter backoff between them: base, cap


def _open_retrying(product: ProductLike, open_: Callable[[], ChunkSource]) -> ChunkSource:
    """``open_()``, asked again (full-jitter backoff, :data:`OPEN_ATTEMPTS` in all) when the store failed
    in a way that may pass. The metadata reads of an open go through zarr and GDAL, which give up on a
    body that times out or is cut (obstore's and GDAL's own retries, ``max_retries``, cover status codes,
    not those); a bad product or a refusal fails at once."""
    attempts = OPEN_ATTEMPTS
    for attempt in range(attempts):
        try:
            return open_()
        except Exception as exc:
            if not is_transient(exc):
                raise
            if attempt + 1 == attempts:
                raise ProductError(f"{_name(product)}: could not be opened: the store failed {attempts} times, last: "
                                   f"{error_line(exc)}; check the endpoint, or raise storage_options max_retries or "
                                   "request_timeout_s for a slow link") from None
            base, cap = _OPEN_BACKOFF_S
            delay = random.uniform(0, min(cap, base * 2**attempt))
            log.warning("%s: opening failed (%s); attempt %d of %d in %.2f s", _name(product), error_line(exc),
                        attempt + 2, attempts, delay)
            time.sleep(delay)
    raise AssertionError("unreachable")


def _name(product: ProductLike) -> str:
    return str(getattr(product, "href", None) or (product.get("id") if isinstance(product, dict) else product))


def _open_source(product: ProductLike, prefer: Sequence[str], storage_options: S3Options | None,
                 allowed_roots: Sequence[str], labels: str | Path | None, lake: str | Path | None) -> ChunkSource:
    href = str(product) if isinstance(product, Path) and product.name == "item.json" else None
    if isinstance(product, dict) and product.get("type") == "Feature":
        links = [ln["href"] for ln in product.get("links", []) if ln.get("rel") == "self"]
        href = links[0] if links else None
        if href is None:
            raise ProductError(f"STAC item {product.get('id')}: no self link; open its scene folder instead")
    if href is None and isinstance(product, str) and is_url(product) and product.endswith("/item.json"):
        href = product
    if href is not None:
        product = parent_url(href) if is_url(href) else Path(href).parent
    s = str(product)
    name = s.rstrip("/").rsplit("/", 1)[-1]
    if is_url(s):
        stem = name.split(".")[0]
        if not name.lower().endswith((".zarr", ".json", ".parq", ".parquet", ".tif", ".tiff")):
            return _with_labels(_object_scene_source(s, prefer, storage_options, lake), labels)
    else:
        p = Path(s)
        if not p.exists():
            raise ProductError(f"{s}: no such product; give a lake scene folder, a .zarr store, refs or a COG")
        if p.is_dir() and (p / "scene.json").exists():
            src = _scene_dir_source(p, prefer, storage_options, lake)
            return _with_labels(src, labels)
        stem = name.split(".")[0]
        s = str(p.resolve())
    low = name.lower()
    if low.endswith(".zarr") or low.endswith(".zarr/"):
        src = _open_zarr(s, stem, storage_options, None)
    elif low.endswith((".json", ".parq", ".parquet")):
        src = _open_refs(s, stem, storage_options, None, allowed_roots, lake=lake)
    elif low.endswith((".tif", ".tiff")):
        src = _open_cog(s, stem, storage_options, None, None)
    else:
        raise ProductError(f"{s}: unknown product type; expected a .zarr store, .refs.json/.refs.parq references, "
                           "a .tif COG or a lake scene folder")
    return _with_labels(src, labels)


def _reopen(args: dict[str, Any], stats: dict[str, np.ndarray] | None) -> ChunkSource:
    src = open_source(**args)
    src.stats = stats
    return src


def _with_labels(src: ChunkSource, labels: str | Path | None) -> ChunkSource:
    if labels is not None:
        src.labels_loader = _labels_tif(Path(labels), (src.grid.height, src.grid.width))
    return src


def open_sources(products: Sequence[ProductLike] | Any, **kw: Any) -> list[ChunkSource]:
    """:func:`open_source` for each product (a list, or a catalog search result)."""
    return [open_source(p, **kw) for p in products]
