"""Band selection by wavelength, per-band normalisation and a fixed linear projection (e.g. PCA). Pure numpy."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

__all__ = ["Projection", "Spectral", "band_stats", "fit_pca", "select_bands"]


@dataclass(frozen=True)
class Projection:
    """``y = matrix @ (x - center)`` over the band axis: ``matrix`` is ``(k, bands)``."""

    matrix: np.ndarray
    center: np.ndarray

    def __post_init__(self) -> None:
        if self.matrix.ndim != 2 or self.center.shape != (self.matrix.shape[1],):
            raise ValueError(f"projection matrix {self.matrix.shape} and center {self.center.shape} do not match")

    def apply(self, x: np.ndarray) -> np.ndarray:
        """``x``: ``(batch, band, h, w)`` -> ``(batch, k, h, w)``."""
        xc = x - self.center.astype(x.dtype)[None, :, None, None]
        return np.einsum("kc,bchw->bkhw", self.matrix.astype(x.dtype), xc, optimize=True)


@dataclass(frozen=True)
class Spectral:
    """What the loader does to the band axis, in this order.

    ``wavelength_ranges_nm``: keep bands whose centre lies in any ``(lo, hi)`` range (from the
    product's wavelength coordinate). ``normalize``: ``"scene"`` standardises each band with the
    scene's statistics recorded at ingest (computed from a few chunks if missing), ``"global"``
    with statistics pooled over all scenes, ``"none"`` keeps physical values. ``projection``:
    applied after normalisation. ``fill``: value given to nodata and padded pixels (after
    normalisation, so 0 is the band mean). ``dtype``: of the batch tensor.
    """

    wavelength_ranges_nm: Sequence[tuple[float, float]] | None = None
    normalize: Literal["scene", "global", "none"] = "scene"
    projection: Projection | None = None
    fill: float = 0.0
    dtype: Literal["float32", "float16"] = "float32"

    def __post_init__(self) -> None:
        if self.normalize not in ("scene", "global", "none"):
            raise ValueError(f"normalize must be 'scene', 'global' or 'none', got {self.normalize!r}")
        if self.dtype not in ("float32", "float16"):
            raise ValueError(f"dtype must be 'float32' or 'float16', got {self.dtype!r}")
        for lo, hi in self.wavelength_ranges_nm or ():
            if not lo < hi:
                raise ValueError(f"wavelength range ({lo}, {hi}): low must be below high (nm)")


def select_bands(wavelengths_nm: np.ndarray | None, ranges: Sequence[tuple[float, float]] | None, product: str) -> np.ndarray | None:
    """Indices of the bands inside ``ranges`` (``None``: all bands)."""
    if not ranges:
        return None
    if wavelengths_nm is None:
        raise ValueError(f"{product}: has no wavelength coordinate, so bands cannot be selected by wavelength; "
                         "drop wavelength_ranges_nm or ingest with a profile that gives wavelengths")
    w = np.asarray(wavelengths_nm, float)
    keep = np.zeros(w.size, bool)
    for lo, hi in ranges:
        keep |= (w >= lo) & (w <= hi)
    if not keep.any():
        raise ValueError(f"{product}: no band lies in {list(ranges)} nm (its bands span {w.min():.1f}-{w.max():.1f} nm)")
    return np.flatnonzero(keep)


def band_stats(values: np.ndarray, valid: np.ndarray) -> dict[str, np.ndarray]:
    """Per-band mean and std of ``values (band, n)`` over ``valid (band, n)``."""
    v = np.where(valid, values, 0.0).astype(np.float64)
    n = valid.sum(axis=1)
    mean = v.sum(axis=1) / np.maximum(n, 1)
    var = (np.where(valid, values - mean[:, None], 0.0) ** 2).sum(axis=1) / np.maximum(n - 1, 1)
    mean[n == 0] = np.nan
    return {"mean": mean, "std": np.sqrt(var)}


def fit_pca(spectra: np.ndarray, k: int) -> Projection:
    """The first ``k`` principal components of ``spectra (n, band)`` (rows with NaN are skipped)."""
    x = np.asarray(spectra, np.float64)
    x = x[np.isfinite(x).all(axis=1)]
    if x.shape[0] < 2 or k < 1 or k > x.shape[1]:
        raise ValueError(f"PCA of {x.shape[0]} finite spectra of {x.shape[1]} bands into {k} components is not possible")
    center = x.mean(axis=0)
    _, _, vt = np.linalg.svd(x - center, full_matrices=False)
    return Projection(vt[:k].astype(np.float32), center.astype(np.float32))
