"""What every product kind gives the loader: :class:`ChunkSource` (a chunk grid, where each chunk's bytes are,
how to decode them) and the small helpers the kinds share. One kind per module: :mod:`.zarr`, :mod:`.refs`, :mod:`.cog`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from cubelake.errors import CubelakeError
from cubelake.grid import ChunkGrid
from cubelake.record import SCENE_RECORD_FILE, Band, SceneRecord, read_scene_record
from cubelake.storage import S3Options

__all__ = ["ChunkSource", "Decoder", "Piece", "ProductError", "nodata_mask"]

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
    crs_wkt: str | None = field(repr=False, default=None)  # the grid's CRS (None: not georeferenced)
    transform: tuple[float, float, float, float, float, float] | None = field(repr=False, default=None)  # affine a..f

    def __reduce__(self) -> tuple[Any, ...]:
        # the locate/decode closures do not pickle; a spawned DataLoader worker reopens the product
        if self.open_args is None:
            raise TypeError(f"{self.url}: this ChunkSource was not made by open_source and cannot be sent to a worker")
        from ..sources import _reopen  # the opener sits above the kinds

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

    def empty_chunk(self, out: np.ndarray | None = None) -> np.ndarray:
        """A chunk of fill, in ``out`` (a ``uint8`` buffer of :attr:`chunk_nbytes`) if given."""
        fill = 0 if self.fill_value is None or (np.isnan(self.fill_value) and self.dtype.kind in "iu") else self.fill_value
        if out is None:
            return np.full(self.chunk_shape, fill, dtype=self.dtype)
        chunk = out.view(self.dtype).reshape(self.chunk_shape)
        chunk.fill(fill)
        return chunk

    def valid_chunks(self) -> np.ndarray | None:
        """``(ny, nx)``: which chunks are stored (an absent chunk is all fill, so it holds no valid pixel)."""
        return self.present()

    def labels(self) -> np.ndarray | None:
        return self.labels_loader()


# -- helpers ------------------------------------------------------------------------------------------


def nodata_mask(values: np.ndarray, fill: float | None) -> np.ndarray:
    """Where ``values`` (stored values, or a float32 copy of them) are nodata: NaN, or equal to the ``fill`` value.

    Stored values are exact in float32 for the integer types cubelake writes, so one test serves both.
    """
    mask = np.isnan(values) if values.dtype.kind == "f" else np.zeros(values.shape, bool)
    if fill is not None and np.isfinite(fill):
        mask |= values == np.asarray(fill).astype(values.dtype)
    return mask


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


def _georef(attrs: dict[str, Any]) -> tuple[str | None, tuple[float, float, float, float, float, float] | None]:
    """``(crs_wkt, affine a..f)`` from a CF grid mapping's attributes (GDAL ``GeoTransform`` is c a b f d e)."""
    crs = attrs.get("crs_wkt") or attrs.get("spatial_ref")
    try:
        gt = [float(v) for v in str(attrs.get("GeoTransform", "")).split()]
    except ValueError:
        gt = []
    if len(gt) != 6 or not all(np.isfinite(gt)):
        return (str(crs) if crs else None), None
    c, a, b, f, d, e = gt
    return (str(crs) if crs else None), (a, b, c, d, e, f)
