"""Scene readers, one module per input format, and the discovery that groups files into scenes.

* :mod:`.gdal` — anything GDAL reads (GeoTIFF of any layout/codec, LAN, ...)
* :mod:`.envi` — ENVI header + raw data (BSQ/BIL/BIP)
* :mod:`.matlab` — MATLAB v5 / v7.3 cubes
* :mod:`.landsat` — Landsat band GeoTIFFs + MTL
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from cubelake.errors import (
    ContentMismatchError,
    CubelakeError,
    SceneNotFoundError,
    UnsupportedFormatError,
)

from ._base import BandInfo, FileCalibration, RasterSource, SceneMetadata, block_grid
from .envi import find_envi_data_file, find_envi_header, open_envi
from .gdal import open_gdal
from .landsat import is_mtl, mtl_band_files, open_landsat, parse_mtl
from .matlab import Axes, open_mat

__all__ = [
    "BandInfo",
    "FileCalibration",
    "RasterSource",
    "SceneInput",
    "SceneKind",
    "SceneMetadata",
    "SourceOptions",
    "block_grid",
    "discover",
    "open_source",
]

log = logging.getLogger(__name__)

#: Files that are never scenes when a folder is expanded (explicit file arguments are always tried).
_SIDECAR_SUFFIXES = {
    ".md", ".txt", ".json", ".sha256", ".spc", ".xml", ".ovr", ".csv", ".yaml", ".yml", ".py", ".aux",
    ".prj", ".tfw", ".wld", ".html", ".pdf", ".png.aux.xml", ".jpg",
}
_LABEL_DIRS = ("labels", "label", "gt", "ground_truth")
_LABEL_SUFFIXES = ("_labels", "_label", "_gt")


class SceneKind(StrEnum):
    GDAL = "gdal"
    ENVI = "envi"
    MAT = "mat"
    LANDSAT = "landsat"
    MISSING = "missing"


@dataclass(frozen=True, slots=True)
class SceneInput:
    """One scene to ingest: its primary path, how to read it, and an optional label raster."""

    path: Path
    kind: SceneKind
    labels: Path | None = None
    data: Path | None = None  # ENVI data file, when found


@dataclass(frozen=True, slots=True)
class SourceOptions:
    """How to read inputs that need a hint: MATLAB variable names and axis order, size limit."""

    variable: str | None = None
    axes: Axes | None = None
    labels_variable: str | None = None
    max_bytes: int | None = None


def _magic(path: Path, n: int = 16) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(n)
    except OSError:
        return b""


def _kind_of(path: Path) -> SceneKind:
    if not path.exists():
        return SceneKind.MISSING
    if is_mtl(path):
        return SceneKind.LANDSAT
    if path.suffix.lower() == ".hdr" or find_envi_header(path) is not None:
        return SceneKind.ENVI
    if path.suffix.lower() == ".mat":
        return SceneKind.MAT
    return SceneKind.GDAL


def _label_for(path: Path) -> Path | None:
    for d in _LABEL_DIRS:
        cand = path.parent / d / path.name
        if cand.is_file():
            return cand
    for suf in _LABEL_SUFFIXES:
        cand = path.with_name(path.stem + suf + path.suffix)
        if cand.is_file():
            return cand
    return None


def _expand(paths: Iterable[Path]) -> list[tuple[Path, bool]]:
    """``(file, explicit)`` for every file named or found under a named folder, in sorted order."""
    out: list[tuple[Path, bool]] = []
    for p in paths:
        if p.is_dir():
            for root, dirs, files in os.walk(p):
                dirs.sort()
                out.extend((Path(root) / f, False) for f in sorted(files))
        else:
            out.append((p, True))
    return out


def discover(paths: Sequence[str | Path], *, labels: str | Path | None = None) -> list[SceneInput]:
    """Group input paths into scenes.

    Folders are walked recursively. An ENVI header and its data file are one scene; a Landsat
    MTL and the band files it lists are one scene; a raster with a same-named file in a
    ``labels/`` folder (or ``<name>_labels``) gets it as its label map, and that file is not a
    scene of its own. Sidecar text files found in folders are skipped; files named explicitly
    are always tried, so a bad one is reported rather than ignored. ``labels`` forces one label
    file for every scene (for a single scene).
    """
    files = _expand(Path(p) for p in paths)
    kinds = {f: _kind_of(f) for f, _ in files}
    # pass 1: files that belong to another scene (Landsat bands, label rasters)
    consumed: set[Path] = set()
    for f, _ in files:
        kind = kinds[f]
        if kind is SceneKind.LANDSAT:
            try:
                consumed.update(b.resolve() for _, b in mtl_band_files(f, parse_mtl(f)))
            except (CubelakeError, OSError) as exc:  # reported when the scene is opened
                log.debug("cannot list the bands of %s yet: %s", f, exc)
        elif kind in (SceneKind.GDAL, SceneKind.MAT, SceneKind.ENVI) and labels is None:
            label = _label_for(f)
            if label is not None:
                consumed.add(label.resolve())
    # pass 2: one scene per remaining file; an ENVI data file stands for its header
    scenes: list[SceneInput] = []
    seen: set[Path] = set()
    for f, explicit in files:
        kind = kinds[f]
        if kind is SceneKind.MISSING:
            scenes.append(SceneInput(path=f, kind=kind))
            continue
        if f.resolve() in consumed:
            continue
        if not explicit and kind is SceneKind.GDAL:
            name = f.name.lower()
            if name.startswith(".") or any(name.endswith(s) for s in _SIDECAR_SUFFIXES):
                continue
        data = None
        if kind is SceneKind.ENVI:
            header = f if f.suffix.lower() == ".hdr" else find_envi_header(f)
            assert header is not None  # _kind_of said ENVI because a header exists
            data, _ = find_envi_data_file(header)
            f = header
        if f.resolve() in seen:
            continue
        seen.add(f.resolve())
        label = Path(labels) if labels is not None else _label_for(data or f)
        scenes.append(SceneInput(path=f, kind=kind, labels=label, data=data))
    return scenes


def _sniff(path: Path) -> None:
    head = _magic(path)
    suffix = path.suffix.lower()
    if head[:4] == b"\x0e\x03\x13\x01":
        raise UnsupportedFormatError(
            f"{path}: HDF4 file (magic 0e031301); the GDAL in rasterio's wheels has no HDF4 driver. Convert it "
            "to GeoTIFF with a GDAL built with HDF4 (e.g. gdal_translate 'HDF4_EOS:EOS_GRID:...' out.tif), or "
            "use the HDF5/NetCDF edition of the product"
        )
    if suffix in (".tif", ".tiff") and head[:4] not in (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+"):
        what = (
            "a JPEG (JFIF) image" if head[:3] == b"\xff\xd8\xff"
            else "a PNG image" if head[:4] == b"\x89PNG"
            else "not a TIFF (no TIFF byte-order header)"
        )
        raise ContentMismatchError(
            f"{path}: named {path.suffix} but the content is {what}; rename it to its real type or re-export it "
            "as GeoTIFF (gdal_translate -of GTiff)"
        )


def open_source(inp: SceneInput, options: SourceOptions | None = None) -> RasterSource:
    """Open one scene for reading. Raises a :class:`~cubelake.errors.CubelakeError` naming the file."""
    options = options or SourceOptions()
    if inp.kind is SceneKind.MISSING:
        raise SceneNotFoundError(f"{inp.path}: no such file or directory; check the path")
    if inp.kind is SceneKind.LANDSAT:
        return open_landsat(inp.path)
    if inp.kind is SceneKind.ENVI:
        return open_envi(inp.path, inp.data)
    if inp.kind is SceneKind.MAT:
        return open_mat(
            inp.path,
            variable=options.variable,
            axes=options.axes,
            labels_variable=options.labels_variable,
            max_bytes=options.max_bytes,
        )
    _sniff(inp.path)
    return open_gdal(inp.path)
