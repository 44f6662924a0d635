"""A scene's preview image: which bands, how they are stretched, how large. Pure numpy, no I/O.

The choices, and why:

- **Bands.** True colour from the stored bands whose centre wavelengths are nearest 640 nm (R),
  550 nm (G) and 470 nm (B), each within :attr:`ThumbnailSpec.tolerance_nm` (35 nm by default: the
  red, green and blue bands of Landsat 5-9 and Sentinel-2 sit 15-25 nm from those targets, a
  hyperspectral sensor has a band within 5 nm; 35 nm keeps a 600 nm band from passing as red or
  green). Failing that, colour infrared (NIR 860 nm, red, green within the same tolerance), the
  usual false colour of vegetation. Failing that (a SWIR-only sensor, say), three bands spread
  across the sensor's range (at 1/6, 1/2 and 5/6 of it, the longest wavelength in red). With
  fewer than three usable bands, or none with a wavelength, one band in greyscale: the one nearest
  550 nm, else the middle band. A band without a valid pixel is never chosen. The thumbnail is
  accumulated during the ingest's one pixel pass, before the valid counts are known, so the pass
  bins :func:`candidate_bands` (the choice, then the choice without those bands: at most six) and
  :func:`choose_accumulated` picks among them after it: the same bands as :func:`choose_bands`
  unless a chosen band is empty and its replacement was not a candidate, then the best among the
  candidates (each further round would cost 12 MB more of sums and counts, for a case seen in no
  scene).
- **Stretch.** Each channel linearly from its 2nd to its 98th percentile (robust to a few hot or
  dark pixels), computed over the pixels shown only: a pixel that is nodata, NaN or masked in any
  channel counts in no channel. A channel whose percentiles coincide (a constant band) is mid grey
  (128), not a division by zero.
- **Nodata.** Transparent: the image has an alpha channel (RGBA, or LA for greyscale), 0 where
  any channel is invalid, 255 elsewhere; the colour there is 0.
- **Size.** The longest side is at most :attr:`ThumbnailSpec.max_side` (512 px), the aspect ratio
  kept (each side rounded, at least 1 px). Smaller scenes keep their size: no upscaling, a
  viewer scales a 32 px preview as well as a resampled one, and an upscaled file only costs bytes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

__all__ = [
    "BLUE_NM",
    "GREEN_NM",
    "NIR_NM",
    "RED_NM",
    "BandChoice",
    "BinnedMean",
    "BinnedPart",
    "ThumbnailSpec",
    "candidate_bands",
    "choose_accumulated",
    "choose_bands",
    "compose",
    "stored_valid",
    "stretch",
    "thumbnail_shape",
]

RED_NM = 640.0
GREEN_NM = 550.0
BLUE_NM = 470.0
NIR_NM = 860.0

Mode = Literal["true_colour", "colour_infrared", "false_colour", "greyscale"]

_MODE_NAMES: dict[str, str] = {
    "true_colour": "True colour",
    "colour_infrared": "Colour infrared",
    "false_colour": "False colour",
    "greyscale": "Greyscale",
}


@dataclass(frozen=True, slots=True)
class ThumbnailSpec:
    """How thumbnails are made: longest side (px), band tolerance (nm), stretch percentiles (%)."""

    max_side: int = 512
    tolerance_nm: float = 35.0
    low_percent: float = 2.0
    high_percent: float = 98.0

    def __post_init__(self) -> None:
        if self.max_side < 1:
            raise ValueError(f"thumbnail max_side must be at least 1 px, got {self.max_side}")
        if not self.tolerance_nm > 0:
            raise ValueError(f"thumbnail tolerance_nm must be positive, got {self.tolerance_nm}")
        if not 0 <= self.low_percent < self.high_percent <= 100:
            raise ValueError(f"thumbnail percentiles must satisfy 0 <= low < high <= 100, got "
                             f"{self.low_percent}, {self.high_percent}")


@dataclass(frozen=True, slots=True)
class BandChoice:
    """The bands shown: stored band indices (0-based) in channel order (R, G, B, or one grey)."""

    mode: Mode
    indices: tuple[int, ...]
    wavelengths_nm: tuple[float | None, ...]

    def title(self, spec: ThumbnailSpec) -> str:
        """One line for the STAC asset, e.g. ``True colour (R 641 nm, G 551 nm, B 469 nm), 2–98 % stretch``."""
        stretch_text = f"{_pct(spec.low_percent)}–{_pct(spec.high_percent)} % stretch"
        if self.mode == "greyscale":
            wl = self.wavelengths_nm[0]
            band = f"band {self.indices[0] + 1}" + (f", {_nm(wl)} nm" if wl is not None else "")
            return f"{_MODE_NAMES[self.mode]} ({band}), {stretch_text}"
        parts = ", ".join(f"{c} {_nm(w)} nm" for c, w in zip("RGB", self.wavelengths_nm, strict=True))
        return f"{_MODE_NAMES[self.mode]} ({parts}), {stretch_text}"

    def description(self, spec: ThumbnailSpec, n_bands: int) -> str:
        """How the image was made, for a reader who wants to reproduce it."""
        bands = ", ".join(str(i + 1) for i in self.indices)
        what = "band" if len(self.indices) == 1 else "bands"
        return (f"Preview of stored {what} {bands} of {n_bands} (1-based, as in the COG), each stretched linearly "
                f"between its {_pct(spec.low_percent)} % and {_pct(spec.high_percent)} % percentiles over the "
                f"valid pixels; nodata is transparent; longest side at most {spec.max_side} px, never upscaled.")


def _nm(wavelength_nm: float | None) -> str:
    """A wavelength in whole nanometres (band centres are rarely known better)."""
    return "?" if wavelength_nm is None else f"{wavelength_nm:.0f}"


def _pct(percent: float) -> str:
    return f"{percent:g}"


def _usable(wavelengths_nm: Sequence[float | None], valid_counts: Sequence[int | None] | None) -> list[int]:
    """Indices of bands that may be shown: not known to have no valid pixel."""
    n = len(wavelengths_nm)
    counts = list(valid_counts) if valid_counts is not None else [None] * n
    if len(counts) != n:
        raise ValueError(f"{n} wavelengths but {len(counts)} valid counts; give one per band")
    return [i for i in range(n) if counts[i] is None or counts[i] != 0]


def _nearest(targets: Sequence[float], candidates: dict[int, float], tolerance_nm: float) -> tuple[int, ...] | None:
    """For each target wavelength, the candidate band nearest it (ties: the lower index); ``None`` when one is
    farther than ``tolerance_nm`` or two targets would share a band."""
    picked: list[int] = []
    for t in targets:
        i = min(candidates, key=lambda k: (abs(candidates[k] - t), k))
        if abs(candidates[i] - t) > tolerance_nm:
            return None
        picked.append(i)
    return tuple(picked) if len(set(picked)) == len(picked) else None


def choose_bands(wavelengths_nm: Sequence[float | None], spec: ThumbnailSpec = ThumbnailSpec(),
                 valid_counts: Sequence[int | None] | None = None) -> BandChoice:
    """The bands to show, from each stored band's centre wavelength (nm, ``None``: unknown) and valid pixel count
    (``None``: unknown; bands with 0 are skipped). See the module docstring for the order of preference."""
    usable = _usable(wavelengths_nm, valid_counts)
    if not usable:
        raise ValueError("no band has a valid pixel: there is nothing to show in a thumbnail")
    known = {i: float(w) for i in usable if (w := wavelengths_nm[i]) is not None and math.isfinite(w)}
    tol = spec.tolerance_nm
    if len(known) >= 3:
        tries: tuple[tuple[Mode, tuple[float, ...]], ...] = (("true_colour", (RED_NM, GREEN_NM, BLUE_NM)),
                                                             ("colour_infrared", (NIR_NM, RED_NM, GREEN_NM)))
        for mode, targets in tries:
            picked = _nearest(targets, known, tol)
            if picked is not None:
                return _choice(mode, picked, known)
        lo, hi = min(known.values()), max(known.values())
        spread = _nearest([lo + (hi - lo) * f for f in (5 / 6, 1 / 2, 1 / 6)], known, math.inf)
        if spread is None:  # bands bunched at one end: the longest, the median and the shortest
            ranked = sorted(known, key=lambda k: (known[k], k))
            spread = (ranked[-1], ranked[len(ranked) // 2], ranked[0])
        return _choice("false_colour", spread, known)
    if known:
        grey = min(known, key=lambda k: (abs(known[k] - GREEN_NM), k))
        return _choice("greyscale", (grey,), known)
    return BandChoice("greyscale", (usable[len(usable) // 2],), (None,))


def candidate_bands(wavelengths_nm: Sequence[float | None], spec: ThumbnailSpec = ThumbnailSpec(),
                    rounds: int = 2) -> tuple[int, ...]:
    """The bands to accumulate while the valid counts are unknown: :func:`choose_bands`' choice, then its choice
    with those bands taken away, ``rounds`` times in all (at most ``3 * rounds`` distinct bands, first choice first)."""
    taken: set[int] = set()
    picked: list[int] = []
    for _ in range(rounds):
        counts: list[int | None] = [0 if i in taken else None for i in range(len(wavelengths_nm))]
        try:
            choice = choose_bands(wavelengths_nm, spec, counts)
        except ValueError:  # every band taken already
            break
        picked.extend(choice.indices)
        taken.update(choice.indices)
    return tuple(picked)


def choose_accumulated(wavelengths_nm: Sequence[float | None], accumulated: Sequence[int],
                       spec: ThumbnailSpec = ThumbnailSpec(),
                       valid_counts: Sequence[int | None] | None = None) -> BandChoice:
    """The bands to show among the ``accumulated`` ones, once the valid counts are known: :func:`choose_bands`'
    choice when every band of it was accumulated, else its choice with the others counted as empty.
    Raises ``ValueError`` when no accumulated band has a valid pixel."""
    choice = choose_bands(wavelengths_nm, spec, valid_counts)
    have = set(accumulated)
    if have.issuperset(choice.indices):
        return choice
    counts = list(valid_counts) if valid_counts is not None else [None] * len(wavelengths_nm)
    try:
        return choose_bands(wavelengths_nm, spec, [c if i in have else 0 for i, c in enumerate(counts)])
    except ValueError:
        raise ValueError(f"none of the bands accumulated for the thumbnail ({', '.join(str(i + 1) for i in sorted(have))}"
                         ", 1-based) has a valid pixel") from None


def _choice(mode: Mode, indices: tuple[int, ...], known: dict[int, float]) -> BandChoice:
    return BandChoice(mode, indices, tuple(known.get(i) for i in indices))


def thumbnail_shape(height: int, width: int, max_side: int) -> tuple[int, int]:
    """``(height, width)`` of the thumbnail (px): the scene's, scaled down so the longest side is ``max_side``."""
    if height < 1 or width < 1:
        raise ValueError(f"a scene of {height}x{width} pixels has no thumbnail")
    longest = max(height, width)
    if longest <= max_side:
        return height, width
    scale = max_side / longest
    return max(1, min(max_side, round(height * scale))), max(1, min(max_side, round(width * scale)))


def stretch(channel: np.ndarray, valid: np.ndarray, low_percent: float = 2.0,
            high_percent: float = 98.0) -> np.ndarray:
    """``channel`` (y, x) to uint8: linear from its ``low_percent`` to its ``high_percent`` percentile over the
    ``valid`` pixels (bool, same shape), clipped; 0 outside ``valid``; 128 where the channel is constant."""
    if channel.shape != valid.shape:
        raise ValueError(f"channel {channel.shape} and valid mask {valid.shape} differ in shape")
    out = np.zeros(channel.shape, dtype=np.uint8)
    values = channel[valid].astype(np.float64)
    if values.size == 0:
        return out
    lo, hi = (float(v) for v in np.percentile(values, [low_percent, high_percent]))
    if not hi > lo:  # constant (or nearly): no range to spread over
        out[valid] = 128
        return out
    scaled = (values - lo) * (255.0 / (hi - lo))
    out[valid] = np.rint(np.clip(scaled, 0.0, 255.0)).astype(np.uint8)
    return out


def compose(channels: np.ndarray, valid: np.ndarray, spec: ThumbnailSpec = ThumbnailSpec()) -> np.ndarray:
    """The image: ``channels`` (c, y, x) with c = 3 (R, G, B) or 1 (grey) and ``valid`` (c, y, x) bool ->
    uint8 (y, x, c + 1), the last channel alpha (255 where every channel is valid, else 0 with colour 0)."""
    if channels.ndim != 3 or channels.shape[0] not in (1, 3) or valid.shape != channels.shape:
        raise ValueError(f"expected channels and a valid mask of shape (1 or 3, y, x), got {channels.shape} and "
                         f"{valid.shape}")
    shown = valid.all(axis=0) & np.isfinite(channels).all(axis=0)
    planes = [stretch(c, shown, spec.low_percent, spec.high_percent) for c in channels]
    alpha = np.where(shown, np.uint8(255), np.uint8(0))
    return np.stack([*planes, alpha], axis=-1)


def stored_valid(stored: np.ndarray, fill_value: float | None) -> np.ndarray:
    """Where stored values are data: finite and not the fill value (``None`` or NaN: only NaN is missing)."""
    valid = np.isfinite(stored)
    if fill_value is not None and not math.isnan(fill_value):
        valid &= stored != fill_value
    return valid


@dataclass(frozen=True, slots=True)
class BinnedPart:
    """One window's contribution to a :class:`BinnedMean`: sums and valid counts (c, rows, cols) of the bins
    ``row_bins`` x ``col_bins`` it touches."""

    row_bins: np.ndarray
    col_bins: np.ndarray
    sums: np.ndarray
    counts: np.ndarray


class BinnedMean:
    """The mean of valid pixels of a (c, height, width) raster over a (c, h, w) grid of bins, fed window by
    window, so the raster is never whole in memory. Source row ``i`` falls in bin ``i * h // height`` (columns
    alike): a block mean when the sizes divide, bins one pixel wider or narrower where they do not."""

    def __init__(self, channels: int, scene_shape: tuple[int, int], shape: tuple[int, int]) -> None:
        self.scene_shape, self.shape = scene_shape, shape
        self.sums = np.zeros((channels, *shape), dtype=np.float64)
        self.counts = np.zeros((channels, *shape), dtype=np.int64)

    def add(self, block: np.ndarray, valid: np.ndarray, row_off: int, col_off: int) -> None:
        """Add the window ``block`` (c, y, x) whose first pixel is at (``row_off``, ``col_off``) of the scene."""
        self.merge(self.partial(block, valid, row_off, col_off))

    def partial(self, block: np.ndarray, valid: np.ndarray, row_off: int, col_off: int) -> BinnedPart:
        """The sums and counts of one window, not yet added (so threads can bin windows in parallel and
        :meth:`merge` them one at a time, in any order)."""
        _, ny, nx = block.shape
        rows, row_bins = _runs(row_off, ny, self.scene_shape[0], self.shape[0])
        cols, col_bins = _runs(col_off, nx, self.scene_shape[1], self.shape[1])
        values = np.where(valid, block, 0.0)
        sums = np.add.reduceat(np.add.reduceat(values, rows, axis=1), cols, axis=2)
        counts = np.add.reduceat(np.add.reduceat(valid.astype(np.int64), rows, axis=1), cols, axis=2)
        return BinnedPart(row_bins, col_bins, sums, counts)

    def merge(self, part: BinnedPart) -> None:
        """Add a window's :meth:`partial` sums (not thread-safe: the caller serialises merges)."""
        # a window's bins are distinct, so the fancy-indexed += adds each once
        self.sums[:, part.row_bins[:, None], part.col_bins[None, :]] += part.sums
        self.counts[:, part.row_bins[:, None], part.col_bins[None, :]] += part.counts

    def mean(self) -> tuple[np.ndarray, np.ndarray]:
        """The means (c, h, w; NaN where a bin has no valid pixel) and where they are valid."""
        valid = self.counts > 0
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(valid, self.sums / self.counts, np.nan), valid


def _runs(offset: int, n: int, total: int, bins: int) -> tuple[np.ndarray, np.ndarray]:
    """For ``n`` source pixels from ``offset`` on: where each run of one bin starts (relative) and its bin."""
    which = (np.arange(offset, offset + n, dtype=np.int64) * bins) // total
    starts = np.flatnonzero(np.diff(which, prepend=-1))
    return starts, which[starts]
