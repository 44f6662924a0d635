"""ENVI scenes: a text header (``.hdr``) next to a raw BSQ/BIL/BIP data file.

The header is parsed here rather than through GDAL because GDAL only parses it when the
data file exists and opens; a header whose data file is missing or short must still be
validated (wavelengths, sizes) and reported. Pixels are read through GDAL's ENVI driver.

The header and data file may be objects (GDAL ``/vsis3/`` names): the header is then read by one
bounded ranged GET, the data file's size by a HEAD, and pixels by GDAL's range requests.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from cubelake.errors import SceneReadError
from cubelake.grid import Window
from cubelake.storage import url_of_gdal_path

from ..report import Code, Issue, error, warning
from ..spectral import parse_float_list, parse_wavelength_text, unit_factor_to_nm
from ._base import (
    BandInfo,
    FileCalibration,
    RasterSource,
    SceneMetadata,
    display_name,
    file_size,
    is_regular_file,
    read_bounded,
)
from .gdal import GdalSource, open_gdal

__all__ = [
    "DATA_EXTENSIONS",
    "ENVI_DTYPES",
    "MetadataOnlySource",
    "envi_data_candidates",
    "envi_header_candidates",
    "find_envi_data_file",
    "find_envi_header",
    "open_envi",
    "parse_envi_header",
]

#: ENVI ``data type`` codes -> numpy dtype names (complex types are listed to reject them by name).
ENVI_DTYPES: dict[int, str] = {
    1: "uint8",
    2: "int16",
    3: "int32",
    4: "float32",
    5: "float64",
    6: "complex64",
    9: "complex128",
    12: "uint16",
    13: "uint32",
    14: "int64",
    15: "uint64",
}

DATA_EXTENSIONS = ("", ".img", ".dat", ".bsq", ".bil", ".bip", ".raw", ".bin")

_KEY_VALUE = re.compile(r"^\s*([^=]+?)\s*=\s*(.*)$")


def parse_envi_header(text: str, path: str) -> dict[str, str]:
    """Header fields as ``{lower-case key: raw value}``; brace values may span lines."""
    lines = text.replace("\r\n", "\n").split("\n")
    if not lines or lines[0].strip() != "ENVI":
        raise SceneReadError(f"{path}: not an ENVI header (first line must be 'ENVI', got {lines[0][:40]!r})")
    fields: dict[str, str] = {}
    i = 1
    while i < len(lines):
        m = _KEY_VALUE.match(lines[i])
        i += 1
        if not m:
            continue
        key, value = m.group(1).strip().lower(), m.group(2).strip()
        if value.startswith("{") and "}" not in value:
            parts = [value]
            while i < len(lines) and "}" not in parts[-1]:
                parts.append(lines[i].strip())
                i += 1
            value = " ".join(parts)
        fields[key] = value
    return fields


def envi_header_candidates(data_path: Path) -> list[Path]:
    """The names a data file's header may have, in the order looked for: ``x.img.hdr``, then ``x.hdr``."""
    return [c for c in (data_path.with_name(data_path.name + ".hdr"), data_path.with_suffix(".hdr")) if c != data_path]


def envi_data_candidates(header: Path) -> list[Path]:
    """The names a header's data file may have, in the order looked for (``x``, ``x.img``, ... ``x.IMG``, ...)."""
    stem = header.with_suffix("")
    return [Path(str(stem) + ext) for ext in DATA_EXTENSIONS] + [stem.with_suffix(ext.upper())
                                                                  for ext in DATA_EXTENSIONS if ext]


def find_envi_header(data_path: Path) -> Path | None:
    """The header of a data file: ``x.hdr`` for ``x`` or ``x.img`` -> ``x.hdr`` or ``x.img.hdr``."""
    return next((c for c in envi_header_candidates(data_path) if is_regular_file(c)), None)


def find_envi_data_file(header: Path) -> tuple[Path | None, list[Path]]:
    """The data file of a header and the candidate names looked for."""
    candidates = envi_data_candidates(header)
    return next((c for c in candidates if is_regular_file(c)), None), candidates


class MetadataOnlySource:
    """A scene whose header could be read but whose pixels cannot (data file missing)."""

    def __init__(self, meta: SceneMetadata) -> None:
        self._meta = meta

    @property
    def meta(self) -> SceneMetadata:
        return self._meta

    def read(self, window: Window) -> np.ndarray:
        raise SceneReadError(f"{self._meta.path}: no pixel data can be read (see the validation report)")

    def blocks(self, window: Window) -> Sequence[Window]:
        return [window]

    def close(self) -> None:
        pass


def _int(fields: dict[str, str], key: str, path: str, default: int | None = None) -> int:
    raw = fields.get(key)
    if raw is None:
        if default is not None:
            return default
        raise SceneReadError(f"{path}: ENVI header has no '{key}' field; add it (e.g. '{key} = 100')")
    try:
        return int(float(raw))
    except ValueError:
        raise SceneReadError(f"{path}: ENVI header field '{key}' is {raw!r}, expected an integer") from None


#: Real headers are a few KB (a 425-band AVIRIS-NG header is ~20 KB); anything far larger is not one.
HEADER_MAX_BYTES = 4 * 1024 * 1024
_INTERLEAVES = ("bsq", "bil", "bip")


def _floats(fields: dict[str, str], key: str, path: str, issues: list[Issue]) -> list[float] | None:
    """A header list of numbers, or ``None`` with an error naming the field and the first bad entry."""
    try:
        values = parse_float_list(fields[key])
    except ValueError as exc:
        issues.append(error(Code.BAD_METADATA, f"header field '{key}' holds a value that is not a number "
                                               f"({str(exc).split(': ', 1)[-1]}); fix the header",
                            where=f"{path}: {key}"))
        return None
    if not all(math.isfinite(v) for v in values):
        issues.append(error(Code.BAD_METADATA, f"header field '{key}' holds NaN or infinite values; fix the header",
                            where=f"{path}: {key}"))
        return None
    return values


def _band_infos(fields: dict[str, str], n: int, path: str, issues: list[Issue]) -> list[BandInfo]:
    names: list[str | None] = [None] * n
    if "band names" in fields:
        raw_names = [s.strip() for s in fields["band names"].strip().strip("{}").split(",")]
        if len(raw_names) == n:
            names = list(raw_names)
    wavelengths: list[float | None] = [None] * n
    fwhm: list[float | None] = [None] * n
    values = _floats(fields, "wavelength", path, issues) if "wavelength" in fields else None
    if values is not None:
        unit = fields.get("wavelength units")
        factor = unit_factor_to_nm(unit)
        if factor is None and values:
            factor = 1000.0 if max(values) < 30 else 1.0
            issues.append(
                warning(
                    Code.WAVELENGTH_UNITS_ASSUMED,
                    f"'wavelength units' is {unit!r}; assumed {'micrometres' if factor == 1000.0 else 'nanometres'} "
                    "from the values. Add 'wavelength units = Nanometers' to the header to be explicit",
                    where=path,
                )
            )
        if len(values) != n:
            issues.append(
                error(
                    Code.WAVELENGTH_COUNT,
                    f"the header lists {len(values)} wavelengths for {n} bands; give exactly one per band",
                    where=f"{path}: wavelength",
                )
            )
        else:
            wavelengths = [v * (factor or 1.0) for v in values]
            fw = _floats(fields, "fwhm", path, issues) if "fwhm" in fields else None
            if fw is not None:
                if len(fw) == n:
                    fwhm = [v * (factor or 1.0) for v in fw]
                else:
                    issues.append(
                        warning(
                            Code.FWHM_IMPLAUSIBLE,
                            f"the header lists {len(fw)} FWHM values for {n} bands; FWHM ignored",
                            where=f"{path}: fwhm",
                        )
                    )
    elif any(names):
        parsed = [parse_wavelength_text(nm) for nm in names]
        if all(p is not None for p in parsed):
            wavelengths = parsed
    bbl = [True] * n
    flags = _floats(fields, "bbl", path, issues) if "bbl" in fields else None
    if flags is not None and len(flags) == n:
        bbl = [f != 0 for f in flags]
    return [BandInfo(i + 1, names[i], wavelengths[i], fwhm[i], not bbl[i]) for i in range(n)]


def _read_header(header: Path) -> dict[str, str]:
    hpath = display_name(header)
    raw = read_bounded(header, HEADER_MAX_BYTES, "an ENVI header")
    return parse_envi_header(raw.decode("latin-1"), hpath)


def _layout_issues(fields: dict[str, str], hpath: str) -> list[Issue]:
    """Errors for header fields that decide how bytes map to pixels, when their values are not ENVI's."""
    issues = []
    interleave = fields.get("interleave", "bsq").strip().lower()
    if interleave not in _INTERLEAVES:
        issues.append(error(Code.BAD_METADATA, f"'interleave = {interleave}' is not an ENVI interleave (bsq, bil or "
                                               "bip); fix the header", where=f"{hpath}: interleave"))
    order = fields.get("byte order", "0").strip()
    if order not in ("0", "1"):
        issues.append(error(Code.BAD_METADATA, f"'byte order = {order}' must be 0 (little-endian) or 1 (big-endian); "
                                               "fix the header", where=f"{hpath}: byte order"))
    return issues


def _nodata(fields: dict[str, str], hpath: str, issues: list[Issue]) -> float | None:
    if "data ignore value" not in fields:
        return None
    raw = fields["data ignore value"]
    try:
        return float(raw)
    except ValueError:
        issues.append(error(Code.BAD_METADATA, f"'data ignore value = {raw}' is not a number, so nodata pixels "
                                               "cannot be told from data; fix the header",
                            where=f"{hpath}: data ignore value"))
        return None


def _gains(fields: dict[str, str], nb: int, hpath: str, issues: list[Issue]) -> list[FileCalibration]:
    if "data gain values" not in fields and "data offset values" not in fields:
        return []
    gains = _floats(fields, "data gain values", hpath, issues) if "data gain values" in fields else [1.0] * nb
    offs = _floats(fields, "data offset values", hpath, issues) if "data offset values" in fields else [0.0] * nb
    if gains is None or offs is None:
        return []
    if len(gains) == nb and len(offs) == nb:
        return [FileCalibration("envi_data_gain", tuple(gains), tuple(offs), note="ENVI data gain/offset values")]
    issues.append(
        error(
            Code.PROFILE_MISMATCH,
            f"'data gain values'/'data offset values' have {len(gains)}/{len(offs)} entries for {nb} bands",
            where=hpath,
        )
    )
    return []


def _size_issue(data: Path, expected: int, shape: str) -> Issue | None:
    """An error when the data file's size is not the one the header describes (short or long)."""
    actual = file_size(data)
    if actual < expected:
        return error(
            Code.TRUNCATED,
            f"data file is {actual} bytes but the header ({shape}) needs {expected}; {expected - actual} bytes are "
            "missing (incomplete copy or download?)",
            where=display_name(data),
        )
    if actual > expected:
        return error(
            Code.BAD_METADATA,
            f"data file is {actual} bytes but the header ({shape}) describes {expected}: {actual - expected} bytes "
            "more, so samples/lines/bands/data type/header offset do not describe this file and pixels would be "
            "read from the wrong places. Fix the header",
            where=display_name(data),
        )
    return None


#: GDAL's ENVI driver looks for the header among the files next to the data file. ``S3Options.gdal_env()``
#: sets ``GDAL_DISABLE_READDIR_ON_OPEN=EMPTY_DIR`` (no listing of a possibly huge prefix per open), which
#: tells the driver that folder is empty, so it finds no header and does not recognise the file; ``TRUE``
#: makes it probe the header's names by HEAD instead. Only ENVI data objects are opened so.
_REMOTE_ENVI_GDAL_CONFIG = {"GDAL_DISABLE_READDIR_ON_OPEN": "TRUE"}


def _open_data(data: Path) -> GdalSource:
    if url_of_gdal_path(data) is None:
        return open_gdal(data)
    return open_gdal(data, config=_REMOTE_ENVI_GDAL_CONFIG)


def open_envi(header: Path, data: Path | None) -> RasterSource:
    """Open an ENVI scene from its header (and data file, if found; either may be a ``/vsis3/`` name)."""
    hpath = display_name(header)
    fields = _read_header(header)
    issues: list[Issue] = _layout_issues(fields, hpath)
    samples = _int(fields, "samples", hpath)
    lines = _int(fields, "lines", hpath)
    nb = _int(fields, "bands", hpath)
    code = _int(fields, "data type", hpath)
    offset = _int(fields, "header offset", hpath, default=0)
    if offset < 0:
        raise SceneReadError(f"{hpath}: ENVI header field 'header offset' is {offset}; it must be >= 0")
    dtype = ENVI_DTYPES.get(code)
    if dtype is None:
        raise SceneReadError(f"{hpath}: unknown ENVI 'data type = {code}' (known: {sorted(ENVI_DTYPES)})")
    bands = _band_infos(fields, nb, hpath, issues) if 0 < nb <= 100_000 else []
    nodata = _nodata(fields, hpath, issues)
    calibrations = _gains(fields, nb, hpath, issues)
    dt = fields.get("acquisition time")
    interleave = fields.get("interleave", "bsq").strip().lower()
    meta = SceneMetadata(
        path=hpath,
        files=(str(header),) if data is None else (str(header), str(data)),
        format="ENVI",
        count=nb,
        height=lines,
        width=samples,
        dtype=dtype,
        nodata=nodata,
        bands=tuple(bands),
        block_shape=(1, samples),
        interleave=interleave,
        datetime=dt,
        tags={k: v for k, v in fields.items() if len(v) < 300 and k not in ("wavelength", "fwhm", "bbl", "band names")},
        calibrations=tuple(calibrations),
        georeferenced="map info" in fields,
        issues=tuple(issues),
    )
    if data is None or any(i.severity == "error" for i in issues) or min(samples, lines, nb) <= 0:
        return MetadataOnlySource(meta)  # nothing more is read: the report says why
    expected = offset + samples * lines * nb * np.dtype(dtype).itemsize
    wrong = _size_issue(data, expected, f"{samples}x{lines}x{nb} {dtype}, offset {offset}")
    if wrong is not None:
        return MetadataOnlySource(dataclasses.replace(meta, issues=(*meta.issues, wrong)))
    src = _open_data(data)
    g = src.meta
    # GDAL supplies grid, georeferencing and layout; the header supplies the spectral metadata.
    merged = dataclasses.replace(
        g,
        path=hpath,
        files=meta.files,
        format="ENVI",
        bands=meta.bands,
        nodata=nodata if nodata is not None else g.nodata,
        calibrations=meta.calibrations,
        datetime=dt,
        tags=meta.tags,
        issues=meta.issues,
        interleave=interleave,
    )
    return src.with_meta(merged)
