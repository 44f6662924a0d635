"""Spectral coverage: which wavelength ranges a scene's bands cover. Pure.

Band ``i`` covers ``[centre_i - fwhm_i / 2, centre_i + fwhm_i / 2]`` (nm). A band without a
FWHM is given the distance to its nearest neighbouring band (imaging spectrometers sample at
about their FWHM); a lone band without one covers only its centre. Neighbouring intervals merge
when they overlap or the gap between them is at most half the narrower band's FWHM: a band's
response does not stop at its FWHM, and spectrometers routinely sample slightly wider than
their FWHM (EnMAP's SWIR leaves 0.4 nm between 10 nm bands), which is no spectral hole. A
query range ``[lo, hi]`` is covered when it lies inside one merged interval, so a removed
water-vapour window (100+ nm) splits coverage exactly where the data has a hole.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["band_intervals", "covers", "merge_arrays", "merge_intervals", "merged_coverage", "parse_wavelength_range"]


def band_intervals(centres_nm: Sequence[float | None], fwhm_nm: Sequence[float | None]) -> list[tuple[float, float]]:
    """``(lo, hi)`` nm per band that has a centre wavelength, in band order."""
    lo, hi = _band_arrays(centres_nm, fwhm_nm)
    return list(zip(lo.tolist(), hi.tolist(), strict=True))


def _band_arrays(centres_nm: Sequence[float | None], fwhm_nm: Sequence[float | None]) -> tuple[np.ndarray, np.ndarray]:
    n = len(centres_nm)
    c = np.array([np.nan if v is None else v for v in centres_nm], dtype=np.float64)
    w = np.array([np.nan if v is None else v for v in list(fwhm_nm)[:n]] + [np.nan] * (n - len(fwhm_nm)),
                 dtype=np.float64)
    has = ~np.isnan(c)
    c, w = c[has], w[has]
    missing = ~(w > 0)
    if missing.any():  # the distance to the nearest other band (only scenes without FWHM pay for this)
        u = np.unique(c)
        pos = np.searchsorted(u, c[missing])
        left = np.where(pos > 0, c[missing] - u[np.maximum(pos - 1, 0)], np.inf)
        right = np.where(pos + 1 < len(u), u[np.minimum(pos + 1, len(u) - 1)] - c[missing], np.inf)
        gap = np.minimum(left, right)
        w[missing] = np.where(np.isfinite(gap), gap, 0.0)
    return c - w / 2, c + w / 2


def merge_intervals(intervals: Sequence[tuple[float, float]], gap_fraction: float = 0.5) -> list[tuple[float, float]]:
    """Bands' intervals as sorted, disjoint ``(lo, hi)``; a gap up to ``gap_fraction`` × the narrower of
    the band and the band reaching the current end is closed (see the module docstring)."""
    if not len(intervals):
        return []
    a = np.asarray(intervals, dtype=np.float64).reshape(-1, 2)
    return merge_arrays(a[:, 0], a[:, 1], gap_fraction)


def merge_arrays(lo: np.ndarray, hi: np.ndarray, gap_fraction: float = 0.5) -> list[tuple[float, float]]:
    """:func:`merge_intervals` on ``lo``/``hi`` arrays, vectorised (the index merges a million items' bands)."""
    if lo.size == 0:
        return []
    order = np.lexsort((hi, lo))
    lo, hi = lo[order], hi[order]
    width = hi - lo
    idx = np.arange(lo.size)
    run = np.maximum.accumulate(hi)  # end of everything merged so far, up to and including band i
    prev = np.concatenate(([-np.inf], run[:-1]))
    # the band that set the running end (the latest one reaching it, as a band-by-band merge does)
    setter = np.maximum.accumulate(np.where(hi >= prev, idx, 0))
    prev_width = np.concatenate(([0.0], width[setter[:-1]]))
    starts = np.flatnonzero(lo > prev + gap_fraction * np.minimum(width, prev_width))
    if starts.size == 0 or starts[0] != 0:
        starts = np.concatenate(([0], starts))
    ends = np.concatenate((starts[1:] - 1, [lo.size - 1]))
    return list(zip(lo[starts].tolist(), run[ends].tolist(), strict=True))


def merged_coverage(centres_nm: Sequence[float | None], fwhm_nm: Sequence[float | None]) -> list[tuple[float, float]]:
    """The merged intervals the bands cover (nm): what ``--wavelength`` queries test."""
    lo, hi = _band_arrays(centres_nm, fwhm_nm)
    return merge_arrays(lo, hi)


def covers(merged: Sequence[tuple[float, float]], lo_nm: float, hi_nm: float) -> bool:
    """Whether ``[lo_nm, hi_nm]`` lies inside one merged interval."""
    return any(a <= lo_nm and hi_nm <= b for a, b in merged)


def parse_wavelength_range(text: str) -> tuple[float, float]:
    """``"400:2400"`` (nm; ``um``/``µm`` suffix for micrometres) -> ``(400.0, 2400.0)``; a single value is a point."""
    raw = text.strip().lower().replace(" ", "")
    factor = 1.0
    for suffix, f in (("nm", 1.0), ("um", 1000.0), ("µm", 1000.0)):
        if raw.endswith(suffix):
            raw, factor = raw[: -len(suffix)], f
            break
    parts = raw.split(":")
    try:
        values = [float(p) * factor for p in parts]
    except ValueError:
        values = []
    if len(values) == 1:
        values = values * 2
    if len(values) != 2 or not all(0 < v < 1e6 for v in values) or values[0] > values[1]:
        raise ValueError(
            f"wavelength range {text!r} is not valid: write LO:HI in nm with LO <= HI, e.g. 400:2400 "
            "(or 0.4:2.4um)"
        )
    return values[0], values[1]
