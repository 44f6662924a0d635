"""Scene readers, one module per input format, and the discovery that groups files into scenes.

* :mod:`.gdal` — anything GDAL reads (GeoTIFF of any layout/codec, LAN, ...)
* :mod:`.envi` — ENVI header + raw data (BSQ/BIL/BIP)
* :mod:`.matlab` — MATLAB v5 / v7.3 cubes
* :mod:`.landsat` — Landsat band GeoTIFFs + MTL
* :mod:`.emit` — NASA EMIT L1B/L2A NetCDF-4 granules, orthorectified through their GLT
* :mod:`.prisma` — ASI PRISMA L1/L2 HDF5-EOS products (VNIR + SWIR merged)
* :mod:`.dlr` — DLR EnMAP (L1B/L1C/L2A) and DESIS (L1C/L2A) deliveries: METADATA.XML + SPECTRAL_IMAGE
* :mod:`.netcdf` — any other NetCDF/HDF5 cube (``--variable``, ``--axes``, ``--wavelength-variable``)

HDF5 and NetCDF files are told apart by their content (signature, then the product's own
attributes and groups), never by their name.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
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

from ._base import (
    BandInfo,
    FileCalibration,
    RasterSource,
    SceneMetadata,
    block_grid,
    display_name,
    file_size,
    is_folder,
    is_regular_file,
)
from .dlr import dlr_side_files, is_dlr_metadata, open_dlr
from .emit import emit_product, open_emit
from .envi import find_envi_data_file, find_envi_header, open_envi
from .gdal import open_gdal
from .hdf import hdf5_signature_at, is_netcdf3, open_h5
from .landsat import is_mtl, mtl_band_files, open_landsat, parse_mtl
from .matlab import Axes, open_mat
from .netcdf import open_netcdf
from .prisma import open_prisma, prisma_level

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
    "display_name",
    "file_size",
    "is_lake",
    "is_regular_file",
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
    DLR = "dlr"  # an EnMAP/DESIS delivery, named by its METADATA.XML
    MISSING = "missing"
    SPECIAL = "special"  # a path that cannot be a scene: FIFO, device, empty folder, ... (``problem`` says why)


@dataclass(frozen=True, slots=True)
class SceneInput:
    """One scene to ingest: its primary path, how to read it, and an optional label raster."""

    path: Path
    kind: SceneKind
    labels: Path | None = None
    data: Path | None = None  # ENVI data file, when found
    problem: str | None = None  # why a MISSING/SPECIAL path is no scene
    url: str | None = None  # an object-store source (``path`` is then GDAL's /vsis3/ name for it)

    @property
    def name(self) -> str:
        """What messages and records call the input: its URL, or its path."""
        return self.url or str(self.path)


@dataclass(frozen=True, slots=True)
class SourceOptions:
    """How to read inputs that need a hint: MATLAB variable names and axis order, size limit."""

    variable: str | None = None
    axes: Axes | None = None
    labels_variable: str | None = None
    max_bytes: int | None = None
    wavelength_variable: str | None = None  # NetCDF/HDF5: the variable holding the band centres


#: Enough of a file's start to find the HDF5 signature behind a user block of up to 2 KiB.
_HEAD_BYTES = 2048 + 8


def _magic(path: Path, n: int = _HEAD_BYTES) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(n)
    except OSError:
        return b""


def _path_problem(path: Path) -> tuple[SceneKind, str] | None:
    """Why ``path`` cannot be read as a scene file without even opening it (``None``: a regular file)."""
    try:
        os.fsencode(path).decode("utf-8")
    except UnicodeDecodeError:
        return SceneKind.SPECIAL, (f"{path}: the file name is not valid UTF-8 ({os.fsencode(path.name)!r}); "
                                   "GDAL cannot open such names. Rename the file")
    try:
        st = path.stat()
    except FileNotFoundError:
        what = "a broken symbolic link" if path.is_symlink() else "no such file or directory"
        return SceneKind.MISSING, f"{path}: {what}; check the path"
    except OSError as exc:
        reason = "a symbolic link loop" if exc.errno == errno.ELOOP else (exc.strerror or str(exc))
        return SceneKind.SPECIAL, f"{path}: cannot be read: {reason}"
    if stat.S_ISREG(st.st_mode):
        return None
    kind = ("a folder" if stat.S_ISDIR(st.st_mode) else "a named pipe (FIFO)" if stat.S_ISFIFO(st.st_mode)
            else "a socket" if stat.S_ISSOCK(st.st_mode) else "a device" if stat.S_ISCHR(st.st_mode)
            or stat.S_ISBLK(st.st_mode) else "not a regular file")
    # never opened: reading a FIFO or a device would block or never end
    return SceneKind.SPECIAL, f"{path}: is {kind}, not a regular file; give scene files (or folders of them)"


def _kind_of(path: Path) -> SceneKind:
    if is_mtl(path):
        return SceneKind.LANDSAT
    if is_dlr_metadata(path):
        return SceneKind.DLR
    if path.suffix.lower() == ".hdr" or find_envi_header(path) is not None:
        return SceneKind.ENVI
    if path.suffix.lower() == ".mat":
        return SceneKind.MAT
    return SceneKind.GDAL


def is_lake(folder: Path) -> bool:
    """Whether ``folder`` is the root of a cubelake lake (its ``lake.json`` says so)."""
    marker = folder / "lake.json"
    try:
        return is_regular_file(marker) and marker.stat().st_size < 1 << 20 and '"cubelake-lake"' in marker.read_text()
    except (OSError, UnicodeDecodeError):
        return False


def _label_for(path: Path) -> Path | None:
    for d in _LABEL_DIRS:
        cand = path.parent / d / path.name
        if is_regular_file(cand):
            return cand
    for suf in _LABEL_SUFFIXES:
        cand = path.with_name(path.stem + suf + path.suffix)
        if is_regular_file(cand):
            return cand
    return None


def _inside(path: Path, roots: Sequence[Path]) -> bool:
    p = path.resolve()
    return any(p == r or r in p.parents for r in roots)


_Entry = tuple[Path, bool] | SceneInput  # (file, named explicitly), or a named path that holds no file to try


def _walk(folder: Path, skip: Sequence[Path], out: list[_Entry]) -> None:
    """Every file under ``folder`` (not explicit), sorted; lakes and unreadable folders are reported, not entered."""
    def onerror(exc: OSError) -> None:
        where = Path(exc.filename) if exc.filename else folder
        out.append(SceneInput(where, SceneKind.SPECIAL,
                              problem=f"{where}: cannot list this folder: {exc.strerror or exc}"))

    for root, dirs, files in os.walk(folder, onerror=onerror):
        here = Path(root)
        kept = []
        for d in sorted(dirs):
            sub = here / d
            if _inside(sub, skip) or is_lake(sub):
                log.info("%s: a cubelake lake, not an input; not walked into", sub)
            else:
                kept.append(d)
        dirs[:] = kept
        out.extend((here / f, False) for f in sorted(files))


def _expand(paths: Iterable[Path], skip: Sequence[Path]) -> list[_Entry]:
    """Every file named or found under a named folder, in order; named paths that hold nothing to try
    (empty folders, lakes) as :class:`SceneInput` with their problem."""
    out: list[_Entry] = []
    for p in paths:
        if not is_folder(p):
            out.append((p, True))
        elif _inside(p, skip) or is_lake(p):
            out.append(SceneInput(p, SceneKind.SPECIAL, problem=(
                f"{p}: is a cubelake lake (or inside one), not an input; ingest the scenes' sources instead")))
        else:
            before = len(out)
            _walk(p, skip, out)
            if len(out) == before:
                out.append(SceneInput(p, SceneKind.SPECIAL, problem=f"{p}: an empty folder; no scene files in it"))
    return out


def discover(paths: Sequence[str | Path], *, labels: str | Path | None = None,
             skip: Sequence[str | Path] = ()) -> list[SceneInput]:
    """Group input paths into scenes.

    Folders are walked recursively. An ENVI header and its data file are one scene; a Landsat
    MTL and the band files it lists are one scene; a raster with a same-named file in a
    ``labels/`` folder (or ``<name>_labels``) gets it as its label map, and that file is not a
    scene of its own. Sidecar text files found in folders are skipped; files named explicitly
    are always tried, so a bad one is reported rather than ignored. ``labels`` forces one label
    file for every scene (for a single scene). Folders under ``skip`` (the target lake) and
    other lakes are not walked into. A path that cannot be a scene (missing, a FIFO, a device,
    an empty folder, a name that is not UTF-8) is returned with its ``problem``, never opened.
    """
    from cubelake.storage import is_url

    remote = [str(p) for p in paths if is_url(str(p))]
    if remote:
        from .remote import discover_remote

        local = discover([p for p in paths if not is_url(str(p))], labels=labels, skip=skip) \
            if len(remote) < len(paths) else []
        return local + _once([s for url in remote for s in discover_remote(url)])
    entries = _expand((Path(p) for p in paths), [Path(r).resolve() for r in skip])
    files = [e for e in entries if isinstance(e, tuple)]
    problems = {f: _path_problem(f) for f, _ in files}
    kinds = {f: (problems[f] or (_kind_of(f), None))[0] for f, _ in files}
    consumed = _consumed(files, kinds, labels)
    scenes: list[SceneInput] = []
    seen: set[Path] = set()
    for entry in entries:
        if isinstance(entry, SceneInput):
            scenes.append(entry)
            continue
        f, explicit = entry
        kind, problem = kinds[f], (problems[f] or (None, None))[1]
        if problem is not None:
            if explicit or not _is_sidecar(f):
                scenes.append(SceneInput(path=f, kind=kind, problem=problem))
            continue
        if f.resolve() in consumed or (not explicit and kind is SceneKind.GDAL and _is_sidecar(f)):
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


def _once(scenes: list[SceneInput]) -> list[SceneInput]:
    """Each object-store scene once, as locally: a header may be named on its own and again through its
    prefix or its data object."""
    seen: set[str | None] = set()
    out = []
    for s in scenes:
        if s.url not in seen:
            out.append(s)
            seen.add(s.url)
    return out


def _is_sidecar(f: Path) -> bool:
    name = f.name.lower()
    return name.startswith(".") or any(name.endswith(s) for s in _SIDECAR_SUFFIXES)


def _consumed(files: list[tuple[Path, bool]], kinds: dict[Path, SceneKind], labels: str | Path | None) -> set[Path]:
    """Files that belong to another scene (Landsat bands, label rasters)."""
    consumed: set[Path] = set()
    for f, _ in files:
        kind = kinds[f]
        if kind is SceneKind.LANDSAT:
            try:
                consumed.update(b.resolve() for _, b in mtl_band_files(f, parse_mtl(f))[0])
            except (CubelakeError, OSError) as exc:  # reported when the scene is opened
                log.debug("cannot list the bands of %s yet: %s", f, exc)
        elif kind is SceneKind.DLR:  # the delivery's image(s), quicklooks and masks belong to its XML
            consumed.update(p.resolve() for p in dlr_side_files(f))
        elif kind in (SceneKind.GDAL, SceneKind.MAT, SceneKind.ENVI) and labels is None:
            label = _label_for(f)
            if label is not None:
                consumed.add(label.resolve())
    return consumed


def _sniff(path: Path, head: bytes | None = None) -> None:
    head = _magic(path) if head is None else head
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
        raise SceneNotFoundError(inp.problem or f"{inp.path}: no such file or directory; check the path")
    if inp.kind is SceneKind.SPECIAL:
        raise UnsupportedFormatError(inp.problem or f"{inp.path}: not a regular file")
    if inp.kind is SceneKind.LANDSAT:
        return open_landsat(inp.path)
    if inp.kind is SceneKind.DLR:
        return open_dlr(inp.path)
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
    head = _remote_magic(inp.url) if inp.url else _magic(inp.path)
    _sniff(inp.path, head)
    if hdf5_signature_at(head) is not None or is_netcdf3(head):
        return _open_scientific(inp.path, head, options)
    return open_gdal(inp.path)


def _open_scientific(path: Path, head: bytes, options: SourceOptions) -> RasterSource:
    """A product reader when the file's content is a product cubelake knows (EMIT, PRISMA), else the generic
    NetCDF/HDF5 cube reader."""
    if hdf5_signature_at(head) is not None and options.variable is None:
        h5 = open_h5(path)
        try:
            variable = emit_product(h5)
            if variable is not None:
                return open_emit(path, h5, variable)
            level = prisma_level(h5)
            if level is not None:
                return open_prisma(path, h5, level)
        except BaseException:
            h5.close()
            raise
        h5.close()
    return open_netcdf(path, head, variable=options.variable, axes=options.axes,
                       wavelength_variable=options.wavelength_variable)


def _remote_magic(url: str, n: int = _HEAD_BYTES) -> bytes:
    from cubelake.storage import object_at

    store, key = object_at(url)
    size = store.head(key).size
    return bytes(store.get_ranges(key, [0], [min(n, size)])[0]) if size else b""
