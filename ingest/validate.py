"""Scene checks that need no pixel pass: size limits, georeferencing, TIFF block table.

Pixel-level checks (every block decodes, all-nodata/constant/non-finite bands) run in the
scan (:mod:`.scan`) and are turned into issues by :func:`stats_issues`.
"""

from __future__ import annotations

import contextlib
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import tifffile

from .report import Code, Issue, error, warning
from .sources import SceneMetadata, file_size, is_regular_file
from .spectral import format_band_ranges
from .stats import ScanStats

__all__ = ["Limits", "check_dimensions", "check_georeferencing", "inspect_tiff", "stats_issues"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Limits:
    """Guards checked from the header, before any pixel is read (decompression-bomb defence)."""

    max_bytes: int = 64 * 1024**3  # decoded size of the whole scene
    max_dimension: int = 1_000_000  # rows or columns
    max_bands: int = 10_000


def check_dimensions(meta: SceneMetadata, limits: Limits) -> list[Issue]:
    issues: list[Issue] = []
    h, w, n = meta.height, meta.width, meta.count
    if h <= 0 or w <= 0 or n <= 0:
        issues.append(
            error(Code.BAD_DIMENSIONS, f"declared size is {n} bands x {h} rows x {w} columns; every dimension must be > 0")
        )
        return issues
    if h > limits.max_dimension or w > limits.max_dimension:
        issues.append(
            error(
                Code.TOO_LARGE,
                f"declared size {h} rows x {w} columns exceeds the {limits.max_dimension}-pixel limit per dimension; "
                "a header this large on a small file is a decompression bomb. Raise --max-dimension if it is genuine",
            )
        )
    if n > limits.max_bands:
        issues.append(
            error(Code.TOO_LARGE, f"declared {n} bands exceeds the {limits.max_bands}-band limit; raise --max-bands if genuine")
        )
    try:
        itemsize = np.dtype(meta.dtype).itemsize
    except TypeError:
        itemsize = 8
    decoded = h * w * n * itemsize
    if decoded > limits.max_bytes:
        on_disk = sum(file_size(f) for f in meta.files if is_regular_file(f))  # objects: one HEAD each
        issues.append(
            error(
                Code.TOO_LARGE,
                f"declared size {n}x{h}x{w} {meta.dtype} decodes to {decoded / 1024**3:.1f} GiB, over the "
                f"{limits.max_bytes / 1024**3:.1f} GiB limit (the file is {on_disk / 1024**2:.1f} MiB on disk). "
                "If the scene is genuine, raise --max-bytes",
            )
        )
    return issues


def check_georeferencing(meta: SceneMetadata) -> list[Issue]:
    issues: list[Issue] = []
    if meta.format.startswith("MAT"):
        return issues  # the reader already warned: MATLAB files have no georeferencing
    if meta.transform is None:
        hint = " (the file has RPCs: orthorectify it first, e.g. gdalwarp -rpc)" if meta.has_rpcs else ""
        issues.append(
            warning(
                Code.NO_TRANSFORM,
                f"no geotransform; the product uses a pixel grid (x, y = pixel centres){hint}",
            )
        )
    else:
        _a, b, _c, d, e, _f = meta.transform
        if b != 0 or d != 0:
            issues.append(
                warning(
                    Code.ROTATED_TRANSFORM,
                    f"rotated/sheared geotransform (b={b:g}, d={d:g}); the COG keeps it, the Zarr stores it as "
                    "GeoTransform without 1-D x/y coordinates. Warp to a north-up grid (gdalwarp) for x/y coordinates",
                )
            )
        elif e > 0:
            issues.append(
                warning(
                    Code.Y_UP_TRANSFORM,
                    f"y-up geotransform (pixel height {e:g} > 0): row 0 is the southern edge; kept as is",
                )
            )
    if meta.crs_wkt is None:
        issues.append(warning(Code.NO_CRS, "no coordinate reference system; coordinates are not tied to the Earth"))
    return issues


@dataclass(frozen=True, slots=True)
class _TiffHeader:
    """What the block checks need from a TIFF's first image, read by tifffile."""

    size: int  # of the file, bytes
    offsets: np.ndarray
    counts: np.ndarray
    shape: tuple[int, int]  # (rows, columns)
    block: tuple[int, int]  # (rows, columns) of a tile or strip
    tiled: bool
    planes: int  # separate sample planes (PlanarConfiguration 2), else 1
    sampleformat: int
    bits: int
    known_dtype: bool
    lost_tags: tuple[str, ...]  # tags tifffile dropped because their values lie outside the file


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _remote_reader(url: str, stack: contextlib.ExitStack) -> tuple[int, Any]:
    """Size and a range-reading file of an object-store TIFF (tifffile reads only the header's ranges)."""
    from cubelake.storage import object_at

    store, key = object_at(url)
    return store.head(key).size, stack.enter_context(store.open_reader(key, buffer_size=256 * 1024))


def _read_tiff_header(p: Path, url: str | None = None) -> _TiffHeader | None:
    """The first image's block table and layout; ``None`` if tifffile cannot parse it (GDAL has the last word).

    tifffile reports tags it had to drop (a value offset past the end of the file) only through
    its logger, so its ERROR records are collected here rather than shown.
    """
    tlog = logging.getLogger("tifffile")
    level, handler = tlog.level, _Collect()
    tlog.setLevel(logging.ERROR)
    tlog.addHandler(handler)
    tlog.propagate, propagate = False, tlog.propagate
    try:
        with contextlib.ExitStack() as stack:
            size, fh = (p.stat().st_size, None) if url is None else _remote_reader(url, stack)
            tif = stack.enter_context(tifffile.TiffFile(fh if fh is not None else p))
            page = tif.pages.first
            tiled = bool(page.is_tiled)
            h, w = int(page.imagelength), int(page.imagewidth)
            block = ((int(page.tilelength), int(page.tilewidth)) if tiled
                     else (int(page.rowsperstrip or h) or h, w))
            return _TiffHeader(
                size=size,
                offsets=np.asarray(page.dataoffsets, dtype=np.uint64),
                counts=np.asarray(page.databytecounts, dtype=np.uint64),
                shape=(h, w), block=block, tiled=tiled,
                planes=int(page.samplesperpixel) if int(page.planarconfig) == 2 else 1,
                sampleformat=int(page.sampleformat), bits=int(page.bitspersample),
                known_dtype=page.dtype is not None,
                lost_tags=_lost_tags(handler.messages),
            )
    except Exception as exc:  # tifffile raises many types on damaged files; GDAL has the final say
        log.debug("tifffile could not inspect %s: %s", p, exc)
        return None
    finally:
        tlog.removeHandler(handler)
        tlog.setLevel(level)
        tlog.propagate = propagate


_LOST_TAG = re.compile(r"TiffTag (\d+) @\d+> invalid value offset")


def _lost_tags(messages: list[str]) -> tuple[str, ...]:
    """``"33550 (ModelPixelScaleTag)"`` for each tag tifffile dropped for a value offset past the file's end."""
    codes = [int(m.group(1)) for msg in messages if (m := _LOST_TAG.search(msg))]
    return tuple(f"{c} ({tifffile.TIFF.TAGS.get(c, 'unknown')})" for c in codes)


def inspect_tiff(path: str, gdal_dtype: str | None = None, url: str | None = None) -> list[Issue]:
    """Header checks of a TIFF: truncation (blocks or tag values past the end), corrupt block tables,
    tile sizes and sample formats the TIFF specification does not allow, absent blocks.

    ``gdal_dtype``: the type GDAL reads; a complex one is reported by the plan, not here again.
    """
    header = _read_tiff_header(Path(path), url)
    if header is None:
        return []
    issues = _layout_issues(header, gdal_dtype)
    if issues:
        return issues  # the block table cannot be judged against a layout that is itself wrong
    return _truncation_issues(header) + _sparse_issues(header)


def _layout_issues(t: _TiffHeader, gdal_dtype: str | None) -> list[Issue]:
    issues = []
    if t.lost_tags:
        issues.append(error(
            Code.TRUNCATED,
            f"the values of TIFF tag(s) {', '.join(t.lost_tags)} lie past the end of the file ({t.size} bytes): the file "
            "is truncated (its georeferencing or other metadata is lost). Re-copy or re-download it",
            where="TIFF header"))
    gdal_complex = gdal_dtype is not None and gdal_dtype.startswith("complex")
    if (t.sampleformat in (5, 6) or not t.known_dtype) and not gdal_complex:
        what = "complex numbers, which cubelake cannot store" if t.sampleformat in (5, 6) else "not a pixel type"
        issues.append(error(
            Code.UNSUPPORTED_DTYPE,
            f"SampleFormat {t.sampleformat} with BitsPerSample {t.bits} is {what} (it stores unsigned/signed "
            "integers and IEEE floats); the header is damaged, or convert the file (gdal_translate -ot)",
            where="TIFF header"))
    by, bx = t.block
    if t.tiled and (by % 16 or bx % 16 or by <= 0 or bx <= 0):
        issues.append(error(
            Code.TRUNCATED,
            f"tiles of {by}x{bx} pixels: TIFF requires tile sides that are positive multiples of 16, so the tile "
            "layout is corrupt. Re-copy or re-export the file", where="TIFF header"))
    elif by > 0 and bx > 0:
        expected = -(-t.shape[0] // by) * -(-t.shape[1] // bx) * t.planes
        if len(t.offsets) != expected:
            issues.append(error(
                Code.TRUNCATED,
                f"the block table lists {len(t.offsets)} {'tiles' if t.tiled else 'strips'}, but a {t.shape[0]}x"
                f"{t.shape[1]} image in {by}x{bx} blocks has {expected}: the header is corrupt. Re-copy or "
                "re-export the file", where="TIFF header"))
    return issues


def _truncation_issues(t: _TiffHeader) -> list[Issue]:
    offsets, counts, size = t.offsets, t.counts, t.size
    if len(offsets) == 0 or len(offsets) != len(counts):
        return []
    issues: list[Issue] = []
    present = counts > 0
    ends = offsets + counts
    beyond = present & (ends > np.uint64(size))
    if beyond.any():
        issues.append(
            error(
                Code.TRUNCATED,
                f"{int(beyond.sum())} of {len(offsets)} blocks lie beyond the end of the file ({size} bytes; the "
                f"furthest ends at byte {int(ends[present].max())}): the file is truncated or its block table is "
                "corrupt. Re-copy or re-download it",
                where=f"first bad block #{int(np.argmax(beyond))}",
            )
        )
    issues.extend(_block_table_issues(offsets[present & ~beyond], counts[present & ~beyond]))
    return issues


def _sparse_issues(t: _TiffHeader) -> list[Issue]:
    if len(t.offsets) == 0 or len(t.offsets) != len(t.counts):
        return []
    present = t.counts > 0
    absent = int((~present).sum())
    if absent == len(t.offsets):
        return [error(
            Code.NO_VALID_DATA,
            f"all {absent} blocks of the full-resolution image are absent (sparse file): there are no pixels to "
            "ingest",
        )]
    if absent:
        return [warning(
            Code.SPARSE_BLOCKS,
            f"{absent} of {len(t.offsets)} blocks are absent (sparse TIFF); GDAL reads them as nodata/0",
        )]
    return []


def _block_table_issues(offsets: np.ndarray, counts: np.ndarray) -> list[Issue]:
    """Blocks whose bytes start inside the 8-byte TIFF header or overlap another block's: a damaged block
    table (a zeroed StripOffsets would decode the header as pixels of every band)."""
    if len(offsets) == 0:
        return []
    issues = []
    in_header = offsets < 8
    if in_header.any():
        issues.append(error(
            Code.TRUNCATED,
            f"{int(in_header.sum())} of {len(offsets)} blocks start at byte {int(offsets[in_header].min())}, inside "
            "the TIFF header: the block table (StripOffsets/TileOffsets) is corrupt. Re-copy or re-export the file",
            where=f"first bad block #{int(np.argmax(in_header))}"))
    order = np.argsort(offsets, kind="stable")
    starts, ends = offsets[order], offsets[order] + counts[order]
    overlap = ends[:-1] > starts[1:]
    if overlap.any():
        issues.append(error(
            Code.TRUNCATED,
            f"{int(overlap.sum())} of {len(offsets)} blocks overlap the next block's bytes (e.g. blocks "
            f"#{int(order[np.argmax(overlap)])} and #{int(order[np.argmax(overlap) + 1])}): the block table is "
            "corrupt, and the overlapping blocks would decode to the same or mixed pixels. Re-copy or re-export the file",
            where=f"block #{int(order[np.argmax(overlap)])}"))
    return issues


def stats_issues(stats: ScanStats, meta: SceneMetadata, nodata: float | None) -> list[Issue]:
    """Band-level findings of the pixel pass."""
    issues: list[Issue] = []
    empty = [i + 1 for i in range(stats.n) if stats.valid[i] == 0]
    if empty and len(empty) == stats.n:
        issues.append(
            error(
                Code.NO_VALID_DATA,
                f"every band is entirely nodata ({'nodata=' + repr(nodata) if nodata is not None else 'non-finite'}): "
                "the scene holds no data. If the nodata value is wrong, override it with a profile",
            )
        )
        return issues
    if empty:
        issues.append(
            warning(Code.ALL_NODATA_BAND, f"band(s) {format_band_ranges(empty)} are entirely nodata", bands=empty)
        )
    const = [i + 1 for i in range(stats.n) if stats.valid[i] > 1 and stats.min[i] == stats.max[i]]
    if const:
        issues.append(
            warning(
                Code.CONSTANT_BAND,
                f"band(s) {format_band_ranges(const)} are constant (e.g. band {const[0]} = {stats.min[const[0] - 1]:g})",
                bands=const,
            )
        )
    bad = [i + 1 for i in range(stats.n) if stats.nan[i] or stats.inf[i]]
    if bad:
        nan, inf = int(stats.nan.sum()), int(stats.inf.sum())
        issues.append(
            warning(
                Code.NONFINITE_VALUES,
                f"{nan} NaN and {inf} infinite value(s) in band(s) {format_band_ranges(bad)}; they are treated as nodata",
                bands=bad,
            )
        )
    return issues


