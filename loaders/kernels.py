"""The cut's inner loop, compiled: windows copied out of one decoded chunk, cast, scaled and tested for nodata in
one pass.

Why compiled (numba) rather than numpy: numpy copies a window ``chunk[:, r:r+h, c:c+w]`` into a
float32 batch one short row at a time (``w`` elements), and window after window it walks every band
of a 16 MiB chunk, so each source cache line is fetched for one 64-byte row and evicted before its
neighbours are used. On the bench cube (int16 chunks of 128 × 256 × 256, 64 windows of 32 × 32) that
cut took 9 ms per batch, against 3 ms for a plain contiguous cast of the same bytes. This loop goes
band by band instead — one 128 KiB band plane stays in cache while every window of the batch takes
its rows — and folds the CF scale/offset, normalisation and the nodata test into the same pass.

Every value is tested, always (``bench/cut_kernel.py``, medians per chunk): on the bench cube's chunks the
tested loop took 6.1 ms against 9.0 ms for the same loop without the test, on 96 × 128 × 128 uint16 chunks
cut into 24-px windows 0.98 against 0.89 ms. The loader used to run the untested loop on chunks that a
separate pass over each decoded chunk (3.9 / 0.69 ms, on the decode threads) had found free of nodata:
that pass cost more than the test it saved.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numba
import numpy as np

__all__ = ["PIECE_FIELDS", "cut_chunk", "stored_fill", "warm"]

# one row of ``pieces``: sample index in the batch, source rows [sy0, sy1) and cols [sx0, sx1) in the
# chunk, and the destination's top-left (dy0, dx0) in the window
PIECE_FIELDS = ("sample", "sy0", "sy1", "sx0", "sx1", "dy0", "dx0")


@numba.njit(nogil=True, cache=True, boundscheck=False)
def _cut(chunk: Any, bands: Any, out: Any, pieces: Any, gain: Any, offset: Any,  # pragma: no cover
         fillv: float, fill: Any, bad: Any, b0: int, b1: int) -> None:
    # (numba compiles this; coverage cannot see inside, the tests check its results against numpy)
    for bi in range(b0, b1):
        plane = chunk[bands[bi]]
        g = gain[bi]
        o = offset[bi]
        for p in range(pieces.shape[0]):
            i = pieces[p, 0]
            sy0, sy1, sx0, sx1 = pieces[p, 1], pieces[p, 2], pieces[p, 3], pieces[p, 4]
            dy0, dx0 = pieces[p, 5], pieces[p, 6]
            dst = out[i, bi]
            nx = sx1 - sx0
            n_bad = 0
            for y in range(sy1 - sy0):
                src_row = plane[sy0 + y, sx0:sx1]
                dst_row = dst[dy0 + y, dx0:dx0 + nx]
                for x in range(nx):
                    v = np.float64(src_row[x])
                    if v != v or v == fillv:  # NaN, or the stored nodata value
                        dst_row[x] = fill
                        n_bad += 1
                    else:
                        dst_row[x] = np.float32(src_row[x]) * g + o
            bad[i] += n_bad


def cut_chunk(chunk: np.ndarray, bands: np.ndarray, out: np.ndarray, pieces: np.ndarray, gain: np.ndarray,
              offset: np.ndarray, fill_value: float | None, fill: float, bad: np.ndarray,
              band_range: tuple[int, int] | None = None) -> None:
    """Copy ``pieces`` (int64 rows of :data:`PIECE_FIELDS`) of ``chunk`` ``(band, y, x)`` into ``out``
    ``(sample, band, y, x)`` float32: ``out = stored * gain + offset`` per selected band (``bands``, int64
    indices into the chunk; ``gain``/``offset`` float32, one per selected band). A stored NaN or
    ``fill_value`` pixel (compared in the chunk's type, :func:`stored_fill`) is written as ``fill`` instead
    and counted in ``bad[sample]``. ``band_range``: only the selected bands ``[b0, b1)`` (output bands too).

    Every value is tested, always: the test costs nothing measurable here (the loop is bound by its
    writes; an unchecked variant was no faster, ``bench/cut_kernel.py``), so no separate pass over each
    decoded chunk is needed to find out whether it holds nodata at all.
    """
    if not chunk.flags.c_contiguous:  # one compiled layout: a strided chunk would compile another
        chunk = np.ascontiguousarray(chunk)
    b0, b1 = band_range if band_range is not None else (0, bands.shape[0])
    _cut(chunk, bands, out, pieces, gain, offset, stored_fill(fill_value, chunk.dtype), np.float32(fill), bad, b0, b1)


def stored_fill(fill_value: float | None, dtype: np.dtype[Any]) -> float:
    """``fill_value`` as the stored type holds it (a float type rounds it), NaN when no stored value can equal it."""
    if fill_value is None or not np.isfinite(fill_value):
        return float("nan")
    if dtype.kind == "f":
        return float(np.asarray(fill_value).astype(dtype))
    if dtype.kind not in "iu":
        return float("nan")
    info = np.iinfo(dtype)
    if fill_value != int(fill_value) or not info.min <= fill_value <= info.max:
        return float("nan")
    return float(fill_value)


def warm(dtypes: Iterable[np.dtype[Any]]) -> None:
    """Compile (or load from numba's cache) the cut for each stored type now, not inside the first batch.

    Loading a cached kernel still initialises LLVM (0.5–1 s); done when a dataset is built, it is paid
    once per process and inherited by forked DataLoader workers instead of stalling their first batch.
    """
    one = np.zeros((1, 1, 1, 1), np.float32)
    for dt in {np.dtype(d).newbyteorder("=") for d in dtypes}:
        cut_chunk(np.zeros((1, 1, 1), dt), np.zeros(1, np.int64), one, np.zeros((1, 7), np.int64),
                  np.ones(1, np.float32), np.zeros(1, np.float32), None, 0.0, np.zeros(1, np.int64))
