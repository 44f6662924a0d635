"""Spectral metadata: wavelength/FWHM parsing, unit handling and checks. Pure, no I/O.

Wavelengths are carried in nanometres everywhere inside cubelake (``*_nm`` names).
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Sequence

from .report import Code, Issue, error, warning

__all__ = [
    "DEFAULT_BAD_WINDOWS_NM",
    "bands_in_windows",
    "check_fwhm",
    "check_wavelengths",
    "overlap_drops",
    "parse_float_list",
    "parse_wavelength_text",
    "unit_factor_to_nm",
]

#: Water-vapour absorption windows and the noisy tail beyond 2450 nm (defaults of the
#: bad-band removal; a profile may replace them).
DEFAULT_BAD_WINDOWS_NM: tuple[tuple[float, float], ...] = (
    (1350.0, 1450.0),
    (1800.0, 1960.0),
    (2450.0, math.inf),
)

_UNIT_FACTORS = {
    "nm": 1.0,
    "nanometer": 1.0,
    "nanometers": 1.0,
    "nanometre": 1.0,
    "nanometres": 1.0,
    "um": 1000.0,
    "µm": 1000.0,
    "μm": 1000.0,
    "micrometer": 1000.0,
    "micrometers": 1000.0,
    "micrometre": 1000.0,
    "micrometres": 1000.0,
    "micron": 1000.0,
    "microns": 1000.0,
    "mm": 1e6,
    "millimeters": 1e6,
}

_NUMBER_UNIT = re.compile(
    r"(?P<value>[-+]?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)\s*(?P<unit>nanomet(?:er|re)s?|nm|micromet(?:er|re)s?|microns?|um|µm|μm)\b",
    re.IGNORECASE,
)


def unit_factor_to_nm(unit: str | None) -> float | None:
    """Factor that converts a value in ``unit`` to nanometres; ``None`` if the unit is unknown."""
    if unit is None:
        return None
    return _UNIT_FACTORS.get(unit.strip().lower())


def parse_wavelength_text(text: str | None) -> float | None:
    """Wavelength in nm from free text such as ``"376.44 Nanometers"`` or ``"band 1 (0.418 um)"``."""
    if not text:
        return None
    m = _NUMBER_UNIT.search(text)
    if m is None:
        return None
    factor = unit_factor_to_nm(m.group("unit"))
    return float(m.group("value")) * factor if factor else None


def parse_float_list(text: str) -> list[float]:
    """Floats from an ENVI-style list ``"{1.0, 2.5 , 3}"`` (braces optional)."""
    body = text.strip().removeprefix("{").removesuffix("}")
    return [float(v) for v in re.split(r"[,\s]+", body.strip()) if v]


def overlap_drops(wavelengths_nm: Sequence[float], *, max_seams: int = 3, max_share: float = 0.2,
                  keep: str = "earlier") -> list[int] | None:
    """0-based bands to drop so wavelengths strictly increase, keeping the ``earlier`` (or ``later``) detector.

    Imaging spectrometers with two detectors (EnMAP and PRISMA VNIR/SWIR, classic AVIRIS) repeat a
    short stretch of wavelengths at the seam. Keeping the earlier detector, a band is dropped when it
    does not exceed every band kept before it; keeping the later, when it is not below every band
    kept after it. A seam is a step back between long increasing runs: with more than ``max_seams``
    step-backs, or more than ``max_share`` of the bands to drop, the order is not a seam (e.g. a
    reversed band order would lose every band but one) and ``None`` is returned, so the ordering
    check reports it instead of bands being removed.
    """
    seams = sum(1 for a, b in itertools.pairwise(wavelengths_nm) if not b > a)
    drops: list[int] = []
    if keep == "later":
        bottom = math.inf
        for i in range(len(wavelengths_nm) - 1, -1, -1):
            if wavelengths_nm[i] < bottom:
                bottom = wavelengths_nm[i]
            else:
                drops.append(i)
        drops.reverse()
    else:
        top = -math.inf
        for i, w in enumerate(wavelengths_nm):
            if w > top:
                top = w
            else:
                drops.append(i)
    if seams > max_seams or len(drops) > max_share * len(wavelengths_nm):
        return None
    return drops


def check_wavelengths(
    wavelengths_nm: Sequence[float | None], n_bands: int, where: str, *, ignore: frozenset[int] = frozenset()
) -> list[Issue]:
    """Errors for a wavelength list that does not match the bands or is not a valid axis.

    ``ignore`` holds 0-based bands already dropped (e.g. at a spectrometer seam), which the
    ordering check skips.
    """
    issues: list[Issue] = []
    if len(wavelengths_nm) != n_bands:
        issues.append(
            error(
                Code.WAVELENGTH_COUNT,
                f"{len(wavelengths_nm)} wavelengths for {n_bands} bands; give exactly one wavelength per band "
                "(fix the header/sidecar, or pass a profile with the right list)",
                where=where,
            )
        )
        return issues
    values = [w for w in wavelengths_nm if w is not None]
    if not values:
        return issues
    if len(values) != n_bands:
        missing = [i + 1 for i, w in enumerate(wavelengths_nm) if w is None]
        issues.append(
            error(
                Code.WAVELENGTH_COUNT,
                f"{len(missing)} band(s) have no wavelength while others do; give one per band",
                bands=missing,
                where=where,
            )
        )
        return issues
    bad = [i + 1 for i, w in enumerate(values) if not (w > 0 and math.isfinite(w))]
    if bad:
        issues.append(
            error(
                Code.WAVELENGTH_NONPOSITIVE,
                f"wavelengths must be positive and finite; band(s) {_ranges(bad)} are not "
                f"(first: {values[bad[0] - 1]})",
                bands=bad,
                where=where,
            )
        )
    kept = [i for i in range(len(values)) if i not in ignore]
    steps_pairs = [(kept[j - 1], kept[j]) for j in range(1, len(kept)) if not values[kept[j]] > values[kept[j - 1]]]
    steps = [b + 1 for _, b in steps_pairs]
    if steps:
        detail = ", ".join(
            f"band {a + 1} ({values[a]:g} nm) -> band {b + 1} ({values[b]:g} nm)" for a, b in steps_pairs[:5]
        )
        more = f" and {len(steps) - 5} more" if len(steps) > 5 else ""
        if len(kept) > 2 and len(steps) >= 0.8 * (len(kept) - 1):
            detail = (f"they decrease at {len(steps)} of {len(kept) - 1} steps, from {values[kept[0]]:g} nm "
                      f"(band {kept[0] + 1}) to "
                      f"{values[kept[-1]]:g} nm (band {kept[-1] + 1}): the bands are in reverse order or the "
                      "wavelength list is reversed")
            more = ""
        issues.append(
            error(
                Code.WAVELENGTH_ORDER,
                f"wavelengths must increase with band number; they do not at {len(steps)} place(s): {detail}{more}. "
                "If these are overlapping spectrometer seams, set spectral.overlap: drop in a profile (or list "
                "the bands in bad_bands.indices); if they are typos, fix the header",
                bands=steps,
                where=where,
            )
        )
    return issues


def check_fwhm(
    wavelengths_nm: Sequence[float], fwhm_nm: Sequence[float], where: str, *, low: float = 0.2, high: float = 5.0
) -> list[Issue]:
    """Warn where a band's FWHM is implausible against the spacing of its neighbours.

    A band's FWHM is normally close to the band spacing; outside ``[low, high] ×`` the spacing
    the numbers are probably in other units or shifted by a band.
    """
    if len(fwhm_nm) != len(wavelengths_nm):
        return [
            warning(
                Code.FWHM_IMPLAUSIBLE,
                f"{len(fwhm_nm)} FWHM values for {len(wavelengths_nm)} bands; FWHM ignored",
                where=where,
            )
        ]
    n = len(wavelengths_nm)
    bad: list[int] = []
    for i in range(n):
        f = fwhm_nm[i]
        if not (f > 0 and math.isfinite(f)):
            bad.append(i + 1)
            continue
        if n < 2:
            continue
        gaps = []
        if i > 0:
            gaps.append(abs(wavelengths_nm[i] - wavelengths_nm[i - 1]))
        if i < n - 1:
            gaps.append(abs(wavelengths_nm[i + 1] - wavelengths_nm[i]))
        spacing = min(g for g in gaps) if gaps else 0.0
        if spacing > 0 and not (low * spacing <= f <= high * max(gaps)):
            bad.append(i + 1)
    if not bad:
        return []
    return [
        warning(
            Code.FWHM_IMPLAUSIBLE,
            f"FWHM of band(s) {_ranges(bad)} is non-positive or outside {low}-{high}x the band spacing "
            f"(first: band {bad[0]}, FWHM {fwhm_nm[bad[0] - 1]:g} nm at {wavelengths_nm[bad[0] - 1]:g} nm); "
            "check the FWHM units",
            bands=bad,
            where=where,
        )
    ]


def bands_in_windows(wavelengths_nm: Sequence[float], windows_nm: Sequence[tuple[float, float]]) -> list[int]:
    """0-based indices of bands whose centre wavelength lies in any ``[lo, hi]`` window (nm)."""
    return [i for i, w in enumerate(wavelengths_nm) if any(lo <= w <= hi for lo, hi in windows_nm)]


def _ranges(bands: Sequence[int]) -> str:
    """``[1,2,3,7]`` -> ``"1-3, 7"``."""
    out: list[str] = []
    start = prev = None
    for b in bands:
        if start is None:
            start = prev = b
        elif b == prev + 1:  # type: ignore[operator]
            prev = b
        else:
            out.append(f"{start}-{prev}" if start != prev else f"{start}")
            start = prev = b
    if start is not None:
        out.append(f"{start}-{prev}" if start != prev else f"{start}")
    return ", ".join(out)


format_band_ranges = _ranges
