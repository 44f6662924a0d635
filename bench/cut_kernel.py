"""The batch cut's compiled kernel against the previous cut and against a plain cast of the same bytes.

One decoded chunk (the bench cube's: int16, 128 bands x 256 x 256; or ``--geometry 2``: uint16, 96 x 128 x 128
with 24-px windows, so windows straddle chunks and arrive as pieces) is cut into a float32 batch of windows
(64 windows of 32 x 32 or every 24-px piece the chunk holds), rotating over 4 batch buffers (128 MiB and more:
the writes go to memory, not to the CPU's cache). Timed, best and median of ``--repeats`` x 10 calls:

* ``cut``: :func:`cubelake.loaders.kernels.cut_chunk` — every value cast, scaled and tested for nodata;
* ``previous``: what one chunk cost before: a pass over every decoded chunk (on the decode threads) to find
  out whether it held any nodata, stopping at the first (``nodata pass``), then, for a chunk with none, the
  loop without the test (kept here as the baseline), else the same tested loop as ``cut``;
* ``cast``: ``np.copyto`` of the whole chunk into a contiguous float32 area, the ceiling's own cast (no
  windows, no test): the floor for writing these bytes out as float32.

With ``--fill`` a fifth of the chunk is nodata.

    python bench/cut_kernel.py --repeats 15 [--geometry 2] [--fill]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import numba
import numpy as np

from cubelake.loaders.kernels import cut_chunk, stored_fill


@numba.njit(nogil=True, boundscheck=False)
def _previous_unchecked(chunk: Any, bands: Any, out: Any, pieces: Any, gain: Any, offset: Any) -> None:
    for bi in range(bands.shape[0]):
        plane = chunk[bands[bi]]
        g, o = gain[bi], offset[bi]
        for p in range(pieces.shape[0]):
            i, sy0, sy1, sx0, sx1 = pieces[p, 0], pieces[p, 1], pieces[p, 2], pieces[p, 3], pieces[p, 4]
            dy0, dx0 = pieces[p, 5], pieces[p, 6]
            dst = out[i, bi]
            nx = sx1 - sx0
            for y in range(sy1 - sy0):
                src_row = plane[sy0 + y, sx0:sx1]
                dst_row = dst[dy0 + y, dx0:dx0 + nx]
                for x in range(nx):
                    dst_row[x] = np.float32(src_row[x]) * g + o


@numba.njit(nogil=True, boundscheck=False)
def _previous_holds(flat: Any, fill: Any) -> bool:
    f = fill[0]
    for start in range(0, flat.shape[0], 4096):
        hit = False
        for j in range(start, min(start + 4096, flat.shape[0])):
            hit |= flat[j] == f
        if hit:
            return True
    return False


def geometry(which: int, fill: bool) -> tuple[np.ndarray, np.ndarray, tuple[int, ...]]:
    """A chunk, its pieces (rows of ``PIECE_FIELDS``) and the batch's shape."""
    rng = np.random.default_rng(0)
    if which == 1:
        chunk = rng.integers(1, 4000, (128, 256, 256)).astype(np.int16)  # 0 is the nodata value
        rows = [(i, (i // 8) * 32, (i // 8) * 32 + 32, (i % 8) * 32, (i % 8) * 32 + 32, 0, 0) for i in range(64)]
        shape: tuple[int, ...] = (64, 128, 32, 32)
    else:  # 128-px chunks on a 24-px window grid of the scene: the chunk at (128, 128) holds 36 pieces
        chunk = rng.integers(1, 4000, (96, 128, 128)).astype(np.uint16)
        rows, edges = [], range(120, 264, 24)  # windows starting at 120, 144, ..., 240 overlap [128, 256)
        for a, wy in enumerate(edges):
            for b, wx in enumerate(edges):
                sy0, sy1, sx0, sx1 = max(wy, 128), min(wy + 24, 256), max(wx, 128), min(wx + 24, 256)
                rows.append((a * 6 + b, sy0 - 128, sy1 - 128, sx0 - 128, sx1 - 128, sy0 - wy, sx0 - wx))
        shape = (64, 96, 24, 24)
    if fill:
        chunk[:, : chunk.shape[1] // 2, : chunk.shape[2] * 2 // 5] = 0
    return chunk, np.array(rows, np.int64), shape


def timed(fn: Callable[[int], Any], repeats: int) -> tuple[float, float]:
    fn(0)  # compile / warm
    per = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for k in range(10):
            fn(k)
        per.append((time.perf_counter() - t0) / 10 * 1e3)
    return min(per), statistics.median(per)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--geometry", type=int, choices=(1, 2), default=1)
    ap.add_argument("--fill", action="store_true")
    a = ap.parse_args()
    chunk, pieces, shape = geometry(a.geometry, a.fill)
    nb = chunk.shape[0]
    bands, gain, off = np.arange(nb, dtype=np.int64), np.ones(nb, np.float32), np.zeros(nb, np.float32)
    outs = [np.ones(shape, np.float32) for _ in range(4)]
    areas = [np.ones(chunk.size, np.float32).reshape(chunk.shape) for _ in range(4)]
    bad = np.zeros(shape[0], np.int64)
    fill_at = np.array([stored_fill(0, chunk.dtype)], chunk.dtype)
    flat = chunk.reshape(-1)
    ref = np.zeros(shape, np.float32)
    _previous_unchecked(chunk, bands, ref, pieces, gain, off)
    got = np.zeros(shape, np.float32)
    cut_chunk(chunk, bands, got, pieces, gain, off, None, 0.0, bad)
    assert np.array_equal(got, ref), "the kernels disagree"
    rows = {
        "cut (every value tested)": timed(lambda k: cut_chunk(chunk, bands, outs[k % 4], pieces, gain, off, 0, 0.0, bad),
                                          a.repeats),
        "previous: unchecked cut": timed(lambda k: _previous_unchecked(chunk, bands, outs[k % 4], pieces, gain, off),
                                         a.repeats),
        "previous: nodata pass": timed(lambda k: _previous_holds(flat, fill_at), a.repeats),
        "cast (np.copyto, whole chunk)": timed(lambda k: np.copyto(areas[k % 4], chunk, casting="unsafe"), a.repeats),
    }
    values = int((pieces[:, 2] - pieces[:, 1]) @ (pieces[:, 4] - pieces[:, 3])) * nb
    print(f"geometry {a.geometry}: chunk {chunk.dtype} {chunk.shape}, {len(pieces)} pieces, {values / chunk.size:.0%} "
          f"of the chunk cut{', a fifth nodata' if a.fill else ''}; ms per chunk, best / median of {a.repeats}")
    for name, (best, med) in rows.items():
        print(f"  {name:32s} {best:6.2f} / {med:6.2f}")
    cut = rows["cut (every value tested)"][1]
    prev = rows["previous: nodata pass"][1] + (cut if a.fill else rows["previous: unchecked cut"][1])
    print(f"  previous (nodata pass + {'tested' if a.fill else 'unchecked'} cut) / cut, medians: {prev / cut:.2f}x; "
          f"cast / cut: {rows['cast (np.copyto, whole chunk)'][1] / cut:.2f}x")

if __name__ == "__main__":
    main()
