"""What every scene reader provides: metadata up front, then windowed reads of ``(band, y, x)``.

Readers take paths: a local file, or GDAL's ``/vsis3/bucket/key`` name for an object (pixels are
read by GDAL's range requests). The small file helpers here answer for both, so a reader needs
no second code path: the object-store side goes through :mod:`cubelake.storage` (HEAD, ranged
GET, one delimiter listing), never a whole-object download.
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

from cubelake.errors import SceneReadError
from cubelake.grid import ChunkGrid, Window
from cubelake.storage import ObjectInfo, ObjectNotFound, object_at, open_store, url_of_gdal_path

from ..report import Issue

__all__ = [
    "BandInfo",
    "FileCalibration",
    "LockedSource",
    "RasterSource",
    "SceneMetadata",
    "block_grid",
    "display_name",
    "file_size",
    "folder_files",
    "is_folder",
    "is_regular_file",
    "read_bounded",
]

PathLike = os.PathLike[str] | str


def display_name(path: PathLike) -> str:
    """What messages call a file: the ``s3://`` URL of a ``/vsis3/`` name, else the path."""
    return url_of_gdal_path(path) or str(path)


def _head(url: str) -> ObjectInfo:
    store, key = object_at(url)
    return store.head(key)


def _mode(path: PathLike) -> int | None:
    try:
        return os.stat(path).st_mode
    except (OSError, ValueError):  # missing, a name too long, a link loop, a NUL byte: not a file to read
        return None


def is_regular_file(path: PathLike) -> bool:
    """Whether ``path`` is (or links to) a regular file, or names an existing object; never true for a FIFO
    or device. Raises only for an object store that cannot answer (:class:`~cubelake.storage.StorageError`)."""
    url = url_of_gdal_path(path)
    if url is not None:
        try:
            _head(url)
        except ObjectNotFound:
            return False
        return True
    mode = _mode(path)
    return mode is not None and stat.S_ISREG(mode)


def is_folder(path: PathLike) -> bool:
    """Whether ``path`` is (or links to) a directory; never raises."""
    mode = _mode(path)
    return mode is not None and stat.S_ISDIR(mode)


def file_size(path: PathLike) -> int:
    """The size of a file or object in bytes (an object's from one HEAD). Raises ``OSError`` when missing."""
    url = url_of_gdal_path(path)
    return _head(url).size if url is not None else os.stat(path).st_size


def read_bounded(path: PathLike, limit: int, what: str) -> bytes:
    """All bytes of a small file or object, refused (:class:`SceneReadError`) when it is over ``limit`` bytes.

    ``what`` names the kind of file in messages (e.g. ``"an ENVI header"``). An object is read by one
    ranged GET of the size its HEAD gave, so an object replaced by a larger one in between is not read whole.
    A file or object that cannot be read is a :class:`SceneReadError` naming it and why.
    """
    try:
        return _read_bounded(path, limit, what)
    except SceneReadError:
        raise
    except OSError as exc:  # missing, unreadable, or the object store's answer (StorageError)
        raise SceneReadError(f"{display_name(path)}: cannot read {what}: {exc.strerror or exc}") from exc


def _read_bounded(path: PathLike, limit: int, what: str) -> bytes:
    url = url_of_gdal_path(path)
    if url is None:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):  # a FIFO or device could block forever
            raise SceneReadError(f"{path}: not a regular file; give {what} as a file")
        _check_size(path, st.st_size, limit, what)
        with open(path, "rb") as f:
            data = f.read(limit + 1)  # the file may have grown since stat
        _check_size(path, len(data), limit, what)
        return data
    store, key = object_at(url)
    size = store.head(key).size
    _check_size(path, size, limit, what)
    return bytes(store.get_ranges(key, [0], [size])[0]) if size else b""


def _check_size(path: PathLike, size: int, limit: int, what: str) -> None:
    if size > limit:
        raise SceneReadError(f"{display_name(path)}: {size} bytes is far larger than {what} (at most {limit}); "
                             f"this is not {what}")


def folder_files(folder: Path) -> list[Path]:
    """The regular files (or objects) directly in ``folder`` (a ``/vsis3/`` prefix: one delimiter listing)."""
    url = url_of_gdal_path(folder)
    if url is None:
        return [p for p in folder.iterdir() if is_regular_file(p)]
    _, objects = open_store(url).list_dirs()
    return [folder / o.key.rsplit("/", 1)[-1] for o in objects]


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


class LockedSource:
    """A scene read window by window through ``get(window) -> (band, y, x)`` under one lock.

    For libraries that are not thread-safe or serialise anyway (h5py, netCDF, scipy arrays): a
    decode error (a damaged chunk, a truncated file) becomes a :class:`SceneReadError` naming the
    file; ``close`` releases the file (once).
    """

    def __init__(self, meta: SceneMetadata, get: Callable[[Window], np.ndarray],
                 close: Callable[[], None] | None = None) -> None:
        self._meta = meta
        self._get = get
        self._close = close
        self._closed = False
        self._lock = threading.Lock()

    @property
    def meta(self) -> SceneMetadata:
        return self._meta

    def read(self, window: Window) -> np.ndarray:
        with self._lock:
            if self._closed:
                raise SceneReadError(f"{display_name(self._meta.path)}: read after close")
            try:
                return np.ascontiguousarray(self._get(window))
            except (OSError, ValueError, KeyError, RuntimeError) as exc:  # the libraries' errors on damaged data
                raise SceneReadError(f"{self._meta.path}: {type(exc).__name__}: {exc}") from exc

    def blocks(self, window: Window) -> Sequence[Window]:
        return [window]

    def close(self) -> None:
        with self._lock:
            if not self._closed and self._close is not None:
                self._close()
            self._closed = True


def block_grid(meta: SceneMetadata) -> ChunkGrid:
    """The grid of the source's native blocks."""
    by, bx = meta.block_shape
    return ChunkGrid(meta.height, meta.width, max(1, by), max(1, bx))
