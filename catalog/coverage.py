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

__all__ = ["band_intervals", "covers", "merge_intervals", "parse_wavelength_range"]


def band_intervals(centres_nm: Sequence[float | None], fwhm_nm: Sequence[float | None]) -> list[tuple[float, float]]:
    """``(lo, hi)`` nm per band that has a centre wavelength, in band order."""
    known = sorted(float(c) for c in centres_nm if c is not None)
    out = []
    for c, w in zip(centres_nm, list(fwhm_nm) + [None] * (len(centres_nm) - len(fwhm_nm)), strict=False):
        if c is None:
            continue
        c = float(c)
        if w is None or not w > 0:
            gaps = [abs(c - k) for k in known if k != c]
            w = min(gaps) if gaps else 0.0
        out.append((c - float(w) / 2, c + float(w) / 2))
    return out


def merge_intervals(intervals: Sequence[tuple[float, float]], gap_fraction: float = 0.5) -> list[tuple[float, float]]:
    """Bands' intervals as sorted, disjoint ``(lo, hi)``; a gap up to ``gap_fraction`` × the narrower
    neighbour's width is closed (see the module docstring)."""
    merged: list[tuple[float, float]] = []
    last_width = 0.0  # width of the band that reaches the current interval's end
    for lo, hi in sorted(intervals):
        width = hi - lo
        if merged and lo <= merged[-1][1] + gap_fraction * min(width, last_width):
            if hi >= merged[-1][1]:
                merged[-1] = (merged[-1][0], hi)
                last_width = width
        else:
            merged.append((lo, hi))
            last_width = width
    return merged


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
    if len(values) != 2 or not all(v > 0 for v in values) or values[0] > values[1]:
        raise ValueError(
            f"wavelength range {text!r} is not valid: write LO:HI in nm with LO <= HI, e.g. 400:2400 "
            "(or 0.4:2.4um)"
        )
    return values[0], values[1]
