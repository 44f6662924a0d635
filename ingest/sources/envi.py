"""ENVI scenes: a text header (``.hdr``) next to a raw BSQ/BIL/BIP data file.

The header is parsed here rather than through GDAL because GDAL only parses it when the
data file exists and opens; a header whose data file is missing or short must still be
validated (wavelengths, sizes) and reported. Pixels are read through GDAL's ENVI driver.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from cubelake.errors import SceneReadError
from cubelake.grid import Window

from ..report import Code, Issue, error, warning
from ..spectral import parse_float_list, parse_wavelength_text, unit_factor_to_nm
from ._base import BandInfo, FileCalibration, RasterSource, SceneMetadata
from .gdal import open_gdal

__all__ = [
    "DATA_EXTENSIONS",
    "ENVI_DTYPES",
    "MetadataOnlySource",
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


def find_envi_header(data_path: Path) -> Path | None:
    """The header of a data file: ``x.hdr`` for ``x`` or ``x.img`` -> ``x.hdr`` or ``x.img.hdr``."""
    for cand in (data_path.with_name(data_path.name + ".hdr"), data_path.with_suffix(".hdr")):
        if cand.is_file() and cand != data_path:
            return cand
    return None


def find_envi_data_file(header: Path) -> tuple[Path | None, list[Path]]:
    """The data file of a header and the candidate names looked for."""
    stem = header.with_suffix("")
    candidates = [Path(str(stem) + ext) for ext in DATA_EXTENSIONS]
    candidates += [stem.with_suffix(ext.upper()) for ext in DATA_EXTENSIONS if ext]
    for cand in candidates:
        if cand.is_file():
            return cand, candidates
    return None, candidates


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


def _band_infos(fields: dict[str, str], n: int, path: str, issues: list[Issue]) -> list[BandInfo]:
    names: list[str | None] = [None] * n
    if "band names" in fields:
        raw_names = [s.strip() for s in fields["band names"].strip().strip("{}").split(",")]
        if len(raw_names) == n:
            names = list(raw_names)
    wavelengths: list[float | None] = [None] * n
    fwhm: list[float | None] = [None] * n
    if "wavelength" in fields:
        values = parse_float_list(fields["wavelength"])
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
            if "fwhm" in fields:
                fw = parse_float_list(fields["fwhm"])
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
    if "bbl" in fields:
        flags = parse_float_list(fields["bbl"])
        if len(flags) == n:
            bbl = [f != 0 for f in flags]
    return [BandInfo(i + 1, names[i], wavelengths[i], fwhm[i], not bbl[i]) for i in range(n)]


def open_envi(header: Path, data: Path | None) -> RasterSource:
    """Open an ENVI scene from its header (and data file, if found)."""
    hpath = str(header)
    try:
        text = header.read_text(encoding="latin-1")
    except OSError as exc:
        raise SceneReadError(f"{hpath}: cannot read the ENVI header: {exc}") from exc
    fields = parse_envi_header(text, hpath)
    issues: list[Issue] = []
    samples = _int(fields, "samples", hpath)
    lines = _int(fields, "lines", hpath)
    nb = _int(fields, "bands", hpath)
    code = _int(fields, "data type", hpath)
    offset = _int(fields, "header offset", hpath, default=0)
    dtype = ENVI_DTYPES.get(code)
    if dtype is None:
        raise SceneReadError(f"{hpath}: unknown ENVI 'data type = {code}' (known: {sorted(ENVI_DTYPES)})")
    bands = _band_infos(fields, nb, hpath, issues)
    nodata = None
    if "data ignore value" in fields:
        try:
            nodata = float(fields["data ignore value"])
        except ValueError:
            issues.append(warning(Code.NO_WAVELENGTHS, f"unparsable 'data ignore value' {fields['data ignore value']!r}"))
    calibrations: list[FileCalibration] = []
    if "data gain values" in fields or "data offset values" in fields:
        gains = parse_float_list(fields.get("data gain values", "{" + ",".join(["1"] * nb) + "}"))
        offs = parse_float_list(fields.get("data offset values", "{" + ",".join(["0"] * nb) + "}"))
        if len(gains) == nb and len(offs) == nb:
            calibrations.append(
                FileCalibration("envi_data_gain", tuple(gains), tuple(offs), note="ENVI data gain/offset values")
            )
        else:
            issues.append(
                error(
                    Code.PROFILE_MISMATCH,
                    f"'data gain values'/'data offset values' have {len(gains)}/{len(offs)} entries for {nb} bands",
                    where=hpath,
                )
            )
    dt = fields.get("acquisition time")
    interleave = fields.get("interleave", "bsq").lower()
    meta = SceneMetadata(
        path=hpath,
        files=(hpath,) if data is None else (hpath, str(data)),
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
    if data is None:
        return MetadataOnlySource(meta)
    expected = offset + samples * lines * nb * np.dtype(dtype).itemsize
    actual = os.path.getsize(data)
    if actual < expected:
        short = MetadataOnlySource(
            dataclasses.replace(
                meta,
                issues=(
                    *meta.issues,
                    error(
                        Code.TRUNCATED,
                        f"data file is {actual} bytes but the header ({samples}x{lines}x{nb} {dtype}, offset {offset}) "
                        f"needs {expected}; {expected - actual} bytes are missing (incomplete copy or download?)",
                        where=str(data),
                    ),
                ),
            )
        )
        return short
    src = open_gdal(data)
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
