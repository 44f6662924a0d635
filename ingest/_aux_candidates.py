"""Candidates of an aux layer: which rasters a spec names, when each was acquired, whether it can be
aligned with a scene (header only), and which one a scene takes. The choice itself is pure.

A candidate's time comes from an ``ACQUISITION_DATETIME``-like tag, ``TIFFTAG_DATETIME``, or a date
in its file name; one without any is static (a DSM) and always acceptable.
"""

from __future__ import annotations

import glob
import math
import re
import stat
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import rasterio
from rasterio.crs import CRS
from rasterio.errors import CRSError, NotGeoreferencedWarning, RasterioIOError
from rasterio.transform import Affine
from rasterio.warp import transform_bounds

from cubelake.errors import CubelakeError
from cubelake.record import AuxCandidate

from .acqtime import AcquisitionTime, format_time, parse_time
from .report import Code
from .sources import SceneMetadata
from .validate import Limits

__all__ = ["RASTER_SUFFIXES", "AuxError", "AuxSource", "Choice", "Probed", "TimeSpan", "aux_candidates", "days_text",
           "is_pattern", "overlap_fraction", "probe_aux", "raster_time", "scene_span", "select_candidate"]

#: Candidates a folder contributes (not recursive); a glob pattern takes every regular file it matches.
RASTER_SUFFIXES = (".tif", ".tiff", ".vrt", ".img", ".jp2", ".asc", ".nc", ".hgt", ".dem", ".bil")
_GLOB_CHARS = re.compile(r"[*?\[]")


def is_pattern(path: str | Path) -> bool:
    """Whether ``path`` is a glob pattern (``*``, ``?`` or ``[``)."""
    return bool(_GLOB_CHARS.search(str(path)))


class AuxError(CubelakeError):
    """An auxiliary raster that cannot be aligned with a scene; ``code`` says why."""

    def __init__(self, code: Code, message: str, rejected: tuple[AuxCandidate, ...] = ()) -> None:
        super().__init__(message)
        self.code = code
        self.rejected = rejected  # the candidates passed over, when there were several


# -- candidates and their times ------------------------------------------------------------------
def aux_candidates(path: str | Path) -> list[Path]:
    """The candidate rasters of a spec's path: the file itself, a folder's rasters, or a pattern's matches."""
    text = str(path)
    if is_pattern(text):
        found = sorted(Path(p) for p in glob.glob(text) if Path(p).is_file())
        if not found:
            raise AuxError(Code.AUX_UNREADABLE, f"{text}: the pattern matches no file")
        return found
    p = Path(text)
    if p.is_dir():
        found = sorted(c for c in p.iterdir() if c.suffix.lower() in RASTER_SUFFIXES and c.is_file())
        if not found:
            raise AuxError(Code.AUX_UNREADABLE, f"{p}: the folder holds no raster ({', '.join(RASTER_SUFFIXES)})")
        return found
    return [p]


@dataclass(frozen=True, slots=True, order=True)
class TimeSpan:
    """A time or interval (UTC): a nominal time is ``start == end``; a date alone spans its day."""

    start: datetime
    end: datetime

    def offset_s(self, scene: TimeSpan) -> float:
        """Seconds from ``scene`` to this span: > 0 later, < 0 earlier, 0 when they overlap."""
        if self.start > scene.end:
            return (self.start - scene.end).total_seconds()
        if self.end < scene.start:
            return -(scene.start - self.end).total_seconds()
        return 0.0

    def text(self) -> str:
        return format_time(self.start) if self.start == self.end else f"{format_time(self.start)}/{format_time(self.end)}"


_TIME_TAGS = ("ACQUISITION_DATETIME", "ACQUISITION_DATE", "ACQUISITIONDATETIME", "DATETIME")
_FILENAME_DATE = re.compile(r"(?<!\d)((?:19|20)\d\d)(-?)(0[1-9]|1[0-2])\2(0[1-9]|[12]\d|3[01])"
                            r"(?:[T_]?([01]\d|2[0-3])(?:\:?)([0-5]\d)(?:\:?)([0-5]\d))?(?!\d)")


def _tag_time(value: str) -> TimeSpan | None:
    v = value.strip()
    m = re.fullmatch(r"(\d{4}):(\d\d):(\d\d)[ T](\d\d):(\d\d):(\d\d)", v)  # TIFFTAG_DATETIME's own format
    if m:
        v = f"{m[1]}-{m[2]}-{m[3]}T{m[4]}:{m[5]}:{m[6]}"
    try:
        t = parse_time(v)
    except ValueError:
        return None
    if re.fullmatch(r"\d{4}-\d\d-\d\d", v):  # a date alone: somewhere in that day
        return TimeSpan(t, t + timedelta(days=1, seconds=-1))
    return TimeSpan(t, t)


def raster_time(tags: dict[str, str], name: str) -> TimeSpan | None:
    """An aux raster's acquisition time: ``ACQUISITION_DATETIME`` (or similar) tag, ``TIFFTAG_DATETIME``,
    then a date in the file name (``YYYYMMDD``, ``YYYY-MM-DD``, optionally ``THHMMSS``); ``None``: static."""
    upper = {k.upper(): v for k, v in tags.items()}
    for key in (*_TIME_TAGS, "TIFFTAG_DATETIME"):
        if upper.get(key):
            span = _tag_time(upper[key])
            if span is not None:
                return span
    m = _FILENAME_DATE.search(name)
    if m is None:
        return None
    try:
        day = datetime(int(m[1]), int(m[3]), int(m[4]), tzinfo=UTC)
    except ValueError:  # 2023-02-30
        return None
    if m[5] is None:
        return TimeSpan(day, day + timedelta(days=1, seconds=-1))
    t = day.replace(hour=int(m[5]), minute=int(m[6]), second=int(m[7]))
    return TimeSpan(t, t)


def scene_span(acq: AcquisitionTime | None) -> TimeSpan | None:
    """The scene's acquisition as a span, or ``None`` when it is unknown."""
    if acq is None or acq.source == "unknown":
        return None
    if acq.datetime:
        t = parse_time(acq.datetime)
        return TimeSpan(t, t)
    if acq.start and acq.end:
        return TimeSpan(parse_time(acq.start), parse_time(acq.end))
    return None


# -- probing a candidate (header only) -----------------------------------------------------------
@dataclass(frozen=True, slots=True)
class AuxSource:
    """What an aux raster's header says."""

    path: str
    size: int  # bytes
    mtime_ns: int
    crs_wkt: str
    transform: tuple[float, float, float, float, float, float]
    height: int
    width: int
    count: int
    dtype: str
    nodata: float | None
    band_names: tuple[str, ...]
    time: TimeSpan | None
    bounds: tuple[float, float, float, float]  # left, bottom, right, top in its own CRS


def _check_size(path: str, ds: Any, limits: Limits) -> None:
    h, w, n = ds.height, ds.width, ds.count
    if np.dtype(ds.dtypes[0]).kind == "c":
        raise AuxError(Code.AUX_UNREADABLE, f"{path}: complex pixels ({ds.dtypes[0]}) cannot be an aux layer; "
                                            "store the amplitude or phase as a real raster")
    nbytes = h * w * n * np.dtype(ds.dtypes[0]).itemsize
    if h > limits.max_dimension or w > limits.max_dimension or n > limits.max_bands or nbytes > limits.max_bytes:
        raise AuxError(Code.AUX_TOO_LARGE,
                       f"{path}: {n} band(s) x {h} x {w} {ds.dtypes[0]} ({nbytes} bytes decoded) exceeds the limits "
                       f"({limits.max_dimension} pixels per side, {limits.max_bands} bands, {limits.max_bytes} bytes); "
                       "crop it to the scenes' area (gdal_translate -projwin) or raise --max-bytes/--max-dimension")


def probe_aux(path: Path, limits: Limits) -> AuxSource:
    """The header of one candidate; :class:`AuxError` when it is missing, not a raster, too large or not georeferenced."""
    try:
        st = path.stat()
    except OSError as exc:
        raise AuxError(Code.AUX_UNREADABLE, f"{path}: aux raster not found ({exc.strerror or exc})") from None
    if not stat.S_ISREG(st.st_mode):  # a FIFO or device would block or never end
        raise AuxError(Code.AUX_UNREADABLE, f"{path}: not a regular file; an aux layer is a raster file")
    return _probe_cached(str(path.resolve()), st.st_size, st.st_mtime_ns, limits)


@lru_cache(maxsize=4096)  # a folder of candidates is probed once per run, not once per scene
def _probe_cached(path: str, size: int, mtime_ns: int, limits: Limits) -> AuxSource:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", NotGeoreferencedWarning)
            with rasterio.open(path) as ds:
                _check_size(path, ds, limits)
                t = ds.transform
                if ds.crs is None or (t.is_identity and not ds.gcps[0]):
                    raise AuxError(Code.AUX_NOT_GEOREFERENCED,
                                   f"{path}: the aux raster has no {'CRS' if ds.crs is None else 'geotransform'}; "
                                   "georeference it (gdal_translate -a_srs EPSG:... -a_ullr ...) or warp it (gdalwarp)")
                if t.is_identity:
                    raise AuxError(Code.AUX_NOT_GEOREFERENCED,
                                   f"{path}: the aux raster is located by GCPs only; warp it first (gdalwarp)")
                tags = ds.tags()
                names = tuple(d or f"band {i}" for i, d in enumerate(ds.descriptions, start=1))
                return AuxSource(path, size, mtime_ns, ds.crs.to_wkt(), (t.a, t.b, t.c, t.d, t.e, t.f), ds.height, ds.width,
                                 ds.count, ds.dtypes[0], ds.nodata, names, raster_time(tags, Path(path).name),
                                 tuple(ds.bounds))
    except RasterioIOError as exc:
        raise AuxError(Code.AUX_UNREADABLE, f"{path}: GDAL cannot read it as a raster ({exc}); it is damaged or "
                                            "not a raster file") from None


def _scene_box(meta: SceneMetadata) -> tuple[float, float, float, float]:
    a = Affine(*meta.transform) if meta.transform else Affine.identity()
    xs, ys = zip(*(a @ (c, r) for c, r in ((0, 0), (meta.width, 0), (0, meta.height), (meta.width, meta.height))),
                 strict=True)
    return min(xs), min(ys), max(xs), max(ys)


def overlap_fraction(meta: SceneMetadata, src: AuxSource) -> float:
    """The share of the scene's bounding box the aux raster's bounding box covers (0 = disjoint)."""
    assert meta.crs_wkt is not None
    try:
        left, bottom, right, top = transform_bounds(CRS.from_wkt(src.crs_wkt), CRS.from_wkt(meta.crs_wkt),
                                                    *src.bounds, densify_pts=21)
    except (CRSError, ValueError, RasterioIOError):  # no transformation between the two CRSs
        return 0.0
    x0, y0, x1, y1 = _scene_box(meta)
    w, h = min(x1, right) - max(x0, left), min(y1, top) - max(y0, bottom)
    if not all(math.isfinite(v) for v in (w, h)) or w <= 0 or h <= 0:
        return 0.0
    return (w * h) / ((x1 - x0) * (y1 - y0))


# -- choosing a candidate (pure) -----------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Probed:
    """One candidate as the selection sees it: its header (or why it has none) and its overlap with the scene."""

    path: str
    source: AuxSource | None
    error: AuxError | None = None
    overlap: float = 0.0


@dataclass(frozen=True, slots=True)
class Choice:
    """The selection's outcome: the candidate taken (or ``None`` and why), and every one passed over."""

    chosen: Probed | None
    time_delta_s: float | None
    rejected: tuple[AuxCandidate, ...]
    code: Code | None = None
    reason: str | None = None


def days_text(seconds: float) -> str:
    return f"{seconds / 86400:+.2f} d"


def select_candidate(cands: Sequence[Probed], scene: TimeSpan | None, max_delta: timedelta | None,
                     several: bool) -> Choice:
    """The candidate to warp: the one nearest the scene in time within ``max_delta``, else the static
    (undated) one covering most of the scene. A single file with no ``max_delta`` is taken whatever its time."""
    rejected: list[tuple[Probed, Code, str]] = []
    timed: list[tuple[float, Probed, str]] = []  # offset (s), candidate, its date
    static: list[Probed] = []
    for c in cands:
        if c.error is not None or c.source is None:
            err = c.error or AuxError(Code.AUX_UNREADABLE, f"{c.path}: unreadable")
            rejected.append((c, err.code, str(err)))
        elif c.overlap <= 0:
            rejected.append((c, Code.AUX_NO_OVERLAP, "its footprint does not overlap the scene"))
        elif c.source.time is None:
            static.append(c)
        elif scene is None:
            if several or max_delta is not None:
                rejected.append((c, Code.AUX_NO_TIME_MATCH, f"dated {c.source.time.text()}, but the scene's "
                                                            "acquisition time is unknown"))
            else:
                static.append(c)  # one file, no limit: its date does not matter
        else:
            delta = c.source.time.offset_s(scene)
            if max_delta is not None and abs(delta) > max_delta.total_seconds():
                rejected.append((c, Code.AUX_NO_TIME_MATCH, f"dated {c.source.time.text()}: {days_text(delta)} from the "
                                                            f"scene, more than {max_delta.total_seconds() / 86400:g} d"))
            else:
                timed.append((delta, c, c.source.time.text()))
    chosen, delta_s = None, None
    if timed:
        delta_s, chosen, _ = min(timed, key=lambda dc: (abs(dc[0]), dc[1].path))
        rejected += [(c, Code.AUX_NO_TIME_MATCH, f"dated {when}: {days_text(d)} from the scene, further than the "
                                                 "one taken") for d, c, when in timed if c is not chosen]
        rejected += [(c, Code.AUX_NO_TIME_MATCH, "undated; a dated candidate was taken") for c in static]
    elif static:
        chosen = min(static, key=lambda c: (-c.overlap, c.path))
        rejected += [(c, Code.AUX_NO_OVERLAP, f"covers {c.overlap:.0%} of the scene, less than the one taken")
                     for c in static if c is not chosen]
    out = tuple(AuxCandidate(path=c.path, code=str(code), reason=why) for c, code, why in rejected)
    if chosen is not None:
        return Choice(chosen, delta_s, out)
    codes = [code for _, code, _ in rejected]
    code = next((k for k in (Code.AUX_NO_TIME_MATCH, Code.AUX_NO_OVERLAP, Code.AUX_NOT_GEOREFERENCED,
                             Code.AUX_TOO_LARGE) if k in codes), Code.AUX_UNREADABLE)
    return Choice(None, None, out, code, _why_none(rejected, several))


def _why_none(rejected: list[tuple[Probed, Code, str]], several: bool) -> str:
    if not several and len(rejected) == 1:
        c, _, why = rejected[0]
        return why if why.startswith(c.path) else f"{c.path}: {why}"
    listed = "; ".join(why if why.startswith(c.path) else f"{Path(c.path).name}: {why}" for c, _, why in rejected[:5])
    more = f"; and {len(rejected) - 5} more" if len(rejected) > 5 else ""
    return f"none of {len(rejected)} candidate(s) fits ({listed}{more})"
