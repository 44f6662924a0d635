"""Geo-aware training: geohash cells of samples, regional sharding, hot-region downsampling, loss weights. Pure.

Each window of a :class:`~cubelake.loaders.plan.SampleTable` is named by the geohash cell of its
centre (precision 6 is ~1.2 km x 0.6 km). Cells then drive three things:

- *Sharding* (``PlanSpec(shard_by="geohash")``): samples in geohash order (a Z-order curve, so a
  run of it is a compact region with short borders) are cut into one run per rank by
  :func:`balanced_cuts`, between whole cells where the ranks still balance within 5 %, so a node
  reads its own region. (Whole-cell LPT balances too but scatters neighbouring cells over the ranks,
  and most chunks end up read by two of them: bench/geo.py measured 205 of 240 against 93.)
- *Downsampling* hot regions: a sample of a cell holding ``n`` samples is kept with probability
  ``1 / (1 + log1p(n))`` (:func:`keep_probability`, :func:`downsample`), seeded per epoch.
- *Loss weights* for sparse regions: ``1 + alpha * (1 - density)`` with ``density = n_cell /
  max(n_cell)`` (:func:`loss_weights`).

A scene without a georeference gets the pseudo-cell ``"~scene<i>"`` (``~`` is outside the
geohash alphabet and sorts after it), so it shards as one unit and never shares a cell.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np
from pyproj import CRS, Transformer
from pyproj.exceptions import CRSError

from cubelake.geohash import encode_many

if TYPE_CHECKING:
    from .plan import SampleTable

__all__ = [
    "Georef",
    "balanced_cuts",
    "cell_counts",
    "downsample",
    "downsample_counts",
    "keep_probability",
    "load_ratio",
    "loss_weights",
    "sample_cells",
    "scene_cell",
]

Transform6 = tuple[float, float, float, float, float, float]


@dataclass(frozen=True, slots=True)
class Georef:
    """Where a scene's pixels are: a CRS (WKT, or anything pyproj reads) and a GDAL-style affine.

    ``transform`` is ``(a, b, c, d, e, f)`` in :class:`affine.Affine` order: ``x = a*col + b*row + c``,
    ``y = d*col + e*row + f``, with ``(row, col)`` the pixel's top-left corner.
    """

    crs_wkt: str
    transform: Transform6

    def __post_init__(self) -> None:
        if not isinstance(self.crs_wkt, str) or not self.crs_wkt.strip():
            raise ValueError(f"Georef.crs_wkt must be a non-empty CRS string (WKT or 'EPSG:n'), got {self.crs_wkt!r}")
        t = tuple(self.transform)
        if len(t) != 6 or not all(isinstance(v, int | float | np.number) and math.isfinite(v) for v in t):
            raise ValueError(f"Georef.transform must be 6 finite numbers (a, b, c, d, e, f), got {self.transform!r}")
        t = tuple(float(v) for v in t)
        object.__setattr__(self, "transform", t)  # a list or numpy numbers in, a hashable tuple of floats kept
        a, b, _c, d, e, _f = t
        if a * e - b * d == 0:
            raise ValueError(f"Georef.transform {t} is degenerate (a*e - b*d == 0): pixels have no area")

    @classmethod
    def of(cls, crs_wkt: str | None, transform: Sequence[float] | None) -> Georef | None:
        """A Georef, or ``None`` when the scene lacks a CRS or a transform (e.g. ``CubeSpec.crs_wkt/transform``)."""
        if crs_wkt is None or transform is None:
            return None
        t = tuple(float(v) for v in transform)
        if len(t) != 6:
            raise ValueError(f"a geotransform has 6 numbers (a, b, c, d, e, f), got {len(t)}: {tuple(transform)!r}")
        return cls(crs_wkt, (t[0], t[1], t[2], t[3], t[4], t[5]))

    def to_lonlat(self, rows: np.ndarray, cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Longitude and latitude (degrees, EPSG:4326) of pixel centres ``(rows + 0.5, cols + 0.5)``.

        ``rows``/``cols``: pixel indices, same shape, may be fractional or outside the raster.
        Points the CRS cannot map come back as ``inf``.
        """
        r = np.asarray(rows, np.float64) + 0.5
        c = np.asarray(cols, np.float64) + 0.5
        if r.shape != c.shape:
            raise ValueError(f"rows and cols must have the same shape, got {r.shape} and {c.shape}")
        a, b, c0, d, e, f = self.transform
        x = a * c + b * r + c0
        y = d * c + e * r + f
        lon, lat = _to_wgs84(self.crs_wkt).transform(x, y)
        return np.asarray(lon, np.float64).reshape(r.shape), np.asarray(lat, np.float64).reshape(r.shape)


@lru_cache(maxsize=64)
def _to_wgs84(crs: str) -> Transformer:
    """One transformer per CRS (pyproj >= 3.1 transformers are thread-safe)."""
    try:
        src = CRS.from_user_input(crs)
    except CRSError as exc:
        shown = crs if len(crs) <= 80 else crs[:77] + "..."
        raise ValueError(f"Georef.crs_wkt {shown!r} is not a CRS pyproj can read ({exc}); pass WKT or 'EPSG:n'") from exc
    return Transformer.from_crs(src, "EPSG:4326", always_xy=True)


def scene_cell(scene: int) -> str:
    """The pseudo-cell of a scene without a georeference."""
    return f"~scene{int(scene)}"


def sample_cells(table: SampleTable, georefs: Sequence[Georef | None], precision: int = 6) -> np.ndarray:
    """The geohash cell of each window's centre, one string per table row (``'<U..'`` array).

    ``georefs[i]`` places scene ``i``; ``None`` gives every window of that scene the pseudo-cell
    ``"~scene<i>"`` (:func:`scene_cell`), so it shards as one unit. ``precision``: 1-12 characters.
    """
    rows = np.asarray(table.rows)
    n = rows.shape[0]
    if n and int(rows[:, 0].max()) >= len(georefs):
        raise ValueError(f"sample table names scene {int(rows[:, 0].max())} but georefs has {len(georefs)} entries: "
                         "pass one Georef (or None) per scene")
    scenes = np.unique(rows[:, 0]) if n else np.zeros(0, np.int64)
    labels: dict[int, np.ndarray] = {}
    for s in scenes.tolist():
        m = rows[:, 0] == s
        g = georefs[s]
        if g is None:
            labels[s] = np.full(int(m.sum()), scene_cell(s))
            continue
        # the window's centre, as a (fractional) pixel index: to_lonlat adds the half pixel
        lon, lat = g.to_lonlat(rows[m, 1] + (table.size[0] - 1) / 2, rows[m, 2] + (table.size[1] - 1) / 2)
        bad = ~(np.isfinite(lon) & np.isfinite(lat))
        if bad.any():
            raise ValueError(f"scene {s}: {int(bad.sum())} window centres do not map to lon/lat with its CRS; "
                             "check the scene's georeference, or pass None for it to shard it as one unit")
        labels[s] = encode_many(lon, lat, precision)
    width = max([precision, *(len(scene_cell(s)) for s in scenes.tolist())])
    out = np.empty(n, f"<U{width}")
    for s, lab in labels.items():
        out[rows[:, 0] == s] = lab
    return out


def cell_counts(cells: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(unique cells sorted, samples per cell, index of each sample's cell)``."""
    uniq, inverse, counts = np.unique(np.asarray(cells), return_inverse=True, return_counts=True)
    return uniq, counts.astype(np.int64), inverse.reshape(-1).astype(np.int64)


# -- hot regions and sparse regions --------------------------------------------------------------------


def _check_counts(counts: np.ndarray) -> np.ndarray:
    n = np.asarray(counts)
    if n.ndim != 1 or not np.issubdtype(n.dtype, np.number) or (n.size and (not np.isfinite(n).all() or n.min() < 0)):
        raise ValueError(f"cell counts must be a 1-D array of finite numbers >= 0, got {n!r:.200}")
    return n.astype(np.float64)


def keep_probability(counts: np.ndarray, fn: Callable[[np.ndarray], np.ndarray] | None = None) -> np.ndarray:
    """Per cell, the probability that one of its samples is kept this epoch.

    Default ``1 / (1 + log1p(n))`` for a cell of ``n`` samples (1 for an empty cell, ~0.13 at
    1000). ``fn``: your own rule, given the float counts and returning one probability in
    ``[0, 1]`` per cell; anything else raises ``ValueError``.
    """
    n = _check_counts(counts)
    if fn is None:
        return 1.0 / (1.0 + np.log1p(n))
    p = np.asarray(fn(n.copy()), np.float64)
    if p.shape != n.shape:
        raise ValueError(f"keep-probability function {getattr(fn, '__name__', fn)!r} returned shape {p.shape}; "
                         f"it must return one probability per cell, shape {n.shape}")
    finite = p[np.isfinite(p)]
    if finite.size < p.size or finite.min(initial=0.0) < 0 or finite.max(initial=0.0) > 1:
        raise ValueError(f"keep-probability function {getattr(fn, '__name__', fn)!r} returned values outside [0, 1] "
                         f"(min {finite.min(initial=0.0)}, max {finite.max(initial=0.0)}, "
                         f"{p.size - finite.size} not finite): return probabilities")
    return p


def downsample(cells_inverse: np.ndarray, probs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Bool mask over samples: sample ``i`` kept with probability ``probs[cells_inverse[i]]`` (one Bernoulli each).

    Seed ``rng`` per epoch (e.g. ``np.random.default_rng([seed, epoch])``) so every rank draws the same mask.
    """
    inv = np.asarray(cells_inverse, np.int64)
    p = np.asarray(probs, np.float64)
    if inv.size and (inv.min() < 0 or inv.max() >= p.size):
        raise ValueError(f"cells_inverse holds cell indices up to {int(inv.max())} but probs has {p.size} cells")
    return rng.random(inv.size) < p[inv]


def downsample_counts(cells_inverse: np.ndarray, mask: np.ndarray, n_cells: int) -> tuple[np.ndarray, np.ndarray]:
    """Per cell, ``(samples before, samples kept)`` by a :func:`downsample` mask (for metrics)."""
    inv = np.asarray(cells_inverse, np.int64)
    keep = np.asarray(mask, bool)
    if keep.shape != inv.shape:
        raise ValueError(f"mask has shape {keep.shape}, cells_inverse {inv.shape}: one flag per sample")
    before = np.bincount(inv, minlength=n_cells).astype(np.int64)
    kept = np.bincount(inv[keep], minlength=n_cells).astype(np.int64)
    return before, kept


def loss_weights(counts: np.ndarray, inverse: np.ndarray, alpha: float) -> np.ndarray:
    """Per sample, the loss weight ``1 + alpha * (1 - density)`` of its cell.

    ``density = n_cell / max(n_cell)``: 1 in the densest cell (weight 1), near 0 in the sparsest
    (weight near ``1 + alpha``). ``counts``: samples per cell; ``inverse``: each sample's cell
    index; ``alpha`` >= 0.
    """
    if not (isinstance(alpha, int | float) and math.isfinite(alpha) and alpha >= 0):
        raise ValueError(f"loss-weight alpha must be a finite number >= 0, got {alpha!r}")
    n = _check_counts(counts)
    inv = np.asarray(inverse, np.int64)
    if inv.size and (inv.min() < 0 or inv.max() >= n.size):
        raise ValueError(f"inverse holds cell indices up to {int(inv.max())} but counts has {n.size} cells")
    top = n.max(initial=0.0)
    density = n / top if top > 0 else np.zeros_like(n)
    return (1.0 + alpha * (1.0 - density))[inv]


# -- balancing cells over bins -------------------------------------------------------------------------


def load_ratio(loads: Sequence[float] | np.ndarray) -> float:
    """``max / min`` of bin loads: 1.0 when all are equal (or all zero), ``inf`` when one is empty and another is not."""
    x = np.asarray(loads, np.float64)
    if x.size == 0 or x.max() == 0:
        return 1.0
    return float(x.max() / x.min()) if x.min() > 0 else math.inf


def _check_bins(bins: int) -> None:
    if isinstance(bins, bool) or not isinstance(bins, int | np.integer) or bins < 1:
        raise ValueError(f"bins must be an integer >= 1, got {bins!r}")


def balanced_cuts(lo: int, hi: int, bins: int, levels: Sequence[np.ndarray], tolerance: float = 1.05) -> list[int]:
    """Cut positions ``lo..hi`` of an ordered sequence into ``bins`` contiguous runs, balanced within ``tolerance``.

    Cuts are placed left to right, each aiming at an equal share of what is left. A cut goes to the
    nearest boundary of the first of ``levels`` (sorted positions, coarsest first: whole cells, then
    chunks) that keeps its run, and the runs left after it, within ``sqrt(tolerance)`` of the mean
    (so any two runs within ``tolerance``); when none does it falls exactly on its aim (inside a cell).
    """
    _check_bins(bins)
    mean = (hi - lo) / bins
    band = (mean / math.sqrt(tolerance), mean * math.sqrt(tolerance))
    cuts = [lo]
    for k in range(1, bins):
        prev = cuts[-1]
        aim = prev + round((hi - prev) / (bins - k + 1))
        cuts.append(_snap(aim, prev, hi, bins - k, band, [np.asarray(v) for v in levels]))
    cuts.append(hi)
    return cuts


def _snap(aim: int, prev: int, hi: int, left: int, band: tuple[float, float], levels: Sequence[np.ndarray]) -> int:
    """The boundary nearest ``aim`` of the coarsest level whose run and remaining average stay in ``band``."""
    for bounds in levels:
        b = bounds[(bounds > prev) & (bounds < hi)]
        b = b[(b - prev >= band[0]) & (b - prev <= band[1])]
        b = b[((hi - b) / left >= band[0]) & ((hi - b) / left <= band[1])]
        if b.size:
            return int(b[np.argmin(np.abs(b - aim))])
    return aim
