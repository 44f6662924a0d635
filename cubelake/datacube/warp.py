"""Read a scene window by window and warp it onto one output block with GDAL's warper.

A block warped from the part of a scene it needs equals the same pixels of the whole scene
warped at once, because three things are fixed that GDAL would otherwise vary with the chunking:

* the coordinate transform is exact: rasterio's ``reproject`` always approximates it to 1/8 pixel
  per warped chunk (rasterio 1.4 hard-codes the tolerance), so nearest-neighbour picks change with
  the chunk shape; a ``WarpedVRT`` with a 1e-9 pixel tolerance is used instead (``tolerance=0``
  with an explicit transform fails in rasterio 1.4.4: GDAL is given no transformer);
* the kernel scale ``XSCALE``/``YSCALE`` is fixed per scene (:func:`~.grid.kernel_scale`), where
  GDAL would estimate it per chunk;
* the window read holds every source pixel the kernel can reach: the block's outline carried into
  the scene's CRS (edges densified), plus ``radius / scale + 2`` pixels (:func:`margin_px`).

Values are decoded (CF scale/offset, fill -> NaN) to float32 before warping, so every kernel
works on physical values and NaN marks what no scene pixel covers.
"""

from __future__ import annotations

import contextlib
import functools
import math
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any, Literal, Protocol

import numpy as np
from affine import Affine

from cubelake.cube import CFEncoder
from cubelake.errors import CubelakeError
from cubelake.grid import Window
from cubelake.storage import S3Options, gdal_vsi_path, is_url, open_store

from .errors import DatacubeError
from .grid import SceneExtent, TargetGrid, apply, edge_pixels
from .scenes import CubeScene

__all__ = ["RESAMPLING", "TOLERANCE_PX", "Resampling", "SceneReader", "margin_px", "open_reader", "pieces",
           "source_window", "warp_block"]

Resampling = Literal["nearest", "bilinear", "cubic", "average"]
RESAMPLING: tuple[Resampling, ...] = ("nearest", "bilinear", "cubic", "average")
#: The warper's coordinate-transform tolerance, in source pixels (exact for every practical purpose).
TOLERANCE_PX = 1e-9
_RADIUS = {"nearest": 1.0, "bilinear": 1.0, "cubic": 2.0, "average": 1.0}  # kernel half-width, source pixels


@functools.lru_cache(maxsize=64)
def _crs(wkt: str) -> Any:
    from rasterio.crs import CRS

    return CRS.from_wkt(wkt)


def margin_px(resampling: Resampling, scale: tuple[float, float]) -> int:
    """Source pixels to read beyond a block's outline: the kernel's reach (wider when downsampling) plus 2."""
    return math.ceil(_RADIUS[resampling] / min(1.0, *scale)) + 2


def source_window(extent: SceneExtent, grid: TargetGrid, window: Window, margin: int) -> Window | None:
    """The scene's pixels a block of ``grid`` needs (``margin`` pixels around its outline); ``None`` if none."""
    from rasterio.warp import transform

    cols, rows = edge_pixels(window.height, window.width)
    xs, ys = apply(grid.window_transform(window), cols, rows)
    sx, sy = transform(_crs(grid.crs_wkt), _crs(extent.crs_wkt), list(xs), list(ys))
    px, py = apply(~extent.affine, np.asarray(sx), np.asarray(sy))
    if not (np.isfinite(px).all() and np.isfinite(py).all()):
        return None  # the block lies where the scene's CRS cannot reach (far outside its area of use)
    c0 = max(0, math.floor(float(np.min(px))) - margin)
    r0 = max(0, math.floor(float(np.min(py))) - margin)
    c1 = min(extent.width, math.ceil(float(np.max(px))) + margin)
    r1 = min(extent.height, math.ceil(float(np.max(py))) + margin)
    if c1 <= c0 or r1 <= r0:
        return None
    return Window(r0, c0, r1 - r0, c1 - c0)


def _halves(window: Window) -> tuple[Window, Window]:
    if window.height >= window.width:
        h = window.height // 2
        return (Window(window.row_off, window.col_off, h, window.width),
                Window(window.row_off + h, window.col_off, window.height - h, window.width))
    w = window.width // 2
    return (Window(window.row_off, window.col_off, window.height, w),
            Window(window.row_off, window.col_off + w, window.height, window.width - w))


def pieces(extent: SceneExtent, grid: TargetGrid, window: Window, margin: int,
           max_pixels: int) -> list[tuple[Window, Window]]:
    """``(part of the block, source window)`` pairs covering a block, each source window at most ``max_pixels``.

    A block is halved until its source window fits (strong downsampling reads many source pixels
    per output pixel); the parts are smaller blocks, so the result is the same.
    """
    src = source_window(extent, grid, window, margin)
    if src is None:
        return []
    if src.size <= max_pixels or window.size <= 1:
        return [(window, src)]
    first, second = _halves(window)
    return (pieces(extent, grid, first, margin, max_pixels)
            + pieces(extent, grid, second, margin, max_pixels))


def warp_block(values: np.ndarray, src_transform: Affine, src_wkt: str, grid: TargetGrid, window: Window,
               resampling: Resampling, scale: tuple[float, float]) -> np.ndarray:
    """``values (band, y, x)`` (float32, NaN = none) at ``src_transform`` warped onto ``window`` of ``grid``."""
    from rasterio.enums import Resampling as GdalResampling
    from rasterio.io import MemoryFile
    from rasterio.vrt import WarpedVRT

    nb, h, w = values.shape
    with MemoryFile() as mem:
        with mem.open(driver="GTiff", width=w, height=h, count=nb, dtype="float32", crs=_crs(src_wkt),
                      transform=src_transform, nodata=np.nan, interleave="band") as dst:
            dst.write(values)
        with mem.open() as src, WarpedVRT(
            src, crs=_crs(grid.crs_wkt), transform=grid.window_transform(window), width=window.width,
            height=window.height, resampling=GdalResampling[resampling], tolerance=TOLERANCE_PX,
            src_nodata=np.nan, nodata=np.nan, dtype="float32", XSCALE=scale[0], YSCALE=scale[1],
        ) as vrt:
            return np.asarray(vrt.read(), dtype=np.float32)


class SceneReader(Protocol):
    """Reads a window of a scene's cube as decoded ``(band, y, x)`` float32, NaN where there is no value."""

    def read(self, window: Window) -> np.ndarray: ...

    def close(self) -> None: ...


def _decoded(stored: np.ndarray, encoding: CFEncoder) -> np.ndarray:
    return encoding.decode(stored).astype(np.float32)


class ZarrReader:
    """A scene's native Zarr ``data (band, y, x)`` (local or on an object store); reads are thread-safe."""

    def __init__(self, scene: CubeScene, options: S3Options | None) -> None:
        import zarr

        self.scene = scene
        store = open_store(scene.product_url, options).zarr_store(read_only=True)
        with _reading(scene):
            self.array = zarr.open_array(store, path="data", mode="r")

    def read(self, window: Window) -> np.ndarray:
        with _reading(self.scene):
            stored = self.array[:, window.row_off:window.row_end, window.col_off:window.col_end]
        return _decoded(np.asarray(stored), self.scene.encoding)

    def close(self) -> None:
        """Nothing to release (zarr reads object by object)."""


class CogReader:
    """A scene's COG, read through GDAL (``/vsis3/`` on S3); one dataset handle per reading thread."""

    def __init__(self, scene: CubeScene, options: S3Options | None) -> None:
        self.scene = scene
        remote = is_url(scene.product_url)
        self.path = gdal_vsi_path(scene.product_url) if remote else scene.product_url
        s3 = S3Options.coerce(options)
        self._env: Callable[[], AbstractContextManager[Any]] = s3.gdal_env if remote else contextlib.nullcontext
        self._local = threading.local()
        self._open: list[Any] = []
        self._lock = threading.Lock()

    def _dataset(self) -> Any:
        import rasterio

        ds = getattr(self._local, "ds", None)
        if ds is None:
            ds = rasterio.open(self.path)
            self._local.ds = ds
            with self._lock:
                self._open.append(ds)
        return ds

    def read(self, window: Window) -> np.ndarray:
        from rasterio.windows import Window as RioWindow

        with self._env(), _reading(self.scene):
            stored = self._dataset().read(window=RioWindow(window.col_off, window.row_off, window.width,
                                                           window.height))
        return _decoded(stored, self.scene.encoding)

    def close(self) -> None:
        with self._lock:
            for ds in self._open:
                ds.close()
            self._open.clear()


@contextlib.contextmanager
def _reading(scene: CubeScene) -> Iterator[None]:
    """Failures of the reading libraries (GDAL, zarr, codecs) as a :class:`DatacubeError` naming the product."""
    try:
        yield
    except CubelakeError:
        raise
    except Exception as exc:  # rasterio, zarr and the codecs raise many types for a damaged or missing product
        raise DatacubeError(f"scene {scene.scene_id}: reading its {scene.product} product {scene.product_url} failed "
                            f"({type(exc).__name__}: {exc}); check it with 'cubelake lake --lake ...' or re-ingest "
                            "the scene") from exc


def open_reader(scene: CubeScene, options: S3Options | None = None) -> SceneReader:
    """The reader of the product the scene is built from (its Zarr, else its COG)."""
    if scene.product == "zarr":
        return ZarrReader(scene, options)
    return CogReader(scene, options)
