"""What every scene reader provides: metadata up front, then windowed reads of ``(band, y, x)``."""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from cubelake.grid import ChunkGrid, Window

from ..report import Issue

__all__ = ["BandInfo", "FileCalibration", "RasterSource", "SceneMetadata", "block_grid", "is_folder", "is_regular_file"]


def _mode(path: os.PathLike[str] | str) -> int | None:
    try:
        return os.stat(path).st_mode
    except (OSError, ValueError):  # missing, a name too long, a link loop, a NUL byte: not a file to read
        return None


def is_regular_file(path: os.PathLike[str] | str) -> bool:
    """Whether ``path`` is (or links to) a regular file; never raises, never true for a FIFO or device."""
    mode = _mode(path)
    return mode is not None and stat.S_ISREG(mode)


def is_folder(path: os.PathLike[str] | str) -> bool:
    """Whether ``path`` is (or links to) a directory; never raises."""
    mode = _mode(path)
    return mode is not None and stat.S_ISDIR(mode)


@dataclass(frozen=True, slots=True)
class BandInfo:
    """One source band. ``number`` is 1-based, as in GDAL and ENVI."""

    number: int
    name: str | None = None
    wavelength_nm: float | None = None
    fwhm_nm: float | None = None
    flagged_bad: bool = False


@dataclass(frozen=True, slots=True)
class FileCalibration:
    """Per-band linear coefficients the file itself carries: ``value = gain × DN + offset``."""

    name: str  # e.g. "gdal_scale_offset", "envi_data_gain", "radiance", "toa_reflectance"
    gains: tuple[float, ...]
    offsets: tuple[float, ...]
    unit: str | None = None
    note: str | None = None


@dataclass(frozen=True, slots=True)
class SceneMetadata:
    """Everything known about a scene before reading pixels."""

    path: str
    files: tuple[str, ...]
    format: str
    count: int
    height: int
    width: int
    dtype: str
    crs_wkt: str | None = None
    crs_epsg: int | None = None
    transform: tuple[float, float, float, float, float, float] | None = None  # GDAL affine a,b,c,d,e,f
    nodata: float | None = None
    bands: tuple[BandInfo, ...] = ()
    block_shape: tuple[int, int] = (1, 1)  # native (rows, cols) of a source block
    interleave: str | None = None
    compression: str | None = None
    datetime: str | None = None
    tags: dict[str, str] = field(default_factory=dict)
    calibrations: tuple[FileCalibration, ...] = ()
    has_rpcs: bool = False
    georeferenced: bool = True
    issues: tuple[Issue, ...] = ()  # problems found while reading metadata

    @property
    def shape(self) -> tuple[int, int, int]:
        """``(band, y, x)``."""
        return (self.count, self.height, self.width)

    @property
    def wavelengths_nm(self) -> list[float | None]:
        return [b.wavelength_nm for b in self.bands]

    @property
    def fwhm_nm(self) -> list[float | None]:
        return [b.fwhm_nm for b in self.bands]

    def calibration(self, name: str) -> FileCalibration | None:
        return next((c for c in self.calibrations if c.name == name), None)


@runtime_checkable
class RasterSource(Protocol):
    """A readable scene. Reads are thread-safe: workers may call :meth:`read` concurrently."""

    @property
    def meta(self) -> SceneMetadata: ...

    def read(self, window: Window) -> np.ndarray:
        """All bands of ``window`` as ``(band, y, x)`` in the source dtype. Raises on decode errors."""
        ...

    def blocks(self, window: Window) -> Sequence[Window]:
        """The native source blocks (tiles/strips) that ``window`` touches, for error diagnosis."""
        ...

    def close(self) -> None: ...


def block_grid(meta: SceneMetadata) -> ChunkGrid:
    """The grid of the source's native blocks."""
    by, bx = meta.block_shape
    return ChunkGrid(meta.height, meta.width, max(1, by), max(1, bx))
