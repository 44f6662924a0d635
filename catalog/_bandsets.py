"""Band sets: an item's band table (names, centres, FWHMs) stored once per distinct content.

Most items of a sensor share one band table (a hyperspectral table is ~3 KB), so the index keeps
each distinct table once, keyed by a digest of its content, with the merged wavelength intervals
it covers; items refer to it. :class:`BandSetMemo` finds the :class:`BandSet` of an item's band
list without re-deriving it: a band list equal (``==``, compared in C) to one seen before has the
same table, so the per-band Python work is paid once per distinct table, not once per item.
Pure logic, no I/O.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from .coverage import merged_coverage
from .schema import EO_CENTER, EO_FWHM

__all__ = ["BandSet", "BandSetMemo", "band_set_of", "band_table_of"]


@dataclass(frozen=True, slots=True)
class BandSet:
    """One band table as the index stores it; ``digest`` identifies its content."""

    digest: bytes
    names: str  # JSON list of the band names (None where a band has none)
    center_nm: bytes  # little-endian float64 per band, NaN = unknown
    fwhm_nm: bytes
    coverage: tuple[tuple[float, float], ...]  # merged (lo, hi) nm intervals the bands cover

    @property
    def row(self) -> tuple[bytes, str, bytes, bytes]:
        return self.digest, self.names, self.center_nm, self.fwhm_nm


def _digest(names: str, center: bytes, fwhm: bytes) -> bytes:
    # JSON text never holds a raw NUL and both arrays are 8 bytes per band: the join is unambiguous
    return hashlib.blake2b(b"\0".join((names.encode(), center, fwhm)), digest_size=16).digest()


def band_set_of(bands: list[Any]) -> BandSet:
    """The band set of an item's band objects (STAC ``bands`` with eo centre/FWHM in µm)."""
    c_nm = [None if (v := b.get(EO_CENTER)) is None else v * 1000.0 for b in bands]
    f_nm = [None if (v := b.get(EO_FWHM)) is None else v * 1000.0 for b in bands]
    names = json.dumps([b.get("name") for b in bands])
    center = np.array(c_nm, dtype="<f8").tobytes()
    fwhm = np.array(f_nm, dtype="<f8").tobytes()
    return BandSet(_digest(names, center, fwhm), names, center, fwhm, tuple(merged_coverage(c_nm, f_nm)))


def band_table_of(names: str, center_nm: bytes, fwhm_nm: bytes) -> list[tuple[str | None, float | None, float | None]]:
    """``(name, centre_nm, fwhm_nm)`` per band from a stored band set (``None`` where unknown)."""
    c, f = np.frombuffer(center_nm, dtype="<f8"), np.frombuffer(fwhm_nm, dtype="<f8")
    return [(n, None if math.isnan(a) else float(a), None if math.isnan(b) else float(b))
            for n, a, b in zip(json.loads(names), c, f, strict=True)]


def _memoizable(bands: list[Any]) -> bool:
    """Only lists whose equality implies an equal band set: dicts with ``str``/``None`` names.

    (``True == 1``: a name ``True`` would compare equal to a remembered name ``1`` but store
    differently; centres and FWHMs are only ever used as numbers, so ``==`` is exact for them.)
    """
    return all(type(b) is dict and (b.get("name") is None or isinstance(b.get("name"), str)) for b in bands)


class BandSetMemo:
    """Band lists seen before, with their band sets: at most ``limit`` of them, shared by threads."""

    def __init__(self, limit: int = 256) -> None:
        self.limit = limit
        self._by_len: dict[int, list[tuple[list[dict[str, Any]], BandSet]]] = {}
        self._count = 0
        self._lock = threading.Lock()

    def get(self, bands: list[Any]) -> BandSet:
        """The band set of ``bands``; equal to ``band_set_of(bands)``, cheaper for a list seen before."""
        for seen, bs in self._by_len.get(len(bands), ()):
            if bands == seen:
                return bs
        bs = band_set_of(bands)
        if _memoizable(bands):
            # a copy of each band dict: the caller may change its own lists and dicts later
            copy = [dict(b) for b in bands]
            with self._lock:
                if self._count >= self.limit:
                    self._by_len, self._count = {}, 0
                self._by_len[len(bands)] = [*self._by_len.get(len(bands), ()), (copy, bs)]
                self._count += 1
        return bs
