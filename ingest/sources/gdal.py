"""Scenes GDAL reads (GeoTIFF of any layout/codec, ENVI pixels, LAN, ...), through rasterio.

One file holds all bands, or several single-band files of one grid are stacked (Landsat).
Every worker thread gets its own dataset handles: GDAL handles are not thread-safe, but
separate handles decode in parallel (GDAL releases the GIL in reads).
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import rasterio
import rasterio.windows
from rasterio._err import CPLE_BaseError
from rasterio.errors import NotGeoreferencedWarning, RasterioError, RasterioIOError

from cubelake.errors import SceneReadError
from cubelake.grid import Window

from ..report import Code, Issue, error, warning
from ..spectral import parse_wavelength_text, unit_factor_to_nm
from ._base import BandInfo, FileCalibration, SceneMetadata, block_grid, display_name

__all__ = ["GDAL_READ_OPTIONS", "GdalSource", "gdal_error_text", "open_gdal"]

log = logging.getLogger(__name__)

#: GDAL options for every read: turn libjpeg's "corrupt data" warnings into errors so a
#: damaged JPEG tile fails loudly instead of decoding to garbage.
GDAL_READ_OPTIONS: dict[str, Any] = {
    "GDAL_ERROR_ON_LIBJPEG_WARNING": "TRUE",
}

_DATETIME_TAGS = ("start_time", "ACQUISITIONDATETIME", "acquisition_time", "DATETIME", "TIFFTAG_DATETIME")


def gdal_error_text(exc: BaseException) -> str:
    """The most specific message of a rasterio error (rasterio hides GDAL's in ``__cause__``)."""
    parts = [str(exc)]
    cause = exc.__cause__ or exc.__context__
    while cause is not None and len(parts) < 4:
        text = str(cause)
        if text and text not in parts:
            parts.append(text)
        cause = cause.__cause__ or cause.__context__
    specific = [p for p in parts if "See previous exception" not in p]
    return "; ".join(specific or parts)


def _open(path: str) -> rasterio.io.DatasetReader:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NotGeoreferencedWarning)
        return rasterio.open(path)


class GdalSource:
    """A scene read through GDAL. ``band_map[k] = (file_index, band_number)`` for output band k."""

    def __init__(self, meta: SceneMetadata, paths: Sequence[str], band_map: Sequence[tuple[int, int]],
                 config: Mapping[str, str] | None = None) -> None:
        self._meta = meta
        self._paths = list(paths)
        self._band_map = list(band_map)
        self._config = dict(config or {})  # GDAL options for opening these files (each worker opens its own)
        self._local = threading.local()
        self._all: list[rasterio.io.DatasetReader] = []
        self._lock = threading.Lock()
        self._remote = any(str(p).startswith("/vsis3/") for p in self._paths)

    @property
    def meta(self) -> SceneMetadata:
        return self._meta

    def with_meta(self, meta: SceneMetadata) -> GdalSource:
        """The same pixels described by other metadata (e.g. an ENVI header's spectral fields)."""
        return GdalSource(meta, self._paths, self._band_map, self._config)

    def _handles(self) -> list[rasterio.io.DatasetReader]:
        handles = getattr(self._local, "handles", None)
        if handles is None:
            with self._s3_env(), rasterio.Env(**GDAL_READ_OPTIONS, **self._config):
                handles = [_open(p) for p in self._paths]
            self._local.handles = handles
            with self._lock:
                self._all.extend(handles)
        return handles

    def read(self, window: Window) -> np.ndarray:
        handles = self._handles()
        win = rasterio.windows.Window(window.col_off, window.row_off, window.width, window.height)
        out = np.empty((len(self._band_map), window.height, window.width), dtype=self._meta.dtype)
        # group consecutive output bands by file so each file is read once per window
        by_file: dict[int, list[tuple[int, int]]] = {}
        for k, (fi, bn) in enumerate(self._band_map):
            by_file.setdefault(fi, []).append((k, bn))
        try:
            with self._s3_env(), rasterio.Env(**GDAL_READ_OPTIONS):
                for fi, pairs in by_file.items():
                    ks = [k for k, _ in pairs]
                    data = handles[fi].read(indexes=[bn for _, bn in pairs], window=win)
                    out[ks] = data
        except (RasterioError, CPLE_BaseError, OSError, ValueError) as exc:  # GDAL's words for a damaged block
            raise SceneReadError(f"{self._meta.path}: {gdal_error_text(exc)}") from exc
        return out

    @property
    def pixel_interleaved(self) -> bool:
        """One pixel-interleaved file holding every band in order: :meth:`read_pixels` then copies GDAL's blocks
        as they are, where a ``(band, y, x)`` read de-interleaves every value (2x the CPU of a read)."""
        if len(self._paths) != 1 or self._band_map != [(0, k) for k in range(1, len(self._band_map) + 1)]:
            return False
        interleaving = self._handles()[0].interleaving
        return getattr(interleaving, "value", interleaving) == "PIXEL"

    def _pixel_handle(self) -> rasterio.io.DatasetReader:
        """This thread's handle for :meth:`read_pixels`, opened with GTiff's direct I/O (GDAL reads the option
        when it opens a file): it copies an uncompressed file's pixels straight into the caller's array, 10x
        less CPU than through the block cache (measured here); GDAL uses it only where it applies."""
        handle = getattr(self._local, "pixel_handle", None)
        if handle is None:
            with self._s3_env(), rasterio.Env(**GDAL_READ_OPTIONS, **self._config, GTIFF_DIRECT_IO="YES"):
                handle = _open(self._paths[0])
            self._local.pixel_handle = handle
            with self._lock:
                self._all.append(handle)
        return handle

    def read_pixels(self, window: Window) -> np.ndarray:
        """The window's pixels as a C-contiguous ``(y, x, band)`` array (every band, in file order)."""
        handle = self._pixel_handle()
        win = rasterio.windows.Window(window.col_off, window.row_off, window.width, window.height)
        out = np.empty((window.height, window.width, len(self._band_map)), dtype=self._meta.dtype)
        try:
            # rasterio hands GDAL the strides of ``out``: a (band, y, x) view of (y, x, band) memory
            with self._s3_env(), rasterio.Env(**GDAL_READ_OPTIONS):
                handle.read(out=out.transpose(2, 0, 1), window=win)
        except (RasterioError, CPLE_BaseError, OSError, ValueError) as exc:
            raise SceneReadError(f"{self._meta.path}: {gdal_error_text(exc)}") from exc
        return out

    def _s3_env(self) -> Any:
        """GDAL's S3 settings for an object-store source, in this thread. rasterio keeps GDAL options per thread
        outside the main one, so an ingest run from a thread (a Dask worker, an application's pool) must set
        them in each reading thread, not only around the open (found by the jobs' S3 test)."""
        if not self._remote:
            return contextlib.nullcontext()
        from cubelake.storage import S3Options

        return S3Options().gdal_env()

    def blocks(self, window: Window) -> list[Window]:
        grid = block_grid(self._meta)
        return [grid.chunk_window(c) for c in grid.chunks_for_window(window)]

    def close(self) -> None:
        with self._lock:
            for h in self._all:
                h.close()
            self._all.clear()
        self._local = threading.local()

    def __enter__(self) -> GdalSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _tag_number(tags: dict[str, str], key: str, where: str, issues: list[Issue]) -> float | None:
    """A numeric band tag, or ``None`` with an error naming the band and the tag."""
    raw = tags[key]
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        issues.append(error(Code.BAD_METADATA, f"band tag {key} = {raw[:40]!r} is not a finite number; fix the tag "
                                               "(gdal_edit.py -mo) or give wavelengths in a profile",
                            where=f"{where}: {key}"))
        return None
    return value


def _band_info(ds: rasterio.io.DatasetReader, bidx: int, issues: list[Issue], path: str = "") -> BandInfo:
    tags = ds.tags(bidx)
    imagery = ds.tags(bidx, ns="IMAGERY") if "IMAGERY" in (ds.tag_namespaces(bidx) or []) else {}
    desc = ds.descriptions[bidx - 1]
    wl: float | None = None
    fwhm: float | None = None
    where = f"{path} band {bidx}"
    if "CENTRAL_WAVELENGTH_UM" in imagery:
        um = _tag_number(imagery, "CENTRAL_WAVELENGTH_UM", where, issues)
        wl = um * 1000.0 if um is not None else None
        if "FWHM_UM" in imagery:
            fw_um = _tag_number(imagery, "FWHM_UM", where, issues)
            fwhm = fw_um * 1000.0 if fw_um is not None else None
    elif "wavelength" in tags:
        units = tags.get("wavelength_units") or ds.tags().get("wavelength_units")
        factor = unit_factor_to_nm(units) if units else None
        raw = _tag_number(tags, "wavelength", where, issues)
        if raw is None:
            return BandInfo(number=bidx, name=desc)
        if factor is None:
            factor = 1000.0 if raw < 30 else 1.0
            if bidx == 1:
                issues.append(
                    warning(
                        Code.WAVELENGTH_UNITS_ASSUMED,
                        f"band tags give wavelengths without a known unit ({units!r}); assumed "
                        f"{'micrometres' if factor == 1000.0 else 'nanometres'} from the values",
                    )
                )
        wl = raw * factor
        if "fwhm" in tags:
            fw = _tag_number(tags, "fwhm", where, issues)
            fwhm = fw * factor if fw is not None else None
    else:
        wl = parse_wavelength_text(desc)
    bbl = tags.get("bbl")
    flagged = bbl is not None and bbl.strip() in ("0", "0.0")
    return BandInfo(number=bidx, name=desc, wavelength_nm=wl, fwhm_nm=fwhm, flagged_bad=flagged)


def describe_dataset(ds: rasterio.io.DatasetReader, path: str) -> dict[str, Any]:
    """Grid, dtype and layout facts of one open dataset (shared by GeoTIFF, ENVI and stacks)."""
    t = ds.transform
    identity = t.is_identity or (ds.crs is None and t == rasterio.Affine(1, 0, 0, 0, 1, 0))
    georef = not identity
    # a CRS without a geotransform (e.g. LAN files' dummy EPSG:4326) locates nothing: drop it
    crs = ds.crs if georef else None
    epsg = None
    if crs is not None:
        try:
            epsg = crs.to_epsg()
        except Exception:  # pyproj/GDAL may not match an EPSG code: keep the WKT only
            epsg = None
    block = ds.block_shapes[0] if ds.block_shapes else (1, ds.width)
    # rasterio returns an enum for known values and a plain string for others (e.g. SGILOG)
    compression = getattr(ds.compression, "value", ds.compression)
    interleave = getattr(ds.interleaving, "value", ds.interleaving)
    interleave = interleave.lower() if isinstance(interleave, str) else None
    return {
        "count": ds.count,
        "height": ds.height,
        "width": ds.width,
        "dtype": ds.dtypes[0],
        "crs_wkt": crs.to_wkt() if crs is not None else None,
        "crs_epsg": epsg,
        "transform": (t.a, t.b, t.c, t.d, t.e, t.f) if georef else None,
        "nodata": ds.nodata,
        "block_shape": (int(block[0]), int(block[1])),
        "interleave": interleave,
        "compression": compression,
        "has_rpcs": bool(ds.rpcs),
        "georeferenced": georef,
        "driver": ds.driver,
    }


def open_gdal(path: str | Path, *, band_files: Sequence[str] | None = None,
              config: Mapping[str, str] | None = None) -> GdalSource:
    """Open a scene with GDAL. With ``band_files``, stack those single-band files instead.

    ``config``: GDAL configuration options for opening the files, here and in every worker thread.
    Raises :class:`SceneReadError` naming the file and GDAL's reason when it cannot be opened.
    """
    path = str(path)
    files = list(band_files) if band_files else [path]
    issues: list[Issue] = []
    try:
        with rasterio.Env(**GDAL_READ_OPTIONS, **(config or {})):
            handles = [_open(f) for f in files]
    except RasterioIOError as exc:
        raise SceneReadError(f"{display_name(path)}: GDAL cannot open it: {gdal_error_text(exc)}") from exc
    try:
        first = handles[0]
        facts = describe_dataset(first, path)
        dtypes = {d for h in handles for d in h.dtypes}
        if len(dtypes) > 1:
            raise SceneReadError(
                f"{display_name(path)}: bands have mixed data types {sorted(dtypes)}; cubelake needs one dtype per scene "
                "(split the bands into separate scenes or convert them with gdal_translate -ot)"
            )
        band_map: list[tuple[int, int]] = []
        bands: list[BandInfo] = []
        for fi, h in enumerate(handles):
            if (h.height, h.width) != (first.height, first.width) or h.transform != first.transform:
                raise SceneReadError(
                    f"{display_name(files[fi])}: band file grid {h.height}x{h.width} {tuple(h.transform)[:6]} differs from "
                    f"{display_name(files[0])} {first.height}x{first.width} {tuple(first.transform)[:6]}; stacked band files must share one grid"
                )
            for b in range(1, h.count + 1):
                info = _band_info(h, b, issues, display_name(files[fi]))
                n = len(band_map) + 1
                bands.append(BandInfo(n, info.name, info.wavelength_nm, info.fwhm_nm, info.flagged_bad))
                band_map.append((fi, b))
        scales = [s for h in handles for s in h.scales]
        offsets = [o for h in handles for o in h.offsets]
        calibrations: tuple[FileCalibration, ...] = ()
        if any(s != 1.0 for s in scales) or any(o != 0.0 for o in offsets):
            calibrations = (
                FileCalibration(
                    "gdal_scale_offset",
                    tuple(float(s) for s in scales),
                    tuple(float(o) for o in offsets),
                    unit=first.units[0] or None,
                    note="GDAL band scale/offset (value = scale x DN + offset)",
                ),
            )
        tags = {k: v for k, v in first.tags().items() if len(v) < 2000}
        dt = next((tags[k] for k in _DATETIME_TAGS if k in tags), None)
        nodata = facts.pop("nodata")
        driver = facts.pop("driver")
        facts.pop("count")
        meta = SceneMetadata(
            path=path,
            files=tuple(files),
            format=driver,
            count=len(band_map),
            nodata=nodata,
            bands=tuple(bands),
            datetime=dt,
            tags=tags,
            calibrations=calibrations,
            issues=tuple(issues),
            **facts,
        )
    finally:
        for h in handles:
            h.close()
    return GdalSource(meta, files, band_map, config)
