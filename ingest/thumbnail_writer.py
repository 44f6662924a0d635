"""Bin a scene's preview bands during the pixel pass, and write ``thumbnail.png`` (the choices: :mod:`.thumbnail`).

:class:`ThumbnailSink` is one more sink of the ingest's one pixel pass: it receives every stored
block (calibrated and encoded, in the product's values) as the COG and Zarr do, and averages the
few candidate bands down to the thumbnail's size as they come (:class:`~.thumbnail.BinnedMean`), so
nothing is read again after the pass. Memory is the sums and counts of the candidates only (at most
6 bands x 512 x 512 x 16 bytes = 25 MB). After the pass, :func:`write_thumbnail` decodes the chosen
bands' means, stretches them and writes the PNG into the scene's staging folder, so it is published
with the products.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cubelake.grid import Window

from .thumbnail import BandChoice, BinnedMean, ThumbnailSpec, compose, stored_valid, thumbnail_shape

__all__ = ["THUMBNAIL_FILE", "ThumbnailSink", "WrittenThumbnail", "write_thumbnail"]

log = logging.getLogger(__name__)

#: The thumbnail's file name in a scene folder.
THUMBNAIL_FILE = "thumbnail.png"


class ThumbnailSink:
    """A pixel-pass sink (:class:`~.scan.ChunkSink`) that bins the stored bands ``candidates`` (0-based, kept
    bands) of a scene of ``scene_shape`` (y, x) px to the thumbnail's size; thread-safe, blocks in any order.

    ``fill_value``: the stored fill value (``None``: only NaN is missing).
    """

    def __init__(self, candidates: Sequence[int], scene_shape: tuple[int, int], spec: ThumbnailSpec,
                 fill_value: float | None) -> None:
        if not candidates:
            raise ValueError("a thumbnail sink needs at least one band to accumulate")
        self.candidates = tuple(candidates)
        self.shape = thumbnail_shape(*scene_shape, spec.max_side)
        self.fill_value = fill_value
        self.seconds = 0.0  # time spent binning, summed over the pass's threads
        self._acc = BinnedMean(len(self.candidates), scene_shape, self.shape)
        self._lock = threading.Lock()

    def write(self, window: Window, data: np.ndarray) -> None:
        """Bin the candidate bands of the stored block ``data`` (kept band, y, x) covering ``window``."""
        t0 = time.perf_counter()
        block = data[list(self.candidates)].astype(np.float64)
        part = self._acc.partial(block, stored_valid(block, self.fill_value), window.row_off, window.col_off)
        with self._lock:
            self._acc.merge(part)
            self.seconds += time.perf_counter() - t0

    def means(self, indices: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """Stored bands ``indices`` (each one of the candidates) averaged down to :attr:`shape`: float64
        (band, y, x) means of the valid stored values, and where there was one."""
        missing = [i for i in indices if i not in self.candidates]
        if missing:
            raise ValueError(f"bands {missing} (0-based) were not accumulated; the candidates are {self.candidates}")
        rows = [self.candidates.index(i) for i in indices]
        with self._lock:
            mean, valid = self._acc.mean()
        return mean[rows], valid[rows]


@dataclass(frozen=True, slots=True)
class WrittenThumbnail:
    """A written thumbnail: its file, size (bytes), image size (px), the bands it shows, and the seconds it
    took after the pass (stretch and PNG)."""

    path: Path
    bytes: int
    height: int
    width: int
    choice: BandChoice
    seconds: float


def write_thumbnail(sink: ThumbnailSink, choice: BandChoice, target: Path, spec: ThumbnailSpec,
                    scale_factor: float = 1.0, add_offset: float = 0.0) -> WrittenThumbnail:
    """Render the ``choice`` bands binned by ``sink`` into the PNG ``target``.

    ``scale_factor``/``add_offset``: the stored values' CF encoding (decoded before the stretch, so a
    negative scale does not invert the image; the decoding is linear, so decoding the means is decoding
    each value and averaging).
    """
    from PIL import Image  # only the ingest writes PNGs

    t0 = time.perf_counter()
    stored, valid = sink.means(choice.indices)
    physical = np.where(valid, stored * scale_factor + add_offset, np.nan)
    image = compose(physical, valid, spec)
    Image.fromarray(image).save(target, format="PNG", optimize=True)  # (y, x, 4): RGBA; (y, x, 2): LA
    seconds = time.perf_counter() - t0
    height, width = sink.shape
    log.debug("%s: %dx%d thumbnail (%s) in %.3f s after the pass, %.3f s binning in it", target, width, height,
              choice.mode, seconds, sink.seconds)
    return WrittenThumbnail(target, target.stat().st_size, height, width, choice, seconds)
