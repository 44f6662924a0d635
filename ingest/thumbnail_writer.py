"""Read a scene's preview bands, decimated, and write ``thumbnail.png`` (the choices: :mod:`.thumbnail`).

Only the one or three bands shown are read, a window of whole blocks at a time, and averaged down
to the thumbnail's size as they come (:class:`~.thumbnail.BinnedMean`): from a GeoTIFF (the scene's
COG, or a source referenced in place; a COG's overviews are used when it has them) or from the Zarr
store. The whole cube is never in memory: one window of the bands shown (at most 64 MiB) and the
thumbnail's sums are. The PNG is written into the scene's staging folder, so it is published with the products.
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import rasterio
from rasterio.enums import Resampling
from rasterio.errors import NotGeoreferencedWarning
from rasterio.windows import Window

from .thumbnail import BandChoice, BinnedMean, ThumbnailSpec, compose, stored_valid, thumbnail_shape

__all__ = ["THUMBNAIL_FILE", "BandReader", "TiffBands", "WrittenThumbnail", "ZarrBands", "write_thumbnail"]

log = logging.getLogger(__name__)

#: The thumbnail's file name in a scene folder.
THUMBNAIL_FILE = "thumbnail.png"


#: The most bytes of one window read while binning (float64, the bands shown); a scene's full width fits
#: unless it is very wide, then the window is a whole number of blocks narrower.
_WINDOW_BYTES = 64 * 1024**2


class BandReader(Protocol):
    """Reads stored bands of a scene reduced to the thumbnail's size; what the thumbnail needs from a product."""

    def read(self, indices: Sequence[int], shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
        """Stored bands ``indices`` (0-based) averaged down to ``shape`` (y, x): float64 (band, y, x) means of
        the valid pixels, and where there was one."""
        ...


def _windows(scene_shape: tuple[int, int], block: tuple[int, int], channels: int) -> Iterator[Window]:
    """Windows of whole blocks covering the scene row by row, each at most ``_WINDOW_BYTES`` of float64."""
    (height, width), (bh, bw) = scene_shape, block
    per_column = max(1, bh) * channels * 8
    cols = max(bw, (_WINDOW_BYTES // per_column) // bw * bw)
    for row in range(0, height, bh):
        for col in range(0, width, cols):
            yield Window(col, row, min(cols, width - col), min(bh, height - row))


def _binned(read_window: Callable[[Window], np.ndarray], fill_value: float | None, channels: int,
            scene_shape: tuple[int, int], block: tuple[int, int], shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Mean of the valid pixels per thumbnail pixel, read window by window with ``read_window``."""
    acc = BinnedMean(channels, scene_shape, shape)
    for w in _windows(scene_shape, block, channels):
        data = read_window(w).astype(np.float64, copy=False)
        acc.add(data, stored_valid(data, fill_value), int(w.row_off), int(w.col_off))
    return acc.mean()


@dataclass(frozen=True, slots=True)
class TiffBands:
    """A GeoTIFF's bands: stored band ``i`` is the file's band ``band_numbers[i]`` (1-based).

    With overviews, GDAL's averaging read takes them (fast, and it honours nodata); without, the
    bands are read block row by block row, all of them in one request so each tile is decoded once
    (a pixel-interleaved COG keeps every band in each tile), and averaged here.
    """

    path: Path
    band_numbers: tuple[int, ...]
    fill_value: float | None

    def read(self, indices: Sequence[int], shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
        numbers = [self.band_numbers[i] for i in indices]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", NotGeoreferencedWarning)
            with rasterio.open(self.path) as ds:
                scene = (ds.height, ds.width)
                if scene != shape and ds.overviews(numbers[0]):
                    data = ds.read(indexes=numbers, out_shape=(len(numbers), *shape), out_dtype="float64",
                                   resampling=Resampling.average)
                    valid = stored_valid(data, self.fill_value)
                    return np.where(valid, data, np.nan), valid
                return _binned(lambda w: ds.read(indexes=numbers, window=w), self.fill_value, len(numbers), scene,
                               ds.block_shapes[0], shape)


@dataclass(frozen=True, slots=True)
class ZarrBands:
    """The ``array`` of a Zarr store laid out ``(band, y, x)``, read a row of chunks at a time."""

    path: Path
    array: str
    fill_value: float | None

    def read(self, indices: Sequence[int], shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
        import zarr

        arr = zarr.open_array(store=str(self.path), path=self.array, mode="r")
        _, height, width = arr.shape
        bands = np.asarray(indices, dtype=np.int64)

        def read_window(w: Window) -> np.ndarray:
            rows, cols = slice(w.row_off, w.row_off + w.height), slice(w.col_off, w.col_off + w.width)
            return np.asarray(arr.get_orthogonal_selection((bands, rows, cols)))

        chunks = (int(arr.chunks[1]), int(arr.chunks[2]))
        return _binned(read_window, self.fill_value, len(indices), (height, width), chunks, shape)


@dataclass(frozen=True, slots=True)
class WrittenThumbnail:
    """A written thumbnail: its file, size (bytes), image size (px) and the bands it shows."""

    path: Path
    bytes: int
    height: int
    width: int
    choice: BandChoice
    seconds: float


def write_thumbnail(reader: BandReader, choice: BandChoice, scene_shape: tuple[int, int], target: Path,
                    spec: ThumbnailSpec, scale_factor: float = 1.0, add_offset: float = 0.0) -> WrittenThumbnail:
    """Render the ``choice`` bands of a scene of ``scene_shape`` (y, x) px into the PNG ``target``.

    ``scale_factor``/``add_offset``: the stored values' CF encoding (decoded before the stretch, so a
    negative scale does not invert the image).
    """
    from PIL import Image  # only the ingest writes PNGs

    t0 = time.perf_counter()
    shape = thumbnail_shape(*scene_shape, spec.max_side)
    stored, valid = reader.read(choice.indices, shape)
    physical = np.where(valid, stored * scale_factor + add_offset, np.nan)
    image = compose(physical, valid, spec)
    Image.fromarray(image).save(target, format="PNG", optimize=True)  # (y, x, 4): RGBA; (y, x, 2): LA
    seconds = time.perf_counter() - t0
    log.debug("%s: %dx%d thumbnail (%s) in %.3f s", target, shape[1], shape[0], choice.mode, seconds)
    return WrittenThumbnail(target, target.stat().st_size, shape[0], shape[1], choice, seconds)
